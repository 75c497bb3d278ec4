"""The experiments fabriclab ships: each a builder of an `Experiment` plus the analysis and the
sentences its summary adds, computed from the measured numbers.

Default topologies and rates are sized for two CPU cores: the transport's endpoints are Python
processes and userspace Open vSwitch forwards every packet in software, so rates are a few Mb/s per
host and the fabrics small enough that the emulated links, not the CPU, limit the traffic (each run
records CPU idle and says when that did not hold).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from experiments import analysis
from experiments.model import Arm, Experiment, Fault, Workload
from topologies import Topology
from transport.core.metrics import percentile


@dataclass(frozen=True)
class Entry:
    name: str
    summary: str
    build: Callable[[], Experiment]
    analyse: Callable[[dict[str, Any], Topology], dict[str, Any]]
    sentences: Callable[[dict[str, Any]], list[str]]


def _mbps(bps: float | None) -> str:
    return "-" if bps is None else f"{bps / 1e6:.1f} Mb/s"


def _ok(arms: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [a for a in arms if not a.get("error")]


def _by_name(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["name"]: a for a in _ok(doc["arms"])}


def _pairs(doc: dict[str, Any]) -> list[tuple[str, str]]:
    return [(f["src"], f["dst"]) for f in doc.get("flows", [])]


# --------------------------------------------------------------------------------------------------
# 1. ECMP vs spraying


def build_ecmp_vs_spray() -> Experiment:
    return Experiment(
        name="ecmp-vs-spray",
        title="ECMP hashing vs per-packet spraying under permutation traffic",
        description="Every host sends one flow to a host on another leaf. With one entropy value per flow "
        "ECMP hashes whole flows onto uplinks and some collide; spraying spreads every flow's packets "
        "over all uplinks. TCP (iperf3) over ECMP is the everyday baseline.",
        # Three hosts per leaf over two uplinks: by pigeonhole ECMP collides on every leaf, whatever the
        # hash, so the comparison does not hinge on one lucky or unlucky seed. 4 Mb/s per host keeps the
        # emulator trusted on two cores: its cost follows packets per second (`fabriclab bench fidelity`).
        topology="leaf-spine:spines=2,leaves=2,hosts=3,host_rate=4,fabric_rate=6",
        arms=[
            Arm("ecmp-single", mode="ecmp", policy="single"),
            Arm("spray", mode="spray", policy="spray"),
            Arm("tcp-ecmp", kind="tcp", mode="ecmp"),
        ],
        workload=Workload(pattern="permutation", fill=0.9, message_size=65536),
        duration_s=10.0,
        seed=1,
    )


def analyse_ecmp_vs_spray(doc: dict[str, Any], topo: Topology) -> dict[str, Any]:
    pairs = _pairs(doc)
    exp = analysis.ecmp_expectation(topo, pairs, trials=2000, seed=doc["seed"])
    out: dict[str, Any] = {"ecmp_expectation": exp.to_dict()}
    for a in doc["arms"]:
        if a["mode"] == "ecmp" and not a.get("error"):
            a["expected_goodput_bps"] = exp.expected_goodput_bps
            a["vs_expectation"] = a["goodput_bps"] / exp.expected_goodput_bps if exp.expected_goodput_bps else None
    # One run is one hash placement; the expectation is over placements, so compare it with the mean
    # over repetitions (each repetition has its own seed).
    ecmp = [a["goodput_bps"] for a in _ok(doc["arms"]) if a["name"] == "ecmp-single"]
    if ecmp and exp.expected_goodput_bps:
        mean = sum(ecmp) / len(ecmp)
        out["ecmp_placements"] = {"runs": len(ecmp), "mean_goodput_bps": mean,
                                  "mean_vs_expectation": mean / exp.expected_goodput_bps}
    return out


def sentences_ecmp_vs_spray(doc: dict[str, Any]) -> list[str]:
    arms = _by_name(doc)
    exp = doc["analysis"].get("ecmp_expectation", {})
    out = []
    bib = exp.get("balls_in_bins", {})
    if bib:
        out.append(
            f"Balls in bins: {bib['balls']} flows hashed onto {bib['bins']} uplinks collide with probability "
            f"{bib['prob_collision']:.0%}; the busiest uplink expects {bib['expected_max_load']:.2f} flows. Over "
            f"the whole fabric ECMP is expected to carry {_mbps(exp['expected_goodput_bps'])} "
            f"({exp['expected_fraction']:.0%} of the ideal {_mbps(exp['ideal_bps'])}; 10-90 % range "
            f"{_mbps(exp['goodput_p10_bps'])} to {_mbps(exp['goodput_p90_bps'])})."
        )
    s, e, t = arms.get("spray"), arms.get("ecmp-single"), arms.get("tcp-ecmp")
    if s:
        out.append(f"Spraying carried {_mbps(s['goodput_bps'])}, {s['goodput_fraction']:.0%} of ideal, "
                   f"with link imbalance {s['link_imbalance']:.2f} (max/mean utilisation of fabric links).")
    if e:
        vs = e.get("vs_expectation")
        hot = ", ".join(e["hot_links"]) or "none"
        out.append(f"ECMP with one entropy value per flow carried {_mbps(e['goodput_bps'])} "
                   f"({e['goodput_fraction']:.0%} of ideal"
                   + (f", {vs:.2f}x its balls-in-bins expectation" if vs else "")
                   + f"); imbalance {e['link_imbalance']:.2f}, hot links: {hot}.")
    if s and e and e["goodput_bps"] > 0:
        out.append(f"Spraying's aggregate goodput is {s['goodput_bps'] / e['goodput_bps']:.2f}x ECMP's; the slowest "
                   f"flow finished in {_s(s['completion_p99_s'])} sprayed against {_s(e['completion_p99_s'])} "
                   "hashed.")
    placements = doc["analysis"].get("ecmp_placements") or {}
    if placements.get("runs", 0) > 1:
        out.append(f"Over {placements['runs']} repetitions (one seed each, so other hash placements) ECMP "
                   f"carried {_mbps(placements['mean_goodput_bps'])} on average, "
                   f"{placements['mean_vs_expectation']:.2f}x its balls-in-bins expectation.")
    if t:
        out.append(f"TCP over ECMP carried {_mbps(t['goodput_bps'])} ({t['goodput_fraction']:.0%} of ideal) with "
                   f"{t['retransmissions'] or 0} retransmissions.")
    return out


def _s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"


# --------------------------------------------------------------------------------------------------
# 2. Loss recovery

LOSS_LEVELS = (0.0, 0.1, 1.0, 5.0)


def build_loss_recovery() -> Experiment:
    arms = []
    for loss in LOSS_LEVELS:
        faults = (Fault(0.0, "loss", "leaf1", "spine1", loss),) if loss else ()
        labels = {"loss_pct": loss}
        arms += [
            Arm(f"selective@{loss:g}%", mode="ecmp", policy="spray", recovery="selective", faults=faults,
                labels={**labels, "recovery": "selective"}),
            Arm(f"gobackn@{loss:g}%", mode="ecmp", policy="spray", recovery="gobackn", faults=faults,
                labels={**labels, "recovery": "gobackn"}),
            Arm(f"tcp@{loss:g}%", kind="tcp", mode="ecmp", faults=faults, labels={**labels, "recovery": "tcp"}),
        ]
    return Experiment(
        name="loss-recovery",
        title="Loss recovery: selective repeat vs go-back-N vs TCP under random loss",
        description="One flow crosses a fabric link that drops 0, 0.1, 1 and 5 % of packets at random "
        "(both directions). A single spine makes every arm cross the lossy link, so each sees the same "
        "loss rate.",
        topology="leaf-spine:spines=1,leaves=2,hosts=1,rate=10",
        arms=arms,
        workload=Workload(pattern="pairs", pairs=(("h1", "h2"),), fill=0.0),
        duration_s=5.0,
        seed=1,
    )


def analyse_loss_recovery(doc: dict[str, Any], topo: Topology) -> dict[str, Any]:
    table: dict[str, dict[str, Any]] = {}
    for a in _ok(doc["arms"]):
        rec, loss = a["labels"].get("recovery"), a["labels"].get("loss_pct")
        if rec is None or loss is None:
            continue
        row = table.setdefault(rec, {})
        rp = [f.get("loss_recovery_p50_s") for f in a["flows"] if f.get("loss_recovery_p50_s") is not None]
        row[f"{loss:g}"] = {"goodput_bps": a["goodput_bps"], "retransmissions": a["retransmissions"],
                            "recovery_p50_s": rp[0] if rp else None}
    for row in table.values():
        base = row.get("0", {}).get("goodput_bps")
        for cell in row.values():
            cell["of_lossless"] = cell["goodput_bps"] / base if base else None
    ratio = {}
    for loss in LOSS_LEVELS:
        k = f"{loss:g}"
        s = table.get("selective", {}).get(k, {}).get("goodput_bps")
        g = table.get("gobackn", {}).get(k, {}).get("goodput_bps")
        ratio[k] = s / g if s and g else None
    return {"by_recovery": table, "selective_over_gobackn": ratio}


def sentences_loss_recovery(doc: dict[str, Any]) -> list[str]:
    an = doc["analysis"]
    t = an.get("by_recovery", {})
    out = []
    for rec in ("selective", "gobackn", "tcp"):
        row = t.get(rec)
        if not row:
            continue
        cells = [f"{k} %: {_mbps(v['goodput_bps'])}" + (f" ({v['of_lossless']:.0%})" if v.get("of_lossless") else "")
                 for k, v in sorted(row.items(), key=lambda kv: float(kv[0]))]
        out.append(f"{rec}: " + "; ".join(cells) + ".")
    r1 = an.get("selective_over_gobackn", {}).get("1")
    sel1 = t.get("selective", {}).get("1", {})
    if r1:
        out.append(f"At 1 % loss selective repeat kept {sel1.get('of_lossless') or 0:.0%} of its lossless goodput and "
                   f"carried {r1:.1f}x what go-back-N did, which resends everything after each loss.")
    return out


# --------------------------------------------------------------------------------------------------
# 3. Reordering


def build_reordering() -> Experiment:
    # One spine link runs at a third of the others' rate: sprayed packets through it queue longer and
    # arrive behind their successors.
    slow = (Fault(0.0, "rate", "leaf1", "spine2", 3.0),)
    return Experiment(
        name="reordering",
        title="Reordering under spraying over unequally loaded paths: ordered vs unordered delivery",
        description="Requests of 64 KiB, eight outstanding, answered with 64 bytes. Spraying over two paths, "
        "one of them slowed to a third, reorders packets: unordered delivery hands each message over as "
        "soon as it is complete, ordered delivery waits for every earlier one (head-of-line blocking). "
        "A single path (no reordering) is the baseline.",
        topology="leaf-spine:spines=2,leaves=2,hosts=1,rate=10",
        arms=[
            Arm("spray-unordered", mode="spray", policy="spray", delivery="unordered", faults=slow),
            Arm("spray-ordered", mode="spray", policy="spray", delivery="ordered", faults=slow),
            Arm("single-ordered", mode="ecmp", policy="single", delivery="ordered", faults=slow),
        ],
        workload=Workload(pattern="pairs", pairs=(("h1", "h2"),), fill=0.0, request_response=True),
        duration_s=5.0,
        seed=1,
    )


def analyse_reordering(doc: dict[str, Any], topo: Topology) -> dict[str, Any]:
    arms = _by_name(doc)
    u, o = arms.get("spray-unordered"), arms.get("spray-ordered")
    hol = None
    if u and o and u.get("completion_p99_s") and o.get("completion_p99_s"):
        hol = {"p50_ratio": (o["completion_p50_s"] or 0) / (u["completion_p50_s"] or 1),
               "p99_ratio": o["completion_p99_s"] / u["completion_p99_s"]}
    return {"head_of_line": hol}


def sentences_reordering(doc: dict[str, Any]) -> list[str]:
    out = []
    for a in _ok(doc["arms"]):
        r = a.get("reorder") or {}
        out.append(f"{a['name']}: {r.get('out_of_order_fraction', 0):.1%} of packets arrived out of order, "
                   f"{r.get('spurious_retransmissions', 0)} spurious retransmissions, reassembly peaked at "
                   f"{(r.get('peak_reassembly_bytes') or 0) / 1024:.0f} KiB; request completion p50 "
                   f"{_s(a['completion_p50_s'])}, p99 {_s(a['completion_p99_s'])}.")
    hol = doc["analysis"].get("head_of_line")
    if hol:
        out.append(f"Ordered delivery over sprayed paths costs {hol['p50_ratio']:.2f}x the median and "
                   f"{hol['p99_ratio']:.2f}x the p99 completion time of unordered delivery (head-of-line blocking).")
    return out


# --------------------------------------------------------------------------------------------------
# 4. Hot link


def build_hot_link() -> Experiment:
    hot = (Fault(2.0, "rate", "leaf1", "spine1", 2.0),)
    return Experiment(
        name="hot-link",
        title="A degraded spine link: ECMP stuck on it, oblivious spraying, adaptive spraying",
        description="Two seconds in, leaf1-spine1 drops to a sixth of its rate. ECMP flows hashed onto it "
        "stay there; oblivious spraying keeps sending a fixed share over it; adaptive spraying notices "
        "the delay and loss of those entropy values and steers around it.",
        # The uplinks have room for all hosts even without the degraded link, so an adaptive sender can
        # keep its full rate.
        topology="leaf-spine:spines=2,leaves=2,hosts=2,host_rate=6,fabric_rate=12",
        arms=[
            Arm("ecmp-single", mode="ecmp", policy="single", faults=hot),
            Arm("spray", mode="spray", policy="spray", faults=hot),
            Arm("adaptive", mode="spray", policy="adaptive", faults=hot),
        ],
        workload=Workload(pattern="permutation", fill=0.0),
        duration_s=8.0,
        seed=1,
        extra={"hot_link": ["leaf1", "spine1"]},
    )


def analyse_hot_link(doc: dict[str, Any], topo: Topology) -> dict[str, Any]:
    leaf, spine = doc.get("extra", {}).get("hot_link", ["leaf1", "spine1"])
    out: dict[str, Any] = {"hot_link": f"{leaf}-{spine}", "share_after_fault": {}}
    for a in _ok(doc["arms"]):
        ps = analysis.path_share(a, leaf)
        a["path_share"] = ps
        fault_t = a["faults"][0]["at_s"] if a.get("faults") else 0.0
        key = f"{leaf}->{spine}"
        if ps and key in ps["share"]:
            vals = [s for t, s in zip(ps["t"], ps["share"][key], strict=True) if t >= fault_t + 1.0]
            out["share_after_fault"][a["name"]] = float(np.mean(vals)) if vals else None
        series = a["goodput_series"]["bps"]
        b = a["goodput_series"]["bin_s"]
        i0, i1 = int(fault_t / b), len(series)
        before = [x for x in series[int(0.5 / b): i0] if x]
        after = [x for x in series[i0 + int(1.0 / b): i1] if x]
        a["goodput_before_fault_bps"] = float(np.mean(before)) if before else None
        a["goodput_after_fault_bps"] = float(np.mean(after)) if after else None
    return out


def sentences_hot_link(doc: dict[str, Any]) -> list[str]:
    an = doc["analysis"]
    out = []
    for a in _ok(doc["arms"]):
        share = an["share_after_fault"].get(a["name"])
        out.append(f"{a['name']}: {_mbps(a.get('goodput_before_fault_bps'))} before the link was degraded, "
                   f"{_mbps(a.get('goodput_after_fault_bps'))} after"
                   + (f"; {share:.0%} of {an['hot_link'].split('-')[0]}'s uplink bytes still crossed the hot link"
                      if share is not None else "") + ".")
    return out


# --------------------------------------------------------------------------------------------------
# 5. Failover


def build_failover() -> Experiment:
    # "auto": the fabric link carrying the most bytes when the fault fires, so ECMP has a flow on it.
    cut = (Fault(3.0, "link_down", "auto", "auto"),)
    return Experiment(
        name="failover",
        title="Failover: a fabric link cut mid-transfer",
        description="Three seconds in, the busiest leaf-spine link is cut. Adaptive spraying stops using "
        "the entropy values that time out; ECMP flows wait for the controller to remove the dead next hop; "
        "TCP waits for its retransmission timer. Recovery is the time until a hit flow's goodput is back "
        "to 90 % of what it had before the cut.",
        # Uplinks with twice the hosts' rate: after losing one of two the leaf still carries every host.
        topology="leaf-spine:spines=2,leaves=2,hosts=2,host_rate=6,fabric_rate=12",
        arms=[
            Arm("adaptive", mode="spray", policy="adaptive", faults=cut),
            Arm("ecmp-reroute", mode="ecmp", policy="single", faults=cut),
            Arm("tcp-ecmp", kind="tcp", mode="ecmp", faults=cut),
        ],
        workload=Workload(pattern="permutation", fill=0.0),
        duration_s=8.0,
        seed=1,
    )


def analyse_failover(doc: dict[str, Any], topo: Topology) -> dict[str, Any]:
    out: dict[str, Any] = {"recovery_s": {}, "recovery_rtos": {}}
    for a in _ok(doc["arms"]):
        if not a.get("faults"):
            continue
        ft = a["faults"][0]["at_s"]
        b = a["goodput_series"]["bin_s"]
        recs = []
        for f in a["flows"]:
            r = analysis.flow_recovery(f.get("series_bps", []), b, ft)
            f["recovery"] = r
            if r["hit"]:
                recs.append(r["recovery_s"])
        # A hit flow that never recovers counts as the rest of the run.
        rest = len(a["goodput_series"]["bps"]) * b - ft
        vals = [rest if r is None else r for r in recs]
        a["hit_flows"] = len(recs)
        a["recovery_s"] = max(vals) if vals else 0.0
        rtos = [f["rto_s"] for f in a["flows"] if f.get("rto_s")]
        a["rto_s"] = percentile(rtos, 50)
        out["recovery_s"][a["name"]] = a["recovery_s"]
        out["recovery_rtos"][a["name"]] = (a["recovery_s"] / a["rto_s"]) if a["rto_s"] else None
        out.setdefault("cut", a["faults"][0]["a"] + "-" + a["faults"][0]["b"])
    return out


def sentences_failover(doc: dict[str, Any]) -> list[str]:
    an = doc["analysis"]
    out = []
    if an.get("cut"):
        out.append(f"The cut link was {an['cut']} (the busiest when the fault fired).")
    for a in _ok(doc["arms"]):
        rtos = an["recovery_rtos"].get(a["name"])
        out.append(f"{a['name']}: {a.get('hit_flows', 0)} flow(s) hit; back to 90 % of their goodput after "
                   f"{_s(a.get('recovery_s'))}" + (f" ({rtos:.1f} RTOs of {_s(a['rto_s'])})" if rtos else "") + ".")
    return out


# --------------------------------------------------------------------------------------------------
# 6. In-server


def build_in_server() -> Experiment:
    pairs = (("s1g1", "s1g2"),)
    ring = tuple((f"s1g{i}", f"s1g{i % 4 + 1}") for i in range(1, 5))
    ar = Workload(pattern="pairs", pairs=ring, elements=262144, iterations=3)
    return Experiment(
        name="in-server",
        title="In-server: GPU to GPU through the local switch vs the ToR hairpin",
        description="Latency (ping) between two GPUs of one server, and a ring all-reduce among four of "
        "its GPUs, routed through the server's local switch (NVSwitch-like) or up to the ToR and back.",
        topology="in-server:servers=2,gpus=8",
        arms=[
            Arm("ping-local", kind="ping", mode="local"),
            Arm("ping-via-tor", kind="ping", mode="via-tor"),
            Arm("allreduce-local", kind="allreduce", mode="local", policy="spray", workload=ar),
            Arm("allreduce-via-tor", kind="allreduce", mode="via-tor", policy="spray", workload=ar),
        ],
        workload=Workload(pattern="pairs", pairs=pairs),
        duration_s=3.0,
        seed=1,
    )


def _allreduce_summary(a: dict[str, Any]) -> dict[str, Any]:
    flows = a.get("flows", [])
    means = [f["iteration_mean_s"] for f in flows if f.get("iteration_mean_s")]
    bounds = [f["bound_s"] for f in flows if f.get("bound_s")]
    correct = [f.get("correct") for f in flows]
    mean = max(means) if means else None
    bound = bounds[0] if bounds else None
    return {"iteration_s": mean, "bound_s": bound, "ratio_to_bound": (mean / bound) if mean and bound else None,
            "correct": bool(correct) and all(c is True for c in correct)}


def analyse_in_server(doc: dict[str, Any], topo: Topology) -> dict[str, Any]:
    out: dict[str, Any] = {"latency": {}, "allreduce": {}}
    for a in _ok(doc["arms"]):
        if a["kind"] == "ping":
            rtts = [f.get("rtt_avg_s") for f in a["flows"] if f.get("rtt_avg_s") is not None]
            out["latency"][a["mode"]] = {"rtt_avg_s": rtts[0] if rtts else None}
            a["completion_p50_s"] = rtts[0] if rtts else None
        elif a["kind"] == "allreduce":
            out["allreduce"][a["mode"]] = s = _allreduce_summary(a)
            a.update({"iteration_s": s["iteration_s"], "bound_s": s["bound_s"],
                      "ratio_to_bound": s["ratio_to_bound"], "correct": s["correct"]})
    return out


def sentences_in_server(doc: dict[str, Any]) -> list[str]:
    an = doc["analysis"]
    out = []
    lat = an.get("latency", {})
    if lat.get("local", {}).get("rtt_avg_s") and lat.get("via-tor", {}).get("rtt_avg_s"):
        lo, vt = lat["local"]["rtt_avg_s"], lat["via-tor"]["rtt_avg_s"]
        out.append(f"Ping between two GPUs of one server: {_s(lo)} through the local switch, {_s(vt)} via the "
                   f"ToR hairpin ({vt / lo:.2f}x).")
    for mode, s in an.get("allreduce", {}).items():
        out.append(f"All-reduce {mode}: {_s(s['iteration_s'])} per iteration, "
                   + (f"{s['ratio_to_bound']:.2f}x the bandwidth bound {_s(s['bound_s'])}; " if s["ratio_to_bound"]
                      else "")
                   + ("result equal to numpy's." if s["correct"] else "RESULT DIFFERS from numpy's (or incomplete)."))
    return out


# --------------------------------------------------------------------------------------------------
# 7. All-reduce


def build_allreduce() -> Experiment:
    loss = (Fault(0.0, "loss", "leaf1", "spine1", 1.0),)
    return Experiment(
        name="allreduce",
        title="Ring all-reduce over the transport: ECMP vs spraying, with and without loss",
        description="Every host holds a float32 array; a ring all-reduce (reduce-scatter, then all-gather) "
        "sums them over the transport and checks the result element for element against numpy summing "
        "in the same order. The bandwidth bound is 2(N-1)/N * S/B.",
        topology="leaf-spine:spines=2,leaves=2,hosts=2,rate=8",
        arms=[
            Arm("ecmp", kind="allreduce", mode="ecmp", policy="single"),
            Arm("spray", kind="allreduce", mode="spray", policy="spray"),
            Arm("ecmp-loss1", kind="allreduce", mode="ecmp", policy="single", faults=loss, labels={"loss_pct": 1.0}),
            Arm("spray-loss1", kind="allreduce", mode="spray", policy="spray", faults=loss, labels={"loss_pct": 1.0}),
        ],
        workload=Workload(pattern="ring", elements=1 << 20, iterations=3),
        duration_s=10.0,
        seed=1,
    )


def analyse_allreduce(doc: dict[str, Any], topo: Topology) -> dict[str, Any]:
    out = {}
    for a in _ok(doc["arms"]):
        s = _allreduce_summary(a)
        a.update({"iteration_s": s["iteration_s"], "bound_s": s["bound_s"],
                  "ratio_to_bound": s["ratio_to_bound"], "correct": s["correct"]})
        out[a["name"]] = s
    return {"allreduce": out}


def sentences_allreduce(doc: dict[str, Any]) -> list[str]:
    out = []
    for name, s in doc["analysis"].get("allreduce", {}).items():
        out.append(f"{name}: {_s(s['iteration_s'])} per iteration"
                   + (f", {s['ratio_to_bound']:.2f}x the bound {_s(s['bound_s'])}" if s["ratio_to_bound"] else "")
                   + ("; equal to numpy's sum." if s["correct"] else "; NOT equal to numpy's sum (or incomplete)."))
    return out


# --------------------------------------------------------------------------------------------------

CATALOGUE: dict[str, Entry] = {
    e.name: e
    for e in (
        Entry("ecmp-vs-spray", "permutation traffic: one EV per flow over ECMP vs spraying vs TCP (the demo)",
              build_ecmp_vs_spray, analyse_ecmp_vs_spray, sentences_ecmp_vs_spray),
        Entry("loss-recovery", "random loss 0/0.1/1/5 %: selective repeat vs go-back-N vs TCP",
              build_loss_recovery, analyse_loss_recovery, sentences_loss_recovery),
        Entry("reordering", "spraying over unequal paths: reorder distance, spurious retransmissions, ordered "
              "vs unordered delivery", build_reordering, analyse_reordering, sentences_reordering),
        Entry("hot-link", "one degraded spine link: ECMP vs oblivious vs adaptive spraying, per-path share",
              build_hot_link, analyse_hot_link, sentences_hot_link),
        Entry("failover", "a fabric link cut mid-transfer: recovery time of adaptive spraying, ECMP + reroute, TCP",
              build_failover, analyse_failover, sentences_failover),
        Entry("in-server", "GPU latency and all-reduce through the local switch vs the ToR hairpin",
              build_in_server, analyse_in_server, sentences_in_server),
        Entry("allreduce", "ring all-reduce over the transport, checked against numpy, vs its bandwidth bound",
              build_allreduce, analyse_allreduce, sentences_allreduce),
    )
}


def get(name: str) -> Entry:
    try:
        return CATALOGUE[name]
    except KeyError:
        raise KeyError(name) from None


# The smallest all-reduce a shortened run still makes: one 64 KiB piece per rank.
MIN_COLLECTIVE_ELEMENTS = 16 * 1024


def _scaled_collective(w: Workload, scale: float) -> Workload:
    """An all-reduce is sized in elements, not seconds: a shorter or longer run scales the array, so
    `--duration` means the same thing (about how long the traffic lasts) for every experiment."""
    if not w.elements:
        return w
    elements = max(MIN_COLLECTIVE_ELEMENTS, round(w.elements * scale / 1024) * 1024)
    return replace(w, elements=elements)


class ArmNotFound(LookupError):
    """--arms named an arm the experiment does not have."""


def with_overrides(exp: Experiment, topology: str | None = None, duration: float | None = None,
                   seed: int | None = None, repetitions: int | None = None,
                   arms: Sequence[str] | None = None) -> Experiment:
    """A copy of `exp` with the command line's overrides (fault times scale with the duration; `arms`
    keeps only the arms named, in the experiment's own order)."""
    if arms:
        unknown = [a for a in arms if a not in {x.name for x in exp.arms}]
        if unknown:
            raise ArmNotFound(f"{exp.name} has no arm {', '.join(repr(u) for u in unknown)}; its arms are "
                              f"{', '.join(a.name for a in exp.arms)}")
        exp = replace(exp, arms=[a for a in exp.arms if a.name in arms])
    if duration is not None and duration != exp.duration_s:
        scale = duration / exp.duration_s
        exp = replace(exp, arms=[replace(a, faults=tuple(replace(f, at_s=f.at_s * scale) if f.at_s > 0 else f
                                                         for f in a.faults)) for a in exp.arms],
                      duration_s=duration, workload=_scaled_collective(exp.workload, scale))
    if topology:
        exp = replace(exp, topology=topology)
    if seed is not None:
        exp = replace(exp, seed=seed)
    if repetitions:
        exp = replace(exp, repetitions=repetitions)
    return exp
