"""The simulated fabric's shapes and the rules of its model: hops, spines, host queues, impairments."""

from __future__ import annotations

import pytest

from transport.sim.fabric import HOST_QUEUE_PACKETS, Fabric, SwitchSpec, TwoLeafSpec, uniform
from transport.sim.simnet import WIRE_OVERHEAD, PathSpec

DATA = bytes(1000 - WIRE_OVERHEAD)  # 1000 bytes on the wire


def _hop(rate_bps: float, delay: float) -> float:
    return 1000 * 8 / rate_bps + delay


def test_two_leaf_packets_cross_two_hops_on_a_leaf_and_four_between_leaves() -> None:
    spec = TwoLeafSpec(hosts=4, spines=2, rate_bps=8e6, hop_delay=0.001)
    fabric = Fabric(spec, spec.hosts)
    same, across = fabric.pair(0, 2), fabric.pair(0, 1)
    same.send(0, DATA, 0, 0.0)
    across.send(0, DATA, 0, 0.0)
    hop = _hop(spec.rate_bps, spec.hop_delay)
    assert fabric.next_time() == pytest.approx(hop)  # both are on host 0's uplink: one after the other
    assert same.pop_due(2 * hop + 1e-9) == [(1, DATA)] and across.pop_due(2 * hop + 1e-9) == []
    # The second waited one serialisation behind the first on the uplink, then three more hops.
    t = 1000 * 8 / spec.rate_bps + 4 * hop
    assert across.pop_due(t - 1e-9) == [] and across.pop_due(t) == [(1, DATA)]


def test_two_leaf_ev_picks_the_spine_and_replies_come_back() -> None:
    spec = TwoLeafSpec(hosts=2, spines=4)
    fabric = Fabric(spec, spec.hosts)
    view = fabric.pair(0, 1)
    view.send(0, DATA, 6, 0.0)  # leaf 0 -> spine 6 % 4
    view.send(1, DATA, 3, 0.0)  # leaf 1 -> spine 3, back to host 0
    assert sorted(side for side, _ in view.pop_due(1.0)) == [0, 1]
    used = {(leaf, s) for leaf, row in enumerate(fabric.to_spine) for s, link in enumerate(row) if link.stats.sent}
    assert used == {(0, 6 % spec.spines), (1, 3)}


def test_a_host_holds_its_own_burst_and_the_switch_drops_an_incast() -> None:
    spec = TwoLeafSpec(hosts=5, spines=1, queue_packets=4)
    fabric = Fabric(spec, spec.hosts)
    burst = 3 * spec.queue_packets
    assert burst < HOST_QUEUE_PACKETS
    one = fabric.pair(1, 0)
    for _ in range(burst):
        one.send(0, DATA, 0, 0.0)
    assert len(one.pop_due(10.0)) == burst and fabric.drops() == 0
    assert fabric.ports["fabric"][1].up.stats.peak_queue == burst  # queued at the host, not dropped
    # Two hosts at line rate into one: the receiver's downlink (switch egress) fills and drops.
    views = [fabric.pair(h, 0) for h in (2, 4)]
    for _ in range(burst):
        for v in views:
            v.send(0, DATA, 0, 10.0)
    got = sum(len(v.pop_due(20.0)) for v in views)
    down = fabric.ports["fabric"][0].down.stats
    assert down.queue_drops > 0 and got == 2 * burst - fabric.drops()
    assert down.peak_queue == spec.queue_packets


def test_one_switch_groups_take_the_local_port_and_impairments_happen_once() -> None:
    spec = SwitchSpec(PathSpec(rate_bps=1e9, delay=0.002), PathSpec(rate_bps=4e9, delay=0.0001, loss=1.0), group=2)
    fabric = Fabric(spec, 4, seed=1)
    local, far = fabric.pair(0, 1), fabric.pair(0, 2)
    local.send(0, DATA, 0, 0.0)
    far.send(0, DATA, 0, 0.0)
    assert local.pop_due(1.0) == [] and far.pop_due(1.0) == [(1, DATA)]
    ports = fabric.port_stats(0)
    assert ports["local"]["up"]["lost"] == 1 and ports["fabric"]["up"]["sent"] == 1
    assert fabric.port_stats(1)["local"]["down"]["sent"] == 0  # the loss was the uplink's, not again here
    # Rank to rank takes the port's delay once: uplink delay and two serialisations.
    f2 = Fabric(uniform(8e6, delay=0.002), 2)
    view = f2.pair(0, 1)
    view.send(0, DATA, 0, 0.0)
    assert f2.next_time() == pytest.approx(_hop(8e6, 0.002))
    view.pop_due(f2.next_time() or 0.0)
    assert f2.next_time() == pytest.approx(_hop(8e6, 0.002) + 1000 * 8 / 8e6)


def test_shapes_refuse_fabrics_too_small() -> None:
    with pytest.raises(ValueError, match="2 hosts and 1 spine"):
        Fabric(TwoLeafSpec(hosts=1), 1)
    with pytest.raises(ValueError, match="2 hosts and 1 spine"):
        Fabric(TwoLeafSpec(spines=0), 16)
    with pytest.raises(ValueError, match="at least 1 host"):
        Fabric(uniform(1e9), 0)
