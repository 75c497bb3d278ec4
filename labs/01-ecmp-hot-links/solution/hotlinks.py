"""Lab 1, ECMP hashing and hot links: SOLUTION (the answer key; students start from starter/).

Five functions: how often hashed flows collide and how loaded the busiest uplink gets (balls in bins),
and how uneven a measured fabric is (max/mean, max/min, hot links) from the per-link utilisation in
results.json. Run this file on a results directory of `fabriclab run ecmp-vs-spray` to see them applied
to a measured run:

    python lab1/hotlinks.py results/lab1
"""

from __future__ import annotations

import math
import sys
from math import comb

# A link direction is hot when it runs at least this full ...
HOT_UTIL = 0.75
# ... and at least this many times the mean utilisation of the fabric's link directions.
HOT_OVER_MEAN = 1.25


def collision_probability(flows: int, uplinks: int) -> float:
    """Probability that at least two of `flows` flows, each hashed onto one of `uplinks` uplinks
    uniformly at random, land on the same uplink (the birthday problem)."""
    if flows > uplinks:
        return 1.0  # pigeonhole
    all_apart = 1.0
    for i in range(flows):
        all_apart *= (uplinks - i) / uplinks
    return 1.0 - all_apart


def expected_max_load(flows: int, uplinks: int) -> float:
    """Expected number of flows on the busiest uplink when `flows` flows are hashed onto `uplinks`
    uplinks uniformly at random.

    Exact: E[max] = sum over m >= 1 of P(max >= m) = sum of 1 - P(every uplink holds < m flows). The
    placements with every uplink holding at most c flows are counted uplink by uplink: ways[j] is the
    number of ways to put j of the (labelled) flows on the uplinks seen so far.
    """
    if flows <= 0 or uplinks <= 0:
        return 0.0
    total = uplinks**flows
    expected = 0.0
    for m in range(1, flows + 1):
        cap = m - 1
        ways = [1] + [0] * flows
        for _ in range(uplinks):
            ways = [sum(ways[j - i] * comb(j, i) for i in range(min(cap, j) + 1)) for j in range(flows + 1)]
        expected += 1.0 - ways[flows] / total
    return expected


def max_over_mean(utilisation: dict[str, float]) -> float:
    """The fabric's link imbalance: the busiest link direction's utilisation over the mean of all of
    them (1.0 = perfectly even). `utilisation` maps "leaf1->spine1" to a fraction of the link's rate."""
    values = list(utilisation.values())
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else 0.0


def max_over_min(utilisation: dict[str, float]) -> float:
    """The busiest link direction's utilisation over the idlest one's; infinity when one carried
    nothing at all."""
    values = list(utilisation.values())
    if not values or max(values) == 0:
        return 0.0
    low = min(values)
    return max(values) / low if low > 0 else math.inf


def hot_links(utilisation: dict[str, float]) -> list[str]:
    """Link directions at least HOT_UTIL full and at least HOT_OVER_MEAN times the mean, sorted."""
    values = list(utilisation.values())
    mean = sum(values) / len(values) if values else 0.0
    return sorted(name for name, u in utilisation.items() if u >= HOT_UTIL and u >= HOT_OVER_MEAN * mean)


if __name__ == "__main__":
    from labs.script import run

    sys.exit(run(1, sys.modules[__name__], sys.argv[1:]))
