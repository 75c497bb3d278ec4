"""Flat ring against hierarchical all-reduce: the ranks, the collective each arm runs, and the link
rate each bound is computed at (the fabric's bottleneck for the transfers that run at once)."""

from __future__ import annotations

import pytest

from experiments.arms.allreduce import _across_groups, _group_ring, _ring_edges, bottleneck_mbps
from experiments.scenarios import hierarchical
from topologies import parse_spec


def test_arms_run_the_plan_collectives_over_both_servers():
    exp = hierarchical.build()
    by = {a.name: a.workload for a in exp.arms}
    assert by["flat-ring"].collective == "all-reduce" and by["hierarchical"].collective == "hierarchical"
    assert by["hierarchical"].group == 4 and len(by["flat-ring"].pairs) == 8


def test_bounds_use_the_rate_the_transfers_get():
    topo = parse_spec(hierarchical.build().topology)  # GPU links 25 Mb/s, one 5 Mb/s NIC per server
    ranks = [f"s{s}g{g}" for s in (1, 2) for g in (1, 2, 3, 4)]
    # The flat ring: one edge each way crosses each NIC, so every edge gets the NIC's 5 Mb/s.
    assert bottleneck_mbps(topo, _ring_edges(ranks)) == pytest.approx(5.0)
    # The hierarchical outer level: four shard rings share each NIC; the inner level runs at the GPU links.
    assert bottleneck_mbps(topo, _across_groups(ranks, 4)) == pytest.approx(1.25)
    assert bottleneck_mbps(topo, _group_ring(ranks, 4)) == pytest.approx(25.0)
