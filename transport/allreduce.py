"""Ring all-reduce over the fabriclab transport: one worker per host, or the whole ring in-process.

``python -m transport.allreduce --rank R --peers IP:PORT,... --size N --iterations K --json-out F`` runs
rank R of the ring (algorithm, barrier and phases in transport/ring.py). The worker listens on its own
``peers[R]`` port for its left neighbour's data and sends to ``peers[R+1]`` from one UDP socket per
entropy value, bound to ``base_port + EV``, exactly as the srd Sender and Receiver do; both directions
run in the event loop they share (transport/eventloop.py) over two sans-I/O ``Connection`` objects.
After every iteration the result is compared bit for bit with the reference sum computed in the ring's
own order of float32 additions.

``transport.ringsim.ring_allreduce_simulated`` runs the same ``RingRank`` for all ranks in one process
over simulated links with a virtual clock, so tests and experiments get deterministic results fast.

Exit status: 0 correct, 1 mismatch, 2 bad input or a timeout, 143 stopped by SIGTERM/SIGINT (the JSON is
written in every case once the options are valid).
"""

from __future__ import annotations

import argparse
import errno
import logging
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NoReturn

import numpy as np

from transport import wire
from transport.config import ConfigError, TransportConfig
from transport.connection import Connection, MessageAcked, MessageReceived
from transport.endpoint import EndpointError, resolve, write_json
from transport.eventloop import RECV_BATCH, EventLoop, read_batch, socket_drops
from transport.ring import (
    DEFAULT_PIECE_BYTES,
    DTYPE,
    HEADER,
    Phase,
    RingProtocolError,
    RingRank,
    RingWorker,
    make_input,
    rank_connections,
    reference_from_seed,
)
from transport.schema import AllreduceMetrics

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_USAGE = 2
EXIT_SIGNAL = 143  # the shell's code for a process ended by SIGTERM
DEFAULT_BASE_PORT = 40000
BASE_PORT_STRIDE = 64  # default base port of rank r is 40000 + 64 r, so ranks sharing a host do not clash
DEFAULT_TIMEOUT = 30.0
DEFAULT_LINGER = 0.3


class AllReduceError(Exception):
    """Bad input or a timeout: reported as one line, exit status 2."""


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


class UdpRingWorker(EventLoop):
    """Rank ``opts.rank`` of the ring over real sockets: a barrier, the iterations, a short linger.

    The rank's logic is a `RingRank` (transport/ring.py), the same as in the simulation; this class
    is its I/O: the listen socket for the left neighbour's data, one socket per EV towards the right
    neighbour, the shared event loop, timeouts and the linger before exiting.
    """

    role = "allreduce"

    def __init__(self, opts: WorkerOptions) -> None:
        opts.validate()
        super().__init__(opts.config)
        self.opts = opts
        n, r = opts.n_ranks, opts.rank
        self.n = n
        self.rank = r
        self.left = opts.peers[(r - 1) % n]
        self.right = opts.peers[(r + 1) % n]
        self.send_conn, self.recv_conn = rank_connections(opts.config, n, r, opts.seed)
        self._recv_cid = self.recv_conn.connection_id
        self.data = make_input(opts.seed, r, opts.size)
        self.worker = RingWorker(r, n, self.data, opts.iterations, max(1, opts.piece_bytes // DTYPE.itemsize))
        self.ring = RingRank(self.worker)
        self.error: str | None = None
        self.listen: socket.socket | None = None
        self.ev_socks: list[socket.socket] = []
        self._evaddr: dict[int, Any] = {}
        self._left_addr: Any = None
        self._last_progress = 0.0
        self._last_rx = 0.0
        self.started_unix: float | None = None
        self.counters = {
            "datagrams_sent": 0, "datagrams_received": 0, "send_errors": 0, "refused": 0,
            "foreign_datagrams": 0, "protocol_errors": 0,
        }

    @property
    def phase(self) -> Phase:
        return self.ring.phase

    @property
    def iteration_times(self) -> list[float]:
        return self.ring.iteration_times

    @property
    def correct(self) -> bool | None:
        return self.ring.correct

    @property
    def mismatch(self) -> dict | None:
        return self.ring.mismatch

    @property
    def barrier_s(self) -> float | None:
        return self.ring.barrier_s

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
        self._register(s, self._drain_listen)
        self.listen = s
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
            self._register(es, partial(self._drain_ev, es.recv))
            self.ev_socks.append(es)
        self._sends = [es.send for es in self.ev_socks]

    # -- ring events --------------------------------------------------------------------------------------

    def _submit(self, msgs: list[bytes], now: float) -> None:
        send = self.send_conn.send_message
        for m in msgs:
            send(m, now)

    def _on_message(self, data: bytes, now: float) -> None:
        try:
            self._submit(self.ring.receive(data, now), now)
        except RingProtocolError as exc:
            self.counters["protocol_errors"] += 1
            logger.warning("rank %d: dropped a message from %s:%d: %s", self.rank, *self.left, exc)

    def _advance(self, now: float) -> None:
        ready = self.ring.phase is Phase.READY
        self._submit(self.ring.advance(now), now)
        if ready and self.ring.phase is not Phase.READY:
            self.started_unix = time.time()

    # -- loop -------------------------------------------------------------------------------------------

    def _drain_listen(self, now: float) -> int:
        batch, n = read_batch(self.listen.recvfrom, self._recv_size)  # type: ignore[union-attr]
        receive = self.recv_conn.receive_datagram
        cid = self._recv_cid
        evaddr = self._evaddr
        for data, addr in batch:
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
        return n

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
                self.counters["refused"] += 1  # the right neighbour is not listening (yet)
                continue
            except OSError:
                break
            n += 1
            receive(data, now)
        self.counters["datagrams_received"] += n
        return n

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
        # The clock is read again: comparing an iteration with the reference takes time that no
        # other rank waits for, so the next iteration starts (and its time counts) from its end.
        self._advance(time.monotonic())
        self._flush(now)
        ring = self.ring
        wake = ring.wake_time()
        for t in (send.get_timer(), recv.get_timer()):
            if t is not None and (wake is None or t < wake):
                wake = t
        if ring.phase is Phase.DRAIN:
            # Stay until our data is acknowledged and the left neighbour has gone quiet, so that a
            # lost final ACK can still be repeated for it.
            done_at = ring.done_at if ring.done_at is not None else now
            quiet_since = max(self._last_rx, done_at)
            if send.idle and (now - quiet_since >= self.opts.linger or now - done_at >= 10 * self.opts.linger):
                ring.drained()
                self.stop("done")
                return None
            limit = quiet_since + self.opts.linger
            if wake is None or limit < wake:
                wake = limit
        elif ring.phase is Phase.READY and ring.start_time is not None:
            self._last_progress = max(self._last_progress, min(now, ring.start_time))
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
        if self.phase is Phase.BARRIER:
            return (f"rank {self.rank}: barrier not complete after {t:g} s (left {left}, right {right}, "
                    f"{self.counters['refused']} refused); start every rank with the same --peers and --seed")
        if self.phase is Phase.DRAIN:
            return (f"rank {self.rank}: right neighbour {right} acknowledged nothing for {t:g} s after the "
                    "last iteration")
        got, want = self.worker.progress
        return (f"rank {self.rank}: iteration {self.worker.iteration + 1} stalled for {t:g} s with {got}/{want} "
                f"pieces from left {left}; is every rank still running?")

    def run(self) -> None:
        """Barrier, iterations, linger; raises AllReduceError on timeouts."""
        reference = reference_from_seed(self.n, self.opts.size, self.opts.seed)
        if self.n == 1:
            # One rank: the ring is empty; iterations only copy the input.
            now = time.monotonic()
            self.started_unix = time.time()
            self.ring.start(now, reference)
            self.ring.advance(now)
            return
        if self.listen is None:
            self.open()
        now = self._last_progress = time.monotonic()
        start_at = None if self.opts.start_at is None else now + self.opts.start_at - time.time()
        self._submit(self.ring.start(now, reference, start_at), now)
        self._run_loop()
        self._flush(time.monotonic())

    # -- results ----------------------------------------------------------------------------------------

    def results(self) -> AllreduceMetrics:
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


# --------------------------------------------------------------------------------------------------
# Command line


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def parse_peers(text: str) -> list[tuple[str, int]]:
    """IP:PORT,IP:PORT,... ([v6]:PORT for IPv6)."""
    peers = []
    for item in text.split(","):
        item = item.strip()
        host, sep, port_s = item.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if not sep or not host or not port_s.isdigit():
            raise argparse.ArgumentTypeError(f"{item!r} is not IP:PORT; use e.g. 10.0.0.1:7000,10.0.0.2:7000")
        port = int(port_s)
        if not 1 <= port <= 65535:
            raise argparse.ArgumentTypeError(f"port {port} in {item!r} is out of range; use 1-65535")
        peers.append((host, port))
    return peers


_SUFFIX = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def count_arg(text: str) -> int:
    """An element count with an optional K/M/G suffix (powers of 1024): 4096, 256K, 1M."""
    raw = text.strip().lower()
    mult = 1
    if raw and raw[-1] in _SUFFIX:
        mult, raw = _SUFFIX[raw[-1]], raw[:-1]
    if not raw.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a count; use e.g. 4096, 256K or 1M")
    return int(raw) * mult


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineParser(
        prog="python -m transport.allreduce",
        description="One rank of a ring all-reduce over the fabriclab transport.",
    )
    p.add_argument("--rank", type=int, required=True, help="this worker's index in --peers")
    p.add_argument("--peers", type=parse_peers, required=True,
                   help="IP:PORT of every rank in ring order; rank r listens on its own port")
    p.add_argument("--size", type=count_arg, required=True, help="float32 elements (suffix K/M/G allowed)")
    p.add_argument("--iterations", type=int, default=1)
    p.add_argument("--policy", choices=["single", "spray", "adaptive"], default="spray", help="path (EV) policy")
    p.add_argument("--evs", type=int, default=16, help="entropy values = source ports per rank")
    p.add_argument("--base-port", type=int, default=None,
                   help=f"first source port (EV 0); default {DEFAULT_BASE_PORT} + {BASE_PORT_STRIDE} * rank")
    p.add_argument("--recovery", choices=["selective", "gobackn"], default="selective")
    p.add_argument("--delivery", choices=["unordered", "ordered"], default="unordered")
    p.add_argument("--cc", choices=["delay", "fixed"], default=TransportConfig.cc, help="congestion control")
    p.add_argument("--window", type=int, default=TransportConfig.window,
                   help="packets: the fixed window, or the initial window of --cc delay")
    p.add_argument("--rto-min", type=float, default=TransportConfig.rto_min, help="seconds: floor of the RTO")
    p.add_argument("--ack-delay", type=float, default=TransportConfig.ack_delay,
                   help="seconds an ACK may be held to coalesce it with others (0 = ACK every packet)")
    p.add_argument("--mtu", type=int, default=TransportConfig.mtu, help="UDP payload bytes per datagram")
    p.add_argument("--piece-bytes", type=count_arg, default=DEFAULT_PIECE_BYTES,
                   help="bytes of a chunk per transport message (pieces pipeline round the ring)")
    p.add_argument("--seed", type=int, default=0, help="inputs are drawn from (seed, rank)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds without progress before giving up")
    p.add_argument("--start-at", type=float, default=None, help="UNIX time to start iteration 1 (after the barrier)")
    p.add_argument("--link-rate-mbps", type=float, default=None, help="link rate for the bandwidth bound")
    p.add_argument("--bind", default=None, help="local address to bind (default: all)")
    p.add_argument("--json-out", default=None, metavar="FILE", help="write the results as JSON (also on SIGTERM)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def _options(args: argparse.Namespace) -> WorkerOptions:
    config = TransportConfig(
        path_policy=args.policy, num_evs=args.evs, recovery=args.recovery, delivery=args.delivery, mtu=args.mtu,
        cc=args.cc, window=args.window, ack_delay=args.ack_delay, rto_min=args.rto_min,
        rto_max=max(TransportConfig.rto_max, args.rto_min),
    )
    return WorkerOptions(
        rank=args.rank, peers=args.peers, size=args.size, iterations=args.iterations, config=config,
        base_port=args.base_port, seed=args.seed, timeout=args.timeout, start_at=args.start_at,
        link_rate_mbps=args.link_rate_mbps, piece_bytes=args.piece_bytes, bind=args.bind,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    prog = "allreduce"
    try:
        worker = UdpRingWorker(_options(args))
        worker.open()
    except (AllReduceError, EndpointError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    def on_signal(signum: int, _frame: object) -> None:
        worker.stop(f"signal {signal.Signals(signum).name}")

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    code = EXIT_OK
    try:
        worker.run()
        if worker.stop_reason.startswith("signal"):
            worker.error = f"stopped by {worker.stop_reason.removeprefix('signal ')}"
            code = EXIT_SIGNAL
        elif not worker.correct:
            code = EXIT_MISMATCH
    except (AllReduceError, EndpointError) as exc:
        worker.error = str(exc)
        code = EXIT_USAGE
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        results = worker.results()
        worker.close()
        if args.json_out:
            try:
                write_json(results, args.json_out)
            except OSError as exc:
                print(f"{prog}: error: cannot write {args.json_out}: {exc.strerror}", file=sys.stderr)
                code = code or EXIT_USAGE
    if worker.error:
        print(f"{prog}: error: {worker.error}", file=sys.stderr)
    else:
        bound = results["bound_s"]
        extra = f", bound {bound:.4f} s (x{results['ratio_to_bound']:.2f})" if bound else ""
        verdict = "correct" if results["correct"] else f"MISMATCH {results['mismatch']}"
        print(f"rank {worker.rank}: {len(worker.iteration_times)} iterations of {results['bytes']} bytes, "
              f"mean {results['mean_s']:.4f} s{extra}; {verdict}")
    return code


if __name__ == "__main__":
    sys.exit(main())
