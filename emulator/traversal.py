"""What one switch traversal costs Open vSwitch, measured on a running fabric.

Paced UDP (one datagram per wake-up, as shaped traffic arrives) crosses the fabric between two hosts
as far apart as the fabric allows; the CPU that the fabric's ovs-vswitchd processes spend over the
window, divided by the packets all switches received, is the cost of one traversal. With one daemon
for the whole fabric it grows with the number of ports the daemon polls; with a daemon per switch it
should not (see emulator.ovs_switch).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

from emulator.cpu import CpuLedger
from emulator.network import Fabric
from emulator.probe import run_probe, switch_rx_packets
from topologies import Topology, parse_spec
from transport.core.headers import UDP_FRAME_OVERHEAD

log = logging.getLogger(__name__)


@dataclass
class TraversalCost:
    spec: str
    isolation: str
    switches: int
    ports: int  # switch ports in the fabric (both ends of every link that ends on a switch)
    daemons: int
    packets_sent: int
    packets_received: int
    traversals: int  # packets received by all switches over the window
    hops: float  # traversals per packet sent
    ovs_cpu_s: float
    us_per_traversal: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def farthest_pair(topo: Topology) -> tuple[str, str]:
    """The first host and the last: in every builder's numbering the last host sits under another
    leaf or pod, so the path crosses the top tier."""
    hosts = [h.name for h in topo.hosts]
    return hosts[0], hosts[-1]


def switch_ports(topo: Topology) -> int:
    return sum(1 for lk in topo.links for end in (lk.a, lk.b) if topo.node(end).is_switch)


# The probe stays under this share of the source host's link, so that the switches see it paced and
# nothing queues: at 1700 datagrams a second a 0.5 Mb/s host link takes two minutes to drain 6,800 of
# them, which the probe's sender waited out blocked in its sends until it timed out.
LINK_SHARE = 0.9


def paced_rate(topo: Topology, src: str, pps: float, size: int) -> float:
    """`pps`, or less where `src`'s link could not carry it (shaped links; 0 means unshaped)."""
    rates = [lk.rate_mbps for lk in topo.links_of(src) if lk.rate_mbps > 0]
    if not rates:
        return pps
    return min(pps, LINK_SHARE * min(rates) * 1e6 / (8 * (size + UDP_FRAME_OVERHEAD)))


def measure_on(fab: Fabric, pps: float = 1700.0, seconds: float = 4.0, size: int = 1000) -> TraversalCost:
    src, dst = farthest_pair(fab.topology)
    pps = paced_rate(fab.topology, src, pps, size)
    switches = [s.name for s in fab.topology.switches]
    pids = fab.ovs_pids()
    targets = {s: fab.ofctl_target(s) for s in switches}
    before_rx = {s: switch_rx_packets(t) for s, t in targets.items()}
    ledger = CpuLedger({"ovs": pids})
    ledger.open()
    packets = max(1, int(pps * seconds))
    r = run_probe(fab, src, dst, packets=packets, entropy="fixed", rate_pps=pps, size=size)
    cpu_s = ledger.close()["ovs"] or 0.0
    after_rx = {s: switch_rx_packets(t) for s, t in targets.items()}
    traversals = sum(after_rx[s] - before_rx[s] for s in switches)
    return TraversalCost(
        spec=fab.topology.name,
        isolation=str(fab.isolation), switches=len(switches), ports=switch_ports(fab.topology),
        daemons=len(pids), packets_sent=r.packets_sent, packets_received=r.packets_received,
        traversals=traversals, hops=round(traversals / r.packets_sent, 2) if r.packets_sent else 0.0,
        ovs_cpu_s=round(cpu_s, 3),
        us_per_traversal=round(cpu_s / traversals * 1e6, 1) if traversals else None,
    )


def measure(spec: str, isolation: str, pps: float = 1700.0, seconds: float = 4.0,
            size: int = 1000) -> TraversalCost:
    """Bring the fabric up with the given switch isolation, measure, tear it down."""
    topo = parse_spec(spec)
    with Fabric(topo, mode="ecmp", isolation=isolation) as fab:
        time.sleep(0.5)  # let the bring-up's own work settle out of the window
        cost = measure_on(fab, pps, seconds, size)
    cost.spec = spec
    log.info("%s (%s): %s µs per traversal", spec, isolation, cost.us_per_traversal)
    return cost
