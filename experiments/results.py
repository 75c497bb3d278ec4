"""Turning an arm's raw material (endpoint JSON, link samples, CPU, queue counters) into its results
entry, and the results.json document: schema, validation, saving and loading. The arm's kind reads
its endpoints' files (experiments.arms, through the transport's schema of them); the rest is common.

results.json top level: `experiment`, `title`, `topology` (spec and the fabric as plain data),
`seed`, `duration_s`, `fidelity` (worst over the arms), `arms` (one entry each, below), `analysis`
(what the experiment adds: e.g. the balls-in-bins expectation), `complete`, `started`, `finished`,
`flows`: experiments.schema's ResultsDocument, every arm an ArmResult (README "Experiments" says what
the keys mean); `experiments.schema.validate` checks a document.

Sized flows also get their ideal completion time and slowdown (FCT / ideal FCT, as htsim and ns-3
report it; `add_slowdowns`), from the endpoint's own framing and minimum RTT and the fabric's rates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from emulator import cpu
from experiments import arms, records, schema
from experiments.analysis.fidelity import OVS_CEILING_PPS, fidelity_verdict, simulated_verdict
from experiments.analysis.framing import (
    bottleneck_bps,
    ideal_fct,
    slowdown,
    topology_base_rtt,
    wire_bytes,
    wire_efficiency,
)
from experiments.analysis.links import directed_series, fabric_hops, hop_label, summarise_links, window_bytes
from experiments.arms.base import SERIES_BIN
from experiments.model import Arm
from experiments.schema import ArmResult, CpuBudget, RawArm, ResultsDocument, RunFidelity, arm_label
from topologies import Topology
from transport.core.metrics import percentile

SAMPLE_DT = 0.5  # seconds a CPU sample covers when it does not say (older results)


# --------------------------------------------------------------------------------------------------
# Per-arm extraction


def add_slowdowns(flows: list[dict[str, Any]], topo: Topology, kind: arms.ArmKind) -> dict[str, Any]:
    """Ideal completion time and slowdown of every sized flow that completed (in place), and the arm's
    mean and max slowdown over them.

    ideal = wire bytes / bottleneck rate + base RTT, where the wire bytes are the flow's bytes plus its
    packets' headers (this arm's transport: the SRD wire format or TCP), the bottleneck is the flow's
    rate alone in the fabric (bottleneck_bps) and the base RTT is the endpoint's minimum
    measured RTT, or, when it measured none, the fabric's (topology_base_rtt).
    """
    values = []
    incomplete = 0
    for f in flows:
        f.update(ideal_fct_s=None, slowdown=None)
        fct, size = f.get("duration_s"), f.get("bytes") or 0
        if not f.get("completed") or fct is None or size <= 0 or not f.get("dst"):
            incomplete += 1
            continue
        framing = kind.framing(f)
        rate = bottleneck_bps(topo, f["src"], f["dst"])
        rtt, source = f.get("min_rtt_s"), "measured"
        if not rtt:
            rtt, source = topology_base_rtt(topo, f["src"], f["dst"], framing), "topology"
        ideal = ideal_fct(size, framing, rate, rtt)
        f.update(wire_bytes=wire_bytes(size, framing), bottleneck_bps=rate, base_rtt_s=rtt,
                 base_rtt_source=source, ideal_fct_s=ideal, slowdown=slowdown(fct, ideal))
        values.append(f["slowdown"])
    return {
        "slowdown_mean": float(np.mean(values)) if values else None,
        "slowdown_max": max(values) if values else None,
        "slowdown_flows": len(values),
        "slowdown_incomplete": incomplete,
    }


def arm_result(arm: Arm, raw: RawArm, topo: Topology, ideal: float, sized: bool) -> ArmResult:
    """The results entry of one arm (an errored arm keeps its keys, with zeros and the error)."""
    entry: ArmResult = {
        "name": arm.name, "kind": arm.kind, "mode": arm.mode, "policy": arm.policy, "recovery": arm.recovery,
        "delivery": arm.delivery, "description": arms.describe(arm), "labels": dict(arm.labels),
        "error": raw.get("error"), "repetition": raw.get("repetition", 0),
        "goodput_bps": 0.0, "ideal_bps": ideal, "goodput_fraction": 0.0, "link_imbalance": 0.0,
        "hot_links": [], "completion_p50_s": None, "completion_p99_s": None,
        "slowdown_mean": None, "slowdown_max": None, "slowdown_flows": 0, "retransmissions": None,
        "reorder": None, "flows": [],
        "fidelity": fidelity_verdict([], 0.0, 0, 0).to_dict(),
    }
    if "samples" not in raw:
        return entry
    kind = arms.get(arm.kind)
    t0 = raw.get("t0") or 0.0
    traffic_s = raw.get("traffic_s") or 0.0
    n_bins = max(1, int(np.ceil((traffic_s + 1.0) / SERIES_BIN)))
    flows = kind.parse(raw, t0, n_bins)
    entry["flows"] = flows
    if not flows and kind.flows_required:
        errs = raw.get("endpoint_errors") or ["no endpoint wrote its metrics"]
        entry["error"] = f"no metrics from the senders: {errs[0]}"
    goodput = float(sum(f.get("goodput_bps") or 0.0 for f in flows))
    entry["goodput_bps"] = goodput
    entry["goodput_fraction"] = goodput / ideal if ideal > 0 else 0.0
    # What the wire format allows of the ideal: the ideal link rate times the share of each frame that
    # is payload (transport, UDP, IP and Ethernet headers cost ~6 % at 1500 bytes, under 1 % at 9000).
    if kind.point_to_point and flows and ideal > 0:
        framing = kind.framing(flows[0])
        eff = wire_efficiency(framing)
        entry["wire_efficiency"] = eff
        entry["goodput_of_wire"] = goodput / (ideal * eff)
    # Completion: flows' completion times when they have a size, else the messages' (transport).
    if sized:
        fct = [f["duration_s"] for f in flows if f.get("duration_s") is not None]
        entry["completion_p50_s"] = percentile(fct, 50)
        entry["completion_p99_s"] = percentile(fct, 99)
        entry["completion_kind"] = "flow"
        if kind.point_to_point:
            entry.update(add_slowdowns(flows, topo, kind))
    else:
        p50 = [f["message_p50_s"] for f in flows if f.get("message_p50_s") is not None]
        p99 = [f["message_p99_s"] for f in flows if f.get("message_p99_s") is not None]
        # Pooled percentiles are not available from summaries: the median flow's p50, the worst p99.
        entry["completion_p50_s"] = percentile(p50, 50)
        entry["completion_p99_s"] = max(p99) if p99 else None
        entry["completion_kind"] = "message"
    retx = [f.get("retransmissions") for f in flows if f.get("retransmissions") is not None]
    entry["retransmissions"] = int(sum(retx)) if retx else None
    if kind.reports_reordering:
        hist: dict[str, int] = {}
        for f in flows:
            for k, v in (f.get("reorder_distance") or {}).items():
                hist[k] = hist.get(k, 0) + v
        data = sum(f.get("data_packets", 0) for f in flows)
        entry["reorder"] = {
            "out_of_order": sum(f.get("out_of_order", 0) for f in flows),
            "out_of_order_fraction": (sum(f.get("out_of_order", 0) for f in flows) / data) if data else 0.0,
            "distance_histogram": hist,
            "spurious_retransmissions": sum(f.get("spurious_retransmissions", 0) for f in flows),
            "peak_reassembly_bytes": max((f.get("peak_reassembly_bytes", 0) for f in flows), default=0),
        }
    # Links, over the traffic window.
    samples = [s for s in raw["samples"] if t0 - 0.01 <= s["t"] <= t0 + traffic_s + 0.6] or raw["samples"]
    links = summarise_links(topo, samples)
    entry["link_imbalance"] = links.link_imbalance
    entry["hot_links"] = links.hot_links
    entry["link_utilisation"] = links.utilisation
    times, series = directed_series(raw["samples"])
    fabric = fabric_hops(topo)
    entry["link_series"] = {
        # Milliseconds resolve a live run's samples (0.5 s apart); a simulated one at 100 Gb/s lasts microseconds.
        "t": [round(t - (t0 - raw["samples"][0]["t"]), 9 if raw.get("engine") == "sim" else 3) for t in times],
        "util": {hop_label(h): [round(v, 4) for v in vals] for h, vals in sorted(series.items())},
        "fabric": sorted(hop_label(h) for h in series if h[0] in fabric),
    }
    # Aggregate goodput over time.
    agg = np.zeros(n_bins)
    for f in flows:
        s = f.get("series_bps") or []
        agg[: len(s)] += np.asarray(s[:n_bins])
    entry["goodput_series"] = {"bin_s": SERIES_BIN, "bps": [round(float(x), 1) for x in agg]}
    # Fidelity: CPU idle while traffic ran, switch load, drops outside the shaped queues. Endpoints
    # start (interpreter, imports, sockets) before t0, so only samples taken mostly inside the traffic
    # window are judged: a start-up blip does not count, a shortage during traffic does.
    start = kind.traffic_starts(raw, t0)
    end = traffic_ends(flows, start, raw.get("last_start_s") or 0.0, t0 + traffic_s)
    idle = traffic_idle(raw.get("cpu", []), start, end)
    steal = traffic_idle(raw.get("cpu", []), start, end, key="steal")
    shaped_sw, ovs_drops = _drops(raw, topo)
    socket_drops = sum(f.get("socket_drops", 0) or 0 for f in flows)
    socket_drops += sum(f.get("receiver_socket_drops_total", 0) or 0 for f in flows)
    vanished = vanished_packets(flows, raw, topo, arm)
    entry["vanished_packets"] = vanished
    outside = max(0, ovs_drops - shaped_sw) + socket_drops + (vanished or 0)
    _, _, npkts = window_bytes(samples)
    if raw.get("engine") == "sim":
        fid = simulated_verdict(links.switch_pps, outside, sum(npkts.values()))
        entry["engine"] = "sim"
        entry["sim"] = raw.get("sim", {})
    else:
        fid = fidelity_verdict(idle, links.switch_pps, outside, sum(npkts.values()),
                               servers_idle=raw.get("server_cpu_idle"), steal=steal)
    if raw.get("queue_series"):
        q = raw["queue_series"]
        pts = [p for p in q.get("samples", []) if p["t"] >= t0]
        entry["queue_series"] = {"interface": q.get("interface"), "t": [round(p["t"] - t0, 3) for p in pts],
                                 "packets": [p["packets"] for p in pts], "bytes": [p["bytes"] for p in pts]}
        entry["queue_max_packets"] = max((p["packets"] for p in pts), default=0)
    if raw.get("servers"):
        where = raw["servers"]
        entry["server_cpu_idle"] = raw.get("server_cpu_idle", {})
        entry["cross_server_links"] = sum(1 for lk in topo.links if where.get(lk.a) != where.get(lk.b))
    entry["fidelity"] = fid.to_dict()
    entry["cpu_budget"] = cpu_budget(raw, topo, npkts)
    entry["queue_drops"] = _queue_drop_delta(raw)
    entry["cpu_idle"] = [c["idle"] for c in raw.get("cpu", [])]
    entry["faults"] = raw.get("faults", [])
    entry["events"] = raw.get("events")
    entry["fault_errors"] = raw.get("fault_errors", [])
    entry["endpoint_errors"] = raw.get("endpoint_errors", [])
    entry["timings"] = {k: raw.get(k) for k in ("bring_up_s", "traffic_s", "teardown_s", "wall_s")}
    entry["datapath"] = raw.get("datapath")
    entry["loss_method"] = raw.get("loss_method")
    return entry


# Share of a CPU sample that must lie inside the traffic window for the sample to be judged: all of it,
# less timer jitter. A sample half before t0 is half start-up (32 interpreters importing, sockets
# opening): measured on a 16-host permutation, that one sample read 26 % idle against 60-77 % for
# every sample of the traffic itself, and whether it counted hung on where the sampler's ticks fell.
INSIDE_SHARE = 0.9


def traffic_ends(flows: list[dict[str, Any]], start: float, last_start_s: float, exited: float) -> float:
    """When the traffic ended: the latest a flow can have ended (the last start plus the longest
    flow), if the flows say how long they took, and never after the endpoints exited. The endpoints'
    own exit (128 interpreters writing their results on a k=8 fat-tree: 4 s at 0 % idle) is not
    traffic."""
    took = [f["duration_s"] for f in flows if isinstance(f.get("duration_s"), (int, float))]
    if not took or len(took) < len(flows):
        return exited
    return min(exited, start + last_start_s + max(took))


def traffic_idle(cpu: list[dict[str, float]], start: float, end: float, key: str = "idle") -> list[Any]:
    """Idle fractions (or another field, `key`: None where a sample lacks it) of the CPU samples that lie
    inside [start, end] (a sample at `t` covers the `dt` seconds before it); a window shorter than one
    sample judges the sample that covers most of it."""
    out = []
    best: tuple[float, Any] | None = None
    for c in cpu:
        lo, hi = c["t"] - c.get("dt", SAMPLE_DT), c["t"]
        if hi <= lo:
            continue
        inside = max(0.0, min(hi, end) - max(lo, start))
        if inside >= INSIDE_SHARE * (hi - lo):
            out.append(c.get(key))
        elif inside > 0 and (best is None or inside > best[0]):
            best = (inside, c.get(key))
    if not out and best is not None:
        out.append(best[1])
    return out


def cpu_budget(raw: RawArm, topo: Topology, npkts: dict[Any, int]) -> CpuBudget | None:
    """CPU seconds per component over the traffic window, and per million packets delivered to hosts
    (DATA and ACKs alike: every packet a host received from its switch)."""
    window = raw.get("cpu_window")
    if not window:
        return None
    run_s = [m.get("cpu_run_s") for m in (raw.get("endpoints") or {}).values() if isinstance(m, dict)]
    if any(v is not None for v in run_s):
        window = {**window, "endpoints": round(sum(v for v in run_s if v is not None), 3)}
        window["other"] = round(max(0.0, window["total"] - sum(
            v for k, v in window.items() if k not in ("other", "total", "steal") and v is not None)), 3)
    hosts = {h.name for h in topo.hosts}
    delivered = 0
    for key, n in npkts.items():
        name, src = key
        lk = next((lk for lk in topo.links if lk.name == name), None)
        if lk is not None and lk.peer(src) in hosts:
            delivered += n
    return {"window_s": raw.get("traffic_s"), "packets_delivered": delivered, "cpu_s": window,
            "cpu_s_per_mpkt": cpu.per_million_packets(window, delivered)}


def vanished_packets(flows: list[dict[str, Any]], raw: RawArm, topo: Topology, arm: Arm) -> int | None:
    """Data packets the fabric lost that no shaped queue dropped: sent by a sender, never seen by its
    receiver, beyond every drop the queues counted (a switch's receive socket that overflowed while its
    daemon was short of CPU loses packets where neither OVS nor tc counts them).

    Judged on flows whose data was all acknowledged (nothing left in flight), and not in arms that lose
    packets on purpose (loss on a link, a cut). The queues' drops include ACKs and unfinished flows', so
    the figure is a lower bound. None when it cannot be judged."""
    if any(lk.loss_pct for lk in topo.links) or any(f.kind in ("loss", "link_down") for f in arm.faults):
        return None
    done = [f for f in flows if f.get("completed") and f.get("packets_sent") is not None
            and f.get("datagrams_arrived") is not None]
    if not done:
        return None
    lost = sum(max(0, f["packets_sent"] - f["datagrams_arrived"]) for f in done)
    return max(0, lost - sum(_queue_drop_delta(raw).values()))


def _queue_drop_delta(raw: RawArm) -> dict[str, int]:
    before, after = raw.get("qdisc_before", {}), raw.get("qdisc_after", {})
    out = {}
    for dev, a in after.items():
        d = a["dropped"] - before.get(dev, {}).get("dropped", 0)
        if d > 0:
            out[dev] = d
    return out


def _drops(raw: RawArm, topo: Topology) -> tuple[int, int]:
    """(drops at the shaped queues of switch ports, drops OVS counted on its ports) over the arm."""
    switch_intfs = {lk.intf(end) for lk in topo.links for end in (lk.a, lk.b) if topo.node(end).is_switch}
    shaped = sum(v for dev, v in _queue_drop_delta(raw).items() if dev in switch_intfs)
    samples = raw.get("samples", [])
    if len(samples) < 2:
        return shaped, 0
    # A link's count starts from its first sample with counters: until the controller has read its
    # switch, a row says 0 (counted_at None), and a drop from before the arm (at bring-up) would count.
    first: dict[str, int] = {}
    for sample in samples:
        for lk in sample["links"]:
            if lk["name"] not in first and lk.get("counted_at", "") is not None:
                first[lk["name"]] = lk.get("drops", 0)
    ovs = sum(max(0, lk.get("drops", 0) - first.get(lk["name"], lk.get("drops", 0))) for lk in samples[-1]["links"])
    return shaped, ovs


# --------------------------------------------------------------------------------------------------
# The document


def label_repetitions(doc: ResultsDocument) -> None:
    """Name each arm of a repeated run with its repetition ("spray (rep 2)"), so that tables and sentences
    tell the rows apart."""
    if (doc.get("repetitions") or 1) > 1:
        for a in doc["arms"]:
            a.setdefault("label", f"{a['name']} (rep {a.get('repetition', 0) + 1})")


def worst_fidelity(arms: list[ArmResult]) -> RunFidelity:
    fids = [a["fidelity"] for a in arms if not a.get("error")]
    idle_min = [f["cpu_idle_min"] for f in fids if f.get("cpu_idle_min") is not None]
    idle_mean = [f["cpu_idle_mean"] for f in fids if f.get("cpu_idle_mean") is not None]
    reasons = []
    for a in arms:
        for r in a["fidelity"].get("reasons", []):
            reasons.append(f"{arm_label(a)}: {r}")
    steal = [f["cpu_steal_max"] for f in fids if f.get("cpu_steal_max") is not None]
    return {
        "cpu_idle_min": min(idle_min) if idle_min else None,
        "cpu_idle_mean": float(np.mean(idle_mean)) if idle_mean else None,
        "cpu_steal_max": max(steal) if steal else None,
        "switch_pps_peak": max((f.get("switch_pps_peak", 0.0) for f in fids), default=0.0),
        "ovs_ceiling_pps": OVS_CEILING_PPS,
        "drops_outside_queues": sum(f.get("drops_outside_queues", 0) for f in fids),
        "trusted": all(f.get("trusted") for f in fids) and bool(fids),
        "reasons": reasons,
    }


def save(doc: ResultsDocument, out_dir: Path) -> Path:
    """results.json into out_dir, whole or not at all."""
    return records.atomic_write_json(Path(out_dir) / records.RESULTS_FILE, doc)


def load(path: Path) -> ResultsDocument:
    """A stored results.json, read bounded (records.read_json) and held to the schema: a file that is
    not a results document is a ResultsReadError naming what is wrong. Keys the schema does not know
    pass (an older or newer run may carry some); a missing key or a value of another type does not."""
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist; give a results directory (results/NAME/<timestamp>) "
                                "or its results.json")
    doc = records.read_json(p)
    if not isinstance(doc, dict):
        raise records.ResultsReadError(f"{p} holds a JSON {type(doc).__name__}, not a results document (an object)")
    wrong = [w for w in schema.validate(doc) if ": unknown key " not in w]
    if wrong:
        more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        raise records.ResultsReadError(f"{p} is not a results document: {wrong[0]}{more}")
    return doc
