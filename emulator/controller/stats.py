"""Port counters and the per-link view of them (pure: no OpenFlow library)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from topologies.model import Link, Topology

COUNTER_FIELDS = (
    "rx_packets",
    "tx_packets",
    "rx_bytes",
    "tx_bytes",
    "rx_dropped",
    "tx_dropped",
    "rx_errors",
    "tx_errors",
)


@dataclass
class PortCounters:
    """Latest counters of one switch port and the rates over the last poll interval."""

    dpid: int
    port: int
    time: float = 0.0
    rx_packets: int = 0
    tx_packets: int = 0
    rx_bytes: int = 0
    tx_bytes: int = 0
    rx_dropped: int = 0
    tx_dropped: int = 0
    rx_errors: int = 0
    tx_errors: int = 0
    rx_bps: float = 0.0
    tx_bps: float = 0.0
    rx_pps: float = 0.0
    tx_pps: float = 0.0
    samples: int = 0
    # The port's age as the switch reports it; when present it times the rate interval, which
    # keeps controller-side queueing jitter out of the rates.
    uptime: float | None = None

    def update(self, now: float, counters: dict[str, int], uptime: float | None = None) -> None:
        """Take a new sample; rates are over the time since the previous one."""
        dt = uptime - self.uptime if uptime and self.uptime and uptime > self.uptime else now - self.time
        if self.samples and dt > 0:
            # A counter that went backwards (port re-created) restarts the rate at zero.
            self.rx_bps = max(0, counters["rx_bytes"] - self.rx_bytes) * 8 / dt
            self.tx_bps = max(0, counters["tx_bytes"] - self.tx_bytes) * 8 / dt
            self.rx_pps = max(0, counters["rx_packets"] - self.rx_packets) / dt
            self.tx_pps = max(0, counters["tx_packets"] - self.tx_packets) / dt
        for name in COUNTER_FIELDS:
            setattr(self, name, int(counters.get(name, 0)))
        self.time = now
        self.uptime = uptime
        self.samples += 1

    @property
    def drops(self) -> int:
        return self.rx_dropped + self.tx_dropped

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["drops"] = self.drops
        return d


@dataclass
class PortTable:
    """Counters of every polled (dpid, port)."""

    ports: dict[tuple[int, int], PortCounters] = field(default_factory=dict)

    def update(
        self, dpid: int, port: int, now: float, counters: dict[str, int], uptime: float | None = None
    ) -> PortCounters:
        pc = self.ports.get((dpid, port))
        if pc is None:
            pc = self.ports[(dpid, port)] = PortCounters(dpid, port)
        pc.update(now, counters, uptime)
        return pc

    def get(self, dpid: int, port: int) -> PortCounters | None:
        return self.ports.get((dpid, port))


def counted_end(topo: Topology, link: Link) -> tuple[str, int, bool] | None:
    """(switch, port, reversed) whose counters describe `link`: end a when it is a switch, else b.

    `reversed` is True when the counters are read at b, so the port's rx is the a->b direction.
    """
    for end, rev in ((link.a, False), (link.b, True)):
        if topo.node(end).is_switch:
            return end, link.port(end), rev
    return None


def link_report(topo: Topology, ports: PortTable, down: set[Link] | frozenset[Link], now: float) -> dict[str, Any]:
    """The `GET /links` body: per topology link, bytes and packets a->b (tx) and b->a (rx)."""
    dpids = {n.name: n.dpid for n in topo.switches}
    out = []
    for lk in topo.links:
        entry: dict[str, Any] = {
            "name": lk.name,
            "a": lk.a,
            "b": lk.b,
            "a_port": lk.a_port,
            "b_port": lk.b_port,
            "rate_mbps": lk.rate_mbps,
            "up": lk not in down,
            "tx_bytes": 0,
            "rx_bytes": 0,
            "tx_packets": 0,
            "rx_packets": 0,
            "drops": 0,
            "util_ab": 0.0,
            "util_ba": 0.0,
            "utilisation": 0.0,
            "counted_at": None,
        }
        end = counted_end(topo, lk)
        pc = ports.get(dpids[end[0]], end[1]) if end else None
        if end and pc:
            rev = end[2]
            ab_bytes, ba_bytes = (pc.rx_bytes, pc.tx_bytes) if rev else (pc.tx_bytes, pc.rx_bytes)
            ab_pkts, ba_pkts = (pc.rx_packets, pc.tx_packets) if rev else (pc.tx_packets, pc.rx_packets)
            ab_bps, ba_bps = (pc.rx_bps, pc.tx_bps) if rev else (pc.tx_bps, pc.rx_bps)
            capacity = lk.rate_mbps * 1e6
            util_ab = ab_bps / capacity if capacity > 0 else 0.0
            util_ba = ba_bps / capacity if capacity > 0 else 0.0
            entry.update(
                tx_bytes=ab_bytes,
                rx_bytes=ba_bytes,
                tx_packets=ab_pkts,
                rx_packets=ba_pkts,
                drops=pc.drops,
                util_ab=round(util_ab, 6),
                util_ba=round(util_ba, 6),
                utilisation=round(max(util_ab, util_ba), 6),
                counted_at=f"{end[0]}:{end[1]}",
            )
        out.append(entry)
    return {"time": now, "links": out}
