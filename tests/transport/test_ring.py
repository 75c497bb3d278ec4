"""RingRank, the all-reduce's phases as a state table: a ring driven by hand (no transport), the start
time, a wrong reference, and every illegal transition the table rejects."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from transport.collective.ring import (
    HEADER,
    HEADER_VERSION,
    KIND_BARRIER,
    TRANSITIONS,
    Phase,
    RankEvent,
    RingProtocolError,
    RingRank,
    RingStateError,
    RingWorker,
    decode_header,
    encode_barrier,
    make_input,
    ring_reference,
)


def _ranks(n: int, size: int = 40, iterations: int = 2) -> tuple[list[RingRank], np.ndarray]:
    inputs = [make_input(3, r, size) for r in range(n)]
    return [RingRank(RingWorker(r, n, inputs[r], iterations, 5)) for r in range(n)], ring_reference(inputs)


def _run(ranks: list[RingRank], reference: np.ndarray, start_at: float | None = None,
         clock: float = 0.0) -> list[list[Phase]]:
    """Deliver every message in order to the right neighbour at time ``clock``; each rank's phases."""
    n = len(ranks)
    inbox: list[deque[bytes]] = [deque() for _ in range(n)]
    seen = [[rank.phase] for rank in ranks]

    def post(r: int, msgs: list[bytes]) -> None:
        inbox[(r + 1) % n].extend(msgs)
        if ranks[r].phase is not seen[r][-1]:
            seen[r].append(ranks[r].phase)

    for r, rank in enumerate(ranks):
        post(r, rank.start(0.0, reference, start_at))
    while any(inbox):
        for r, rank in enumerate(ranks):
            while inbox[r]:
                post(r, rank.receive(inbox[r].popleft(), clock))
                post(r, rank.advance(clock))
    return seen


def test_a_ring_walks_every_phase_in_order() -> None:
    ranks, ref = _ranks(3)
    seen = _run(ranks, ref)
    for r, rank in enumerate(ranks):
        assert seen[r] == [Phase.SETUP, Phase.BARRIER, Phase.READY, Phase.ALLREDUCE, Phase.DRAIN]
        assert rank.correct is True and rank.mismatch is None
        assert len(rank.iteration_times) == 2 and rank.barrier_s == 0.0 and rank.done_at == 0.0
        assert np.array_equal(rank.worker.buf, ref)
        rank.drained()
        assert rank.phase is Phase.DONE


def test_barrier_messages_go_round_twice() -> None:
    ranks, ref = _ranks(3)
    first = ranks[0].start(0.0, ref)
    assert first == [encode_barrier(1)] and decode_header(first[0])[0] == KIND_BARRIER
    assert ranks[1].start(0.0, ref) == [] and ranks[2].start(0.0, ref) == []
    # Rank 1 passes round 1 on and keeps waiting; round 2 completes its barrier.
    assert ranks[1].receive(encode_barrier(1), 0.0) == [encode_barrier(1)]
    assert ranks[1].phase is Phase.BARRIER
    assert ranks[1].receive(encode_barrier(2), 0.5) == [encode_barrier(2)]
    assert ranks[1].phase is Phase.READY and ranks[1].barrier_s == 0.5
    # Rank 0 answers round 1 coming back with round 2; round 2 coming back is only an echo.
    assert ranks[0].receive(encode_barrier(1), 1.0) == [encode_barrier(2)]
    assert ranks[0].phase is Phase.READY
    assert ranks[0].receive(encode_barrier(2), 1.0) == []
    assert ranks[0].phase is Phase.READY


def test_iteration_one_waits_for_the_start_time() -> None:
    ranks, ref = _ranks(2, iterations=1)
    ranks[1].start(0.0, ref, start_at=5.0)
    ranks[1].receive(encode_barrier(1), 1.0)
    ranks[1].receive(encode_barrier(2), 2.0)
    assert ranks[1].phase is Phase.READY and ranks[1].wake_time() == 5.0
    assert ranks[1].advance(4.9) == [] and ranks[1].phase is Phase.READY
    pieces = ranks[1].advance(5.0)
    assert pieces and all(decode_header(m)[0] == 1 for m in pieces)
    assert ranks[1].phase is Phase.ALLREDUCE and ranks[1].wake_time() is None
    # A start time already past when the barrier completes starts at once.
    late, ref = _ranks(2, iterations=1)
    late[1].start(0.0, ref, start_at=1.0)
    late[1].receive(encode_barrier(1), 2.0)
    late[1].receive(encode_barrier(2), 3.0)
    assert late[1].start_time == 3.0


def test_a_single_rank_finishes_at_start() -> None:
    ranks, ref = _ranks(1, size=7, iterations=3)
    rank = ranks[0]
    assert rank.start(2.0, ref) == [] and rank.phase is Phase.READY and rank.barrier_s == 0.0
    assert rank.advance(2.0) == []
    assert rank.phase is Phase.DRAIN and rank.iteration_times == [0.0, 0.0, 0.0] and rank.correct is True


def test_a_wrong_reference_is_reported_once() -> None:
    ranks, ref = _ranks(3)
    bad = ref.copy()
    bad[7] += 1
    _run(ranks, bad)
    for rank in ranks:
        assert rank.correct is False
        assert rank.mismatch is not None
        assert rank.mismatch["iteration"] == 0 and rank.mismatch["index"] == 7 and rank.mismatch["differing"] == 1


# --------------------------------------------------------------------------------------------------
# The table and its illegal transitions


def test_the_table_names_every_phase_and_only_start_leaves_setup() -> None:
    assert set(TRANSITIONS) == set(Phase)
    assert TRANSITIONS[Phase.SETUP] == {RankEvent.START: Phase.BARRIER}
    assert all(target is Phase.DONE for target in TRANSITIONS[Phase.DONE].values())
    # The phases only move forward.
    order = list(Phase)
    for phase, moves in TRANSITIONS.items():
        assert all(order.index(target) >= order.index(phase) for target in moves.values())


def _at(phase: Phase, rank: int = 1) -> RingRank:
    """Rank ``rank`` of 3 taken to ``phase`` through its public API."""
    ranks, ref = _ranks(3, iterations=1)
    r = ranks[rank]
    if phase in (Phase.DRAIN, Phase.DONE):
        _run(ranks, ref)
        if phase is Phase.DONE:
            r.drained()
    elif phase is not Phase.SETUP:
        r.start(0.0, ref, start_at=10.0)
        if phase is not Phase.BARRIER:
            r.receive(encode_barrier(1), 0.0)
            r.receive(encode_barrier(2), 0.0)
        if phase is Phase.ALLREDUCE:
            r.advance(10.0)
    assert r.phase is phase
    return r


@pytest.mark.parametrize("phase", [Phase.BARRIER, Phase.READY, Phase.ALLREDUCE, Phase.DRAIN, Phase.DONE])
def test_start_twice_is_refused(phase: Phase) -> None:
    rank = _at(phase)
    with pytest.raises(RingStateError, match=f"start is not allowed in phase {phase.value}"):
        rank.start(0.0, rank.worker.data)
    assert rank.phase is phase


@pytest.mark.parametrize("phase", [Phase.READY, Phase.ALLREDUCE, Phase.DRAIN, Phase.DONE])
def test_barrier_rounds_after_the_barrier_are_refused(phase: Phase) -> None:
    rank = _at(phase)
    for round_no in (1, 2):
        with pytest.raises(RingStateError, match=f"not allowed in phase {phase.value}"):
            rank.receive(encode_barrier(round_no), 0.0)
    assert rank.phase is phase


@pytest.mark.parametrize("phase", [Phase.SETUP, Phase.BARRIER, Phase.READY, Phase.ALLREDUCE, Phase.DONE])
def test_drained_outside_the_drain_is_refused(phase: Phase) -> None:
    rank = _at(phase)
    with pytest.raises(RingStateError, match=f"drained is not allowed in phase {phase.value}"):
        rank.drained()
    assert rank.phase is phase


def test_messages_before_start_are_refused() -> None:
    rank = _at(Phase.SETUP)
    piece = HEADER.pack(1, HEADER_VERSION, 0, 0, 0, 0) + bytes(20)
    for msg in (piece, encode_barrier(1)):
        with pytest.raises(RingStateError, match="not allowed in phase setup"):
            rank.receive(msg, 0.0)
    assert rank.phase is Phase.SETUP and rank.worker.iteration == -1


def test_rank_zero_cannot_see_its_echo_before_its_barrier_completes() -> None:
    rank = _at(Phase.BARRIER, rank=0)
    with pytest.raises(RingStateError, match="barrier echo is not allowed in phase barrier"):
        rank.receive(encode_barrier(2), 0.0)


def test_data_during_the_barrier_waits_for_iteration_one() -> None:
    ranks, ref = _ranks(2, iterations=1)
    left, rank = ranks
    left.start(0.0, ref)
    left.receive(encode_barrier(1), 0.0)
    sent = left.advance(0.0)  # rank 0 started; rank 1 has not seen round 2 yet
    rank.start(0.0, ref)
    rank.receive(encode_barrier(1), 0.0)
    assert all(rank.receive(m, 0.0) == [] for m in sent)
    assert rank.phase is Phase.BARRIER
    rank.receive(encode_barrier(2), 0.0)
    assert rank.advance(0.0)  # iteration 1 starts with the buffered pieces


def test_foreign_messages_are_protocol_errors() -> None:
    rank = _at(Phase.BARRIER)
    with pytest.raises(RingProtocolError, match="barrier round 3"):
        rank.receive(encode_barrier(3), 0.0)
    with pytest.raises(RingProtocolError, match="unknown message kind 9"):
        rank.receive(HEADER.pack(9, HEADER_VERSION, 0, 0, 0, 0), 0.0)
    with pytest.raises(RingProtocolError, match="shorter than"):
        rank.receive(b"\x01", 0.0)
    assert rank.phase is Phase.BARRIER
