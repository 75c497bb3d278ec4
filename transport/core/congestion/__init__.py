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
from transport.core.congestion.credit import CreditControl
from transport.core.congestion.delay import DelayBased
from transport.core.congestion.fixed import FixedWindow
from transport.core.congestion.nscc import Nscc

register_congestion_control("delay", DelayBased.from_config,
                            "Swift-like delay-based window toward a target queueing delay, decrease on loss")
register_congestion_control("fixed", FixedWindow.from_config, "a constant --window, paced over the RTT")
register_congestion_control("credit", CreditControl.from_config,
                            "receiver-driven credit (EQDS / UE RCCC): one BDP unscheduled, then only on the "
                            "receiver's credit, paced at its link rate")
register_congestion_control("nscc", Nscc.from_config,
                            "UE NSCC: four quadrants of delay against target x ECN (delay alone where nothing "
                            "marks), constants of uet-htsim scaled by BDP")

__all__ = [
    "CONTROLLERS", "CcConfig", "CcFactory", "CongestionControl", "CreditControl", "DelayBased", "FixedWindow",
    "Nscc", "Pacer", "WindowControl", "make_cc", "register_congestion_control",
]
