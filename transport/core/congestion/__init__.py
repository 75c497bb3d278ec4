"""Congestion control behind one interface (transport.core.congestion.base), chosen by name.

The built-ins register here, one line each; a new controller is a module of its own beside them and
one more `register_congestion_control` line (or that call from anywhere before the connection is built).
"""

from transport.core.congestion.base import (
    CONTROLLERS,
    CcConfig,
    CcFactory,
    CongestionControl,
    Pacer,
    WindowControl,
    make_cc,
    register_congestion_control,
)
from transport.core.congestion.delay import DelayBased
from transport.core.congestion.fixed import FixedWindow

register_congestion_control("delay", DelayBased.from_config,
                            "Swift-like delay-based window toward a target queueing delay, decrease on loss")
register_congestion_control("fixed", FixedWindow.from_config, "a constant --window, paced over the RTT")

__all__ = [
    "CONTROLLERS", "CcConfig", "CcFactory", "CongestionControl", "DelayBased", "FixedWindow", "Pacer",
    "WindowControl", "make_cc", "register_congestion_control",
]
