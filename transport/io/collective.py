"""Any plan collective (reduce-scatter, all-gather, all-to-all, hierarchical all-reduce) over real UDP.

``fabriclab allreduce --collective NAME --rank R --peers IP:PORT,...`` (cli/allreduce.py) runs rank R;
the rank's logic is a `CollectiveRank` (transport/collective/api.py), the same as in the simulation
(transport/sim/collsim.py). Unlike the ring, whose rank talks to two neighbours, a rank here talks to
every peer its plan names, over one pair of sans-I/O Connections per (sender, receiver):

* DATA from every peer arrives on the rank's own ``peers[R]`` port and goes to the receiving
  Connection its connection id names; each ACK goes back to the socket the DATA came from;
* DATA to every peer leaves from the same one socket per entropy value, bound to ``base_port + EV``
  and not connected (``sendto`` the peer), so the EV is still the source port the fabric hashes;
  ACKs come back to those sockets and go to the sending Connection their connection id names.

Barrier, iterations checked bit for bit against numpy (integer-valued inputs), linger, timeouts and
exit status are the ring worker's (transport/io/allreduce.py); the results are `CollectiveMetrics`.
"""

from __future__ import annotations

import socket
import time
from functools import partial
from typing import Any

import numpy as np

from transport.collective.api import CollectiveRank, expected_from_seed
from transport.collective.base import DTYPE, Phase
from transport.collective.plan import build_plan, make_int_input
from transport.collective.report import Row, bound
from transport.collective.worker import Message, PlanWorker
from transport.core import wire
from transport.core.connection import Connection
from transport.core.pump import Datagrams, Pump
from transport.core.schema import CollectiveMetrics
from transport.io.allreduce import AllReduceError, RankLoop, WorkerOptions, bind_listen, bind_source, summary
from transport.io.endpoint import resolve
from transport.io.eventloop import SocketSender, read_batch
from transport.io.incarnation import TAG_BITS, PeerIncarnation, tagged_connection_ids


class UdpCollectiveWorker(RankLoop):
    """Rank ``opts.rank`` of the plan collective ``opts.collective`` over real sockets."""

    role = "collective"

    def __init__(self, opts: WorkerOptions) -> None:
        opts.validate()
        super().__init__(opts.config)
        self._init_run(opts)
        n, r = opts.n_ranks, opts.rank
        try:
            self.plan = build_plan(opts.collective, n, opts.size, group=opts.group,
                                   piece_elems=max(1, opts.piece_bytes // DTYPE.itemsize))
        except ValueError as exc:
            raise AllReduceError(str(exc)) from None
        self.worker = PlanWorker(self.plan, r, make_int_input(opts.seed, r, opts.size), opts.iterations)
        self.coll = self.run_state = CollectiveRank(self.worker)
        edges = self.plan.edges()
        self.sends: dict[int, Connection] = {}
        self.recvs: dict[int, Connection] = {}
        # Each start sends under fresh ids tagged with this rank, and takes each source's id from its
        # first DATA (transport/io/incarnation.py): a restarted rank is never matched to the state
        # its old self left at a peer. Until then a source's connection is a placeholder.
        dsts = sorted(dst for src, dst in edges if src == r)
        self._recv_seed: dict[int, int] = {}
        for dst, cid in zip(dsts, tagged_connection_ids(r, len(dsts)), strict=True):
            self.sends[dst] = Connection(opts.config, cid, seed=self._pair_seed(r, dst))
        for src in sorted(src for src, dst in edges if dst == r):
            self._recv_seed[src] = self._pair_seed(src, r) + 1
            self.recvs[src] = Connection(opts.config, 0, seed=self._recv_seed[src])
        self._incarnations: dict[int, PeerIncarnation] = {}  # source -> its host's incarnation, from open()
        self._dest: dict[int, Any] = {}  # peer -> its socket address
        self._evaddr: dict[int, dict[int, Any]] = {s: {} for s in self.recvs}  # peer -> EV -> its source
        self._last_addr: dict[int, Any] = {}
        self._by_cid_recv: dict[int, tuple[int, Connection]] = {}  # filled by _adopt()
        self._by_cid_send = {c.connection_id: c for c in self.sends.values()}
        self.send_pumps = {d: Pump(c, partial(self._send_data, d), self._on_send_event) for d, c in self.sends.items()}
        self.recv_pumps = {s: Pump(c, partial(self._send_acks, s), self._on_recv_event)
                           for s, c in self.recvs.items()}
        self.pumps = [*self.send_pumps.values(), *self.recv_pumps.values()]
        self._data_senders: dict[int, SocketSender] = {}
        self._ack_senders: dict[int, SocketSender] = {}

    def _pair_seed(self, src: int, dst: int) -> int:
        """The seed of the pair src -> dst's sending Connection (its receiving one's is one more)."""
        return self.opts.seed * 1_000_003 + 2 * (src * self.plan.n_ranks + dst)

    def _adopt(self, data: bytes, addr: tuple[Any, ...]) -> tuple[int, Connection] | None:
        """The source and connection a DATA under an unknown id opens: its sender's first, under an id
        tagged with a source of this rank; None for anything else. Another first DATA of a source
        under another id means it restarted, which ends the run with an error."""
        src = wire.read_conn_id(data) >> TAG_BITS
        cid = self._adopted_id(self._incarnations.get(src), data, addr, f"source rank {src}")
        if cid is None:
            return None
        conn = self.recvs[src] = self.recv_pumps[src].conn = Connection(self.opts.config, cid,
                                                                          seed=self._recv_seed[src])
        self._by_cid_recv[cid] = src, conn
        return src, conn

    # -- sockets ------------------------------------------------------------------------------------

    def open(self) -> None:
        opts = self.opts
        host, port = opts.peers[self.rank]
        family, _ = resolve(host, port)
        for d in self.sends:
            dfamily, self._dest[d] = resolve(*opts.peers[d])
            if dfamily != family:
                raise AllReduceError(f"peer {d} {opts.peers[d][0]} is not of rank {self.rank}'s address family")
        self._incarnations = {src: PeerIncarnation(resolve(*opts.peers[src])[1][0]) for src in self.recvs}
        s = bind_listen(family, opts.bind or host, port, self.rank)
        self._register(s, self._drain_listen)
        self.listen = s
        sendto = s.sendto

        def ack_sender(src: int) -> SocketSender:
            # Each ACK goes back to the socket that sent the DATA it names.
            evaddr, last = self._evaddr[src], self._last_addr
            return SocketSender(lambda dgram, ev: sendto(dgram, evaddr.get(ev, last[src])), self.sent)

        self._ack_senders = {src: ack_sender(src) for src in self.recvs}
        if self.n == 1:
            return
        sbind = opts.bind or ("::" if family == socket.AF_INET6 else "0.0.0.0")
        base = opts.source_base
        for ev in range(opts.config.num_evs):
            es = bind_source(family, sbind, base, ev)
            self._register(es, partial(self._drain_ev, es.recvfrom))
            self.ev_socks.append(es)
        ev_sendto = [es.sendto for es in self.ev_socks]

        def data_sender(addr: Any) -> SocketSender:
            return SocketSender(lambda dgram, ev: ev_sendto[ev](dgram, addr), self.sent)

        self._data_senders = {d: data_sender(self._dest[d]) for d in self.sends}

    # -- collective events --------------------------------------------------------------------------

    def _submit(self, msgs: list[Message], now: float) -> None:
        sends = self.sends
        for m in msgs:
            sends[m.dst].send_message(m.data, now)

    def _sends_idle(self) -> bool:
        return all(c.idle for c in self.sends.values())

    def _reference(self) -> np.ndarray:
        return expected_from_seed(self.plan, self.rank, self.opts.seed)

    # -- loop ---------------------------------------------------------------------------------------

    def _drain_listen(self, now: float) -> int:
        batch, n = read_batch(self.listen.recvfrom, self._recv_size)  # type: ignore[union-attr]
        by_cid = self._by_cid_recv
        for data, addr in batch:
            hit = by_cid.get(wire.read_conn_id(data)) if len(data) >= wire.CONN_ID_OFFSET + 4 else None
            if hit is None and (len(data) < wire.CONN_ID_OFFSET + 4 or (hit := self._adopt(data, addr)) is None):
                self.counters["foreign_datagrams"] += 1
                continue
            src, conn = hit
            if conn.receive_datagram(data, now) and data[wire.TYPE_OFFSET] == wire.TYPE_DATA:
                self._evaddr[src][wire.read_ev(data)] = addr
                self._last_addr[src] = addr
        if n:
            self.counters["datagrams_received"] += n
            self._last_rx = now
        return n

    def _drain_ev(self, recvfrom: Any, now: float) -> int:
        batch, n = read_batch(recvfrom, self._recv_size)
        by_cid = self._by_cid_send
        for data, _ in batch:
            conn = by_cid.get(wire.read_conn_id(data)) if len(data) >= wire.CONN_ID_OFFSET + 4 else None
            if conn is None:
                self.counters["foreign_datagrams"] += 1
                continue
            conn.receive_datagram(data, now)
        self.counters["datagrams_received"] += n
        return n

    def _send_data(self, dst: int, out: Datagrams, now: float) -> None:
        sender = self._data_senders.get(dst)
        if sender is not None:
            sender(out, now)

    def _send_acks(self, src: int, out: Datagrams, now: float) -> None:
        # ACKs answer DATA, so the peer's address is known by the time there are any.
        if src in self._last_addr and src in self._ack_senders:
            self._ack_senders[src](out, now)

    def _pump_turn(self, now: float) -> None:
        pumps = self.pumps
        for p in pumps:
            p.fire(now)
        for p in pumps:
            p.events(now)
        # The clock is read again, as the ring worker does: checking an iteration takes time.
        self._advance(time.monotonic())
        for p in pumps:
            p.flush(now)

    def _timeout_message(self) -> str:
        t = self.opts.timeout
        name = self.plan.name
        if self.phase is Phase.BARRIER:
            return (f"rank {self.rank}: {name} barrier not complete after {t:g} s; start every rank with the "
                    "same --peers, --collective, --group and --seed")
        if self.phase is Phase.DRAIN:
            return f"rank {self.rank}: peers acknowledged nothing for {t:g} s after the last {name} iteration"
        got, want = self.worker.progress
        return (f"rank {self.rank}: {name} iteration {self.worker.iteration + 1} stalled for {t:g} s with "
                f"{got}/{want} pieces received; is every rank still running?")

    # -- results ------------------------------------------------------------------------------------

    def row(self) -> Row:
        opts = self.opts
        nbytes = opts.size * DTYPE.itemsize
        b = bound(self.plan.name, self.n, nbytes, opts.link_rate_mbps, group=self.plan.group,
                  local_rate_mbps=opts.local_rate_mbps)
        return Row(self.plan.name, self.n, nbytes, opts.size, summary(self.iteration_times)["mean_s"], b)

    def results(self) -> CollectiveMetrics:
        opts = self.opts
        row = self.row()
        times = summary(self.iteration_times)
        peer = lambda r: f"{opts.peers[r][0]}:{opts.peers[r][1]}"  # noqa: E731
        return {
            "rank": self.rank,
            "peers": [f"{h}:{p}" for h, p in opts.peers],
            "collective": self.plan.name,
            "group": self.plan.group,
            "size": opts.size,
            "bytes": row.size,
            "count": row.count,
            "type": row.type,
            "redop": row.redop,
            "iterations": opts.iterations,
            "iterations_done": len(self.iteration_times),
            "iteration_times_s": self.iteration_times,
            "mean_s": times["mean_s"],
            "min_s": times["min_s"],
            "max_s": times["max_s"],
            "bound_s": row.bound.total_s if row.bound else None,
            "bound_levels_s": dict(row.bound.levels) if row.bound else {},
            "link_rate_mbps": opts.link_rate_mbps,
            "local_rate_mbps": opts.local_rate_mbps,
            "ratio_to_bound": row.ratio_to_bound,
            "algbw_gbps": row.algbw_gbps,
            "busbw_gbps": row.busbw_gbps,
            **self.run_fields(),  # type: ignore[typeddict-item]
            "collective_stats": {"duplicates": self.worker.duplicates, "stale": self.worker.stale},
            "transport": {
                "sends": [{"to": peer(d), **c.metrics()} for d, c in self.sends.items()],  # type: ignore[typeddict-item]
                "recvs": [{"from": peer(s), **c.metrics()} for s, c in self.recvs.items()],  # type: ignore[misc]
                **self.socket_fields(),  # type: ignore[typeddict-item]
            },
        }
