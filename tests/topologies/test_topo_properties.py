"""Property tests over builder parameters: always valid, unique addresses, connected, ECMP width."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from topologies import (
    Topology,
    clos,
    dump,
    equal_cost_paths,
    fat_tree,
    in_server,
    leaf_spine,
    load_json,
    next_hops,
    path_count,
    shortest_path_length,
    validate,
)

SETTINGS = settings(max_examples=40, deadline=None)


def _unique_addresses(topo: Topology) -> None:
    hosts, switches = topo.hosts, topo.switches
    assert len({h.address for h in hosts}) == len(hosts)
    assert len({h.mac for h in hosts}) == len(hosts)
    assert len({s.dpid for s in switches}) == len(switches)
    ports = [(lk.a, lk.a_port) for lk in topo.links] + [(lk.b, lk.b_port) for lk in topo.links]
    assert len(set(ports)) == len(ports)


@SETTINGS
@given(
    spines=st.integers(1, 6),
    leaves=st.integers(1, 6),
    hosts=st.integers(1, 4),
    host_rate=st.floats(0.5, 1000),
    fabric_rate=st.none() | st.floats(0.5, 1000),
)
def test_leaf_spine_properties(
    spines: int, leaves: int, hosts: int, host_rate: float, fabric_rate: float | None
) -> None:
    topo = leaf_spine(spines, leaves, hosts, host_rate=host_rate, fabric_rate=fabric_rate)
    assert validate(topo) is topo
    assert len(topo.hosts) == leaves * hosts
    assert len(topo.links) == leaves * hosts + leaves * spines
    _unique_addresses(topo)
    assert Topology.from_dict(topo.to_dict()) == topo
    names = [h.name for h in topo.hosts]
    # Sample pairs so large fabrics stay quick; every host is in at least one pair.
    pairs = list(zip(names, names[1:] + names[:1], strict=True)) + list(
        itertools.islice(itertools.combinations(names, 2), 30)
    )
    for a, b in pairs:
        paths = equal_cost_paths(topo, a, b)
        same_leaf = topo.node(a).labels == topo.node(b).labels
        if a == b:
            assert paths == [[a]]
        elif same_leaf:
            assert len(paths) == 1 and shortest_path_length(topo, a, b) == 2
        else:
            assert len(paths) == spines == path_count(topo, a, b)
            assert shortest_path_length(topo, a, b) == 4
            leaf = topo.host_switch(a)[0]
            assert len(next_hops(topo, leaf, b)) == spines


@SETTINGS
@given(servers=st.integers(1, 5), gpus=st.integers(1, 8), nics=st.integers(1, 3))
def test_in_server_properties(servers: int, gpus: int, nics: int) -> None:
    topo = in_server(servers, gpus, nics_per_server=nics)
    assert validate(topo) is topo
    assert len(topo.hosts) == servers * gpus
    _unique_addresses(topo)
    for a, b in itertools.combinations([h.name for h in topo.hosts], 2):
        paths = equal_cost_paths(topo, a, b)
        assert len(paths) == 1
        if topo.node(a).labels == topo.node(b).labels:
            assert len(paths[0]) == 3
        else:
            assert paths[0][2] == "tor1"
            assert path_count(topo, a, b) == nics * nics


@SETTINGS
@given(
    pods=st.integers(1, 3),
    leaves=st.integers(1, 3),
    spines=st.integers(1, 3),
    per_plane=st.integers(1, 3),
    hosts=st.integers(1, 2),
)
def test_clos_properties(pods: int, leaves: int, spines: int, per_plane: int, hosts: int) -> None:
    topo = clos(pods, leaves, spines, spines * per_plane, hosts)
    assert validate(topo) is topo
    assert len(topo.hosts) == pods * leaves * hosts
    assert len(topo.links) == len(topo.hosts) + pods * leaves * spines + pods * spines * per_plane
    _unique_addresses(topo)
    assert Topology.from_dict(topo.to_dict()) == topo
    names = [h.name for h in topo.hosts]
    for a, b in itertools.islice(itertools.combinations(names, 2), 40):
        la, lb = topo.node(a).labels, topo.node(b).labels
        if la == lb:
            expected, hops = 1, 2
        elif la["pod"] == lb["pod"]:
            expected, hops = spines, 4
        else:
            expected, hops = spines * per_plane, 6
        assert len(equal_cost_paths(topo, a, b)) == expected == path_count(topo, a, b)
        assert shortest_path_length(topo, a, b) == hops


@settings(max_examples=4, deadline=None)
@given(k=st.sampled_from([2, 4, 6, 8]))
def test_fat_tree_properties(k: int) -> None:
    topo = fat_tree(k)
    half = k // 2
    assert validate(topo) is topo
    _unique_addresses(topo)
    first, last = topo.hosts[0].name, topo.hosts[-1].name
    assert path_count(topo, first, last) == half * half
    leaf = topo.host_switch(first)[0]
    assert len(next_hops(topo, leaf, last)) == half


@settings(max_examples=15, deadline=None)
@given(
    spines=st.integers(1, 4),
    leaves=st.integers(1, 4),
    hosts=st.integers(1, 3),
    delay=st.floats(0, 50),
    loss=st.floats(0, 99.9),
    queue=st.none() | st.integers(1, 10_000),
)
def test_dump_load_round_trip(
    tmp_path_factory, spines: int, leaves: int, hosts: int, delay: float, loss: float, queue: int | None
) -> None:
    topo = leaf_spine(spines, leaves, hosts, delay_ms=delay, loss_pct=loss, queue_packets=queue)
    path = dump(topo, tmp_path_factory.mktemp("rt") / "t.json")
    back = load_json(path)
    assert back == topo
    assert back.links == topo.links
