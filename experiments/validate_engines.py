"""`fabriclab validate-engines`: each experiment's default run on both engines, headline figures side by
side, and every disagreement over 10 % named.

For every experiment with arms the simulated engine runs (the transport's own), the same definition
(fabric, flows, seed, faults, the arms both run) goes through `experiments.driver.execute` once per
engine, so the two results.json come out of the same analysis. The headline figures compared per arm:
goodput of ideal, slowdown mean and max, link imbalance, the incast's completion ratio, and the median
completion of a request/response arm. ECMP is compared flow for flow too: the live controller's link
counters say which fabric links each arm loaded, and the simulated engine puts every flow on the path
Open vSwitch's hash gives it, so the sets of loaded links must match.

Experiments whose arms all run programs the simulated engine does not model (the all-reduce worker,
training jobs, ping) are listed as such.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from experiments import catalogue, driver, engines
from experiments.analysis.links import fabric_hops

log = logging.getLogger(__name__)

TOLERANCE = 0.10
# Per arm: key in the results entry -> what the table calls it.
HEADLINES = {
    "goodput_fraction": "goodput of ideal",
    "slowdown_mean": "slowdown mean",
    "slowdown_max": "slowdown max",
    "link_imbalance": "link imbalance",
    "incast_completion_ratio": "incast completion ratio",
    "completion_p50_s": "completion p50",
}
# Utilisation above which a fabric link direction counts as loaded, for the flow-for-flow ECMP check.
LOADED = 0.05
DEFAULT_NAMES = ("ecmp-vs-spray", "loss-recovery", "reordering", "hot-link", "failover", "incast")


def headline(arm: dict[str, Any], key: str) -> float | None:
    value = arm.get(key)
    if key == "completion_p50_s" and arm.get("completion_kind") != "message":
        return None  # sized flows are compared by their slowdowns
    return float(value) if isinstance(value, (int, float)) else None


def _fabric(hop: str, fabric: set[str]) -> bool:
    a, _, b = hop.partition("->")
    return f"{a}-{b}" in fabric or f"{b}-{a}" in fabric


def compare(live: dict[str, Any], sim: dict[str, Any], fabric: set[str]) -> list[dict[str, Any]]:
    """Rows (arm, figure, live, sim, relative difference, over tolerance) for the arms both ran."""
    rows = []
    sims = {a["name"]: a for a in sim["arms"]}
    for la in live["arms"]:
        sa = sims.get(la["name"])
        if sa is None or la.get("error") or sa.get("error"):
            continue
        for key, label in HEADLINES.items():
            lv, sv = headline(la, key), headline(sa, key)
            if lv is None or sv is None:
                continue
            diff = (sv - lv) / lv if lv else (0.0 if sv == lv else float("inf"))
            rows.append({"arm": la["name"], "figure": label, "key": key, "live": lv, "sim": sv,
                         "difference": diff, "over": abs(diff) > TOLERANCE})
        if la.get("mode") == "ecmp" and la.get("policy") == "single":
            ll = [h for h, u in (la.get("link_utilisation") or {}).items() if u >= LOADED and _fabric(h, fabric)]
            sl = [h for h, u in (sa.get("link_utilisation") or {}).items() if u >= LOADED and _fabric(h, fabric)]
            same = sorted(ll) == sorted(sl)
            rows.append({"arm": la["name"], "figure": "ECMP's loaded fabric links", "key": "paths",
                         "live": len(ll), "sim": len(sl), "difference": 0.0 if same else 1.0, "over": not same,
                         "detail": {"live_only": sorted(set(ll) - set(sl)), "sim_only": sorted(set(sl) - set(ll))}})
    return rows


def run(names: tuple[str, ...] = DEFAULT_NAMES, duration: float | None = None, out_root: Path = Path("results"),
        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    out = {"experiments": [], "tolerance": TOLERANCE}
    for name in names:
        exp, topo = driver.prepare(name, duration=duration)
        keep, left = engines.runnable_arms(exp, "sim")
        entry: dict[str, Any] = {"experiment": name, "topology": exp.topology, "rows": [],
                                 "left_out": [f"{a.name} ({a.kind})" for a in left]}
        out["experiments"].append(entry)
        if not keep:
            entry["note"] = "no arm the simulated engine models"
            continue
        exp = replace(exp, arms=keep)
        docs = {}
        for engine in ("sim", "live"):
            if progress:
                progress(f"{name} on the {engine} engine ({len(keep)} arms)")
            rendered = driver.execute(exp, topo, out_root / "validate-engines", None, engine=engine)
            docs[engine] = rendered.doc
            entry[f"{engine}_results"] = str(rendered.out_dir)
        entry["live_trusted"] = docs["live"]["fidelity"].get("trusted")
        entry["rows"] = compare(docs["live"], docs["sim"], fabric_hops(topo))
    return out


def text_report(doc: dict[str, Any]) -> str:
    lines = [f"Each experiment's default on both engines; * marks a difference over {doc['tolerance']:.0%}.", ""]
    head = ("experiment", "arm", "figure", "live", "sim", "sim/live")
    table = [head]
    for e in doc["experiments"]:
        if not e["rows"]:
            table.append((e["experiment"], "-", e.get("note", "no figure both engines gave"), "", "", ""))
            continue
        for r in e["rows"]:
            if r["key"] == "paths":
                cells = (str(r["live"]), str(r["sim"]), "same links" if not r["over"] else "*other links")
            else:
                cells = (_fmt(r["key"], r["live"]), _fmt(r["key"], r["sim"]),
                         f"{'*' if r['over'] else ''}{1 + r['difference']:.2f}x")
            table.append((e["experiment"], r["arm"], r["figure"], *cells))
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for i, row in enumerate(table):
        lines.append("  ".join(c.ljust(w) if j < 3 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths,
                                                                                              strict=True))))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    untrusted = [e["experiment"] for e in doc["experiments"] if e.get("live_trusted") is False]
    left = [f"{e['experiment']}: {', '.join(e['left_out'])}" for e in doc["experiments"] if e["left_out"]]
    if untrusted:
        lines += ["", f"The live runs of {', '.join(untrusted)} were not trusted (the emulator fell behind): "
                  "their side of the table is not ground truth."]
    if left:
        lines += ["", "Arms left out (the simulated engine does not model their programs): " + "; ".join(left) + "."]
    over = sum(r["over"] for e in doc["experiments"] for r in e["rows"])
    total = sum(len(e["rows"]) for e in doc["experiments"])
    lines += ["", f"{total - over} of {total} figures agree within {doc['tolerance']:.0%}."]
    return "\n".join(lines)


def _fmt(key: str, value: float) -> str:
    if key == "goodput_fraction":
        return f"{value:.0%}"
    if key.endswith("_s"):
        return f"{value * 1e3:.1f} ms"
    return f"{value:.2f}"


def known_names() -> tuple[str, ...]:
    return tuple(catalogue.CATALOGUE)
