"""Lab 1 checker: ECMP hashing and hot links.

On a folder of code (the lab's starter/ or solution/, or your copy): hotlinks.py's functions against
fabriclab's own numbers: `experiments.analysis.hashing.balls_in_bins` for the collision probability and the
busiest uplink's expected load, and `experiments.analysis.links.summarise_links` (what fills results.json's
`link_utilisation`, `link_imbalance` and `hot_links`) on synthetic counters for the imbalance measures
and the hot links. Besides eight fixed cases of flows and uplinks and five fixed fabrics, it draws four
more and three more from the seed it prints, so answers copied for the fixed cases do not pass.

On a results directory of `fabriclab run ecmp-vs-spray`: the measured run shows what the lab is about,
judged with margins (never exact figures): spraying spreads the fabric's links evenly and carries at
least what ECMP does, ECMP leaves the links far more uneven.
"""

from __future__ import annotations

import math
from math import comb
from pathlib import Path
from typing import Any

from experiments.analysis.hashing import balls_in_bins
from experiments.analysis.links import LinkSummary, summarise_links
from experiments.scenarios import ecmp_vs_spray
from labs import grading
from labs.catalogue import LabError
from topologies import parse_spec

MODULE = "hotlinks.py"
EXPERIMENT = "ecmp-vs-spray"
# The experiment's own fabric: three hosts per leaf over two uplinks.
FABRIC = "leaf-spine:spines=2,leaves=2,hosts=3,host_rate=4,fabric_rate=6"
WINDOW_S = 10.0

# Thresholds for a measured run, with margin over what the default run gives on two cores (spray's
# max/mean 1.02 and max/min 1.04, 84 % of ideal; ECMP's max/min 1.3 even when the hash splits a leaf's
# three flows 2 + 1, and far more when it puts all three on one uplink).
SPRAY_MAX_OVER_MEAN = 1.2
SPRAY_OF_ECMP_MAX_OVER_MIN = 0.9
SPRAY_MIN_FRACTION = 0.6
SPRAY_OF_ECMP_GOODPUT = 0.95


def check(target: Path) -> list[grading.Check]:
    if grading.is_code_dir(target):
        return check_code(target)
    return check_results(grading.load_results(target, EXPERIMENT))


# ---- the student's code ---------------------------------------------------------------------------


def _samples(util: dict[str, float]) -> list[dict[str, Any]]:
    """Two `GET /links` readings WINDOW_S apart whose byte counts give each fabric link direction the
    utilisation in `util` ("leaf1->spine1": 0.9); host links carry 40 %."""
    topo = parse_spec(FABRIC)
    first, last = [], []
    for lk in topo.links:
        rate = lk.rate_mbps * 1e6
        ab = util.get(f"{lk.a}->{lk.b}", 0.4)
        ba = util.get(f"{lk.b}->{lk.a}", 0.4)
        first.append({"name": lk.name, "a": lk.a, "b": lk.b, "tx_bytes": 0, "rx_bytes": 0,
                      "tx_packets": 0, "rx_packets": 0})
        last.append({"name": lk.name, "a": lk.a, "b": lk.b, "tx_bytes": round(ab * rate * WINDOW_S / 8),
                     "rx_bytes": round(ba * rate * WINDOW_S / 8), "tx_packets": 1000, "rx_packets": 1000})
    return [{"t": 0.0, "links": first}, {"t": WINDOW_S, "links": last}]


UP = ("leaf1->spine1", "leaf1->spine2", "leaf2->spine1", "leaf2->spine2")
DOWN = ("spine1->leaf1", "spine2->leaf1", "spine1->leaf2", "spine2->leaf2")
# Fabric link directions as ECMP and spraying leave them (first 4: uplinks, then downlinks).
SCENARIOS = {
    "every flow hashed onto spine1": (0.89, 0.005, 0.89, 0.005, 0.89, 0.005, 0.89, 0.005),
    "a 2 + 1 split on each leaf": (0.92, 0.68, 0.68, 0.92, 0.92, 0.68, 0.68, 0.92),
    "sprayed evenly": (0.84, 0.86, 0.85, 0.86, 0.84, 0.86, 0.85, 0.86),
    "one hot uplink and an idle one": (0.95, 0.0, 0.5, 0.5, 0.6, 0.4, 0.5, 0.5),
    "a quiet fabric": (0.3, 0.0, 0.31, 0.2, 0.3, 0.25, 0.28, 0.2),
}


def _random_scenarios(count: int = 3) -> dict[str, tuple[float, ...]]:
    """Fabrics drawn from this run's seed: some directions idle, some hot, the rest anywhere."""
    rng = grading.case_rng("lab1 fabrics")
    out = {}
    for i in range(count):
        values = tuple(rng.choice((0.0, round(rng.uniform(0.76, 0.99), 3), round(rng.uniform(0.01, 0.7), 3)))
                       for _ in UP + DOWN)
        out[f"random fabric {i + 1} {values}"] = values
    return out


def _summaries() -> dict[str, LinkSummary]:
    topo = parse_spec(FABRIC)
    return {label: summarise_links(topo, _samples(dict(zip(UP + DOWN, values, strict=True))))
            for label, values in {**SCENARIOS, **_random_scenarios()}.items()}


def _random_flows_uplinks(fixed: list[tuple[int, int]], count: int = 4) -> list[tuple[int, int]]:
    """(flows, uplinks) drawn from this run's seed, few enough placements (uplinks**flows) to count."""
    rng = grading.case_rng("lab1 balls in bins")
    out: list[tuple[int, int]] = []
    while len(out) < count:
        k, n = rng.randint(1, 9), rng.randint(2, 16)
        if n**k <= 300_000 and (k, n) not in out and (k, n) not in fixed:
            out.append((k, n))
    return out


def exact_max_load(flows: int, uplinks: int) -> float:
    """E[busiest uplink's flows], exactly: the sum over m >= 1 of P(max >= m), counting placements with
    every uplink below m uplink by uplink (ways[j]: placements of j labelled flows so far)."""
    if flows <= 0 or uplinks <= 0:
        return 0.0
    expected = 0.0
    for m in range(1, flows + 1):
        ways = [1] + [0] * flows
        for _ in range(uplinks):
            ways = [sum(ways[j - i] * comb(j, i) for i in range(min(m - 1, j) + 1)) for j in range(flows + 1)]
        expected += 1.0 - ways[flows] / uplinks**flows
    return expected


def _key(util: dict[str, float]) -> tuple[tuple[str, float], ...]:
    return tuple(sorted(util.items()))


def _max_over_min(util: dict[str, float]) -> float | None:
    """max/min utilisation: infinity when a direction carried nothing, 0.0 when none did, None when
    there are no link data at all."""
    if not util:
        return None
    low, high = min(util.values()), max(util.values())
    if high == 0:
        return 0.0
    return high / low if low > 0 else math.inf


def check_code(folder: Path) -> list[grading.Check]:
    mod = grading.load_module(folder, MODULE)
    if isinstance(mod, grading.Check):
        return [mod]
    fixed = [(1, 4), (2, 2), (2, 4), (3, 2), (4, 4), (6, 2), (8, 4), (5, 16)]
    flows_uplinks = {f"(flows={k}, uplinks={n})": (k, n) for k, n in fixed + _random_flows_uplinks(fixed)}
    summaries = _summaries()
    util_cases = {label: (dict(s.utilisation),) for label, s in summaries.items()}
    # The reference is looked up by the utilisations it is given: they come from that summary.
    by_util = {_key(s.utilisation): s for s in summaries.values()}
    return [
        # An exact figure, compared to rounding: no sampling noise to allow for.
        grading.agrees("collision probability", mod, "collision_probability", flows_uplinks,
                       lambda k, n: balls_in_bins(k, n, trials=1)["prob_collision"], rel=1e-9,
                       what="fabriclab's balls_in_bins (exact)"),
        # 3 %: the starter allows a Monte Carlo of 20 000 throws, which lands within 1 %.
        grading.agrees("busiest uplink", mod, "expected_max_load", flows_uplinks, exact_max_load, rel=0.03,
                       what="the exact expectation (counting every placement)"),
        grading.agrees("link imbalance (max/mean)", mod, "max_over_mean", util_cases,
                       lambda util: by_util[_key(util)].link_imbalance, rel=0.01,
                       what="the link_imbalance fabriclab computes from the same counters"),
        grading.agrees("max/min", mod, "max_over_min", util_cases, _max_over_min, rel=0.01,
                       what="max/min of the same utilisations"),
        grading.agrees("hot links", mod, "hot_links", util_cases, lambda util: by_util[_key(util)].hot_links,
                       what="the hot_links fabriclab finds in the same counters"),
    ]


# ---- a measured run -------------------------------------------------------------------------------


def check_results(doc: dict[str, Any]) -> list[grading.Check]:
    ecmp, spray = grading.arm(doc, ecmp_vs_spray.ECMP_SINGLE), grading.arm(doc, ecmp_vs_spray.SPRAY)
    e_mm = _max_over_min(ecmp.get("link_utilisation") or {})
    s_mm = _max_over_min(spray.get("link_utilisation") or {})
    if e_mm is None or s_mm is None:
        raise LabError("this run has no link utilisation (no controller counters were sampled); re-run the "
                       "experiment")
    return [
        grading.at_most("spraying is even", spray["link_imbalance"], SPRAY_MAX_OVER_MEAN,
                        "spray's link imbalance (max/mean)"),
        grading.at_most("spraying is more even than ECMP", s_mm, SPRAY_OF_ECMP_MAX_OVER_MIN * e_mm,
                        f"spray's max/min link utilisation (ECMP's is {e_mm:.3g}; bound 0.9x it)"),
        grading.at_least("spraying fills the fabric", spray["goodput_fraction"], SPRAY_MIN_FRACTION,
                         "spray's goodput as a fraction of ideal"),
        grading.at_least("spraying carries at least what ECMP does", spray["goodput_bps"] / 1e6,
                         SPRAY_OF_ECMP_GOODPUT * ecmp["goodput_bps"] / 1e6,
                         f"spray's goodput in Mb/s (ECMP's is {ecmp['goodput_bps'] / 1e6:.3g}; bound 0.95x it)"),
        grading.holds("no hot link under spraying", not spray["hot_links"], "spray left no link direction hot",
                      f"spray left hot links: {', '.join(spray['hot_links'])}"),
    ]
