"""The congestion controller of receiver-driven credit (`cc="credit"`); the protocol itself, and its rules,
are in transport.core.credit."""

from __future__ import annotations

from transport.core.congestion.base import CcConfig
from transport.core.congestion.fixed import FixedWindow
from transport.core.rtt import RttEstimator


class CreditControl(FixedWindow):
    """The congestion controller of `cc="credit"`: the receiver's credit paces and limits the sender
    (Connection consults its CreditSender), so the window, fixed at max_window, only bounds memory, the
    sender does not pace itself, and loss and delay signals are left to the receiver (as the fixed
    window ignores them)."""

    name = "credit"
    receiver_driven = True

    @property
    def pacing_rate(self) -> float | None:
        return None

    @classmethod
    def from_config(cls, config: CcConfig, rtt: RttEstimator | None = None) -> CreditControl:
        return cls(config.max_window, pacing=False, rtt=rtt)
