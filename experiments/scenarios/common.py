"""What the experiments' analyses and sentences share: reading a results document's arms and flows,
formatting rates and times, summarising an all-reduce arm."""

from __future__ import annotations

import statistics
from typing import Any

from experiments.schema import ArmResult, ResultsDocument


def mbps(bps: float | None) -> str:
    return "-" if bps is None else f"{bps / 1e6:.1f} Mb/s"


def ok_arms(arms: list[ArmResult]) -> list[ArmResult]:
    return [a for a in arms if not a.get("error")]


def compared_repetition(doc: ResultsDocument) -> int:
    """Which repetition the comparisons between arms read: the last that has an arm that ran."""
    return max((a.get("repetition") or 0 for a in ok_arms(doc["arms"])), default=0)


def arms_by_name(doc: ResultsDocument) -> dict[str, ArmResult]:
    """The arms that ran, by name; in a repeated run, those of `compared_repetition` (repetitions_sentence
    says so, and gives every repetition's spread)."""
    rep = compared_repetition(doc)
    return {a["name"]: a for a in ok_arms(doc["arms"]) if (a.get("repetition") or 0) == rep}


def repetitions_sentence(doc: ResultsDocument, across: bool = False) -> list[str]:
    """For a repeated run: each arm's goodput over its repetitions, and which one the comparisons read
    (none to name when the experiment's analysis reads them all: `across`)."""
    reps = doc.get("repetitions") or 1
    by_name: dict[str, list[float]] = {}
    for a in ok_arms(doc["arms"]):
        by_name.setdefault(a["name"], []).append(a["goodput_bps"])
    if reps <= 1 or not by_name:
        return []
    spreads = [f"{name} {mbps(min(v))}, {mbps(statistics.median(v))}, {mbps(max(v))}"
               + (f" ({len(v)} of {reps} ran)" if len(v) < reps else "") for name, v in by_name.items()]
    which = "" if across else f" The comparisons below read repetition {compared_repetition(doc) + 1}."
    return [f"Across {reps} repetitions (one seed each), goodput min, median, max: " + "; ".join(spreads)
            + "." + which]


def flow_pairs(doc: ResultsDocument) -> list[tuple[str, str]]:
    return [(f["src"], f["dst"]) for f in doc.get("flows", [])]


def secs(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"


def allreduce_summary(a: ArmResult) -> dict[str, Any]:
    flows = a.get("flows", [])
    means = [f["iteration_mean_s"] for f in flows if f.get("iteration_mean_s")]
    bounds = [f["bound_s"] for f in flows if f.get("bound_s")]
    correct = [f.get("correct") for f in flows]
    mean = max(means) if means else None
    bound = bounds[0] if bounds else None
    return {"iteration_s": mean, "bound_s": bound, "ratio_to_bound": (mean / bound) if mean and bound else None,
            "correct": bool(correct) and all(c is True for c in correct)}

