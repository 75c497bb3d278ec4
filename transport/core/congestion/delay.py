"""Swift-like delay-based congestion control: AIMD toward a target queueing delay, a multiplicative
decrease on loss scaled by the lossy EVs' share of the window, and the undo of a spurious decrease."""

from __future__ import annotations

from transport.core.congestion.base import CcConfig, WindowControl
from transport.core.rtt import RttEstimator


class DelayBased(WindowControl):
    """Swift-like: grow while queueing delay (on the way out where the peer reports one-way delays,
    else the RTT minus the minimum RTT) is below target, shrink
    in proportion to the excess, and shrink multiplicatively on loss -- each decrease at most once
    per RTT. Until the first decrease the window doubles per RTT (slow start), so short transfers
    are not dominated by the ramp.

    Random loss on one of many sprayed paths is not congestion of the others, so the loss decrease
    (``loss_beta``) is scaled by the share of the window on the EVs that lost; delay stays the
    primary signal, as in Swift and SRD.
    """

    name = "delay"

    def __init__(
        self,
        initial_window: int,
        max_window: int,
        target_delay: float,
        *,
        target_packets: float = 0.0,
        pacing: bool = True,
        ai: float = 1.0,
        beta: float = 0.8,
        max_mdf: float = 0.5,
        loss_beta: float = 0.25,
        min_window: float = 1.0,
        rtt: RttEstimator | None = None,
    ) -> None:
        super().__init__(initial_window, pacing, rtt)
        self.max_window = float(max_window)
        self.min_window = min_window
        self.target_delay = target_delay
        self.target_packets = target_packets
        self.target = target_delay  # the target in force (see _target)
        self.ai = ai
        self.beta = beta
        self.max_mdf = max_mdf
        self.loss_beta = loss_beta
        self.slow_start = True
        self._last_decrease = float("-inf")
        self.decreases = 0
        # Window before the latest loss/timeout decrease, while that decrease may still be undone.
        self._undo_window: float | None = None
        self.undone = 0

    @property
    def pacing_rate(self) -> float | None:
        # Pace a little faster than window/RTT so pacing smooths bursts without capping throughput.
        return self._paced(2.0 if self.slow_start else 1.25)

    def _can_decrease(self, now: float) -> bool:
        return now - self._last_decrease >= (self.rtt.srtt or 0.0)

    def _decrease(self, factor: float, now: float) -> None:
        self._undo_window = None
        self._window = max(self.min_window, self._window * factor)
        self._last_decrease = now
        self.slow_start = False
        self.decreases += 1

    def on_ack(self, rtt: float, acked: int, now: float) -> None:
        if rtt <= 0:
            return
        est = self.rtt
        if self._own_rtt:
            est.update(rtt)
        # The way out's queueing where the peer reports one-way delays: the round trip's excess also
        # holds whatever the ACK met on the way back, queued behind the peer's own data, which this
        # window cannot drain and, taken for its own, halves it whenever the traffic runs both ways.
        q = est.queueing
        delay = rtt - est.min_rtt if q is None else q  # type: ignore[operator]  # not None: this sample is in it
        target = self.target = self._target(est.srtt)
        if self.slow_start and delay >= target / 2:
            # Leave slow start early: the delay signal lags a doubling window by an RTT.
            self.slow_start = False
        if delay < target:
            if self.slow_start:
                self._window += acked
            else:
                self._window += self.ai * acked / self._window
            if self._window > self.max_window:
                self._window = self.max_window
        elif self._can_decrease(now):
            factor = 1.0 - self.beta * (delay - target) / delay
            self._decrease(max(factor, 1.0 - self.max_mdf), now)

    def _target(self, srtt: float | None) -> float:
        """The queueing delay to aim for: ``target_delay``, but at least ``target_packets`` packets'
        worth at the connection's own rate (srtt / window per packet).

        A fixed target in seconds only suits one link rate: at a few Mb/s one packet takes about as
        long to serialise as a 2 ms target, so the window could never keep a queue of even one packet
        and the link idled. Store-and-forward hops also add a packet time each to every RTT (and
        HTB's token bucket lets the first packets through at once, so the minimum RTT misses them);
        Swift scales its target with the hop count for the same reason. Counting in packets at the
        flow's own rate keeps the target meaningful from Mb/s emulators to fast simulated paths,
        where the floor ``target_delay`` governs.
        """
        if self.target_packets <= 0 or srtt is None:
            return self.target_delay
        # Compared, not max()ed: this runs on every ACK and builtin calls are dear there.
        window = self._window if self._window > 1.0 else 1.0
        target = self.target_packets * srtt / window
        return target if target > self.target_delay else self.target_delay

    def on_loss(self, now: float, share: float = 1.0) -> None:
        """``share``: fraction of the window that was on the EVs that lost. With spraying, a loss
        on one path says little about the others, so the decrease scales with that share (as
        coupled multipath congestion control decreases only the subflow that lost)."""
        if self._can_decrease(now):
            before = self._window
            self._decrease(1.0 - self.loss_beta * min(1.0, max(share, 0.0)), now)
            self._undo_window = before

    def on_timeout(self, now: float) -> None:
        if self._can_decrease(now):
            before = self._window
            self._decrease(1.0 - self.max_mdf, now)
            self._undo_window = before

    def on_spurious(self, now: float) -> None:
        """A retransmission turned out unnecessary (the original arrived): the loss or timeout
        that caused it was reordering or delay, not congestion, so the decrease it triggered is
        undone (as TCP's Eifel / F-RTO undo). A delay-driven decrease since then stands."""
        if self._undo_window is not None:
            self._window = min(self.max_window, max(self._window, self._undo_window))
            self._undo_window = None
            self.undone += 1

    def state(self) -> dict:
        return {
            "window": self._window, "min_rtt": self.min_rtt, "target": self.target, "decreases": self.decreases,
            "undone": self.undone,
        }

    @classmethod
    def from_config(cls, config: CcConfig, rtt: RttEstimator | None = None) -> DelayBased:
        return cls(config.initial_window, config.max_window, config.target_delay, target_packets=config.target_packets,
                   pacing=config.pacing, rtt=rtt)
