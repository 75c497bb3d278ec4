"""A degraded spine link: ECMP stuck on it, oblivious spraying, adaptive spraying, per-path share."""

from __future__ import annotations

from typing import Any

import numpy as np

from experiments.analysis.links import path_share
from experiments.model import Arm, Experiment, Fault, Workload
from experiments.scenarios.common import mbps, ok_arms
from experiments.schema import ResultsDocument, arm_label
from topologies import Topology

NAME = "hot-link"
SUMMARY = "one degraded spine link: ECMP vs oblivious vs adaptive spraying, per-path share"
ECMP_SINGLE, SPRAY, ADAPTIVE = "ecmp-single", "spray", "adaptive"


def build() -> Experiment:
    hot = (Fault(2.0, "rate", "leaf1", "spine1", 2.0),)
    return Experiment(
        name=NAME,
        title="A degraded spine link: ECMP stuck on it, oblivious spraying, adaptive spraying",
        description="Two seconds in, leaf1-spine1 drops to a sixth of its rate. ECMP flows hashed onto it "
        "stay there; oblivious spraying keeps sending a fixed share over it; adaptive spraying notices "
        "the delay and loss of those entropy values and steers around it.",
        # The uplinks have room for all hosts even without the degraded link, so an adaptive sender can
        # keep its full rate.
        # Standard frames: its labs and documented figures are at 1,500 bytes, and this fabric stays
        # trusted with them (fabrics default to jumbo frames).
        topology="leaf-spine:spines=2,leaves=2,hosts=2,host_rate=6,fabric_rate=12,mtu=1500",
        arms=[
            Arm(ECMP_SINGLE, mode="ecmp", policy="single", faults=hot),
            Arm(SPRAY, mode="spray", policy="spray", faults=hot),
            Arm(ADAPTIVE, mode="spray", policy="adaptive", faults=hot),
        ],
        workload=Workload(pattern="permutation", fill=0.0),
        duration_s=8.0,
        seed=1,
        extra={"hot_link": ["leaf1", "spine1"]},
    )


def analyse(doc: ResultsDocument, topo: Topology) -> dict[str, Any]:
    leaf, spine = doc.get("extra", {}).get("hot_link", ["leaf1", "spine1"])
    out: dict[str, Any] = {"hot_link": f"{leaf}-{spine}", "share_after_fault": {}}
    for a in ok_arms(doc["arms"]):
        ps = path_share(a, leaf)
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


def sentences(doc: ResultsDocument) -> list[str]:
    an = doc["analysis"]
    out = []
    for a in ok_arms(doc["arms"]):
        share = an["share_after_fault"].get(a["name"])
        out.append(f"{arm_label(a)}: {mbps(a.get('goodput_before_fault_bps'))} before the link was degraded, "
                   f"{mbps(a.get('goodput_after_fault_bps'))} after"
                   + (f"; {share:.0%} of {an['hot_link'].split('-')[0]}'s uplink bytes still crossed the hot link"
                      if share is not None else "") + ".")
    return out
