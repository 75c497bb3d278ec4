"""Any plan collective (transport/collective/plan.py) for all ranks in one process, with a virtual clock.

Every rank runs the same `CollectiveRank` as a live worker (transport/io/collective.py): barrier,
iterations checked bit for bit against numpy, drain. Each (sender, receiver) pair of the plan is one
pair of Connections, and every pair crosses the same one-switch `Fabric` (transport/sim/fabric.py), so a
rank's port is shared by all its peers as a real NIC is. Deterministic for a seed.

`SimCollectiveGroup` runs a workload's `Collective` objects (transport/collective/api.py) the same way,
one operation at a time, over Connections that last the whole job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from transport.collective.api import Collective, CollectiveRank, pair_connections
from transport.collective.base import DEFAULT_PIECE_BYTES, DTYPE, Phase
from transport.collective.plan import Plan, build_plan, make_int_input
from transport.collective.report import Bound, Row, bound
from transport.collective.worker import PlanWorker
from transport.core.config import TransportConfig
from transport.core.connection import Connection
from transport.core.events import MessageReceived
from transport.sim.fabric import Fabric, SwitchSpec, uniform
from transport.sim.simnet import drive


def _wire(plan: Plan, pairs: Sequence[tuple[int, int]], net: Fabric, config: TransportConfig,
          seed: int) -> tuple[list[Connection], list, dict[tuple[int, int], Connection], dict[int, int]]:
    """Connections for every (src, dst) pair over ``net``: connection 2e sends pair e's data (at rank
    src), connection 2e+1 receives it (at rank dst). Returns the connections, drive()'s joins, the
    sending connection of each pair and the rank at each receiving connection's index."""
    conns: list[Connection] = []
    joins = []
    send: dict[tuple[int, int], Connection] = {}
    receiver_of: dict[int, int] = {}
    for e, (src, dst) in enumerate(pairs):
        s, r = pair_connections(config, plan, src, dst, seed)
        conns += [s, r]
        send[(src, dst)] = s
        receiver_of[2 * e + 1] = dst
        joins.append((net.pair(src, dst), 2 * e, 2 * e + 1))
    return conns, joins, send, receiver_of


@dataclass
class SimCollectiveResult:
    name: str
    results: list[np.ndarray]  # every rank's result (of the last iteration)
    expected: list[np.ndarray]
    correct: bool
    mismatch: dict | None  # first mismatch: {"rank", "iteration", "index", ...}
    iteration_times: list[list[float]]  # [rank][iteration], virtual seconds
    duration: float
    completed: bool
    bound: Bound | None
    row: Row  # nccl-tests' line: the slowest rank's mean iteration time against the bound
    ports: list[dict] = field(default_factory=list)
    retransmissions: int = 0


def collective_simulated(
    name: str,
    n_ranks: int,
    size: int,
    seed: int = 0,
    *,
    group: int = 1,
    fabric: SwitchSpec | None = None,
    config: TransportConfig | None = None,
    iterations: int = 1,
    inputs: Sequence[np.ndarray] | None = None,
    piece_bytes: int = DEFAULT_PIECE_BYTES,
    time_limit: float = 60.0,
) -> SimCollectiveResult:
    """Run collective ``name`` of ``size`` float32 elements on ``n_ranks`` ranks over a simulated fabric
    (default: one 1 Gb/s switch). ``inputs`` overrides the seeded integer inputs (one array per rank)."""
    config = config or TransportConfig()
    config.validate()
    fabric = fabric or uniform(1e9)
    plan = build_plan(name, n_ranks, size, group=group, piece_elems=max(1, piece_bytes // DTYPE.itemsize))
    if fabric.local is not None and fabric.group != plan.group:
        raise ValueError(f"the fabric's groups hold {fabric.group} ranks, the collective's {plan.group}")
    if inputs is None:
        inputs = [make_int_input(seed, r, size) for r in range(n_ranks)]
    if len(inputs) != n_ranks or any(len(x) != size for x in inputs):
        raise ValueError(f"inputs must be {n_ranks} arrays of {size} elements")
    expected = plan.expected(inputs)
    ranks = [CollectiveRank(PlanWorker(plan, r, inputs[r], iterations)) for r in range(n_ranks)]
    net = Fabric(fabric, n_ranks, seed=seed * 7919 + 17)
    edges = sorted(plan.edges())
    conns, joins, send, receiver_of = _wire(plan, edges, net, config, seed)
    out_of = {r: [send[e] for e in edges if e[0] == r] for r in range(n_ranks)}
    mismatch: dict | None = None

    def submit(r: int, msgs: list, now: float) -> None:
        for m in msgs:
            send[(r, m.dst)].send_message(m.data, now)

    def advance(r: int, now: float) -> None:
        nonlocal mismatch
        submit(r, ranks[r].advance(now), now)
        if mismatch is None and ranks[r].mismatch is not None:
            mismatch = {"rank": r, **ranks[r].mismatch}

    def on_event(i: int, event: object, now: float) -> None:
        if i in receiver_of and isinstance(event, MessageReceived):
            r = receiver_of[i]
            submit(r, ranks[r].receive(event.data, now), now)
            advance(r, now)

    def drained(now: float) -> None:
        for r, rank in enumerate(ranks):
            if rank.phase is Phase.DRAIN and all(c.idle for c in out_of[r]):
                rank.drained()

    for r in range(n_ranks):
        submit(r, ranks[r].start(0.0, expected[r]), 0.0)
        advance(r, 0.0)
    done = lambda: all(rank.phase is Phase.DONE for rank in ranks)  # noqa: E731
    if n_ranks == 1:
        for rank in ranks:
            rank.drained()
        now = 0.0
    else:
        now = drive(conns, joins, done=done, time_limit=time_limit, on_event=on_event, check=drained)
    completed = done()
    times = [rank.iteration_times for rank in ranks]
    slowest = max((float(np.mean(t)) for t in times if t), default=None)
    nbytes = size * DTYPE.itemsize
    rate = fabric.fabric.rate_bps / 1e6
    local_rate = fabric.local.rate_bps / 1e6 if fabric.local is not None else None
    b = bound(plan.name, n_ranks, nbytes, rate, group=plan.group, local_rate_mbps=local_rate)
    retx = sum(c.metrics()["sender"]["retransmissions"] for c in conns[0::2])
    return SimCollectiveResult(
        name=plan.name,
        results=[rank.worker.result.copy() for rank in ranks],
        expected=expected,
        correct=completed and mismatch is None,
        mismatch=mismatch if completed else (mismatch or {"error": f"not finished within {time_limit} s"}),
        iteration_times=times,
        duration=now,
        completed=completed,
        bound=b,
        row=Row(plan.name, n_ranks, nbytes, size, slowest, b),
        ports=[net.port_stats(r) for r in range(n_ranks)],
        retransmissions=retx,
    )


class SimCollectiveGroup:
    """Workload `Collective`s (transport/collective/api.py), one per rank, over a simulated fabric whose
    Connections last from one operation to the next, as a job's do: `run_operation(now)` starts the
    next operation on every rank at ``now`` and runs the network until every rank is done with it."""

    def __init__(self, colls: Sequence[Collective], fabric: SwitchSpec | None = None,
                 config: TransportConfig | None = None, seed: int = 0) -> None:
        self.colls = list(colls)
        n = len(self.colls)
        if [c.rank for c in self.colls] != list(range(n)):
            raise ValueError("give one Collective per rank, in rank order")
        config = config or TransportConfig()
        config.validate()
        self.net = Fabric(fabric or uniform(1e9), n, seed=seed * 7919 + 29)
        pairs = sorted({(c.rank, d) for c in self.colls for d in c.sends_to})
        self.conns, self.joins, self.send, self.receiver_of = _wire(self.colls[0].worker.plan, pairs, self.net,
                                                                    config, seed)

    def run_operation(self, now: float, time_limit: float = 60.0) -> float:
        """The time at which the last rank finished this operation (or ``time_limit`` if it did not)."""
        colls, send = self.colls, self.send

        def submit(r: int, msgs: list, t: float) -> None:
            for m in msgs:
                send[(r, m.dst)].send_message(m.data, t)

        def on_event(i: int, event: object, t: float) -> None:
            if i in self.receiver_of and isinstance(event, MessageReceived):
                r = self.receiver_of[i]
                submit(r, colls[r].receive(event.data, t), t)

        for c in colls:
            submit(c.rank, c.start(now), now)
        done = lambda: all(c.done for c in colls)  # noqa: E731
        if done() or not self.conns:
            return now
        return drive(self.conns, self.joins, done=done, time_limit=time_limit, on_event=on_event, start=now)
