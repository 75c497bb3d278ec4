"""The path-spread probe: send UDP packets between two hosts and count, from the switches' own port
counters, how many crossed each switch above the ones hosts attach to, tier by tier: spines in a
leaf-spine, the ToR in an in-server fabric, cores and aggregation switches in a fat-tree, super-spines
and spines in a three-tier Clos. `per_spine` is the top tier's counts, as leaf-spine tools expect."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from emulator.errors import EmulatorError
from emulator.network import Fabric
from emulator.system import slowdown
from topologies.model import Topology
from transport.core.contract import DEFAULT_BASE_PORT

log = logging.getLogger(__name__)

PROBE_PORT = 9999
BASE_PORT = DEFAULT_BASE_PORT  # aligned (transport.core.contract): the low 4 bits of the source port run 0..15
ROTATE_SOURCES = 256
ENTROPY = ("fixed", "rotate")


@dataclass
class ProbeResult:
    mode: str
    entropy: str
    src: str
    dst: str
    packets_sent: int
    packets_received: int
    per_spine: dict[str, int]  # the top tier of per_tier
    duration_s: float
    max_gap_s: float
    max_gap_at_s: float | None = None  # when the largest gap began, seconds after the first arrival
    events: list[dict] = field(default_factory=list)
    # role -> switch -> packets, highest tier first, e.g. {"core": {...}, "agg": {...}}
    per_tier: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def balance(self) -> float | None:
        """max/min packets over the spines that carried any (None if none did)."""
        return balance(self.per_spine)

    @property
    def tier_balance(self) -> dict[str, float | None]:
        """`balance` of every counted tier."""
        return {role: balance(counts) for role, counts in self.per_tier.items()}

    def to_dict(self) -> dict:
        return asdict(self)


_RX = re.compile(r"port\s+(\w+):\s+rx pkts=(\d+)")


def switch_rx_packets(switch: str) -> int:
    """Packets received on all OpenFlow ports of a switch, read from OVS; `switch` is what ovs-ofctl
    takes (`Fabric.ofctl_target`: the bridge's name, or its daemon's management socket)."""
    out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-ports", switch],
                         capture_output=True, text=True, timeout=10)
    if out.returncode != 0:
        raise EmulatorError(f"ovs-ofctl dump-ports {switch} failed: {out.stderr.strip()}")
    return sum(int(pkts) for port, pkts in _RX.findall(out.stdout) if port != "LOCAL")


def counted_tiers(topo: Topology) -> dict[str, list[str]]:
    """Role -> switches of every tier whose switches have no hosts, highest tier first: the switches a
    packet between two hosts may cross on one of several paths."""
    hosts = {h.name for h in topo.hosts}
    attached = {lk.peer(end) for lk in topo.links for end in (lk.a, lk.b) if end in hosts}
    tiers = {
        role: [n.name for n in nodes]
        for role, nodes in topo.tiers().items()
        if not any(n.name in attached for n in nodes)
    }
    if not tiers:
        raise EmulatorError("every switch of this topology has hosts: there is no upper tier to count paths over")
    return tiers


def tier_counts(
    tiers: dict[str, list[str]], before: dict[str, int], after: dict[str, int]
) -> dict[str, dict[str, int]]:
    """Packets each counted switch received between two readings of its counters."""
    return {role: {s: after[s] - before[s] for s in names} for role, names in tiers.items()}


def balance(counts: dict[str, int]) -> float | None:
    """max/min over the switches that carried any packets (None if none did)."""
    used = [v for v in counts.values() if v > 0]
    return max(used) / min(used) if used else None


def run_probe(
    fab: Fabric,
    src: str,
    dst: str,
    packets: int = 1000,
    entropy: str = "rotate",
    rate_pps: float = 2000.0,
    during: Callable[[], None] | None = None,
    during_at: float = 0.5,
    size: int = 64,
) -> ProbeResult:
    """Send `packets` datagrams src -> dst; optionally call `during()` `during_at` seconds in."""
    if entropy not in ENTROPY:
        raise EmulatorError(f"unknown entropy '{entropy}'; choose fixed or rotate")
    if packets <= 0:
        raise EmulatorError("--packets must be a positive number")
    for h in (src, dst):
        if h not in {n.name for n in fab.topology.hosts}:
            raise EmulatorError(f"'{h}' is not a host of this fabric; hosts: "
                                f"{', '.join(n.name for n in fab.topology.hosts)}")
    if src == dst:
        raise EmulatorError("--src and --dst must be different hosts")
    assert fab.workdir is not None
    tiers = counted_tiers(fab.topology)
    switches = [s for names in tiers.values() for s in names]
    out_file = fab.workdir / f"probe-{time.monotonic_ns()}.json"
    ready_file = out_file.with_suffix(".ready")
    duration = packets / rate_pps
    slow = slowdown()
    recv = fab.host(dst).popen(
        [sys.executable, "-m", "emulator.probe_agent", "recv", "--port", str(PROBE_PORT), "--idle", str(slow),
         "--deadline", str(duration + 30 * slow), "--out", str(out_file), "--ready", str(ready_file)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        _wait_for(ready_file, recv, 10.0 * slow)
        before = {s: switch_rx_packets(fab.ofctl_target(s)) for s in switches}
        sources = ROTATE_SOURCES if entropy == "rotate" else 1
        send = fab.host(src).popen(
            [sys.executable, "-m", "emulator.probe_agent", "send", "--dst", fab.ip(dst), "--port",
             str(PROBE_PORT), "--packets", str(packets), "--sources", str(sources), "--base-port",
             str(BASE_PORT), "--rate", str(rate_pps), "--size", str(size)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        if during is not None:
            time.sleep(during_at)
            during()
        try:
            sout, serr = send.communicate(timeout=duration + 60 * slow)
        except subprocess.TimeoutExpired:
            send.kill()
            send.wait()
            raise EmulatorError(
                f"probe sender still sending {packets} datagrams at {rate_pps:g}/s after {duration + 60 * slow:.0f} s: "
                f"{src}'s link is too slow for that rate; lower --rate or --packets") from None
        if send.returncode != 0:
            raise EmulatorError(f"probe sender failed: {serr.decode().strip()[-300:]}")
        sent = json.loads(sout)["sent"]
        try:
            recv.wait(timeout=duration + 40 * slow)
        except subprocess.TimeoutExpired:
            raise EmulatorError(f"probe receiver on {dst} did not finish within {duration + 40 * slow:.0f} s after "
                                "the sender; is the machine overloaded?") from None
        if not out_file.exists():
            raise EmulatorError(f"probe receiver failed: {recv.stderr.read().decode().strip()[-300:]}")
        got = json.loads(out_file.read_text())
        after = {s: switch_rx_packets(fab.ofctl_target(s)) for s in switches}
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
    per_tier = tier_counts(tiers, before, after)
    return ProbeResult(
        mode=fab.mode, entropy=entropy, src=src, dst=dst, packets_sent=sent,
        packets_received=got["received"], per_spine=next(iter(per_tier.values())),
        duration_s=got["duration_s"], max_gap_s=got["max_gap_s"], max_gap_at_s=got["max_gap_at_s"],
        per_tier=per_tier,
    )


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise EmulatorError(f"probe receiver exited early: {proc.stderr.read().decode().strip()[-300:]}")
        if time.monotonic() > deadline:
            raise EmulatorError("probe receiver did not start")
        time.sleep(0.02)
