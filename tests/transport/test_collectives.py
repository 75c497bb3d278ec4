"""The plan collectives (reduce-scatter, all-gather, all-to-all, hierarchical all-reduce and the ring
all-reduce as a plan): bit for bit against numpy under any delivery order, over the simulated switched
fabric with loss, reordering and duplication, their state tables, the workload API and the report."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transport.collective import Collective, CollectiveStateError, Message, collective
from transport.collective.api import CollectiveRank, expected_from_seed
from transport.collective.base import HEADER, RingProtocolError, RingStateError, encode_barrier
from transport.collective.plan import COLLECTIVES, build_plan, canonical, make_int_input
from transport.collective.report import Row, bound, bus_factor, format_rows
from transport.collective.ring import RingWorker, make_input, ring_reference
from transport.collective.worker import PlanWorker
from transport.sim.collsim import SimCollectiveGroup, collective_simulated
from transport.sim.fabric import SwitchSpec, uniform
from transport.sim.simnet import PathSpec

F32 = np.float32


def numpy_expected(name: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Each rank's result computed here from numpy alone (np.array_split's chunks), not from the plan."""
    p = len(inputs)
    stack = np.stack(inputs)
    total = stack.sum(axis=0)
    idx = np.array_split(np.arange(len(inputs[0])), p)
    if name in ("all-reduce", "hierarchical"):
        return [total] * p
    if name == "reduce-scatter":
        return [total[i] for i in idx]
    if name == "all-gather":
        return [np.concatenate([inputs[c][i] for c, i in enumerate(idx)])] * p
    return [np.concatenate([inputs[s][idx[d]] for s in range(p)]) for d in range(p)]


def shuffled(name: str, p: int, size: int, *, group: int = 1, piece: int = 3, seed: int = 0,
             iterations: int = 2, dup: float = 0.05, inputs: list[np.ndarray] | None = None):
    """Every rank's result of every iteration, messages delivered in a random order, some twice."""
    plan = build_plan(name, p, size, group=group, piece_elems=piece)
    inputs = inputs or [make_int_input(seed, r, size) for r in range(p)]
    workers = [PlanWorker(plan, r, inputs[r], iterations) for r in range(p)]
    rng = random.Random(seed)
    results: list[list[np.ndarray]] = [[] for _ in range(p)]
    inflight: list[Message] = []

    def settle(r: int) -> None:
        w = workers[r]
        while w.iteration_done and len(results[r]) <= w.iteration:
            results[r].append(w.result.copy())
            if w.iteration + 1 < iterations:
                inflight.extend(w.start_iteration())

    # Ranks start at different moments: rank 0 first, the others after some of its traffic.
    started = [0]
    inflight.extend(workers[0].start_iteration())
    settle(0)
    while inflight or len(started) < p:
        if len(started) < p and (not inflight or rng.random() < 0.1):
            r = len(started)
            started.append(r)
            inflight.extend(workers[r].start_iteration())
            settle(r)
            continue
        m = inflight.pop(rng.randrange(len(inflight)))
        if rng.random() < dup:
            inflight.append(m)
        inflight.extend(workers[m.dst].receive(m.data))
        settle(m.dst)
    return inputs, workers, results


def _groups(p: int) -> list[int]:
    return [g for g in range(1, p + 1) if p % g == 0]


# --------------------------------------------------------------------------------------------------
# The pure worker, any delivery order


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(COLLECTIVES), p=st.integers(2, 8), size=st.integers(1, 300),
       piece=st.integers(1, 40), seed=st.integers(0, 10_000), data=st.data())
def test_every_collective_is_numpy_bit_for_bit_in_any_order(name: str, p: int, size: int, piece: int, seed: int,
                                                          data: st.DataObject) -> None:
    group = data.draw(st.sampled_from(_groups(p))) if name == "hierarchical" else 1
    inputs, workers, results = shuffled(name, p, size, group=group, piece=piece, seed=seed)
    want = numpy_expected(name, inputs)
    for r in range(p):
        assert len(results[r]) == 2
        for got in results[r]:
            assert got.dtype == F32 and np.array_equal(got, want[r]), (name, p, size, group, r)
        assert np.array_equal(expected_from_seed(workers[r].plan, r, seed), want[r])


@pytest.mark.parametrize("p", [3, 5, 8])
def test_the_plan_all_reduce_adds_in_the_ring_order(p: int) -> None:
    # make_input's floats span decades, so only the ring's own order of additions matches.
    inputs = [make_input(7, r, 301) for r in range(p)]
    _, _, results = shuffled("all-reduce", p, 301, piece=5, seed=p, inputs=inputs)
    ref = ring_reference(inputs)
    naive = inputs[0].copy()
    for x in inputs[1:]:
        naive = naive + x
    assert not np.array_equal(ref, naive)  # the order does matter here
    for r in range(p):
        assert all(np.array_equal(got, ref) for got in results[r])


def test_the_plan_all_reduce_moves_what_the_ring_worker_moves() -> None:
    p, size, piece = 4, 103, 6
    plan = build_plan("all-reduce", p, size, piece_elems=piece)
    ring = RingWorker(0, p, make_input(0, 0, size), 1, piece)
    ring_bytes = sum(len(m) - HEADER.size for m in ring.start_iteration())
    step0 = sum(t.length for t in plan.transfers if t.src == 0 and t.step == 0) * 4
    assert step0 == ring_bytes
    assert plan.steps == 2 * (p - 1)


def test_all_to_all_is_a_pairwise_exchange() -> None:
    p = 5
    plan = build_plan("all-to-all", p, 50, piece_elems=4)
    for t in plan.transfers:
        k = t.step + 1
        assert t.dst == (t.src + k) % p
    assert plan.sync_steps and plan.steps == p - 1


def test_hierarchical_keeps_each_phase_on_its_level() -> None:
    p, group = 8, 4
    plan = build_plan("hierarchical", p, 1000, group=group, piece_elems=16)
    local_steps = group - 1
    for t in plan.transfers:
        same_group = t.src // group == t.dst // group
        cross = local_steps <= t.step < local_steps + 2 * (p // group - 1)
        assert same_group != cross, t
        if cross:
            assert t.src % group == t.dst % group  # rank i of every group together
    # Each rank sends 2(L-1)/L of the array locally and 2(G-1)/G of its shard across groups.
    sent = plan.bytes_sent(0) / 4
    assert sent == pytest.approx(2 * 3 / 4 * 1000 + 2 * 1 / 2 * 250, abs=4)


def test_plan_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="whole groups"):
        build_plan("hierarchical", 6, 10, group=4)
    with pytest.raises(ValueError, match="unknown collective"):
        canonical("broadcast")
    assert canonical("ring") == "all-reduce" and canonical("AllToAll") == "all-to-all"
    with pytest.raises(ValueError):
        build_plan("all-gather", 0, 10)


def test_the_worker_rejects_what_is_not_its_own() -> None:
    plan = build_plan("reduce-scatter", 3, 30, piece_elems=4)
    w = PlanWorker(plan, 1, make_int_input(0, 1, 30))
    peer = PlanWorker(plan, 0, make_int_input(0, 0, 30))
    w.start_iteration()
    first = peer.start_iteration()[0]
    assert first.dst == 1
    w.receive(first.data)
    with pytest.raises(RingProtocolError, match="version"):
        w.receive(RingWorker(0, 3, make_input(0, 0, 30), 1, 4).start_iteration()[0])  # a ring message
    bad_src = first.data[:8] + (2).to_bytes(4, "big") + first.data[12:]
    with pytest.raises(RingProtocolError, match="expects nothing"):
        w.receive(bad_src)
    with pytest.raises(RingProtocolError, match="elements"):
        w.receive(first.data[:-4])
    assert w.duplicates == 0
    w.receive(first.data)
    assert w.duplicates == 1


# --------------------------------------------------------------------------------------------------
# Over the simulated fabric with loss, reordering and duplication


IMPAIRED = {"loss": 0.02, "reorder": 0.2, "reorder_delay": 0.001, "duplicate": 0.01}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(COLLECTIVES), p=st.integers(2, 8), size=st.integers(1, 20_000),
       seed=st.integers(0, 1000), data=st.data())
def test_simulated_collectives_are_bit_exact_under_loss(name: str, p: int, size: int, seed: int,
                                                        data: st.DataObject) -> None:
    group = data.draw(st.sampled_from(_groups(p))) if name == "hierarchical" else 1
    fabric = uniform(1e9, **IMPAIRED)
    if group > 1:
        fabric = SwitchSpec(fabric.fabric, PathSpec(rate_bps=4e9, **IMPAIRED), group)
    res = collective_simulated(name, p, size, seed, group=group, fabric=fabric, iterations=2, piece_bytes=4096)
    assert res.completed and res.correct, res.mismatch
    inputs = [make_int_input(seed, r, size) for r in range(p)]
    want = numpy_expected(res.name, inputs)
    for r in range(p):
        assert np.array_equal(res.results[r], want[r])
        assert len(res.iteration_times[r]) == 2


@pytest.mark.parametrize("name", COLLECTIVES)
def test_simulated_collectives_recover_from_loss_for_every_rank_count(name: str) -> None:
    for p in range(2, 9):
        group = 2 if name == "hierarchical" and p % 2 == 0 else 1
        res = collective_simulated(name, p, 4099, seed=p, group=group, piece_bytes=2048,
                                   fabric=uniform(1e9, loss=0.03, reorder=0.1, duplicate=0.02))
        assert res.completed and res.correct, (p, res.mismatch)
        assert np.array_equal(res.results[-1], numpy_expected(res.name, [make_int_input(p, r, 4099)
                                                                          for r in range(p)])[-1])


@pytest.mark.parametrize(("name", "p", "group"), [("all-reduce", 4, 1), ("reduce-scatter", 4, 1),
                                                  ("all-gather", 5, 1), ("all-to-all", 6, 1),
                                                  ("hierarchical", 8, 4)])
def test_no_collective_beats_its_bound(name: str, p: int, group: int) -> None:
    fabric = uniform(1e9) if group == 1 else SwitchSpec(PathSpec(rate_bps=1e9), PathSpec(rate_bps=4e9), group)
    res = collective_simulated(name, p, 200_000, 3, group=group, fabric=fabric)
    assert res.correct and res.bound is not None
    floor = res.bound.overlap_s if res.bound.overlap_s is not None else res.bound.total_s
    assert min(min(t) for t in res.iteration_times) >= floor
    assert res.row.ratio_to_bound == pytest.approx(res.row.time_s / res.bound.total_s)


def test_a_dead_port_is_not_correct() -> None:
    fabric = uniform(1e9, down=[(0.0, 1e9)])
    res = collective_simulated("all-to-all", 3, 300, 1, fabric=fabric, time_limit=1.0)
    assert not res.completed and not res.correct and res.mismatch is not None


# --------------------------------------------------------------------------------------------------
# State tables


def test_collective_rank_walks_its_phases_and_refuses_events_out_of_order() -> None:
    plan = build_plan("all-gather", 2, 10)
    rank = CollectiveRank(PlanWorker(plan, 1, make_int_input(0, 1, 10)))
    with pytest.raises(RingStateError):
        rank.drained()  # not draining
    with pytest.raises(RingStateError):
        rank.receive(encode_barrier(2, 2), 0.0)  # before start
    assert rank.start(0.0, expected_from_seed(plan, 1, 0)) == []
    with pytest.raises(RingStateError):
        rank.start(0.0, expected_from_seed(plan, 1, 0))
    out = rank.receive(encode_barrier(1, 2), 0.0)
    assert out == [Message(0, encode_barrier(1, 2))]  # the barrier goes on round the ring of ranks
    with pytest.raises(RingProtocolError, match="version"):
        rank.receive(encode_barrier(1), 0.0)  # a ring's barrier is not this run's


def test_collective_api_runs_operations_and_refuses_a_second_start() -> None:
    p, nbytes = 4, 4001  # not a whole number of float32: rounded up to 1001 elements
    peers = [f"10.0.0.{r + 1}:7000" for r in range(p)]
    colls = [collective("all-to-all", r, peers, nbytes, operations=3, piece_bytes=512) for r in range(p)]
    assert all(isinstance(c, Collective) for c in colls)
    assert colls[0].sends_to == [1, 2, 3] and colls[0].receives_from == [1, 2, 3]
    rng = random.Random(4)
    for op in range(3):
        inflight: list[Message] = []
        for c in colls:
            inflight.extend(c.start(float(op)))
        with pytest.raises(CollectiveStateError):
            colls[0].start(float(op))
        while inflight:
            m = inflight.pop(rng.randrange(len(inflight)))
            inflight.extend(colls[m.dst].receive(m.data, op + 0.5))
        assert all(c.done for c in colls)
    assert all(c.finished and c.correct and len(c.op_times) == 3 for c in colls)
    assert all(t == 0.5 for c in colls for t in c.op_times)
    with pytest.raises(CollectiveStateError):
        colls[1].start(9.0)
    inputs = [make_int_input(0, r, 1001) for r in range(p)]
    for r, c in enumerate(colls):
        assert np.array_equal(c.result(), numpy_expected("all-to-all", inputs)[r])


def test_collective_api_keeps_a_faster_peer_s_next_operation() -> None:
    peers = [0, 1]
    a, b = (collective("ring", r, peers, 64, operations=2) for r in peers)
    # Rank 0 is one operation ahead: its second operation's messages reach rank 1 first.
    q = a.start(0.0) + b.start(0.0)
    while q:
        m = q.pop(0)
        q += (a, b)[m.dst].receive(m.data, 1.0)
    early = a.start(2.0)
    assert early and b.done and b.phase == "idle" and len(b.op_times) == 1
    for m in early:
        assert b.receive(m.data, 2.0) == []  # kept until b starts its second operation
    assert b.phase == "idle" and len(b.op_times) == 1 and not a.done
    q = b.start(3.0)
    while q:
        m = q.pop(0)
        q += (a, b)[m.dst].receive(m.data, 3.0)
    assert a.finished and b.finished and a.correct and b.correct


# --------------------------------------------------------------------------------------------------
# Bounds and the report


def test_bounds_and_bus_factors() -> None:
    # 4 MB over 4 ranks at 1000 Mb/s: 32 Mbit; the all-reduce moves 1.5 of it, the others 0.75.
    assert bound("ring", 4, 4_000_000, 1000).total_s == pytest.approx(0.048)
    for name in ("reduce-scatter", "all-gather", "all-to-all"):
        assert bound(name, 4, 4_000_000, 1000).total_s == pytest.approx(0.024)
        assert bus_factor(name, 4) == 0.75
    assert bus_factor("hierarchical", 8) == bus_factor("all-reduce", 8) == 1.75
    # 8 ranks in 2 groups of 4: local 2*3/4 * 32 Mbit / 4000 Mb/s = 12 ms; fabric 2*1/2 * 8 Mbit / 1000 = 8 ms.
    b = bound("hierarchical", 8, 4_000_000, 1000, group=4, local_rate_mbps=4000)
    assert b.levels == pytest.approx({"local": 0.012, "fabric": 0.008})
    assert b.total_s == pytest.approx(0.020) and b.overlap_s == pytest.approx(0.012)
    assert bound("all-to-all", 1, 100, 1000) is None and bound("all-to-all", 4, 100, None) is None


def test_report_rows_read_like_nccl_tests() -> None:
    b = bound("hierarchical", 8, 4_000_000, 1000, group=4, local_rate_mbps=4000)
    rows = [Row("all-to-all", 4, 4_000_000, 1_000_000, 0.032, bound("all-to-all", 4, 4_000_000, 1000)),
            Row("hierarchical", 8, 4_000_000, 1_000_000, 0.025, b), Row("all-gather", 4, 400, 100, None)]
    assert rows[0].algbw_gbps == pytest.approx(1.0) and rows[0].busbw_gbps == pytest.approx(0.75)
    assert rows[0].ratio_to_bound == pytest.approx(0.032 / 0.024)
    text = format_rows(rows)
    lines = text.splitlines()
    assert lines[0].split() == ["#", "size", "count", "type", "redop", "time", "algbw", "busbw", "bound", "x_bound"]
    assert lines[2].split() == ["4000000", "1000000", "float", "none", "32000.0", "1.000", "0.750", "24000.0",
                                "1.33"]
    assert lines[3].split()[3] == "sum" and "local 12000.0 us, fabric 8000.0 us" in lines[4]
    assert lines[5].split()[4:] == ["n/a"] * 5
    assert rows[1].to_dict()["bound_levels_s"] == pytest.approx({"local": 0.012, "fabric": 0.008})


@pytest.mark.parametrize(("name", "group"), [("ring", 1), ("all-to-all", 1), ("hierarchical", 2)])
def test_workload_collectives_over_the_simulated_transport(name: str, group: int) -> None:
    p, nbytes = 4, 40_004
    peers = [f"gpu{r}" for r in range(p)]
    colls = [collective(name, r, peers, nbytes, group=group, operations=3, piece_bytes=4096) for r in range(p)]
    fabric = uniform(1e9, loss=0.02, reorder=0.1, duplicate=0.01)
    if group > 1:
        fabric = SwitchSpec(fabric.fabric, PathSpec(rate_bps=4e9, loss=0.02), group)
    sim = SimCollectiveGroup(colls, fabric, seed=2)
    now = 0.0
    for _ in range(3):
        end = sim.run_operation(now + 0.01)  # a compute phase between operations
        assert all(c.done for c in colls) and end > now + 0.01
        now = end
    assert all(c.finished and c.correct and len(c.op_times) == 3 for c in colls)
    b = bound(name, p, nbytes, 1000, group=group, local_rate_mbps=4000)
    assert min(t for c in colls for t in c.op_times) >= (b.overlap_s or b.total_s)
