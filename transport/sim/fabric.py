"""Simulated fabrics on the virtual clock: hosts whose ports are shared by many pairs of Connections.

`transport.sim.simnet.SimNetwork` gives two endpoints paths of their own; here every host has a port
that all its peers share, as a real NIC is, so incast queues where it does in a fabric. Two shapes,
built by one `Fabric`:

* `SwitchSpec`, one non-blocking switch (the collectives'): every host (rank) has a port on the
  fabric switch and, when hosts come in groups (a server's GPUs), another on its group's local
  switch; traffic between two hosts of a group takes the local port, all other traffic the fabric port.
* `TwoLeafSpec`, two leaves and ``spines`` spines (the congestion-control bench's): even hosts on
  leaf 0, odd on leaf 1, every link alike; a packet between leaves crosses the spine its EV picks
  (``ev % spines``: a sprayed flow uses them all, a single-path one keeps one).

The model's rules, for both shapes:

* Every link direction is a `simnet.Link`: seeded impairments, then a drop-tail queue of
  ``queue_packets`` in front of a serialising link (the datagram plus Ethernet/IP/UDP headers at the
  link's rate), then its propagation delay.
* Store and forward: a packet enters its next hop when it has reached the far end of the last one,
  and every hop serves packets in the order they reach it (one event heap for the whole fabric, ties
  in the order they were sent), whichever pair of Connections they belong to.
* A host's port is an uplink (host -> switch) and a downlink (switch -> host) at the same rate. The
  uplink's queue is the host's own egress queue, HOST_QUEUE_PACKETS deep (or the link's, if deeper):
  a host holds back what its NIC cannot send yet rather than dropping it, and its data and its ACKs
  share that queue. Switch egress (downlinks, leaf -> spine, spine -> leaf) has the link's queue:
  that is where incast queues and drops, as in a real switch.
* Two traffic classes, as the emulator's shaped links have: ACKs and credit (a receiving endpoint's
  socket marks them control) go before data at every hop, in a queue of their own (`simnet.Link`).
* Impairments are drawn from one seeded generator per fabric, in event order, so a run is
  reproducible from its seed. A `SwitchSpec` port's `PathSpec` describes the whole way between two
  hosts: its delay and impairments are the uplink's, and the downlink has none of either, so a
  datagram is lost or reordered at most once. A `TwoLeafSpec` has no impairments, and every link
  (host ports and leaf-spine links) has the one-way ``hop_delay``.

`Fabric.pair(a, b)` gives the two-ended view of hosts a and b that `transport.sim.simnet.drive` runs a
pair of Connections over (SimNetwork's interface).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, replace

from transport.core.config import TransportConfig
from transport.core.headers import ACK_FRAME
from transport.core.wire import CONTROL_CLASS_TYPES, TYPE_OFFSET
from transport.sim.simnet import WIRE_OVERHEAD, Link, PathSpec

# Linux's default txqueuelen: the depth of a host's own egress queue.
HOST_QUEUE_PACKETS = 1000


@dataclass
class SwitchSpec:
    """One switch with a port per host; with ``local``, a local switch per group of ``group`` hosts."""

    fabric: PathSpec  # every host's port to the fabric switch
    local: PathSpec | None = None  # every host's port to its group's switch (None: no local switch)
    group: int = 1  # hosts per group: hosts g*group .. g*group+group-1

    leaves = 1
    spines = 0

    def level(self, a: int, b: int) -> str:
        same = self.local is not None and self.group > 1 and a // self.group == b // self.group
        return "local" if same else "fabric"

    def leaf(self, host: int) -> int:
        return 0

    def port_links(self) -> dict[str, tuple[PathSpec, PathSpec]]:
        """Per level, the (uplink, downlink) of every host's port."""
        levels = {"fabric": self.fabric, **({"local": self.local} if self.local is not None else {})}
        return {level: (spec, PathSpec(rate_bps=spec.rate_bps, delay=0.0, queue_packets=spec.queue_packets))
                for level, spec in levels.items()}

    def spine_link(self) -> PathSpec | None:
        return None

    def check(self, hosts: int) -> None:
        if hosts < 1:
            raise ValueError("a fabric needs at least 1 host")


@dataclass
class TwoLeafSpec:
    """``hosts`` hosts on two leaves joined by ``spines`` spines, every link the same."""

    hosts: int = 16
    spines: int = 8
    rate_bps: float = 100e6  # every link
    hop_delay: float = 0.00005  # one-way propagation per link
    queue_packets: int = 256  # drop-tail, per link and direction

    leaves = 2

    def level(self, a: int, b: int) -> str:
        return "fabric"

    def leaf(self, host: int) -> int:
        return host % 2

    def link(self) -> PathSpec:
        return PathSpec(rate_bps=self.rate_bps, delay=self.hop_delay, queue_packets=self.queue_packets)

    def port_links(self) -> dict[str, tuple[PathSpec, PathSpec]]:
        return {"fabric": (self.link(), self.link())}

    def spine_link(self) -> PathSpec | None:
        return self.link()

    def check(self, hosts: int) -> None:
        if hosts < 2 or self.spines < 1:
            raise ValueError("a fabric needs at least 2 hosts and 1 spine")

    def base_rtt(self, mtu: int) -> float:
        """Unloaded RTT between leaves for a full-size packet and its ACK: four hops each way."""
        data = (mtu + WIRE_OVERHEAD) * 8 / self.rate_bps
        ack = ACK_FRAME * 8 / self.rate_bps
        return 4 * (data + ack) + 8 * self.hop_delay

    def config(self, base: TransportConfig) -> TransportConfig:
        """``base`` told the fabric's link rate and base RTT (so windows and credit are BDP-sized)."""
        return replace(base, link_rate_bps=self.rate_bps, base_rtt=self.base_rtt(base.mtu))


FabricSpec = SwitchSpec | TwoLeafSpec


class Port:
    """A host's port on a switch: its uplink behind the host's own queue, and the switch's downlink."""

    def __init__(self, up: PathSpec, down: PathSpec) -> None:
        self.up = Link(replace(up, queue_packets=max(up.queue_packets, HOST_QUEUE_PACKETS)))
        self.down = Link(down)


# A datagram in flight: (time it reaches the end of hops[i - 1], seq, hops, i, view, destination side, datagram).
_Event = tuple[float, int, tuple[Link, ...], int, "PairView", int, bytes]


class Fabric:
    """The links of a shape and the one event heap that moves datagrams across them."""

    def __init__(self, spec: FabricSpec, hosts: int, seed: int = 0) -> None:
        spec.check(hosts)
        self.spec = spec
        self.rng = random.Random(seed)
        self.ports: dict[str, list[Port]] = {level: [Port(up, down) for _ in range(hosts)]
                                             for level, (up, down) in spec.port_links().items()}
        spine = spec.spine_link()

        def leaf_spine() -> list[list[Link]]:  # [leaf][spine], one direction
            return [] if spine is None else [[Link(spine) for _ in range(spec.spines)] for _ in range(spec.leaves)]

        self.to_spine = leaf_spine()
        self.from_spine = leaf_spine()
        self._heap: list[_Event] = []
        self._seq = 0
        self.now = 0.0

    def pair(self, a: int, b: int) -> PairView:
        return PairView(self, a, b)

    def route(self, src: int, dst: int, ev: int) -> tuple[Link, ...]:
        spec = self.spec
        ports = self.ports[spec.level(src, dst)]
        ls, ld = spec.leaf(src), spec.leaf(dst)
        if ls == ld:
            return (ports[src].up, ports[dst].down)
        s = ev % spec.spines
        return (ports[src].up, self.to_spine[ls][s], self.from_spine[ld][s], ports[dst].down)

    def send(self, view: PairView, side: int, data: bytes, ev: int, now: float) -> None:
        src, dst = view.ends[side], view.ends[1 - side]
        self._forward(self.route(src, dst, ev), 0, view, 1 - side, data, now)

    def _forward(self, hops: tuple[Link, ...], i: int, view: PairView, to: int, data: bytes, now: float) -> None:
        control = len(data) > TYPE_OFFSET and data[TYPE_OFFSET] in CONTROL_CLASS_TYPES
        for t, payload in hops[i].transmit(data, now, self.rng, control):
            self._seq += 1
            heapq.heappush(self._heap, (t, self._seq, hops, i + 1, view, to, payload))

    def next_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def advance(self, now: float) -> None:
        """Move every datagram due by ``now`` into its next hop, or out to its view's host."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            t, _, hops, i, view, to, data = heapq.heappop(heap)
            if i < len(hops):
                self._forward(hops, i, view, to, data, t)
            else:
                view.outbox.append((to, data))
        self.now = max(self.now, now)

    def links(self) -> list[Link]:
        return [*(link for ports in self.ports.values() for port in ports for link in (port.up, port.down)),
                *(link for row in (*self.to_spine, *self.from_spine) for link in row)]

    def drops(self) -> int:
        """Datagrams dropped by full queues anywhere in the fabric."""
        return sum(link.stats.queue_drops for link in self.links())

    def port_stats(self, host: int) -> dict:
        return {"host": host, **{level: {"up": vars(ports[host].up.stats), "down": vars(ports[host].down.stats)}
                                 for level, ports in self.ports.items()}}


class PairView:
    """Hosts ``a`` (endpoint 0) and ``b`` (endpoint 1) over the fabric: SimNetwork's interface for drive."""

    def __init__(self, fabric: Fabric, a: int, b: int) -> None:
        self.fabric = fabric
        self.ends = (a, b)
        self.outbox: list[tuple[int, bytes]] = []

    def send(self, src: int, data: bytes, ev: int, now: float) -> None:
        self.fabric.send(self, src, data, ev, now)

    def next_time(self) -> float | None:
        if self.outbox:
            return self.fabric.now
        return self.fabric.next_time()

    def pop_due(self, now: float) -> list[tuple[int, bytes]]:
        self.fabric.advance(now)
        out, self.outbox = self.outbox, []
        return out

    def link_stats(self) -> list[dict]:
        return [self.fabric.port_stats(h) for h in self.ends]


def uniform(rate_bps: float, **impairments: float) -> SwitchSpec:
    """A fabric of one switch whose ports all run at ``rate_bps`` (full bisection)."""
    return SwitchSpec(replace(PathSpec(rate_bps=rate_bps), **impairments))
