"""Where the CPU goes while an emulated fabric carries traffic: machine idle time and per-component CPU.

An emulator's numbers are only right while the CPU keeps up (Mininet-HiFi kept at least 35 % idle).
`cpu_times` / `idle_fraction` read the machine's aggregate idle time from /proc/stat; `CpuLedger`
charges CPU seconds over a window to the processes that spent them: Open vSwitch (whose thread also
runs the kernel's forwarding work for the packets it sends), the controller, the runner itself, and
whatever else ran (kernel threads, softirqs on other cores, unrelated processes). Endpoints report
their own CPU time in their metrics, because they have exited by the time the window closes.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass, field
from pathlib import Path

from emulator.procs import proc_stat_fields

OVS_PIDFILE = Path("/var/run/openvswitch/ovs-vswitchd.pid")
_HZ = os.sysconf("SC_CLK_TCK")


def cpu_times() -> tuple[int, int, int]:
    """(idle, total, steal) jiffies from /proc/stat's aggregate line; hosts share the kernel, so it is
    global. Steal is time the hypervisor gave this machine's CPUs to other guests while they had work:
    part of `total` and not idle (the emulator lost it all the same), but nothing here spent it."""
    with open("/proc/stat") as fh:
        parts = fh.readline().split()
    values = [int(x) for x in parts[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    steal = values[7] if len(values) > 7 else 0
    return idle, sum(values[:8]), steal


def idle_fraction(before: tuple[int, ...], after: tuple[int, ...]) -> float | None:
    d_total = after[1] - before[1]
    if d_total <= 0:
        return None
    return (after[0] - before[0]) / d_total


def steal_fraction(before: tuple[int, int, int], after: tuple[int, int, int]) -> float | None:
    """The share of the machine's CPU time between two `cpu_times()` that the hypervisor stole."""
    d_total = after[1] - before[1]
    if d_total <= 0:
        return None
    return max(0.0, (after[2] - before[2]) / d_total)


def process_cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of a live process (all its threads), or None if it is gone."""
    fields = proc_stat_fields(pid) if pid else None
    if not fields:
        return None
    return (int(fields[11]) + int(fields[12])) / _HZ


def ovs_pid() -> int | None:
    try:
        return int(OVS_PIDFILE.read_text().strip())
    except (OSError, ValueError):
        return None


def own_cpu_seconds() -> float:
    """This process's CPU (every thread: the runner's loop, the sampler), not its children's."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _cpu_seconds(pids: int | list[int] | None) -> float | None:
    """One process's CPU seconds, or the sum over a component's processes (None if any is gone: a
    partial sum would undercount)."""
    if isinstance(pids, list):
        if not pids:
            return None
        parts = [process_cpu_seconds(p) for p in pids]
        return None if any(p is None for p in parts) else sum(p for p in parts if p is not None)
    return process_cpu_seconds(pids)


@dataclass
class CpuSnapshot:
    busy_s: float  # machine-wide busy CPU seconds (all cores) since boot, steal excluded
    components: dict[str, float | None] = field(default_factory=dict)
    steal_s: float = 0.0  # CPU seconds the hypervisor gave to other guests since boot


class CpuLedger:
    """Charges CPU over a window to named processes. `pids` maps a component to its process id, or to the
    list of its processes (per-switch Open vSwitch daemons); the runner itself is always `runner`."""

    def __init__(self, pids: dict[str, int | list[int] | None]) -> None:
        self.pids = dict(pids)
        self.start: CpuSnapshot | None = None

    def snapshot(self) -> CpuSnapshot:
        comps = {name: _cpu_seconds(pid) for name, pid in self.pids.items()}
        comps["runner"] = own_cpu_seconds()
        idle, total, steal = cpu_times()
        return CpuSnapshot((total - idle - steal) / _HZ, comps, steal / _HZ)

    def open(self) -> None:
        self.start = self.snapshot()

    def close(self) -> dict[str, float | None]:
        """CPU seconds per component since `open()`, `other` (the machine's busy time that no component
        accounts for; the results subtract the endpoints' own reports from it), `total`, and `steal`
        (what the hypervisor gave other guests meanwhile: in neither `other` nor `total`)."""
        assert self.start is not None, "open() first"
        end = self.snapshot()
        out: dict[str, float | None] = {}
        for name, before in self.start.components.items():
            after = end.components.get(name)
            out[name] = None if before is None or after is None else round(after - before, 3)
        busy = end.busy_s - self.start.busy_s
        out["other"] = round(max(0.0, busy - sum(v for v in out.values() if v is not None)), 3)
        out["total"] = round(busy, 3)
        out["steal"] = round(max(0.0, end.steal_s - self.start.steal_s), 3)
        return out


def per_million_packets(cpu_s: dict[str, float | None], packets: int) -> dict[str, float | None]:
    """CPU seconds per million packets delivered, per component (None where unknown or no packets)."""
    if packets <= 0:
        return {k: None for k in cpu_s}
    return {k: None if v is None else round(v / (packets / 1e6), 2) for k, v in cpu_s.items()}
