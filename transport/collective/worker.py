"""One rank's part of a collective plan (transport/collective/plan.py), sans-I/O, like `RingWorker`.

The rank's operations are the plan's transfers it sends (a send reads its buffer) and receives (a
receive adds to it or overwrites it). Messages may arrive in any order, early, late or twice; the
result is the same bit for bit because of two rules, checked when the plan is loaded:

* an operation at step g waits for every operation of this rank at an earlier step that touches an
  overlapping region: a send for the receives that change what it reads, a receive for the sends that
  must read the region first and for the receives that must change it first. So the additions into
  any element happen in step order, whatever the network does;
* at one step no send and receive of a rank overlap (the plans never need it).

A plan with ``sync_steps`` (all-to-all) also holds a rank's sends of step g until all its receives
of step g-1 are in: the pairwise exchange's pacing, not needed for the result.

A send goes out as soon as what it waits for is done, so pieces pipeline through the steps; a
receive whose message came before its turn keeps the message until then. Messages of a later
iteration wait for it to start; those of a finished iteration, and duplicates, are counted and
dropped.

Each message is one piece: the ring's header (version 2) holding the step, the iteration, the
sender's rank and the element offset in the receiver's buffer, then the float32 values.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from transport.collective.base import (
    DTYPE,
    HEADER,
    KIND_DATA,
    Iterations,
    PieceError,
    RingProtocolError,
    decode_header,
    piece_digest,
    piece_values,
)
from transport.collective.plan import Op, Plan

PLAN_HEADER_VERSION = 2  # a ring worker (version 1) and a plan worker never take each other's messages


class Message(NamedTuple):
    """A message for rank ``dst`` (an index into the run's peers)."""

    dst: int
    data: bytes


@dataclass(frozen=True, slots=True)
class _Op:
    step: int
    send: bool
    peer: int
    lo: int  # region in this rank's buffer
    hi: int
    remote_lo: int  # sends: offset in the receiver's buffer
    op: Op


def _dependencies(ops: list[_Op], sync_steps: bool = False) -> list[list[int]]:
    """For every op, the earlier-step ops it waits for (see the module's rules)."""
    by_lo = sorted(range(len(ops)), key=lambda i: ops[i].lo)
    los = [ops[i].lo for i in by_lo]
    longest = max((o.hi - o.lo for o in ops), default=0)
    deps: list[list[int]] = [[] for _ in ops]
    for i, o in enumerate(ops):
        # Candidates start before o ends and no more than the longest op before o starts.
        start = bisect_left(los, o.lo - longest + 1)
        end = bisect_left(los, o.hi)
        for j in by_lo[start:end]:
            p = ops[j]
            if p.hi <= o.lo or p.lo >= o.hi:
                continue
            if p.step == o.step:
                if p.send != o.send:
                    raise ValueError(f"the plan sends and receives an overlapping region at step {o.step}")
                continue
            if p.step < o.step and (not o.send or not p.send):
                deps[i].append(j)
    if sync_steps:
        recvs_at: dict[int, list[int]] = {}
        for j, p in enumerate(ops):
            if not p.send:
                recvs_at.setdefault(p.step, []).append(j)
        for i, o in enumerate(ops):
            if o.send:
                deps[i] = sorted(set(deps[i]) | set(recvs_at.get(o.step - 1, [])))
    return deps


@dataclass(eq=False)
class PlanWorker(Iterations):
    """One rank's part of ``plan`` over any number of iterations of the same input.

    ``start_iteration()`` and ``receive()`` return the messages to send, each addressed to a rank.
    """

    plan: Plan
    rank: int
    data: np.ndarray
    iterations: int = 1
    iteration: int = -1  # the iteration in progress (or last finished); -1 before the first
    duplicates: int = 0
    stale: int = 0
    buf: np.ndarray = field(init=False)
    _pending: dict[int, list[bytes]] = field(default_factory=dict, init=False)
    _active: bool = False

    def __post_init__(self) -> None:
        n = self.plan.n_ranks
        if not 0 <= self.rank < n:
            raise ValueError(f"rank {self.rank} is outside 0..{n - 1}")
        self.n_ranks = n
        self.data = np.ascontiguousarray(self.data, dtype=DTYPE)
        if len(self.data) != self.plan.size:
            raise ValueError(f"input of {len(self.data)} elements, the plan moves {self.plan.size}")
        r = self.rank
        ops: list[_Op] = []
        for t in self.plan.transfers:
            if t.src == r:
                ops.append(_Op(t.step, True, t.dst, t.src_lo, t.src_lo + t.length, t.dst_lo, t.op))
            if t.dst == r:
                ops.append(_Op(t.step, False, t.src, t.dst_lo, t.dst_lo + t.length, 0, t.op))
        self._ops = ops
        deps = _dependencies(ops, self.plan.sync_steps)
        self._wait0 = [len(d) for d in deps]
        self._dependents: list[list[int]] = [[] for _ in ops]
        for i, d in enumerate(deps):
            for j in d:
                self._dependents[j].append(i)
        # A received message names its op by (sender, step, offset in our buffer).
        self._recv_index = {(o.peer, o.step, o.lo): i for i, o in enumerate(ops) if not o.send}
        self._expected = len(self._recv_index)
        self.buf = self.plan.load(r, self.data)
        self._reset()

    def _reset(self) -> None:
        self._wait = list(self._wait0)
        self._done = [False] * len(self._ops)
        self._held: dict[int, np.ndarray] = {}
        self._digests: dict[int, bytes] = {}  # receive op -> digest of the piece it took
        self._received = 0

    # -- state --------------------------------------------------------------------------------------

    @property
    def result(self) -> np.ndarray:
        return self.plan.result(self.rank, self.buf)

    @property
    def peers_to(self) -> list[int]:
        return sorted({o.peer for o in self._ops if o.send})

    @property
    def peers_from(self) -> list[int]:
        return sorted({o.peer for o in self._ops if not o.send})

    # -- running --------------------------------------------------------------------------------------

    def start_iteration(self) -> list[Message]:
        self._next_iteration()
        self.buf = self.plan.load(self.rank, self.data)
        self._reset()
        self._active = self._expected > 0
        out: list[Message] = []
        ready = [i for i, w in enumerate(self._wait) if w == 0 and self._ops[i].send]
        self._run(ready, out)
        for msg in self._pending.pop(self.iteration, []):
            out.extend(self.receive(msg))
        return out

    def receive(self, msg: bytes) -> list[Message]:
        """Process one data message from any peer; returns what to send on."""
        kind, step, it, src, lo = decode_header(msg, PLAN_HEADER_VERSION)
        if kind != KIND_DATA:
            raise RingProtocolError(f"message kind {kind} is not data")
        # The piece is checked whole before it is kept for a later iteration or recorded, so that a
        # malformed copy never makes the genuine one a duplicate, and a kept one is known to be sound.
        i = self._recv_index.get((src, step, lo))
        if i is None:
            raise RingProtocolError(f"rank {self.rank} expects nothing from rank {src} at step {step} "
                                    f"for offset {lo}")
        o = self._ops[i]
        where = f"rank {self.rank}: the piece from rank {src} of iteration {it}, step {step}, offset {lo}"
        values = piece_values(msg, where)
        if len(values) != o.hi - o.lo:
            raise PieceError(f"{where} has {len(values)} elements, expected {o.hi - o.lo}")
        if not self._admit(kind, it, msg):
            return []
        # A piece is identified by (sender, step, offset): a repeat is dropped, other values refused.
        digest = piece_digest(msg)
        seen = self._digests.get(i)
        if seen is not None:
            if seen != digest:
                raise PieceError(f"{where} arrived again with other values than the first copy")
            self.duplicates += 1
            return []
        self._digests[i] = digest
        out: list[Message] = []
        if self._wait[i]:
            self._held[i] = values  # its turn comes when the earlier steps are done here
            return out
        self._apply(i, values)
        self._run(self._release(i), out)
        return out

    def _apply(self, i: int, values: np.ndarray) -> None:
        o = self._ops[i]
        view = self.buf[o.lo:o.hi]
        if o.op is Op.ADD:
            np.add(view, values, out=view)
        else:
            view[:] = values
        self._done[i] = True
        self._received += 1
        if self._received == self._expected:
            self._active = False

    def _release(self, i: int) -> list[int]:
        """The ops that op i was the last to wait for."""
        freed = []
        for j in self._dependents[i]:
            self._wait[j] -= 1
            if self._wait[j] == 0:
                freed.append(j)
        return freed

    def _run(self, ready: list[int], out: list[Message]) -> None:
        """Do every op in ``ready`` that can be done now, and what they in turn free, in step order."""
        work = sorted(ready, key=lambda j: (self._ops[j].step, j), reverse=True)
        while work:
            j = work.pop()
            o = self._ops[j]
            if o.send:
                data = HEADER.pack(KIND_DATA, PLAN_HEADER_VERSION, o.step, self.iteration, self.rank, o.remote_lo)
                out.append(Message(o.peer, data + self.buf[o.lo:o.hi].tobytes()))
                self._done[j] = True
            elif j in self._held:
                self._apply(j, self._held.pop(j))
            else:
                continue  # its message has not come yet
            freed = self._release(j)
            if freed:
                work.extend(freed)
                work.sort(key=lambda k: (self._ops[k].step, k), reverse=True)
