"""Ring all-reduce over the fabriclab transport: one worker per host, or the whole ring in-process.

``fabriclab allreduce --rank R --peers IP:PORT,... --size N --iterations K --json-out F`` (cli/allreduce.py)
runs rank R of the ring (algorithm in transport/ring.py). The worker listens on its own ``peers[R]`` port for
its left neighbour's data and sends to ``peers[R+1]`` from one UDP socket per entropy value, bound to
``base_port + EV``, exactly as transport/endpoint.py's Sender and Receiver do; both directions run in
one epoll loop over two sans-I/O ``Connection`` objects. After every iteration the result is compared
bit for bit with the reference sum computed in the ring's own order of float32 additions.

``ring_allreduce_simulated`` runs the same algorithm for all ranks over transport.simnet with a virtual
clock, one simulated network per ring edge, so tests and experiments get deterministic results fast.

Exit status: 0 correct, 1 mismatch, 2 bad input or a timeout, 143 stopped by SIGTERM/SIGINT (the JSON is
written in every case once the options are valid).
"""

from __future__ import annotations

import errno
import logging
import select
import socket
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from transport import wire
from transport.config import ConfigError, TransportConfig
from transport.connection import Connection, MessageAcked, MessageReceived
from transport.endpoint import resolve, socket_drops
from transport.ring import (
    DEFAULT_PIECE_BYTES,
    DTYPE,
    HEADER,
    KIND_BARRIER,
    KIND_DATA,
    RingProtocolError,
    RingWorker,
    decode_header,
    encode_barrier,
    first_mismatch,
    make_input,
    reference_from_seed,
    ring_reference,
)
from transport.simnet import PathSpec, SimNetwork

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_USAGE = 2
EXIT_SIGNAL = 143  # the shell's code for a process ended by SIGTERM
DEFAULT_BASE_PORT = 40000
BASE_PORT_STRIDE = 64  # default base port of rank r is 40000 + 64 r, so ranks sharing a host do not clash
SOCKET_BUFFER_BYTES = 4 << 20
RECV_BATCH = 256
SPIN_BELOW = 0.001  # epoll sleeps in whole milliseconds: shorter waits are polled
DEFAULT_TIMEOUT = 30.0
DEFAULT_LINGER = 0.3


class AllReduceError(Exception):
    """Bad input or a timeout: reported as one line, exit status 2."""


def edge_connection_id(n_ranks: int, seed: int, sender_rank: int) -> int:
    """The connection id of the ring edge sender_rank -> sender_rank+1, agreed without talking."""
    return zlib.crc32(f"fabriclab-allreduce:{n_ranks}:{seed}:{sender_rank}".encode()) or 1


def bandwidth_bound(n_ranks: int, nbytes: int, link_rate_mbps: float | None) -> float | None:
    """Lower bound of one ring all-reduce: 2(N-1)/N of the array crosses each rank's link."""
    if not link_rate_mbps or n_ranks < 2:
        return None
    return 2 * (n_ranks - 1) / n_ranks * nbytes * 8 / (link_rate_mbps * 1e6)


def _summary(times: list[float]) -> dict[str, float | None]:
    if not times:
        return {"mean_s": None, "min_s": None, "max_s": None}
    return {"mean_s": float(np.mean(times)), "min_s": min(times), "max_s": max(times)}


# --------------------------------------------------------------------------------------------------
# In-process ring over the simulated network


@dataclass
class SimAllReduceResult:
    results: list[np.ndarray]  # every rank's final array (of the last iteration)
    reference: np.ndarray
    correct: bool
    mismatch: dict | None  # first mismatch: {"rank", "iteration", "index", "got", "expected", ...}
    iteration_times: list[list[float]]  # [rank][iteration], virtual seconds
    duration: float  # virtual seconds until the last rank finished
    completed: bool
    edges: list[dict] = field(default_factory=list)  # per edge r -> r+1: sender, receiver, network


def ring_allreduce_simulated(
    n_ranks: int,
    size: int,
    seed: int = 0,
    config: TransportConfig | None = None,
    paths: Sequence[PathSpec] | Sequence[Sequence[PathSpec]] | None = None,
    *,
    iterations: int = 1,
    inputs: Sequence[np.ndarray] | None = None,
    piece_bytes: int = DEFAULT_PIECE_BYTES,
    time_limit: float = 60.0,
) -> SimAllReduceResult:
    """Run the ring for all ranks over simulated links (virtual clock, deterministic for a seed).

    ``paths`` are the paths of every ring edge (one SimNetwork per edge), or a list of path lists,
    one per edge r -> r+1. ``inputs`` overrides the seeded inputs (one array per rank).
    """
    if n_ranks < 1:
        raise ValueError("n_ranks must be >= 1")
    config = config or TransportConfig()
    config.validate()
    if inputs is None:
        inputs = [make_input(seed, r, size) for r in range(n_ranks)]
    if len(inputs) != n_ranks or any(len(x) != size for x in inputs):
        raise ValueError(f"inputs must be {n_ranks} arrays of {size} elements")
    reference = ring_reference(inputs)
    per_edge: list[list[PathSpec]]
    if not paths:
        per_edge = [[PathSpec()] for _ in range(n_ranks)]
    elif isinstance(paths[0], PathSpec):
        per_edge = [list(paths) for _ in range(n_ranks)]  # type: ignore[arg-type]
    else:
        per_edge = [list(p) for p in paths]  # type: ignore[arg-type]
        if len(per_edge) != n_ranks:
            raise ValueError(f"give one path list per edge ({n_ranks}), got {len(per_edge)}")

    piece_elems = max(1, piece_bytes // DTYPE.itemsize)
    workers = [RingWorker(r, n_ranks, inputs[r], iterations, piece_elems) for r in range(n_ranks)]
    nets = [SimNetwork(per_edge[r], seed=seed * 7919 + r) for r in range(n_ranks)]
    # Edge r joins send[r] (side 0 of nets[r]) to recv[r+1] (side 1 of nets[r]).
    send = [Connection(config, edge_connection_id(n_ranks, seed, r), seed=seed * 1000 + 2 * r) for r in range(n_ranks)]
    recv = [
        Connection(config, edge_connection_id(n_ranks, seed, (r - 1) % n_ranks), seed=seed * 1000 + 2 * r + 1)
        for r in range(n_ranks)
    ]
    started = [0.0] * n_ranks
    times: list[list[float]] = [[] for _ in range(n_ranks)]
    mismatch: dict | None = None
    finished = [False] * n_ranks
    now = 0.0

    def submit(r: int, msgs: list[bytes]) -> None:
        for m in msgs:
            send[r].send_message(m, now)

    def finish_iterations(r: int) -> None:
        nonlocal mismatch
        w = workers[r]
        while w.iteration_done and not finished[r]:
            times[r].append(now - started[r])
            bad = first_mismatch(w.buf, reference)
            if bad is not None and mismatch is None:
                mismatch = {"rank": r, "iteration": w.iteration, **bad}
            if w.iteration + 1 >= iterations:
                finished[r] = True
                break
            started[r] = now
            submit(r, w.start_iteration())

    if n_ranks > 1:
        for r in range(n_ranks):
            submit(r, workers[r].start_iteration())
    else:
        workers[0].start_iteration()
    for r in range(n_ranks):
        finish_iterations(r)

    while True:
        for r in range(n_ranks):
            conn = recv[r]
            while (event := conn.next_event()) is not None:
                if isinstance(event, MessageReceived):
                    submit(r, workers[r].receive(event.data))
            finish_iterations(r)
            while send[r].next_event() is not None:
                pass
        for r in range(n_ranks):
            for data, ev in send[r].datagrams_to_send(now):
                nets[r].send(0, data, ev, now)
            for data, ev in recv[(r + 1) % n_ranks].datagrams_to_send(now):
                nets[r].send(1, data, ev, now)
        if all(finished) and all(c.idle for c in send):
            break
        pending = [t for net in nets if (t := net.next_time()) is not None]
        pending += [t for c in (*send, *recv) if (t := c.get_timer()) is not None]
        if not pending:
            logger.debug("simulated ring stalled at %.6f", now)
            break
        nxt = max(now, min(pending))
        if nxt > time_limit:
            break
        now = nxt
        for r, net in enumerate(nets):
            for dst, data in net.pop_due(now):
                (send[r] if dst == 0 else recv[(r + 1) % n_ranks]).receive_datagram(data, now)
        for c in (*send, *recv):
            t = c.get_timer()
            if t is not None and t <= now:
                c.handle_timer(now)

    completed = all(finished)
    edges = [
        {
            "edge": f"{r}->{(r + 1) % n_ranks}",
            "sender": send[r].metrics(),
            "receiver": recv[(r + 1) % n_ranks].metrics(),
            "network": nets[r].link_stats(),
        }
        for r in range(n_ranks)
    ]
    return SimAllReduceResult(
        results=[w.buf.copy() for w in workers],
        reference=reference,
        correct=completed and mismatch is None,
        mismatch=mismatch if completed else (mismatch or {"error": f"not finished within {time_limit} s"}),
        iteration_times=times,
        duration=now,
        completed=completed,
        edges=edges,
    )


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
        try:
            self.config.validate()
        except ConfigError as exc:
            raise AllReduceError(f"transport configuration: {exc}") from None
        base = self.source_base
        if not 1 <= base <= 65536 - self.config.num_evs:
            raise AllReduceError(
                f"--base-port {base} + {self.config.num_evs} EVs does not fit 1-65535; "
                f"use a base port <= {65536 - self.config.num_evs}"
            )
        if base % 16:
            logger.warning("base port %d is not a multiple of 16: source port low bits != EV", base)
        max_piece = Connection(self.config, 1).max_message_size - HEADER.size
        if not DTYPE.itemsize <= self.piece_bytes <= max_piece:
            raise AllReduceError(f"--piece-bytes {self.piece_bytes}: use {DTYPE.itemsize}..{max_piece}")


def _tune(sock: socket.socket) -> None:
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)
        except OSError:
            pass
    sock.setblocking(False)


class UdpRingWorker:
    """Rank ``opts.rank`` of the ring over real sockets: a barrier, the iterations, a short linger."""

    def __init__(self, opts: WorkerOptions) -> None:
        opts.validate()
        self.opts = opts
        n, r = opts.n_ranks, opts.rank
        self.n = n
        self.rank = r
        self.left = opts.peers[(r - 1) % n]
        self.right = opts.peers[(r + 1) % n]
        cfg = opts.config
        cseed = opts.seed * 1000 + 2 * r
        self.send_conn = Connection(cfg, edge_connection_id(n, opts.seed, r), seed=cseed)
        self.recv_conn = Connection(cfg, edge_connection_id(n, opts.seed, (r - 1) % n), seed=cseed + 1)
        self._recv_cid = self.recv_conn.connection_id
        self.data = make_input(opts.seed, r, opts.size)
        self.worker = RingWorker(r, n, self.data, opts.iterations, max(1, opts.piece_bytes // DTYPE.itemsize))
        self.reference: np.ndarray | None = None
        self.iteration_times: list[float] = []
        self.correct: bool | None = None
        self.mismatch: dict | None = None
        self.error: str | None = None
        self.phase = "setup"
        self.listen: socket.socket | None = None
        self.ev_socks: list[socket.socket] = []
        self._ep = select.epoll()
        self._fd_ev: dict[int, int] = {}
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._ep.register(self._wake_r.fileno(), select.EPOLLIN)
        self._stopping = False
        self.stop_reason = ""
        self._evaddr: dict[int, Any] = {}
        self._left_addr: Any = None
        self._iter_start = 0.0
        self._start_at_mono: float | None = None
        self._barrier_done_at: float | None = None
        self._done_at: float | None = None
        self._last_progress = 0.0
        self._last_rx = 0.0
        self.started_unix: float | None = None
        self.barrier_s: float | None = None
        self.counters = {
            "datagrams_sent": 0, "datagrams_received": 0, "send_errors": 0, "refused": 0,
            "foreign_datagrams": 0, "protocol_errors": 0,
        }

    # -- sockets ----------------------------------------------------------------------------------------

    def open(self) -> None:
        opts = self.opts
        host, port = opts.peers[self.rank]
        lfamily, _ = resolve(host, port)
        rfamily, rdest = resolve(*self.right)
        # Listen on this rank's own address from --peers, not on every interface of the machine.
        bind = opts.bind or host
        s = socket.socket(lfamily, socket.SOCK_DGRAM)
        try:
            s.bind((bind, port))
        except OSError as exc:
            s.close()
            if exc.errno == errno.EADDRINUSE:
                raise AllReduceError(f"port {port} of peer {self.rank} is in use on this host; pick another") from None
            raise AllReduceError(f"cannot bind {bind}:{port}: {exc.strerror}") from None
        _tune(s)
        self.listen = s
        self._ep.register(s.fileno(), select.EPOLLIN)
        if self.n == 1:
            return
        sbind = opts.bind or ("::" if rfamily == socket.AF_INET6 else "0.0.0.0")
        base = opts.source_base
        for ev in range(opts.config.num_evs):
            es = socket.socket(rfamily, socket.SOCK_DGRAM)
            try:
                es.bind((sbind, base + ev))
                es.connect(rdest)
            except OSError as exc:
                es.close()
                if exc.errno == errno.EADDRINUSE:
                    raise AllReduceError(
                        f"source port {base + ev} (base port {base} + EV {ev}) is in use; choose another --base-port"
                    ) from None
                raise AllReduceError(f"cannot reach right neighbour {self.right[0]}:{self.right[1]}: "
                                     f"{exc.strerror}") from None
            _tune(es)
            self._ep.register(es.fileno(), select.EPOLLIN)
            self._fd_ev[es.fileno()] = ev
            self.ev_socks.append(es)
        self._sends = [es.send for es in self.ev_socks]

    def close(self) -> None:
        for s in (*([self.listen] if self.listen else []), *self.ev_socks, self._wake_r, self._wake_w):
            try:
                s.close()
            except OSError:
                pass
        self._ep.close()

    def stop(self, reason: str) -> None:
        """Finish the current turn and return from run(); safe from a signal handler."""
        if not self._stopping:
            self.stop_reason = reason
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    # -- ring events --------------------------------------------------------------------------------------

    def _submit(self, msgs: list[bytes], now: float) -> None:
        send = self.send_conn.send_message
        for m in msgs:
            send(m, now)

    def _begin_allreduce(self, now: float) -> None:
        if self._barrier_done_at is None:
            self._barrier_done_at = now
            self.barrier_s = now - self._t0
            if self.opts.start_at is not None:
                self._start_at_mono = now + max(0.0, self.opts.start_at - time.time())
            else:
                self._start_at_mono = now

    def _maybe_start(self, now: float) -> None:
        if self.phase == "barrier" and self._start_at_mono is not None and now >= self._start_at_mono:
            self.phase = "allreduce"
            self.started_unix = time.time()
            self._start_iteration(now)

    def _start_iteration(self, now: float) -> None:
        self._iter_start = now
        self._submit(self.worker.start_iteration(), now)
        self._check_iteration(now)

    def _check_iteration(self, now: float) -> None:
        w = self.worker
        while self.phase == "allreduce" and w.iteration_done:
            self.iteration_times.append(now - self._iter_start)
            bad = first_mismatch(w.buf, self.reference)  # type: ignore[arg-type]
            if bad is not None and self.mismatch is None:
                self.mismatch = {"iteration": w.iteration, **bad}
                logger.warning("rank %d iteration %d differs from the reference: %s", self.rank, w.iteration, bad)
            if w.iteration + 1 >= self.opts.iterations:
                self.correct = self.mismatch is None
                self.phase = "drain"
                self._done_at = now
                return
            # Iteration time excludes the comparison above, which no other rank waits for.
            now = time.monotonic()
            self._iter_start = now
            self._submit(w.start_iteration(), now)

    def _on_message(self, data: bytes, now: float) -> None:
        try:
            kind = decode_header(data)[0]
            if kind == KIND_BARRIER:
                self._on_barrier(decode_header(data)[2], now)
            elif kind == KIND_DATA:
                self._submit(self.worker.receive(data), now)
                self._check_iteration(now)
            else:
                raise RingProtocolError(f"unknown message kind {kind}")
        except RingProtocolError as exc:
            self.counters["protocol_errors"] += 1
            logger.warning("rank %d: dropped a message from %s:%d: %s", self.rank, *self.left, exc)

    def _on_barrier(self, round_no: int, now: float) -> None:
        # Rank 0 sends round 1 round the ring; when it returns every rank is listening, and round 2
        # tells each rank (as it forwards it) to start. Rank 0 starts as it sends round 2.
        if self.rank == 0:
            if round_no == 1:
                self._submit([encode_barrier(2)], now)
                self._begin_allreduce(now)
            return
        self._submit([encode_barrier(round_no)], now)
        if round_no == 2:
            self._begin_allreduce(now)

    # -- loop -------------------------------------------------------------------------------------------

    def _drain_listen(self, now: float) -> None:
        recvfrom = self.listen.recvfrom  # type: ignore[union-attr]
        size = max(65535, self.opts.config.mtu + 64)
        receive = self.recv_conn.receive_datagram
        cid = self._recv_cid
        evaddr = self._evaddr
        n = 0
        while n < RECV_BATCH:
            try:
                data, addr = recvfrom(size)
            except BlockingIOError:
                break
            except OSError:
                n += 1
                continue
            n += 1
            if len(data) < wire.CONN_ID_OFFSET + 4 or wire.read_conn_id(data) != cid:
                self.counters["foreign_datagrams"] += 1
                continue
            if data[wire.TYPE_OFFSET] == wire.TYPE_DATA:
                # The ACK names the DATA packet's EV and goes back to the socket that sent it.
                evaddr[wire.read_ev(data)] = addr
                self._left_addr = addr
            receive(data, now)
        if n:
            self.counters["datagrams_received"] += n
            self._last_rx = now

    def _drain_ev(self, fd: int, now: float) -> None:
        sock_recv = self.ev_socks[self._fd_ev[fd]].recv
        receive = self.send_conn.receive_datagram
        n = 0
        while n < RECV_BATCH:
            try:
                data = sock_recv(65535)
            except BlockingIOError:
                break
            except ConnectionRefusedError:
                self.counters["refused"] += 1  # the right neighbour is not listening (yet)
                continue
            except OSError:
                break
            n += 1
            receive(data, now)
        self.counters["datagrams_received"] += n

    def _flush(self, now: float) -> None:
        out = self.send_conn.datagrams_to_send(now)
        if out:
            sends = self._sends
            for dgram, ev in out:
                try:
                    sends[ev](dgram)
                except BlockingIOError:
                    self.counters["send_errors"] += 1  # lost like a switch drop; the transport recovers
                except ConnectionRefusedError:
                    self.counters["refused"] += 1
                except OSError:
                    self.counters["send_errors"] += 1
            self.counters["datagrams_sent"] += len(out)
        acks = self.recv_conn.datagrams_to_send(now)
        if acks and self._left_addr is not None:
            sendto = self.listen.sendto  # type: ignore[union-attr]
            get = self._evaddr.get
            left = self._left_addr
            for dgram, ev in acks:
                try:
                    sendto(dgram, get(ev, left))
                except OSError:
                    self.counters["send_errors"] += 1
            self.counters["datagrams_sent"] += len(acks)

    def _turn(self, now: float) -> float | None:
        send, recv = self.send_conn, self.recv_conn
        for conn in (send, recv):
            t = conn.get_timer()
            if t is not None and t <= now:
                conn.handle_timer(now)
        while (event := recv.next_event()) is not None:
            if isinstance(event, MessageReceived):
                self._last_progress = now
                self._on_message(event.data, now)
        while (event := send.next_event()) is not None:
            if isinstance(event, MessageAcked):
                self._last_progress = now
        self._maybe_start(now)
        self._flush(now)
        wake = None
        for t in (send.get_timer(), recv.get_timer()):
            if t is not None and (wake is None or t < wake):
                wake = t
        if self.phase == "barrier" and self._start_at_mono is not None and (wake is None or self._start_at_mono < wake):
            wake = self._start_at_mono
        if self.phase == "drain":
            # Stay until our data is acknowledged and the left neighbour has gone quiet, so that a
            # lost final ACK can still be repeated for it.
            quiet_since = max(self._last_rx, self._done_at or now)
            if send.idle and (now - quiet_since >= self.opts.linger or now - self._done_at >= 10 * self.opts.linger):
                self.phase = "done"
                self.stop("done")
                return None
            limit = quiet_since + self.opts.linger
            if wake is None or limit < wake:
                wake = limit
        elif self.phase == "barrier" and self._start_at_mono is not None:
            self._last_progress = max(self._last_progress, min(now, self._start_at_mono))
        if now - self._last_progress > self.opts.timeout:
            raise AllReduceError(self._timeout_message())
        limit = self._last_progress + self.opts.timeout + 0.01
        if wake is None or limit < wake:
            wake = limit
        return wake

    def _timeout_message(self) -> str:
        t = self.opts.timeout
        left = f"{self.left[0]}:{self.left[1]}"
        right = f"{self.right[0]}:{self.right[1]}"
        if self.phase == "barrier":
            return (f"rank {self.rank}: barrier not complete after {t:g} s (left {left}, right {right}, "
                    f"{self.counters['refused']} refused); start every rank with the same --peers and --seed")
        if self.phase == "drain":
            return (f"rank {self.rank}: right neighbour {right} acknowledged nothing for {t:g} s after the "
                    "last iteration")
        got, want = self.worker.progress
        return (f"rank {self.rank}: iteration {self.worker.iteration + 1} stalled for {t:g} s with {got}/{want} "
                f"pieces from left {left}; is every rank still running?")

    def run(self) -> None:
        """Barrier, iterations, linger; raises AllReduceError on timeouts."""
        self.reference = reference_from_seed(self.n, self.opts.size, self.opts.seed)
        if self.n == 1:
            self._run_single()
            return
        if self.listen is None:
            self.open()
        mono = time.monotonic
        poll = self._ep.poll
        listen_fd = self.listen.fileno()  # type: ignore[union-attr]
        wake_fd = self._wake_r.fileno()
        self._t0 = self._last_progress = mono()
        self.phase = "barrier"
        if self.rank == 0:
            self._submit([encode_barrier(1)], self._t0)
        while not self._stopping:
            now = mono()
            wake = self._turn(now)
            if self._stopping:
                break
            timeout = -1.0 if wake is None else max(0.0, wake - now)
            if 0 < timeout < SPIN_BELOW:
                timeout = 0.0
            ready = poll(timeout)
            if not ready:
                continue
            now = mono()
            for fd, _ in ready:
                if fd == listen_fd:
                    self._drain_listen(now)
                elif fd == wake_fd:
                    try:
                        self._wake_r.recv(64)
                    except OSError:
                        pass
                else:
                    self._drain_ev(fd, now)
        self._flush(mono())

    def _run_single(self) -> None:
        """One rank: the ring is empty; iterations only copy the input."""
        self.phase = "allreduce"
        self.started_unix = time.time()
        self.barrier_s = 0.0
        self._start_iteration(time.monotonic())

    # -- results ----------------------------------------------------------------------------------------

    def results(self) -> dict[str, Any]:
        opts = self.opts
        nbytes = opts.size * DTYPE.itemsize
        bound = bandwidth_bound(self.n, nbytes, opts.link_rate_mbps)
        summary = _summary(self.iteration_times)
        mean = summary["mean_s"]
        socks = [s for s in (self.listen, *self.ev_socks) if s is not None]
        try:
            drops = socket_drops(socks) if socks and socks[0].fileno() >= 0 else None
        except OSError:
            drops = None
        return {
            "rank": self.rank,
            "peers": [f"{h}:{p}" for h, p in opts.peers],
            "size": opts.size,
            "bytes": nbytes,
            "iterations": opts.iterations,
            "iterations_done": len(self.iteration_times),
            "iteration_times_s": self.iteration_times,
            "mean_s": mean,
            "min_s": summary["min_s"],
            "max_s": summary["max_s"],
            "bound_s": bound,
            "link_rate_mbps": opts.link_rate_mbps,
            "ratio_to_bound": (mean / bound) if (mean is not None and bound) else None,
            "algbw_gbps": (nbytes * 8 / mean / 1e9) if mean else None,
            "busbw_gbps": (2 * (self.n - 1) / self.n * nbytes * 8 / mean / 1e9) if mean and self.n > 1 else None,
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
            "ring_stats": {"duplicates": self.worker.duplicates, "stale": self.worker.stale},
            "transport": {
                "send": {"to": f"{self.right[0]}:{self.right[1]}", **self.send_conn.metrics()},
                "recv": {"from": f"{self.left[0]}:{self.left[1]}", **self.recv_conn.metrics()},
                **self.counters,
                "socket_drops": drops,
                "config": opts.config.to_dict(),
            },
        }
