"""Turning an arm's raw material (endpoint JSON, link samples, CPU, queue counters) into its results
entry, and the results.json document: schema, validation, saving and loading.

results.json top level: `experiment`, `title`, `topology` (spec and the fabric as plain data),
`seed`, `duration_s`, `fidelity` (worst over the arms), `arms` (one entry each, below), `analysis`
(what the experiment adds: e.g. the balls-in-bins expectation), `complete`, `started`, `finished`,
`flows`. Every arm has the keys in ARM_KEYS; see README "Experiments" for their meaning.

Sized flows also get their ideal completion time and slowdown (FCT / ideal FCT, as htsim and ns-3
report it; `add_slowdowns`), from the endpoint's own framing and minimum RTT and the fabric's rates.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from emulator import cpu
from experiments import analysis
from experiments.model import Arm
from topologies import Topology

SCHEMA_VERSION = 2  # 2: arms carry slowdown_mean / slowdown_max, sized flows ideal_fct_s / slowdown
SERIES_BIN = 0.1  # seconds per goodput-series bin
SAMPLE_DT = 0.5  # seconds a CPU sample covers when it does not say (older results)

TOP_KEYS: dict[str, type | tuple[type, ...]] = {
    "schema": int,
    "experiment": str,
    "title": str,
    "topology": dict,
    "seed": int,
    "duration_s": (int, float),
    "fidelity": dict,
    "arms": list,
    "analysis": dict,
    "complete": bool,
}
NUM = (int, float)
OPT_NUM = (int, float, type(None))
ARM_KEYS: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "kind": str,
    "mode": str,
    "description": str,
    "error": (str, type(None)),
    "goodput_bps": NUM,
    "ideal_bps": NUM,
    "goodput_fraction": NUM,
    "link_imbalance": NUM,
    "hot_links": list,
    "completion_p50_s": OPT_NUM,
    "completion_p99_s": OPT_NUM,
    "slowdown_mean": OPT_NUM,
    "slowdown_max": OPT_NUM,
    "retransmissions": (int, type(None)),
    "reorder": (dict, type(None)),
    "flows": list,
    "fidelity": dict,
}


# --------------------------------------------------------------------------------------------------
# Per-arm extraction


def _rebin(start: float, width: float, values: list[float], t0: float, n_bins: int,
           out: np.ndarray) -> None:
    """Add a rate series (bit/s per bin of `width` from `start`) into `out`'s SERIES_BIN grid from t0."""
    for i, v in enumerate(values):
        if not v:
            continue
        b0 = start + i * width - t0
        idx = int(b0 // SERIES_BIN)
        if 0 <= idx < n_bins:
            # bytes in this source bin land in the target bin that holds its start
            out[idx] += v * width / SERIES_BIN


def _srd_flows(raw: dict[str, Any], t0: float, n_bins: int) -> list[dict[str, Any]]:
    endpoints = raw.get("endpoints", {})
    recv_by_cid: dict[int, dict[str, Any]] = {}
    for name, m in endpoints.items():
        if name.startswith("recv-"):
            for c in m.get("connections", []):
                recv_by_cid[c.get("connection_id")] = {**c, "_socket_drops": m.get("socket_drops")}
    flows = []
    for name in sorted(endpoints, key=_flow_order):
        if not name.startswith("send-"):
            continue
        m = endpoints[name]
        _, idx, src, dst = name.split("-", 3)
        conn = m.get("connection", {})
        snd = conn.get("sender", {})
        rc = recv_by_cid.get(m.get("connection_id"), {})
        rcv = rc.get("transport", {}).get("receiver", {})
        state = conn.get("state", {})
        series = np.zeros(n_bins)
        gp = rcv.get("goodput") or {}
        if gp.get("start") is not None:
            _rebin(gp["start"], gp["bin"], gp.get("bps", []), t0, n_bins, series)
        ct = m.get("completion_times") or {}
        srtt, rttvar = state.get("srtt"), state.get("rttvar")
        flows.append({
            "src": src, "dst": dst, "index": int(idx),
            "bytes": m.get("bytes", 0),
            "goodput_bps": m.get("goodput_bps", 0.0),
            "duration_s": m.get("duration"),
            "completed": m.get("completed"),
            "stop_reason": m.get("stop_reason"),
            "message_p50_s": ct.get("p50"), "message_p99_s": ct.get("p99"), "messages": ct.get("count", 0),
            "retransmissions": snd.get("retransmissions", 0),
            "spurious_retransmissions": snd.get("spurious_retransmissions", 0),
            "timeouts": snd.get("timeouts", 0),
            "gobackn_rewinds": snd.get("gobackn_rewinds", 0),
            "loss_recovery_p50_s": (snd.get("loss_recovery") or {}).get("p50"),
            "loss_recovery_p99_s": (snd.get("loss_recovery") or {}).get("p99"),
            "rtt_p50_s": (snd.get("rtt") or {}).get("p50"),
            "min_rtt_s": state.get("min_rtt"),
            "srtt_s": srtt, "rttvar_s": rttvar,
            "rto_s": (max(0.005, srtt + 4 * rttvar) if srtt is not None and rttvar is not None else None),
            "out_of_order": rcv.get("out_of_order", 0),
            "data_packets": rcv.get("data_packets", 0),
            "reorder_distance": rcv.get("reorder_distance", {}),
            "peak_reassembly_bytes": rcv.get("peak_reassembly_bytes", 0),
            "duplicates": rcv.get("duplicates", 0),
            "ev_datagrams_sent": m.get("ev_datagrams_sent", []),
            "socket_drops": (m.get("socket_drops") or 0),
            "series_bps": [round(float(x), 1) for x in series],
            "mtu": (m.get("config") or {}).get("mtu"),
            "message_size": (m.get("workload") or {}).get("size"),
        })
    recv_drops = sum((m.get("socket_drops") or 0) for n, m in endpoints.items() if n.startswith("recv-"))
    if flows:
        flows[0]["receiver_socket_drops_total"] = recv_drops
    return flows


def _flow_order(name: str) -> tuple[int, str]:
    parts = name.split("-")
    return (int(parts[1]), name) if len(parts) > 1 and parts[1].isdigit() else (1 << 30, name)


def _tcpflow_flows(raw: dict[str, Any], t0: float, n_bins: int) -> list[dict[str, Any]]:
    """Sized TCP flows (transport.tcpflow): the sender's completion is when the receiver had every byte;
    the bytes counted are the receiver's."""
    endpoints = raw.get("endpoints", {})
    recv = {name.split("-")[2]: m for name, m in endpoints.items() if name.startswith("tcp-recv-")}
    flows = []
    for name in sorted(endpoints, key=lambda n: _flow_order(n.replace("tcp-send-", "x-"))):
        if not name.startswith("tcp-send-"):
            continue
        m = endpoints[name]
        _, _, idx, src, dst = name.split("-", 4)
        r = recv.get(idx, {})
        series = np.zeros(n_bins)
        if m.get("t_start") is not None:
            _rebin(m["t_start"], m.get("bin_s", SERIES_BIN), m.get("series_bps") or [], t0, n_bins, series)
        completed = bool(m.get("completed"))
        flows.append({
            "src": src, "dst": dst, "index": int(idx),
            "bytes": r.get("bytes", m.get("bytes", 0) if completed else 0),
            "goodput_bps": m.get("goodput_bps", 0.0) if completed else 0.0,
            "duration_s": m.get("duration_s") if completed else None,
            "completed": completed,
            "stop_reason": m.get("stop_reason"),
            "retransmissions": m.get("retransmissions"),
            "series_bps": [round(float(x), 1) for x in series],
            "min_rtt_s": m.get("min_rtt_s"), "mss": m.get("mss"), "pmtu": m.get("pmtu"),
        })
    return flows


def _tcp_flows(raw: dict[str, Any], t0: float, n_bins: int) -> list[dict[str, Any]]:
    if any(name.startswith("tcp-send-") for name in raw.get("endpoints", {})):
        return _tcpflow_flows(raw, t0, n_bins)
    endpoints = raw.get("endpoints", {})
    flows = []
    for name in sorted(endpoints, key=lambda n: _flow_order(n.replace("iperf-client-", "x-"))):
        if not name.startswith("iperf-client-"):
            continue
        m = endpoints[name]
        _, _, idx, src, dst = name.split("-", 4)
        end = m.get("end", {}) if isinstance(m, dict) else {}
        recv = end.get("sum_received", {})
        sent = end.get("sum_sent", {})
        series = np.zeros(n_bins)
        for iv in m.get("intervals", []) if isinstance(m, dict) else []:
            s = iv.get("sum", {})
            i = int((s.get("start", 0.0) + 1e-9) // SERIES_BIN)
            if 0 <= i < n_bins:
                series[i] += s.get("bits_per_second", 0.0) * (s.get("seconds", SERIES_BIN) / SERIES_BIN)
        secs = max(recv.get("seconds", 0.0) or 0.0, sent.get("seconds", 0.0) or 0.0)
        flows.append({
            "src": src, "dst": dst, "index": int(idx),
            "bytes": recv.get("bytes", 0),
            "goodput_bps": recv.get("bits_per_second", 0.0),
            "duration_s": secs or None,
            "completed": bool(recv) and not m.get("error"),
            "stop_reason": m.get("error"),
            "retransmissions": sent.get("retransmits", 0),
            "series_bps": [round(float(x), 1) for x in series],
            **_iperf_framing(m),
        })
    return flows


def _iperf_framing(m: Any) -> dict[str, Any]:
    """The client's minimum RTT (iperf3 reports the sender's RTTs in microseconds, on Linux), its MSS
    and the path MTU, for the flow's ideal completion time."""
    if not isinstance(m, dict):
        return {"min_rtt_s": None, "mss": None, "pmtu": None}
    streams = (m.get("end") or {}).get("streams") or [{}]
    min_rtt_us = (streams[0].get("sender") or {}).get("min_rtt")
    pmtu = next((st["pmtu"] for iv in m.get("intervals") or [] for st in iv.get("streams") or []
                 if st.get("pmtu")), None)
    return {"min_rtt_s": min_rtt_us / 1e6 if min_rtt_us else None,
            "mss": (m.get("start") or {}).get("tcp_mss_default"), "pmtu": pmtu}


def _ping_flows(raw: dict[str, Any]) -> list[dict[str, Any]]:
    import re

    flows = []
    for name, m in sorted(raw.get("endpoints", {}).items()):
        if not name.startswith("ping-"):
            continue
        _, idx, src, dst = name.split("-", 3)
        text = m.get("text", "")
        rtt = re.search(r"= ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) ms", text)
        loss = re.search(r"([\d.]+)% packet loss", text)
        flows.append({
            "src": src, "dst": dst, "index": int(idx), "bytes": 0, "goodput_bps": 0.0,
            "rtt_min_s": float(rtt.group(1)) / 1e3 if rtt else None,
            "rtt_avg_s": float(rtt.group(2)) / 1e3 if rtt else None,
            "rtt_max_s": float(rtt.group(3)) / 1e3 if rtt else None,
            "loss_pct": float(loss.group(1)) if loss else None,
            "series_bps": [],
        })
    return flows


def _allreduce_flows(raw: dict[str, Any]) -> list[dict[str, Any]]:
    flows = []
    for name, m in sorted(raw.get("endpoints", {}).items(), key=lambda kv: _flow_order(kv[0])):
        if not name.startswith("allreduce-"):
            continue
        _, idx, host = name.split("-", 2)
        times = m.get("iteration_times_s") or []
        mean = m.get("mean_s")
        snd = ((m.get("transport") or {}).get("send") or {}).get("sender", {})
        rcv = ((m.get("transport") or {}).get("recv") or {}).get("receiver", {})
        nbytes = m.get("bytes", 0) or 0
        flows.append({
            "src": host, "dst": "", "index": int(idx), "bytes": nbytes,
            # A rank's share of the ring's traffic: it sends 2(N-1)/N of its array per iteration.
            "goodput_bps": (m.get("busbw_gbps") or 0.0) * 1e9,
            "duration_s": sum(times) if times else None,
            "completed": m.get("correct") is not None and m.get("error") is None,
            "correct": m.get("correct"),
            "mismatch": m.get("mismatch"),
            "iteration_times_s": times,
            "iteration_mean_s": mean,
            "bound_s": m.get("bound_s"),
            "ratio_to_bound": m.get("ratio_to_bound"),
            "retransmissions": snd.get("retransmissions", 0),
            "spurious_retransmissions": snd.get("spurious_retransmissions", 0),
            "out_of_order": rcv.get("out_of_order", 0),
            "data_packets": rcv.get("data_packets", 0),
            "reorder_distance": rcv.get("reorder_distance", {}),
            "peak_reassembly_bytes": rcv.get("peak_reassembly_bytes", 0),
            "socket_drops": (m.get("transport") or {}).get("socket_drops") or 0,
            "error": m.get("error"),
            "stop_reason": m.get("stop_reason"),
            "series_bps": [],
        })
    return flows


def flow_framing(flow: dict[str, Any], kind: str) -> analysis.Framing:
    """How this flow's endpoint cut its bytes into packets, from its own metrics (defaults otherwise)."""
    if kind == "tcp":
        mss = flow.get("mss") or analysis.TCP_MSS
        return analysis.tcp_framing(mss, flow.get("pmtu") or analysis.TCP_PMTU)
    return analysis.srd_framing(flow.get("mtu") or 1400, flow.get("message_size") or 65536)


def add_slowdowns(flows: list[dict[str, Any]], topo: Topology, kind: str) -> dict[str, Any]:
    """Ideal completion time and slowdown of every sized flow that completed (in place), and the arm's
    mean and max slowdown over them.

    ideal = wire bytes / bottleneck rate + base RTT, where the wire bytes are the flow's bytes plus its
    packets' headers (this arm's transport: the SRD wire format or TCP), the bottleneck is the flow's
    rate alone in the fabric (analysis.bottleneck_bps) and the base RTT is the endpoint's minimum
    measured RTT, or, when it measured none, the fabric's (analysis.topology_base_rtt).
    """
    values = []
    incomplete = 0
    for f in flows:
        f.update(ideal_fct_s=None, slowdown=None)
        fct, size = f.get("duration_s"), f.get("bytes") or 0
        if not f.get("completed") or fct is None or size <= 0 or not f.get("dst"):
            incomplete += 1
            continue
        framing = flow_framing(f, kind)
        rate = analysis.bottleneck_bps(topo, f["src"], f["dst"])
        rtt, source = f.get("min_rtt_s"), "measured"
        if not rtt:
            rtt, source = analysis.topology_base_rtt(topo, f["src"], f["dst"], framing), "topology"
        ideal = analysis.ideal_fct(size, framing, rate, rtt)
        f.update(wire_bytes=analysis.wire_bytes(size, framing), bottleneck_bps=rate, base_rtt_s=rtt,
                 base_rtt_source=source, ideal_fct_s=ideal, slowdown=analysis.slowdown(fct, ideal))
        values.append(f["slowdown"])
    return {
        "slowdown_mean": float(np.mean(values)) if values else None,
        "slowdown_max": max(values) if values else None,
        "slowdown_flows": len(values),
        "slowdown_incomplete": incomplete,
    }


def arm_result(arm: Arm, raw: dict[str, Any], topo: Topology, ideal: float, sized: bool) -> dict[str, Any]:
    """The results entry of one arm (an errored arm keeps its keys, with zeros and the error)."""
    entry: dict[str, Any] = {
        "name": arm.name, "kind": arm.kind, "mode": arm.mode, "policy": arm.policy, "recovery": arm.recovery,
        "delivery": arm.delivery, "description": arm.describe(), "labels": dict(arm.labels),
        "error": raw.get("error"), "repetition": raw.get("repetition", 0),
        "goodput_bps": 0.0, "ideal_bps": ideal, "goodput_fraction": 0.0, "link_imbalance": 0.0,
        "hot_links": [], "completion_p50_s": None, "completion_p99_s": None,
        "slowdown_mean": None, "slowdown_max": None, "slowdown_flows": 0, "retransmissions": None,
        "reorder": None, "flows": [],
        "fidelity": analysis.fidelity_verdict([], 0.0, 0, 0).to_dict(),
    }
    if "samples" not in raw:
        return entry
    t0 = raw.get("t0") or 0.0
    traffic_s = raw.get("traffic_s") or 0.0
    n_bins = max(1, int(np.ceil((traffic_s + 1.0) / SERIES_BIN)))
    if arm.kind == "srd":
        flows = _srd_flows(raw, t0, n_bins)
    elif arm.kind == "tcp":
        flows = _tcp_flows(raw, t0, n_bins)
    elif arm.kind == "ping":
        flows = _ping_flows(raw)
    else:
        flows = _allreduce_flows(raw)
    entry["flows"] = flows
    if not flows and arm.kind != "ping":
        errs = raw.get("endpoint_errors") or ["no endpoint wrote its metrics"]
        entry["error"] = f"no metrics from the senders: {errs[0]}"
    goodput = float(sum(f.get("goodput_bps") or 0.0 for f in flows))
    entry["goodput_bps"] = goodput
    entry["goodput_fraction"] = goodput / ideal if ideal > 0 else 0.0
    # What the wire format allows of the ideal: the ideal link rate times the share of each frame that
    # is payload (transport, UDP, IP and Ethernet headers cost ~6 % at 1500 bytes, under 1 % at 9000).
    if arm.kind in ("srd", "tcp") and flows and ideal > 0:
        framing = flow_framing(flows[0], arm.kind)
        eff = analysis.wire_efficiency(framing)
        entry["wire_efficiency"] = eff
        entry["goodput_of_wire"] = goodput / (ideal * eff)
    # Completion: flows' completion times when they have a size, else the messages' (transport).
    if sized:
        fct = [f["duration_s"] for f in flows if f.get("duration_s") is not None]
        entry["completion_p50_s"] = analysis.percentile(fct, 50)
        entry["completion_p99_s"] = analysis.percentile(fct, 99)
        entry["completion_kind"] = "flow"
        if arm.kind in ("srd", "tcp"):
            entry.update(add_slowdowns(flows, topo, arm.kind))
    else:
        p50 = [f["message_p50_s"] for f in flows if f.get("message_p50_s") is not None]
        p99 = [f["message_p99_s"] for f in flows if f.get("message_p99_s") is not None]
        # Pooled percentiles are not available from summaries: the median flow's p50, the worst p99.
        entry["completion_p50_s"] = analysis.percentile(p50, 50)
        entry["completion_p99_s"] = max(p99) if p99 else None
        entry["completion_kind"] = "message"
    retx = [f.get("retransmissions") for f in flows if f.get("retransmissions") is not None]
    entry["retransmissions"] = int(sum(retx)) if retx else None
    if arm.kind in ("srd", "allreduce"):
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
    links = analysis.summarise_links(topo, samples)
    entry["link_imbalance"] = links.link_imbalance
    entry["hot_links"] = links.hot_links
    entry["link_utilisation"] = links.utilisation
    times, series = analysis.directed_series(raw["samples"])
    entry["link_series"] = {
        "t": [round(t - (t0 - raw["samples"][0]["t"]), 3) for t in times],
        "util": {analysis.hop_label(h): [round(v, 4) for v in vals] for h, vals in sorted(series.items())},
        "fabric": sorted(analysis.hop_label(h) for h in series if h[0] in analysis.fabric_hops(topo)),
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
    idle = traffic_idle(raw.get("cpu", []), t0, t0 + traffic_s)
    shaped_sw, ovs_drops = _drops(raw, topo)
    socket_drops = sum(f.get("socket_drops", 0) or 0 for f in flows)
    socket_drops += sum(f.get("receiver_socket_drops_total", 0) or 0 for f in flows)
    outside = max(0, ovs_drops - shaped_sw) + socket_drops
    _, _, npkts = analysis.window_bytes(samples)
    fid = analysis.fidelity_verdict(idle, links.switch_pps, outside, sum(npkts.values()))
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


def traffic_idle(cpu: list[dict[str, float]], start: float, end: float) -> list[float]:
    """Idle fractions of the CPU samples that lie at least half inside [start, end] (a sample at `t`
    covers the `dt` seconds before it)."""
    out = []
    for c in cpu:
        lo, hi = c["t"] - c.get("dt", SAMPLE_DT), c["t"]
        inside = max(0.0, min(hi, end) - max(lo, start))
        if hi > lo and inside >= 0.5 * (hi - lo):
            out.append(c["idle"])
    return out


def cpu_budget(raw: dict[str, Any], topo: Topology, npkts: dict[Any, int]) -> dict[str, Any] | None:
    """CPU seconds per component over the traffic window, and per million packets delivered to hosts
    (DATA and ACKs alike: every packet a host received from its switch)."""
    window = raw.get("cpu_window")
    if not window:
        return None
    run_s = [m.get("cpu_run_s") for m in (raw.get("endpoints") or {}).values() if isinstance(m, dict)]
    if any(v is not None for v in run_s):
        window = {**window, "endpoints": round(sum(v for v in run_s if v is not None), 3)}
        window["other"] = round(max(0.0, window["total"] - sum(
            v for k, v in window.items() if k not in ("other", "total") and v is not None)), 3)
    hosts = {h.name for h in topo.hosts}
    delivered = 0
    for key, n in npkts.items():
        name, src = key
        lk = next((lk for lk in topo.links if lk.name == name), None)
        if lk is not None and lk.peer(src) in hosts:
            delivered += n
    return {"window_s": raw.get("traffic_s"), "packets_delivered": delivered, "cpu_s": window,
            "cpu_s_per_mpkt": cpu.per_million_packets(window, delivered)}


def _queue_drop_delta(raw: dict[str, Any]) -> dict[str, int]:
    before, after = raw.get("qdisc_before", {}), raw.get("qdisc_after", {})
    out = {}
    for dev, a in after.items():
        d = a["dropped"] - before.get(dev, {}).get("dropped", 0)
        if d > 0:
            out[dev] = d
    return out


def _drops(raw: dict[str, Any], topo: Topology) -> tuple[int, int]:
    """(drops at the shaped queues of switch ports, drops OVS counted on its ports) over the arm."""
    switch_intfs = {lk.intf(end) for lk in topo.links for end in (lk.a, lk.b) if topo.node(end).is_switch}
    shaped = sum(v for dev, v in _queue_drop_delta(raw).items() if dev in switch_intfs)
    samples = raw.get("samples", [])
    if len(samples) < 2:
        return shaped, 0
    first = {lk["name"]: lk.get("drops", 0) for lk in samples[0]["links"]}
    ovs = sum(max(0, lk.get("drops", 0) - first.get(lk["name"], 0)) for lk in samples[-1]["links"])
    return shaped, ovs


# --------------------------------------------------------------------------------------------------
# The document


def worst_fidelity(arms: list[dict[str, Any]]) -> dict[str, Any]:
    fids = [a["fidelity"] for a in arms if not a.get("error")]
    idle_min = [f["cpu_idle_min"] for f in fids if f.get("cpu_idle_min") is not None]
    idle_mean = [f["cpu_idle_mean"] for f in fids if f.get("cpu_idle_mean") is not None]
    reasons = []
    for a in arms:
        for r in a["fidelity"].get("reasons", []):
            reasons.append(f"{a['name']}: {r}")
    return {
        "cpu_idle_min": min(idle_min) if idle_min else None,
        "cpu_idle_mean": float(np.mean(idle_mean)) if idle_mean else None,
        "switch_pps_peak": max((f.get("switch_pps_peak", 0.0) for f in fids), default=0.0),
        "ovs_ceiling_pps": analysis.OVS_CEILING_PPS,
        "drops_outside_queues": sum(f.get("drops_outside_queues", 0) for f in fids),
        "trusted": all(f.get("trusted") for f in fids) and bool(fids),
        "reasons": reasons,
    }


def validate_results(doc: dict[str, Any]) -> list[str]:
    """Problems with a results document (empty when it has every key with the right type)."""
    problems = []
    for key, typ in TOP_KEYS.items():
        if key not in doc:
            problems.append(f"missing top-level key '{key}'")
        elif not isinstance(doc[key], typ) or (typ is int and isinstance(doc[key], bool)):
            problems.append(f"top-level '{key}' is {type(doc[key]).__name__}")
    for i, arm in enumerate(doc.get("arms", [])):
        for key, typ in ARM_KEYS.items():
            if key not in arm:
                problems.append(f"arm {i} ({arm.get('name')}): missing '{key}'")
            elif not isinstance(arm[key], typ):
                problems.append(f"arm {i} ({arm.get('name')}): '{key}' is {type(arm[key]).__name__}")
        if isinstance(arm.get("goodput_bps"), NUM) and arm["goodput_bps"] < 0:
            problems.append(f"arm {i}: negative goodput")
    return problems


def save(doc: dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "results.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=_jsonable) + "\n")
    tmp.replace(path)
    return path


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON-serialisable")


def load(path: Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist; give a results directory (results/NAME/<timestamp>) "
                                "or its results.json")
    return json.loads(p.read_text())
