"""The fixed window: a constant number of packets in flight, paced over the smoothed RTT."""

from __future__ import annotations

from transport.core.congestion.base import CcConfig, WindowControl
from transport.core.rtt import RttEstimator


class FixedWindow(WindowControl):
    """A constant window; pacing spreads it over the smoothed RTT."""

    name = "fixed"

    @property
    def pacing_rate(self) -> float | None:
        return self._paced(1.5)

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
    def from_config(cls, config: CcConfig, rtt: RttEstimator | None = None) -> FixedWindow:
        return cls(config.window, pacing=config.pacing, rtt=rtt)
