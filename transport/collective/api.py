"""The collectives as objects a driver or a workload holds, one per rank, sans-I/O.

`Collective` is what a workload (a training step) uses: ``collective(name, rank, peers, nbytes)``
gives one; ``start(now)`` begins the next operation and returns the first messages, ``receive(data,
now)`` takes any message from any peer and returns what to send on, ``done`` says the operation is
over on this rank. Messages are `Message(dst, data)`, ``dst`` an index into ``peers``. Its phases:

=========  =================================  ===========================================
phase      event                              next phase
=========  =================================  ===========================================
IDLE       START (start())                    RUNNING
IDLE       DATA (a peer is already ahead)     IDLE (kept for the next operation)
RUNNING    DATA                               RUNNING
RUNNING    COMPLETE (not the last operation)  IDLE
RUNNING    LAST (the last operation)          FINISHED
FINISHED   DATA (a late duplicate)            FINISHED
=========  =================================  ===========================================

Anything else (start() while an operation runs or after the last) raises `CollectiveStateError`.

`CollectiveRank` is the measured run that `fabriclab allreduce --collective` and the simulation
drive: `RankRun`'s barrier, iterations checked against the reference, and drain (transport/collective/base.py),
around the same `PlanWorker`.
"""

from __future__ import annotations

import enum
import logging
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from transport.collective.base import DEFAULT_PIECE_BYTES, DTYPE, RankRun, RingStateError, first_mismatch
from transport.collective.plan import Plan, build_plan, canonical, make_int_input
from transport.collective.worker import PLAN_HEADER_VERSION, Message, PlanWorker
from transport.core.config import TransportConfig
from transport.core.connection import Connection

logger = logging.getLogger(__name__)


def expected_from_seed(plan: Plan, rank: int, seed: int) -> np.ndarray:
    """Rank ``rank``'s result computed from the seeded inputs (`make_int_input`) one rank at a time, so
    a worker never holds every input at once; numpy's, bit for bit, since the values are integers."""
    n, size = plan.n_ranks, plan.size
    chunks = plan.chunks
    if plan.name == "all-gather":
        out = np.empty(size, dtype=DTYPE)
        for c, (lo, hi) in enumerate(chunks):
            out[lo:hi] = make_int_input(seed, c, size)[lo:hi]
        return out
    if plan.name == "all-to-all":
        lo, hi = chunks[rank]
        return np.concatenate([make_int_input(seed, s, size)[lo:hi] for s in range(n)]).astype(DTYPE)
    total = np.zeros(size, dtype=DTYPE)
    for s in range(n):
        total += make_int_input(seed, s, size)
    if plan.name == "reduce-scatter":
        lo, hi = chunks[rank]
        return total[lo:hi].copy()
    return total


def pair_connection_id(plan: Plan, seed: int, src: int, dst: int) -> int:
    """The connection id of the pair src -> dst of a plan collective, agreed without talking."""
    return zlib.crc32(f"fabriclab-{plan.name}:{plan.n_ranks}:{plan.group}:{seed}:{src}:{dst}".encode()) or 1


def pair_connections(config: TransportConfig, plan: Plan, src: int, dst: int,
                     seed: int) -> tuple[Connection, Connection]:
    """The sending (at ``src``) and receiving (at ``dst``) Connection of the pair src -> dst."""
    cid = pair_connection_id(plan, seed, src, dst)
    base = seed * 1_000_003 + 2 * (src * plan.n_ranks + dst)
    return Connection(config, cid, seed=base), Connection(config, cid, seed=base + 1)


@dataclass(eq=False)
class CollectiveRank(RankRun[Message]):
    """One rank's measured run of a plan collective: barrier, iterations, drain (RankRun's table)."""

    worker: PlanWorker
    header_version: ClassVar[int] = PLAN_HEADER_VERSION

    def _to_next(self, data: bytes) -> Message:
        return Message((self.worker.rank + 1) % self.worker.n_ranks, data)

    def _result(self) -> np.ndarray:
        return self.worker.result


# --------------------------------------------------------------------------------------------------
# The workload's object


class OpPhase(enum.StrEnum):
    IDLE = "idle"
    RUNNING = "running"
    FINISHED = "finished"


class OpEvent(enum.Enum):
    START = "start"
    DATA = "data"
    COMPLETE = "operation complete"
    LAST = "last operation complete"


OP_TRANSITIONS: dict[OpPhase, dict[OpEvent, OpPhase]] = {
    OpPhase.IDLE: {OpEvent.START: OpPhase.RUNNING, OpEvent.DATA: OpPhase.IDLE},
    OpPhase.RUNNING: {OpEvent.DATA: OpPhase.RUNNING, OpEvent.COMPLETE: OpPhase.IDLE, OpEvent.LAST: OpPhase.FINISHED},
    OpPhase.FINISHED: {OpEvent.DATA: OpPhase.FINISHED},
}


class CollectiveStateError(RingStateError):
    """An event the collective's phase does not allow (start() while running, or after the last)."""


@dataclass(eq=False)
class Collective:
    """One rank of a collective for a workload: a sequence of ``operations`` of the same collective.

    ``start(now)`` begins the next operation; feed every message addressed to this rank to
    ``receive(data, now)`` (messages of the next operation may come before this rank starts it: they
    are kept); send every returned `Message` to ``peers[msg.dst]``. ``done`` is True once the current
    operation is over here; ``op_times`` holds each operation's duration. With ``check`` every result is
    compared bit for bit with numpy's (`correct`, `mismatch`).
    """

    worker: PlanWorker
    peers: list[Any]
    nbytes: int
    seed: int = 0
    check: bool = True
    phase: OpPhase = field(default=OpPhase.IDLE, init=False)
    op_times: list[float] = field(default_factory=list, init=False)
    mismatch: dict | None = field(default=None, init=False)
    _started_at: float = field(default=0.0, init=False)
    _expected: np.ndarray | None = field(default=None, init=False)

    def _fire(self, event: OpEvent) -> None:
        try:
            self.phase = OP_TRANSITIONS[self.phase][event]
        except KeyError:
            raise CollectiveStateError(f"rank {self.rank}: {event.value} is not allowed in phase "
                                       f"{self.phase.value}") from None

    @property
    def name(self) -> str:
        return self.worker.plan.name

    @property
    def rank(self) -> int:
        return self.worker.rank

    @property
    def done(self) -> bool:
        """The current (or last) operation is over on this rank."""
        return self.phase is not OpPhase.RUNNING and self.worker.iteration >= 0

    @property
    def finished(self) -> bool:
        return self.phase is OpPhase.FINISHED

    @property
    def sends_to(self) -> list[int]:
        """The ranks this one sends data to (a connection each), besides none for the barrier."""
        return self.worker.peers_to

    @property
    def receives_from(self) -> list[int]:
        return self.worker.peers_from

    @property
    def correct(self) -> bool | None:
        if not self.check or not self.op_times:
            return None
        return self.mismatch is None

    def result(self) -> np.ndarray:
        return self.worker.result

    def start(self, now: float) -> list[Message]:
        self._fire(OpEvent.START)
        self._started_at = now
        out = self.worker.start_iteration()
        self._settle(now)
        return out

    def receive(self, data: bytes, now: float) -> list[Message]:
        """Handle one message from any peer; RingProtocolError if it cannot belong to this collective."""
        self._fire(OpEvent.DATA)
        out = self.worker.receive(data)
        self._settle(now)
        return out

    def _settle(self, now: float) -> None:
        w = self.worker
        if self.phase is not OpPhase.RUNNING or not w.iteration_done:
            return
        self.op_times.append(now - self._started_at)
        if self.check:
            if self._expected is None:
                self._expected = expected_from_seed(w.plan, w.rank, self.seed)
            bad = first_mismatch(w.result, self._expected)
            if bad is not None and self.mismatch is None:
                self.mismatch = {"operation": w.iteration, **bad}
                logger.warning("rank %d operation %d of %s differs from numpy: %s", w.rank, w.iteration,
                               self.name, bad)
        self._fire(OpEvent.LAST if w.iteration + 1 >= w.iterations else OpEvent.COMPLETE)


def elements_of(nbytes: int) -> int:
    """float32 elements holding ``nbytes`` (rounded up; at least one)."""
    if nbytes < 1:
        raise ValueError(f"{nbytes} bytes: a collective moves at least one element")
    return max(1, math.ceil(nbytes / DTYPE.itemsize))


def collective(name: str, rank: int, peers: Sequence[Any], nbytes: int, *, group: int = 1,
               operations: int = 1, seed: int = 0, piece_bytes: int = DEFAULT_PIECE_BYTES,
               check: bool = True) -> Collective:
    """Rank ``rank``'s `Collective` ``name`` (ring/all-reduce, reduce-scatter, all-gather, all-to-all,
    hierarchical with ``group`` ranks per group) of ``nbytes`` bytes of float32 over ``peers`` (one
    entry per rank, in rank order; anything the driver uses to address them), for ``operations``
    operations. Inputs are `make_int_input(seed, rank, ...)`; every rank must agree on all arguments."""
    plan = build_plan(canonical(name), len(peers), elements_of(nbytes), group=group,
                      piece_elems=max(1, piece_bytes // DTYPE.itemsize))
    worker = PlanWorker(plan, rank, make_int_input(seed, rank, plan.size), operations)
    return Collective(worker, list(peers), nbytes, seed, check)
