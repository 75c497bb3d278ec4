"""Collective pieces of the wrong size or type, and forged ones, from a hostile peer: the sans-I/O ring and
plan workers refuse them with an error naming the rank and the piece, before recording them, so the
genuine piece still counts; the training rank fails the step (and the job rolls back); `fabriclab
allreduce` exits 2 with one line. Everything runs on the virtual clock except the one CLI test on
127.0.0.1."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import numpy as np
import pytest

from tests.transport.test_allreduce import ROOT, _cmd, _free_base, _free_udp_port, _one_line_error
from tests.transport.test_training import IdealNet, ranks
from tests.transport.test_trainsim import BASE
from transport.collective.base import HEADER, PieceError, RingProtocolError
from transport.collective.plan import build_plan, make_int_input
from transport.collective.ring import RingWorker, make_input, ring_reference
from transport.collective.worker import PLAN_HEADER_VERSION, PlanWorker
from transport.core.config import TransportConfig
from transport.io.allreduce import AllReduceError, UdpRingWorker, WorkerOptions
from transport.sim.trainsim import train_simulated
from transport.training import collective as training_collective
from transport.training.messages import Kind, decode, encode
from transport.training.metrics import job_summary, rank_report
from transport.training.spec import JobSpec


def _short(msg: bytes) -> bytes:
    return msg[:-4]  # one element short


def _odd(msg: bytes) -> bytes:
    return msg + b"\x00\x00"  # 4k + 2 bytes of payload


def _float64(msg: bytes) -> bytes:
    values = np.frombuffer(msg, dtype="<f4", offset=HEADER.size)
    return msg[:HEADER.size] + values.astype("<f8").tobytes()  # the same values, the wrong element type


def _forged(msg: bytes) -> bytes:
    values = np.frombuffer(msg, dtype="<f4", offset=HEADER.size)
    return msg[:HEADER.size] + (values + np.float32(1)).tobytes()  # well formed, other values


# --------------------------------------------------------------------------------------------------
# The ring worker


def _ring_with_bad_first_piece(corrupt: Callable[[bytes], bytes]) -> tuple[list[RingWorker], list[Exception]]:
    """A 3-rank ring in which rank 1 first gets a corrupted copy of its first piece, then the rest in order."""
    n, size, piece = 3, 30, 4
    workers = [RingWorker(r, n, make_input(5, r, size), 1, piece) for r in range(n)]
    queue = [(r, m) for r in range(n) for m in workers[r].start_iteration()]
    first = next(i for i, (src, _) in enumerate(queue) if src == 0)
    queue.insert(first, (0, corrupt(queue[first][1])))
    errors: list[Exception] = []
    while queue:
        src, msg = queue.pop(0)
        try:
            queue.extend(((src + 1) % n, m) for m in workers[(src + 1) % n].receive(msg))
        except RingProtocolError as exc:
            errors.append(exc)
    return workers, errors


@pytest.mark.parametrize("corrupt", [_short, _odd, _float64], ids=["short", "4k+2", "float64"])
def test_ring_refuses_a_malformed_piece_and_still_takes_the_genuine_one(corrupt) -> None:
    workers, errors = _ring_with_bad_first_piece(corrupt)
    assert len(errors) == 1 and isinstance(errors[0], PieceError)
    assert "rank 1: the piece of iteration 0, step 0, chunk 0, offset 0" in str(errors[0])
    ref = ring_reference([w.data for w in workers])
    assert all(np.array_equal(w.buf, ref) for w in workers)
    assert workers[1].duplicates == 0  # the genuine piece was not taken for a repeat of the bad one


def test_ring_reports_a_forged_piece_that_came_before_the_genuine_one() -> None:
    workers, errors = _ring_with_bad_first_piece(_forged)
    assert len(errors) == 1 and isinstance(errors[0], PieceError)
    assert "step 0, chunk 0, offset 0 arrived again with other values" in str(errors[0])
    assert workers[1].duplicates == 0


def test_ring_drops_a_piece_of_another_header_version_without_recording_it() -> None:
    workers, errors = _ring_with_bad_first_piece(lambda m: m[:1] + b"\x07" + m[2:])
    assert len(errors) == 1 and not isinstance(errors[0], PieceError) and "header version 7" in str(errors[0])
    ref = ring_reference([w.data for w in workers])
    assert all(np.array_equal(w.buf, ref) for w in workers)


def test_ring_still_drops_an_identical_repeat_as_a_duplicate() -> None:
    workers, errors = _ring_with_bad_first_piece(lambda m: m)
    assert errors == [] and workers[1].duplicates == 1
    assert np.array_equal(workers[1].buf, ring_reference([w.data for w in workers]))


def test_ring_refuses_a_malformed_piece_of_a_later_iteration_at_once_not_when_it_starts() -> None:
    w = RingWorker(1, 3, make_input(0, 1, 30), 2, 4)
    peer = RingWorker(0, 3, make_input(0, 0, 30), 2, 4)
    w.start_iteration()
    peer.start_iteration()
    peer._active = False  # let the peer run ahead to iteration 1
    early = peer.start_iteration()[0]
    with pytest.raises(PieceError, match="iteration 1, step 0"):
        w.receive(_odd(early))
    assert w._pending == {}


# --------------------------------------------------------------------------------------------------
# The plan worker (the other collectives)


@pytest.mark.parametrize("corrupt", [_short, _odd, _float64, _forged], ids=["short", "4k+2", "float64", "forged"])
def test_plan_worker_refuses_a_bad_piece_naming_sender_and_step(corrupt) -> None:
    p, size = 3, 12
    plan = build_plan("all-to-all", p, size, piece_elems=2)
    inputs = [make_int_input(1, r, size) for r in range(p)]
    workers = [PlanWorker(plan, r, inputs[r]) for r in range(p)]
    queue = [m for w in workers for m in w.start_iteration()]
    first = next(i for i, m in enumerate(queue) if m.dst == 0)
    genuine = queue[first].data
    queue.insert(first, queue[first]._replace(data=corrupt(genuine)))
    errors: list[PieceError] = []
    while queue:
        m = queue.pop(0)
        try:
            queue.extend(workers[m.dst].receive(m.data))
        except PieceError as exc:
            errors.append(exc)
    assert len(errors) == 1
    _, version, step, it, src, lo = HEADER.unpack_from(genuine)
    assert version == PLAN_HEADER_VERSION
    assert f"rank 0: the piece from rank {src} of iteration {it}, step {step}, offset {lo}" in str(errors[0])
    expected = [np.concatenate([inputs[s][d * 4:(d + 1) * 4] for s in range(p)]) for d in range(p)]
    if corrupt is not _forged:  # the genuine piece still counts; a forged first copy made the result untrustworthy
        assert all(np.array_equal(w.result, e) for w, e in zip(workers, expected, strict=True))
    assert workers[0].duplicates == 0


# --------------------------------------------------------------------------------------------------
# Training: a bad piece fails the step, which rolls back like a timed-out one


class _HostileNet(IdealNet):
    """Puts a corrupted copy of rank 0's first data piece of step ``step`` for rank 1 (its right
    neighbour) just before the genuine one."""

    def __init__(self, job, corrupt: Callable[[bytes], bytes], step: int) -> None:
        super().__init__(job)
        self.corrupt, self.step, self.done_once = corrupt, step, False

    def post(self, src, sends, now):
        out = []
        for dst, msg in sends:
            m = decode(msg)
            if (not self.done_once and src == "rank0" and dst == "rank1" and m.kind is Kind.COLL
                    and m.fields[1] == self.step and len(m.payload) > HEADER.size):
                self.done_once = True
                out.append((dst, encode(Kind.COLL, *m.fields, payload=self.corrupt(m.payload))))
            out.append((dst, msg))
        super().post(src, out, now)


@pytest.mark.parametrize("corrupt", [_odd, _float64, _forged], ids=["4k+2", "float64", "forged"])
def test_training_step_with_a_bad_piece_fails_and_rolls_back(corrupt) -> None:
    job = ranks(3, steps=6, compute_s=0.05, data_bytes=0, checkpoint_every=2, checkpoint_bytes=1000,
                collective_timeout_s=0.3)
    net = _HostileNet(job, corrupt, step=3)
    net.run()
    s = job_summary([rank_report(r) for r in job])
    assert s["finished"] and s["correct"] and s["useful_steps"] == 6 and s["rollbacks"] == 1
    failed = [rec for rec in job[1].records if rec.outcome == "failed"]
    assert len(failed) == 1 and failed[0].step == 3
    assert failed[0].error is not None
    assert failed[0].error.startswith("rank1: step 3: rank 1: the piece of iteration 0, step 0, chunk 0, offset 0")
    assert job[1].refused_messages == 1


def test_training_ring_refuses_a_piece_from_a_rank_that_is_not_its_left_neighbour() -> None:
    coll = training_collective.make_collective(training_collective.CollectiveSpec(nbytes=64, piece_bytes=16), 1, 3)
    with pytest.raises(RingProtocolError, match=r"from rank 2.*left neighbour is rank 0"):
        coll.receive(2, b"\x01" * HEADER.size, 0.0)


def test_train_simulated_fails_the_step_of_a_4k_plus_2_piece_and_completes(monkeypatch) -> None:
    real = training_collective.COLLECTIVES["allreduce"]
    state = {"left": 1}

    class Hostile:
        """Rank 0's ring step, whose first data piece of the run goes out 2 bytes too long."""

        def __init__(self, spec, rank, n_ranks) -> None:
            self.inner = real(spec, rank, n_ranks)
            self.rank = rank

        def _spoil(self, out):
            if self.rank != 0 or not state["left"]:
                return out
            spoilt = []
            for dst, m in out:
                if state["left"] and m[0] == 1 and len(m) > HEADER.size:
                    state["left"] -= 1
                    m = _odd(m)
                spoilt.append((dst, m))
            return spoilt

        def start(self, now):
            return self._spoil(self.inner.start(now))

        def receive(self, src, msg, now):
            return self._spoil(self.inner.receive(src, msg, now))

        def advance(self, now):
            return self._spoil(self.inner.advance(now))

        def __getattr__(self, name):
            return getattr(self.inner, name)

    monkeypatch.setitem(training_collective.COLLECTIVES, "allreduce", Hostile)
    r = train_simulated(JobSpec(**{**BASE, "steps": 6, "checkpoint_every": 2}))
    assert r.completed and r.summary["finished"] and r.summary["correct"]
    assert r.summary["useful_steps"] == 6 and r.summary["rollbacks"] == 1
    assert r.transport["message_errors"] == 0
    rank1 = r.reports[1]
    assert rank1["refused_messages"] == 1
    errors = [rec["error"] for rec in rank1["records"] if rec["outcome"] == "failed"]
    assert len(errors) == 1 and errors[0].startswith("rank1: step 1: rank 1: the piece of iteration 0, step 0")


# --------------------------------------------------------------------------------------------------
# `fabriclab allreduce`: exit status 2 and one line, never a traceback


def test_allreduce_exits_2_with_one_line_on_a_4k_plus_2_piece(tmp_path) -> None:
    ports = [_free_udp_port()]
    while len(ports) < 2:
        if (p := _free_udp_port()) not in ports:
            ports.append(p)
    taken = set(ports)
    peers = [("127.0.0.1", p) for p in ports]
    victim = subprocess.Popen(
        _cmd("--rank", "1", "--peers", ",".join(f"127.0.0.1:{p}" for p in ports), "--size", "64", "--evs", "4",
             "--base-port", str(_free_base(4, taken)), "--timeout", "10"),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Rank 0, in this process, sends its first data piece 2 bytes too long.
        hostile = UdpRingWorker(WorkerOptions(rank=0, peers=peers, size=64, timeout=3.0,
                                              base_port=_free_base(4, taken), config=TransportConfig(num_evs=4)))
        piece = hostile.run_state.worker._piece
        hostile.run_state.worker._piece = lambda g, c, off: _odd(piece(g, c, off))  # type: ignore[method-assign]
        hostile.open()
        try:
            hostile.run()
        except AllReduceError:
            pass  # its right neighbour stopped: rank 0 times out
        finally:
            hostile.close()
        _, err = victim.communicate(timeout=30)
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
    line = _one_line_error(subprocess.CompletedProcess(victim.args, victim.returncode, "", err))
    assert "rank 1: the piece of iteration 0, step 0, chunk 0, offset 0 has 130 bytes of payload" in line
