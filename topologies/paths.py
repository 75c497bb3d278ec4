"""Equal-cost (shortest by hop count) paths and next hops, for ECMP groups and rerouting.

Hosts never forward: a path may start or end at a host but never passes through one, so a
multi-homed host is not mistaken for a switch. `down_links` is a collection of the topology's
`Link` objects that are out of service; paths and next hops avoid them. Everything is breadth-first
search over an adjacency list built once per topology, so a routing table for ~100 switches and a
few hundred hosts takes milliseconds; with every link up, each target's search is kept.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass

from topologies.model import Link, Topology

NO_LINKS: frozenset[Link] = frozenset()


@dataclass(frozen=True)
class _Graph:
    hosts: frozenset[str]
    # node -> [(link, peer)] in order of the node's port on the link, so results follow the wiring.
    adj: dict[str, list[tuple[Link, str]]]
    # (node, port) -> link
    ports: dict[tuple[str, int], Link]
    # target -> distances() with every link up: analyses ask it per flow and per hop, thousands of
    # times for the same targets (an ECMP expectation draws 2,000 placements of every flow).
    dist_all_up: dict[str, dict[str, int]]


# Keyed by id() because hashing a large frozen Topology on every call would cost more than the search.
_graphs: dict[int, tuple[weakref.ref[Topology], _Graph]] = {}


def _graph(topo: Topology) -> _Graph:
    key = id(topo)
    hit = _graphs.get(key)
    if hit is not None and hit[0]() is topo:
        return hit[1]
    adj: dict[str, list[tuple[Link, str]]] = {n.name: [] for n in topo.nodes}
    ports: dict[tuple[str, int], Link] = {}
    for lk in topo.links:
        adj.setdefault(lk.a, []).append((lk, lk.b))
        adj.setdefault(lk.b, []).append((lk, lk.a))
        ports[lk.a, lk.a_port] = lk
        ports[lk.b, lk.b_port] = lk
    for node, edges in adj.items():
        edges.sort(key=lambda edge, node=node: edge[0].port(node))
    graph = _Graph(frozenset(n.name for n in topo.nodes if n.is_host), adj, ports, {})
    _graphs[key] = (weakref.ref(topo, lambda _ref, key=key: _graphs.pop(key, None)), graph)
    return graph


def _as_set(down_links: Collection[Link]) -> Collection[Link]:
    return down_links if isinstance(down_links, set | frozenset) else frozenset(down_links)


def _check_node(graph: _Graph, name: str) -> None:
    if name not in graph.adj:
        raise KeyError(f"unknown node {name!r}")


def distances(topo: Topology, target: str, down_links: Collection[Link] = NO_LINKS) -> dict[str, int]:
    """Hop count from every node that can reach `target` (over up links, not through hosts).

    With every link up the result is kept per topology and shared between callers: do not change it.
    """
    graph = _graph(topo)
    down = _as_set(down_links)
    if not down:
        hit = graph.dist_all_up.get(target)
        if hit is not None:
            return hit
    _check_node(graph, target)
    dist = {target: 0}
    queue = deque([target])
    while queue:
        here = queue.popleft()
        if here != target and here in graph.hosts:
            continue
        for lk, peer in graph.adj[here]:
            if peer not in dist and (not down or lk not in down):
                dist[peer] = dist[here] + 1
                queue.append(peer)
    if not down:
        graph.dist_all_up[target] = dist
    return dist


def shortest_path_length(topo: Topology, src: str, dst: str, down_links: Collection[Link] = NO_LINKS) -> int | None:
    """Hops on a shortest path from `src` to `dst`, or None when no path is up."""
    _check_node(_graph(topo), src)
    return distances(topo, dst, down_links).get(src)


def _steps(graph: _Graph, here: str, dst: str, dist: dict[str, int], down: Collection[Link]) -> list[tuple[Link, str]]:
    """Up links out of `here` that bring it one hop closer to `dst`, in port order."""
    if here not in dist or here == dst:
        return []
    want = dist[here] - 1
    hosts = graph.hosts
    # `not down` first: hashing a Link dataclass costs more than the rest of the test.
    return [
        (lk, peer)
        for lk, peer in graph.adj[here]
        if dist.get(peer) == want and (peer == dst or peer not in hosts) and (not down or lk not in down)
    ]


def equal_cost_paths(topo: Topology, src: str, dst: str, down_links: Collection[Link] = NO_LINKS) -> list[list[str]]:
    """All shortest paths from `src` to `dst` as node-name lists, ordered by port at each hop.

    Parallel links between the same two nodes give one node path (see `path_count` to count them).
    Returns [] when no path is up and [[src]] when src == dst.
    """
    graph = _graph(topo)
    _check_node(graph, src)
    down = _as_set(down_links)
    dist = distances(topo, dst, down)
    if src not in dist:
        return []
    paths: list[list[str]] = []

    def walk(path: list[str]) -> None:
        here = path[-1]
        if here == dst:
            paths.append(list(path))
            return
        seen: set[str] = set()
        for _lk, peer in _steps(graph, here, dst, dist, down):
            if peer not in seen:
                seen.add(peer)
                path.append(peer)
                walk(path)
                path.pop()

    walk([src])
    return paths


def path_count(topo: Topology, src: str, dst: str, down_links: Collection[Link] = NO_LINKS) -> int:
    """Number of shortest link-level paths (parallel links count separately), without enumerating them."""
    graph = _graph(topo)
    _check_node(graph, src)
    down = _as_set(down_links)
    dist = distances(topo, dst, down)
    if src not in dist:
        return 0
    # Count from dst outwards, in increasing distance, so each node's successors are already done.
    counts = {dst: 1}
    for node in sorted((n for n in dist if n != dst), key=dist.__getitem__):
        if node in graph.hosts and node != src:
            continue
        counts[node] = sum(counts.get(peer, 0) for _lk, peer in _steps(graph, node, dst, dist, down))
    return counts.get(src, 0)


def next_hops(topo: Topology, switch: str, dst_host: str, down_links: Collection[Link] = NO_LINKS) -> list[Link]:
    """Up links out of `switch` that lie on a shortest path to `dst_host`, in `switch`'s port order.

    Parallel links are listed separately. Empty when `switch` is `dst_host` or cannot reach it.
    Works for a (multi-homed) host as `switch` too: it lists the host's usable interfaces.
    """
    graph = _graph(topo)
    _check_node(graph, switch)
    down = _as_set(down_links)
    return [lk for lk, _ in _steps(graph, switch, dst_host, distances(topo, dst_host, down), down)]


def routing_table(topo: Topology, down_links: Collection[Link] = NO_LINKS) -> dict[str, dict[str, list[Link]]]:
    """switch -> destination host -> next-hop links (as `next_hops`), with one search per host."""
    graph = _graph(topo)
    down = _as_set(down_links)
    table: dict[str, dict[str, list[Link]]] = {s.name: {} for s in topo.switches}
    for host in topo.hosts:
        dist = distances(topo, host.name, down)
        for switch, routes in table.items():
            routes[host.name] = [lk for lk, _ in _steps(graph, switch, host.name, dist, down)]
    return table


def nodes_on_paths(
    topo: Topology, src: str, dst: str, role: str | None = None, down_links: Collection[Link] = NO_LINKS
) -> list[str]:
    """Nodes (optionally of one role) that lie on some shortest path from src to dst, in node order."""
    _check_node(_graph(topo), src)
    to_dst = distances(topo, dst, down_links)
    if src not in to_dst:
        return []
    from_src = distances(topo, src, down_links)
    total = to_dst[src]
    return [
        n.name
        for n in topo.nodes
        if (role is None or n.role == role)
        and n.name in to_dst
        and n.name in from_src
        and from_src[n.name] + to_dst[n.name] == total
        and (n.is_switch or n.name in (src, dst))
    ]


def spines_on_paths(topo: Topology, src: str, dst: str, down_links: Collection[Link] = NO_LINKS) -> list[str]:
    """Spines a packet from src to dst can cross on an equal-cost path (empty within one leaf)."""
    return nodes_on_paths(topo, src, dst, role="spine", down_links=down_links)


def link_at(topo: Topology, node: str, port: int) -> Link:
    """The link on `node`'s port `port`, e.g. to turn an OpenFlow port-status event into a Link."""
    try:
        return _graph(topo).ports[node, port]
    except KeyError:
        raise KeyError(f"no link on {node} port {port}") from None
