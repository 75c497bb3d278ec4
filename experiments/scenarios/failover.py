"""Failover: a fabric link cut mid-transfer, and each arm's time back to 90 % of its goodput."""

from __future__ import annotations

from typing import Any

from experiments.analysis.recovery_time import flow_recovery
from experiments.arms.base import FINE_BIN
from experiments.model import Arm, Experiment, Fault, Workload
from experiments.scenarios.common import ok_arms, secs
from experiments.schema import ResultsDocument
from topologies import Topology
from transport.core.metrics import percentile

NAME = "failover"
SUMMARY = "a fabric link cut mid-transfer: recovery time of adaptive spraying, ECMP + reroute, TCP"
ACROSS_REPETITIONS = True  # recovery times and the speed-up are medians over the repetitions
ADAPTIVE, ECMP_REROUTE, TCP_ECMP = "adaptive", "ecmp-reroute", "tcp-ecmp"
# How long after the cut the controller reroutes. Its own reaction takes ~30 ms, which no real fabric
# matches: link-down detection alone is BFD's 3 x 300 ms, and routing convergence adds more, so real
# fabrics move flows after a few hundred ms to seconds. With the local figure every arm recovers alike
# and what the transport's own path steering buys never shows; 1 s is a fast real fabric.
CONTROLLER_REACTION_S = 1.0
# Bins of the fine series a recovery is read from, smoothed together: 60 ms, about 30 packets of a
# 6 Mb/s flow in standard frames, against RTOs of ~60 ms.
FINE_SMOOTH = 3


def build() -> Experiment:
    # "auto": the fabric link carrying the most bytes when the fault fires, so ECMP has a flow on it.
    cut = (Fault(3.0, "link_down", "auto", "auto"),)
    return Experiment(
        name=NAME,
        title="Failover: a fabric link cut mid-transfer",
        description="Three seconds in, the busiest leaf-spine link is cut. Adaptive spraying stops using "
        "the entropy values that time out; ECMP flows wait for the controller to remove the dead next hop, "
        f"which it does after its reaction delay ({CONTROLLER_REACTION_S:g} s unless --reaction-delay says "
        "otherwise), as a real fabric's link-down detection and routing would; TCP waits for its retransmission "
        "timer and the reroute."
        " Recovery is the time until a hit flow's goodput is back "
        "to 90 % of what it had before the cut.",
        # Uplinks with twice the hosts' rate: after losing one of two the leaf still carries every host.
        # Standard frames: its labs and documented figures are at 1,500 bytes, and this fabric stays
        # trusted with them (fabrics default to jumbo frames).
        topology="leaf-spine:spines=2,leaves=2,hosts=2,host_rate=6,fabric_rate=12,mtu=1500",
        arms=[
            Arm(ADAPTIVE, mode="spray", policy="adaptive", faults=cut),
            Arm(ECMP_REROUTE, mode="ecmp", policy="single", faults=cut),
            Arm(TCP_ECMP, kind="tcp", mode="ecmp", faults=cut),
        ],
        workload=Workload(pattern="permutation", fill=0.0),
        duration_s=8.0,
        seed=1,
        extra={"controller_reaction_s": CONTROLLER_REACTION_S},
    )


def analyse(doc: ResultsDocument, topo: Topology) -> dict[str, Any]:
    """Each arm's recovery (its slowest hit flow's), and per experiment arm the median over the
    repetitions with every repetition's own value; the adaptive arm's speed-up over the delayed
    reroute is taken within each repetition, where both met the same seed and the same cut."""
    by_rep: dict[str, dict[int, float]] = {}
    rtos_by_rep: dict[str, dict[int, float | None]] = {}
    cut = None
    for a in ok_arms(doc["arms"]):
        if not a.get("faults"):
            continue
        ft = a["faults"][0]["at_s"]
        b = a["goodput_series"]["bin_s"]
        recs = []
        for f in a["flows"]:
            # The fine series where the arm kind keeps one (the transport's): 0.1 s bins cannot resolve
            # a recovery of a few RTOs.
            if f.get("fine_series_bps"):
                r = flow_recovery(f["fine_series_bps"], FINE_BIN, ft, smooth=FINE_SMOOTH)
            else:
                r = flow_recovery(f.get("series_bps", []), b, ft)
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
        rep = int(a.get("repetition") or 0)
        by_rep.setdefault(a["name"], {})[rep] = a["recovery_s"]
        rtos_by_rep.setdefault(a["name"], {})[rep] = a["recovery_s"] / a["rto_s"] if a["rto_s"] else None
        cut = cut or a["faults"][0]["a"] + "-" + a["faults"][0]["b"]
    out: dict[str, Any] = {
        "recovery_s": {n: percentile(v.values(), 50) for n, v in by_rep.items()},
        "recovery_rtos": {n: percentile(v.values(), 50) for n, v in rtos_by_rep.items()},
        "recovery_s_by_repetition": {n: [v[k] for k in sorted(v)] for n, v in by_rep.items()},
    }
    adaptive, reroute = by_rep.get(ADAPTIVE, {}), by_rep.get(ECMP_REROUTE, {})
    ratios = [reroute[k] / adaptive[k] for k in sorted(adaptive.keys() & reroute.keys()) if adaptive[k] > 0]
    if ratios:
        out["adaptive_speedup"] = {"by_repetition": [round(x, 2) for x in ratios],
                                   "median": round(percentile(ratios, 50) or 0.0, 2), "min": round(min(ratios), 2)}
    if cut:
        out["cut"] = cut
    return out


def sentences(doc: ResultsDocument) -> list[str]:
    an = doc["analysis"]
    out = []
    if an.get("cut"):
        out.append(f"The cut link was {an['cut']} (the busiest when the fault fired)."
                   if len(an.get("adaptive_speedup", {}).get("by_repetition", ())) <= 1 else
                   "Each repetition cut the link that was busiest when its fault fired.")
    delay = (doc.get("extra") or {}).get("controller_reaction_s")
    if delay:
        out.append(f"The controller rerouted {delay:g} s after the cut, as a fast real fabric would (link-down "
                   "detection by BFD, then routing); its own reaction alone takes ~30 ms.")
    arms = [a for a in ok_arms(doc["arms"]) if a.get("faults")]
    repeated = len({a.get("repetition") or 0 for a in arms}) > 1
    for a in arms:
        rtos = a["recovery_s"] / a["rto_s"] if a.get("rto_s") else None
        name = a["name"] + (f" (repetition {a.get('repetition') or 0}, {a['faults'][0]['a']}-{a['faults'][0]['b']} cut)"
                            if repeated else "")
        out.append(f"{name}: {a.get('hit_flows', 0)} flow(s) hit; back to 90 % of their goodput after "
                   f"{secs(a.get('recovery_s'))}" + (f" ({rtos:.1f} RTOs of {secs(a['rto_s'])})" if rtos else "") + ".")
    speed = an.get("adaptive_speedup")
    if speed:
        out.append(speedup_sentence(speed["median"], len(speed["by_repetition"]), speed["min"]))
    return out


# Recoveries within this factor of each other are read as equal: one RTO sample of either arm moves
# its figure by more.
SAME_SPEED = 1.1


def speedup_sentence(ratio: float, repetitions: int = 1, slowest: float | None = None) -> str:
    """How adaptive spraying's recovery compares with the delayed reroute's, given their ratio (the
    reroute's recovery over adaptive's): sooner, about as soon, or later, in words that match it."""
    where = f" (the median of {repetitions} repetitions)" if repetitions > 1 else ""
    if ratio >= SAME_SPEED:
        if repetitions > 1 and slowest is not None:
            where = f" (the median of {repetitions} repetitions; {slowest:.1f}x in the slowest)"
        return (f"Adaptive spraying steered around the dead path {ratio:.1f}x sooner than ECMP waited for the "
                f"reroute{where}.")
    if ratio > 1 / SAME_SPEED:
        return f"Adaptive spraying steered around the dead path about as soon as ECMP was rerouted{where}."
    return (f"Adaptive spraying took {1 / ratio:.1f}x as long to steer around the dead path as ECMP took to be "
            f"rerouted{where}.")
