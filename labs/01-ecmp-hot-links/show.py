"""Lab 1: what `python lab1/hotlinks.py RESULTS_DIR` prints: the student's functions on a measured run of
`fabriclab run ecmp-vs-spray`, next to fabriclab's own balls-in-bins expectation and link imbalance."""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType
from typing import Any

from labs.catalogue import LabError
from labs.grading import load_results
from labs.script import attempt


def _fmt(value: Any) -> str:
    if value is None:
        return "TODO"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.2f}"
    if isinstance(value, list):
        return ", ".join(value) or "none"
    return str(value)


def main(student: ModuleType, argv: list[str]) -> int:
    if len(argv) != 1:
        raise LabError("give the results directory of `fabriclab run ecmp-vs-spray --out DIR`, e.g. results/lab1")
    doc = load_results(Path(argv[0]), "ecmp-vs-spray")
    bib = doc["analysis"].get("ecmp_expectation", {}).get("balls_in_bins", {})
    k, n = bib.get("balls", 0), bib.get("bins", 0)
    print(f"Balls in bins for this fabric: {k} flows leave the busiest leaf, hashed onto {n} uplinks")
    print(f"  P(some uplink gets 2+ flows)     yours {_fmt(attempt(student.collision_probability, k, n)):>8}"
          f"   fabriclab {bib.get('prob_collision', float('nan')):.2f}")
    print(f"  flows on the busiest uplink (E)  yours {_fmt(attempt(student.expected_max_load, k, n)):>8}"
          f"   fabriclab {bib.get('expected_max_load', float('nan')):.2f} (Monte Carlo)")
    print()
    print(f"{'arm':<12} {'goodput':>10} {'max/mean':>9} {'(fabric)':>9} {'max/min':>9}  hot links (yours)")
    for arm in doc["arms"]:
        util = arm.get("link_utilisation") or {}
        if arm.get("error") or not util:
            print(f"{arm['name']:<12} no link data ({arm.get('error') or 'empty'})")
            continue
        mine = [_fmt(attempt(fn, util)) for fn in (student.max_over_mean, student.max_over_min, student.hot_links)]
        print(f"{arm['name']:<12} {arm['goodput_bps'] / 1e6:>5.2f} Mb/s {mine[0]:>9} {arm['link_imbalance']:>9.2f} "
              f"{mine[1]:>9}  {mine[2]}")
    return 0
