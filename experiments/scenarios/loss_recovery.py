"""Loss recovery under random loss on a fabric link: selective repeat vs go-back-N vs TCP."""

from __future__ import annotations

from typing import Any

from experiments.model import Arm, Experiment, Fault, Workload
from experiments.scenarios.common import mbps, ok_arms
from experiments.schema import ResultsDocument
from topologies import Topology

NAME = "loss-recovery"
SUMMARY = "random loss 0/0.1/1/5 %: selective repeat vs go-back-N vs TCP"


LOSS_LEVELS = (0.0, 0.1, 1.0, 5.0)
RECOVERIES = ("selective", "gobackn", "tcp")  # the transport's two, and TCP's


def arm_name(recovery: str, loss_pct: float) -> str:
    """The arm of `recovery` ("selective", "gobackn" or "tcp") at `loss_pct` percent loss: "gobackn@1%"."""
    return f"{recovery}@{loss_pct:g}%"


def build() -> Experiment:
    arms = []
    for loss in LOSS_LEVELS:
        faults = (Fault(0.0, "loss", "leaf1", "spine1", loss),) if loss else ()
        labels = {"loss_pct": loss}
        arms += [
            Arm(arm_name("selective", loss), mode="ecmp", policy="spray", recovery="selective", faults=faults,
                labels={**labels, "recovery": "selective"}),
            Arm(arm_name("gobackn", loss), mode="ecmp", policy="spray", recovery="gobackn", faults=faults,
                labels={**labels, "recovery": "gobackn"}),
            Arm(arm_name("tcp", loss), kind="tcp", mode="ecmp", faults=faults, labels={**labels, "recovery": "tcp"}),
        ]
    return Experiment(
        name=NAME,
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


def analyse(doc: ResultsDocument, topo: Topology) -> dict[str, Any]:
    table: dict[str, dict[str, Any]] = {}
    for a in ok_arms(doc["arms"]):
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


def sentences(doc: ResultsDocument) -> list[str]:
    an = doc["analysis"]
    t = an.get("by_recovery", {})
    out = []
    for rec in RECOVERIES:
        row = t.get(rec)
        if not row:
            continue
        cells = [f"{k} %: {mbps(v['goodput_bps'])}" + (f" ({v['of_lossless']:.0%})" if v.get("of_lossless") else "")
                 for k, v in sorted(row.items(), key=lambda kv: float(kv[0]))]
        out.append(f"{rec}: " + "; ".join(cells) + ".")
    r1 = an.get("selective_over_gobackn", {}).get("1")
    sel1 = t.get("selective", {}).get("1", {})
    if r1:
        out.append(f"At 1 % loss selective repeat kept {sel1.get('of_lossless') or 0:.0%} of its lossless goodput and "
                   f"carried {r1:.1f}x what go-back-N did, which resends everything after each loss.")
    return out
