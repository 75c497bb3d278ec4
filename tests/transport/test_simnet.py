"""The simulated network and run_transfer: link model, impairments, determinism, and the
benchmark targets (loss on one of eight paths, 2x delay spread)."""

from __future__ import annotations

import time

import pytest

from transport.core.config import TransportConfig
from transport.sim.simnet import WIRE_OVERHEAD, PathSpec, SimNetwork, run_transfer


def test_serialisation_and_propagation_delay() -> None:
    net = SimNetwork([PathSpec(rate_bps=8e6, delay=0.001)])
    data = bytes(1000 - WIRE_OVERHEAD)
    net.send(0, data, 0, 0.0)
    net.send(0, data, 0, 0.0)
    assert net.next_time() == pytest.approx(0.002)  # 1 ms on the wire + 1 ms propagation
    assert net.pop_due(0.0019) == []
    assert net.pop_due(0.002) == [(1, data)]
    assert net.pop_due(0.003) == [(1, data)]  # queued behind the first


def test_ev_selects_the_path_and_acks_go_back() -> None:
    net = SimNetwork([PathSpec(delay=0.001), PathSpec(delay=0.005)])
    net.send(0, b"x", 3, 0.0)  # EV 3 -> path 1
    net.send(1, b"y", 2, 0.0)  # EV 2 -> path 0, from B to A
    assert net.pop_due(0.002) == [(0, b"y")]
    assert net.pop_due(0.01) == [(1, b"x")]
    assert net.link_stats()[1]["a_to_b"]["sent"] == 1


def test_drop_tail_queue() -> None:
    net = SimNetwork([PathSpec(rate_bps=1e6, queue_packets=3)])
    for _ in range(5):
        net.send(0, bytes(100), 0, 0.0)
    st = net.link_stats()[0]["a_to_b"]
    assert st["queue_drops"] == 2 and st["delivered"] == 3


def test_down_interval_drops_everything() -> None:
    net = SimNetwork([PathSpec(down=[(1.0, 2.0)])])
    net.send(0, b"a", 0, 0.5)
    net.send(0, b"b", 0, 1.5)
    net.send(0, b"c", 0, 2.0)
    assert [d for _, d in net.pop_due(10.0)] == [b"a", b"c"]
    assert net.link_stats()[0]["a_to_b"]["down_drops"] == 1


def test_impairment_rates_follow_the_spec() -> None:
    net = SimNetwork([PathSpec(rate_bps=1e12, loss=0.2, duplicate=0.1, corrupt=0.1, queue_packets=10**6)], seed=3)
    for i in range(20_000):
        net.send(0, b"0123456789", 0, i * 1e-6)
    st = net.link_stats()[0]["a_to_b"]
    assert st["lost"] / 20_000 == pytest.approx(0.2, abs=0.01)
    assert st["duplicated"] / 16_000 == pytest.approx(0.1, abs=0.01)
    arrived = net.pop_due(100.0)
    assert sum(d != b"0123456789" for _, d in arrived) / len(arrived) == pytest.approx(0.1, abs=0.01)


def test_reorder_adds_extra_delay() -> None:
    net = SimNetwork([PathSpec(rate_bps=1e12, delay=0.001, reorder=1.0, reorder_delay=0.01)], seed=1)
    for i in range(100):
        net.send(0, bytes([i]), 0, i * 1e-5)
    order = [d[0] for _, d in net.pop_due(1.0)]
    assert sorted(order) == list(range(100)) and order != list(range(100))


def test_run_transfer_is_deterministic() -> None:
    cfg = TransportConfig()
    paths = [PathSpec(loss=0.02, reorder=0.1), PathSpec(delay=0.001)]
    r1 = run_transfer(cfg, cfg, paths, total_bytes=300_000, message_size=10_000, seed=5)
    r2 = run_transfer(cfg, cfg, paths, total_bytes=300_000, message_size=10_000, seed=5)
    assert r1.completed and r1.duration == r2.duration and r1.delivered == r2.delivered
    assert r1.sender_metrics == r2.sender_metrics


def test_transfer_with_a_path_going_down() -> None:
    cfg = TransportConfig(path_policy="adaptive", num_evs=4)
    paths = [PathSpec() for _ in range(3)] + [PathSpec(down=[(0.005, 10.0)])]
    r = run_transfer(cfg, cfg, paths, total_bytes=2 * 2**20, seed=1)
    assert r.completed
    assert r.sender_metrics["sender"]["timeouts"] + r.sender_metrics["sender"]["losses_detected"] > 0


EIGHT = [PathSpec() for _ in range(8)]
ONE_LOSSY = [PathSpec() for _ in range(7)] + [PathSpec(loss=0.01)]
SIZE = 4 * 2**20


def _goodput(paths: list[PathSpec], **cfg) -> float:
    c = TransportConfig(**cfg)
    r = run_transfer(c, c, paths, total_bytes=SIZE, seed=1)
    assert r.completed
    return r.goodput_bps


def test_selective_repeat_keeps_goodput_with_one_lossy_path_and_gobackn_does_not() -> None:
    lossless = _goodput(EIGHT)
    assert lossless > 0.85 * 8 * 100e6 * 1358 / 1442  # the paths, not the window, limit goodput
    selective = _goodput(ONE_LOSSY) / lossless
    gobackn = _goodput(ONE_LOSSY, recovery="gobackn") / lossless
    assert selective >= 0.90
    assert gobackn < 0.6 * selective


def test_spraying_over_paths_with_2x_delay_spread_rarely_retransmits_spuriously() -> None:
    paths = [PathSpec(delay=0.0005 if i % 2 else 0.001) for i in range(8)]
    c = TransportConfig()
    r = run_transfer(c, c, paths, total_bytes=SIZE, seed=1)
    assert r.completed
    s = r.sender_metrics["sender"]
    assert r.receiver_metrics["receiver"]["out_of_order_fraction"] > 0.1  # there is real reordering
    assert s["spurious_retx_fraction"] < 0.01


def test_ten_megabytes_over_eight_paths_simulates_quickly() -> None:
    c = TransportConfig()
    start = time.perf_counter()
    r = run_transfer(c, c, EIGHT, total_bytes=10 * 2**20, seed=2)
    assert r.completed
    assert time.perf_counter() - start < 10.0
