"""Ring all-reduce over the fabriclab transport: one worker per host, or the whole ring in-process.

``fabriclab allreduce --rank R --peers IP:PORT,... --size N --iterations K --json-out F`` (cli/allreduce.py)
runs rank R of the ring (algorithm, barrier and phases in transport/collective/ring.py). The worker listens on its own
``peers[R]`` port for its left neighbour's data and sends to ``peers[R+1]`` from one UDP socket per
entropy value, bound to ``base_port + EV``, exactly as the srd Sender and Receiver do; both directions
run in the event loop they share (transport/io/eventloop.py) over two sans-I/O ``Connection`` objects.
After every iteration the result is compared bit for bit with the reference sum computed in the ring's
own order of float32 additions.

`RankLoop` is what this worker shares with the other collectives' (transport/io/collective.py, chosen
with ``--collective``): a rank's run from barrier to linger, its timeouts and its results' common keys;
`WorkerOptions` are both workers' options.

``transport.sim.ringsim.ring_allreduce_simulated`` runs the same ``RingRank`` for all ranks in one process
over simulated links with a virtual clock, so tests and experiments get deterministic results fast.

Exit status: 0 correct, 1 mismatch, 2 bad input or a timeout, 143 stopped by SIGTERM/SIGINT (the JSON is
written in every case once the options are valid).
"""

from __future__ import annotations

import errno
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from transport.collective.base import RankRun
from transport.collective.plan import canonical
from transport.collective.report import bound
from transport.collective.ring import (
    DEFAULT_PIECE_BYTES,
    DTYPE,
    HEADER,
    Phase,
    PieceError,
    RingProtocolError,
    RingRank,
    RingWorker,
    make_input,
    reference_from_seed,
)
from transport.core import wire
from transport.core.config import ConfigError, TransportConfig
from transport.core.connection import Connection, MessageAcked, MessageReceived
from transport.core.contract import DEFAULT_BASE_PORT, PORT_ALIGNMENT, base_port_problem, is_aligned
from transport.core.events import Event
from transport.core.pump import Datagrams, Pump, earliest, linger
from transport.core.schema import AllreduceMetrics
from transport.io.endpoint import resolve
from transport.io.eventloop import (
    RECV_BATCH,
    EventLoop,
    SendCounters,
    SocketSender,
    mark_control,
    read_batch,
    socket_drops,
)
from transport.io.incarnation import PeerIncarnation, PeerRestarted, fresh_connection_id

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_USAGE = 2
EXIT_SIGNAL = 143  # the shell's code for a process ended by SIGTERM
BASE_PORT_STRIDE = 64  # default base port of rank r is 40000 + 64 r, so ranks sharing a host do not clash
DEFAULT_TIMEOUT = 30.0
DEFAULT_LINGER = 0.3


class AllReduceError(Exception):
    """Bad input, a timeout or a peer's piece that cannot be right: reported as one line, exit status 2."""


def bandwidth_bound(n_ranks: int, nbytes: int, link_rate_mbps: float | None) -> float | None:
    """Lower bound of one ring all-reduce: 2(N-1)/N of the array crosses each rank's link."""
    b = bound("all-reduce", n_ranks, nbytes, link_rate_mbps)
    return b.total_s if b else None


def summary(times: list[float]) -> dict[str, float | None]:
    if not times:
        return {"mean_s": None, "min_s": None, "max_s": None}
    return {"mean_s": float(np.mean(times)), "min_s": min(times), "max_s": max(times)}


# --------------------------------------------------------------------------------------------------
# One rank over real UDP sockets


@dataclass
class WorkerOptions:
    rank: int
    peers: list[tuple[str, int]]
    size: int
    iterations: int = 1
    config: TransportConfig = field(default_factory=TransportConfig)
    base_port: int | None = None  # None: 40000 + 64 * rank
    seed: int = 0
    timeout: float = DEFAULT_TIMEOUT
    start_at: float | None = None  # UNIX time at which iteration 1 starts (after the barrier)
    link_rate_mbps: float | None = None
    piece_bytes: int = DEFAULT_PIECE_BYTES
    bind: str | None = None
    linger: float = DEFAULT_LINGER
    collective: str = "ring"  # ring: the ring worker (UdpRingWorker); else a plan collective (io/collective.py)
    group: int = 1  # ranks per group (hierarchical)
    local_rate_mbps: float | None = None  # the group's local links, for the hierarchical bound

    @property
    def n_ranks(self) -> int:
        return len(self.peers)

    @property
    def source_base(self) -> int:
        return self.base_port if self.base_port is not None else DEFAULT_BASE_PORT + BASE_PORT_STRIDE * self.rank

    def validate(self) -> None:
        n = self.n_ranks
        if n < 1:
            raise AllReduceError("--peers: give at least one IP:PORT")
        if not 0 <= self.rank < n:
            raise AllReduceError(f"--rank {self.rank} is out of range: {n} peers give ranks 0..{n - 1}")
        if len(set(self.peers)) != n:
            raise AllReduceError("--peers: every rank needs its own IP:PORT; the list has duplicates")
        if self.size < 1:
            raise AllReduceError(f"--size {self.size}: use at least 1 element")
        if self.iterations < 1:
            raise AllReduceError(f"--iterations {self.iterations}: use at least 1")
        if not self.timeout > 0:
            raise AllReduceError(f"--timeout {self.timeout}: use a positive number of seconds")
        if self.link_rate_mbps is not None and not self.link_rate_mbps > 0:
            raise AllReduceError(f"--link-rate-mbps {self.link_rate_mbps}: use a positive rate")
        if self.local_rate_mbps is not None and not self.local_rate_mbps > 0:
            raise AllReduceError(f"--local-rate-mbps {self.local_rate_mbps}: use a positive rate")
        self._validate_collective()
        try:
            self.config.validate()
        except ConfigError as exc:
            raise AllReduceError(f"transport configuration: {exc}") from None
        base = self.source_base
        if problem := base_port_problem(base, self.config.num_evs):
            raise AllReduceError(f"--base-port: {problem}")
        if not is_aligned(base):
            logger.warning("base port %d is not a multiple of %d: source port low bits != EV", base, PORT_ALIGNMENT)
        max_piece = Connection(self.config, 1).max_message_size - HEADER.size
        if not DTYPE.itemsize <= self.piece_bytes <= max_piece:
            raise AllReduceError(f"--piece-bytes {self.piece_bytes}: use {DTYPE.itemsize}..{max_piece}")


    def _validate_collective(self) -> None:
        try:
            name = "ring" if self.collective == "ring" else canonical(self.collective)
        except ValueError as exc:
            raise AllReduceError(f"--collective: {exc}") from None
        if self.group < 1:
            raise AllReduceError(f"--group {self.group}: use at least 1 rank per group")
        if name != "hierarchical" and (self.group != 1 or self.local_rate_mbps is not None):
            raise AllReduceError("--group and --local-rate-mbps apply to --collective hierarchical only")
        if name == "hierarchical" and self.n_ranks % self.group:
            raise AllReduceError(f"--group {self.group}: the {self.n_ranks} peers do not split into groups of "
                                 f"{self.group}")


def bind_listen(family: int, bind: str, port: int, rank: int) -> socket.socket:
    """The socket on which rank ``rank`` hears its peers' data, bound to its own address and port."""
    s = socket.socket(family, socket.SOCK_DGRAM)
    try:
        s.bind((bind, port))
    except OSError as exc:
        s.close()
        if exc.errno == errno.EADDRINUSE:
            raise AllReduceError(f"port {port} of peer {rank} is in use on this host; pick another") from None
        raise AllReduceError(f"cannot bind {bind}:{port}: {exc.strerror}") from None
    # It sends only ACKs: control, served before data on shaped links.
    mark_control(s)
    return s


def bind_source(family: int, bind: str, base: int, ev: int, connect: Any = None,
                unreachable: str = "") -> socket.socket:
    """The source socket of entropy value ``ev`` (port ``base + ev``), connected to ``connect`` if given."""
    es = socket.socket(family, socket.SOCK_DGRAM)
    try:
        es.bind((bind, base + ev))
        if connect is not None:
            es.connect(connect)
    except OSError as exc:
        es.close()
        if exc.errno == errno.EADDRINUSE:
            raise AllReduceError(
                f"source port {base + ev} (base port {base} + EV {ev}) is in use; choose another --base-port"
            ) from None
        raise AllReduceError(f"{unreachable or f'cannot bind {bind}:{base + ev}'}: {exc.strerror}") from None
    return es


class RankLoop(EventLoop):
    """What every collective worker over UDP shares: its `RankRun` (``self.run_state``) driven by the
    event loop, from the barrier through the iterations to the linger, with its timeouts.

    A subclass opens its sockets, holds its pumps (``self.pumps``), submits a rank's messages
    (`_submit`), says when everything it sent is acknowledged (`_sends_idle`), computes the reference
    (`_reference`) and runs its pumps in `_pump_turn`.
    """

    opts: WorkerOptions
    run_state: RankRun
    pumps: list[Pump]

    def _init_run(self, opts: WorkerOptions) -> None:
        self.opts = opts
        self.n = opts.n_ranks
        self.rank = opts.rank
        self.error: str | None = None
        self.listen: socket.socket | None = None
        self.ev_socks: list[socket.socket] = []
        self._last_progress = 0.0
        self._last_rx = 0.0
        self.started_unix: float | None = None
        self.sent = SendCounters()  # every connection's sends, and refused reads
        self.counters = {"datagrams_received": 0, "foreign_datagrams": 0, "protocol_errors": 0}

    @property
    def phase(self) -> Phase:
        return self.run_state.phase

    @property
    def iteration_times(self) -> list[float]:
        return self.run_state.iteration_times

    @property
    def correct(self) -> bool | None:
        return self.run_state.correct

    @property
    def mismatch(self) -> dict | None:
        return self.run_state.mismatch

    @property
    def barrier_s(self) -> float | None:
        return self.run_state.barrier_s

    def open(self) -> None:
        raise NotImplementedError

    def _submit(self, msgs: list, now: float) -> None:
        raise NotImplementedError

    def _sends_idle(self) -> bool:
        raise NotImplementedError

    def _reference(self) -> np.ndarray:
        raise NotImplementedError

    def _pump_turn(self, now: float) -> None:
        raise NotImplementedError

    def _timeout_message(self) -> str:
        raise NotImplementedError

    # -- rank events --------------------------------------------------------------------------------

    def _on_message(self, data: bytes, now: float) -> None:
        try:
            self._submit(self.run_state.receive(data, now), now)
        except PieceError as exc:
            # A piece of this run that cannot be right: no result of the run can be trusted any more.
            self.counters["protocol_errors"] += 1
            raise AllReduceError(f"{exc}{self._message_source()}") from None
        except RingProtocolError as exc:
            self.counters["protocol_errors"] += 1
            logger.warning("rank %d: dropped a message%s: %s", self.rank, self._message_source(), exc)

    def _message_source(self) -> str:
        return ""

    def _adopted_id(self, inc: PeerIncarnation | None, data: bytes, addr: tuple[Any, ...], who: str) -> int | None:
        """The connection id ``inc`` takes from ``data``, its peer's first DATA (transport/io/incarnation.py),
        or None; a first DATA under another id once one is taken ends the run with an error naming ``who``."""
        if inc is None:
            return None
        try:
            if not inc.adopt(data, addr):
                return None
        except PeerRestarted as exc:
            self.counters["protocol_errors"] += 1
            raise AllReduceError(f"rank {self.rank}: {who} at {exc}") from None
        return inc.connection_id

    def _advance(self, now: float) -> None:
        ready = self.run_state.phase is Phase.READY
        try:
            out = self.run_state.advance(now)
        except PieceError as exc:  # a kept piece of the new iteration conflicts with another copy
            self.counters["protocol_errors"] += 1
            raise AllReduceError(str(exc)) from None
        self._submit(out, now)
        if ready and self.run_state.phase is not Phase.READY:
            self.started_unix = time.time()

    def _on_recv_event(self, event: Event, now: float) -> None:
        if isinstance(event, MessageReceived):
            self._last_progress = now
            self._on_message(event.data, now)

    def _on_send_event(self, event: Event, now: float) -> None:
        if isinstance(event, MessageAcked):
            self._last_progress = now

    # -- loop ---------------------------------------------------------------------------------------

    def _turn(self, now: float) -> float | None:
        self._pump_turn(now)
        rs = self.run_state
        wake = earliest(rs.wake_time(), self.pumps)
        if rs.phase is Phase.DRAIN:
            # Stay until our data is acknowledged and the peers have gone quiet, so that a lost
            # final ACK can still be repeated for them.
            over, until = linger(now, rs.done_at if rs.done_at is not None else now, self._last_rx,
                                 self.opts.linger)
            if self._sends_idle() and over:
                rs.drained()
                self.stop("done")
                return None
            if wake is None or until < wake:
                wake = until
        elif rs.phase is Phase.READY and rs.start_time is not None:
            self._last_progress = max(self._last_progress, min(now, rs.start_time))
        if now - self._last_progress > self.opts.timeout:
            raise AllReduceError(self._timeout_message())
        limit = self._last_progress + self.opts.timeout + 0.01
        if wake is None or limit < wake:
            wake = limit
        return wake

    def run(self) -> None:
        """Barrier, iterations, linger; raises AllReduceError on timeouts."""
        reference = self._reference()
        if self.n == 1:
            # One rank: nobody to talk to; iterations only do what the rank does alone.
            now = time.monotonic()
            self.started_unix = time.time()
            self.run_state.start(now, reference)
            self.run_state.advance(now)
            return
        if self.listen is None:
            self.open()
        now = self._last_progress = time.monotonic()
        start_at = None if self.opts.start_at is None else now + self.opts.start_at - time.time()
        self._submit(self.run_state.start(now, reference, start_at), now)
        self._run_loop()
        now = time.monotonic()
        for pump in self.pumps:
            pump.flush(now)

    # -- results ------------------------------------------------------------------------------------

    def socket_drops(self) -> int | None:
        socks = [s for s in (self.listen, *self.ev_socks) if s is not None]
        try:
            return socket_drops(socks) if socks and socks[0].fileno() >= 0 else None
        except OSError:
            return None

    def run_fields(self) -> dict[str, Any]:
        """The results' keys about the run itself, the same for every collective."""
        opts = self.opts
        return {
            "correct": bool(self.correct) if self.correct is not None else False,
            "mismatch": self.mismatch,
            "error": self.error,
            "stop_reason": self.stop_reason,
            "phase": self.phase,
            "barrier_s": self.barrier_s,
            "started_unix": self.started_unix,
            "seed": opts.seed,
            "base_port": opts.source_base,
            "piece_bytes": opts.piece_bytes,
            # Counted as the endpoints' CPU in an arm's budget, as the srd endpoints' is.
            **self.cpu_metrics(),
        }

    def socket_fields(self) -> dict[str, Any]:
        """The transport results' keys about the sockets."""
        return {
            "datagrams_sent": self.sent.datagrams_sent,
            "send_errors": self.sent.send_errors,
            "refused": self.sent.refused,
            **self.counters,
            "socket_drops": self.socket_drops(),
            "config": self.opts.config.to_dict(),
        }


class UdpRingWorker(RankLoop):
    """Rank ``opts.rank`` of the ring over real sockets: a barrier, the iterations, a short linger.

    The rank's logic is a `RingRank` (transport/collective/ring.py), the same as in the simulation; this class
    is its I/O: the listen socket for the left neighbour's data, one socket per EV towards the right
    neighbour, the shared event loop, timeouts and the linger before exiting.
    """

    role = "allreduce"

    def __init__(self, opts: WorkerOptions) -> None:
        opts.validate()
        super().__init__(opts.config)
        self._init_run(opts)
        n, r = opts.n_ranks, opts.rank
        self.left = opts.peers[(r - 1) % n]
        self.right = opts.peers[(r + 1) % n]
        # Each start sends under a fresh connection id, and the left neighbour's is taken from its
        # first DATA (transport/io/incarnation.py): a restarted rank is never matched to the state
        # its old self left behind, which acknowledged its new data as duplicates.
        base = opts.seed * 1000 + 2 * r
        self.send_conn = Connection(opts.config, fresh_connection_id(), seed=base)
        self._recv_seed = base + 1
        self.recv_conn = Connection(opts.config, 0, seed=base + 1)  # replaced by _adopt()
        self._recv_cid: int | None = None
        self._left_incarnation: PeerIncarnation | None = None  # the left neighbour's host, from open()
        self.data = make_input(opts.seed, r, opts.size)
        self.worker = RingWorker(r, n, self.data, opts.iterations, max(1, opts.piece_bytes // DTYPE.itemsize))
        self.ring = self.run_state = RingRank(self.worker)
        self._evaddr: dict[int, Any] = {}
        self._left_addr: Any = None
        # Data to the right neighbour over the EV sockets, ACKs to the left one (set up in open()).
        self.send_pump = Pump(self.send_conn, self._send_data, self._on_send_event)
        self.recv_pump = Pump(self.recv_conn, self._send_acks, self._on_recv_event)
        self.pumps = [self.send_pump, self.recv_pump]
        self._data_sender: SocketSender | None = None
        self._ack_sender: SocketSender | None = None

    # -- sockets ----------------------------------------------------------------------------------------

    def open(self) -> None:
        opts = self.opts
        host, port = opts.peers[self.rank]
        lfamily, _ = resolve(host, port)
        rfamily, rdest = resolve(*self.right)
        self._left_incarnation = PeerIncarnation(resolve(*self.left)[1][0])
        # Listen on this rank's own address from --peers, not on every interface of the machine.
        s = bind_listen(lfamily, opts.bind or host, port, self.rank)
        self._register(s, self._drain_listen)
        self.listen = s
        sendto = s.sendto
        evaddr_get = self._evaddr.get
        # Each ACK goes back to the socket that sent the DATA it names.
        self._ack_sender = SocketSender(lambda dgram, ev: sendto(dgram, evaddr_get(ev, self._left_addr)), self.sent)
        if self.n == 1:
            return
        sbind = opts.bind or ("::" if rfamily == socket.AF_INET6 else "0.0.0.0")
        base = opts.source_base
        for ev in range(opts.config.num_evs):
            es = bind_source(rfamily, sbind, base, ev, rdest,
                             f"cannot reach right neighbour {self.right[0]}:{self.right[1]}")
            self._register(es, partial(self._drain_ev, es.recv))
            self.ev_socks.append(es)
        sends = [es.send for es in self.ev_socks]
        self._data_sender = SocketSender(lambda dgram, ev: sends[ev](dgram), self.sent)

    # -- ring events --------------------------------------------------------------------------------------

    def _submit(self, msgs: list[bytes], now: float) -> None:
        send = self.send_conn.send_message
        for m in msgs:
            send(m, now)

    def _message_source(self) -> str:
        return f" from {self.left[0]}:{self.left[1]}"

    def _sends_idle(self) -> bool:
        return self.send_conn.idle

    def _reference(self) -> np.ndarray:
        return reference_from_seed(self.n, self.opts.size, self.opts.seed)

    # -- loop -------------------------------------------------------------------------------------------

    def _drain_listen(self, now: float) -> int:
        batch, n = read_batch(self.listen.recvfrom, self._recv_size)  # type: ignore[union-attr]
        receive = self.recv_conn.receive_datagram
        cid = self._recv_cid
        evaddr = self._evaddr
        for data, addr in batch:
            if len(data) < wire.CONN_ID_OFFSET + 4 or (wire.read_conn_id(data) != cid and not self._adopt(data, addr)):
                self.counters["foreign_datagrams"] += 1
                continue
            if cid != self._recv_cid:  # just adopted
                cid, receive = self._recv_cid, self.recv_conn.receive_datagram
            # Addresses are learnt only from datagrams that parsed and passed the CRC.
            if receive(data, now) and data[wire.TYPE_OFFSET] == wire.TYPE_DATA:
                # The ACK names the DATA packet's EV and goes back to the socket that sent it.
                evaddr[wire.read_ev(data)] = addr
                self._left_addr = addr
        if n:
            self.counters["datagrams_received"] += n
            self._last_rx = now
        return n

    def _adopt(self, data: bytes, addr: tuple[Any, ...]) -> bool:
        """Take the connection id of the left neighbour's first DATA as its incarnation's; a DATA of
        its under another id later means it restarted, which ends the run with an error."""
        cid = self._adopted_id(self._left_incarnation, data, addr, "the left neighbour")
        if cid is None:
            return False
        self.recv_conn = self.recv_pump.conn = Connection(self.opts.config, cid, seed=self._recv_seed)
        self._recv_cid = cid
        return True

    def _drain_ev(self, sock_recv: Callable[[int], bytes], now: float) -> int:
        receive = self.send_conn.receive_datagram
        size = self._recv_size
        n = 0
        while n < RECV_BATCH:
            try:
                data = sock_recv(size)
            except BlockingIOError:
                break
            except ConnectionRefusedError:
                self.sent.refused += 1  # the right neighbour is not listening (yet)
                continue
            except OSError:
                break
            n += 1
            receive(data, now)
        self.counters["datagrams_received"] += n
        return n

    def _send_data(self, out: Datagrams, now: float) -> None:
        if self._data_sender is not None:
            self._data_sender(out, now)

    def _send_acks(self, out: Datagrams, now: float) -> None:
        # ACKs answer DATA, so the left neighbour's address is known by the time there are any.
        if self._ack_sender is not None and self._left_addr is not None:
            self._ack_sender(out, now)

    def _pump_turn(self, now: float) -> None:
        sp, rp = self.send_pump, self.recv_pump
        sp.fire(now)
        rp.fire(now)
        rp.events(now)
        sp.events(now)
        # The clock is read again: comparing an iteration with the reference takes time that no
        # other rank waits for, so the next iteration starts (and its time counts) from its end.
        self._advance(time.monotonic())
        sp.flush(now)
        rp.flush(now)

    def _timeout_message(self) -> str:
        t = self.opts.timeout
        left = f"{self.left[0]}:{self.left[1]}"
        right = f"{self.right[0]}:{self.right[1]}"
        if self.phase is Phase.BARRIER:
            return (f"rank {self.rank}: barrier not complete after {t:g} s (left {left}, right {right}, "
                    f"{self.sent.refused} refused); start every rank with the same --peers and --seed")
        if self.phase is Phase.DRAIN:
            return (f"rank {self.rank}: right neighbour {right} acknowledged nothing for {t:g} s after the "
                    "last iteration")
        got, want = self.worker.progress
        return (f"rank {self.rank}: iteration {self.worker.iteration + 1} stalled for {t:g} s with {got}/{want} "
                f"pieces from left {left}; is every rank still running?")

    # -- results ----------------------------------------------------------------------------------------

    def results(self) -> AllreduceMetrics:
        opts = self.opts
        nbytes = opts.size * DTYPE.itemsize
        bound = bandwidth_bound(self.n, nbytes, opts.link_rate_mbps)
        times = summary(self.iteration_times)
        mean = times["mean_s"]
        return {
            "rank": self.rank,
            "peers": [f"{h}:{p}" for h, p in opts.peers],
            "size": opts.size,
            "bytes": nbytes,
            "iterations": opts.iterations,
            "iterations_done": len(self.iteration_times),
            "iteration_times_s": self.iteration_times,
            "mean_s": mean,
            "min_s": times["min_s"],
            "max_s": times["max_s"],
            "bound_s": bound,
            "link_rate_mbps": opts.link_rate_mbps,
            "ratio_to_bound": (mean / bound) if (mean is not None and bound) else None,
            "algbw_gbps": (nbytes * 8 / mean / 1e9) if mean else None,
            "busbw_gbps": (2 * (self.n - 1) / self.n * nbytes * 8 / mean / 1e9) if mean and self.n > 1 else None,
            **self.run_fields(),  # type: ignore[typeddict-item]
            "ring_stats": {"duplicates": self.worker.duplicates, "stale": self.worker.stale},
            "transport": {
                "send": {"to": f"{self.right[0]}:{self.right[1]}", **self.send_conn.metrics()},
                "recv": {"from": f"{self.left[0]}:{self.left[1]}", **self.recv_conn.metrics()},
                **self.socket_fields(),  # type: ignore[typeddict-item]
            },
        }
