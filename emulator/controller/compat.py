"""The one place that knows whether the OpenFlow framework is os-ken or Ryu (same app API).

os-ken (OpenStack's maintained fork, native threads) is used when present; Ryu (`ryu.*`, eventlet)
is the fallback. Ryu's last release does not start on Python 3.10+, so the Ryu path matters only for
older interpreters.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

try:
    # app_manager must be imported before controller (the other order is a circular import);
    # isort's order keeps it that way.
    from os_ken import cfg
    from os_ken.base import app_manager
    from os_ken.controller import controller, ofp_event  # controller registers --ofp-* options
    from os_ken.controller.handler import (
        CONFIG_DISPATCHER,
        DEAD_DISPATCHER,
        MAIN_DISPATCHER,
        set_ev_cls,
    )
    from os_ken.lib import hub
    from os_ken.lib.packet import arp, ethernet, packet
    from os_ken.ofproto import nicira_ext, ofproto_v1_3, ofproto_v1_3_parser

    FRAMEWORK = "os-ken"
    PROJECT = "os_ken"
    BaseApp = app_manager.OSKenApp
except ImportError:  # pragma: no cover - only on interpreters where Ryu still runs
    from ryu.lib import hub

    # Ryu's hub is eventlet: patch first, as ryu-manager does, so that Ryu and our threads, locks
    # and sockets are all green.
    hub.patch(thread=True)

    from ryu import cfg
    from ryu.base import app_manager
    from ryu.controller import controller, ofp_event
    from ryu.controller.handler import (
        CONFIG_DISPATCHER,
        DEAD_DISPATCHER,
        MAIN_DISPATCHER,
        set_ev_cls,
    )
    from ryu.lib.packet import arp, ethernet, packet
    from ryu.ofproto import nicira_ext, ofproto_v1_3, ofproto_v1_3_parser

    FRAMEWORK = "ryu"
    PROJECT = "ryu"
    BaseApp = app_manager.RyuApp

# OVS's enum nx_hash_fields; the frameworks name only the first two values.
NX_HASH_FIELDS_SYMMETRIC_L3L4_UDP = 3

__all__ = [
    "CONFIG_DISPATCHER",
    "DEAD_DISPATCHER",
    "FRAMEWORK",
    "MAIN_DISPATCHER",
    "NX_HASH_FIELDS_SYMMETRIC_L3L4_UDP",
    "BaseApp",
    "arp",
    "controller",
    "ethernet",
    "hub",
    "nicira_ext",
    "ofp_event",
    "ofproto_v1_3",
    "ofproto_v1_3_parser",
    "packet",
    "run_apps",
    "set_ev_cls",
    "spawn",
]


def run_apps(app_modules: list[str], of_host: str, of_port: int) -> None:
    """Start the OpenFlow listener on of_host:of_port and run the apps; blocks until they stop."""
    cfg.CONF(
        args=["--ofp-listen-host", of_host, "--ofp-tcp-listen-port", str(of_port)],
        project=PROJECT,
    )
    log.info("starting %s apps %s, OpenFlow on %s:%d", FRAMEWORK, app_modules, of_host, of_port)
    app_manager.AppManager.run_apps(app_modules)


def spawn(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Start a background task in the framework's own threading model."""
    return hub.spawn(func, *args, **kwargs)
