"""Which server each node of a fabric runs on.

The rule: a switch that hosts attach to (leaf, ToR, edge, an in-server fabric's local switch) lives on
one server together with all of its hosts, so host links never cross servers; these switches are
spread over the servers in contiguous, evenly sized blocks (a fat-tree's pods stay together as far as
the count allows). The switches above them are spread the same way. Only fabric links (leaf-spine,
edge-agg, agg-core) cross servers, and they are the links the ssh tunnels carry.
"""

from __future__ import annotations

from topologies.model import Topology


def _bins(names: list[str], servers: list[str]) -> dict[str, str]:
    """Contiguous blocks of sizes differing by at most one, in order."""
    out: dict[str, str] = {}
    q, r = divmod(len(names), len(servers))
    i = 0
    for k, server in enumerate(servers):
        for _ in range(q + (1 if k < r else 0)):
            out[names[i]] = server
            i += 1
    return out


def place(topo: Topology, servers: list[str]) -> dict[str, str]:
    """node name -> server."""
    if not servers:
        raise ValueError("no servers to place the fabric on")
    attached: dict[str, str] = {}
    for lk in topo.links:
        a, b = topo.node(lk.a), topo.node(lk.b)
        if a.is_host and b.is_switch:
            attached.setdefault(a.name, b.name)
        elif b.is_host and a.is_switch:
            attached.setdefault(b.name, a.name)
    edge = [s.name for s in topo.switches if s.name in set(attached.values())]
    upper = [s.name for s in topo.switches if s.name not in set(edge)]
    placement = _bins(edge, servers)
    placement.update(_bins(upper, servers))
    for h in topo.hosts:
        if h.name not in attached:
            raise ValueError(f"host {h.name} has no switch to be placed with")
        placement[h.name] = placement[attached[h.name]]
    return placement


def crossing_links(topo: Topology, placement: dict[str, str]) -> list[str]:
    return [lk.name for lk in topo.links if placement[lk.a] != placement[lk.b]]
