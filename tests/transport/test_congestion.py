"""Congestion control: the fixed window and the Swift-like delay-based AIMD, and the queueing on the way
out it reads where the peer reports one-way delays."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from transport.core.config import TransportConfig
from transport.core.congestion import CONTROLLERS, DelayBased, FixedWindow, make_cc
from transport.core.rtt import OneWayDelay, RttEstimator
from transport.sim.fabric import TwoLeafSpec
from transport.sim.flows import run_flows


def test_fixed_window_ignores_signals_and_paces_over_srtt() -> None:
    cc = make_cc("fixed", TransportConfig(window=32, max_window=1024, target_delay=0.002))
    assert isinstance(cc, FixedWindow) and cc.pacing_rate is None
    cc.on_ack(0.001, 1, 0.0)
    cc.on_loss(0.0)
    cc.on_timeout(0.0)
    assert cc.window == 32
    assert cc.pacing_rate == pytest.approx(1.5 * 32 / 0.001)
    unpaced = TransportConfig(window=32, max_window=1024, target_delay=0.002, pacing=False)
    assert make_cc("fixed", unpaced).pacing_rate is None


def test_slow_start_then_additive_increase_below_target() -> None:
    cc = DelayBased(10, 1000, target_delay=0.002)
    cc.on_ack(0.001, 10, 0.0)
    assert cc.window == 20 and cc.slow_start
    cc.on_ack(0.0021, 1, 0.001)  # queueing delay 1.1 ms >= target/2: slow start ends
    assert not cc.slow_start
    w = cc.window
    cc.on_ack(0.0021, 1, 0.002)
    assert cc.window == pytest.approx(w + 1 / w)


def test_decrease_proportional_to_excess_delay_once_per_rtt() -> None:
    cc = DelayBased(100, 1000, target_delay=0.001)
    cc.on_ack(0.001, 1, 0.0)  # min RTT 1 ms
    cc.slow_start = False
    w = cc.window
    cc.on_ack(0.0025, 1, 0.01)  # 1.5 ms queueing vs 1 ms target
    assert cc.window == pytest.approx(w * (1 - 0.8 * 0.5 / 1.5))
    w2 = cc.window
    cc.on_ack(0.0025, 1, 0.0101)  # within the same RTT: no second decrease
    assert cc.window == w2
    cc.on_ack(0.010, 1, 0.02)  # far above target: the decrease is capped at max_mdf
    assert cc.window == pytest.approx(w2 * 0.5)


def test_loss_decrease_scales_with_share_and_is_rate_limited() -> None:
    cc = DelayBased(100, 1000, target_delay=0.002)
    cc.on_ack(0.001, 1, 0.0)
    w = cc.window
    cc.on_loss(0.01, share=1 / 8)
    assert cc.window == pytest.approx(w * (1 - 0.25 / 8))
    w = cc.window
    cc.on_loss(0.0105)
    assert cc.window == w
    cc.on_loss(0.02)
    assert cc.window == pytest.approx(w * 0.75)
    cc.on_timeout(0.03)
    assert cc.window == pytest.approx(w * 0.75 * 0.5)


def test_window_bounds() -> None:
    cc = DelayBased(4, 8, target_delay=0.002)
    for i in range(100):
        cc.on_ack(0.001, 4, i * 0.001)
    assert cc.window == 8
    for i in range(100):
        cc.on_timeout(1 + i)
    assert cc.window == 1.0
    assert cc.pacing_rate is not None and cc.pacing_rate > 0


def test_unknown_cc() -> None:
    with pytest.raises(ValueError, match="unknown congestion control"):
        make_cc("cubic", TransportConfig(window=1, max_window=1, target_delay=0.1))


def test_target_covers_a_number_of_packets_at_the_flows_rate() -> None:
    # 20 ms RTT with a window of 8: 2.5 ms per packet, so 8 packets of queue are 20 ms, far above
    # the 2 ms floor; a 10 ms queueing delay is then below target and the window grows.
    cc = DelayBased(8, 1000, target_delay=0.002, target_packets=8)
    cc.on_ack(0.020, 1, 0.0)
    cc.slow_start = False
    w = cc.window
    cc.on_ack(0.030, 1, 0.1)
    assert cc.target == pytest.approx(8 * cc.srtt / w)
    assert cc.window > w and cc.decreases == 0
    # Without the packet target the same delay is far above 2 ms: a decrease.
    plain = DelayBased(8, 1000, target_delay=0.002)
    plain.on_ack(0.020, 1, 0.0)
    plain.on_ack(0.030, 1, 0.1)
    assert plain.decreases == 1 and plain.window < 8


def test_target_floor_governs_fast_paths() -> None:
    cc = DelayBased(100, 1000, target_delay=0.002, target_packets=16)
    cc.on_ack(0.001, 1, 0.0)  # 10 us per packet: 16 packets are 0.16 ms, below the floor
    assert cc.target == 0.002


def test_spurious_retransmission_undoes_the_loss_decrease() -> None:
    cc = DelayBased(40, 1000, target_delay=0.002)
    cc.on_ack(0.001, 1, 0.0)
    w = cc.window
    cc.on_loss(0.01)
    assert cc.window < w
    cc.on_spurious(0.012)
    assert cc.window == w and cc.undone == 1
    cc.on_spurious(0.013)  # only once per decrease
    assert cc.undone == 1
    cc.on_timeout(0.02)
    assert cc.window == w / 2
    cc.on_ack(0.0100, 1, 0.03)  # a delay-driven decrease replaces the undo record
    cc.on_spurious(0.04)
    assert cc.window < w / 2 and cc.undone == 1


@pytest.mark.parametrize("name", CONTROLLERS.names())
def test_a_shared_rtt_estimate_is_read_not_updated_again(name: str) -> None:
    # In a connection loss recovery updates the estimate with a sample before on_ack reports it.
    rtt = RttEstimator()
    cc = make_cc(name, TransportConfig(window=10, max_window=100, target_delay=0.002), rtt=rtt)
    for sample in (0.001, 0.003):
        rtt.update(sample)
        cc.on_ack(sample, 1, 0.0)
    assert rtt.srtt == pytest.approx(0.875 * 0.001 + 0.125 * 0.003)
    assert cc.srtt == rtt.srtt and cc.min_rtt == 0.001  # type: ignore[attr-defined]


# ------------------------------------------------------------------ delay on the way out


@given(offset=st.integers(0, 2**32 - 1), delays=st.lists(st.integers(0, 10**6), min_size=1, max_size=40))
def test_one_way_queueing_is_each_delay_less_the_least_whatever_the_clocks_offset(
    offset: int, delays: list[int],
) -> None:
    owd = OneWayDelay()
    least = delays[0]
    for d in delays:
        least = min(least, d)
        assert owd.sample((d + offset) & 0xFFFFFFFF) == pytest.approx((d - least) * 1e-6)


def test_the_delay_controller_reads_the_way_outs_queueing_when_the_peer_reports_it() -> None:
    est = RttEstimator()
    cc = DelayBased(100, 1000, target_delay=0.001, rtt=est)
    est.update(0.001)
    cc.on_ack(0.001, 1, 0.0)
    cc.slow_start = False
    w = cc.window
    # 4 ms of RTT above the minimum, but the ACK queued on the way back: only 0.5 ms was ours.
    est.update(0.005)
    est.queueing = 0.0005
    cc.on_ack(0.005, 1, 0.01)
    assert cc.window > w
    est.update(0.005)
    est.queueing = None  # not reported: the round trip's excess is all there is
    cc.on_ack(0.005, 1, 0.02)
    assert cc.window < w


@pytest.mark.parametrize("cc", ["delay"])
def test_traffic_both_ways_keeps_the_links_full(cc: str) -> None:
    # Two hosts on two leaves sending to each other: each one's ACKs queue behind its own data. Read as
    # congestion, that queue cost each flow a fifth of its link (0.81 of the wire each way).
    spec = TwoLeafSpec(hosts=2, spines=2, rate_bps=4e6, hop_delay=0.0003)
    config = spec.config(TransportConfig(path_policy="spray", num_evs=16, mtu=1500, cc=cc, ack_delay=0.01,
                                         ack_batch=8))
    size = 1 << 20
    allowance = spec.rate_bps * config.max_payload / config.wire_packet_bytes
    one = run_flows(config, spec, [(0, 1, size)], seed=1)
    both = run_flows(config, spec, [(0, 1, size), (1, 0, size)], seed=1)
    assert one.completed and both.completed
    solo = 8 * size / one.fct[0] / allowance
    for t in both.fct:
        assert 8 * size / t / allowance > solo - 0.05
