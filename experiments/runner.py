"""Runs an experiment: every arm on a freshly brought-up fabric, one after the other, same seed.

For each arm the runner brings the fabric up in the arm's routing mode, has the arm's kind start its
endpoints inside the Mininet hosts (experiments.arms: the transport's `srd` endpoints, TCP, the
all-reduce worker or ping), injects the arm's faults at their times, and meanwhile samples the
controller's per-link counters and the CPU's idle time every half second (emulator.sampling).
Afterwards it reads every endpoint's JSON, the queue drops of the shaped interfaces, and tears the
fabric down. An arm that fails is recorded with its error and the others still run; Ctrl-C keeps the
finished arms and marks the run incomplete.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from emulator import cpu
from emulator.errors import EmulatorError
from emulator.network import Terminated
from emulator.sampling import Sampler, qdisc_drops
from experiments import arms, records
from experiments.analysis.links import fabric_hops, window_bytes
from experiments.analysis.placement import derangement_across, host_rate_mbps
from experiments.arms import ArmContext, Flow
from experiments.model import Arm, Experiment, Fault, Workload, act
from experiments.records import RunOutcome
from experiments.schema import RawArm
from topologies import Link, Topology
from transport.core.headers import DATA_WIRE_OVERHEAD, datagram_size_for_mtu
from transport.core.wire import DATA_HEADER_LEN

log = logging.getLogger(__name__)

# Time to give a fabric that another run holds: poll this often, for at most this long.
BUSY_POLL_S = 20.0
BUSY_WAIT_MAX_S = 900.0

class Reporter:
    """Progress callbacks; the CLI shows a bar, the default logs."""

    def run_started(self, exp: Experiment, total_arms: int) -> None:
        log.info("running %s: %d arms", exp.name, total_arms)

    def arm_started(self, index: int, arm: Arm, expected_s: float) -> None:
        log.info("arm %d: %s", index + 1, arm.name)

    def arm_progress(self, fraction: float, note: str = "") -> None:
        pass

    def arm_finished(self, index: int, arm: Arm, result: RawArm) -> None:
        log.info("arm %s done%s", arm.name, f" (error: {result['error']})" if result.get("error") else "")


# --------------------------------------------------------------------------------------------------
# Faults


def busiest_fabric_link(topo: Topology, sampler: Sampler) -> tuple[str, str]:
    """The leaf->spine (or switch->switch) link direction carrying most bytes in the last samples."""
    fabric = fabric_hops(topo)
    best, best_bytes = None, -1
    s = sampler.samples[-3:] if len(sampler.samples) >= 2 else sampler.samples
    _, nbytes, _ = window_bytes(s)
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
    try:
        act(ctx.fab, fault.kind, a, b, fault.value)
    except ValueError as exc:
        raise EmulatorError(str(exc)) from None
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
    from emulator.cluster import new_fabric

    waited = 0.0
    while True:
        fab = new_fabric(topo, mode=mode)
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
            bytes_per_flow: int, raw_dir: Path, reporter: Reporter) -> RawArm:
    """Bring a fabric up, run one arm, tear it down; returns the raw material for its results."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    fab = open_fabric(topo, arm.mode, reporter)
    raw: RawArm = {"fault_errors": [], "endpoint_errors": []}
    try:
        raw["bring_up_s"] = round(fab.timings.bring_up_s, 3)
        reaction = exp.extra.get("controller_reaction_s")
        if reaction is not None:
            fab.api.set_reaction_delay(float(reaction))
        raw["datapath"] = fab.datapath
        raw["loss_method"] = fab.shaper.loss_method if fab.shaper else None
        ctx = ArmContext(fab, exp, arm, topo, flows, duration, seed, bytes_per_flow, raw_dir,
                         workload=arm.workload or exp.workload)
        sampler = Sampler(fab)
        sampler.sample_once()
        sampler.start()
        queue = _queue_watcher(fab, topo, exp.extra.get("watch_queue"))
        q_before = qdisc_drops(fab)
        # Faults at time 0 are the arm's conditions: in place before any traffic.
        early = [f for f in arm.faults if f.at_s <= 0]
        late = [f for f in arm.faults if f.at_s > 0]
        for f in early:
            apply_fault(ctx, f, sampler)
        stop_faults = ctx.stop
        ledger = cpu.CpuLedger({"ovs": fab.ovs_pids(), "controller": fab.controller.pid if fab.controller else None})
        try:
            kind = arms.get(arm.kind)
            receivers, senders = kind.start(ctx)
            ledger.open()
            servers_before = fab.server_cpu_jiffies() if hasattr(fab, "server_cpu_jiffies") else None
            fault_th = _fault_thread(ctx, late, sampler, stop_faults, raw["fault_errors"]) if late else None
            last_start = max((f.start_s for f in flows), default=0.0)
            expected = duration
            limit = max(kind.min_wait_s, last_start + ((3 * duration + 20) if bytes_per_flow else duration + 20))
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
            if servers_before is not None:
                from emulator.cluster.fabric import idle_between

                raw["server_cpu_idle"] = idle_between(servers_before, fab.server_cpu_jiffies())
                raw["servers"] = dict(fab.placement)
            time.sleep(0.3)  # the last ACKs reach the senders; the receivers' counters settle
            stop_faults.set()
            if fault_th is not None:
                fault_th.join(timeout=5)
            _stop_procs(receivers + senders)
            sampler.sample_once()
        finally:
            stop_faults.set()
            sampler.stop()
            if queue is not None:
                queue.stop()
                raw["queue_series"] = {"interface": queue.cmd[-1], "samples": queue.samples}
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
        raw["last_start_s"] = last_start
        raw["t0_unix"] = time.time() - (time.monotonic() - ctx.t0)  # endpoints stamp wall-clock times
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


def watched_link(topo: Topology, where: Sequence[str]) -> tuple[str, Link]:
    """The switch and link of `extra["watch_queue"]` = [switch, host] on `topo`. An experiment names its
    own fabric's switch (incast's leaf1); on another fabric the queue watched is the one into the same
    host, from whatever switch it hangs off."""
    switch, host = where
    if not topo.links_between(switch, host):
        switch = topo.host_switch(host)[0]
    return switch, topo.links_between(switch, host)[0]


def _queue_watcher(fab: Any, topo: Topology, where: Any) -> Any:
    """A running QueueWatcher on the egress of switch -> host, for `extra["watch_queue"]` = [switch, host]."""
    if not where:
        return None
    from emulator.sampling import QueueWatcher

    switch, link = watched_link(topo, where)
    pid = None if fab._in_root_namespace(switch) else fab.net[switch].pid
    watcher = QueueWatcher(pid, link.intf(switch))
    watcher.start()
    return watcher


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
    elif w.pattern == "incast":
        if w.receiver not in {h.name for h in topo.hosts}:
            raise EmulatorError(f"the incast's receiver {w.receiver} is not a host of {topo.name}; give a "
                                "--topo whose hosts include it")
        specs = [(h.name, w.receiver, 0, 0.0) for h in topo.hosts if h.name != w.receiver]
    elif w.pattern == "ring":
        hosts = [h.name for h in topo.hosts]
        specs = [(h, hosts[(i + 1) % len(hosts)], 0, 0.0) for i, h in enumerate(hosts)]
    else:
        specs = [(s, d, 0, 0.0) for s, d in derangement_across(topo, seed)]
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
    payload = datagram_size_for_mtu(topo.mtu) - DATA_HEADER_LEN
    goodput_rate = host_rate_mbps(topo) * 1e6 * payload / (payload + DATA_WIRE_OVERHEAD)
    return int(w.fill * goodput_rate * duration / 8 / w.message_size) * w.message_size or w.message_size


def run_experiment(exp: Experiment, topo: Topology, out_dir: Path, reporter: Reporter | None = None,
                   arms: list[Arm] | None = None, engine: str = "live") -> RunOutcome:
    """Run every arm (and repetition) in turn on `engine` ("live": a fabric brought up per arm; "sim":
    the simulated fabric, experiments.sim_arm); failures are recorded, Ctrl-C stops after teardown.

    Each arm's record is written to out_dir the moment it finishes (experiments.records), so what
    finished survives whatever happens to the rest of the run.
    """
    reporter = reporter or Reporter()
    arms = arms if arms is not None else exp.arms
    flows = {a.name: plan_flows(a.workload or exp.workload, topo, exp.seed) for a in arms}
    nbytes = {a.name: flow_bytes(a.workload or exp.workload, topo, exp.duration_s) for a in arms}
    raws: list[tuple[Arm, RawArm]] = []
    complete = True
    started = time.time()
    records.write_manifest(out_dir, exp, topo, started, engine=engine)
    schedule = [(rep, arm) for rep in range(exp.repetitions) for arm in arms]
    reporter.run_started(exp, len(schedule))
    for i, (rep, arm) in enumerate(schedule):
        slug = records.arm_slug(arm, rep, exp.repetitions)
        raw_dir = out_dir / "raw" / slug
        reporter.arm_started(i, arm, exp.duration_s)
        try:
            # Each repetition gets its own seed: the flows stay, but ECMP sees other entropy values and
            # client ports, so repetitions sample other hash placements.
            if engine == "sim":
                from experiments.sim_arm import run_arm_sim

                raw = run_arm_sim(exp, arm, topo, flows[arm.name], exp.duration_s, exp.seed + rep, nbytes[arm.name],
                                  reporter)
            else:
                raw = run_arm(exp, arm, topo, flows[arm.name], exp.duration_s, exp.seed + rep, nbytes[arm.name],
                              raw_dir, reporter)
            raw["repetition"] = rep
            raw["seed"] = exp.seed + rep
        except (KeyboardInterrupt, Terminated) as exc:
            complete = False
            why = ("interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt)
                   else f"terminated ({exc.args[0] if exc.args else 'SIGTERM'})")
            raws.append((arm, {"error": why, "repetition": rep}))
            records.write_arm(out_dir, i, slug, arm, raws[-1][1], flows[arm.name], nbytes[arm.name])
            reporter.arm_finished(i, arm, raws[-1][1])
            break
        except Exception as exc:
            log.exception("arm %s failed", arm.name)
            raw = {"error": f"{type(exc).__name__}: {exc}", "repetition": rep}
            if raw_dir.exists():
                raw["endpoints"] = read_endpoints(raw_dir)
        raws.append((arm, raw))
        records.write_arm(out_dir, i, slug, arm, raw, flows[arm.name], nbytes[arm.name])
        reporter.arm_finished(i, arm, raw)
    finished = time.time()
    records.write_manifest(out_dir, exp, topo, started, finished, complete, engine)
    return RunOutcome(raws, complete, started, finished, flows, nbytes, engine)
