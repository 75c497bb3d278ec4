"""What every congestion controller is: the interface, the pacer, the window both built-ins share, and
the registry that builds a controller by name.

Windows are in packets (floats, so additive increase can grow by fractions of a packet per ACK).
``pacing_rate`` is in packets per second, or None until an RTT is known.

A controller reads the smoothed and minimum RTT from the ``RttEstimator`` it is given: inside a
connection that is the one loss recovery keeps, already updated with the sample ``on_ack`` reports.
A controller built alone keeps its own and updates it in ``on_ack``.

A controller is built by its factory, ``factory(config, rtt)``, from the connection's configuration
(`CcConfig`: the fields controllers read) and the RTT estimate to share. ``CONTROLLERS`` holds the
factories by name; transport/core/congestion/__init__.py registers the built-ins.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from transport.core.registry import Registry
from transport.core.rtt import RttEstimator


class CongestionControl(Protocol):
    name: str

    @property
    def window(self) -> float: ...

    @property
    def pacing_rate(self) -> float | None: ...

    def on_ack(self, rtt: float, acked: int, now: float) -> None: ...

    def on_loss(self, now: float, share: float = 1.0) -> None: ...

    def on_timeout(self, now: float) -> None: ...

    def on_spurious(self, now: float) -> None: ...

    def state(self) -> dict: ...


class CcConfig(Protocol):
    """The fields of the transport's configuration a controller's factory may read (TransportConfig)."""

    window: int
    max_window: int
    target_delay: float
    target_packets: float
    pacing: bool
    base_rtt: float  # 0 = unknown

    @property
    def initial_window(self) -> int: ...  # one BDP where known, else window

    @property
    def bdp_packets(self) -> float | None: ...


CcFactory = Callable[[CcConfig, "RttEstimator | None"], CongestionControl]

CONTROLLERS: Registry[CcFactory] = Registry("congestion control")


def register_congestion_control(name: str, factory: CcFactory, summary: str) -> None:
    """Make `name` a choice of ``TransportConfig.cc`` (and of every command's --cc)."""
    CONTROLLERS.register(name, factory, summary)


def make_cc(name: str, config: CcConfig, rtt: RttEstimator | None = None) -> CongestionControl:
    """The controller `name` for `config`. ``rtt``: the estimate to read, kept up to date by its owner
    (loss recovery); None = keep one."""
    return CONTROLLERS.get(name)(config, rtt)


@dataclass(slots=True)
class Pacer:
    """When the next paced transmission is due; the connection's send loop advances it, banking up
    to ``burst`` packet intervals of idle time."""

    burst: int = 4
    next_time: float = float("-inf")


class WindowControl:
    """What both controllers share: a window in packets, pacing it over the smoothed RTT, and the
    RTT estimate they read (loss recovery's, or their own when built alone)."""

    def __init__(self, window: float, pacing: bool = True, rtt: RttEstimator | None = None) -> None:
        self._window = float(window)
        self._pacing = pacing
        self._own_rtt = rtt is None
        self.rtt = RttEstimator() if rtt is None else rtt

    @property
    def window(self) -> float:
        return self._window

    @property
    def srtt(self) -> float | None:
        return self.rtt.srtt

    @property
    def min_rtt(self) -> float | None:
        return self.rtt.min_rtt

    def _paced(self, gain: float) -> float | None:
        """``gain`` windows per smoothed RTT, or None without pacing or an RTT."""
        srtt = self.rtt.srtt
        if not self._pacing or srtt is None:
            return None
        return gain * self._window / srtt
