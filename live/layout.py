"""Where to draw each node: tiers of a fabric, derived from the wiring rather than from role names.

A node's tier is its distance from the nearest host (hosts 0, the switches they hang off 1, ...), so
leaf-spine (host / leaf / spine), in-server (gpu / local / tor) and a three-tier fat-tree (host /
edge / agg / core) all draw bottom-up without a table of role names. A tier is named after the most
common role in it. Within a tier, nodes follow the order of what they connect to below, so links
mostly run straight up.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import asdict, dataclass
from typing import Any

from topologies import Topology
from topologies.model import natural_key


@dataclass(frozen=True)
class Tier:
    level: int  # 0 = hosts
    name: str  # the most common role in the tier, e.g. "spine"
    nodes: tuple[str, ...]  # left to right


def node_levels(topo: Topology) -> dict[str, int]:
    """Hop distance from the nearest host, for every node (unconnected switches go on top)."""
    adj: dict[str, list[str]] = {n.name: [] for n in topo.nodes}
    for lk in topo.links:
        adj[lk.a].append(lk.b)
        adj[lk.b].append(lk.a)
    level = {h.name: 0 for h in topo.hosts}
    queue = deque(level)
    while queue:
        here = queue.popleft()
        for peer in adj[here]:
            if peer not in level:
                level[peer] = level[here] + 1
                queue.append(peer)
    top = max(level.values(), default=0) + 1
    return {n.name: level.get(n.name, top) for n in topo.nodes}


def tiers(topo: Topology) -> list[Tier]:
    """Tiers from the hosts (level 0) up, each ordered left to right."""
    level = node_levels(topo)
    by_level: dict[int, list[str]] = {}
    for n in topo.nodes:
        by_level.setdefault(level[n.name], []).append(n.name)
    result: list[Tier] = []
    position: dict[str, float] = {}
    levels = sorted(by_level)
    # Switches just above the hosts are ordered by name, and hosts under them in that order; higher
    # tiers by name (their children span everything anyway).
    if len(levels) > 1:
        edge = sorted(by_level[levels[1]], key=natural_key)
        position.update({name: i for i, name in enumerate(edge)})
    for lv in levels:
        names = by_level[lv]
        if lv == 0:
            def parent_pos(h: str) -> float:
                ups = [position[p] for p in _above(topo, h, level) if p in position]
                return min(ups) if ups else float("inf")

            names = sorted(names, key=lambda h: (parent_pos(h), natural_key(h)))
        else:
            names = sorted(names, key=natural_key)
        roles = Counter(topo.node(n).role for n in names)
        result.append(Tier(level=lv, name=roles.most_common(1)[0][0], nodes=tuple(names)))
    return result


def _above(topo: Topology, node: str, level: dict[str, int]) -> list[str]:
    return [lk.peer(node) for lk in topo.links_of(node) if level[lk.peer(node)] > level[node]]


def layout(topo: Topology) -> dict[str, Any]:
    """The drawing's plain data: tiers (top tier first, as drawn) and links."""
    ts = tiers(topo)
    return {
        "name": topo.name,
        "tiers": [asdict(t) | {"nodes": list(t.nodes)} for t in reversed(ts)],
        "nodes": {n.name: {"role": n.role, "host": n.is_host, "ip": n.address} for n in topo.nodes},
        "links": [{"name": lk.name, "a": lk.a, "b": lk.b, "rate_mbps": lk.rate_mbps} for lk in topo.links],
    }
