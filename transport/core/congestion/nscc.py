"""NSCC-style sender congestion control (`cc="nscc"`): the Ultra Ethernet transport's sender-based
controller, after uet-htsim's `htsim/sim/uec.cpp` (UecSrc::updateCwndOnAck_NSCC and its helpers).

Each ACK falls in one of four quadrants, queueing delay (RTT minus the base RTT) against a target
times ECN-marked or not:

* delay below target, not marked: proportional increase, by how far below the target the delay is
  (with a fast increase once a whole window has seen almost no queueing);
* delay at or above target, not marked: fair increase, a constant per acknowledged packet, so flows
  sharing a bottleneck converge to equal windows;
* delay at or above target, marked: multiplicative decrease by the smoothed delay's excess over the
  target, by at most half, at most once per base RTT;
* delay below target, marked: nothing (the mark is from another path's queue).

Increases are collected and applied (divided by the window) every 8 packets or once per base RTT,
plus a small constant ``eta`` per base RTT. Quick adapt: once per base RTT + target, after a loss or
when the delay exceeds four targets, a window that delivered less than an eighth of the maximum
window is cut to what it delivered. A loss also takes one packet off the window; a timeout quick-
adapts, or halves the window when quick adapt does not apply.

Constants and their scaling. htsim's reference network is 100 Gb/s with a 12 us RTT (BDP 150 kB, 36.6
of its 4096-byte MSS), with the target queueing delay equal to the network RTT. fabriclab runs at
Mb/s, so sizes are scaled by BDP and times by the base RTT, as htsim scales them itself
(``_scaling_factor_a`` = BDP / reference BDP, ``_scaling_factor_b`` = target / reference RTT):

* a = BDP in packets / 36.6; the BDP is the configuration's (TransportConfig.bdp_packets: link rate x
  base RTT) or, while the link rate is unknown, the initial window;
* the target is the base RTT (the configuration's, else the measured minimum RTT), so b = 1;
* per ACK of k packets, window W in packets: proportional increase 4 a b k (target - delay) / target / W
  (htsim's alpha = 4 MSS a b / target); fair increase 5 a k / W (htsim's fi = 5 MSS a); fast
  increase 0.25 a k (fi_scale) when the delay is under target / 12 (htsim's 1 us of 12 us); eta =
  0.15 a per base RTT; decrease factor gamma = 0.8; quick adapt threshold 4 targets, gate maximum
  window / 8 (qa_gate 3); maximum window 1.5 BDP (htsim's _maxwnd; capped at max_window);
* htsim smooths the delay with weight 0.0125 per ACK at ~37 packets per RTT; the weight here is
  0.0125 x 36.6 / BDP (at most 0.5), so the smoothing spans the same number of RTTs.

ECN. The ACK echoes how many of the packets it answers arrived CE-marked (`on_ecn` hears of it before
`on_ack`). Once a connection has seen a mark it follows the quadrants above. Until then the smoothed
delay above target stands in for the mark, as a RED queue marks on its average length. On the
project's own machine the kernel has no RED qdisc and OVS cannot mark on queue length, so nothing is
ever marked there and NSCC runs on delay alone.
"""

from __future__ import annotations

from transport.core.congestion.base import CcConfig, WindowControl
from transport.core.rtt import RttEstimator

REF_BDP_PACKETS = 100e9 / 8 * 12e-6 / 4096  # htsim's reference: 100 Gb/s x 12 us in 4096-byte MSS
FAIR_INCREASE = 5.0
PROPORTIONAL = 4.0
FAST_INCREASE = 0.25
FAST_DELAY = 1.0 / 12  # of the target: htsim's 1 us at a 12 us target
ETA = 0.15
GAMMA = 0.8
MAX_MDF = 0.5
QA_THRESHOLD = 4.0  # targets
QA_GATE = 3  # quick adapt only below max_window >> QA_GATE delivered
ADJUST_PACKETS = 8
DELAY_ALPHA = 0.0125
MAX_WINDOW_BDP = 1.5


class Nscc(WindowControl):
    """NSCC's four quadrants over a window in packets (see the module docstring for the rules and
    the scaling of htsim's constants)."""

    name = "nscc"

    def __init__(
        self,
        initial_window: int,
        max_window: int,
        *,
        bdp: float | None = None,
        base_rtt: float | None = None,
        pacing: bool = True,
        min_window: float = 1.0,
        rtt: RttEstimator | None = None,
    ) -> None:
        super().__init__(initial_window, pacing, rtt)
        bdp = bdp if bdp and bdp > 0 else float(initial_window)
        self.bdp = bdp
        self.a = bdp / REF_BDP_PACKETS
        self.max_window = min(float(max_window), max(MAX_WINDOW_BDP * bdp, float(initial_window)))
        self.min_window = min_window
        self._base_rtt = base_rtt if base_rtt and base_rtt > 0 else None
        self.delay_alpha = min(0.5, DELAY_ALPHA * REF_BDP_PACKETS / bdp)
        self.avg_delay = 0.0
        self.ecn_seen = False
        self._pending_ce = 0
        self._inc = 0.0  # increases collected until the next adjustment (packets^2)
        self._received = 0
        self._last_adjust = 0.0
        self._last_decrease = float("-inf")
        self._fi_count = 0.0
        self._fast = False
        self._achieved = 0.0
        self._qa_end = 0.0
        self._trigger_qa = False
        self.quadrants = {"proportional": 0, "fair": 0, "decrease": 0, "noop": 0}
        self.quick_adapts = 0
        self.decreases = 0

    @property
    def pacing_rate(self) -> float | None:
        return self._paced(1.25)

    @property
    def base_rtt(self) -> float | None:
        return self._base_rtt if self._base_rtt is not None else self.rtt.min_rtt

    def on_ecn(self, marked: int, now: float) -> None:
        """The next ACK's echo: ``marked`` of the packets it answers arrived CE-marked."""
        self._pending_ce += marked
        self.ecn_seen = True

    def on_ack(self, rtt: float, acked: int, now: float) -> None:
        if rtt <= 0:
            return
        if self._own_rtt:
            self.rtt.update(rtt)
        base = self.base_rtt
        if base is None:
            return
        target = base
        q = self.rtt.queueing
        if q is not None:
            # Less what the ACK queued on the way back, where the peer reports one-way delays (see
            # DelayBased.on_ack): the round trip as if only the way out had queued.
            rtt = self.rtt.min_rtt + q  # type: ignore[operator]  # not None: this sample is in it
        delay = rtt - base if rtt > base else 0.0
        marked_ce = self._pending_ce > 0
        self._pending_ce = 0
        alpha = self.delay_alpha
        if self.ecn_seen:
            # htsim's update_delay: a high delay without a mark is another path's queue, pulled down.
            sample = base * 0.25 if (not marked_ce and delay > target) else delay
            marked = marked_ce
        else:
            sample = delay
        self.avg_delay = alpha * sample + (1 - alpha) * self.avg_delay
        if not self.ecn_seen:
            marked = self.avg_delay > target
        self._achieved += acked
        self._received += acked
        if self._quick_adapt(False, delay, target, now):
            return
        w = self._window
        q = self.quadrants
        if not marked:
            if delay >= target:
                self._inc += FAIR_INCREASE * self.a * acked
                self._fast = False
                self._fi_count = 0.0
                q["fair"] += 1
            else:
                q["proportional"] += 1
                if delay < FAST_DELAY * target:
                    self._fi_count += acked
                    if self._fi_count > w or self._fast:
                        self._window = w + acked * FAST_INCREASE * self.a
                        self._fast = True
                else:
                    self._fi_count = 0.0
                    self._fast = False
                if not self._fast:
                    self._inc += PROPORTIONAL * self.a * acked * (target - delay) / target
        elif delay >= target:
            q["decrease"] += 1
            self._fast = False
            self._fi_count = 0.0
            avg = self.avg_delay
            if avg > target and now - self._last_decrease > base:
                self._window = w * max(1 - GAMMA * (avg - target) / avg, MAX_MDF)
                self._last_decrease = now
                self.decreases += 1
        else:
            q["noop"] += 1
        self._bound()
        if self._received > ADJUST_PACKETS or now - self._last_adjust > base:
            self._window += self._inc / self._window
            if now - self._last_adjust >= base:
                self._window += ETA * self.a
                self._last_adjust = now
            self._inc = 0.0
            self._received = 0
            self._bound()

    def _bound(self) -> None:
        if self._window < self.min_window:
            self._window = self.min_window
        elif self._window > self.max_window:
            self._window = self.max_window

    def _quick_adapt(self, loss: bool, delay: float, target: float, now: float) -> bool:
        """htsim's quick_adapt: once per base RTT + target, cut a window that delivered little after a
        loss or a very high delay to what it delivered."""
        done = False
        if now > self._qa_end:
            if (self._qa_end != 0 and (self._trigger_qa or loss or delay > QA_THRESHOLD * target)
                    and self._achieved < self.max_window / (1 << QA_GATE)):
                self._window = max(self._achieved, self.min_window)
                self._trigger_qa = False
                self.quick_adapts += 1
                done = True
            self._achieved = 0.0
            base = self.base_rtt or 0.0
            self._qa_end = now + base + target
        if done:
            self._inc = 0.0
            self._received = 0
        return done

    def on_loss(self, now: float, share: float = 1.0) -> None:
        self._trigger_qa = True
        base = self.base_rtt
        if base is None or not self._quick_adapt(True, 0.0, base, now):
            self._window = max(self.min_window, self._window - 1.0)

    def on_timeout(self, now: float) -> None:
        self._trigger_qa = True
        base = self.base_rtt
        if base is None or not self._quick_adapt(True, 0.0, base, now):
            self._window = max(self.min_window, self._window / 2)

    def on_spurious(self, now: float) -> None:
        pass

    def state(self) -> dict:
        return {
            "window": self._window, "bdp": self.bdp, "a": self.a, "base_rtt": self.base_rtt,
            "avg_delay": self.avg_delay, "ecn_seen": self.ecn_seen, "quadrants": dict(self.quadrants),
            "quick_adapts": self.quick_adapts, "decreases": self.decreases,
        }

    @classmethod
    def from_config(cls, config: CcConfig, rtt: RttEstimator | None = None) -> Nscc:
        return cls(config.initial_window, config.max_window, bdp=config.bdp_packets, base_rtt=config.base_rtt,
                   pacing=config.pacing, rtt=rtt)
