"""NSCC-style sender control (cc "nscc", transport.core.congestion.nscc) alone: its four quadrants, the
once-per-base-RTT decrease, quick adapt on loss, the BDP scaling, ECN echoed from the receiver, and
transfers on the virtual clock over a range of rates."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transport.core.config import TransportConfig
from transport.core.congestion import make_cc
from transport.core.congestion.nscc import FAIR_INCREASE, GAMMA, REF_BDP_PACKETS, Nscc
from transport.sim.simnet import PathSpec, run_transfer

from .conftest import make_pair

BASE = 0.001


def _nscc(window: int = 20, bdp: float = 20.0) -> Nscc:
    cc = Nscc(window, 1000, bdp=bdp, base_rtt=BASE)
    cc.on_ack(BASE, 1, 0.0)  # opens quick adapt's first period; no queueing
    return cc


def test_constants_are_scaled_by_bdp() -> None:
    cfg = TransportConfig(link_rate_bps=100e6, base_rtt=0.002)
    cc = make_cc("nscc", cfg)
    assert isinstance(cc, Nscc)
    assert cc.bdp == pytest.approx(cfg.bdp_packets)
    assert cc.a == pytest.approx(cfg.bdp_packets / REF_BDP_PACKETS)
    assert cc.window == cfg.initial_window
    assert cc.max_window == pytest.approx(1.5 * cfg.bdp_packets)
    # Unknown rate: the initial window stands in for the BDP, the measured minimum RTT for the base.
    plain = make_cc("nscc", TransportConfig(window=32))
    assert plain.bdp == 32 and plain.base_rtt is None  # type: ignore[attr-defined]


def test_below_target_unmarked_is_a_proportional_increase() -> None:
    cc = _nscc()
    w = cc.window
    before = cc.quadrants["proportional"]
    for i in range(1, 10):
        cc.on_ack(BASE * 1.5, 1, BASE * 0.1 * i)  # half a target of queueing
    assert cc.window > w and cc.quadrants["proportional"] - before == 9 and cc.decreases == 0


def test_above_target_unmarked_is_a_fair_increase() -> None:
    cc = _nscc()
    cc.on_ecn(0, 0.0)  # the path can mark: the echo, not the smoothed delay, says "marked"
    w = cc.window
    for i in range(1, 10):
        cc.on_ack(BASE * 2.5, 1, BASE * 0.1 * i)  # 1.5 targets of queueing, nothing marked
    assert cc.quadrants["fair"] == 9
    assert cc.window == pytest.approx(w + FAIR_INCREASE * cc.a * 9 / w, rel=0.05)


def test_marked_above_target_decreases_at_most_once_per_base_rtt() -> None:
    cc = _nscc()
    cc.avg_delay = 3 * BASE  # a queue that has stood for a while
    w = cc.window
    cc.on_ecn(1, 0.01)
    cc.on_ack(BASE * 4, 1, 0.01)
    assert cc.decreases == 1
    avg = cc.avg_delay
    # The decrease, then the increases collected since the last adjustment (less than a packet here).
    assert cc.window == pytest.approx(w * max(1 - GAMMA * (avg - BASE) / avg, 0.5), abs=1.0)
    assert cc.window < 0.6 * w
    w2 = cc.window
    cc.on_ecn(1, 0.0105)
    cc.on_ack(BASE * 4, 1, 0.0105)  # within the same base RTT
    assert cc.decreases == 1 and cc.window >= w2


def test_marked_below_target_changes_nothing() -> None:
    cc = _nscc()
    w = cc.window
    cc.on_ecn(1, 0.0)
    cc.on_ack(BASE * 1.2, 1, 0.0001)
    assert cc.quadrants["noop"] == 1 and cc.window == pytest.approx(w, abs=0.01)


def test_delay_alone_stands_in_for_marks_where_nothing_marks() -> None:
    cc = _nscc()
    assert not cc.ecn_seen
    now = 0.0
    for _ in range(400):  # a standing queue of three targets, never marked
        now += BASE / 10
        cc.on_ack(BASE * 4, 1, now)
    assert cc.avg_delay > BASE and cc.decreases >= 1


def test_quick_adapt_on_loss_cuts_to_what_was_delivered() -> None:
    cc = _nscc(window=200, bdp=200.0)
    cc.on_ack(BASE, 1, BASE * 3)  # the first period (to 2 ms) has ended: a new one runs to 5 ms
    cc.on_ack(BASE, 2, BASE * 4)  # ... in which only 2 packets got through
    cc.on_loss(BASE * 6)
    assert cc.quick_adapts == 1 and cc.window == pytest.approx(2.0)
    w = cc.window
    cc.on_loss(BASE * 6.1)  # within the next period: one packet off, no second quick adapt
    assert cc.quick_adapts == 1 and cc.window == pytest.approx(max(1.0, w - 1))


def test_ce_marks_travel_from_the_receiver_in_acks() -> None:
    cfg = TransportConfig(cc="nscc", pacing=False)
    p = make_pair(cfg)
    p.a.send_message(bytes(3 * cfg.max_payload))
    sent = p.drain("a")
    p.now += 0.0005
    for i, (data, _ev) in enumerate(sent):
        p.b.receive_datagram(data, p.now, ecn_ce=i == 0)  # the first one arrived CE-marked
    p.now += 0.0005
    p.deliver("b", p.drain("b"))
    assert p.b.metrics()["receiver"]["ecn_ce_received"] == 1
    assert p.a.metrics()["sender"]["ecn_ce_echoed"] == 1
    assert p.a.metrics()["state"]["cc"]["ecn_seen"] is True


@settings(max_examples=10, deadline=None)
@given(rate=st.sampled_from([10e6, 50e6, 200e6]), paths=st.integers(1, 4), seed=st.integers(0, 100))
def test_a_transfer_fills_the_link_without_drops(rate: float, paths: int, seed: int) -> None:
    base_rtt = 0.001 + 2 * 1442 * 8 / rate
    cfg = TransportConfig(cc="nscc", link_rate_bps=rate * paths, base_rtt=base_rtt)
    spec = [PathSpec(rate_bps=rate, delay=0.0005, queue_packets=128) for _ in range(paths)]
    r = run_transfer(cfg, cfg, spec, total_bytes=1 << 20, seed=seed, time_limit=60)
    assert r.completed
    drops = sum(p["a_to_b"]["queue_drops"] for p in r.network)
    assert drops == 0
    allowance = rate * paths * cfg.max_payload / cfg.wire_packet_bytes
    assert r.goodput_bps >= 0.7 * allowance
