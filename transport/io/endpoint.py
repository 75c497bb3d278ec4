"""UDP endpoints that drive sans-I/O transport `Connection`s over real sockets: the names to import.

The protocol core never touches a clock or a socket; the endpoints are the thin I/O shell around it,
in modules of their own:

* transport/io/eventloop.py — the event loop, poller and socket tuning every endpoint shares;
* transport/io/sender.py — `Sender`, one connection over one UDP socket per entropy value (EV);
* transport/io/receiver.py — `Receiver`, one port serving any number of connections;
* transport/io/workload.py — `Workload` and the generated, verifiable messages;
* transport/io/addressing.py — default ports, name resolution, the largest datagram a path takes.

This module gathers their public names (`from transport.io.endpoint import Sender, Receiver, ...`) and
holds what a process around an endpoint needs: the ready file and the atomic JSON results file. None
of them imports scapy.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from transport.core.metrics import preload as preload_metrics
from transport.io.addressing import (
    DEFAULT_BASE_PORT,
    DEFAULT_PORT,
    local_datagram_size,
    path_datagram_size,
    resolve,
)
from transport.io.eventloop import EndpointError, socket_drops
from transport.io.receiver import Receiver
from transport.io.sender import Sender
from transport.io.workload import SEQ_LEN, Workload, check_payload, make_payload, payload_seq

__all__ = [
    "DEFAULT_BASE_PORT", "DEFAULT_PORT", "SEQ_LEN", "EndpointError", "Receiver", "Sender", "Workload",
    "announce_ready", "check_payload", "local_datagram_size", "make_payload", "path_datagram_size",
    "payload_seq", "resolve", "socket_drops", "write_json",
]


def announce_ready(path: str | None) -> None:
    """Create `path` (atomically) once the endpoint's sockets are open: the runner starts traffic only
    when every endpoint has done so, so start-up (imports, binding) stays out of the measured window."""
    if path:
        preload_metrics()
        write_json({"pid": os.getpid(), "t": time.monotonic()}, path)


def write_json(metrics: dict[str, Any], path: str | None) -> None:
    """Write metrics as JSON to `path` atomically (a reader never sees half a file)."""
    if not path:
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(metrics, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)

