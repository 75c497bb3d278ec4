"""A `Topology` as a simulated network: every link a pair of `transport.sim.netsim.Port`s, forwarding by
the controller's own flow entries (emulator.sim.flowtable), and the faults the live fabric takes.

What it models as the live fabric does (emulator/network.py, emulator/shaping.py):
* each link direction at the link's rate, with its propagation delay and random loss;
* drop-tail queues as the emulator sizes them: the link's `queue_packets`, or the 1,000 packets of a
  default transmit queue, of full-size frames (`SimSettings.queue_bytes` gives bytes instead, as the
  field's simulators do);
* control (ACKs, credit) before data at every port;
* a cut takes both directions down at once; the controller reroutes `reaction_s` later (its reaction
  delay, 0 unless the experiment sets it), with its rules over the links that are down, and
  packets in flight follow the new entries from the next switch they reach;
* loss and rate set at run time, both directions.

`links_report(now)` gives the controller's `GET /links` body from the ports' counters, so the
results read the simulated fabric's links as they read the live one's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from emulator.controller.rules import LazyRules, mode_error
from emulator.sim.flowtable import FlowTables, Key
from topologies import Link, Topology
from transport.sim.netsim import Network, Port, Waker

log = logging.getLogger(__name__)

# A default transmit queue (txqueuelen): what an unshaped-queue link holds, as on the live fabric.
DEFAULT_QUEUE_PACKETS = 1000
ETHERNET_HEADER = 14  # a frame is the IP packet plus this
MAX_HOPS = 64  # a route longer than this is a forwarding loop


@dataclass(frozen=True)
class SimSettings:
    """How the simulated fabric departs from the topology's own numbers, when it does."""

    # Every switch port's queue in bytes (None: the link's queue_packets, else DEFAULT_QUEUE_PACKETS,
    # of full-size frames). Hosts' own egress queues stay DEFAULT_QUEUE_PACKETS frames deep.
    queue_bytes: int | None = None
    # ECN marking from this share of a switch port's queue (0: no marking).
    ecn_fraction: float = 0.0
    # Seconds between a cut (or a repair) and the controller's new rules.
    reaction_s: float = 0.0

    def __post_init__(self) -> None:
        if self.queue_bytes is not None and self.queue_bytes <= 0:
            raise ValueError(f"queue of {self.queue_bytes} bytes: give a positive number of bytes")
        if not 0 <= self.ecn_fraction <= 1:
            raise ValueError(f"ECN threshold {self.ecn_fraction}: give a share of the queue from 0 to 1")
        if self.reaction_s < 0:
            raise ValueError(f"reaction delay {self.reaction_s} s: give 0 or more seconds")


class SimFabric:
    """The simulated network of `topo` in routing `mode`."""

    def __init__(self, topo: Topology, mode: str, settings: SimSettings | None = None, seed: int = 0) -> None:
        self.topo = topo
        self.mode = mode
        self.settings = settings = settings or SimSettings()
        self.ids = {n.name: i for i, n in enumerate(topo.nodes)}
        self.names = [n.name for n in topo.nodes]
        self.is_host = [n.is_host for n in topo.nodes]
        self.address = {n.address: self.ids[n.name] for n in topo.hosts if n.address}
        frame = topo.mtu + ETHERNET_HEADER
        ports: list[Port] = []
        self.link_ports: dict[Link, tuple[Port, Port]] = {}  # (a -> b, b -> a)
        self.out: list[dict[int, Port]] = [{} for _ in topo.nodes]  # node -> port number -> port out
        self.in_port: dict[int, int] = {}  # port index -> the port number it arrives on
        self.host_port: dict[int, Port] = {}
        arrives_on: list[tuple[Port, int]] = []
        for lk in topo.links:
            pair = []
            for src, dst in ((lk.a, lk.b), (lk.b, lk.a)):
                from_host = self.is_host[self.ids[src]]
                packets = lk.queue_packets or DEFAULT_QUEUE_PACKETS
                qbytes = packets * frame if from_host or settings.queue_bytes is None else settings.queue_bytes
                ecn = int(qbytes * settings.ecn_fraction) if not from_host else 0
                p = Port(self.ids[src], self.ids[dst], lk.rate_mbps * 1e6, lk.delay_ms / 1e3, qbytes,
                         ecn_bytes=ecn, loss=lk.loss_pct / 100, name=f"{src}->{dst}")
                ports.append(p)
                pair.append(p)
                self.out[self.ids[src]][lk.port(src)] = p
                arrives_on.append((p, lk.port(dst)))
                if from_host:
                    self.host_port[self.ids[src]] = p
            self.link_ports[lk] = (pair[0], pair[1])
        self.net = Network(ports, self._route, seed=seed)
        self.in_port = {p.index: number for p, number in arrives_on}
        self.down: set[Link] = set()
        self._install()
        self.rule_changes: list[dict] = []

    # -- forwarding ------------------------------------------------------------------------------

    def _install(self) -> None:
        rules = LazyRules(self.topo, self.mode, self.down)
        self.tables = [None if self.is_host[i] else FlowTables(rules, name) for i, name in enumerate(self.names)]

    def _route(self, key: Key, node: int, via: Port | None) -> tuple[Port, ...]:
        """The ports from `node` (entered by `via`, None at the sending host) to the key's destination."""
        dst = self.address.get(key[1])
        if dst is None:
            return ()
        path: list[Port] = []
        if via is None:
            if not self.is_host[node]:
                return ()
            p = self.host_port.get(node)
            if p is None:
                return ()
            path.append(p)
            via = p
        for _ in range(MAX_HOPS):
            here = via.dst
            if self.is_host[here]:
                return tuple(path) if here == dst else ()
            tables = self.tables[here]
            out = tables.output(key, self.in_port[via.index]) if tables is not None else None
            if out is None:
                return ()
            p = self.out[here].get(out)
            if p is None:
                return ()
            path.append(p)
            via = p
        log.warning("forwarding loop for %s from %s", key, self.names[node])
        return ()

    def route_names(self, key: Key) -> list[str]:
        """The nodes a packet with header `key` crosses from its source host (for tests and `explain`)."""
        src = self.address[key[0]]
        path = self._route(key, src, None)
        return [self.names[src], *(self.names[p.dst] for p in path)]

    # -- faults ----------------------------------------------------------------------------------

    def link(self, a: str, b: str) -> Link:
        found = self.topo.links_between(a, b)
        if not found:
            raise ValueError(f"{self.topo.name} has no link {a}-{b}")
        return found[0]

    def set_link_up(self, a: str, b: str, up: bool) -> None:
        """Cut or restore a-b now (on the network's clock); the controller reacts reaction_s later."""
        now = self.net.now
        lk = self.link(a, b)
        for p in self.link_ports[lk]:
            if up:
                p.up = True
            else:
                p.cut()
        if up:
            self.down.discard(lk)
        else:
            self.down.add(lk)
        self.net.at(now + self.settings.reaction_s, Waker(self._reinstall))

    def set_mode(self, mode: str) -> None:
        """Another routing mode: the controller installs its rules at once, as on the live fabric."""
        rules_mode_error = mode_error(mode)
        if rules_mode_error is not None:
            raise ValueError(rules_mode_error)
        self.mode = mode
        self._reinstall(self.net.now)

    def _reinstall(self, now: float) -> None:
        self._install()
        self.net.reroute()
        self.rule_changes.append({"t": now, "down": sorted(lk.name for lk in self.down)})

    def set_loss(self, a: str, b: str, loss_pct: float) -> None:
        for p in self.link_ports[self.link(a, b)]:
            p.loss = loss_pct / 100

    def set_rate(self, a: str, b: str, rate_mbps: float) -> None:
        for p in self.link_ports[self.link(a, b)]:
            p.set_rate(rate_mbps * 1e6)

    # -- counters --------------------------------------------------------------------------------

    def links_report(self, now: float, previous: dict | None = None) -> dict:
        """The controller's `GET /links` body (emulator.controller.stats.link_report) from the ports'
        counters; utilisation over the time since `previous` (an earlier report)."""
        before = {lk["name"]: lk for lk in (previous or {}).get("links", [])}
        dt = now - previous["time"] if previous else 0.0
        out = []
        for lk in self.topo.links:
            ab, ba = self.link_ports[lk]
            row = {"name": lk.name, "a": lk.a, "b": lk.b, "a_port": lk.a_port, "b_port": lk.b_port,
                   "rate_mbps": lk.rate_mbps, "up": lk not in self.down,
                   "tx_bytes": ab.stats.bytes, "rx_bytes": ba.stats.bytes,
                   "tx_packets": ab.stats.packets, "rx_packets": ba.stats.packets,
                   "drops": ab.stats.queue_drops + ba.stats.queue_drops, "counted_at": "sim"}
            prev = before.get(lk.name)
            cap = lk.rate_mbps * 1e6
            util_ab = util_ba = 0.0
            if prev is not None and dt > 0:
                util_ab = (row["tx_bytes"] - prev["tx_bytes"]) * 8 / (cap * dt)
                util_ba = (row["rx_bytes"] - prev["rx_bytes"]) * 8 / (cap * dt)
            row.update(util_ab=round(util_ab, 6), util_ba=round(util_ba, 6),
                       utilisation=round(max(util_ab, util_ba), 6))
            out.append(row)
        return {"time": now, "links": out}

    def drops(self) -> dict[str, int]:
        """Queue drops per port that dropped any ("leaf1->spine2")."""
        return {p.name: p.stats.queue_drops for p in self.net.ports if p.stats.queue_drops}
