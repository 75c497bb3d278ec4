"""The congestion controller of receiver-driven credit (`cc="credit"`); the protocol itself, and its rules,
are in transport.core.credit."""

from __future__ import annotations

from transport.core.congestion.base import CcConfig, WindowControl
from transport.core.rtt import RttEstimator


class CreditControl(WindowControl):
    """The congestion controller of `cc="credit"`: the receiver's credit paces and limits the sender
    (Connection consults its CreditSender), so the window only bounds memory (max_window) and the
    sender does not pace itself; loss and delay signals are the receiver's business."""

    name = "credit"
    receiver_driven = True

    @property
    def pacing_rate(self) -> float | None:
        return None

    def on_ack(self, rtt: float, acked: int, now: float) -> None:
        if self._own_rtt:
            self.rtt.update(rtt)

    def on_loss(self, now: float, share: float = 1.0) -> None:
        pass

    def on_timeout(self, now: float) -> None:
        pass

    def on_spurious(self, now: float) -> None:
        pass

    def state(self) -> dict:
        return {"window": self._window}

    @classmethod
    def from_config(cls, config: CcConfig, rtt: RttEstimator | None = None) -> CreditControl:
        return cls(config.max_window, pacing=False, rtt=rtt)
