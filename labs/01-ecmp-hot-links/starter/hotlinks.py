"""Lab 1, ECMP hashing and hot links: your code. Write the five functions marked TODO.

How often hashed flows collide and how loaded the busiest uplink gets (balls in bins), and how uneven
a measured fabric is (max/mean, max/min, hot links) from the per-link utilisation in results.json.
Run this file on a results directory of `fabriclab run ecmp-vs-spray` to see your functions applied
to a measured run, and grade them with `fabriclab lab check 1 lab1`:

    python lab1/hotlinks.py results/lab1
"""

from __future__ import annotations

import sys

# A link direction is hot when it runs at least this full ...
HOT_UTIL = 0.75
# ... and at least this many times the mean utilisation of the fabric's link directions.
HOT_OVER_MEAN = 1.25


def collision_probability(flows: int, uplinks: int) -> float:
    """Probability that at least two of `flows` flows, each hashed onto one of `uplinks` uplinks
    uniformly at random, land on the same uplink (the birthday problem)."""
    # TODO: 1 minus the probability that every flow finds an uplink no earlier flow took.
    raise NotImplementedError("TODO: the birthday problem for flows on uplinks")


def expected_max_load(flows: int, uplinks: int) -> float:
    """Expected number of flows on the busiest uplink when `flows` flows are hashed onto `uplinks`
    uplinks uniformly at random."""
    # TODO: exactly, by counting the uplinks**flows equally likely placements (fine up to a few
    # hundred thousand of them), or by Monte Carlo: throw the flows many times (20 000 throws land
    # within 1 %) and average the busiest uplink's count. random.randrange or numpy both do.
    raise NotImplementedError("TODO: the expected load of the busiest uplink")


def max_over_mean(utilisation: dict[str, float]) -> float:
    """The fabric's link imbalance: the busiest link direction's utilisation over the mean of all of
    them (1.0 = perfectly even). `utilisation` maps "leaf1->spine1" to a fraction of the link's rate."""
    # TODO: the mean is over every link direction, idle ones included: an idle uplink is exactly
    # what ECMP wastes. Return 0.0 when nothing carried anything.
    raise NotImplementedError("TODO: max / mean utilisation")


def max_over_min(utilisation: dict[str, float]) -> float:
    """The busiest link direction's utilisation over the idlest one's; infinity when one carried
    nothing at all."""
    # TODO: float("inf") when the idlest direction is exactly 0; 0.0 when nothing carried anything.
    raise NotImplementedError("TODO: max / min utilisation")


def hot_links(utilisation: dict[str, float]) -> list[str]:
    """Link directions at least HOT_UTIL full and at least HOT_OVER_MEAN times the mean, sorted."""
    # TODO: the same definition the fabric's own analysis and the live view use.
    raise NotImplementedError("TODO: the hot link directions")


if __name__ == "__main__":
    from labs.script import run

    sys.exit(run(1, sys.modules[__name__], sys.argv[1:]))
