"""results.py fed real transport metrics: transfers on the simulated network, written as the endpoints
write their files, read back as the runner reads a raw directory, parsed into an arm's results."""

from __future__ import annotations

import pytest

from experiments import results, runner
from experiments.model import Arm
from tests.experiments.simulated_endpoints import receiver_record, sender_record, transfer, write
from topologies import parse_spec
from transport.core.rtt import RttEstimator, rto
from transport.core.schema import AllreduceMetrics, ReceiverMetrics, SenderMetrics, problems
from transport.io.allreduce import UdpRingWorker, WorkerOptions
from transport.sim.simnet import PathSpec

SIZE = 600_000
TOPO = "leaf-spine:spines=1,leaves=2,hosts=2,rate=10"


def _raw(raw_dir, traffic_s: float) -> dict:
    return {"t0": 0.0, "traffic_s": traffic_s, "samples": [{"t": 0.0, "links": []}, {"t": traffic_s, "links": []}],
            "cpu": [], "endpoints": runner.read_endpoints(raw_dir)}


@pytest.fixture
def srd_arm(tmp_path):
    """Two flows to h3 (one lossy and reordering), their sender files and h3's receiver file."""
    paths = [PathSpec(rate_bps=10e6, delay=0.0005), PathSpec(rate_bps=10e6, delay=0.0005, loss=0.02, reorder=0.2)]
    runs = [transfer(SIZE, path, seed=i + 1, connection_id=100 + i) for i, path in enumerate(paths)]
    records = [sender_record(r, SIZE) for r in runs]
    recv = receiver_record(runs)
    for i, (src, rec) in enumerate(zip(("h1", "h2"), records, strict=True)):
        write(tmp_path, f"send-{i}-{src}-h3", rec)
    write(tmp_path, "recv-h3", recv)
    raw = _raw(tmp_path, max(r.duration for r in runs))
    entry = results.arm_result(Arm("spray"), raw, parse_spec(TOPO), ideal=10e6, sized=True)
    return runs, raw, entry


def test_the_files_are_the_endpoints_schema(srd_arm):
    _, raw, _ = srd_arm
    eps = raw["endpoints"]
    assert problems(eps["send-0-h1-h3"], SenderMetrics) == problems(eps["send-1-h2-h3"], SenderMetrics) == []
    assert problems(eps["recv-h3"], ReceiverMetrics) == []


def test_flows_carry_the_transports_own_counters(srd_arm):
    runs, _, entry = srd_arm
    assert entry["error"] is None and [f["src"] for f in entry["flows"]] == ["h1", "h2"]
    for f, r in zip(entry["flows"], runs, strict=True):
        snd, rcv, state = r.sender_metrics["sender"], r.receiver_metrics["receiver"], r.sender_metrics["state"]
        assert f["bytes"] == SIZE and f["completed"]
        assert f["retransmissions"] == snd["retransmissions"]
        assert f["timeouts"] == snd["timeouts"]
        assert f["loss_recovery_p50_s"] == snd["loss_recovery"]["p50"]
        assert f["out_of_order"] == rcv["out_of_order"] and f["data_packets"] == rcv["data_packets"]
        assert f["reorder_distance"] == rcv["reorder_distance"]
        assert f["min_rtt_s"] == state["min_rtt"] and f["srtt_s"] == state["srtt"]
        # The sender's RTO by the transport's rule (srtt + 4 rttvar, at least 2 srtt and rto_min).
        cfg = r.sender_metrics["config"]
        assert f["rto_s"] == rto(RttEstimator(srtt=state["srtt"], rttvar=state["rttvar"]), cfg["initial_rtt"],
                                 cfg["rto_min"], cfg["rto_max"], 0)
        assert f["rto_s"] >= max(2 * state["srtt"], cfg["rto_min"])
        # The receiver's goodput bins land on the arm's series: every byte is counted once.
        assert sum(f["series_bps"]) * results.SERIES_BIN / 8 == pytest.approx(SIZE, rel=1e-6)
    lossy = entry["flows"][1]
    assert lossy["retransmissions"] > 0 and lossy["out_of_order"] > 0


def test_the_arm_adds_up_its_flows(srd_arm):
    runs, _, entry = srd_arm
    assert entry["retransmissions"] == sum(r.sender_metrics["sender"]["retransmissions"] for r in runs)
    ooo = sum(r.receiver_metrics["receiver"]["out_of_order"] for r in runs)
    data = sum(r.receiver_metrics["receiver"]["data_packets"] for r in runs)
    assert entry["reorder"]["out_of_order"] == ooo
    assert entry["reorder"]["out_of_order_fraction"] == pytest.approx(ooo / data)
    assert entry["goodput_bps"] == pytest.approx(sum(8 * SIZE / f["duration_s"] for f in entry["flows"]))
    assert entry["completion_kind"] == "flow" and entry["slowdown_flows"] == 2
    assert entry["slowdown_max"] >= entry["slowdown_mean"] >= 1 - 1e-9


def test_an_allreduce_workers_file_becomes_its_ranks_entry(tmp_path):
    worker = UdpRingWorker(WorkerOptions(rank=0, peers=[("127.0.0.1", 7471)], size=4096, iterations=3))
    worker.run()
    record = worker.results()
    worker.close()
    assert problems(record, AllreduceMetrics) == []
    write(tmp_path, "allreduce-0-h1", record)
    entry = results.arm_result(Arm("ring", kind="allreduce"), _raw(tmp_path, 1.0), parse_spec(TOPO), 0.0, False)
    (f,) = entry["flows"]
    assert entry["error"] is None and f["correct"] is True and f["completed"]
    assert f["iteration_times_s"] == record["iteration_times_s"] and len(f["iteration_times_s"]) == 3
    assert f["bytes"] == 4 * 4096 and f["duration_s"] == pytest.approx(sum(record["iteration_times_s"]))
