"""Equal-cost paths, next hops around failures, and the routing table the controller builds on."""

from __future__ import annotations

import time

import pytest

from topologies import (
    Link,
    Node,
    Topology,
    clos,
    equal_cost_paths,
    fat_tree,
    in_server,
    leaf_spine,
    link_at,
    next_hops,
    path_count,
    paths,
    routing_table,
    shortest_path_length,
    spines_on_paths,
    validate,
)
from topologies.paths import distances, nodes_on_paths


def test_two_by_two() -> None:
    topo = leaf_spine(spines=2, leaves=2, hosts_per_leaf=2)
    assert equal_cost_paths(topo, "h1", "h3") == [
        ["h1", "leaf1", "spine1", "leaf2", "h3"],
        ["h1", "leaf1", "spine2", "leaf2", "h3"],
    ]
    assert equal_cost_paths(topo, "h1", "h2") == [["h1", "leaf1", "h2"]]
    assert shortest_path_length(topo, "h1", "h3") == 4
    assert shortest_path_length(topo, "h1", "h2") == 2
    assert equal_cost_paths(topo, "h1", "h1") == [["h1"]]


def test_four_by_four() -> None:
    topo = leaf_spine(spines=4, leaves=4, hosts_per_leaf=2)
    paths = equal_cost_paths(topo, "h1", "h8")
    assert len(paths) == 4
    assert [p[2] for p in paths] == ["spine1", "spine2", "spine3", "spine4"]
    assert spines_on_paths(topo, "h1", "h8") == ["spine1", "spine2", "spine3", "spine4"]
    assert spines_on_paths(topo, "h1", "h2") == []
    # Between switches too.
    assert len(equal_cost_paths(topo, "leaf1", "leaf2")) == 4
    assert equal_cost_paths(topo, "spine1", "spine2") == [
        ["spine1", "leaf1", "spine2"],
        ["spine1", "leaf2", "spine2"],
        ["spine1", "leaf3", "spine2"],
        ["spine1", "leaf4", "spine2"],
    ]


def test_in_server_paths() -> None:
    topo = in_server(servers=2, gpus_per_server=4)
    assert equal_cost_paths(topo, "s1g1", "s1g4") == [["s1g1", "nv1", "s1g4"]]
    assert equal_cost_paths(topo, "s1g1", "s2g2") == [["s1g1", "nv1", "tor1", "nv2", "s2g2"]]
    assert nodes_on_paths(topo, "s1g1", "s2g2", role="tor") == ["tor1"]
    two_nics = in_server(servers=2, gpus_per_server=2, nics_per_server=2)
    # Parallel NIC links share a node path but are separate next hops and link-level paths.
    assert len(equal_cost_paths(two_nics, "s1g1", "s2g1")) == 1
    assert path_count(two_nics, "s1g1", "s2g1") == 4
    assert [lk.port("nv1") for lk in next_hops(two_nics, "nv1", "s2g1")] == [3, 4]


def test_fat_tree_paths_cross_every_core_between_pods() -> None:
    topo = fat_tree(k=4)
    # h1 (p1e1) to h16 (p4e2): 2 aggregation choices x 2 core choices, one path per core.
    paths = equal_cost_paths(topo, "h1", "h16")
    assert paths == [
        ["h1", "p1e1", "p1a1", "c1", "p4a1", "p4e2", "h16"],
        ["h1", "p1e1", "p1a1", "c2", "p4a1", "p4e2", "h16"],
        ["h1", "p1e1", "p1a2", "c3", "p4a2", "p4e2", "h16"],
        ["h1", "p1e1", "p1a2", "c4", "p4a2", "p4e2", "h16"],
    ]
    assert path_count(topo, "h1", "h16") == 4 and shortest_path_length(topo, "h1", "h16") == 6
    assert nodes_on_paths(topo, "h1", "h16", role="core") == ["c1", "c2", "c3", "c4"]
    assert nodes_on_paths(topo, "h1", "h16", role="agg") == ["p1a1", "p1a2", "p4a1", "p4a2"]
    # Within a pod the paths turn at the aggregation tier; on one edge switch there is one path.
    assert equal_cost_paths(topo, "h1", "h3") == [
        ["h1", "p1e1", "p1a1", "p1e2", "h3"],
        ["h1", "p1e1", "p1a2", "p1e2", "h3"],
    ]
    assert equal_cost_paths(topo, "h1", "h2") == [["h1", "p1e1", "h2"]]
    assert [lk.peer("p1e1") for lk in next_hops(topo, "p1e1", "h16")] == ["p1a1", "p1a2"]
    assert [lk.peer("p1a2") for lk in next_hops(topo, "p1a2", "h16")] == ["c3", "c4"]
    assert [lk.peer("c3") for lk in next_hops(topo, "c3", "h16")] == ["p4a2"]
    # Losing p4a2-c3 leaves three paths: c3 is no longer on a shortest path to pod 4.
    down = set(topo.links_between("p4a2", "c3"))
    assert [p[3] for p in equal_cost_paths(topo, "h1", "h16", down)] == ["c1", "c2", "c4"]


def test_clos_paths() -> None:
    topo = clos(pods=2, leaves=2, spines=2, superspines=6, hosts_per_leaf=1)
    assert path_count(topo, "h1", "h4") == 2 * 3
    assert nodes_on_paths(topo, "h1", "h4", role="superspine") == [f"ss{x}" for x in range(1, 7)]
    assert path_count(topo, "h1", "h2") == 2
    assert nodes_on_paths(topo, "h1", "h2", role="superspine") == []


def test_next_hops_and_down_links() -> None:
    topo = leaf_spine(spines=4, leaves=2, hosts_per_leaf=2)
    ups = next_hops(topo, "leaf1", "h3")
    assert [lk.port("leaf1") for lk in ups] == [3, 4, 5, 6]
    assert next_hops(topo, "leaf1", "h2") == [link_at(topo, "leaf1", 2)]
    assert next_hops(topo, "spine2", "h3") == [link_at(topo, "spine2", 2)]
    assert next_hops(topo, "h1", "h3") == [link_at(topo, "h1", 0)]
    assert next_hops(topo, "h3", "h3") == []

    # Leaf1's uplink to spine2 fails: leaf1 stops using it.
    down = {link_at(topo, "leaf1", 4)}
    assert [lk.port("leaf1") for lk in next_hops(topo, "leaf1", "h3", down)] == [3, 5, 6]
    assert len(equal_cost_paths(topo, "h1", "h3", down)) == 3
    # Spine2 to leaf2 fails: leaf1 avoids spine2 for h3 and spine2 detours through leaf1 (4 hops).
    down = frozenset({link_at(topo, "spine2", 2)})
    assert [lk.port("leaf1") for lk in next_hops(topo, "leaf1", "h3", down)] == [3, 5, 6]
    assert [lk.peer("spine2") for lk in next_hops(topo, "spine2", "h3", down)] == ["leaf1"]
    assert shortest_path_length(topo, "spine2", "h3", down) == 4
    # All uplinks of leaf1 down: h1 cannot reach h3 any more.
    down = frozenset(topo.links_between("leaf1", f"spine{j}")[0] for j in range(1, 5))
    assert next_hops(topo, "leaf1", "h3", down) == []
    assert equal_cost_paths(topo, "h1", "h3", down) == []
    assert shortest_path_length(topo, "h1", "h3", down) is None
    assert path_count(topo, "h1", "h3", down) == 0
    assert next_hops(topo, "leaf1", "h2", down) == [link_at(topo, "leaf1", 2)]


def test_paths_never_cross_hosts() -> None:
    # h2 is multi-homed to both switches; the only switch-only path from s1 to s2 is the direct link.
    nodes = (
        Node("s1", "switch", dpid=1),
        Node("s2", "switch", dpid=2),
        Node("h1", "host", ip="10.0.0.1/16", mac="02:00:00:00:00:01"),
        Node("h2", "host", ip="10.0.0.2/16", mac="02:00:00:00:00:02"),
        Node("h3", "host", ip="10.0.0.3/16", mac="02:00:00:00:00:03"),
    )
    links = (
        Link("h1", 0, "s1", 1, 10.0),
        Link("h2", 0, "s1", 2, 10.0),
        Link("h2", 1, "s2", 1, 10.0),
        Link("s1", 3, "s2", 2, 10.0),
        Link("h3", 0, "s2", 3, 10.0),
    )
    topo = validate(Topology("multi", nodes, links))
    assert equal_cost_paths(topo, "h1", "h3") == [["h1", "s1", "s2", "h3"]]
    assert equal_cost_paths(topo, "h2", "h3") == [["h2", "s2", "h3"]]
    assert next_hops(topo, "h2", "h1") == [link_at(topo, "h2", 0)]
    down = {link_at(topo, "s1", 3)}
    assert equal_cost_paths(topo, "h1", "h3", down) == []
    assert distances(topo, "h3", down).get("s1") is None


def test_routing_table_matches_next_hops() -> None:
    topo = leaf_spine(spines=3, leaves=3, hosts_per_leaf=2)
    down = {link_at(topo, "leaf2", 4)}
    table = routing_table(topo, down)
    assert set(table) == {s.name for s in topo.switches}
    for switch, routes in table.items():
        for host, links in routes.items():
            assert links == next_hops(topo, switch, host, down)


def test_unknown_node() -> None:
    topo = leaf_spine()
    with pytest.raises(KeyError):
        equal_cost_paths(topo, "nope", "h1")
    with pytest.raises(KeyError):
        next_hops(topo, "leaf1", "nope")
    with pytest.raises(KeyError, match="no link on leaf1 port 99"):
        link_at(topo, "leaf1", 99)


def test_fast_for_a_k8_fat_tree() -> None:
    topo = fat_tree(k=8)
    start = time.perf_counter()
    table = routing_table(topo)
    assert len(equal_cost_paths(topo, "h1", "h128")) == 16
    assert time.perf_counter() - start < 2.0
    assert len(table["p1e1"]["h128"]) == 4 and len(table["p1a1"]["h128"]) == 4 and len(table["c1"]["h128"]) == 1


def test_fast_for_a_hundred_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    # Fast because of how little it does: one breadth-first search per host (not one per switch and host,
    # nor per pair of hosts), then one look at a switch's ports per entry of the table. That is counted, so
    # it holds on any machine (~0.4 s here, ~2 s on a slow VM); the wall-clock bound only guards a hang.
    topo = leaf_spine(spines=16, leaves=84, hosts_per_leaf=4)
    searched: list[str] = []
    looked: list[tuple[str, str]] = []
    search, look = paths.distances, paths._steps

    def counted_search(topo: Topology, target: str, down_links=paths.NO_LINKS) -> dict[str, int]:
        searched.append(target)
        return search(topo, target, down_links)

    def counted_look(graph, here: str, dst: str, dist: dict[str, int], down) -> list[tuple[Link, str]]:
        looked.append((here, dst))
        return look(graph, here, dst, dist, down)

    monkeypatch.setattr(paths, "distances", counted_search)
    monkeypatch.setattr(paths, "_steps", counted_look)
    start = time.perf_counter()
    table = routing_table(topo)
    took = time.perf_counter() - start
    monkeypatch.undo()
    hosts, switches = [h.name for h in topo.hosts], [s.name for s in topo.switches]
    assert len(hosts) == 336 and len(switches) == 100
    assert sorted(searched) == sorted(hosts)  # each host's search once, and nothing else searched
    assert sorted(looked) == sorted((s, h) for s in switches for h in hosts)  # each entry's ports once
    assert len(equal_cost_paths(topo, "h1", f"h{84 * 4}")) == 16
    assert len(table["leaf1"]["h5"]) == 16
    assert took < 30.0, f"routing_table took {took:.1f} s"
