"""Builders: node and link counts, port wiring, the address plan and oversubscription."""

from __future__ import annotations

import pytest

from topologies import SpecError, in_server, leaf_spine, validate
from topologies.builders import MAX_HOSTS, assign_addresses, host_ip, host_mac
from topologies.model import Node


def test_leaf_spine_counts_and_names() -> None:
    topo = leaf_spine(spines=3, leaves=4, hosts_per_leaf=2)
    assert [n.name for n in topo.by_role("spine")] == ["spine1", "spine2", "spine3"]
    assert [n.name for n in topo.by_role("leaf")] == ["leaf1", "leaf2", "leaf3", "leaf4"]
    assert [n.name for n in topo.hosts] == [f"h{i}" for i in range(1, 9)]
    assert len(topo.links) == 8 + 3 * 4
    assert topo.node("h3").labels == {"leaf": "leaf2"}
    assert topo.name == "leaf-spine-3x4x2"


def test_leaf_spine_ports() -> None:
    topo = leaf_spine(spines=2, leaves=3, hosts_per_leaf=2)
    # Host side is port 0, leaf K host ports 1..H.
    assert topo.host_switch("h1") == ("leaf1", 1)
    assert topo.host_switch("h2") == ("leaf1", 2)
    assert topo.host_switch("h5") == ("leaf3", 1)
    assert topo.links_of("h5")[0].intf("h5") == "h5-eth0"
    # Uplink to spine j is port H+j on the leaf; spine j reaches leaf K on port K.
    (up,) = topo.links_between("leaf3", "spine2")
    assert up.port("leaf3") == 4
    assert up.port("spine2") == 3
    assert up.intf("leaf3") == "leaf3-eth4"


def test_leaf_spine_rates_and_oversubscription() -> None:
    topo = leaf_spine(spines=2, leaves=2, hosts_per_leaf=4, host_rate=10, fabric_rate=10)
    assert topo.params["oversubscription"] == pytest.approx(2.0)
    assert {lk.rate_mbps for lk in topo.links_of("h1")} == {10.0}
    topo = leaf_spine(spines=4, hosts_per_leaf=2, host_rate=20)
    assert topo.params["fabric_rate"] == 20.0
    assert topo.params["oversubscription"] == pytest.approx(0.5)


def test_leaf_spine_impairments_on_every_link() -> None:
    topo = leaf_spine(delay_ms=1.5, loss_pct=2, queue_packets=50)
    assert all((lk.delay_ms, lk.loss_pct, lk.queue_packets) == (1.5, 2.0, 50) for lk in topo.links)


def test_addresses_follow_the_plan() -> None:
    topo = leaf_spine(spines=2, leaves=2, hosts_per_leaf=2)
    assert [n.dpid for n in topo.switches] == [1, 2, 3, 4]
    h1 = topo.node("h1")
    assert (h1.ip, h1.mac) == ("10.0.0.1/16", "02:00:00:00:00:01")
    assert host_ip(256) == "10.0.1.0/16"
    assert host_mac(300) == "02:00:00:00:01:2c"
    assert len({h.ip for h in topo.hosts}) == len(topo.hosts)
    assert len({h.mac for h in topo.hosts}) == len(topo.hosts)


def test_assign_addresses_keeps_explicit_values() -> None:
    nodes = assign_addresses([Node("s1", "switch", dpid=42), Node("a", "host", ip="10.0.9.9/16"), Node("b", "host")])
    assert nodes[0].dpid == 42
    assert nodes[1].ip == "10.0.9.9/16"
    assert nodes[1].mac == "02:00:00:00:00:01"
    assert nodes[2].ip == "10.0.0.2/16"


def test_address_plan_limit() -> None:
    with pytest.raises(SpecError, match="address plan"):
        leaf_spine(leaves=2, hosts_per_leaf=MAX_HOSTS)


def test_in_server_counts_ports_and_roles() -> None:
    topo = in_server(servers=2, gpus_per_server=4, nics_per_server=2)
    assert [n.name for n in topo.switches] == ["tor1", "nv1", "nv2"]
    assert [n.role for n in topo.switches] == ["tor", "local", "local"]
    assert [n.name for n in topo.hosts][:4] == ["s1g1", "s1g2", "s1g3", "s1g4"]
    assert all(h.role == "gpu" for h in topo.hosts)
    assert topo.node("s2g3").labels == {"server": "s2"}
    assert topo.host_switch("s2g3") == ("nv2", 3)
    nics = topo.links_between("nv2", "tor1")
    assert [(lk.port("nv2"), lk.port("tor1")) for lk in nics] == [(5, 3), (6, 4)]
    assert len(topo.links) == 8 + 4


def test_in_server_defaults_local_fabric_faster_than_nic() -> None:
    topo = in_server()
    assert len(topo.hosts) == 16
    gpu_link = topo.links_of("s1g1")[0]
    (nic,) = topo.links_between("nv1", "tor1")
    assert gpu_link.rate_mbps > nic.rate_mbps
    assert topo.params["oversubscription"] == pytest.approx(8 * 100 / 20)


def test_builders_return_valid_topologies() -> None:
    assert validate(leaf_spine()) is not None
    assert validate(in_server(servers=1, gpus_per_server=1)) is not None


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"spines": 0}, "spines=0 must be >= 1"),
        ({"hosts_per_leaf": 1.5}, "hosts_per_leaf=1.5 is not a whole number"),
        ({"host_rate": -5}, "host_rate=-5 must be > 0"),
        ({"loss_pct": 100}, "loss_pct=100 must be in [0, 100)"),
        ({"delay_ms": -1}, "delay_ms=-1 must be >= 0"),
        ({"queue_packets": 0}, "queue_packets=0 must be >= 1"),
        ({"spines": 100, "leaves": 10000, "hosts_per_leaf": 1}, "is too long"),
    ],
)
def test_leaf_spine_rejects_bad_arguments(kwargs: dict, fragment: str) -> None:
    with pytest.raises(SpecError) as err:
        leaf_spine(**kwargs)
    assert fragment in str(err.value)
