"""Ring all-reduce over the transport, checked against numpy, vs its bandwidth bound."""

from __future__ import annotations

from typing import Any

from experiments.model import Arm, Experiment, Fault, Workload
from experiments.scenarios.common import allreduce_summary, ok_arms, secs
from experiments.schema import ResultsDocument
from topologies import Topology

NAME = "allreduce"
SUMMARY = "ring all-reduce over the transport, checked against numpy, vs its bandwidth bound"
ECMP, SPRAY, ECMP_LOSS1, SPRAY_LOSS1 = "ecmp", "spray", "ecmp-loss1", "spray-loss1"
ARMS = (ECMP, SPRAY, ECMP_LOSS1, SPRAY_LOSS1)


def build() -> Experiment:
    loss = (Fault(0.0, "loss", "leaf1", "spine1", 1.0),)
    return Experiment(
        name=NAME,
        title="Ring all-reduce over the transport: ECMP vs spraying, with and without loss",
        description="Every host holds a float32 array; a ring all-reduce (reduce-scatter, then all-gather) "
        "sums them over the transport and checks the result element for element against numpy summing "
        "in the same order. The bandwidth bound is 2(N-1)/N * S/B.",
        topology="leaf-spine:spines=2,leaves=2,hosts=2,rate=8",
        arms=[
            Arm(ECMP, kind="allreduce", mode="ecmp", policy="single"),
            Arm(SPRAY, kind="allreduce", mode="spray", policy="spray"),
            Arm(ECMP_LOSS1, kind="allreduce", mode="ecmp", policy="single", faults=loss, labels={"loss_pct": 1.0}),
            Arm(SPRAY_LOSS1, kind="allreduce", mode="spray", policy="spray", faults=loss, labels={"loss_pct": 1.0}),
        ],
        workload=Workload(pattern="ring", elements=1 << 20, iterations=3),
        duration_s=10.0,
        seed=1,
    )


def analyse(doc: ResultsDocument, topo: Topology) -> dict[str, Any]:
    out = {}
    for a in ok_arms(doc["arms"]):
        s = allreduce_summary(a)
        a.update({"iteration_s": s["iteration_s"], "bound_s": s["bound_s"],
                  "ratio_to_bound": s["ratio_to_bound"], "correct": s["correct"]})
        out[a["name"]] = s
    return {"allreduce": out}


def sentences(doc: ResultsDocument) -> list[str]:
    out = []
    for name, s in doc["analysis"].get("allreduce", {}).items():
        out.append(f"{name}: {secs(s['iteration_s'])} per iteration"
                   + (f", {s['ratio_to_bound']:.2f}x the bound {secs(s['bound_s'])}" if s["ratio_to_bound"] else "")
                   + ("; equal to numpy's sum." if s["correct"] else "; NOT equal to numpy's sum (or incomplete)."))
    return out
