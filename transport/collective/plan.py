"""Collectives as plans: every block that moves, at which step, from which rank's buffer to which.

A plan is pure data, the same on every rank, built from (collective, ranks, elements, group size,
piece size). Each rank holds one work buffer of float32; a `Transfer` copies ``length`` elements of
the sender's buffer at ``src_lo`` into the receiver's buffer at ``dst_lo``, either adding them to what
is there (ADD) or replacing it (COPY). Every transfer is one transport message (a piece of a block).
`transport.collective.worker.PlanWorker` runs one rank's part of a plan; the rules that make the result
independent of the order in which messages arrive are written there.

The collectives (N ranks, a rank's input of ``size`` elements cut into N chunks at ``np.array_split``
boundaries, chunk c = [lo_c, hi_c)):

==================  ==========================================================  =====================
collective          step g (rank r sends to / receives from)                    rank r's result
==================  ==========================================================  =====================
all-reduce          g < N-1: chunk (r-g) to r+1; chunk (r-g-1) from r-1, ADD    the sum of all inputs
                    g = N-1+s: chunk (r+1-s) to r+1; chunk (r-s) from r-1, COPY
reduce-scatter      chunk (r-g-1) to r+1; chunk (r-g-2) from r-1, ADD (g<N-1)   chunk r of the sum
all-gather          chunk (r-g) to r+1; chunk (r-g-1) from r-1, COPY (g<N-1)    chunk c of rank c, all c
all-to-all          g = k-1, k = 1..N-1: input chunk (r+k) to rank (r+k);       block s = chunk r of
                    from rank (r-k) into output block (r-k); step g's sends     rank s's input, all s
                    wait for step g-1's receives (pairwise exchange)
hierarchical        ranks in groups of L (group g holds ranks gL .. gL+L-1):    the sum of all inputs
                    reduce-scatter of L local chunks inside the group (L-1
                    steps), all-reduce of local chunk i over rank i of every
                    group (2(G-1) steps), all-gather inside the group (L-1)
==================  ==========================================================  =====================

Indices are mod N (mod the ring's length inside a group or across groups). The all-reduce's order
of additions is ring.py's, so it is bit for bit `ring_reference`. All-to-all's work buffer is the
input followed by the output (N blocks of chunk r's length); a rank's own block is copied locally.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from transport.collective.base import DTYPE, chunk_bounds


class Op(enum.IntEnum):
    ADD = 1
    COPY = 2


COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "hierarchical")
# What the `fabriclab allreduce --collective` option has always called the all-reduce.
ALIASES = {"ring": "all-reduce", "allreduce": "all-reduce", "alltoall": "all-to-all",
           "reducescatter": "reduce-scatter", "allgather": "all-gather"}


def canonical(name: str) -> str:
    """The collective's name as COLLECTIVES spell it; ValueError for one that does not exist."""
    key = name.strip().lower().replace("_", "-")
    key = ALIASES.get(key, ALIASES.get(key.replace("-", ""), key))
    if key not in COLLECTIVES:
        raise ValueError(f"unknown collective {name!r}: use one of {', '.join(('ring', *COLLECTIVES))}")
    return key


@dataclass(frozen=True, slots=True)
class Transfer:
    step: int
    src: int
    dst: int
    src_lo: int  # in the sender's work buffer
    dst_lo: int  # in the receiver's work buffer
    length: int
    op: Op


@dataclass
class Plan:
    name: str
    n_ranks: int
    size: int
    group: int = 1  # ranks per group (hierarchical only)
    transfers: list[Transfer] = field(default_factory=list)
    steps: int = 0
    # A rank's sends of step g also wait for all its receives of step g-1: all-to-all's pairwise
    # exchange, which keeps each rank's downlink to about one sender at a time instead of all at once.
    sync_steps: bool = False

    @property
    def chunks(self) -> list[tuple[int, int]]:
        return chunk_bounds(self.size, self.n_ranks)

    # -- buffers ----------------------------------------------------------------------------------

    def load(self, rank: int, x: np.ndarray) -> np.ndarray:
        """Rank ``rank``'s work buffer at the start of an iteration, from its input ``x``."""
        x = np.asarray(x, dtype=DTYPE)
        if self.name != "all-to-all":
            return x.copy()
        lo, hi = self.chunks[rank]
        n = hi - lo
        work = np.zeros(self.size + self.n_ranks * n, dtype=DTYPE)
        work[: self.size] = x
        work[self.size + rank * n: self.size + (rank + 1) * n] = x[lo:hi]  # its own block stays here
        return work

    def result(self, rank: int, work: np.ndarray) -> np.ndarray:
        """The part of the work buffer that is the collective's result on ``rank``."""
        if self.name == "reduce-scatter":
            lo, hi = self.chunks[rank]
            return work[lo:hi]
        if self.name == "all-to-all":
            return work[self.size:]
        return work

    def expected(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Every rank's result as numpy computes it (exact for integer-valued inputs, see make_int_input)."""
        stack = np.stack([np.asarray(x, dtype=DTYPE) for x in inputs])
        chunks = self.chunks
        if self.name in ("all-reduce", "hierarchical"):
            total = stack.sum(axis=0, dtype=DTYPE)
            return [total.copy() for _ in inputs]
        if self.name == "reduce-scatter":
            total = stack.sum(axis=0, dtype=DTYPE)
            return [total[lo:hi].copy() for lo, hi in chunks]
        if self.name == "all-gather":
            out = np.concatenate([stack[c, lo:hi] for c, (lo, hi) in enumerate(chunks)]) if chunks else stack[0]
            return [out.astype(DTYPE) for _ in inputs]
        return [np.ascontiguousarray(stack[:, lo:hi]).reshape(-1) for lo, hi in chunks]

    def edges(self) -> set[tuple[int, int]]:
        """Every (sender, receiver) pair the plan uses, and the barrier's ring r -> r+1."""
        pairs = {(t.src, t.dst) for t in self.transfers}
        if self.n_ranks > 1:
            pairs |= {(r, (r + 1) % self.n_ranks) for r in range(self.n_ranks)}
        return pairs

    def bytes_sent(self, rank: int) -> int:
        return sum(t.length for t in self.transfers if t.src == rank) * DTYPE.itemsize


def make_int_input(seed: int, rank: int, size: int) -> np.ndarray:
    """Rank ``rank``'s input for the plan collectives: integer values in float32, small enough that any
    sum over up to 4096 ranks is exact, so every order of additions gives numpy's result bit for bit."""
    rng = np.random.default_rng([seed, rank, 0x1C])
    return rng.integers(-2048, 2049, size).astype(DTYPE)


# --------------------------------------------------------------------------------------------------
# Building plans


def _pieces(lo: int, hi: int, piece_elems: int) -> list[tuple[int, int]]:
    """[start, end) of the pieces of a block, from its start; an empty block moves nothing."""
    return [(s, min(s + piece_elems, hi)) for s in range(lo, hi, piece_elems)]


def _ring_pass(out: list[Transfer], members: Sequence[int], blocks: Sequence[tuple[int, int]], step0: int,
               op: Op, shift: int, piece_elems: int) -> int:
    """A pass round the ring ``members`` (member i sends to member i+1): at step g member i sends block
    (i - g + shift) and receives block (i - g - 1 + shift), for k-1 steps (k = len(members)). Blocks are
    regions of the work buffer, the same on every member. Returns the number of steps."""
    k = len(members)
    for g in range(k - 1):
        for i, src in enumerate(members):
            b = (i - g + shift) % k
            dst = members[(i + 1) % k]
            for lo, hi in _pieces(*blocks[b], piece_elems):
                out.append(Transfer(step0 + g, src, dst, lo, lo, hi - lo, op))
    return max(k - 1, 0)


def build_plan(name: str, n_ranks: int, size: int, *, group: int = 1, piece_elems: int = 16384) -> Plan:
    """The plan of collective ``name`` (see COLLECTIVES) over ``n_ranks`` ranks of ``size`` elements."""
    name = canonical(name)
    if n_ranks < 1:
        raise ValueError("n_ranks must be >= 1")
    if size < 1:
        raise ValueError("size must be >= 1")
    if piece_elems < 1:
        raise ValueError("piece_elems must be >= 1")
    if name != "hierarchical":
        group = 1
    elif group < 1 or n_ranks % group:
        raise ValueError(f"group {group}: the {n_ranks} ranks must split into whole groups")
    plan = Plan(name, n_ranks, size, group)
    out = plan.transfers
    ranks = list(range(n_ranks))
    chunks = plan.chunks
    if name == "all-reduce":
        steps = _ring_pass(out, ranks, chunks, 0, Op.ADD, 0, piece_elems)
        steps += _ring_pass(out, ranks, chunks, steps, Op.COPY, 1, piece_elems)
    elif name == "reduce-scatter":
        steps = _ring_pass(out, ranks, chunks, 0, Op.ADD, -1, piece_elems)
    elif name == "all-gather":
        steps = _ring_pass(out, ranks, chunks, 0, Op.COPY, 0, piece_elems)
    elif name == "all-to-all":
        steps = n_ranks - 1
        plan.sync_steps = True
        for k in range(1, n_ranks):
            for r in ranks:
                d = (r + k) % n_ranks
                lo, hi = chunks[d]
                base = size + r * (hi - lo)  # block r of rank d's output
                for plo, phi in _pieces(lo, hi, piece_elems):
                    out.append(Transfer(k - 1, r, d, plo, base + plo - lo, phi - plo, Op.COPY))
    else:
        steps = _hierarchical(out, n_ranks, size, group, piece_elems)
    plan.steps = steps
    return plan


def _hierarchical(out: list[Transfer], n_ranks: int, size: int, group: int, piece_elems: int) -> int:
    n_groups = n_ranks // group
    local = chunk_bounds(size, group)
    groups = [list(range(g * group, (g + 1) * group)) for g in range(n_groups)]
    # 1. Reduce-scatter inside each group: member i ends with local chunk i summed over its group.
    steps = 0
    for members in groups:
        s = _ring_pass(out, members, local, 0, Op.ADD, -1, piece_elems)
    steps += s if groups else 0
    # 2. All-reduce of local chunk i across groups, over rank i of every group.
    s = 0
    for i, (lo, hi) in enumerate(local):
        rail = [g * group + i for g in range(n_groups)]
        sub = [(lo + a, lo + b) for a, b in chunk_bounds(hi - lo, n_groups)]
        s = _ring_pass(out, rail, sub, steps, Op.ADD, 0, piece_elems)
        s += _ring_pass(out, rail, sub, steps + s, Op.COPY, 1, piece_elems)
    steps += s
    # 3. All-gather inside each group: member i starts with the whole of local chunk i.
    s = 0
    for members in groups:
        s = _ring_pass(out, members, local, steps, Op.COPY, 0, piece_elems)
    return steps + s
