"""One node of a training job over real UDP sockets: a rank, or a storage host (and the coordinator).

``python -m cli.endpoint train-node --name rank0 --nodes rank0=IP,rank1=IP,...,near0=IP ...``
(cli/training_node.py) runs the node named; every node of the job gets the same ``--nodes``. The node's
logic is the same sans-I/O object as in the simulation (transport/sim/trainsim.py): a `TrainingRank`
or a `StorageHost`. This is its I/O: two transport `Connection`s per peer it talks to, one each
way, a listen socket on its own port for everything peers send, one socket per entropy value
(bound to ``base_port + EV``, so the fabric hashes or sprays on the source port) for everything it
sends, and the shared event loop. Datagrams are handed to their connection by connection id.

A node sends under ids drawn on every start and tagged with its index among ``--nodes``
(transport/io/incarnation.py), and takes each peer's id from that peer's first DATA: with one id per
pair from the seed, a node that restarted had its first messages acknowledged as duplicates by the
state its old self left at its peers, and never delivered. A peer's first DATA under another id
later means it restarted, and ends this node with an error naming it.

A rank stops once the coordinator has ended the job and its last messages are acknowledged; the
coordinator's storage host stops a little after the end; other storage hosts run until stopped. A
node that hears nothing for ``timeout`` seconds gives up.

Exit status: 0 done, 1 a collective's result differed from the reference, 2 bad input or a timeout,
143 stopped by SIGTERM/SIGINT (the JSON is written in every case once the options are valid).
"""

from __future__ import annotations

import errno
import logging
import socket
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from transport.core import wire
from transport.core.config import ConfigError, TransportConfig
from transport.core.connection import Connection, MessageReceived
from transport.core.contract import base_port_problem
from transport.core.events import Event
from transport.core.pump import Pump, earliest
from transport.io.endpoint import resolve
from transport.io.eventloop import EventLoop, SendCounters, SocketSender, control_ancillary, read_batch
from transport.io.incarnation import TAG_BITS, PeerIncarnation, PeerRestarted, tagged_connection_ids
from transport.training.messages import MessageError
from transport.training.metrics import rank_report
from transport.training.rank import TrainingRank
from transport.training.spec import JobSpec, RankHosts, SpecError, rank_name
from transport.training.storage import Coordinator, StorageHost

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_USAGE = 2
EXIT_SIGNAL = 143
DEFAULT_PORT = 7481  # where a node listens
_TYPE_OFFSET = wire.TYPE_OFFSET
DEFAULT_TIMEOUT = 60.0
LINGER_S = 0.5  # after the end: final ACKs and the END's repeats still get out


class TrainingNodeError(Exception):
    """Bad input or a timeout: reported as one line, exit status 2."""


@dataclass
class NodeOptions:
    name: str
    nodes: dict[str, tuple[str, int]]  # every node of the job: name -> (IP, listen port)
    spec: JobSpec = field(default_factory=JobSpec)
    hosts: RankHosts | None = None  # a rank's storage hosts
    coordinator: str = "near0"
    config: TransportConfig = field(default_factory=TransportConfig)
    base_port: int = 40000
    seed: int = 0
    timeout: float = DEFAULT_TIMEOUT

    @property
    def ranks(self) -> list[str]:
        return sorted((n for n in self.nodes if n.startswith("rank")), key=lambda n: int(n[4:]))

    @property
    def is_rank(self) -> bool:
        return self.name.startswith("rank")

    def validate(self) -> None:
        if self.name not in self.nodes:
            raise TrainingNodeError(f"--name {self.name}: not among --nodes ({', '.join(self.nodes)})")
        ranks = self.ranks
        if not ranks:
            raise TrainingNodeError("--nodes: name the ranks rank0, rank1, ...")
        if ranks != [rank_name(r) for r in range(len(ranks))]:
            raise TrainingNodeError(f"--nodes: ranks must be rank0..rank{len(ranks) - 1}, got {', '.join(ranks)}")
        if self.coordinator not in self.nodes or self.coordinator.startswith("rank"):
            raise TrainingNodeError(f"--coordinator {self.coordinator}: name a storage host of --nodes")
        if self.is_rank:
            assert self.hosts is not None
            for what, host in (("--data-host", self.hosts.data), ("--checkpoint-host", self.hosts.checkpoint)):
                if host not in self.nodes or host.startswith("rank"):
                    raise TrainingNodeError(f"{what} {host}: name a storage host of --nodes")
        if len(set(self.nodes.values())) != len(self.nodes):
            raise TrainingNodeError("--nodes: every node needs its own IP:PORT")
        if not self.timeout > 0:
            raise TrainingNodeError(f"--timeout {self.timeout}: use a positive number of seconds")
        try:
            self.spec.validate()
            self.config.validate()
        except (SpecError, ConfigError) as exc:
            raise TrainingNodeError(str(exc)) from None
        if problem := base_port_problem(self.base_port, self.config.num_evs):
            raise TrainingNodeError(f"--base-port: {problem}")


class UdpTrainingNode(EventLoop):
    """A rank or storage host of the job over real sockets (see the module's docstring)."""

    role = "training"

    def __init__(self, opts: NodeOptions) -> None:
        opts.validate()
        super().__init__(opts.config)
        self.opts = opts
        self.name = opts.name
        n_ranks = len(opts.ranks)
        self.rank: TrainingRank | None = None
        self.storage: StorageHost | None = None
        if opts.is_rank:
            assert opts.hosts is not None
            self.rank = TrainingRank(opts.spec, int(opts.name[4:]), n_ranks, opts.hosts)
            peers = {*opts.ranks, opts.hosts.data, opts.hosts.checkpoint, opts.hosts.coordinator} - {self.name}
        else:
            coord = Coordinator(n_ranks) if opts.name == opts.coordinator else None
            self.storage = StorageHost(opts.name, coord)
            peers = set(opts.ranks)  # whoever of them uses this host; the others' connections stay idle
        self.peers = sorted(peers)
        self.conns: dict[str, Connection] = {}  # what this node sends to each peer
        self.recv_conns: dict[str, Connection] = {}  # what each peer sends: a placeholder until _adopt()
        self.pumps: list[Pump] = []
        self._send_pumps: dict[str, Pump] = {}
        self._recv_pumps: dict[str, Pump] = {}
        self._by_cid: dict[int, Connection] = {}
        self._peer_addr: dict[str, Any] = {}
        self.sent = SendCounters()
        self.counters = {"datagrams_received": 0, "foreign_datagrams": 0, "message_errors": 0}
        # Ids drawn on every start, tagged with the sender's index among the nodes (the module's docstring).
        names = sorted(opts.nodes)
        self._tagged = {names.index(peer): peer for peer in self.peers}
        self._incarnations: dict[str, PeerIncarnation] = {}  # from open()
        self._recv_seed: dict[str, int] = {}
        ids = tagged_connection_ids(names.index(self.name), len(self.peers))
        for i, (peer, cid) in enumerate(zip(self.peers, ids, strict=True)):
            seed = opts.seed * 100003 + 7 * i + 1
            conn = Connection(opts.config, cid, seed=seed)
            self.conns[peer] = conn
            self._by_cid[cid] = conn
            self._recv_seed[peer] = seed + 3
            self.recv_conns[peer] = Connection(opts.config, 0, seed=seed + 3)
        self.listen: socket.socket | None = None
        self.ev_socks: list[socket.socket] = []
        self._control_cmsg: list[tuple[int, int, bytes]] = []
        self.error: str | None = None
        self.started_unix: float | None = None
        self._last_rx = 0.0
        self._ended_at: float | None = None

    # -- sockets ----------------------------------------------------------------------------------------

    def open(self) -> None:
        host, port = self.opts.nodes[self.name]
        family, _ = resolve(host, port)
        self._control_cmsg = control_ancillary(family)
        self.listen = self._bind(family, host, port, "listen port")
        self._register(self.listen, self._drain_listen)
        for ev in range(self.opts.config.num_evs):
            s = self._bind(family, host, self.opts.base_port + ev, f"source port of EV {ev}")
            self._register(s, partial(self._drain_ev, s))
            self.ev_socks.append(s)
        for peer in self.peers:
            self._peer_addr[peer] = resolve(*self.opts.nodes[peer])[1]
        for peer in self.peers:
            self._incarnations[peer] = PeerIncarnation(self._peer_addr[peer][0])
            sender = SocketSender(partial(self._sendto, self._peer_addr[peer]), self.sent)
            self._send_pumps[peer] = Pump(self.conns[peer], sender, partial(self._on_event, peer))
            self._recv_pumps[peer] = Pump(self.recv_conns[peer], sender, partial(self._on_event, peer))
        self.pumps = [*self._send_pumps.values(), *self._recv_pumps.values()]

    def _bind(self, family: int, host: str, port: int, what: str) -> socket.socket:
        s = socket.socket(family, socket.SOCK_DGRAM)
        try:
            s.bind((host, port))
        except OSError as exc:
            s.close()
            if exc.errno == errno.EADDRINUSE:
                raise TrainingNodeError(f"{what} {port} is in use on this host; pick another") from None
            raise TrainingNodeError(f"cannot bind {host}:{port}: {exc.strerror}") from None
        return s

    def _sendto(self, addr: Any, dgram: bytes, ev: int) -> None:
        if dgram[_TYPE_OFFSET] in wire.CONTROL_CLASS_TYPES:
            # ACKs share the EV's socket with data, so each is marked control on its own.
            self.ev_socks[ev].sendmsg((dgram,), self._control_cmsg, 0, addr)
        else:
            self.ev_socks[ev].sendto(dgram, addr)

    def _drain_listen(self, now: float) -> int:
        batch, n = read_batch(self.listen.recvfrom, self._recv_size)  # type: ignore[union-attr]
        by_cid = self._by_cid
        for data, addr in batch:
            if len(data) < wire.CONN_ID_OFFSET + 4:
                conn = None
            elif (conn := by_cid.get(wire.read_conn_id(data))) is None:
                conn = self._adopt(data, addr)
            if conn is None:
                self.counters["foreign_datagrams"] += 1
                continue
            conn.receive_datagram(data, now)
        if n:
            self.counters["datagrams_received"] += n
            self._last_rx = now
        return n

    def _adopt(self, data: bytes, addr: tuple[Any, ...]) -> Connection | None:
        """The connection a DATA under an unknown id opens: a peer's first, under an id tagged with
        that peer's index; None for anything else. Another first DATA of a peer under another id
        means it restarted, which ends this node with an error."""
        peer = self._tagged.get(wire.read_conn_id(data) >> TAG_BITS)
        inc = self._incarnations.get(peer) if peer is not None else None
        if inc is None or peer is None:
            return None
        try:
            if not inc.adopt(data, addr):
                return None
        except PeerRestarted as exc:
            raise TrainingNodeError(f"{self.name}: {peer} at {exc}") from None
        cid = inc.connection_id
        assert cid is not None
        conn = self.recv_conns[peer] = self._by_cid[cid] = Connection(self.opts.config, cid,
                                                                       seed=self._recv_seed[peer])
        pump = self._recv_pumps.get(peer)
        if pump is not None:
            pump.conn = conn  # its pump drives the adopted connection from now on
        return conn

    def _drain_ev(self, sock: socket.socket, now: float) -> int:
        # Nothing is sent to the source ports; what they get is an ICMP error for an earlier send.
        _, n = read_batch(sock.recvfrom, self._recv_size)
        self.sent.refused += n
        return n

    # -- the node -----------------------------------------------------------------------------------

    def _dispatch(self, sends: list[tuple[str, bytes]], now: float) -> None:
        for dst, msg in sends:
            conn = self.conns.get(dst)
            if conn is None:
                logger.warning("%s: no connection to %s; message dropped", self.name, dst)
                continue
            conn.send_message(msg, now)

    def _on_event(self, peer: str, event: Event, now: float) -> None:
        if not isinstance(event, MessageReceived):
            return
        node = self.rank if self.rank is not None else self.storage
        try:
            self._dispatch(node.receive(peer, event.data, now), now)  # type: ignore[union-attr]
        except MessageError as exc:
            self.counters["message_errors"] += 1
            logger.warning("%s: dropped a message from %s: %s", self.name, peer, exc)

    def _turn(self, now: float) -> float | None:
        for pump in self.pumps:
            pump.fire(now)
        for pump in self.pumps:
            pump.events(now)
        rank = self.rank
        if rank is not None:
            self._dispatch(rank.advance(time.monotonic()), now)
        for pump in self.pumps:
            pump.flush(now)
        wake = earliest(rank.wake_time() if rank is not None else None, self.pumps)
        if self._ended(now):
            if self._ended_at is None:
                self._ended_at = now
            idle = all(c.idle for c in (*self.conns.values(), *self.recv_conns.values()))
            if (idle and now - self._ended_at >= LINGER_S) or now - self._ended_at >= 10 * LINGER_S:
                self.stop("done")
                return None
            until = self._ended_at + LINGER_S
            wake = until if wake is None or until < wake else wake
        if now - self._last_rx > self.opts.timeout and not self._waiting_is_fine():
            raise TrainingNodeError(f"{self.name}: nothing heard for {self.opts.timeout:g} s "
                                    f"({self._where()}); is every node running?")
        limit = self._last_rx + self.opts.timeout + 0.01
        return limit if wake is None or limit < wake else wake

    def _ended(self, now: float) -> bool:
        if self.rank is not None:
            return self.rank.done
        coord = self.storage.coordinator if self.storage is not None else None
        return coord is not None and coord.ended

    def _waiting_is_fine(self) -> bool:
        """A storage host that is not the coordinator hears nothing between checkpoints: no timeout."""
        return self.rank is None and (self.storage is None or self.storage.coordinator is None)

    def _where(self) -> str:
        if self.rank is not None:
            return f"step {self.rank.step}, phase {self.rank.phase}, epoch {self.rank.epoch}"
        return "serving storage"

    def run(self) -> None:
        if self.listen is None:
            self.open()
        now = self._last_rx = time.monotonic()
        self.started_unix = time.time()
        if self.rank is not None:
            self._dispatch(self.rank.start(now), now)
        self._run_loop()
        now = time.monotonic()
        for pump in self.pumps:
            pump.flush(now)

    # -- results ------------------------------------------------------------------------------------

    def results(self) -> dict[str, Any]:
        mono_to_unix = time.time() - time.monotonic()  # the node's clock is monotonic; reports are UNIX
        out: dict[str, Any] = {
            "name": self.name,
            "role": "rank" if self.rank is not None else "storage",
            "error": self.error,
            "stop_reason": self.stop_reason,
            "started_unix": self.started_unix,
            "clock_offset_unix": mono_to_unix,
            "transport": {
                "retransmissions": sum(c.metrics().get("sender", {}).get("retransmissions", 0)
                                       for c in self.conns.values()),
                "datagrams_sent": self.sent.datagrams_sent,
                "send_errors": self.sent.send_errors,
                "refused": self.sent.refused,
                **self.counters,
                "config": self.opts.config.to_dict(),
            },
            **self.cpu_metrics(),
        }
        if self.rank is not None:
            out["report"] = rank_report(self.rank)
        if self.storage is not None:
            out["storage"] = self.storage.stats()
            if self.storage.coordinator is not None:
                out["restarts"] = self.storage.coordinator.restarts
                out["ended"] = self.storage.coordinator.ended
        return out
