"""What a running fabric is measured by while traffic crosses it: the controller's per-link counters and
the CPU's idle time, sampled every half second (`Sampler`), the queue counters of the shaped
interfaces from `tc -s qdisc show` (`qdisc_drops`), read before and after, and one interface's queue
over time (`QueueWatcher`: an incast's receiver downlink).
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
    (fraction of the machine idle since the previous sample), "steal" (fraction the hypervisor gave to
    other guests: neither idle nor ours), "dt" (seconds that sample covers)}.
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
            steal = cpu.steal_fraction(prev, now) or 0.0
            t = time.monotonic()
            if idle is not None:
                self.cpu.append({"t": t, "idle": round(idle, 4), "steal": round(steal, 4), "dt": round(t - prev_t, 3)})
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


_BACKLOG_RX = re.compile(r"^qdisc \S+ \S+ (?:dev \S+ )?root.*?backlog (\d+)b (\d+)p", re.M | re.S)


def parse_root_backlog(text: str) -> tuple[int, int] | None:
    """(bytes, packets) queued at the root qdisc of one interface's `tc -s qdisc show dev X`."""
    m = _BACKLOG_RX.search(text)
    return (int(m.group(1)), int(m.group(2))) if m else None


class QueueWatcher(threading.Thread):
    """Samples the backlog of one interface's egress queue every `interval` seconds, from outside the
    node's shell (nsenter into its network namespace), so the runner's own use of the shell is free.

    `samples`: {"t": monotonic time, "bytes", "packets"}."""

    def __init__(self, netns_pid: int | None, interface: str, interval: float = 0.05) -> None:
        super().__init__(daemon=True, name=f"fabriclab-queue-{interface}")
        self.cmd = ["tc", "-s", "qdisc", "show", "dev", interface]
        if netns_pid:
            self.cmd = ["nsenter", "-t", str(netns_pid), "-n", *self.cmd]
        self.interval = interval
        self.samples: list[dict[str, float]] = []
        self._stop_evt = threading.Event()

    def run(self) -> None:
        while not self._stop_evt.wait(self.interval):
            try:
                out = subprocess.run(self.cmd, capture_output=True, text=True, timeout=5).stdout
            except (OSError, subprocess.SubprocessError) as exc:
                log.debug("queue sample: %s", exc)
                continue
            got = parse_root_backlog(out)
            if got is not None:
                self.samples.append({"t": time.monotonic(), "bytes": got[0], "packets": got[1]})

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(timeout=5)
