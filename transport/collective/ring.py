"""Ring all-reduce as a pure, sans-I/O state machine, plus the reference sum it must reproduce bit for bit.

Rank r of N sends only to rank r+1 and receives only from rank r-1. The array is cut into N chunks
(``np.array_split`` boundaries) and each chunk into pieces of at most ``piece_elems`` elements; a piece
is one transport message. With global step g = 0 .. 2N-3:

* reduce-scatter (g < N-1): send chunk (r - g) mod N, receive chunk (r - g - 1) mod N and add it to
  the local copy;
* all-gather (g = N-1+s): send chunk (r + 1 - s) mod N, receive chunk (r - s) mod N and store it.

The chunk sent at step g is always the one received at step g-1 (at g = 0 it is the local chunk r), so
each received piece is forwarded as soon as it is processed: pieces pipeline around the ring instead of
waiting for whole chunks. Chunk c is therefore summed in the rank order c, c+1, ..., c+N-1 (mod N),
left to right in float32, which is what ``ring_reference`` computes.

``RingWorker`` moves the pieces of one rank; ``RingRank`` runs the rank's whole all-reduce around it
as a small state table (h11 style): a barrier, the iterations, each checked against the reference, and
a drain. The real worker (transport/io/allreduce.py) and the simulated ring both drive ``RingRank``.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from transport.collective.base import (
    DEFAULT_PIECE_BYTES,
    DTYPE,
    HEADER,
    HEADER_VERSION,
    KIND_BARRIER,
    KIND_DATA,
    TRANSITIONS,
    Iterations,
    Phase,
    PieceError,
    RankEvent,
    RankRun,
    RingProtocolError,
    RingStateError,
    chunk_bounds,
    decode_header,
    encode_barrier,
    first_mismatch,
    make_input,
    piece_digest,
    piece_offsets,
    piece_values,
)
from transport.core.config import TransportConfig
from transport.core.connection import Connection

# The ring's own names and what it has always offered its users from the shared base.
__all__ = [
    "DEFAULT_PIECE_BYTES", "DTYPE", "HEADER", "HEADER_VERSION", "KIND_BARRIER", "KIND_DATA", "TRANSITIONS",
    "Phase", "PieceError", "RankEvent", "RingProtocolError", "RingRank", "RingStateError", "RingWorker", "chunk_bounds",
    "decode_header", "edge_connection_id", "encode_barrier", "first_mismatch", "make_input", "piece_offsets",
    "rank_connections", "reference_from_seed", "ring_reference",
]

def ring_reference(inputs: Sequence[np.ndarray]) -> np.ndarray:
    """The all-reduced array exactly as the ring computes it: chunk c = x_c + x_{c+1} + ... (mod N)."""
    n = len(inputs)
    size = len(inputs[0])
    out = np.empty(size, dtype=DTYPE)
    for c, (lo, hi) in enumerate(chunk_bounds(size, n)):
        acc = np.asarray(inputs[c][lo:hi], dtype=DTYPE).copy()
        for k in range(1, n):
            acc = acc + np.asarray(inputs[(c + k) % n][lo:hi], dtype=DTYPE)
        out[lo:hi] = acc
    return out


def reference_from_seed(n: int, size: int, seed: int, make: Callable[[int, int, int], np.ndarray] = make_input
                        ) -> np.ndarray:
    """``ring_reference`` of the seeded inputs, holding only one input at a time in memory.

    Pass 1 walks ranks 0..N-1 and extends every chunk c <= k (whose order starts at rank c); pass 2
    walks ranks 0..N-2 again and finishes the chunks c > k (whose order wraps round to rank 0).
    """
    bounds = chunk_bounds(size, n)
    out = np.zeros(size, dtype=DTYPE)
    for k in range(n):
        x = make(seed, k, size)
        for c in range(k + 1):
            lo, hi = bounds[c]
            out[lo:hi] = x[lo:hi] if c == k else out[lo:hi] + x[lo:hi]
    for k in range(n - 1):
        x = make(seed, k, size)
        for c in range(k + 1, n):
            lo, hi = bounds[c]
            out[lo:hi] = out[lo:hi] + x[lo:hi]
    return out


def edge_connection_id(n_ranks: int, seed: int, sender_rank: int) -> int:
    """The connection id of the ring edge sender_rank -> sender_rank+1, agreed without talking: the
    simulated ring's. The worker over UDP draws one per start instead (transport/io/incarnation.py),
    so that a restarted rank is never matched to the state its old self left at its neighbour."""
    return zlib.crc32(f"fabriclab-allreduce:{n_ranks}:{seed}:{sender_rank}".encode()) or 1


def rank_connections(config: TransportConfig, n_ranks: int, rank: int, seed: int) -> tuple[Connection, Connection]:
    """Rank ``rank``'s two transport connections: to its right neighbour and from its left one."""
    send = Connection(config, edge_connection_id(n_ranks, seed, rank), seed=seed * 1000 + 2 * rank)
    recv = Connection(config, edge_connection_id(n_ranks, seed, (rank - 1) % n_ranks), seed=seed * 1000 + 2 * rank + 1)
    return send, recv


@dataclass(eq=False)
class RingWorker(Iterations):
    """One rank's side of the ring, over any number of iterations of the same input.

    ``start_iteration()`` and ``receive()`` return the messages to send to the right neighbour, in
    order. Messages of a later iteration that arrive early are buffered until it starts.
    """

    rank: int
    n_ranks: int
    data: np.ndarray
    iterations: int = 1
    piece_elems: int = DEFAULT_PIECE_BYTES // DTYPE.itemsize
    iteration: int = -1  # the iteration in progress (or last finished); -1 before the first
    buf: np.ndarray = field(init=False)
    duplicates: int = 0
    stale: int = 0
    _pending: dict[int, list[bytes]] = field(default_factory=dict, init=False)
    _seen: dict[tuple[int, int], bytes] = field(default_factory=dict, init=False)  # (step, offset) -> digest
    _received: int = 0
    _expected: int = 0
    _active: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.n_ranks:
            raise ValueError(f"rank {self.rank} is outside 0..{self.n_ranks - 1}")
        if self.piece_elems < 1:
            raise ValueError("piece_elems must be >= 1")
        self.data = np.ascontiguousarray(self.data, dtype=DTYPE)
        self.buf = self.data.copy()
        self.bounds = chunk_bounds(len(self.data), self.n_ranks)
        self._pieces = [piece_offsets(hi - lo, self.piece_elems) for lo, hi in self.bounds]
        n = self.n_ranks
        self._steps = 2 * (n - 1)
        self._recv_chunk = [self.recv_chunk(g) for g in range(self._steps)]
        self._expected = sum(len(self._pieces[c]) for c in self._recv_chunk)

    # -- schedule -------------------------------------------------------------------------------------

    def send_chunk(self, g: int) -> int:
        n, r = self.n_ranks, self.rank
        return (r - g) % n if g < n - 1 else (r + 1 - (g - (n - 1))) % n

    def recv_chunk(self, g: int) -> int:
        n, r = self.n_ranks, self.rank
        return (r - g - 1) % n if g < n - 1 else (r - (g - (n - 1))) % n

    # -- state ------------------------------------------------------------------------------------------

    def start_iteration(self) -> list[bytes]:
        self._next_iteration()
        self.buf[:] = self.data
        self._seen.clear()
        self._received = 0
        self._active = self._expected > 0
        out: list[bytes] = []
        if not self._active:
            return out
        c = self.send_chunk(0)
        for off in self._pieces[c]:
            out.append(self._piece(0, c, off))
        for msg in self._pending.pop(self.iteration, []):
            out.extend(self.receive(msg))
        return out

    def _piece(self, g: int, c: int, off: int) -> bytes:
        lo = self.bounds[c][0] + off
        hi = min(lo + self.piece_elems, self.bounds[c][1])
        return HEADER.pack(KIND_DATA, HEADER_VERSION, g, self.iteration, c, off) + self.buf[lo:hi].tobytes()

    def receive(self, msg: bytes) -> list[bytes]:
        """Process one data message from the left neighbour; returns what to forward to the right."""
        kind, g, it, c, off = decode_header(msg)
        if kind != KIND_DATA:
            raise RingProtocolError(f"message kind {kind} is not data")
        # The piece is checked whole before it is kept for a later iteration or recorded, so that a
        # malformed copy never makes the genuine one a duplicate, and a kept one is known to be sound.
        if not 0 <= g < self._steps or c != self._recv_chunk[g]:
            raise RingProtocolError(f"rank {self.rank} got chunk {c} at step {g}, expected "
                                    f"{self._recv_chunk[g] if 0 <= g < self._steps else 'no step'}")
        lo_c, hi_c = self.bounds[c]
        where = f"rank {self.rank}: the piece of iteration {it}, step {g}, chunk {c}, offset {off}"
        if off % self.piece_elems or (off and off >= hi_c - lo_c):
            raise RingProtocolError(f"{where} is not a piece of the chunk")
        values = piece_values(msg, where)
        lo = lo_c + off
        hi = lo + len(values)
        if hi != min(lo + self.piece_elems, hi_c):
            raise PieceError(f"{where} has {len(values)} elements, expected {min(lo + self.piece_elems, hi_c) - lo}")
        if not self._admit(kind, it, msg):
            return []
        # A piece is identified by (step, offset) in this iteration (its chunk follows from the step and
        # its sender is the left neighbour): a repeat is dropped, other values under that identity refused.
        key = (g, off)
        digest = piece_digest(msg)
        seen = self._seen.get(key)
        if seen is not None:
            if seen != digest:
                raise PieceError(f"{where} arrived again with other values than the first copy")
            self.duplicates += 1
            return []
        self._seen[key] = digest
        if g < self.n_ranks - 1:
            view = self.buf[lo:hi]
            np.add(view, values, out=view)  # float addition is commutative, so x + y == y + x exactly
        else:
            self.buf[lo:hi] = values
        self._received += 1
        if self._received == self._expected:
            self._active = False
        if g + 1 < self._steps:
            return [self._piece(g + 1, c, off)]
        return []


@dataclass(eq=False)
class RingRank(RankRun[bytes]):
    """One rank's whole all-reduce, sans-I/O: the barrier, the iterations of its `RingWorker`, the drain
    (the table and its rules are `RankRun`'s, in transport/collective/base.py).

    Every message goes to the right neighbour, so ``start``, ``receive`` and ``advance`` return bare
    payloads, in order.
    """

    worker: RingWorker

    def _to_next(self, data: bytes) -> bytes:
        return data
