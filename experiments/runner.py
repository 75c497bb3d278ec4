"""Runs an experiment: every arm on a freshly brought-up fabric, one after the other, same seed.

For each arm the runner brings the fabric up in the arm's routing mode, starts the receivers and then
the senders inside the Mininet hosts (the transport's `srd` endpoints, iperf3, or the all-reduce
worker), injects the arm's faults at their times, and meanwhile samples the controller's per-link
counters and the CPU's idle time every half second. Afterwards it reads every endpoint's JSON, the
queue drops of the shaped interfaces, and tears the fabric down. An arm that fails is recorded with
its error and the others still run; Ctrl-C keeps the finished arms and marks the run incomplete.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from emulator import cpu
from emulator.errors import EmulatorError
from emulator.network import Terminated
from experiments import analysis
from experiments.model import Arm, Experiment, Fault, Workload
from topologies import Topology
from transport import command_line
from transport.wire import DATA_HEADER_LEN

log = logging.getLogger(__name__)

SRD_PORT = 7471
IPERF_PORT = 5201
BASE_PORT = 40000  # a multiple of 16: EV i leaves from BASE_PORT + 16*flow + i
SAMPLE_INTERVAL = 0.5
# Time to give a fabric that another run holds: poll this often, for at most this long.
BUSY_POLL_S = 20.0
BUSY_WAIT_MAX_S = 900.0
# Bytes around one transport datagram: IPv4 + UDP inside the MTU, Ethernet outside it.
IP_UDP_HEADERS = analysis.UDP_IP_HEADERS
# Header bytes on the wire per DATA packet: the transport's own header, UDP, IPv4 and Ethernet.
WIRE_OVERHEAD = DATA_HEADER_LEN + IP_UDP_HEADERS + analysis.ETHERNET_HEADER
# How long endpoints may take to start (interpreter, imports, sockets) before the arm gives up.
READY_TIMEOUT_S = 60.0
# Flow.start_s is honoured: each sender is released (or iperf3 client started) at t0 + start_s.
FLOW_START_OFFSETS = True


class ArmInterrupted(Exception):
    """Raised inside an arm when the run is asked to stop (Ctrl-C)."""


@dataclass
class Flow:
    src: str
    dst: str
    index: int  # position among the flows leaving `src` (source ports and iperf3 ports differ)
    size: int = 0  # this flow's bytes (a traffic matrix gives each its own); 0 = the arm's bytes_per_flow
    start_s: float = 0.0  # when it starts, in seconds after the traffic starts (a traffic matrix's start)


@dataclass
class ArmContext:
    """What one arm's traffic needs: the fabric, its flows, sizes and where to put files."""

    fab: Any
    exp: Experiment
    arm: Arm
    topo: Topology
    flows: list[Flow]
    duration: float
    seed: int
    bytes_per_flow: int
    raw_dir: Path
    workload: Workload = field(default_factory=Workload)
    procs: list[subprocess.Popen] = field(default_factory=list)
    t0: float = 0.0  # time.monotonic() when the traffic started
    fault_log: list[dict[str, Any]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)  # the arm is ending: no more starts


class Reporter:
    """Progress callbacks; the CLI shows a bar, the default logs."""

    def run_started(self, exp: Experiment, total_arms: int) -> None:
        log.info("running %s: %d arms", exp.name, total_arms)

    def arm_started(self, index: int, arm: Arm, expected_s: float) -> None:
        log.info("arm %d: %s", index + 1, arm.name)

    def arm_progress(self, fraction: float, note: str = "") -> None:
        pass

    def arm_finished(self, index: int, arm: Arm, result: dict[str, Any]) -> None:
        log.info("arm %s done%s", arm.name, f" (error: {result['error']})" if result.get("error") else "")


# --------------------------------------------------------------------------------------------------
# Sampling


class Sampler(threading.Thread):
    """Polls the controller's link counters and /proc/stat every `interval` seconds."""

    def __init__(self, fab: Any, interval: float = SAMPLE_INTERVAL) -> None:
        super().__init__(daemon=True, name="fabriclab-sampler")
        self.fab = fab
        self.interval = interval
        self.samples: list[dict[str, Any]] = []
        self.cpu: list[dict[str, float]] = []
        self.errors = 0
        self._stop_evt = threading.Event()

    def sample_once(self) -> None:
        try:
            links = self.fab.api.links()
            self.samples.append({"t": time.monotonic(), "links": links.get("links", [])})
        except Exception as exc:  # a slow or restarting controller must not end the arm
            self.errors += 1
            log.debug("link sample failed: %s", exc)

    def run(self) -> None:
        prev = cpu.cpu_times()
        prev_t = time.monotonic()
        while not self._stop_evt.wait(self.interval):
            self.sample_once()
            now = cpu.cpu_times()
            idle = cpu.idle_fraction(prev, now)
            t = time.monotonic()
            if idle is not None:
                self.cpu.append({"t": t, "idle": round(idle, 4), "dt": round(t - prev_t, 3)})
            prev, prev_t = now, t

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(timeout=5)


_QDISC_RX = re.compile(r"^qdisc (\S+) (\S+) dev (\S+) (root|parent \S+).*?\n\s*Sent (\d+) bytes (\d+) pkt "
                       r"\(dropped (\d+), overlimits (\d+) requeues (\d+)\)", re.M)


def parse_qdisc_drops(text: str) -> dict[str, dict[str, int]]:
    """Per interface, from `tc -s qdisc show`: packets sent and dropped at its root qdisc (which counts
    its children's drops too)."""
    out: dict[str, dict[str, int]] = {}
    for m in _QDISC_RX.finditer(text):
        if m.group(4) != "root":
            continue
        out[m.group(3)] = {"sent_packets": int(m.group(6)), "dropped": int(m.group(7))}
    return out


def qdisc_drops(fab: Any) -> dict[str, dict[str, int]]:
    """Root-qdisc counters of every shaped interface: switch ends in the root namespace, host ends in
    the hosts' namespaces."""
    result: dict[str, dict[str, int]] = {}
    try:
        out = subprocess.run(["tc", "-s", "qdisc", "show"], capture_output=True, text=True, timeout=20)
        result.update(parse_qdisc_drops(out.stdout))
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("tc -s qdisc: %s", exc)
    for h in fab.topology.hosts:
        try:
            result.update(parse_qdisc_drops(fab.host(h.name).cmd("tc -s qdisc show")))
        except Exception as exc:
            log.debug("tc in %s: %s", h.name, exc)
    return result


# --------------------------------------------------------------------------------------------------
# Traffic


def _popen(ctx: ArmContext, host: str, cmd: list[str], out_file: Path | None = None) -> subprocess.Popen:
    stdout = open(out_file, "wb") if out_file else subprocess.DEVNULL  # noqa: SIM115 - closed on reap
    try:
        p = ctx.fab.host(host).popen(cmd, stdout=stdout, stderr=subprocess.PIPE)
    finally:
        if out_file:
            stdout.close()
    ctx.procs.append(p)
    return p


def datagram_size(topo: Topology) -> int:
    """The transport's datagram size on this fabric: its MTU less the IP and UDP headers."""
    return topo.mtu - IP_UDP_HEADERS


def _ready_file(ctx: ArmContext, name: str) -> Path:
    d = ctx.raw_dir / "ready"
    d.mkdir(exist_ok=True)
    return d / name


def wait_ready(files: list[Path], procs: list[subprocess.Popen], timeout: float = READY_TIMEOUT_S) -> list[int]:
    """Wait until every endpoint has announced that its sockets are open; returns their pids (as the
    endpoints wrote them). An endpoint that exits first, or a timeout, is an error naming why."""
    deadline = time.monotonic() + timeout
    while True:
        if all(f.exists() for f in files):
            return [json.loads(f.read_text())["pid"] for f in files]
        for p in procs:
            if p.poll() is not None:
                err = p.stderr.read().decode(errors="replace").strip() if p.stderr else ""
                last = err.splitlines()[-1] if err else f"exit status {p.returncode}"
                raise EmulatorError(f"an endpoint exited before it was ready: {last}")
        if time.monotonic() > deadline:
            missing = sum(not f.exists() for f in files)
            raise EmulatorError(f"{missing} of {len(files)} endpoints were not ready after {timeout:.0f} s; "
                                "the machine may be overloaded")
        time.sleep(0.02)


def _start_on_schedule(ctx: ArmContext, starts: list[tuple[float, Callable[[], None]]]) -> None:
    """Run each start at ctx.t0 + its offset: those due now at once, later ones from a thread that the
    arm's stop event ends (held senders that never get their signal exit on SIGTERM, sending nothing)."""
    starts = sorted(starts, key=lambda s: s[0])
    while starts and starts[0][0] <= 0:
        starts.pop(0)[1]()
    if not starts:
        return

    def run() -> None:
        for at, start in starts:
            if ctx.stop.wait(max(0.0, ctx.t0 + at - time.monotonic())):
                return
            try:
                start()
            except OSError as exc:  # the endpoint already ended: its own error is reported
                log.debug("late start failed: %s", exc)

    threading.Thread(target=run, daemon=True, name="fabriclab-starts").start()


def start_srd(ctx: ArmContext) -> tuple[list[subprocess.Popen], list[subprocess.Popen]]:
    """Receivers first, then every sender held with its sockets open; traffic starts (t0) when all are
    ready, so interpreter start-up and imports stay out of the measured window."""
    arm, w = ctx.arm, ctx.workload
    common = ["--recovery", arm.recovery, "--delivery", arm.delivery, "--mtu", str(datagram_size(ctx.topo))]
    receivers, ready = [], []
    for dst in sorted({f.dst for f in ctx.flows}):
        ready.append(_ready_file(ctx, f"recv-{dst}"))
        cmd = command_line("srd", "recv", "--bind", ctx.fab.ip(dst), "--port", str(SRD_PORT),
                           "--ready-file", str(ready[-1]), "--json-out", str(ctx.raw_dir / f"recv-{dst}.json"), *common)
        if w.request_response:
            cmd += ["--response-size", "64"]
        receivers.append(_popen(ctx, dst, cmd))
    wait_ready(ready, receivers)
    senders, ready = [], []
    for i, f in enumerate(ctx.flows):
        ready.append(_ready_file(ctx, f"send-{i}"))
        cmd = command_line("srd", "send", "--to", f"{ctx.fab.ip(f.dst)}:{SRD_PORT}", "--policy", arm.policy,
                           "--seed", str(ctx.seed * 1000 + i), "--base-port", str(BASE_PORT + 16 * f.index),
                           "--hold", "--ready-file", str(ready[-1]), "--size", str(w.message_size),
                           "--json-out", str(ctx.raw_dir / f"send-{i}-{f.src}-{f.dst}.json"), *common)
        if ctx.bytes_per_flow:
            # A cap so that a stuck flow cannot hold the run: 3x the time it needs at the host rate.
            cmd += ["--bytes", str(f.size or ctx.bytes_per_flow), "--duration", f"{3 * ctx.duration + 5:g}"]
        else:
            cmd += ["--duration", f"{ctx.duration:g}"]
        if w.request_response:
            cmd += ["--request-response", "--closed-loop", "8"]
        cmd += list(arm.options)
        senders.append(_popen(ctx, f.src, cmd))
    pids = wait_ready(ready, senders)
    ctx.t0 = time.monotonic()
    _start_on_schedule(ctx, [(f.start_s, partial(os.kill, pid, signal.SIGUSR1))
                             for f, pid in zip(ctx.flows, pids, strict=True)])
    return receivers, senders


def _tcp_client_port(ctx: ArmContext, i: int) -> int:
    # A fixed client port: ECMP hashes it, so the same seed gives the same paths.
    return BASE_PORT + 256 + (ctx.seed * 7 + i * 16) % 4096


def start_tcp(ctx: ArmContext) -> tuple[list[subprocess.Popen], list[subprocess.Popen]]:
    """TCP, the everyday baseline. Sized flows use transport.tcpflow, whose completion is when the
    receiver has every byte (iperf3 -n ends a test once the sender has *written* its bytes, so a flow
    that fits the socket buffers "completes" before most of it has crossed a slow link); timed flows
    use iperf3 -t."""
    if ctx.bytes_per_flow or any(f.size for f in ctx.flows):
        return _start_tcpflow(ctx)
    receivers = []
    for i, f in enumerate(ctx.flows):
        receivers.append(_popen(ctx, f.dst, ["iperf3", "-s", "-1", "-p", str(IPERF_PORT + i), "-J"],
                                ctx.raw_dir / f"iperf-server-{i}-{f.dst}.json"))
    time.sleep(0.5)  # iperf3 (C) starts in milliseconds; its servers only need to be listening
    senders = []
    ctx.t0 = time.monotonic()
    for i, f in enumerate(ctx.flows):
        cmd = ["iperf3", "-c", ctx.fab.ip(f.dst), "-p", str(IPERF_PORT + i), "--cport", str(_tcp_client_port(ctx, i)),
               "-J", "-i", "0.1", "-t", f"{ctx.duration:g}"]
        senders.append(_popen(ctx, f.src, cmd, ctx.raw_dir / f"iperf-client-{i}-{f.src}-{f.dst}.json"))
    return receivers, senders


def _start_tcpflow(ctx: ArmContext) -> tuple[list[subprocess.Popen], list[subprocess.Popen]]:
    """One receiver per flow (each takes one connection), every sender connected and held, then all
    released together (or at their matrix start times), as start_srd does."""
    tcpflow = command_line("tcpflow")
    timeout = f"{3 * ctx.duration + 20:g}"
    receivers, ready = [], []
    for i, f in enumerate(ctx.flows):
        ready.append(_ready_file(ctx, f"tcp-recv-{i}"))
        receivers.append(_popen(ctx, f.dst, [*tcpflow, "recv", "--bind", ctx.fab.ip(f.dst), "--port",
                                             str(IPERF_PORT + i), "--timeout", timeout, "--ready-file", str(ready[-1]),
                                             "--json-out", str(ctx.raw_dir / f"tcp-recv-{i}-{f.dst}.json")]))
    wait_ready(ready, receivers)
    senders, ready = [], []
    for i, f in enumerate(ctx.flows):
        ready.append(_ready_file(ctx, f"tcp-send-{i}"))
        senders.append(_popen(ctx, f.src, [
            *tcpflow, "send", "--to", f"{ctx.fab.ip(f.dst)}:{IPERF_PORT + i}", "--bytes",
            str(f.size or ctx.bytes_per_flow), "--cport", str(_tcp_client_port(ctx, i)), "--hold",
            "--timeout", timeout, "--ready-file", str(ready[-1]),
            "--json-out", str(ctx.raw_dir / f"tcp-send-{i}-{f.src}-{f.dst}.json")]))
    pids = wait_ready(ready, senders)
    ctx.t0 = time.monotonic()
    _start_on_schedule(ctx, [(f.start_s, partial(os.kill, pid, signal.SIGUSR1))
                             for f, pid in zip(ctx.flows, pids, strict=True)])
    return receivers, senders


def start_allreduce(ctx: ArmContext) -> tuple[list[subprocess.Popen], list[subprocess.Popen]]:
    w = ctx.workload
    ranks = [f.src for f in ctx.flows]
    peers = ",".join(f"{ctx.fab.ip(h)}:{SRD_PORT}" for h in ranks)
    workers = []
    ctx.t0 = time.monotonic()
    for r, h in enumerate(ranks):
        cmd = command_line("allreduce", "--rank", str(r), "--peers", peers,
                           "--size", str(w.elements), "--iterations", str(w.iterations),
                           "--json-out", str(ctx.raw_dir / f"allreduce-{r}-{h}.json"))
        cmd += _allreduce_options(ctx)
        workers.append(_popen(ctx, h, cmd))
    return [], workers


def _allreduce_options(ctx: ArmContext) -> list[str]:
    """Transport settings of the arm, and the host link rate for the worker's bandwidth bound."""
    arm = ctx.arm
    host_rate = min(lk.rate_mbps for h in ctx.topo.hosts for lk in ctx.topo.links_of(h.name))
    return ["--policy", arm.policy, "--recovery", arm.recovery, "--delivery", arm.delivery,
            "--seed", str(ctx.seed), "--link-rate-mbps", f"{host_rate:g}", "--timeout", "30"]


def start_ping(ctx: ArmContext) -> tuple[list[subprocess.Popen], list[subprocess.Popen]]:
    senders = []
    ctx.t0 = time.monotonic()
    count = max(20, int(ctx.duration / 0.02))
    for i, f in enumerate(ctx.flows):
        senders.append(_popen(ctx, f.src, ["ping", "-n", "-q", "-i", "0.02", "-c", str(count), ctx.fab.ip(f.dst)],
                              ctx.raw_dir / f"ping-{i}-{f.src}-{f.dst}.txt"))
    return [], senders


STARTERS: dict[str, Callable[[ArmContext], tuple[list[subprocess.Popen], list[subprocess.Popen]]]] = {
    "srd": start_srd,
    "tcp": start_tcp,
    "allreduce": start_allreduce,
    "ping": start_ping,
}


# --------------------------------------------------------------------------------------------------
# Faults


def busiest_fabric_link(topo: Topology, sampler: Sampler) -> tuple[str, str]:
    """The leaf->spine (or switch->switch) link direction carrying most bytes in the last samples."""
    fabric = analysis.fabric_hops(topo)
    best, best_bytes = None, -1
    s = sampler.samples[-3:] if len(sampler.samples) >= 2 else sampler.samples
    _, nbytes, _ = analysis.window_bytes(s)
    for (name, src), b in nbytes.items():
        if name in fabric and b > best_bytes:
            lk = next(lk for lk in topo.links if lk.name == name)
            best, best_bytes = (src, lk.peer(src)), b
    if best is None:
        lk = next(lk for lk in topo.links if lk.name in fabric)
        best = (lk.a, lk.b)
    return best


def apply_fault(ctx: ArmContext, fault: Fault, sampler: Sampler) -> None:
    a, b = fault.a, fault.b
    if a == "auto":
        a, b = busiest_fabric_link(ctx.topo, sampler)
    t = time.monotonic()
    fab = ctx.fab
    if fault.kind == "link_down":
        fab.set_link_up(a, b, False)
    elif fault.kind == "link_up":
        fab.set_link_up(a, b, True)
    elif fault.kind == "loss":
        fab.set_loss(a, b, fault.value)
    elif fault.kind == "rate":
        fab.set_rate(a, b, fault.value)
    else:
        raise EmulatorError(f"unknown fault kind {fault.kind}")
    ctx.fault_log.append({"kind": fault.kind, "a": a, "b": b, "value": fault.value, "planned_s": fault.at_s,
                          "at_s": round(t - ctx.t0, 4) if ctx.t0 else 0.0, "t": t})
    log.info("fault: %s %s-%s %s at %.2f s", fault.kind, a, b, fault.value, t - ctx.t0 if ctx.t0 else 0)


def _fault_thread(ctx: ArmContext, faults: list[Fault], sampler: Sampler, stop: threading.Event,
                  errors: list[str]) -> threading.Thread:
    def run() -> None:
        for f in sorted(faults, key=lambda f: f.at_s):
            if stop.wait(max(0.0, ctx.t0 + f.at_s - time.monotonic())):
                return
            try:
                apply_fault(ctx, f, sampler)
            except Exception as exc:
                errors.append(f"fault {f.describe()}: {exc}")

    th = threading.Thread(target=run, daemon=True, name="fabriclab-faults")
    th.start()
    return th


# --------------------------------------------------------------------------------------------------
# One arm


def _stop_procs(procs: list[subprocess.Popen], grace: float = 3.0) -> None:
    """SIGTERM (the endpoints write their metrics on it), then SIGKILL whatever is left, by pid."""
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
            except OSError:
                pass
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


def open_fabric(topo: Topology, mode: str, reporter: Reporter) -> Any:
    """A started Fabric; waits while another fabric holds the machine (they share interface names)."""
    from emulator.network import Fabric

    waited = 0.0
    while True:
        fab = Fabric(topo, mode=mode)
        try:
            fab.__enter__()
            return fab
        except EmulatorError as exc:
            if "another fabric" not in str(exc) or waited >= BUSY_WAIT_MAX_S:
                raise
            reporter.arm_progress(0.0, "waiting: another fabric is running")
            log.warning("%s; retrying in %.0f s", exc, BUSY_POLL_S)
            time.sleep(BUSY_POLL_S)
            waited += BUSY_POLL_S


def run_arm(exp: Experiment, arm: Arm, topo: Topology, flows: list[Flow], duration: float, seed: int,
            bytes_per_flow: int, raw_dir: Path, reporter: Reporter) -> dict[str, Any]:
    """Bring a fabric up, run one arm, tear it down; returns the raw material for its results."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    fab = open_fabric(topo, arm.mode, reporter)
    raw: dict[str, Any] = {"fault_errors": [], "endpoint_errors": []}
    try:
        raw["bring_up_s"] = round(fab.timings.bring_up_s, 3)
        raw["datapath"] = fab.datapath
        raw["loss_method"] = fab.shaper.loss_method if fab.shaper else None
        ctx = ArmContext(fab, exp, arm, topo, flows, duration, seed, bytes_per_flow, raw_dir,
                         workload=arm.workload or exp.workload)
        sampler = Sampler(fab)
        sampler.sample_once()
        sampler.start()
        q_before = qdisc_drops(fab)
        # Faults at time 0 are the arm's conditions: in place before any traffic.
        early = [f for f in arm.faults if f.at_s <= 0]
        late = [f for f in arm.faults if f.at_s > 0]
        for f in early:
            apply_fault(ctx, f, sampler)
        stop_faults = ctx.stop
        ledger = cpu.CpuLedger({"ovs": cpu.ovs_pid(), "controller": fab.controller.pid if fab.controller else None})
        try:
            receivers, senders = STARTERS[arm.kind](ctx)
            ledger.open()
            fault_th = _fault_thread(ctx, late, sampler, stop_faults, raw["fault_errors"]) if late else None
            last_start = max((f.start_s for f in flows), default=0.0)
            expected = duration
            limit = last_start + ((3 * duration + 20) if bytes_per_flow else duration + 20)
            if arm.kind == "allreduce":
                limit = max(limit, 120.0)
            # Late flows (a traffic matrix's later starts) may not have a process yet.
            while any(p.poll() is None for p in senders) or time.monotonic() < ctx.t0 + last_start:
                elapsed = time.monotonic() - ctx.t0
                reporter.arm_progress(min(0.99, elapsed / max(expected, 1e-3)))
                if elapsed > limit:
                    raw["endpoint_errors"].append(f"senders still running after {limit:.0f} s; stopped")
                    break
                time.sleep(0.2)
            t_end = time.monotonic()
            raw["cpu_window"] = ledger.close()
            time.sleep(0.3)  # the last ACKs reach the senders; the receivers' counters settle
            stop_faults.set()
            if fault_th is not None:
                fault_th.join(timeout=5)
            _stop_procs(receivers + senders)
            sampler.sample_once()
        finally:
            stop_faults.set()
            sampler.stop()
            _stop_procs(ctx.procs, grace=1.0)
        for p in ctx.procs:
            if p.returncode not in (0, -signal.SIGTERM, None) and p.stderr is not None:
                err = p.stderr.read().decode(errors="replace").strip()
                if err:
                    raw["endpoint_errors"].append(err.splitlines()[-1][:300])
        for p in ctx.procs:
            if p.stderr is not None:
                p.stderr.close()
        raw["qdisc_before"] = q_before
        raw["qdisc_after"] = qdisc_drops(fab)
        raw["samples"] = sampler.samples
        raw["cpu"] = sampler.cpu
        raw["t0"] = ctx.t0
        raw["traffic_s"] = round(t_end - ctx.t0, 3)
        raw["faults"] = [{k: v for k, v in f.items() if k != "t"} for f in ctx.fault_log]
        raw["fault_times"] = [f["t"] - ctx.t0 for f in ctx.fault_log]
        raw["events"] = _safe(fab.api.events)
    finally:
        fab.__exit__(None, None, None)
    raw["teardown_s"] = round(fab.timings.teardown_s, 3)
    raw["wall_s"] = round(time.monotonic() - t_start, 3)
    raw["endpoints"] = read_endpoints(raw_dir)
    return raw


def _safe(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:
        return None


def read_endpoints(raw_dir: Path) -> dict[str, Any]:
    """Every endpoint's output in the arm's raw directory, parsed (JSON, or ping's text)."""
    out: dict[str, Any] = {}
    for path in sorted(raw_dir.iterdir()):
        if path.suffix == ".json":
            try:
                out[path.stem] = json.loads(path.read_text())
            except (ValueError, OSError) as exc:
                out[path.stem] = {"error": f"unreadable: {exc}"}
        elif path.suffix == ".txt":
            out[path.stem] = {"text": path.read_text(errors="replace")}
    return out


# --------------------------------------------------------------------------------------------------
# A whole experiment


def plan_flows(w: Workload, topo: Topology, seed: int) -> list[Flow]:
    if w.pattern == "matrix":
        specs = [(f.src, f.dst, f.size, f.start_s) for f in w.flows]
    elif w.pattern == "pairs" and w.pairs:
        specs = [(s, d, 0, 0.0) for s, d in w.pairs]
    elif w.pattern == "ring":
        hosts = [h.name for h in topo.hosts]
        specs = [(h, hosts[(i + 1) % len(hosts)], 0, 0.0) for i, h in enumerate(hosts)]
    else:
        specs = [(s, d, 0, 0.0) for s, d in analysis.derangement_across(topo, seed)]
    seen: dict[str, int] = {}
    flows = []
    for s, d, size, start in specs:
        flows.append(Flow(s, d, seen.get(s, 0), size, start))
        seen[s] = seen.get(s, 0) + 1
    return flows


def flow_bytes(w: Workload, topo: Topology, duration: float) -> int:
    """Bytes per flow for sized workloads: `fill` of what the host link carries in `duration`; for a
    traffic matrix the largest flow's (each Flow carries its own `size`)."""
    if w.pattern == "matrix":
        return max((f.size for f in w.flows), default=0)
    if w.bytes_per_flow:
        return w.bytes_per_flow
    if not w.fill:
        return 0
    host_rate = min(lk.rate_mbps for h in topo.hosts for lk in topo.links_of(h.name))
    payload = datagram_size(topo) - DATA_HEADER_LEN
    goodput_rate = host_rate * 1e6 * payload / (payload + WIRE_OVERHEAD)
    return int(w.fill * goodput_rate * duration / 8 / w.message_size) * w.message_size or w.message_size


@dataclass
class RunOutcome:
    raws: list[tuple[Arm, dict[str, Any]]]
    complete: bool
    started: float
    finished: float
    flows: dict[str, list[Flow]]  # arm name -> its flows
    bytes_per_flow: dict[str, int]


def run_experiment(exp: Experiment, topo: Topology, out_dir: Path, reporter: Reporter | None = None,
                   arms: list[Arm] | None = None) -> RunOutcome:
    """Run every arm (and repetition) in turn; failures are recorded, Ctrl-C stops after teardown."""
    reporter = reporter or Reporter()
    arms = arms if arms is not None else exp.arms
    flows = {a.name: plan_flows(a.workload or exp.workload, topo, exp.seed) for a in arms}
    nbytes = {a.name: flow_bytes(a.workload or exp.workload, topo, exp.duration_s) for a in arms}
    raws: list[tuple[Arm, dict[str, Any]]] = []
    complete = True
    started = time.time()
    schedule = [(rep, arm) for rep in range(exp.repetitions) for arm in arms]
    reporter.run_started(exp, len(schedule))
    for i, (rep, arm) in enumerate(schedule):
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", arm.name) + (f"-rep{rep + 1}" if exp.repetitions > 1 else "")
        raw_dir = out_dir / "raw" / slug
        reporter.arm_started(i, arm, exp.duration_s)
        try:
            # Each repetition gets its own seed: the flows stay, but ECMP sees other entropy values and
            # client ports, so repetitions sample other hash placements.
            raw = run_arm(exp, arm, topo, flows[arm.name], exp.duration_s, exp.seed + rep, nbytes[arm.name],
                          raw_dir, reporter)
            raw["repetition"] = rep
            raw["seed"] = exp.seed + rep
        except (KeyboardInterrupt, Terminated) as exc:
            complete = False
            why = "interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else "terminated (SIGTERM)"
            raws.append((arm, {"error": why, "repetition": rep}))
            reporter.arm_finished(i, arm, raws[-1][1])
            break
        except Exception as exc:
            log.exception("arm %s failed", arm.name)
            raw = {"error": f"{type(exc).__name__}: {exc}", "repetition": rep}
            if raw_dir.exists():
                raw["endpoints"] = read_endpoints(raw_dir)
        raws.append((arm, raw))
        reporter.arm_finished(i, arm, raw)
    return RunOutcome(raws, complete, started, time.time(), flows, nbytes)


def clear_dir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
