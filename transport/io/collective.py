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

import errno
import logging
import socket
import time
from functools import partial
from typing import Any

from transport.collective.api import CollectiveRank, expected_from_seed, pair_connections
from transport.collective.base import DTYPE, Phase, RingProtocolError
from transport.collective.plan import build_plan, make_int_input
from transport.collective.report import Row, bound
from transport.collective.worker import Message, PlanWorker
from transport.core import wire
from transport.core.connection import Connection, MessageAcked, MessageReceived
from transport.core.events import Event
from transport.core.pump import Datagrams, Pump, earliest, linger
from transport.core.schema import CollectiveMetrics
from transport.io.allreduce import AllReduceError, WorkerOptions, summary
from transport.io.endpoint import resolve
from transport.io.eventloop import EventLoop, SendCounters, SocketSender, read_batch, socket_drops

logger = logging.getLogger(__name__)


class UdpCollectiveWorker(EventLoop):
    """Rank ``opts.rank`` of the plan collective ``opts.collective`` over real sockets."""

    role = "collective"

    def __init__(self, opts: WorkerOptions) -> None:
        opts.validate()
        super().__init__(opts.config)
        self.opts = opts
        n, r = opts.n_ranks, opts.rank
        self.n = n
        self.rank = r
        try:
            self.plan = build_plan(opts.collective, n, opts.size, group=opts.group,
                                   piece_elems=max(1, opts.piece_bytes // DTYPE.itemsize))
        except ValueError as exc:
            raise AllReduceError(str(exc)) from None
        self.worker = PlanWorker(self.plan, r, make_int_input(opts.seed, r, opts.size), opts.iterations)
        self.coll = CollectiveRank(self.worker)
        edges = self.plan.edges()
        self.sends: dict[int, Connection] = {}
        self.recvs: dict[int, Connection] = {}
        for src, dst in sorted(edges):
            if src == r:
                self.sends[dst] = pair_connections(opts.config, self.plan, r, dst, opts.seed)[0]
            if dst == r:
                self.recvs[src] = pair_connections(opts.config, self.plan, src, r, opts.seed)[1]
        self.sent = SendCounters()
        self.counters = {"datagrams_received": 0, "foreign_datagrams": 0, "protocol_errors": 0}
        self.listen: socket.socket | None = None
        self.ev_socks: list[socket.socket] = []
        self._dest: dict[int, Any] = {}  # peer -> its socket address
        self._evaddr: dict[int, dict[int, Any]] = {s: {} for s in self.recvs}  # peer -> EV -> its source
        self._last_addr: dict[int, Any] = {}
        self._by_cid_recv = {c.connection_id: (s, c) for s, c in self.recvs.items()}
        self._by_cid_send = {c.connection_id: c for c in self.sends.values()}
        self.send_pumps = {d: Pump(c, partial(self._send_data, d), self._on_send_event) for d, c in self.sends.items()}
        self.recv_pumps = {s: Pump(c, partial(self._send_acks, s), self._on_recv_event)
                           for s, c in self.recvs.items()}
        self._pumps = [*self.send_pumps.values(), *self.recv_pumps.values()]
        self._data_senders: dict[int, SocketSender] = {}
        self._ack_senders: dict[int, SocketSender] = {}
        self._last_progress = 0.0
        self._last_rx = 0.0
        self.started_unix: float | None = None
        self.error: str | None = None

    @property
    def phase(self) -> Phase:
        return self.coll.phase

    @property
    def iteration_times(self) -> list[float]:
        return self.coll.iteration_times

    @property
    def correct(self) -> bool | None:
        return self.coll.correct

    # -- sockets ------------------------------------------------------------------------------------

    def open(self) -> None:
        opts = self.opts
        host, port = opts.peers[self.rank]
        family, _ = resolve(host, port)
        for d in self.sends:
            dfamily, self._dest[d] = resolve(*opts.peers[d])
            if dfamily != family:
                raise AllReduceError(f"peer {d} {opts.peers[d][0]} is not of rank {self.rank}'s address family")
        bind = opts.bind or host
        s = socket.socket(family, socket.SOCK_DGRAM)
        try:
            s.bind((bind, port))
        except OSError as exc:
            s.close()
            if exc.errno == errno.EADDRINUSE:
                raise AllReduceError(f"port {port} of peer {self.rank} is in use on this host; pick another") from None
            raise AllReduceError(f"cannot bind {bind}:{port}: {exc.strerror}") from None
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
            es = socket.socket(family, socket.SOCK_DGRAM)
            try:
                es.bind((sbind, base + ev))
            except OSError as exc:
                es.close()
                if exc.errno == errno.EADDRINUSE:
                    raise AllReduceError(
                        f"source port {base + ev} (base port {base} + EV {ev}) is in use; choose another --base-port"
                    ) from None
                raise AllReduceError(f"cannot bind {sbind}:{base + ev}: {exc.strerror}") from None
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

    def _on_message(self, data: bytes, now: float) -> None:
        try:
            self._submit(self.coll.receive(data, now), now)
        except RingProtocolError as exc:
            self.counters["protocol_errors"] += 1
            logger.warning("rank %d: dropped a message: %s", self.rank, exc)

    def _advance(self, now: float) -> None:
        ready = self.coll.phase is Phase.READY
        self._submit(self.coll.advance(now), now)
        if ready and self.coll.phase is not Phase.READY:
            self.started_unix = time.time()

    # -- loop ---------------------------------------------------------------------------------------

    def _drain_listen(self, now: float) -> int:
        batch, n = read_batch(self.listen.recvfrom, self._recv_size)  # type: ignore[union-attr]
        by_cid = self._by_cid_recv
        for data, addr in batch:
            hit = by_cid.get(wire.read_conn_id(data)) if len(data) >= wire.CONN_ID_OFFSET + 4 else None
            if hit is None:
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

    def _on_recv_event(self, event: Event, now: float) -> None:
        if isinstance(event, MessageReceived):
            self._last_progress = now
            self._on_message(event.data, now)

    def _on_send_event(self, event: Event, now: float) -> None:
        if isinstance(event, MessageAcked):
            self._last_progress = now

    def _turn(self, now: float) -> float | None:
        pumps = self._pumps
        for p in pumps:
            p.fire(now)
        for p in pumps:
            p.events(now)
        self._advance(time.monotonic())
        for p in pumps:
            p.flush(now)
        coll = self.coll
        wake = earliest(coll.wake_time(), pumps)
        if coll.phase is Phase.DRAIN:
            over, until = linger(now, coll.done_at if coll.done_at is not None else now, self._last_rx,
                                 self.opts.linger)
            if over and all(c.idle for c in self.sends.values()):
                coll.drained()
                self.stop("done")
                return None
            if wake is None or until < wake:
                wake = until
        elif coll.phase is Phase.READY and coll.start_time is not None:
            self._last_progress = max(self._last_progress, min(now, coll.start_time))
        if now - self._last_progress > self.opts.timeout:
            raise AllReduceError(self._timeout_message())
        limit = self._last_progress + self.opts.timeout + 0.01
        if wake is None or limit < wake:
            wake = limit
        return wake

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

    def run(self) -> None:
        """Barrier, iterations, linger; raises AllReduceError on timeouts."""
        expected = expected_from_seed(self.plan, self.rank, self.opts.seed)
        if self.n == 1:
            now = time.monotonic()
            self.started_unix = time.time()
            self.coll.start(now, expected)
            self.coll.advance(now)
            return
        if self.listen is None:
            self.open()
        now = self._last_progress = time.monotonic()
        start_at = None if self.opts.start_at is None else now + self.opts.start_at - time.time()
        self._submit(self.coll.start(now, expected, start_at), now)
        self._run_loop()
        now = time.monotonic()
        for p in self._pumps:
            p.flush(now)

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
        socks = [s for s in (self.listen, *self.ev_socks) if s is not None]
        try:
            drops = socket_drops(socks) if socks and socks[0].fileno() >= 0 else None
        except OSError:
            drops = None
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
            "correct": bool(self.correct) if self.correct is not None else False,
            "mismatch": self.coll.mismatch,
            "error": self.error,
            "stop_reason": self.stop_reason,
            "phase": self.phase,
            "barrier_s": self.coll.barrier_s,
            "started_unix": self.started_unix,
            "seed": opts.seed,
            "base_port": opts.source_base,
            "piece_bytes": opts.piece_bytes,
            "collective_stats": {"duplicates": self.worker.duplicates, "stale": self.worker.stale},
            "transport": {
                "sends": [{"to": peer(d), **c.metrics()} for d, c in self.sends.items()],  # type: ignore[typeddict-item]
                "recvs": [{"from": peer(s), **c.metrics()} for s, c in self.recvs.items()],  # type: ignore[misc]
                "datagrams_sent": self.sent.datagrams_sent,
                "send_errors": self.sent.send_errors,
                "refused": self.sent.refused,
                **self.counters,  # type: ignore[typeddict-item]
                "socket_drops": drops,
                "config": opts.config.to_dict(),
            },
        }
