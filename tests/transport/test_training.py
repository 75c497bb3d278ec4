"""The training job's sans-I/O rank, storage host and coordinator, driven by hand over an ideal network."""

from __future__ import annotations

import heapq

import pytest

from transport.training.collective import COLLECTIVES, CollectiveSpec, make_collective
from transport.training.messages import Kind, MessageError, decode, encode
from transport.training.metrics import job_summary, rank_report
from transport.training.rank import TRANSITIONS, Event, Phase, TrainingRank, TrainingStateError
from transport.training.spec import JobSpec, RankHosts, SpecError, rank_name
from transport.training.storage import Coordinator, StorageHost

HOSTS = RankHosts(data="store", checkpoint="store", coordinator="store")


class IdealNet:
    """Every message arrives `latency` seconds after it is sent, except those `drop` refuses."""

    def __init__(self, ranks: list[TrainingRank], latency: float = 0.001, drop=None) -> None:
        self.ranks = {r.name: r for r in ranks}
        self.store = StorageHost("store", Coordinator(len(ranks)))
        self.latency = latency
        self.drop = drop or (lambda src, dst, now: False)
        self.heap: list[tuple[float, int, str, str, bytes]] = []
        self.seq = 0
        self.now = 0.0

    def node(self, name: str):
        return self.store if name == "store" else self.ranks[name]

    def post(self, src: str, sends, now: float) -> None:
        for dst, msg in sends:
            if not self.drop(src, dst, now):
                self.seq += 1
                heapq.heappush(self.heap, (now + self.latency, self.seq, src, dst, msg))

    def run(self, until: float = 100.0) -> float:
        for r in self.ranks.values():
            self.post(r.name, r.start(0.0), 0.0)
        while not all(r.done for r in self.ranks.values()):
            wakes = [t for r in self.ranks.values() if (t := r.wake_time()) is not None]
            t_msg = self.heap[0][0] if self.heap else None
            nxt = min([*wakes, *([t_msg] if t_msg is not None else [])], default=None)
            assert nxt is not None, "the job stalled with nothing scheduled"
            assert nxt <= until, f"the job did not finish by {until} s"
            self.now = nxt
            while self.heap and self.heap[0][0] <= nxt:
                _, _, src, dst, msg = heapq.heappop(self.heap)
                self.post(dst, self.node(dst).receive(src, msg, nxt), nxt)
            for r in self.ranks.values():
                self.post(r.name, r.advance(nxt), nxt)
        return self.now


def ranks(n: int, **kw) -> list[TrainingRank]:
    spec = JobSpec(**{"collective": CollectiveSpec(nbytes=4096, piece_bytes=1024), **kw})
    return [TrainingRank(spec, r, n, HOSTS) for r in range(n)]


def test_messages_round_trip_and_reject_what_is_not_ours() -> None:
    m = decode(encode(Kind.COLL, 3, 7, payload=b"xyz"))
    assert (m.kind, m.fields, m.payload) == (Kind.COLL, (3, 7), b"xyz")
    with pytest.raises(MessageError):
        decode(b"")
    with pytest.raises(MessageError):
        decode(bytes([200]))
    with pytest.raises(MessageError):
        decode(encode(Kind.WRITE, 1, 2)[:-1])


def test_state_table_refuses_what_a_phase_does_not_allow() -> None:
    r = ranks(1)[0]
    with pytest.raises(TrainingStateError):
        r._fire(Event.COMPUTE_DONE, 0.0)
    assert Event.RESTART not in TRANSITIONS[Phase.SETUP] and Event.RESTART not in TRANSITIONS[Phase.EXITED]
    # Background work (a prefetch, an asynchronous checkpoint, early peers) never moves a phase.
    assert all(TRANSITIONS[p][Event.TRANSFER_DONE] is None for p in Phase)
    r.start(0.0)
    assert r.phase is Phase.RENDEZVOUS
    with pytest.raises(TrainingStateError):
        r._fire(Event.STEP_DONE, 0.0)


def test_spec_validation_names_the_setting() -> None:
    with pytest.raises(SpecError, match="checkpoint_mode"):
        JobSpec(checkpoint_mode="sometimes").validate()
    with pytest.raises(SpecError, match="collective="):
        JobSpec(collective=CollectiveSpec(name="broadcast")).validate()
    with pytest.raises(ValueError, match="unknown collective"):
        make_collective(CollectiveSpec(name="broadcast"), 0, 2)
    assert "allreduce" in COLLECTIVES


def test_ideal_network_step_time_is_compute_plus_transfers() -> None:
    latency = 0.002
    job = ranks(2, steps=4, compute_s=0.1, data_bytes=1000, prefetch=True, checkpoint_every=2,
                checkpoint_bytes=5000, checkpoint_mode="sync")
    IdealNet(job, latency).run()
    s = job_summary([rank_report(r) for r in job])
    assert s["finished"] and s["correct"] and s["useful_steps"] == 4 and s["steps_lost"] == 0
    # Two synchronous checkpoints, each one write and its answer: two latencies of stall.
    assert s["checkpoint_stall_s"] == pytest.approx(2 * 2 * latency)
    assert s["breakdown_s"]["compute_s"] == pytest.approx(4 * 0.1)
    # Only the first step waits for its data: the others' was prefetched during the compute before.
    waits = [st["data_wait_s"] for st in s["timeline"]]
    assert waits[0] == pytest.approx(2 * latency) and all(w == 0 for w in waits[1:])
    assert 0 < s["compute_share"] < 1


def test_without_prefetch_every_step_waits_for_its_data() -> None:
    latency = 0.002
    job = ranks(2, steps=3, compute_s=0.05, data_bytes=1000, prefetch=False, checkpoint_every=0)
    IdealNet(job, latency).run()
    waits = [st["data_wait_s"] for st in job_summary([rank_report(r) for r in job])["timeline"]]
    assert waits == [pytest.approx(2 * latency)] * 3


def test_asynchronous_checkpoint_overlaps_the_next_steps() -> None:
    def stall(mode: str) -> float:
        job = ranks(2, steps=6, compute_s=0.05, data_bytes=0, checkpoint_every=2, checkpoint_bytes=5000,
                    checkpoint_mode=mode)
        IdealNet(job, 0.01).run()
        s = job_summary([rank_report(r) for r in job])
        assert s["finished"] and s["checkpoints"] == 3
        return s["checkpoint_stall_s"], s["final_flush_s"]

    (sync, sync_flush), (asynchronous, flush) = stall("sync"), stall("async")
    assert sync == pytest.approx(3 * 2 * 0.01) and sync_flush == 0
    # No step waits; only the job's end waits for its last write to be in.
    assert asynchronous == 0 and flush == pytest.approx(2 * 0.01)


def test_collective_timeout_rolls_back_to_the_last_checkpoint_every_rank_wrote() -> None:
    # Rank 1's messages to rank 0 are lost between 0.35 s and 0.45 s: rank 0's collective times out.
    job = ranks(2, steps=8, compute_s=0.05, data_bytes=0, checkpoint_every=2, checkpoint_bytes=1000,
                collective_timeout_s=0.3)
    net = IdealNet(job, 0.001, drop=lambda src, dst, now: src == "rank1" and dst == "rank0" and 0.35 <= now < 0.45)
    net.run()
    reports = [rank_report(r) for r in job]
    s = job_summary(reports)
    assert s["finished"] and s["useful_steps"] == 8 and s["rollbacks"] == 1
    restart = net.store.coordinator.restarts[0]
    failed = next(r for r in job if any(rec.outcome == "failed" for rec in r.records))
    rb = failed.rollbacks[0]
    assert rb.restart_from == restart["from_step"] and rb.restart_from % 2 == 0 and rb.restart_from > 0
    # Steps lost: those done after the checkpoint, now done again.
    assert s["steps_lost"] == rb.failed_step - 1 - rb.restart_from
    lost = [rec for rec in failed.records if rec.lost]
    assert len(lost) == rb.steps_lost and all(rec.step > rb.restart_from for rec in lost)
    assert rb.resumed_at is not None and rb.resumed_at >= rb.restored_at >= rb.at
    assert [t.purpose for t in failed.transfers].count("restore") == 1


def test_coordinator_restarts_from_the_oldest_commit_and_once_per_epoch() -> None:
    c = Coordinator(3)
    for rank, step in ((0, 10), (1, 10), (2, 5), (0, 20)):
        c.receive(Kind.COMMIT, (rank, step), 0.0)
    out = c.receive(Kind.FAILED, (1, 0), 1.0)
    assert {dst for dst, _ in out} == {rank_name(r) for r in range(3)}
    assert {decode(m).fields for _, m in out} == {(1, 5)}
    assert c.receive(Kind.FAILED, (2, 0), 1.1) == []  # a second failure of the same epoch
    assert [decode(m).kind for _, m in c.receive(Kind.JOIN, (0, 1), 2.0)] == []
    c.receive(Kind.JOIN, (1, 1), 2.0)
    assert {decode(m).kind for _, m in c.receive(Kind.JOIN, (2, 1), 2.0)} == {Kind.GO}


def test_storage_host_answers_writes_once_complete_and_reads_in_full() -> None:
    s = StorageHost("store")
    assert s.receive("rank0", encode(Kind.WRITE, 1, 100, payload=bytes(60)), 0.0) == []
    (dst, msg), = s.receive("rank0", encode(Kind.WRITE, 1, 100, payload=bytes(40)), 0.0)
    assert dst == "rank0" and decode(msg).kind is Kind.WRITTEN
    chunks = s.receive("rank1", encode(Kind.READ, 2, 200_000), 0.0)
    assert sum(len(decode(m).payload) for _, m in chunks) == 200_000
    with pytest.raises(MessageError):
        s.receive("rank0", encode(Kind.GO, 0), 0.0)  # no coordinator here


def test_train_node_processes_run_a_job_over_loopback(tmp_path) -> None:
    """Every node its own `python -m cli.endpoint train-node` process, as in the emulated hosts."""
    import json
    import os
    import subprocess
    import sys

    base = 30000 + (os.getpid() % 400) * 50
    names = ["rank0", "rank1", "near0"]
    nodes = ",".join(f"{n}=127.0.0.1:{base + i}" for i, n in enumerate(names))
    procs = []
    for i, n in enumerate(names):
        cmd = [sys.executable, "-m", "cli.endpoint", "train-node", "--name", n, "--nodes", nodes, "--evs", "4",
               "--base-port", str(base + 100 + 16 * i), "--steps", "3", "--compute-s", "0.01",
               "--collective-bytes", "8K", "--data-bytes", "2K", "--checkpoint-every", "2",
               "--checkpoint-bytes", "16K", "--timeout", "30", "--json-out", str(tmp_path / f"{n}.json")]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=90) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert "3 steps, 0 rollbacks, correct" in outs[0][0]
    reports = [json.loads((tmp_path / f"{n}.json").read_text())["report"] for n in names[:2]]
    s = job_summary(reports)
    assert s["finished"] and s["correct"] and s["useful_steps"] == 3 and s["checkpoints"] == 1
    store = json.loads((tmp_path / "near0.json").read_text())
    assert store["ended"] and store["storage"]["writes_done"] == 2 and store["storage"]["bytes_read"] == 2 * 3 * 2048
