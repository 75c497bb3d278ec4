"""Recovering ECMP's actual placement from link counters, and the fair rates it allowed."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.analysis.actual_placement import (
    equal_cost_paths,
    infer_placement,
    placement_fair_rates,
)
from experiments.analysis.links import fabric_hops, hop_label
from experiments.analysis.placement import derangement_across
from topologies import parse_spec


def _loads(topo, paths, sizes):
    fabric = fabric_hops(topo)
    load: dict[str, float] = {}
    for path, size in zip(paths, sizes, strict=True):
        for h in path:
            if h[0] in fabric:
                load[hop_label(h)] = load.get(hop_label(h), 0.0) + size
    return load


def test_paths_of_a_leaf_spine_go_over_each_spine():
    topo = parse_spec("leaf-spine:spines=3,leaves=2,hosts=1")
    paths = equal_cost_paths(topo, "h1", "h2")
    assert len(paths) == 3
    assert {p[1][1] for p in paths} == {"leaf1"} and len({p[2][1] for p in paths}) == 3


@settings(max_examples=60, deadline=None)
@given(spec=st.sampled_from(["leaf-spine:spines=2,leaves=2,hosts=3", "leaf-spine:spines=4,leaves=4,hosts=4",
                             "fat-tree:k=4"]),
       seed=st.integers(0, 10_000))
def test_the_placement_that_made_the_counters_is_found(spec, seed):
    topo = parse_spec(spec)
    pairs = derangement_across(topo, seed)
    rng = random.Random(seed)
    true = [rng.choice(equal_cost_paths(topo, s, d)) for s, d in pairs]
    sizes = [rng.choice([1.0, 2.0, 3.0]) * 1e6 for _ in pairs]
    observed = {k: v * 0.37 for k, v in _loads(topo, true, sizes).items()}  # any scale: rates, utilisation
    found = infer_placement(topo, pairs, sizes, observed)
    assert found.residual < 1e-9
    assert _loads(topo, found.paths, sizes) == _loads(topo, true, sizes)


def test_fair_rates_of_a_collision():
    topo = parse_spec("leaf-spine:spines=2,leaves=2,hosts=2,rate=10")
    pairs = [("h1", "h3"), ("h2", "h4")]
    both_spine1 = [equal_cost_paths(topo, s, d)[0] for s, d in pairs]
    observed = _loads(topo, both_spine1, [1.0, 1.0])
    placement = infer_placement(topo, pairs, [1.0, 1.0], observed)
    assert [round(r / 1e6, 6) for r in placement_fair_rates(topo, placement)] == [5.0, 5.0]
    apart = [equal_cost_paths(topo, "h1", "h3")[0], equal_cost_paths(topo, "h2", "h4")[1]]
    placement = infer_placement(topo, pairs, [1.0, 1.0], _loads(topo, apart, [1.0, 1.0]))
    assert [round(r / 1e6, 6) for r in placement_fair_rates(topo, placement)] == [10.0, 10.0]
