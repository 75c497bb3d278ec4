"""LossRecovery on its own, on a fake clock: RTO arming, backoff and reset, the RACK-like reordering
allowance, spurious-retransmission undo, go-back-N rewind and the loss timer."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transport.core.config import TransportConfig
from transport.core.metrics import Stats
from transport.core.recovery import LossRecovery, SentPacket
from transport.core.rtt import RttEstimator, rto


class Recorder:
    """Congestion control and path policy stand-in that records what loss recovery tells it."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def on_ack(self, *args: float) -> None:
        self.calls.append(("ack", *args))

    def on_loss(self, *args: float) -> None:
        self.calls.append(("loss", *args))

    def on_timeout(self, *args: float) -> None:
        self.calls.append(("timeout", *args))

    def on_spurious(self, *args: float) -> None:
        self.calls.append(("spurious", *args))

    def named(self, name: str) -> list[tuple]:
        return [c[1:] for c in self.calls if c[0] == name]


class SteeringRecorder(Recorder):
    """A path policy stand-in that steers, so it is also told of packets overdue (on_suspect)."""

    def on_suspect(self, *args: float) -> None:
        self.calls.append(("suspect", *args))


class Harness:
    """A LossRecovery with recorders around it and a clock moved by hand."""

    def __init__(self, policy: Recorder | None = None, **config: object) -> None:
        cfg = dict(initial_rtt=0.005, rto_min=0.005, rto_max=1.0, reorder_window=0.25)
        cfg.update(config)
        self.config = TransportConfig(**cfg)  # type: ignore[arg-type]
        self.rtt = RttEstimator()
        self.cc = Recorder()
        self.policy = policy if policy is not None else SteeringRecorder()
        self.stats = Stats()
        self.r = LossRecovery(self.config, self.rtt, self.cc, self.policy, self.stats)  # type: ignore[arg-type]
        self.now = 0.0
        self.records: dict[int, SentPacket] = {}

    def send(self, seq: int, ev: int = 0) -> SentPacket:
        """Transmit ``seq`` (again, if it was sent before) now on ``ev``."""
        rec = self.records.get(seq)
        if rec is None:
            rec = self.records[seq] = SentPacket(seq, 0, 0, 1, 1, b"x")
        self.r.on_packet_sent(rec, ev, self.ts(), self.now)
        return rec

    def ts(self, at: float | None = None) -> int:
        return round((self.now if at is None else at) * 1e6)

    def ack(
        self, cum: int, ack_seq: int, sacked: tuple[int, ...] = (), echo: int | None = None, delay_us: int = 0,
        nak: bool = False, owd: int | None = None,
    ) -> list[int]:
        """An ACK of everything below ``cum`` and of ``sacked``, echoing ``ack_seq``'s latest
        transmission unless ``echo`` names another timestamp."""
        base = min(sacked) if sacked else 0
        bitmap = sum(1 << (s - base) for s in sacked)
        if echo is None:
            echo = self.records[ack_seq].ts
        newly = self.r.on_ack(cum, base, bitmap, ack_seq, echo, delay_us, nak, self.now, owd)
        return [rec.seq for rec in newly]

    def resend_lost(self) -> list[int]:
        out = []
        while (rec := self.r.lost_packet()) is not None:
            self.r.pop_lost()
            self.send(rec.seq, ev=rec.ev + 1)
            out.append(rec.seq)
        return out

    def fire(self) -> None:
        t = self.r.loss_time()
        assert t is not None
        self.now = t
        self.r.on_timeout(t)

    def overtake(self, gap: float = 0.001, delay_us: int = 0) -> tuple[int, float, int]:
        """Send packet n on EV 0 and n + 1 on EV 1; ``gap`` later only n + 1 is acknowledged.
        Returns n, when it was sent and its wire timestamp."""
        n = self.r.next_seq
        sent = self.send(n, ev=0)
        self.send(n + 1, ev=1)
        self.now += gap
        assert self.ack(n, n + 1, sacked=(n + 1,), delay_us=delay_us) == [n + 1]
        return n, sent.sent_time, sent.ts

    def overtake_and_resend(self) -> tuple[int, int]:
        """``overtake()``, then wait until packet n is declared lost and resend it."""
        n, _, original = self.overtake()
        self.fire()
        assert self.resend_lost() == [n]
        return n, original


def _sample(h: Harness, rtt: float) -> None:
    """One RTT sample of ``rtt``: a packet sent now and acknowledged ``rtt`` later."""
    seq = h.r.next_seq
    h.send(seq)
    h.now += rtt
    assert h.ack(seq + 1, seq) == [seq]


# ---------------------------------------------------------------------------------------------- RTO


def test_nothing_in_flight_means_no_timer() -> None:
    h = Harness()
    assert h.r.loss_time() is None
    h.send(0)
    h.now = 0.001
    h.ack(1, 0)
    assert h.r.loss_time() is None and not h.r.inflight and not h.r.sent


def test_rto_before_any_sample_is_three_initial_rtts_and_probes_with_the_oldest_packet() -> None:
    h = Harness()
    for seq in range(4):
        h.send(seq)
    assert h.r.rto() == pytest.approx(3 * 0.005)
    assert h.r.loss_time() == pytest.approx(0.015)
    h.now = 0.0149
    h.r.on_timeout(h.now)
    assert h.stats.timeouts == 0
    h.fire()
    # Without an RTT sample a slow first window is likelier than a lost one: only the oldest goes.
    assert h.stats.timeouts == 1 and h.stats.losses_detected == 1
    assert h.r.lost_packet() is h.records[0]
    assert h.cc.named("timeout") == [(h.now,)] and h.policy.named("timeout") == [(0, h.now)]


def test_rto_follows_rfc6298_with_the_2_srtt_and_rto_min_floors() -> None:
    h = Harness(rto_min=0.001)
    _sample(h, 0.002)
    assert (h.rtt.srtt, h.rtt.rttvar) == (pytest.approx(0.002), pytest.approx(0.001))
    assert h.r.rto() == pytest.approx(0.002 + 4 * 0.001)
    h2 = Harness(rto_min=0.05)
    _sample(h2, 0.002)
    assert h2.r.rto() == pytest.approx(0.05)
    # A steady RTT drives rttvar towards zero; the RTO keeps at least two smoothed RTTs.
    h3 = Harness(rto_min=0.0001)
    for _ in range(200):
        _sample(h3, 0.01)
    assert h3.r.rto() == pytest.approx(2 * 0.01, rel=1e-3)


def test_rto_backs_off_per_timeout_and_resets_on_new_acknowledgement() -> None:
    h = Harness(rto_min=0.001, rto_max=10.0)
    _sample(h, 0.002)
    base = h.r.rto()
    for seq in (1, 2):
        h.send(seq)
    h.fire()
    assert h.r.rto() == pytest.approx(2 * base)
    h.resend_lost()
    h.fire()
    assert h.r.rto() == pytest.approx(4 * base) and h.stats.timeouts == 2
    c = h.config
    assert h.r.rto() == rto(h.rtt, c.initial_rtt, c.rto_min, c.rto_max, 2)  # the one rule, backed off twice
    h.resend_lost()
    h.now += 0.001
    assert h.ack(2, 1) == [1]
    assert h.r.rto() < 2 * base  # the backoff is gone (the sample also moved the estimate)


def test_rto_is_capped_at_rto_max() -> None:
    h = Harness(rto_min=0.001, rto_max=0.02)
    _sample(h, 0.002)
    h.send(1)
    for _ in range(10):
        h.fire()
        h.resend_lost()
    assert h.r.rto() == pytest.approx(0.02)


def test_rto_runs_from_the_latest_acknowledgement_of_new_data() -> None:
    # A queue draining slowly: ACKs keep acknowledging new packets, so the oldest one still in
    # flight does not time out at its own send time plus the RTO.
    h = Harness(rto_min=0.005)
    _sample(h, 0.001)
    for seq in range(1, 5):
        h.send(seq)
    start = h.now
    assert h.r.loss_time() == pytest.approx(start + h.r.rto())
    h.now += 0.004
    assert h.ack(2, 1) == [1]
    assert h.r.loss_time() == pytest.approx(h.now + h.r.rto())
    h.r.on_timeout(start + h.r.rto() + 1e-6)
    assert h.stats.timeouts == 0


def test_first_timeout_probes_with_the_oldest_and_a_second_resends_the_round() -> None:
    # The first timeout since progress resends only the oldest packet: a queue that outgrew the RTT
    # estimate is likelier than a lost round. Timing out again with no progress declares lost what
    # was in flight for more than half the (backed-off) timeout.
    h = Harness(rto_min=0.01)
    _sample(h, 0.001)
    h.send(1)
    h.now += 0.003
    h.send(2)
    h.now += 0.005
    h.send(3)
    h.fire()  # rto after packet 1
    assert h.resend_lost() == [1]
    assert 2 in h.r.inflight and 3 in h.r.inflight
    h.now += 0.015
    h.send(4)
    h.fire()  # no ACK since: 1 (resent), 2 and 3 are old, 4 was just sent
    assert h.resend_lost() == [1, 2, 3]
    assert 4 in h.r.inflight
    assert h.stats.timeouts == 2


def test_a_late_round_costs_one_probe_not_a_round() -> None:
    # A round delayed past the RTO (an incast's queue): one packet resent, then the originals'
    # ACKs arrive and nothing else is declared lost.
    h = Harness(rto_min=0.01)
    _sample(h, 0.001)
    for seq in range(1, 9):
        h.send(seq)
    h.fire()
    assert h.resend_lost() == [1]
    h.now += 0.002
    assert h.ack(9, 8, echo=h.records[8].ts) == list(range(1, 9))
    assert h.stats.losses_detected == 1 and h.stats.timeouts == 1  # the probe only


# --------------------------------------------------------------------------------- RACK detection


def _allowance(h: Harness, est: RttEstimator, scale: float = 1.0) -> float:
    w = h.config.reorder_window * scale
    return est.srtt * (1 + w) + 2 * est.rttvar  # type: ignore[operator]


def test_overtaken_packet_is_lost_only_after_its_evs_reordering_allowance() -> None:
    h = Harness(rto_min=1.0)
    _sample(h, 0.002)  # EV 0
    n, sent_at, _ = h.overtake()
    deadline = sent_at + _allowance(h, h.r._ev_rtt[0])
    assert h.r.loss_time() == pytest.approx(deadline)
    assert h.stats.losses_detected == 0
    h.now = deadline - 1e-6
    h.r.on_timeout(h.now)
    assert h.stats.losses_detected == 0
    h.fire()
    assert h.r.lost_packet() is h.records[n] and h.stats.losses_detected == 1
    assert h.policy.named("loss") == [(0, h.now)]
    # The loss is reported with the share of the window that was on the EV that lost: all of it.
    assert h.cc.named("loss") == [(h.now, 1.0)]


def test_an_overtaken_packet_a_round_trip_old_is_overdue_to_the_policy_before_it_is_lost() -> None:
    h = Harness(rto_min=1.0)
    # EV 0: srtt 2 ms, rttvar 1 ms, so it is overdue 4 ms after sending and lost after 4.5 ms.
    _sample(h, 0.002)
    n, _, _ = h.overtake(gap=0.0042)
    # Later than its EV's round trips go, a later packet on another EV is acknowledged and it is not:
    # the policy hears that EV 0 is overdue; nothing is lost, retransmitted or cut yet.
    assert h.policy.named("suspect") == [(0, h.now)]
    assert h.policy.named("loss") == [] and h.cc.named("loss") == [] and h.r.lost_packet() is None
    h.fire()
    assert h.r.lost_packet() is h.records[n] and h.policy.named("loss") == [(0, h.now)]


def test_an_overtaken_packet_within_its_evs_rtt_and_variation_is_not_overdue() -> None:
    h = Harness(rto_min=1.0)
    _sample(h, 0.002)
    h.overtake(gap=0.0038)
    assert h.policy.named("suspect") == []


def test_a_policy_without_the_overdue_hook_is_not_asked() -> None:
    h = Harness(policy=Recorder(), rto_min=1.0)  # spray and single-path have no on_suspect
    _sample(h, 0.002)
    h.overtake(gap=0.0042)
    assert h.policy.calls and h.policy.named("suspect") == [] and h.r.lost_packet() is None


def test_packets_not_overtaken_are_never_declared_lost_by_rack() -> None:
    h = Harness(rto_min=1.0)
    _sample(h, 0.002)
    for seq in range(1, 5):
        h.send(seq, ev=seq % 2)
    h.now += 0.1  # far beyond any allowance, but nothing sent later has been acknowledged
    h.ack(1, 1)
    assert h.stats.losses_detected == 0


def test_peer_ack_delay_extends_the_allowance() -> None:
    h = Harness(rto_min=1.0)
    _sample(h, 0.002)
    # A hold of 3 ms within the 4 ms round trip it is part of (a longer one would be implausible).
    _, sent_at, _ = h.overtake(gap=0.004, delay_us=3000)
    assert h.r.loss_time() == pytest.approx(sent_at + _allowance(h, h.r._ev_rtt[0]) + 0.003)


def test_implausible_ack_delays_are_clamped() -> None:
    """A hold longer than the round trip is ignored; one beyond max_ack_delay counts as that."""
    h = Harness(rto_min=1.0)
    _sample(h, 0.002)
    _, sent_at, _ = h.overtake(gap=0.001, delay_us=3000)
    assert h.r.loss_time() == pytest.approx(sent_at + _allowance(h, h.r._ev_rtt[0]))
    h = Harness(rto_min=1.0)
    _sample(h, 0.002)
    _, sent_at, _ = h.overtake(gap=0.5, delay_us=0xFFFFFFFF)
    assert h.r._ack_allow == h.config.max_ack_delay


@settings(max_examples=60, deadline=None)
@given(
    rtts=st.lists(st.floats(0.0005, 0.02), min_size=1, max_size=8),
    window=st.floats(0.0, 2.0),
    late=st.floats(0.0, 0.05),
)
def test_rack_deadline_is_srtt_times_one_plus_window_plus_two_rttvar(
    rtts: list[float], window: float, late: float,
) -> None:
    h = Harness(rto_min=10.0, rto_max=10.0, reorder_window=window)
    for rtt in rtts:
        _sample(h, rtt)
    _, sent_at, _ = h.overtake(gap=late)
    deadline = sent_at + _allowance(h, h.r._ev_rtt[0])
    lost = h.stats.losses_detected == 1
    assert lost == (h.now >= deadline)
    if not lost:
        assert h.r.loss_time() == pytest.approx(deadline)


# ------------------------------------------------------------------------ spurious retransmissions


def _spurious_episode(h: Harness) -> None:
    """Packet n is overtaken, declared lost and resent; then the original's echo arrives."""
    n, original = h.overtake_and_resend()
    h.now += 0.0005
    assert h.ack(n + 2, n, echo=original) == [n]


def test_spurious_retransmission_is_counted_undone_and_widens_the_reordering_allowance() -> None:
    h = Harness(rto_min=1.0)
    _sample(h, 0.002)
    _spurious_episode(h)
    assert h.stats.spurious_retransmissions == 1
    assert len(h.cc.named("spurious")) == 1
    assert h.r._reorder_scale == 2.0
    # The next overtaken packet gets twice the reordering window.
    _, sent_at, _ = h.overtake(gap=0.0001)
    assert h.r.loss_time() == pytest.approx(sent_at + _allowance(h, h.r._ev_rtt[0], scale=2.0))


def test_the_widened_allowance_halves_again_after_a_quiet_spell() -> None:
    h = Harness(rto_min=1.0)
    _sample(h, 0.002)
    for _ in range(3):
        _spurious_episode(h)
    assert h.r._reorder_scale == 8.0
    h.now += 17 * h.rtt.srtt  # type: ignore[operator]
    h.overtake(gap=0.0)
    assert h.r._reorder_scale == 4.0


def test_a_late_echo_of_the_retransmission_itself_is_not_spurious() -> None:
    h = Harness(rto_min=1.0)
    _sample(h, 0.002)
    n, _ = h.overtake_and_resend()
    h.now += 0.001
    assert h.ack(n + 2, n) == [n]  # echoes the retransmission's timestamp
    assert h.stats.spurious_retransmissions == 0 and not h.cc.named("spurious")


def test_spurious_check_still_works_after_the_packet_was_acknowledged() -> None:
    # The retransmission is acknowledged first; the original's echo comes in a later ACK.
    h = Harness(rto_min=1.0)
    _sample(h, 0.002)
    n, original = h.overtake_and_resend()
    h.now += 0.001
    assert h.ack(n + 2, n) == [n]
    assert h.ack(n + 2, n, echo=original) == []
    assert h.stats.spurious_retransmissions == 1


# ------------------------------------------------------------------------------------- go-back-N


def test_nak_rewinds_everything_from_the_gap_once_per_rtt() -> None:
    h = Harness(recovery="gobackn", rto_min=1.0)
    _sample(h, 0.002)
    for seq in range(1, 6):
        h.send(seq, ev=seq % 3)
    h.now += 0.001
    h.ack(3, 4, nak=True)  # 1 and 2 arrived, 3 did not: the receiver discarded 4
    assert h.stats.gobackn_rewinds == 1
    assert h.resend_lost() == [3, 4, 5]
    assert h.policy.named("loss") == [(0, h.now)]  # the EV packet 3 went on
    h.ack(3, 5, nak=True)  # the same NAK again within an RTT: no second rewind
    assert h.stats.gobackn_rewinds == 1
    h.now += 0.003
    h.ack(3, 4, nak=True)
    assert h.stats.gobackn_rewinds == 2 and h.resend_lost() == [3, 4, 5]


def test_gobackn_timeout_rewinds_from_the_oldest_expired_packet() -> None:
    h = Harness(recovery="gobackn", rto_min=0.01)
    _sample(h, 0.001)
    for seq in range(1, 4):
        h.send(seq)
    h.fire()
    assert h.stats.timeouts == 1 and h.stats.gobackn_rewinds == 1
    assert h.resend_lost() == [1, 2, 3]


def test_gobackn_never_runs_rack() -> None:
    h = Harness(recovery="gobackn", rto_min=1.0)
    _sample(h, 0.002)
    h.send(1, ev=0)
    h.send(2, ev=1)
    h.now += 0.5
    h.ack(1, 2, sacked=(2,))
    assert h.stats.losses_detected == 0 and h.r._loss_time is None


# ------------------------------------------------------------------------- acknowledgment ledger


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.sets(st.integers(0, 63), max_size=8)), min_size=1, max_size=12))
def test_acks_in_any_order_acknowledge_each_packet_once(acks: list[tuple[int, set[int]]]) -> None:
    h = Harness(rto_min=10.0, rto_max=10.0)
    for seq in range(40):
        h.send(seq, ev=seq % 4)
    acknowledged: set[int] = set()
    for cum, bits in acks:
        h.now += 0.0001
        sacked = tuple(sorted(b for b in bits if b < 40))
        newly = h.ack(cum, cum - 1 if cum else 0, sacked=sacked)
        expect = ({s for s in range(cum)} | set(sacked)) - acknowledged
        assert sorted(newly) == sorted(expect)
        acknowledged |= expect
        assert set(h.r.sent) == set(range(40)) - acknowledged
        assert set(h.r.inflight) <= set(h.r.sent)
        assert h.r.una == min(h.r.sent, default=h.r.next_seq)
        assert h.r.lost_packet() is None or h.r.lost_packet().seq in h.r.sent  # type: ignore[union-attr]
    assert sum(s.acked for s in h.stats.per_ev.values()) == len(acknowledged)


@pytest.mark.parametrize("rate_mbps", [2.0, 4.0])
def test_a_slow_jumbo_path_whose_base_rtt_is_known_times_nothing_out_before_its_first_rtt(rate_mbps: float) -> None:
    # 9000-byte frames at 2-4 Mb/s: 18-36 ms to cross one link, a first round trip of 40-80 ms, against
    # the 15 ms (3 x initial_rtt) a timeout would otherwise allow before the first sample.
    from transport.sim.simnet import PathSpec, run_transfer

    path = PathSpec(rate_bps=rate_mbps * 1e6, delay=0.0005, queue_packets=256)
    frame_s = 9014 * 8 / path.rate_bps
    base_rtt = 2 * (frame_s + path.delay)
    cfg = TransportConfig(mtu=8972, link_rate_bps=path.rate_bps, base_rtt=base_rtt)
    assert cfg.rtt_guess == base_rtt > 3 * cfg.initial_rtt
    r = run_transfer(cfg, cfg, [path], total_bytes=16 * 65536, seed=3)
    snd = r.sender_metrics["sender"]
    assert r.completed and snd["timeouts"] == 0 and snd["retransmissions"] == 0, snd


@pytest.mark.parametrize("rate_mbps", [4.0, 100.0])
def test_an_overtaken_packet_may_trail_by_two_frames_on_the_link_before_it_is_lost(rate_mbps: float) -> None:
    from transport.core.recovery import REORDER_FRAMES

    plain, framed = Harness(ack_delay=0.0), Harness(ack_delay=0.0, link_rate_bps=rate_mbps * 1e6)
    deadlines = []
    for h in (plain, framed):
        _sample(h, 0.010)
        _n, sent, _ts = h.overtake()
        t = h.r.loss_time()
        assert t is not None
        deadlines.append(t - sent)
    frame_s = 8 * framed.config.wire_packet_bytes / framed.config.link_rate_bps
    assert deadlines[1] - deadlines[0] == pytest.approx(REORDER_FRAMES * frame_s)


# ------------------------------------------------------------------------ one-way delay


def _sample_owd(h: Harness, rtt: float, owd: int) -> None:
    seq = h.r.next_seq
    h.send(seq)
    h.now += rtt
    assert h.ack(seq + 1, seq, owd=owd) == [seq]


def test_the_way_outs_queueing_is_read_from_the_peers_one_way_delays() -> None:
    h = Harness()
    assert h.rtt.queueing is None  # until a peer reports one
    _sample_owd(h, 0.002, 2**32 - 500)  # the peer's clock 500 us behind ours, say
    assert h.rtt.queueing == 0.0
    # 1.5 ms more round trip, of which 0.3 ms on the way out (the rest queued on the way back).
    _sample_owd(h, 0.0035, 2**32 - 200)
    assert h.rtt.queueing == pytest.approx(0.0003)


def test_a_peer_cannot_claim_more_queueing_on_the_way_out_than_the_round_trip_had() -> None:
    h = Harness()
    _sample_owd(h, 0.002, 1000)
    _sample_owd(h, 0.003, 1000 + 10**6)  # "a second of queueing" in a round trip 1 ms over its least
    assert h.rtt.queueing == pytest.approx(0.001)
