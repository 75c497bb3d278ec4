"""`fabriclab bench endpoints`: what the transport's endpoints cost per delivered packet, without a fabric.

A sender and a receiver run as the fabric runs them, each its own `python -m cli.endpoint srd ...`
process, on 127.0.0.1. Between them this process plays the host's shaped link: a token bucket of the
demo's few Mb/s with a drop-tail queue and a fixed one-way delay in each direction, so that packets
reach each endpoint one at a time, paced, as they do in an emulated host, and the sender's congestion
control sees a queue. The link keeps one socket toward the receiver per sender source port, so the
receiver still sees one source port per entropy value and answers each on its own.

Per case (MTU, link rate) it reports each endpoint's CPU seconds while its loop ran (`cpu_run_s`, what
`fabriclab bench fidelity` charges to the endpoints) and the process's whole CPU time, divided by the
packets the link delivered (DATA to the receiver plus ACKs to the sender, as the fidelity table counts
packets delivered to hosts): microseconds of CPU per delivered packet.

Then two bare loops (experiments.bare_loop) run over the same link at the endpoints' pace: datagrams of
the same size as often, an ACK-sized answer as often, and nothing else. What they cost is what this
machine charges for a wake-up and a datagram, which no transport in Python avoids; the endpoints'
figure over theirs is what the transport itself adds. Last, the core's receive path runs in this
process back to back and after sleeping the run's gap between packets (experiments.idle_penalty): on a
machine where the second is many times the first, the endpoints' figure is mostly the price of waking.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from experiments import bare_loop, idle_penalty
from experiments.endpoints import command_line
from transport.core.headers import UDP_FRAME_OVERHEAD, datagram_size_for_mtu

# The demo's host links (leaf-spine host_rate=4) and its paths' base delay, roughly: a few switch
# traversals of userspace Open vSwitch.
DEFAULT_RATE_MBPS = 4.0
DEFAULT_DELAY_S = 0.0005
DEFAULT_MTUS = (1500, 9000)
# A shaped host port's queue: the emulator's HTB class keeps the interface's default of 1000 packets.
QUEUE_PACKETS = 1000
# Bytes a shaped link counts per datagram besides its payload.
FRAME_OVERHEAD = UDP_FRAME_OVERHEAD
# The target issue 16 sets: sender and receiver together.
TARGET_US_PER_PACKET = 30.0
# Seconds of the bare loops' run after each case (at most the case's own): enough packets for a
# steady figure at the demo's pace.
FLOOR_SECONDS = 4.0


@dataclass
class Direction:
    """One direction of the shaped link: when it is next free, what waits to be delivered."""

    rate_bps: float
    delay_s: float
    queue_packets: int
    free_at: float = 0.0
    waiting: deque[tuple[float, bytes, Any]] = field(default_factory=deque)  # (deliver at, datagram, to)
    delivered: int = 0
    dropped: int = 0

    def offer(self, data: bytes, to: Any, now: float) -> None:
        if len(self.waiting) >= self.queue_packets:  # drop-tail (the delay line counts too: it is short)
            self.dropped += 1
            return
        start = self.free_at if self.free_at > now else now
        self.free_at = start + (len(data) + FRAME_OVERHEAD) * 8 / self.rate_bps
        self.waiting.append((self.free_at + self.delay_s, data, to))


class ShapedLink:
    """A relay on 127.0.0.1 between one sender (any number of source ports) and one receiver."""

    def __init__(self, receiver: tuple[str, int], rate_bps: float, delay_s: float,
                 queue_packets: int = QUEUE_PACKETS) -> None:
        self.receiver = receiver
        self.front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.front.bind(("127.0.0.1", 0))
        self.front.setblocking(False)
        self.forward = Direction(rate_bps, delay_s, queue_packets)
        self.reverse = Direction(rate_bps, delay_s, queue_packets)
        self._back: dict[Any, socket.socket] = {}  # sender address -> its socket toward the receiver
        self._by_fd: dict[int, tuple[socket.socket, Any]] = {}  # back socket fd -> (it, sender address)

    @property
    def address(self) -> tuple[str, int]:
        return self.front.getsockname()

    def _back_socket(self, sender: Any) -> socket.socket:
        s = self._back.get(sender)
        if s is None:
            s = self._back[sender] = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("127.0.0.1", 0))
            s.connect(self.receiver)
            s.setblocking(False)
            self._by_fd[s.fileno()] = (s, sender)
        return s

    def _read(self, fd: int, now: float) -> None:
        if fd == self.front.fileno():
            while True:
                try:
                    data, addr = self.front.recvfrom(65535)
                except (BlockingIOError, InterruptedError):
                    return
                except OSError:
                    continue
                self.forward.offer(data, self._back_socket(addr), now)
        else:
            sock, to = self._by_fd[fd]
            while True:
                try:
                    data = sock.recv(65535)
                except (BlockingIOError, InterruptedError):
                    return
                except OSError:
                    continue
                self.reverse.offer(data, to, now)

    def _deliver(self, now: float) -> float | None:
        wake = None
        for d in (self.forward, self.reverse):
            w = d.waiting
            while w and w[0][0] <= now:
                _, data, to = w.popleft()
                try:
                    if d is self.forward:
                        to.send(data)
                    else:
                        self.front.sendto(data, to)
                    d.delivered += 1
                except OSError:
                    d.dropped += 1
            if w and (wake is None or w[0][0] < wake):
                wake = w[0][0]
        return wake

    def run(self, until: Callable[[], bool]) -> None:
        """Relay until `until()` is true (looked at every few milliseconds at least)."""
        mono = time.monotonic
        while not until():
            now = mono()
            wake = self._deliver(now)
            timeout = 0.005 if wake is None else max(0.0, min(0.005, wake - now))
            fds = [self.front.fileno(), *self._by_fd]
            # select() sleeps with microsecond resolution; epoll would round up to a millisecond.
            ready = select.select(fds, [], [], timeout)[0]
            now = mono()
            for fd in ready:
                self._read(fd, now)

    def close(self) -> None:
        for s in (self.front, *self._back.values()):
            s.close()


@dataclass
class EndpointCost:
    """One endpoint process's CPU: while its loop ran, and in all (start-up and exit too)."""

    cpu_run_s: float | None
    cpu_process_s: float | None
    us_per_packet: float | None  # cpu_run_s per delivered packet
    process_us_per_packet: float | None
    kernel_share: float | None = None  # of cpu_run_s, the part spent in the kernel


@dataclass
class FloorResult:
    """The bare loops (experiments.bare_loop) at the endpoints' pace: CPU per delivered packet."""

    gap_s: float  # between DATA datagrams: the endpoints' mean over their run
    ack_every: int  # DATA datagrams per ACK, as the endpoints' receiver answered
    data_delivered: int
    acks_delivered: int
    sender_us_per_packet: float | None
    receiver_us_per_packet: float | None
    us_per_packet: float | None


@dataclass
class CaseResult:
    mtu: int
    datagram_bytes: int
    rate_mbps: float
    delay_s: float
    seconds: float
    goodput_mbps: float
    data_delivered: int
    acks_delivered: int
    link_drops: int
    retransmissions: int
    completed: bool
    sender: EndpointCost
    receiver: EndpointCost
    endpoints_us_per_packet: float | None
    endpoints_us_per_data_packet: float | None
    ack_ratio: float | None  # DATA packets per ACK
    floor: FloorResult | None = None  # the bare loops at the same pace: the machine's price of the wake-ups
    # The core's receive path in the bench's own process (experiments.idle_penalty), µs per DATA
    # datagram: back to back, and after sleeping the run's mean gap between DATA datagrams.
    core_receive_us: dict[str, float] | None = None


def _cost(metrics: dict[str, Any], process_s: float | None, packets: int) -> EndpointCost:
    run = metrics.get("cpu_run_s")
    per = None if run is None or not packets else round(run / packets * 1e6, 1)
    per_proc = None if process_s is None or not packets else round(process_s / packets * 1e6, 1)
    kernel = metrics.get("cpu_run_kernel_s")
    share = None if kernel is None or not run else round(min(1.0, kernel / run), 3)
    return EndpointCost(run, None if process_s is None else round(process_s, 4), per, per_proc, share)


class _Reaped:
    """Children of this process reaped with `os.wait4`, so that each one's CPU time comes from the
    kernel's own accounting (Popen.poll would reap them and lose it)."""

    def __init__(self) -> None:
        self.cpu_s: dict[int, float] = {}

    def done(self, proc: subprocess.Popen) -> bool:
        if proc.pid in self.cpu_s:
            return True
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if not pid:
            return False
        proc.returncode = os.waitstatus_to_exitcode(status)
        self.cpu_s[pid] = usage.ru_utime + usage.ru_stime
        return True

    def wait(self, proc: subprocess.Popen, timeout: float) -> float | None:
        """`proc`'s CPU seconds once it has exited; None if it had to be killed after `timeout`."""
        deadline = time.monotonic() + timeout
        while not self.done(proc):
            if time.monotonic() > deadline:
                proc.kill()
                self.done(proc) or proc.wait()
                return None
            time.sleep(0.01)
        return self.cpu_s[proc.pid]


def _ready(path: Path, proc: subprocess.Popen, reaped: _Reaped, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if reaped.done(proc) or time.monotonic() > deadline:
            raise RuntimeError(f"endpoint did not start: {' '.join(map(str, proc.args))}")
        time.sleep(0.02)


def _free_port() -> int:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return port


@dataclass
class _Pair:
    """A sender and a receiver process that have exited, their CPU seconds, and the link between them."""

    link: ShapedLink
    send: subprocess.Popen
    recv: subprocess.Popen
    send_cpu_s: float | None
    recv_cpu_s: float | None


def _run_pair(recv_cmd: list[str], recv_ready: Path, send_cmd: Callable[[str], list[str]],
              send_ready: Path | None, rate_bps: float, delay_s: float, give_up_s: float) -> _Pair:
    """Start the receiver, the link toward it and the sender (`send_cmd(link address)`; with
    `send_ready`, released by SIGUSR1 once ready), and relay until both have exited. On failure, what
    was started is stopped by its own handles."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    rport = int(recv_cmd[recv_cmd.index("--port") + 1])
    recv = subprocess.Popen(recv_cmd, env=env, stdout=subprocess.DEVNULL)
    link = ShapedLink(("127.0.0.1", rport), rate_bps, delay_s)
    reaped = _Reaped()
    send = None
    finished = False
    try:
        _ready(recv_ready, recv, reaped)
        host, port = link.address
        send = subprocess.Popen(send_cmd(f"{host}:{port}"), env=env, stdout=subprocess.DEVNULL)
        if send_ready is not None:
            _ready(send_ready, send, reaped)
            send.send_signal(signal.SIGUSR1)
        give_up = time.monotonic() + give_up_s
        link.run(lambda: (reaped.done(send) and reaped.done(recv)) or time.monotonic() > give_up)
        finished = True
    finally:
        link.close()
        if not finished:
            for proc in (send, recv):
                if proc is not None and not reaped.done(proc):
                    proc.kill()
                    reaped.wait(proc, 5.0)
    return _Pair(link, send, recv, reaped.wait(send, 10.0), reaped.wait(recv, 10.0))


def _results(pair: _Pair, send_json: Path, recv_json: Path, what: str) -> tuple[dict[str, Any], dict[str, Any]]:
    try:
        return json.loads(send_json.read_text()), json.loads(recv_json.read_text())
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"{what} wrote no results (sender exit {pair.send.returncode}, receiver exit "
                           f"{pair.recv.returncode}): {exc}") from exc


def run_case(mtu: int, rate_mbps: float, seconds: float, delay_s: float = DEFAULT_DELAY_S,
             workdir: Path | None = None, profile: Path | None = None, extra_args: tuple[str, ...] = (),
             floor: bool = True) -> CaseResult:
    """One sender and one receiver over the shaped link for about `seconds` of traffic; with `floor`,
    then the bare loops at their pace (run_floor)."""
    datagram = datagram_size_for_mtu(mtu)
    rate_bps = rate_mbps * 1e6
    # Bytes the link carries in `seconds`, less framing: the sender's bulk transfer.
    total = int(rate_bps / 8 * seconds * datagram / (datagram + FRAME_OVERHEAD) * 0.9)
    tmp = Path(tempfile.mkdtemp(prefix="fabriclab-endpoints-", dir=workdir))

    def cmd(role: str, *args: str) -> list[str]:
        line = command_line("srd", role, *args, "--mtu", str(datagram), *extra_args)
        if profile is not None:
            # The same command under cProfile: `python -m cProfile -o FILE -m cli.endpoint ...`.
            line = [line[0], "-m", "cProfile", "-o", str(profile / f"{role}-{mtu}.prof"), *line[1:]]
        return line

    try:
        pair = _run_pair(
            cmd("recv", "--bind", "127.0.0.1", "--port", str(_free_port()), "--expect-bytes", str(total),
                "--ready-file", str(tmp / "recv.ready"), "--json-out", str(tmp / "recv.json")),
            tmp / "recv.ready",
            # The sender gives up after its --duration; the receiver lingers a little after the last byte.
            lambda to: cmd("send", "--to", to, "--bytes", str(total), "--base-port", "0",
                           "--duration", f"{3 * seconds + 5:g}", "--hold",
                           "--ready-file", str(tmp / "send.ready"), "--json-out", str(tmp / "send.json")),
            tmp / "send.ready", rate_bps, delay_s, give_up_s=3 * seconds + 20)
        sm, rm = _results(pair, tmp / "send.json", tmp / "recv.json", "an endpoint")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    link = pair.link
    data, acks = link.forward.delivered, link.reverse.delivered
    packets = data + acks
    sender, receiver = _cost(sm, pair.send_cpu_s, packets), _cost(rm, pair.recv_cpu_s, packets)
    both = (None if sender.us_per_packet is None or receiver.us_per_packet is None
            else round(sender.us_per_packet + receiver.us_per_packet, 1))
    run_s = (sm.get("cpu_run_s") or 0.0) + (rm.get("cpu_run_s") or 0.0)
    conn = (sm.get("connection") or {}).get("sender") or {}
    duration = sm.get("duration", 0.0)
    bare = core = None
    if floor and data and acks and duration > 0:
        gap = duration / data
        bare = run_floor(datagram, rate_mbps, delay_s, gap_s=gap, ack_every=max(1, round(data / acks)),
                         seconds=min(seconds, FLOOR_SECONDS), workdir=workdir)
        core = idle_penalty.probe(datagram, gap)
    return CaseResult(
        mtu=mtu, datagram_bytes=datagram, rate_mbps=rate_mbps, delay_s=delay_s,
        seconds=round(duration, 3), goodput_mbps=round(sm.get("goodput_bps", 0.0) / 1e6, 3),
        data_delivered=data, acks_delivered=acks, link_drops=link.forward.dropped + link.reverse.dropped,
        retransmissions=conn.get("retransmissions", 0), completed=bool(sm.get("completed")),
        sender=sender, receiver=receiver, endpoints_us_per_packet=both,
        endpoints_us_per_data_packet=round(run_s / data * 1e6, 1) if data else None,
        ack_ratio=round(data / acks, 2) if acks else None, floor=bare, core_receive_us=core,
    )


def run_floor(datagram: int, rate_mbps: float, delay_s: float, gap_s: float, ack_every: int, seconds: float,
              workdir: Path | None = None) -> FloorResult:
    """The bare loops of experiments.bare_loop over the same shaped link: datagrams of `datagram` bytes
    every `gap_s` for `seconds`, an ACK-sized answer to every `ack_every`-th."""
    tmp = Path(tempfile.mkdtemp(prefix="fabriclab-floor-", dir=workdir))
    count = max(1, int(seconds / gap_s))
    bare = [sys.executable, "-m", "experiments.bare_loop"]
    try:
        pair = _run_pair(
            [*bare, "recv", "--port", str(_free_port()), "--ack-every", str(ack_every),
             "--ready-file", str(tmp / "recv.ready"), "--timeout", f"{seconds + 30:g}",
             "--json-out", str(tmp / "recv.json")],
            tmp / "recv.ready",
            lambda to: [*bare, "send", "--to", to, "--size", str(datagram), "--count", str(count),
                        "--gap", f"{gap_s:.9f}", "--json-out", str(tmp / "send.json")],
            None, rate_mbps * 1e6, delay_s, give_up_s=seconds + 40)
        sm, rm = _results(pair, tmp / "send.json", tmp / "recv.json", "a bare loop")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # The sender's end markers cross the link too; they are not packets of the run.
    data = max(0, pair.link.forward.delivered - bare_loop.END_COPIES)
    acks = pair.link.reverse.delivered
    packets = data + acks
    s_us, r_us = _cost(sm, None, packets).us_per_packet, _cost(rm, None, packets).us_per_packet
    return FloorResult(gap_s=round(gap_s, 6), ack_every=ack_every, data_delivered=data, acks_delivered=acks,
                       sender_us_per_packet=s_us, receiver_us_per_packet=r_us,
                       us_per_packet=None if s_us is None or r_us is None else round(s_us + r_us, 1))


def run_endpoint_bench(mtus: tuple[int, ...] = DEFAULT_MTUS, rate_mbps: float = DEFAULT_RATE_MBPS,
                       seconds: float = 8.0, delay_s: float = DEFAULT_DELAY_S, repeat: int = 1,
                       profile: Path | None = None, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every MTU `repeat` times; one JSON-able summary whose `cases` are the median runs (by the two
    endpoints' CPU per delivered packet) and `runs` all of them."""
    cases, runs = [], []
    for mtu in mtus:
        mine = []
        for i in range(repeat):
            if progress:
                run = f", run {i + 1}/{repeat}" if repeat > 1 else ""
                progress(f"MTU {mtu}, {rate_mbps:g} Mb/s, {seconds:g} s{run}")
            mine.append(asdict(run_case(mtu, rate_mbps, seconds, delay_s, profile=profile)))
        runs += mine
        cases.append(median_run(mine))
    return {"target_us_per_packet": TARGET_US_PER_PACKET, "cpus": os.cpu_count(), "rate_mbps": rate_mbps,
            "delay_s": delay_s, "seconds": seconds, "cases": cases, "runs": runs}


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run in the middle by the endpoints' CPU per delivered packet (runs without a figure last)."""
    ranked = sorted(runs, key=lambda r: (r["endpoints_us_per_packet"] is None, r["endpoints_us_per_packet"] or 0.0))
    return ranked[(len(ranked) - 1) // 2]


def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f} %"


def text_report(result: dict[str, Any]) -> str:
    """One row per case: µs of CPU per delivered packet for the sender, the receiver and both, and what
    the bare loops cost at the same pace."""
    lines = [
        "| MTU | link | goodput | DATA / ACKs delivered | sender µs/pkt | receiver µs/pkt | endpoints µs/pkt "
        "| per DATA pkt | whole processes µs/pkt | in the kernel, sender / receiver | bare loops µs/pkt "
        "| endpoints / bare |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in result["cases"]:
        s, r = c["sender"], c["receiver"]
        whole = (None if s["process_us_per_packet"] is None or r["process_us_per_packet"] is None
                 else s["process_us_per_packet"] + r["process_us_per_packet"])
        bare = (c.get("floor") or {}).get("us_per_packet")
        over = None if not bare or c["endpoints_us_per_packet"] is None else c["endpoints_us_per_packet"] / bare
        lines.append(
            f"| {c['mtu']} | {c['rate_mbps']:g} Mb/s | {c['goodput_mbps']:.2f} Mb/s | {c['data_delivered']} / "
            f"{c['acks_delivered']} | {_f(s['us_per_packet'])} | {_f(r['us_per_packet'])} | "
            f"{_f(c['endpoints_us_per_packet'])} | {_f(c['endpoints_us_per_data_packet'])} | {_f(whole)} | "
            f"{_pct(s.get('kernel_share'))} / {_pct(r.get('kernel_share'))} | {_f(bare)} | "
            f"{_f(over, '{:.1f}x')} |")
    target = result["target_us_per_packet"]
    worst = [c["endpoints_us_per_packet"] for c in result["cases"] if c["endpoints_us_per_packet"] is not None]
    if worst:
        lines.append(f"endpoints together: at most {max(worst):.1f} µs per delivered packet (target < {target:g})")
    floors = [c["floor"]["us_per_packet"] for c in result["cases"]
              if c.get("floor") and c["floor"]["us_per_packet"] is not None]
    if floors:
        lines.append(f"bare loops at the endpoints' pace (a wake-up and a system call per datagram, no "
                     f"transport): {min(floors):.1f}-{max(floors):.1f} µs per delivered packet on this machine"
                     + (", the target below them" if min(floors) >= target else ""))
    for c in result["cases"]:
        core = c.get("core_receive_us")
        if core and c["data_delivered"]:
            gap_ms = c["seconds"] / c["data_delivered"] * 1e3
            lines.append(f"MTU {c['mtu']}: the transport core's receive path (a DATA datagram in, its ACK out) "
                         f"costs {core['back_to_back']:.1f} µs back to back and {core['after_gap']:.1f} after "
                         f"sleeping the run's {gap_ms:.1f} ms between DATA datagrams")
    return "\n".join(lines)
