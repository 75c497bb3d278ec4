"""The endpoint metrics schema (transport.core.schema): real endpoints and simulated connections write what
it says, and `rto_s` is the transport's own retransmission timeout."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from transport.core.config import TransportConfig
from transport.core.rtt import RttEstimator, rto
from transport.core.schema import (
    AllreduceMetrics,
    ConnectionMetrics,
    ReceiverMetrics,
    SenderMetrics,
    base_rto_s,
    problems,
)
from transport.io.allreduce import UdpRingWorker, WorkerOptions
from transport.io.endpoint import Receiver, Sender, Workload
from transport.sim.simnet import PathSpec, run_transfer


def _json(record: Any) -> Any:
    """What a reader of the file gets back."""
    return json.loads(json.dumps(record))


def _loopback(config: TransportConfig, total: int, **workload: Any) -> tuple[dict, dict]:
    rx = Receiver(config, bind="127.0.0.1", port=0, expect_bytes=total, linger=0.2)
    rx.open()
    got: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: got.update(rx.run()), daemon=True)
    thread.start()
    sender = Sender(config, "127.0.0.1", rx.address[1], Workload(total_bytes=total, **workload), bind="127.0.0.1",
                    base_port=0, duration=20)
    sent = sender.run()
    thread.join(10)
    assert not thread.is_alive()
    return dict(sent), got


@pytest.mark.parametrize("config", [TransportConfig(), TransportConfig(cc="fixed", recovery="gobackn",
                                                                       delivery="ordered")],
                         ids=["default", "fixed-gobackn-ordered"])
def test_loopback_endpoints_write_the_schema(config: TransportConfig) -> None:
    sent, received = _loopback(config, 300_000, size=40_000)
    assert sent["completed"] and received["bytes"] == 300_000
    assert problems(_json(sent), SenderMetrics) == []
    assert problems(_json(received), ReceiverMetrics) == []
    assert received["connections"][0]["connection_id"] == sent["connection_id"]
    assert sent["rto_s"] == base_rto_s(sent["connection"])


@pytest.mark.parametrize("path", [PathSpec(), PathSpec(loss=0.03, reorder=0.2, duplicate=0.01)],
                         ids=["clean", "lossy"])
def test_simulated_connections_report_the_schema(path: PathSpec) -> None:
    cfg = TransportConfig()
    r = run_transfer(cfg, cfg, [path, path], total_bytes=400_000, seed=3)
    assert r.completed
    for side in (r.sender_metrics, r.receiver_metrics):
        assert problems(side, ConnectionMetrics) == []
        assert problems(_json(side), ConnectionMetrics) == []


def test_a_single_rank_allreduce_writes_the_schema() -> None:
    # One rank needs no socket: the ring is empty and each iteration copies the input.
    worker = UdpRingWorker(WorkerOptions(rank=0, peers=[("127.0.0.1", 7471)], size=1000, iterations=2))
    worker.run()
    result = worker.results()
    worker.close()
    assert result["correct"] and result["iterations_done"] == 2
    assert problems(_json(result), AllreduceMetrics) == []


def test_rto_is_the_transports_rule_not_srtt_plus_four_rttvar() -> None:
    def conn(srtt: float | None, rttvar: float, **config: Any) -> ConnectionMetrics:
        m = run_transfer(TransportConfig(**config), TransportConfig(), [PathSpec()], total_bytes=1000).sender_metrics
        m["state"].update(srtt=srtt, rttvar=rttvar)
        return m

    # A steady RTT: the 2 x srtt floor, where srtt + 4 rttvar would give 10.4 ms.
    assert base_rto_s(conn(0.010, 0.0001)) == pytest.approx(0.020)
    assert base_rto_s(conn(0.010, 0.004)) == pytest.approx(0.026)
    assert base_rto_s(conn(0.0005, 0.0001, rto_min=0.005)) == 0.005
    assert base_rto_s(conn(None, 0.0, initial_rtt=0.004)) == pytest.approx(0.012)
    assert base_rto_s(conn(0.8, 0.2, rto_max=1.0)) == 1.0
    real = conn(0.0123, 0.0011)
    est = RttEstimator(srtt=0.0123, rttvar=0.0011)
    assert base_rto_s(real) == rto(est, real["config"]["initial_rtt"], real["config"]["rto_min"],
                                   real["config"]["rto_max"], 0)


def test_problems_names_what_is_missing_unknown_or_mistyped() -> None:
    cfg = TransportConfig()
    good = run_transfer(cfg, cfg, [PathSpec()], total_bytes=10_000).sender_metrics
    assert problems(good, ConnectionMetrics) == []
    bad = _json(good)
    del bad["state"]["srtt"]
    bad["sender"]["retransmissions"] = 1.5
    bad["receiver"]["data_packets"] = True
    bad["receiver"]["reorder_distance"]["1"] = "many"
    bad["extra"] = 1
    found = problems(bad, ConnectionMetrics)
    assert "ConnectionMetrics.state: no key 'srtt'" in found
    assert "ConnectionMetrics: unknown key 'extra'" in found
    assert "ConnectionMetrics.sender.retransmissions: float is not int" in found
    assert "ConnectionMetrics.receiver.data_packets: bool is not int" in found
    assert "ConnectionMetrics.receiver.reorder_distance['1']: str is not int" in found
    assert len(found) == 5
    assert problems(None, int | None) == [] and problems(3, float) == [] and problems([1, "x"], list[int]) == [
        "list[int][1]: str is not int"]
