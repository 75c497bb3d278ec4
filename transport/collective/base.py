"""What every collective shares: the element type, the message header, the seeded inputs, chunk and
piece boundaries, the bit-for-bit comparison, and a rank's phases as a state table.
"""

from __future__ import annotations

import enum
import struct

import numpy as np

DTYPE = np.dtype("<f4")  # float32, little-endian on the wire whatever the host
KIND_DATA = 1
KIND_BARRIER = 2
# kind, version, step, iteration, chunk, element offset within the chunk
HEADER = struct.Struct("!BBHIII")
HEADER_VERSION = 1
DEFAULT_PIECE_BYTES = 64 * 1024


class RingProtocolError(ValueError):
    """A message that cannot belong to this ring (wrong kind, step, chunk or bounds)."""


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


def encode_barrier(round_no: int) -> bytes:
    return HEADER.pack(KIND_BARRIER, HEADER_VERSION, 0, round_no, 0, 0)


def decode_header(msg: bytes) -> tuple[int, int, int, int, int]:
    """(kind, step, iteration, chunk, offset) of a ring message."""
    if len(msg) < HEADER.size:
        raise RingProtocolError(f"message of {len(msg)} bytes is shorter than the {HEADER.size}-byte header")
    kind, version, step, iteration, chunk, offset = HEADER.unpack_from(msg)
    if version != HEADER_VERSION:
        raise RingProtocolError(f"header version {version}, expected {HEADER_VERSION}")
    return kind, step, iteration, chunk, offset


# --------------------------------------------------------------------------------------------------
# One rank's whole run: barrier, iterations, drain


class Phase(enum.StrEnum):
    """Where a rank is in its run (the value is what results files report)."""

    SETUP = "setup"  # not started
    BARRIER = "barrier"  # waiting for every rank to listen
    READY = "ready"  # the barrier is complete; waiting for the start time
    ALLREDUCE = "allreduce"  # iterations running
    DRAIN = "drain"  # every iteration done; the right neighbour still has to acknowledge our data
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
