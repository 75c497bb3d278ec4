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
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

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


def run_case(mtu: int, rate_mbps: float, seconds: float, delay_s: float = DEFAULT_DELAY_S,
             workdir: Path | None = None, profile: Path | None = None, extra_args: tuple[str, ...] = ()) -> CaseResult:
    """One sender and one receiver over the shaped link for about `seconds` of traffic."""
    datagram = datagram_size_for_mtu(mtu)
    rate_bps = rate_mbps * 1e6
    # Bytes the link carries in `seconds`, less framing: the sender's bulk transfer.
    total = int(rate_bps / 8 * seconds * datagram / (datagram + FRAME_OVERHEAD) * 0.9)
    tmp = Path(tempfile.mkdtemp(prefix="fabriclab-endpoints-", dir=workdir))
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}

    def cmd(role: str, *args: str) -> list[str]:
        line = command_line("srd", role, *args, "--mtu", str(datagram), *extra_args)
        if profile is not None:
            # The same command under cProfile: `python -m cProfile -o FILE -m cli.endpoint ...`.
            line = [line[0], "-m", "cProfile", "-o", str(profile / f"{role}-{mtu}.prof"), *line[1:]]
        return line

    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    rport = probe.getsockname()[1]
    probe.close()
    recv = subprocess.Popen(cmd("recv", "--bind", "127.0.0.1", "--port", str(rport), "--expect-bytes", str(total),
                                "--ready-file", str(tmp / "recv.ready"), "--json-out", str(tmp / "recv.json")),
                            env=env, stdout=subprocess.DEVNULL)
    link = ShapedLink(("127.0.0.1", rport), rate_bps, delay_s)
    reaped = _Reaped()
    send = None
    finished = False
    try:
        _ready(tmp / "recv.ready", recv, reaped)
        host, port = link.address
        send = subprocess.Popen(cmd("send", "--to", f"{host}:{port}", "--bytes", str(total), "--base-port", "0",
                                    "--duration", f"{3 * seconds + 5:g}", "--hold",
                                    "--ready-file", str(tmp / "send.ready"), "--json-out", str(tmp / "send.json")),
                                env=env, stdout=subprocess.DEVNULL)
        _ready(tmp / "send.ready", send, reaped)
        send.send_signal(signal.SIGUSR1)
        # The sender gives up after its --duration; the receiver lingers a little after the last byte.
        give_up = time.monotonic() + 3 * seconds + 20
        link.run(lambda: (reaped.done(send) and reaped.done(recv)) or time.monotonic() > give_up)
        finished = True
    finally:
        link.close()
        if not finished:  # stop what this run started, by its own handles
            for proc in (send, recv):
                if proc is not None and not reaped.done(proc):
                    proc.kill()
                    reaped.wait(proc, 5.0)
            shutil.rmtree(tmp, ignore_errors=True)
    s_cpu = reaped.wait(send, 10.0)
    r_cpu = reaped.wait(recv, 10.0)
    try:
        sm = json.loads((tmp / "send.json").read_text())
        rm = json.loads((tmp / "recv.json").read_text())
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"an endpoint wrote no results (sender exit {send.returncode}, receiver exit "
                           f"{recv.returncode}): {exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    data, acks = link.forward.delivered, link.reverse.delivered
    packets = data + acks
    sender, receiver = _cost(sm, s_cpu, packets), _cost(rm, r_cpu, packets)
    both = (None if sender.us_per_packet is None or receiver.us_per_packet is None
            else round(sender.us_per_packet + receiver.us_per_packet, 1))
    run_s = (sm.get("cpu_run_s") or 0.0) + (rm.get("cpu_run_s") or 0.0)
    conn = (sm.get("connection") or {}).get("sender") or {}
    return CaseResult(
        mtu=mtu, datagram_bytes=datagram, rate_mbps=rate_mbps, delay_s=delay_s,
        seconds=round(sm.get("duration", 0.0), 3), goodput_mbps=round(sm.get("goodput_bps", 0.0) / 1e6, 3),
        data_delivered=data, acks_delivered=acks, link_drops=link.forward.dropped + link.reverse.dropped,
        retransmissions=conn.get("retransmissions", 0), completed=bool(sm.get("completed")),
        sender=sender, receiver=receiver, endpoints_us_per_packet=both,
        endpoints_us_per_data_packet=round(run_s / data * 1e6, 1) if data else None,
        ack_ratio=round(data / acks, 2) if acks else None,
    )


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
    """One row per case: µs of CPU per delivered packet for the sender, the receiver and both."""
    lines = [
        "| MTU | link | goodput | DATA / ACKs delivered | sender µs/pkt | receiver µs/pkt | endpoints µs/pkt "
        "| per DATA pkt | whole processes µs/pkt | in the kernel, sender / receiver |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in result["cases"]:
        s, r = c["sender"], c["receiver"]
        whole = (None if s["process_us_per_packet"] is None or r["process_us_per_packet"] is None
                 else s["process_us_per_packet"] + r["process_us_per_packet"])
        lines.append(
            f"| {c['mtu']} | {c['rate_mbps']:g} Mb/s | {c['goodput_mbps']:.2f} Mb/s | {c['data_delivered']} / "
            f"{c['acks_delivered']} | {_f(s['us_per_packet'])} | {_f(r['us_per_packet'])} | "
            f"{_f(c['endpoints_us_per_packet'])} | {_f(c['endpoints_us_per_data_packet'])} | {_f(whole)} | "
            f"{_pct(s.get('kernel_share'))} / {_pct(r.get('kernel_share'))} |")
    target = result["target_us_per_packet"]
    worst = [c["endpoints_us_per_packet"] for c in result["cases"] if c["endpoints_us_per_packet"] is not None]
    if worst:
        lines.append(f"endpoints together: at most {max(worst):.1f} µs per delivered packet (target < {target:g})")
    return "\n".join(lines)
