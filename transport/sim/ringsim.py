"""The whole ring all-reduce in one process over simulated links, with a virtual clock.

Every rank runs the same `RingRank` (transport/collective/ring.py) as a real worker (transport/io/allreduce.py):
barrier, iterations checked against the reference, drain. Ring edge r -> r+1 is one
`transport.sim.simnet.SimNetwork` between rank r's sending Connection and rank r+1's receiving one, and
`transport.sim.simnet.drive` runs all of them, so results are deterministic for a seed and fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from transport.collective.ring import (
    DEFAULT_PIECE_BYTES,
    DTYPE,
    Phase,
    RingRank,
    RingWorker,
    make_input,
    rank_connections,
    ring_reference,
)
from transport.core.config import TransportConfig
from transport.core.events import MessageReceived
from transport.sim.simnet import PathSpec, SimNetwork, drive


@dataclass
class SimAllReduceResult:
    results: list[np.ndarray]  # every rank's final array (of the last iteration)
    reference: np.ndarray
    correct: bool
    mismatch: dict | None  # first mismatch: {"rank", "iteration", "index", "got", "expected", ...}
    iteration_times: list[list[float]]  # [rank][iteration], virtual seconds
    duration: float  # virtual seconds until the last rank finished
    completed: bool
    edges: list[dict] = field(default_factory=list)  # per edge r -> r+1: sender, receiver, network


def ring_allreduce_simulated(
    n_ranks: int,
    size: int,
    seed: int = 0,
    config: TransportConfig | None = None,
    paths: Sequence[PathSpec] | Sequence[Sequence[PathSpec]] | None = None,
    *,
    iterations: int = 1,
    inputs: Sequence[np.ndarray] | None = None,
    piece_bytes: int = DEFAULT_PIECE_BYTES,
    time_limit: float = 60.0,
) -> SimAllReduceResult:
    """Run the ring for all ranks over simulated links (virtual clock, deterministic for a seed).

    Every rank runs the same `RingRank` as a real worker: the barrier, the iterations, the drain.
    ``paths`` are the paths of every ring edge (one SimNetwork per edge), or a list of path lists,
    one per edge r -> r+1. ``inputs`` overrides the seeded inputs (one array per rank).
    """
    if n_ranks < 1:
        raise ValueError("n_ranks must be >= 1")
    config = config or TransportConfig()
    config.validate()
    if inputs is None:
        inputs = [make_input(seed, r, size) for r in range(n_ranks)]
    if len(inputs) != n_ranks or any(len(x) != size for x in inputs):
        raise ValueError(f"inputs must be {n_ranks} arrays of {size} elements")
    reference = ring_reference(inputs)
    per_edge: list[list[PathSpec]]
    if not paths:
        per_edge = [[PathSpec()] for _ in range(n_ranks)]
    elif isinstance(paths[0], PathSpec):
        per_edge = [list(paths) for _ in range(n_ranks)]  # type: ignore[arg-type]
    else:
        per_edge = [list(p) for p in paths]  # type: ignore[arg-type]
        if len(per_edge) != n_ranks:
            raise ValueError(f"give one path list per edge ({n_ranks}), got {len(per_edge)}")

    piece_elems = max(1, piece_bytes // DTYPE.itemsize)
    ranks = [RingRank(RingWorker(r, n_ranks, inputs[r], iterations, piece_elems)) for r in range(n_ranks)]
    nets = [SimNetwork(per_edge[r], seed=seed * 7919 + r) for r in range(n_ranks)]
    # Edge r joins send[r] (side 0 of nets[r]) to recv[r+1] (side 1 of nets[r]); in the list drive
    # runs, send[r] is connection r and recv[r] connection n_ranks + r.
    pairs = [rank_connections(config, n_ranks, r, seed) for r in range(n_ranks)]
    send = [pair[0] for pair in pairs]
    recv = [pair[1] for pair in pairs]
    joins = [(nets[r], r, n_ranks + (r + 1) % n_ranks) for r in range(n_ranks)]
    mismatch: dict | None = None

    def submit(r: int, msgs: list[bytes], now: float) -> None:
        for m in msgs:
            send[r].send_message(m, now)

    def advance(r: int, now: float) -> None:
        nonlocal mismatch
        submit(r, ranks[r].advance(now), now)
        if mismatch is None and ranks[r].mismatch is not None:
            mismatch = {"rank": r, **ranks[r].mismatch}

    def on_event(i: int, event: object, now: float) -> None:
        if i >= n_ranks and isinstance(event, MessageReceived):
            r = i - n_ranks
            submit(r, ranks[r].receive(event.data, now), now)
            advance(r, now)

    def drained(now: float) -> None:
        # The simulation runs every connection until the whole ring is done, so a rank is done as
        # soon as its data is acknowledged: no linger for a lost final ACK is needed.
        for r, rank in enumerate(ranks):
            if rank.phase is Phase.DRAIN and send[r].idle:
                rank.drained()

    for r in range(n_ranks):
        submit(r, ranks[r].start(0.0, reference), 0.0)
        advance(r, 0.0)
    now = drive([*send, *recv], joins, done=lambda: all(rank.phase is Phase.DONE for rank in ranks),
                time_limit=time_limit, on_event=on_event, check=drained)

    completed = all(rank.phase is Phase.DONE for rank in ranks)
    edges = [
        {
            "edge": f"{r}->{(r + 1) % n_ranks}",
            "sender": send[r].metrics(),
            "receiver": recv[(r + 1) % n_ranks].metrics(),
            "network": nets[r].link_stats(),
        }
        for r in range(n_ranks)
    ]
    return SimAllReduceResult(
        results=[rank.worker.buf.copy() for rank in ranks],
        reference=reference,
        correct=completed and mismatch is None,
        mismatch=mismatch if completed else (mismatch or {"error": f"not finished within {time_limit} s"}),
        iteration_times=[rank.iteration_times for rank in ranks],
        duration=now,
        completed=completed,
        edges=edges,
    )
