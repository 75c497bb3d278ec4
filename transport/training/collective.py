"""The collective of one training step, behind a small interface, and the ring all-reduce behind it.

A training rank needs of its step's collective only this: start it, hand it the messages peers send,
let it act on the clock, and know when it is done (and whether its result was right). `StepCollective`
is that interface; its messages are addressed to peer ranks, so a collective that talks to every rank
(all-to-all) fits as well as the ring, which talks only to its right neighbour. A collective is looked
up by name in `COLLECTIVES`, as a factory of one rank's instance for one step.

`RingStep` runs one iteration of the ring all-reduce's `RingRank` (transport/collective/ring.py) per
step: its barrier, its iteration checked bit for bit against the reference sum, and done as soon as
the iteration is (the ring's drain is the transport's business, which goes on under the next step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Protocol

import numpy as np

from transport.collective.ring import (
    DEFAULT_PIECE_BYTES,
    DTYPE,
    Phase,
    RingProtocolError,
    RingRank,
    RingWorker,
    make_input,
    reference_from_seed,
)

Outgoing = list[tuple[int, bytes]]  # (destination rank, message)


class StepCollective(Protocol):
    """One rank's part in one step's collective, sans-I/O."""

    def start(self, now: float) -> Outgoing: ...

    def receive(self, src: int, msg: bytes, now: float) -> Outgoing: ...

    def advance(self, now: float) -> Outgoing: ...

    def wake_time(self) -> float | None: ...

    @property
    def done(self) -> bool: ...

    @property
    def correct(self) -> bool | None: ...


@dataclass(frozen=True)
class CollectiveSpec:
    """What every rank's collective of every step is: its name, the bytes per rank, the ring's pieces."""

    name: str = "allreduce"
    nbytes: int = 1 << 20
    seed: int = 0
    piece_bytes: int = DEFAULT_PIECE_BYTES

    @property
    def elements(self) -> int:
        return max(1, self.nbytes // DTYPE.itemsize)


CollectiveFactory = Callable[[CollectiveSpec, int, int], StepCollective]  # (spec, rank, n_ranks)


@lru_cache(maxsize=8)
def _ring_arrays(n_ranks: int, rank: int, elements: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The rank's input and the reference sum: the same every step, so computed once per process."""
    return make_input(seed, rank, elements), reference_from_seed(n_ranks, elements, seed)


@dataclass(eq=False)
class RingStep:
    """One step's ring all-reduce for one rank: a `RingRank` of one iteration."""

    spec: CollectiveSpec
    rank: int
    n_ranks: int
    ring: RingRank = field(init=False)

    def __post_init__(self) -> None:
        data, self._reference = _ring_arrays(self.n_ranks, self.rank, self.spec.elements, self.spec.seed)
        piece = max(1, self.spec.piece_bytes // DTYPE.itemsize)
        self.ring = RingRank(RingWorker(self.rank, self.n_ranks, data, 1, piece))
        self._right = (self.rank + 1) % self.n_ranks
        self._left = (self.rank - 1) % self.n_ranks

    def _to_right(self, msgs: list[bytes]) -> Outgoing:
        return [(self._right, m) for m in msgs]

    def start(self, now: float) -> Outgoing:
        out = self.ring.start(now, self._reference)
        return self._to_right(out + self.ring.advance(now))

    def receive(self, src: int, msg: bytes, now: float) -> Outgoing:
        if src != self._left:
            # A ring rank hears only its left neighbour; taking this would let it stand in for the real one.
            raise RingProtocolError(f"rank {self.rank}: a ring message from rank {src}, whose data it never takes "
                                    f"(its left neighbour is rank {self._left})")
        out = self.ring.receive(msg, now)
        return self._to_right(out + self.ring.advance(now))

    def advance(self, now: float) -> Outgoing:
        return self._to_right(self.ring.advance(now))

    def wake_time(self) -> float | None:
        return self.ring.wake_time()

    @property
    def done(self) -> bool:
        return self.ring.phase in (Phase.DRAIN, Phase.DONE)

    @property
    def correct(self) -> bool | None:
        return self.ring.correct


@dataclass(eq=False)
class PlanStep:
    """One step's collective from transport.collective's plans (all-to-all for a mixture-of-experts
    layer, or a hierarchical all-reduce), checked bit for bit against numpy like the ring."""

    spec: CollectiveSpec
    rank: int
    n_ranks: int
    plan: str = "all-to-all"

    def __post_init__(self) -> None:
        from transport.collective import collective

        self.coll = collective(self.plan, self.rank, list(range(self.n_ranks)), self.spec.nbytes,
                               seed=self.spec.seed)
        self._correct: bool | None = None

    def start(self, now: float) -> Outgoing:
        return [(m.dst, m.data) for m in self.coll.start(now)]

    def receive(self, src: int, msg: bytes, now: float) -> Outgoing:
        return [(m.dst, m.data) for m in self.coll.receive(msg, now)]

    def advance(self, now: float) -> Outgoing:
        return []

    def wake_time(self) -> float | None:
        return None

    @property
    def done(self) -> bool:
        return self.coll.done

    @property
    def correct(self) -> bool | None:
        return self.coll.correct if self.coll.done else None


def _all_to_all(spec: CollectiveSpec, rank: int, n_ranks: int) -> PlanStep:
    return PlanStep(spec, rank, n_ranks, "all-to-all")


COLLECTIVES: dict[str, CollectiveFactory] = {"allreduce": RingStep, "all-to-all": _all_to_all}


def make_collective(spec: CollectiveSpec, rank: int, n_ranks: int) -> StepCollective:
    try:
        factory = COLLECTIVES[spec.name]
    except KeyError:
        raise ValueError(f"unknown collective {spec.name!r}; use one of {', '.join(COLLECTIVES)}") from None
    return factory(spec, rank, n_ranks)
