"""What a running fabric is measured by while traffic crosses it: the controller's per-link counters and
the CPU's idle time, sampled every half second (`Sampler`), and the queue counters of the shaped
interfaces from `tc -s qdisc show` (`qdisc_drops`), read before and after.
"""

from __future__ import annotations

import logging
import re
import subprocess
import threading
import time
from typing import Any

from emulator import cpu

log = logging.getLogger(__name__)

SAMPLE_INTERVAL = 0.5


class Sampler(threading.Thread):
    """Polls the controller's link counters and /proc/stat every `interval` seconds.

    `samples`: {"t": monotonic time, "links": the controller's GET /links rows}; `cpu`: {"t", "idle"
    (fraction of the machine idle since the previous sample), "dt" (seconds that sample covers)}.
    """

    def __init__(self, fab: Any, interval: float = SAMPLE_INTERVAL) -> None:
        super().__init__(daemon=True, name="fabriclab-sampler")
        self.fab = fab
        self.interval = interval
        self.samples: list[dict[str, Any]] = []
        self.cpu: list[dict[str, float]] = []
        self.errors = 0
        self._stop_evt = threading.Event()

    def sample_once(self) -> None:
        try:
            links = self.fab.api.links()
            self.samples.append({"t": time.monotonic(), "links": links.get("links", [])})
        except Exception as exc:  # a slow or restarting controller must not end the arm
            self.errors += 1
            log.debug("link sample failed: %s", exc)

    def run(self) -> None:
        prev = cpu.cpu_times()
        prev_t = time.monotonic()
        while not self._stop_evt.wait(self.interval):
            self.sample_once()
            now = cpu.cpu_times()
            idle = cpu.idle_fraction(prev, now)
            t = time.monotonic()
            if idle is not None:
                self.cpu.append({"t": t, "idle": round(idle, 4), "dt": round(t - prev_t, 3)})
            prev, prev_t = now, t

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(timeout=5)


_QDISC_RX = re.compile(r"^qdisc (\S+) (\S+) dev (\S+) (root|parent \S+).*?\n\s*Sent (\d+) bytes (\d+) pkt "
                       r"\(dropped (\d+), overlimits (\d+) requeues (\d+)\)", re.M)


def parse_qdisc_drops(text: str) -> dict[str, dict[str, int]]:
    """Per interface, from `tc -s qdisc show`: packets sent and dropped at its root qdisc (which counts
    its children's drops too)."""
    out: dict[str, dict[str, int]] = {}
    for m in _QDISC_RX.finditer(text):
        if m.group(4) != "root":
            continue
        out[m.group(3)] = {"sent_packets": int(m.group(6)), "dropped": int(m.group(7))}
    return out


def qdisc_drops(fab: Any) -> dict[str, dict[str, int]]:
    """Root-qdisc counters of every shaped interface: those in the root namespace (switch ends, when
    the switches share the system's daemon), then those in every node's own namespace."""
    result: dict[str, dict[str, int]] = {}
    try:
        out = subprocess.run(["tc", "-s", "qdisc", "show"], capture_output=True, text=True, timeout=20)
        result.update(parse_qdisc_drops(out.stdout))
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("tc -s qdisc: %s", exc)
    for node in fab.namespaced_nodes():
        try:
            result.update(parse_qdisc_drops(node.cmd("tc -s qdisc show")))
        except Exception as exc:
            log.debug("tc in %s: %s", node.name, exc)
    return result
