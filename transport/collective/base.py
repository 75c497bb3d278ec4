"""What every collective shares: the element type, the message header, the seeded inputs, chunk and
piece boundaries, the bit-for-bit comparison, and a rank's phases as a state table.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import struct
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np

logger = logging.getLogger(__name__)
Out = TypeVar("Out")  # what a rank hands its driver to send: bare bytes in a ring, addressed messages otherwise

DTYPE = np.dtype("<f4")  # float32, little-endian on the wire whatever the host
KIND_DATA = 1
KIND_BARRIER = 2
# kind, version, step, iteration, chunk, element offset within the chunk
HEADER = struct.Struct("!BBHIII")
HEADER_VERSION = 1
DEFAULT_PIECE_BYTES = 64 * 1024


class RingProtocolError(ValueError):
    """A message that cannot belong to this ring (wrong kind, step, chunk or bounds)."""


class PieceError(RingProtocolError):
    """A data piece of this run that cannot be right: a payload that is not whole elements or not
    the size its place holds, or a second piece with the identity of one already received but other
    values. Its run's result cannot be trusted, so this ends the run (or fails the training step)
    where other protocol errors only drop the message."""


def piece_values(msg: bytes, where: str) -> np.ndarray:
    """The elements of a data piece; PieceError (naming ``where``) if its payload is not whole elements."""
    nbytes = len(msg) - HEADER.size
    if nbytes % DTYPE.itemsize:
        raise PieceError(f"{where} has {nbytes} bytes of payload, not a whole number of "
                         f"{DTYPE.itemsize}-byte {DTYPE.name} elements")
    return np.frombuffer(msg, dtype=DTYPE, offset=HEADER.size)


def piece_digest(msg: bytes) -> bytes:
    """What tells two pieces of one identity apart: a digest of the payload (a repeat is identical)."""
    return hashlib.blake2b(memoryview(msg)[HEADER.size:], digest_size=16).digest()


def make_input(seed: int, rank: int, size: int) -> np.ndarray:
    """Rank ``rank``'s input: deterministic from (seed, rank), so any process can recompute it.

    Magnitudes span several decades so that the order of float32 additions visibly matters.
    """
    rng = np.random.default_rng([seed, rank])
    mantissa = rng.standard_normal(size, dtype=np.float32)
    scale = np.float32(10.0) ** rng.integers(-3, 4, size).astype(np.float32)
    return (mantissa * scale).astype(DTYPE)


def chunk_bounds(size: int, n: int) -> list[tuple[int, int]]:
    """[start, end) of each of the n chunks, as ``np.array_split`` cuts them."""
    base, extra = divmod(size, n)
    bounds = []
    start = 0
    for c in range(n):
        end = start + base + (1 if c < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def piece_offsets(length: int, piece_elems: int) -> list[int]:
    """Element offsets of the pieces of a chunk; an empty chunk is still one (empty) piece."""
    return list(range(0, length, piece_elems)) or [0]


def first_mismatch(result: np.ndarray, expected: np.ndarray) -> dict | None:
    """None when bit-for-bit equal, else the first differing index and both values."""
    if result.shape == expected.shape and np.array_equal(result, expected):
        return None
    if result.shape != expected.shape:
        return {"index": None, "got_shape": list(result.shape), "expected_shape": list(expected.shape)}
    idx = int(np.flatnonzero(result != expected)[0])
    return {
        "index": idx,
        "got": float(result[idx]),
        "expected": float(expected[idx]),
        "differing": int(np.count_nonzero(result != expected)),
    }


def encode_barrier(round_no: int, version: int = HEADER_VERSION) -> bytes:
    return HEADER.pack(KIND_BARRIER, version, 0, round_no, 0, 0)


def decode_header(msg: bytes, expect_version: int = HEADER_VERSION) -> tuple[int, int, int, int, int]:
    """(kind, step, iteration, chunk, offset) of a ring message."""
    if len(msg) < HEADER.size:
        raise RingProtocolError(f"message of {len(msg)} bytes is shorter than the {HEADER.size}-byte header")
    kind, version, step, iteration, chunk, offset = HEADER.unpack_from(msg)
    if version != expect_version:
        raise RingProtocolError(f"header version {version}, expected {expect_version}")
    return kind, step, iteration, chunk, offset


class Iterations:
    """What a worker (`RingWorker`, `PlanWorker`) does with iterations: it runs them one at a time;
    a message of a later iteration is kept until that one starts, one of a finished iteration (a late
    duplicate) is counted as stale and dropped. The worker holds ``iteration``, ``iterations``,
    ``stale``, ``_active``, ``_pending``, ``_received`` and ``_expected``."""

    iteration: int
    iterations: int
    stale: int
    _active: bool
    _pending: dict[int, list[bytes]]
    _received: int
    _expected: int

    @property
    def iteration_done(self) -> bool:
        """The current iteration has received (and forwarded) everything it needs."""
        return self.iteration >= 0 and not self._active

    @property
    def progress(self) -> tuple[int, int]:
        """(pieces received, pieces expected) in the current iteration."""
        return self._received, self._expected

    def _next_iteration(self) -> None:
        if self._active:
            raise RuntimeError(f"iteration {self.iteration} is still in progress")
        if self.iteration + 1 >= self.iterations:
            raise RuntimeError("all iterations are done")
        self.iteration += 1

    def _admit(self, kind: int, it: int, msg: bytes) -> bool:
        """Whether a message of this ``kind`` and iteration is for the iteration in progress."""
        if kind != KIND_DATA:
            raise RingProtocolError(f"message kind {kind} is not data")
        if it >= self.iterations:
            raise RingProtocolError(f"iteration {it} is beyond the {self.iterations} of this run")
        if it > self.iteration:
            self._pending.setdefault(it, []).append(msg)
            return False
        if it < self.iteration or not self._active:
            self.stale += 1  # a late duplicate of a finished iteration
            return False
        return True


# --------------------------------------------------------------------------------------------------
# One rank's whole run: barrier, iterations, drain


class Phase(enum.StrEnum):
    """Where a rank is in its run (the value is what results files report)."""

    SETUP = "setup"  # not started
    BARRIER = "barrier"  # waiting for every rank to listen
    READY = "ready"  # the barrier is complete; waiting for the start time
    ALLREDUCE = "allreduce"  # iterations running
    DRAIN = "drain"  # every iteration done; the peers still have to acknowledge our data
    DONE = "done"


class RankEvent(enum.Enum):
    """What moves a rank from one phase to the next."""

    START = "start"  # the driver starts the rank
    BARRIER_PASS = "barrier round 1"  # a rank > 0 passes the first barrier round on
    BARRIER_COMPLETE = "barrier complete"  # the last round reached this rank: everyone listens
    BARRIER_ECHO = "barrier echo"  # rank 0 sees the last round come back round the ring
    DATA = "data"  # a piece of the array from the left neighbour
    GO = "start time"  # the start time has come: iteration 1 starts
    LAST_ITERATION = "last iteration done"
    DRAINED = "drained"  # the driver saw the right neighbour acknowledge everything


# The rank's allowed transitions, h11 style: phase -> {event: next phase}. Anything else is an error.
# Data may arrive before this rank starts its first iteration (the left neighbour started earlier);
# the RingWorker keeps it until then. Rank 0's last barrier round comes back whenever the ring is
# done with it, even after the iterations.
TRANSITIONS: dict[Phase, dict[RankEvent, Phase]] = {
    Phase.SETUP: {RankEvent.START: Phase.BARRIER},
    Phase.BARRIER: {
        RankEvent.BARRIER_PASS: Phase.BARRIER,
        RankEvent.BARRIER_COMPLETE: Phase.READY,
        RankEvent.DATA: Phase.BARRIER,
    },
    Phase.READY: {RankEvent.GO: Phase.ALLREDUCE, RankEvent.BARRIER_ECHO: Phase.READY, RankEvent.DATA: Phase.READY},
    Phase.ALLREDUCE: {
        RankEvent.LAST_ITERATION: Phase.DRAIN,
        RankEvent.BARRIER_ECHO: Phase.ALLREDUCE,
        RankEvent.DATA: Phase.ALLREDUCE,
    },
    Phase.DRAIN: {RankEvent.DRAINED: Phase.DONE, RankEvent.BARRIER_ECHO: Phase.DRAIN, RankEvent.DATA: Phase.DRAIN},
    Phase.DONE: {RankEvent.BARRIER_ECHO: Phase.DONE, RankEvent.DATA: Phase.DONE},
}


class RingStateError(RingProtocolError):
    """An event the rank's phase does not allow."""


@dataclass(eq=False)
class RankRun(Generic[Out]):
    """One rank's whole collective run, sans-I/O: the barrier, the iterations of its worker, the drain.

    The barrier: rank 0 sends round 1 round the ring; when it returns every rank is listening, and
    round 2 tells each rank (as it passes it on) to start. Rank 0 starts as it sends round 2. A rank
    then starts iteration 1 at ``start_at`` (in the driver's clock) if given, else at once. Each
    iteration's result is compared with the reference; after the last one the rank drains until the
    driver reports (``drained``) that its peers have acknowledged everything it sent.

    ``start``, ``receive`` and ``advance`` return the messages to send, in order: a subclass says how
    one is addressed (``_to_next`` for the barrier's, which go round the ring of ranks 0, 1, .., N-1;
    the worker's own for data). ``advance(now)`` starts what is due by ``now`` (iteration 1 at the
    start time, the next iteration after one completes), so a driver whose clock moves on while it compares an iteration
    with the reference can start the next one at the time the comparison ended.
    """

    worker: Any  # a RingWorker or a PlanWorker: rank, n_ranks, iterations, start_iteration(), receive()
    # Only the table moves the phase; the rest is filled in as the run goes.
    phase: Phase = field(default=Phase.SETUP, init=False)
    reference: np.ndarray | None = field(default=None, init=False)
    started: float | None = field(default=None, init=False)  # when start() was called
    start_time: float | None = field(default=None, init=False)  # iteration 1 (known after the barrier)
    barrier_s: float | None = field(default=None, init=False)
    done_at: float | None = field(default=None, init=False)  # when the last iteration completed
    iteration_times: list[float] = field(default_factory=list, init=False)
    mismatch: dict | None = field(default=None, init=False)  # the first difference: {"iteration", ...}
    correct: bool | None = field(default=None, init=False)  # known after the last iteration
    _start_at: float | None = field(default=None, init=False)
    _iteration_start: float = field(default=0.0, init=False)
    _next_due: bool = field(default=False, init=False)  # an iteration is done and the next not started
    header_version: ClassVar[int] = HEADER_VERSION  # messages of another version are not this run's

    def _to_next(self, data: bytes) -> Out:
        """A barrier message addressed to the next rank round the ring (rank + 1 mod N)."""
        raise NotImplementedError

    def _result(self) -> np.ndarray:
        """The array an iteration leaves on this rank, compared with the reference."""
        return self.worker.buf

    def _fire(self, event: RankEvent) -> None:
        try:
            self.phase = TRANSITIONS[self.phase][event]
        except KeyError:
            raise RingStateError(
                f"rank {self.worker.rank}: {event.value} is not allowed in phase {self.phase.value}"
            ) from None

    def start(self, now: float, reference: np.ndarray, start_at: float | None = None) -> list[Out]:
        """Start the barrier; ``reference`` is the array every iteration must reproduce."""
        self._fire(RankEvent.START)
        self.reference = reference
        self.started = now
        self._start_at = start_at
        if self.worker.n_ranks == 1:
            self._barrier_complete(now)  # nobody to wait for
            return []
        return [self._to_next(encode_barrier(1, self.header_version))] if self.worker.rank == 0 else []

    def receive(self, msg: bytes, now: float) -> list[Out]:
        """Handle one message from a peer (the left neighbour in a ring); RingProtocolError if it cannot be ours now."""
        kind, _, round_no, _, _ = decode_header(msg, self.header_version)
        if kind == KIND_BARRIER:
            return self._on_barrier(round_no, now)
        if kind != KIND_DATA:
            raise RingProtocolError(f"unknown message kind {kind}")
        self._fire(RankEvent.DATA)
        out = self.worker.receive(msg)
        self._check_iteration(now)
        return out

    def _on_barrier(self, round_no: int, now: float) -> list[Out]:
        if round_no not in (1, 2):
            raise RingProtocolError(f"barrier round {round_no}: there are two")
        if self.worker.rank == 0:
            if round_no == 2:
                self._fire(RankEvent.BARRIER_ECHO)
                return []
            self._barrier_complete(now)
            return [self._to_next(encode_barrier(2, self.header_version))]
        if round_no == 1:
            self._fire(RankEvent.BARRIER_PASS)
        else:
            self._barrier_complete(now)
        return [self._to_next(encode_barrier(round_no, self.header_version))]

    def _barrier_complete(self, now: float) -> None:
        self._fire(RankEvent.BARRIER_COMPLETE)
        self.barrier_s = now - (self.started or 0.0)
        self.start_time = now if self._start_at is None else max(now, self._start_at)

    def wake_time(self) -> float | None:
        """When ``advance`` next has something to do by the clock alone (the start time), if ever."""
        return self.start_time if self.phase is Phase.READY else None

    def advance(self, now: float) -> list[Out]:
        """Start iteration 1 once the start time has come, and the next iteration once one is done."""
        out: list[Out] = []
        if self.phase is Phase.READY and self.start_time is not None and now >= self.start_time:
            self._fire(RankEvent.GO)
            self._next_due = True
        while self._next_due and self.phase is Phase.ALLREDUCE:
            self._next_due = False
            self._iteration_start = now
            out.extend(self.worker.start_iteration())
            self._check_iteration(now)  # an iteration with nothing to receive is done at once
        return out

    def _check_iteration(self, now: float) -> None:
        w = self.worker
        if self.phase is not Phase.ALLREDUCE or self._next_due or not w.iteration_done:
            return
        self.iteration_times.append(now - self._iteration_start)
        bad = first_mismatch(self._result(), self.reference)  # type: ignore[arg-type]
        if bad is not None and self.mismatch is None:
            self.mismatch = {"iteration": w.iteration, **bad}
            logger.warning("rank %d iteration %d differs from the reference: %s", w.rank, w.iteration, bad)
        if w.iteration + 1 >= w.iterations:
            self.correct = self.mismatch is None
            self.done_at = now
            self._fire(RankEvent.LAST_ITERATION)
        else:
            self._next_due = True

    def drained(self) -> None:
        """The right neighbour has acknowledged everything this rank sent: the rank is done."""
        self._fire(RankEvent.DRAINED)
