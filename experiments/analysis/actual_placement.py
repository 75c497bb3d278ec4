"""Which path each ECMP-hashed flow actually took, recovered from the links' own counters, and what
that placement allowed: its max-min fair rates.

The balls-in-bins expectation (analysis.hashing) averages over all the placements a hash could make;
one run has one. To tell bad luck from a fabric or transport that shares badly, a run is judged
against its own placement: "ECMP carried 0.97x what its placement allowed" says the transport filled
the paths the hash gave it; "0.64x its expectation" alone cannot.

The placement is the assignment of one equal-cost path per flow whose bytes best explain the bytes
counted on every fabric link direction (least squares, searched exhaustively per flow from several
starts: a few flows per leaf and a few paths each). Flows of the same size on the same links are
interchangeable, and so is their effect on the fair rates. Nothing here needs root.
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

    def vias(self, topo: Topology) -> list[str]:
        """Each path as the switches it crosses between the source's and the destination's, e.g.
        'spine2' ('-' for a flow that stays on its switch)."""
        out = []
        for path in self.paths:
            nodes = [src for _, src in path[2:-1]]
            out.append("/".join(nodes) if nodes else "-")
        return out


def infer_placement(topo: Topology, pairs: Sequence[tuple[str, str]], flow_bytes: Sequence[float],
                    observed: Mapping[str, float], restarts: int = 40, seed: int = 0) -> Placement:
    """One path per flow that best explains `observed` (bytes, or any quantity proportional to them, per
    fabric link direction labelled 'a->b' as results.json's link_utilisation is, already in rate units)."""
    fabric = fabric_hops(topo)
    candidates = [equal_cost_paths(topo, s, d) for s, d in pairs]
    labels = sorted({hop_label(h) for c in candidates for p in c for h in p if h[0] in fabric} | set(observed))
    obs = {lb: float(observed.get(lb, 0.0)) for lb in labels}
    total_obs = sum(obs.values())
    sizes = [float(b) for b in flow_bytes]

    def fabric_labels(path: Path) -> list[str]:
        return [hop_label(h) for h in path if h[0] in fabric]

    cand_labels = [[fabric_labels(p) for p in c] for c in candidates]

    def error(choice: list[int]) -> float:
        load = dict.fromkeys(labels, 0.0)
        for f, k in enumerate(choice):
            for lb in cand_labels[f][k]:
                load[lb] += sizes[f]
        total = sum(load.values())
        scale = total_obs / total if total > 0 else 0.0
        return sum((scale * load[lb] - obs[lb]) ** 2 for lb in labels)

    rng = random.Random(seed)
    best: list[int] | None = None
    best_err = float("inf")
    for r in range(max(1, restarts)):
        choice = [0 if r == 0 else rng.randrange(len(c)) for c in candidates]
        choice, err = _descend(choice, error(choice), [len(c) for c in candidates], error)
        if err < best_err:
            best, best_err = choice, err
        if best_err <= 1e-12:
            break
    assert best is not None
    norm = sum(v * v for v in obs.values()) or 1.0
    return Placement([candidates[f][k] for f, k in enumerate(best)], best_err / norm)


def _descend(choice: list[int], err: float, n_paths: list[int], error) -> tuple[list[int], float]:
    """Local search: move one flow to another path while that helps, then two flows at once (a swap
    between two leaves' flows is invisible to single moves), until neither helps."""
    n = len(choice)
    while True:
        improved = False
        for f in range(n):
            for k in range(n_paths[f]):
                if k != choice[f]:
                    trial = choice.copy()
                    trial[f] = k
                    e = error(trial)
                    if e < err - 1e-12:
                        choice, err, improved = trial, e, True
        if improved:
            continue
        for f in range(n):
            for g in range(f + 1, n):
                for k in range(n_paths[f]):
                    for m in range(n_paths[g]):
                        if k == choice[f] and m == choice[g]:
                            continue
                        trial = choice.copy()
                        trial[f], trial[g] = k, m
                        e = error(trial)
                        if e < err - 1e-12:
                            choice, err, improved = trial, e, True
        if not improved or err <= 1e-12:
            return choice, err


def placement_fair_rates(topo: Topology, placement: Placement, sizes: Sequence[float] | None = None) -> list[float]:
    """Max-min fair rates (bit/s) of flows pinned to the placement's paths; with `sizes` (bits on the
    wire per flow, all starting at once), each flow's mean rate as the shares change while flows
    complete (placement.fluid_rates)."""
    flows = [dict.fromkeys(path, 1.0) for path in placement.paths]
    if sizes is not None:
        return fluid_rates(flows, capacities(topo), sizes)
    return max_min_rates(flows, capacities(topo))
