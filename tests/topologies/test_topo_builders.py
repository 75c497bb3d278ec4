"""Builders: node and link counts, port wiring, the address plan and oversubscription."""

from __future__ import annotations

import pytest

from topologies import SpecError, clos, fat_tree, in_server, leaf_spine, validate
from topologies.builders import MAX_HOSTS, assign_addresses, host_ip, host_mac
from topologies.model import DEFAULT_MTU, Node
from topologies.validate import MAX_IFNAME


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


# -- three tiers --------------------------------------------------------------------------------------------
def test_fat_tree_counts_names_and_roles() -> None:
    topo = fat_tree(k=4)
    assert topo.name == "fat-tree-k4"
    tiers = topo.tiers()
    assert list(tiers) == ["core", "agg", "edge"]
    assert [n.name for n in tiers["core"]] == ["c1", "c2", "c3", "c4"]
    assert [n.name for n in tiers["agg"]] == ["p1a1", "p1a2", "p2a1", "p2a2", "p3a1", "p3a2", "p4a1", "p4a2"]
    assert [n.name for n in tiers["edge"]][:3] == ["p1e1", "p1e2", "p2e1"]
    assert [n.name for n in topo.hosts] == [f"h{i}" for i in range(1, 17)]
    assert [n.tier for n in (topo.node("c1"), topo.node("p1a1"), topo.node("p1e1"), topo.node("h1"))] == [4, 3, 2, 0]
    # k^3/4 hosts; k*k/2 edge-agg links and as many agg-core links.
    assert len(topo.links) == 16 + 16 + 16
    assert topo.node("h3").labels == {"edge": "p1e2", "pod": "p1"}
    assert topo.node("p3a2").labels == {"pod": "p3"}
    assert topo.node("c3").labels == {"plane": "2"}
    assert [n.dpid for n in topo.switches] == list(range(1, 21))


def test_fat_tree_ports_and_planes() -> None:
    topo = fat_tree(k=4)
    # A host uses port 0; edge e has host ports 1..k/2 and reaches agg a on port k/2 + a.
    assert topo.host_switch("h5") == ("p2e1", 1)
    (up,) = topo.links_between("p2e1", "p2a2")
    assert (up.port("p2e1"), up.port("p2a2")) == (4, 1)
    # Agg a links to the a-th group of k/2 cores (plane a) on ports k/2 + m; core x reaches pod p on port p.
    cores = sorted(lk.peer("p2a2") for lk in topo.links_of("p2a2") if topo.node(lk.peer("p2a2")).role == "core")
    assert cores == ["c3", "c4"]
    (top,) = topo.links_between("p2a2", "c4")
    assert (top.port("p2a2"), top.port("c4")) == (4, 2)
    assert all(len(topo.links_of(f"c{x}")) == 4 for x in range(1, 5))


def test_fat_tree_rates_and_oversubscription() -> None:
    topo = fat_tree(k=4, host_rate=10, agg_rate=10, core_rate=5)
    assert {lk.rate_mbps for lk in topo.links_of("c1")} == {5.0}
    assert {lk.rate_mbps for lk in topo.links_between("p1e1", "p1a1")} == {10.0}
    assert topo.params["oversubscription"] == pytest.approx(1.0)
    assert topo.params["agg_oversubscription"] == pytest.approx(2.0)
    assert fat_tree(k=2).params["k"] == 2 and len(fat_tree(k=2).hosts) == 2


@pytest.mark.parametrize("k", [2, 4, 6, 8, 10])
def test_fat_tree_sizes_and_interface_names(k: int) -> None:
    topo = fat_tree(k=k)
    half = k // 2
    assert len(topo.hosts) == k**3 // 4
    assert len(topo.by_role("core")) == half * half
    assert len(topo.by_role("agg")) == len(topo.by_role("edge")) == k * half
    assert max(len(lk.intf(end)) for lk in topo.links for end in (lk.a, lk.b)) <= MAX_IFNAME


def test_clos_counts_wiring_and_rates() -> None:
    topo = clos(
        pods=3, leaves=2, spines=2, superspines=6, hosts_per_leaf=2, host_rate=10, spine_rate=20, superspine_rate=40
    )
    assert topo.name == "clos-3x2x2x6x2"
    assert list(topo.tiers()) == ["superspine", "spine", "leaf"]
    assert [n.name for n in topo.by_role("superspine")] == [f"ss{x}" for x in range(1, 7)]
    assert [n.name for n in topo.by_role("spine")][:3] == ["p1s1", "p1s2", "p2s1"]
    assert [n.name for n in topo.by_role("leaf")][:3] == ["p1l1", "p1l2", "p2l1"]
    assert len(topo.hosts) == 12
    assert topo.node("h12").labels == {"leaf": "p3l2", "pod": "p3"}
    # Spine j of every pod links to plane j: superspines/spines super-spines.
    up = sorted(lk.peer("p2s2") for lk in topo.links_of("p2s2") if lk.peer("p2s2").startswith("ss"))
    assert up == ["ss4", "ss5", "ss6"]
    assert {lk.rate_mbps for lk in topo.links_of("ss1")} == {40.0}
    assert {lk.rate_mbps for lk in topo.links_between("p1l1", "p1s1")} == {20.0}
    assert topo.params["oversubscription"] == pytest.approx(2 * 10 / (2 * 20))
    assert topo.params["spine_oversubscription"] == pytest.approx(2 * 20 / (3 * 40))
    assert clos() == clos(2, 2, 2, 4, 2)


@pytest.mark.parametrize(
    ("builder", "kwargs", "fragment"),
    [
        (fat_tree, {"k": 3}, "k=3 must be even"),
        (fat_tree, {"k": 0}, "k=0 must be >= 1"),
        (fat_tree, {"core_rate": 0}, "core_rate=0 must be > 0"),
        (fat_tree, {"k": 64}, "65536 hosts do not fit the address plan"),
        (clos, {"spines": 2, "superspines": 3}, "superspines=3 must be a multiple of spines=2"),
        (clos, {"pods": 0}, "pods=0 must be >= 1"),
        (clos, {"pods": 1, "leaves": 1, "spines": 1, "superspines": 10**7}, "node name 'p1s1' is too long"),
        (leaf_spine, {"mtu": 9217}, "mtu=9217 must be in [576, 9216] bytes"),
        (in_server, {"mtu": 575}, "mtu=575 must be in [576, 9216] bytes"),
        (clos, {"mtu": 1500.5}, "mtu=1500.5 is not a whole number"),
    ],
)
def test_builders_reject_bad_arguments(builder, kwargs: dict, fragment: str) -> None:
    with pytest.raises(SpecError) as err:
        builder(**kwargs)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_every_builder_carries_an_mtu() -> None:
    for build in (leaf_spine, in_server, fat_tree, clos):
        assert build().mtu == DEFAULT_MTU == 9000  # jumbo frames, as AI fabrics run them
        assert build(mtu=1500).mtu == 1500
        assert build(mtu=1500) != build()
