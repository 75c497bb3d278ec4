"""Which path each ECMP-hashed flow actually took, recovered from the links' own counters, and what
that placement allowed: its max-min fair rates.

The balls-in-bins expectation (analysis.hashing) averages over all the placements a hash could make;
one run has one. To tell bad luck from a fabric or transport that shares badly, a run is judged
against its own placement: "ECMP carried 0.97x what its placement allowed" says the transport filled
the paths the hash gave it; "0.64x its expectation" alone cannot.

The placement is the assignment of one equal-cost path per flow whose bytes best explain the bytes
counted on every fabric link direction (least squares, a local search from several starts, within
a budget of moves that a 4x4x4 leaf-spine never meets and a k=8 fat-tree meets in seconds). Flows
of the same size on the same links are interchangeable, and so is their effect on the fair rates.
Nothing here needs root.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from experiments.analysis.links import fabric_hops, hop_label
from experiments.analysis.placement import Hop, capacities, fluid_rates, max_min_rates
from topologies import Topology, next_hops

Path = tuple[Hop, ...]


def equal_cost_paths(topo: Topology, src: str, dst: str) -> list[Path]:
    """Every shortest path src -> dst as its directed links, in the topology's next-hop order."""
    out: list[Path] = []

    def walk(node: str, hops: list[Hop]) -> None:
        if node == dst:
            out.append(tuple(hops))
            return
        if len(hops) > 16:
            raise ValueError(f"no loop-free path from {src} to {dst}")
        for lk in next_hops(topo, node, dst):
            walk(lk.peer(node), [*hops, (lk.name, node)])

    walk(src, [])
    return out


@dataclass
class Placement:
    paths: list[Path]  # per flow
    residual: float  # squared error left, as a share of the squared observed load (0: explained exactly)
    moves: int = 0  # moves the search tried (at most MOVE_BUDGET and one flow's pairs more)

    def vias(self, topo: Topology) -> list[str]:
        """Each path as the switches it crosses between the source's and the destination's, e.g.
        'spine2' ('-' for a flow that stays on its switch)."""
        out = []
        for path in self.paths:
            nodes = [src for _, src in path[2:-1]]
            out.append("/".join(nodes) if nodes else "-")
        return out


# Moves tried, over all restarts, before the search stops where it stands. A 4x4x4 leaf-spine (16
# flows of 4 paths) needs about 10^5 for all 40 starts and never meets it. A k=8 fat-tree (128 flows
# of 16 paths, nearly every pair able to share a core link) tries ~2 x 10^6 per sweep of pairs: its
# analysis took hours before, and now stops after a few seconds with the best placement found.
MOVE_BUDGET = 3_000_000


def infer_placement(topo: Topology, pairs: Sequence[tuple[str, str]], flow_bytes: Sequence[float],
                    observed: Mapping[str, float], restarts: int = 40, seed: int = 0) -> Placement:
    """One path per flow that best explains `observed` (bytes, or any quantity proportional to them, per
    fabric link direction labelled 'a->b' as results.json's link_utilisation is, already in rate units)."""
    fabric = fabric_hops(topo)
    candidates = [equal_cost_paths(topo, s, d) for s, d in pairs]
    labels = sorted({hop_label(h) for c in candidates for p in c for h in p if h[0] in fabric} | set(observed))
    index = {lb: i for i, lb in enumerate(labels)}
    obs = [float(observed.get(lb, 0.0)) for lb in labels]
    total_obs = sum(obs)
    sizes = [float(b) for b in flow_bytes]
    cand = [[tuple(index[hop_label(h)] for h in p if h[0] in fabric) for p in c] for c in candidates]
    search = _Search(cand, sizes, obs, total_obs)
    rng = random.Random(seed)
    best: list[int] | None = None
    best_err = float("inf")
    for r in range(max(1, restarts)):
        if r and search.moves > MOVE_BUDGET:
            break
        choice = [0 if r == 0 else rng.randrange(len(c)) for c in candidates]
        choice, err = search.descend(choice)
        if err < best_err:
            best, best_err = choice, err
        if best_err <= 1e-12:
            break
    assert best is not None
    norm = sum(v * v for v in obs) or 1.0
    return Placement([candidates[f][k] for f, k in enumerate(best)], best_err / norm, search.moves)


class _Search:
    """Least squares over one path per flow: the squared error between the links' observed loads and
    the loads a choice of paths puts there, scaled to the observed total (equal-cost paths cross as
    many fabric links, so the scale is the same for every choice). Local search: move one flow to
    another path while that helps, then two flows at once (a swap between two leaves' flows is
    invisible to single moves), until neither helps. A move is scored by what it changes on its own
    links; a pair is tried only when the two flows can share a link, since otherwise the pair's change
    is the sum of two single moves that did not help."""

    def __init__(self, cand: list[list[tuple[int, ...]]], sizes: list[float], obs: list[float],
                 total_obs: float) -> None:
        self.cand, self.sizes, self.obs = cand, sizes, obs
        self.moves = 0
        self.total_obs = total_obs
        # A multi-homed host's equal-cost paths may cross different numbers of fabric links: then the
        # scale depends on the choice, and moves are scored by recomputing the whole error.
        self.varying = any(len({len(p) for p in c}) > 1 for c in cand)
        self.scale = 0.0
        if not self.varying:
            total = sum(s * len(c[0]) for s, c in zip(sizes, cand, strict=True) if c)
            self.scale = total_obs / total if total > 0 else 0.0
        reach = [set().union(*c) if c else set() for c in cand]
        by_link: dict[int, list[int]] = {}
        for f, links in enumerate(reach):
            for lb in links:
                by_link.setdefault(lb, []).append(f)
        self.partners = [sorted({g for lb in reach[f] for g in by_link[lb] if g > f}) for f in range(len(cand))]

    def _error(self, load: list[float]) -> float:
        c = self.scale
        if self.varying:
            total = sum(load)
            c = self.total_obs / total if total > 0 else 0.0
        return sum((c * x - o) ** 2 for x, o in zip(load, self.obs, strict=True))

    def _delta(self, load: list[float], f: int, old: int, new: int) -> float:
        """Change of the error when flow f moves from path `old` to `new` (the load left unchanged)."""
        if self.varying:
            before = self._error(load)
            self._move(load, f, old, new)
            after = self._error(load)
            self._move(load, f, new, old)
            return after - before
        c, obs, s = self.scale, self.obs, self.sizes[f]
        a, b = self.cand[f][old], self.cand[f][new]
        d = 0.0
        for lb in a:
            if lb not in b:
                x = c * load[lb] - obs[lb]
                d += (x - c * s) ** 2 - x * x
        for lb in b:
            if lb not in a:
                x = c * load[lb] - obs[lb]
                d += (x + c * s) ** 2 - x * x
        return d

    def _move(self, load: list[float], f: int, old: int, new: int) -> None:
        s = self.sizes[f]
        for lb in self.cand[f][old]:
            load[lb] -= s
        for lb in self.cand[f][new]:
            load[lb] += s

    def descend(self, choice: list[int]) -> tuple[list[int], float]:
        choice = list(choice)
        load = [0.0] * len(self.obs)
        for f, k in enumerate(choice):
            for lb in self.cand[f][k]:
                load[lb] += self.sizes[f]
        n_paths = [len(c) for c in self.cand]
        while True:
            improved = False
            for f in range(len(choice)):
                if self.moves > MOVE_BUDGET:
                    return choice, self._error(load)
                for k in range(n_paths[f]):
                    if k != choice[f]:
                        self.moves += 1
                        if self._delta(load, f, choice[f], k) < -1e-12:
                            self._move(load, f, choice[f], k)
                            choice[f], improved = k, True
            if improved:
                continue
            for f in range(len(choice)):
                if self.moves > MOVE_BUDGET:
                    return choice, self._error(load)
                for g in self.partners[f]:
                    for k in range(n_paths[f]):
                        d1 = 0.0 if k == choice[f] else self._delta(load, f, choice[f], k)
                        if k != choice[f]:
                            self._move(load, f, choice[f], k)
                        kept = False
                        for m in range(n_paths[g]):
                            if (k == choice[f] and m == choice[g]) or m == choice[g]:
                                continue
                            self.moves += 1
                            if d1 + self._delta(load, g, choice[g], m) < -1e-12:
                                self._move(load, g, choice[g], m)
                                choice[f], choice[g], improved, kept = k, m, True, True
                                break
                        if not kept and k != choice[f]:
                            self._move(load, f, k, choice[f])
            if not improved:
                return choice, self._error(load)


def placement_fair_rates(topo: Topology, placement: Placement, sizes: Sequence[float] | None = None) -> list[float]:
    """Max-min fair rates (bit/s) of flows pinned to the placement's paths; with `sizes` (bits on the
    wire per flow, all starting at once), each flow's mean rate as the shares change while flows
    complete (placement.fluid_rates)."""
    flows = [dict.fromkeys(path, 1.0) for path in placement.paths]
    if sizes is not None:
        return fluid_rates(flows, capacities(topo), sizes)
    return max_min_rates(flows, capacities(topo))
