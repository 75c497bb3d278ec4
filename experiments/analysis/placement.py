"""Where a workload's flows go and what the fabric can carry for them: permutation traffic across
groups, the bytes a flow puts on each directed link (pinned to one path or sprayed), max-min fair rates
by progressive filling, and the ideal (max-min total with spraying).

Fair shares are max-min fair rates found by progressive filling over link *directions*: every flow
uses each directed link with a weight (the fraction of its bytes crossing it). A flow pinned to one
path (ECMP) has weight 1 on that path's links; a sprayed flow splits evenly at every hop, as the
fabric's spray mode does. The ideal of a workload is its max-min total with spraying: what the
fabric can carry when no path is wasted. Nothing here needs root or a running fabric.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from topologies import Topology, next_hops

# A directed link: (link name, the node the bytes leave from).
Hop = tuple[str, str]


def derangement_across(topo: Topology, seed: int, group_label: str | None = None) -> list[tuple[str, str]]:
    """Permutation traffic: each host sends to exactly one host, and receives from exactly one,
    always on another leaf (or server): a random derangement across groups, drawn from `seed`.

    Groups come from the hosts' `leaf` / `server` labels (or `group_label`); with a single group the
    constraint is only src != dst.
    """
    hosts = [h.name for h in topo.hosts]
    label = group_label or _group_label(topo)
    group = {h.name: h.labels.get(label, h.name) if label else h.name for h in topo.hosts}
    rng = random.Random(seed)
    single_group = len(set(group.values())) <= 1
    for _ in range(10_000):
        dsts = hosts[:]
        rng.shuffle(dsts)
        if all(s != d and (single_group or group[s] != group[d]) for s, d in zip(hosts, dsts, strict=True)):
            return list(zip(hosts, dsts, strict=True))
    # Fall back to a shift by one group (always valid when groups are equal-sized).
    n = len(hosts)
    per = max(1, n // max(1, len(set(group.values()))))
    return [(hosts[i], hosts[(i + per) % n]) for i in range(n)]


def _group_label(topo: Topology) -> str | None:
    # On three tiers the pod comes first, so that every flow crosses the top tier (the cores), where
    # multi-stage hashing and spraying differ most.
    for label in ("pod", "leaf", "edge", "server"):
        if any(label in h.labels for h in topo.hosts):
            return label
    return None


def host_rate_mbps(topo: Topology) -> float:
    """The slowest host link's rate: what every host can send at (flow sizes, all-reduce's bound)."""
    return min(lk.rate_mbps for h in topo.hosts for lk in topo.links_of(h.name))


def path_weights(topo: Topology, src: str, dst: str, spray: bool = True,
                 rng: random.Random | None = None) -> dict[Hop, float]:
    """Fraction of a src->dst flow's bytes on each directed link.

    spray=True splits evenly over the next hops at every switch (the fabric's spray mode); otherwise
    one next hop is drawn at random at every switch (`rng`): one sample of ECMP hashing.
    """
    weights: dict[Hop, float] = {}
    frontier: dict[str, float] = {src: 1.0}
    guard = 0
    while frontier:
        guard += 1
        if guard > 64:
            raise ValueError(f"no loop-free path from {src} to {dst}")
        nxt: dict[str, float] = {}
        for node, w in frontier.items():
            if node == dst:
                continue
            hops = next_hops(topo, node, dst)
            if not hops:
                raise ValueError(f"{dst} is unreachable from {node}")
            if not spray:
                hops = [(rng or random).choice(hops)]
            share = w / len(hops)
            for lk in hops:
                key = (lk.name, node)
                weights[key] = weights.get(key, 0.0) + share
                peer = lk.peer(node)
                nxt[peer] = nxt.get(peer, 0.0) + share
        frontier = {n: w for n, w in nxt.items() if n != dst}
    return weights


def capacities(topo: Topology, overrides: dict[Hop, float] | None = None) -> dict[Hop, float]:
    """Capacity in bit/s of every directed link."""
    caps: dict[Hop, float] = {}
    for lk in topo.links:
        caps[(lk.name, lk.a)] = lk.rate_mbps * 1e6
        caps[(lk.name, lk.b)] = lk.rate_mbps * 1e6
    if overrides:
        caps.update(overrides)
    return caps


def max_min_rates(flows: Sequence[dict[Hop, float]], caps: dict[Hop, float]) -> list[float]:
    """Max-min fair rates (bit/s) by progressive filling; `flows[i]` maps directed links to weights."""
    n = len(flows)
    rates = [0.0] * n
    frozen = [False] * n
    residual = dict(caps)
    for _ in range(n + len(caps) + 1):
        active = [i for i in range(n) if not frozen[i]]
        if not active:
            break
        # Load per unit of common rate increase on each link still used by an active flow.
        load: dict[Hop, float] = {}
        for i in active:
            for hop, w in flows[i].items():
                load[hop] = load.get(hop, 0.0) + w
        if not load:
            break
        step = min(residual[h] / w for h, w in load.items() if w > 0)
        for i in active:
            rates[i] += step
        for hop, w in load.items():
            residual[hop] -= step * w
        saturated = {h for h, w in load.items() if w > 0 and residual[h] <= 1e-6 * caps[h]}
        for i in active:
            if any(h in saturated for h in flows[i]):
                frozen[i] = True
    return rates


def fluid_rates(flows: Sequence[dict[Hop, float]], caps: dict[Hop, float], sizes: Sequence[float]) -> list[float]:
    """Each flow's mean rate (bit/s: its size over its completion time) when flows of `sizes` bits all
    start at once and share max-min fairly, the shares found again each time a flow completes.

    What a sized run's goodput (every flow's bytes over its own duration, summed) is to be judged
    against: the static max-min rates hold only while every flow runs, and a flow that shared a link
    with one that finished early speeds up for the rest of its transfer.
    """
    n = len(flows)
    left = [float(b) for b in sizes]
    done = [0.0] * n
    active = [i for i in range(n) if left[i] > 0]
    now = 0.0
    while active:
        rates = max_min_rates([flows[i] for i in active], caps)
        # The next completion; a flow the fabric cannot carry at all never completes.
        step = min((left[i] / r for i, r in zip(active, rates, strict=True) if r > 0), default=None)
        if step is None:
            break
        now += step
        still = []
        for i, r in zip(active, rates, strict=True):
            left[i] -= r * step
            if left[i] <= 1e-9 * sizes[i]:
                done[i] = now
            else:
                still.append(i)
        active = still
    return [sizes[i] / done[i] if done[i] > 0 else 0.0 for i in range(n)]


def ideal_bps(topo: Topology, pairs: Sequence[tuple[str, str]], caps: dict[Hop, float] | None = None) -> float:
    """What the fabric can carry for these flows: their max-min total with even spraying."""
    flows = [path_weights(topo, s, d, spray=True) for s, d in pairs]
    return float(sum(max_min_rates(flows, caps or capacities(topo))))
