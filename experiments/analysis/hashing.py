"""Balls in bins: what ECMP hashing is expected to do to a set of flows, by Monte Carlo over hash
placements (goodput, busiest link, collisions) and by the textbook count of flows over uplinks."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from experiments.analysis.links import fabric_hops
from experiments.analysis.placement import Hop, capacities, ideal_bps, max_min_rates, path_weights
from topologies import Topology, next_hops
from transport.core.metrics import percentile


@dataclass
class EcmpExpectation:
    """Monte Carlo expectation of ECMP hashing for a set of flows on a topology."""

    trials: int
    expected_goodput_bps: float
    goodput_p10_bps: float
    goodput_p90_bps: float
    ideal_bps: float
    expected_fraction: float
    expected_max_load: float  # flows on the busiest fabric link direction
    expected_colliding_flows: float  # flows sharing a fabric link direction with another flow
    prob_any_collision: float
    balls_in_bins: dict[str, float] = field(default_factory=dict)
    busiest_switch: str | None = None  # the switch whose leaving flows balls_in_bins counts

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def balls_in_bins(balls: int, bins: int, trials: int = 20_000, seed: int = 0) -> dict[str, float]:
    """F balls thrown into S bins uniformly: expected max load, expected balls that share a bin,
    and the probability of at least one collision (exact: 1 - S!/(S-F)!/S^F)."""
    if balls <= 0 or bins <= 0:
        return {"balls": balls, "bins": bins, "expected_max_load": 0.0, "expected_colliding": 0.0,
                "prob_collision": 0.0}
    rng = np.random.default_rng(seed)
    throws = rng.integers(0, bins, size=(trials, balls))
    counts = np.zeros((trials, bins), dtype=np.int64)
    np.add.at(counts, (np.arange(trials)[:, None], throws), 1)
    max_load = counts.max(axis=1).mean()
    colliding = np.where(counts > 1, counts, 0).sum(axis=1).mean()
    no_collision = math.prod((bins - i) / bins for i in range(balls)) if balls <= bins else 0.0
    # Expected balls alone in their bin, exactly: F * ((S-1)/S)^(F-1).
    exact_colliding = balls - balls * ((bins - 1) / bins) ** (balls - 1)
    return {
        "balls": balls,
        "bins": bins,
        "expected_max_load": float(max_load),
        "expected_colliding": float(exact_colliding),
        "expected_colliding_mc": float(colliding),
        "prob_collision": float(1.0 - no_collision),
    }


# The Monte Carlo's budget in flow draws: 2,000 trials of the 16-host demo's flows. A 1,024-flow
# permutation on a k=16 fat-tree draws 31 trials in the same budget (2,000 took most of an hour).
DRAW_BUDGET = 32_000
MIN_TRIALS = 20


def default_trials(flows: int) -> int:
    """Trials for `flows` flows: 2,000, fewer once that would pass DRAW_BUDGET draws, never under MIN_TRIALS."""
    return max(MIN_TRIALS, min(2000, DRAW_BUDGET // max(1, flows)))


def ecmp_expectation(topo: Topology, pairs: Sequence[tuple[str, str]], trials: int | None = None,
                     seed: int = 0) -> EcmpExpectation:
    """Expected goodput, max load and collisions when each flow is hashed onto one path at random
    (`trials` draws of every flow's path; default_trials by default)."""
    if trials is None:
        trials = default_trials(len(pairs))
    rng = random.Random(seed)
    caps = capacities(topo)
    fabric = fabric_hops(topo)
    goodputs, max_loads, colliding = [], [], []
    for _ in range(trials):
        flows = [path_weights(topo, s, d, spray=False, rng=rng) for s, d in pairs]
        goodputs.append(sum(max_min_rates(flows, caps)))
        per_hop: dict[Hop, int] = {}
        for f in flows:
            for hop in f:
                if hop[0] in fabric:
                    per_hop[hop] = per_hop.get(hop, 0) + 1
        max_loads.append(max(per_hop.values(), default=0))
        colliding.append(sum(1 for f in flows if any(per_hop.get(h, 0) > 1 for h in f if h[0] in fabric)))
    ideal = ideal_bps(topo, pairs, caps)
    g = np.array(goodputs)
    busiest, leaving, uplinks = textbook_switch(topo, pairs)
    bib = balls_in_bins(leaving, uplinks, seed=seed)
    return EcmpExpectation(
        trials=trials,
        expected_goodput_bps=float(g.mean()) if g.size else 0.0,
        goodput_p10_bps=percentile(goodputs, 10) or 0.0,
        goodput_p90_bps=percentile(goodputs, 90) or 0.0,
        ideal_bps=ideal,
        expected_fraction=float(g.mean() / ideal) if ideal > 0 and g.size else 0.0,
        expected_max_load=float(np.mean(max_loads)) if max_loads else 0.0,
        expected_colliding_flows=float(np.mean(colliding)) if colliding else 0.0,
        prob_any_collision=float(np.mean([c > 0 for c in colliding])) if colliding else 0.0,
        balls_in_bins=bib,
        busiest_switch=busiest,
    )


def textbook_switch(topo: Topology, pairs: Sequence[tuple[str, str]]) -> tuple[str | None, int, int]:
    """The textbook view of hashing: the switch that most flows leave through its uplinks, how many
    leave it, and over how many uplinks they are hashed ((None, 0, 1) when every flow stays on its
    switch). A flow between two hosts of one switch never meets an uplink, so it counts for neither."""
    leaving: dict[str, int] = {}
    uplinks: dict[str, int] = {}
    for s, d in pairs:
        sw, _ = topo.host_switch(s)
        if topo.host_switch(d)[0] == sw:
            continue
        leaving[sw] = leaving.get(sw, 0) + 1
        uplinks[sw] = max(uplinks.get(sw, 0), len(next_hops(topo, sw, d)))
    if not leaving:
        return None, 0, 1
    busiest = max(leaving, key=lambda sw: leaving[sw])  # the first of the busiest, in flow order
    return busiest, leaving[busiest], max(1, uplinks[busiest])
