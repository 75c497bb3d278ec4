"""Flat ring against hierarchical all-reduce on GPU servers: the same sum, but the hierarchical one
crosses the servers' NICs with a quarter of the bytes."""

from __future__ import annotations

from typing import Any

from experiments.model import Arm, Experiment, Workload
from experiments.scenarios.common import allreduce_summary, ok_arms, secs
from experiments.schema import ResultsDocument
from topologies import Topology

NAME = "hierarchical"
SUMMARY = "all-reduce over two GPU servers: a flat ring against reduce-scatter / all-reduce / all-gather"
FLAT, HIERARCHICAL = "flat-ring", "hierarchical"
SERVERS, GPUS = 2, 4


def _ranks() -> list[str]:
    return [f"s{s}g{g}" for s in range(1, SERVERS + 1) for g in range(1, GPUS + 1)]


def build() -> Experiment:
    ranks = _ranks()
    ring = tuple((ranks[i], ranks[(i + 1) % len(ranks)]) for i in range(len(ranks)))

    def work(collective: str, group: int) -> Workload:
        return Workload(pattern="pairs", pairs=ring, elements=262144, iterations=3, collective=collective,
                        group=group)

    return Experiment(
        name=NAME,
        title="Flat ring vs hierarchical all-reduce on GPU servers",
        description=f"{SERVERS * GPUS} GPUs on {SERVERS} servers ({GPUS} each behind a local switch at 5x the "
        "NIC's rate) all-reduce 1 MiB each. The flat ring sends 2(p-1)/p of the array over every edge, two "
        "of which cross the servers' NICs; the hierarchical all-reduce reduce-scatters inside each server, "
        "all-reduces each shard across servers (rank i of every server together), and all-gathers inside: "
        "the NICs carry a quarter of the bytes, shared by the server's four shard rings.",
        # Jumbo frames, and the local links at 25 Mb/s (the NICs at 5): the emulator's cost follows
        # packets: eight ranks at the builder's 100/20 kept a 2-core machine 19-26 % idle, at 50/10 31-38 %.
        topology=f"in-server:servers={SERVERS},gpus={GPUS},gpu_rate=25,nic_rate=5",
        arms=[
            Arm(FLAT, kind="allreduce", mode="local", policy="spray", workload=work("all-reduce", 1)),
            Arm(HIERARCHICAL, kind="allreduce", mode="local", policy="spray", workload=work("hierarchical", GPUS)),
        ],
        workload=Workload(pattern="pairs", pairs=ring),
        duration_s=3.0,
        seed=1,
    )


def analyse(doc: ResultsDocument, topo: Topology) -> dict[str, Any]:
    out: dict[str, Any] = {"allreduce": {}}
    for a in ok_arms(doc["arms"]):
        out["allreduce"][a["name"]] = s = allreduce_summary(a)
        a.update({"iteration_s": s["iteration_s"], "bound_s": s["bound_s"], "ratio_to_bound": s["ratio_to_bound"],
                  "correct": s["correct"]})
    return out


def sentences(doc: ResultsDocument) -> list[str]:
    ar = doc["analysis"].get("allreduce", {})
    out = []
    for name, s in ar.items():
        ratio = f", {s['ratio_to_bound']:.2f}x its bound {secs(s['bound_s'])}" if s.get("ratio_to_bound") else ""
        out.append(f"{name}: {secs(s['iteration_s'])} per all-reduce{ratio}; "
                   + ("every rank's result equal to numpy's." if s["correct"] else "RESULT DIFFERS from numpy's."))
    flat, hier = ar.get(FLAT, {}), ar.get(HIERARCHICAL, {})
    if flat.get("iteration_s") and hier.get("iteration_s"):
        out.append(f"The hierarchical all-reduce took {hier['iteration_s'] / flat['iteration_s']:.2f}x the flat "
                   "ring's time: it moves the bulk of the bytes over the servers' own switches.")
    return out
