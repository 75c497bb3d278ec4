"""Reordering under spraying over unequal paths: ordered vs unordered delivery, head-of-line blocking."""

from __future__ import annotations

from typing import Any

from experiments.model import Arm, Experiment, Fault, Workload
from experiments.scenarios.common import arms_by_name, ok_arms, secs
from experiments.schema import ResultsDocument, arm_label
from topologies import Topology

NAME = "reordering"
SUMMARY = ("spraying over unequal paths: reorder distance, spurious retransmissions, ordered vs unordered "
           "delivery")
SPRAY_UNORDERED, SPRAY_ORDERED, SINGLE_ORDERED = "spray-unordered", "spray-ordered", "single-ordered"


def build() -> Experiment:
    # One spine link runs at a third of the others' rate: sprayed packets through it queue longer and
    # arrive behind their successors.
    slow = (Fault(0.0, "rate", "leaf1", "spine2", 3.0),)
    return Experiment(
        name=NAME,
        title="Reordering under spraying over unequally loaded paths: ordered vs unordered delivery",
        description="Requests of 64 KiB, eight outstanding, answered with 64 bytes. Spraying over two paths, "
        "one of them slowed to a third, reorders packets: unordered delivery hands each message over as "
        "soon as it is complete, ordered delivery waits for every earlier one (head-of-line blocking). "
        "A single path (no reordering) is the baseline.",
        # Standard frames: its labs and documented figures are at 1,500 bytes, and this fabric stays
        # trusted with them (fabrics default to jumbo frames).
        topology="leaf-spine:spines=2,leaves=2,hosts=1,rate=10,mtu=1500",
        arms=[
            Arm(SPRAY_UNORDERED, mode="spray", policy="spray", delivery="unordered", faults=slow),
            Arm(SPRAY_ORDERED, mode="spray", policy="spray", delivery="ordered", faults=slow),
            Arm(SINGLE_ORDERED, mode="ecmp", policy="single", delivery="ordered", faults=slow),
        ],
        workload=Workload(pattern="pairs", pairs=(("h1", "h2"),), fill=0.0, request_response=True),
        duration_s=5.0,
        seed=1,
    )


def analyse(doc: ResultsDocument, topo: Topology) -> dict[str, Any]:
    arms = arms_by_name(doc)
    u, o = arms.get(SPRAY_UNORDERED), arms.get(SPRAY_ORDERED)
    hol = None
    if u and o and u.get("completion_p99_s") and o.get("completion_p99_s"):
        hol = {"p50_ratio": (o["completion_p50_s"] or 0) / (u["completion_p50_s"] or 1),
               "p99_ratio": o["completion_p99_s"] / u["completion_p99_s"]}
    return {"head_of_line": hol}


def sentences(doc: ResultsDocument) -> list[str]:
    out = []
    for a in ok_arms(doc["arms"]):
        r = a.get("reorder") or {}
        out.append(f"{arm_label(a)}: {r.get('out_of_order_fraction', 0):.1%} of packets arrived out of order, "
                   f"{r.get('spurious_retransmissions', 0)} spurious retransmissions, reassembly peaked at "
                   f"{(r.get('peak_reassembly_bytes') or 0) / 1024:.0f} KiB; request completion p50 "
                   f"{secs(a['completion_p50_s'])}, p99 {secs(a['completion_p99_s'])}.")
    hol = doc["analysis"].get("head_of_line")
    if hol:
        out.append(f"Ordered delivery over sprayed paths costs {hol['p50_ratio']:.2f}x the median and "
                   f"{hol['p99_ratio']:.2f}x the p99 completion time of unordered delivery (head-of-line blocking).")
    return out
