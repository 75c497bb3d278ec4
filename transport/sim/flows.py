"""A simulated two-leaf fabric on the virtual clock: many flows sharing host links, for incast and permutations.

``transport.sim.simnet`` joins two endpoints; here ``hosts`` endpoints hang off two leaves (even hosts on
leaf 0, odd on leaf 1) joined by ``spines`` spines, every link a drop-tail queue in front of a serialising
link with a propagation delay, store-and-forward at every hop. A packet between leaves crosses the
spine its EV picks (``ev % spines``: a sprayed flow uses them all, a single-path one keeps one). Each
flow is a pair of Connections whose traffic goes through ``FabricFlow``, a view with SimNetwork's
interface, so ``simnet.drive`` runs them all; the receiving sides on one host share one
``CreditScheduler`` when the controller is receiver-driven, as the receiving endpoint does.

``run_flows`` runs a list of sized flows to completion and reports, per flow, its completion time,
and for the fabric each link's drops and the peak queue of every host's downlink.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass, field

from transport.core.config import TransportConfig
from transport.core.connection import Connection, MessageAcked, MessageReceived
from transport.core.credit import CreditScheduler
from transport.core.headers import ACK_FRAME, ETHERNET_HEADER, IP_UDP_HEADERS
from transport.sim.simnet import drive

WIRE_OVERHEAD = ETHERNET_HEADER + IP_UDP_HEADERS


@dataclass
class FabricSpec:
    hosts: int = 16
    spines: int = 8
    rate_bps: float = 100e6  # every link
    hop_delay: float = 0.00005  # one-way propagation per link
    queue_packets: int = 256  # drop-tail, per link and direction

    def base_rtt(self, mtu: int) -> float:
        """Unloaded RTT between leaves for a full-size packet and its ACK: four hops each way."""
        data = (mtu + WIRE_OVERHEAD) * 8 / self.rate_bps
        ack = ACK_FRAME * 8 / self.rate_bps
        return 4 * (data + ack) + 8 * self.hop_delay

    def config(self, base: TransportConfig) -> TransportConfig:
        """``base`` told the fabric's link rate and base RTT (so windows and credit are BDP-sized)."""
        from dataclasses import replace

        return replace(base, link_rate_bps=self.rate_bps, base_rtt=self.base_rtt(base.mtu))


class _Link:
    __slots__ = ("busy_until", "delay", "departures", "drops", "peak", "queue", "rate", "sent")

    def __init__(self, rate: float, delay: float, queue: int) -> None:
        self.rate = rate
        self.delay = delay
        self.queue = queue
        self.busy_until = 0.0
        self.departures: deque[float] = deque()
        self.drops = 0
        self.peak = 0
        self.sent = 0

    def enqueue(self, size: int, now: float) -> float | None:
        """When a packet of ``size`` bytes entering now reaches the far end; None if the queue drops it."""
        deps = self.departures
        while deps and deps[0] <= now:
            deps.popleft()
        if len(deps) >= self.queue:
            self.drops += 1
            return None
        start = now if now > self.busy_until else self.busy_until
        self.busy_until = start + (size + WIRE_OVERHEAD) * 8 / self.rate
        deps.append(self.busy_until)
        if len(deps) > self.peak:
            self.peak = len(deps)
        self.sent += 1
        return self.busy_until + self.delay


class Fabric:
    """The links and the event heap; flows send through their ``FabricFlow`` views."""

    def __init__(self, spec: FabricSpec) -> None:
        if spec.hosts < 2 or spec.spines < 1:
            raise ValueError("a fabric needs at least 2 hosts and 1 spine")
        self.spec = spec

        def link() -> _Link:
            return _Link(spec.rate_bps, spec.hop_delay, spec.queue_packets)

        self.up = [link() for _ in range(spec.hosts)]
        self.down = [link() for _ in range(spec.hosts)]
        self.to_spine = [[link() for _ in range(spec.spines)] for _ in range(2)]
        self.from_spine = [[link() for _ in range(spec.spines)] for _ in range(2)]
        self._heap: list[tuple[float, int, tuple[_Link, ...], int, FabricFlow, int, bytes]] = []
        self._seq = 0

    def route(self, src: int, dst: int, ev: int) -> tuple[_Link, ...]:
        ls, ld = src % 2, dst % 2
        if ls == ld:
            return (self.up[src], self.down[dst])
        s = ev % self.spec.spines
        return (self.up[src], self.to_spine[ls][s], self.from_spine[ld][s], self.down[dst])

    def inject(self, flow: FabricFlow, side: int, data: bytes, ev: int, now: float) -> None:
        src, dst = (flow.src, flow.dst) if side == 0 else (flow.dst, flow.src)
        self._forward(self.route(src, dst, ev), 0, flow, 1 - side, data, now)

    def _forward(self, hops: tuple[_Link, ...], i: int, flow: FabricFlow, to: int, data: bytes, now: float) -> None:
        t = hops[i].enqueue(len(data), now)
        if t is None:
            return
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, hops, i + 1, flow, to, data))

    def next_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def advance(self, now: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now:
            t, _, hops, i, flow, to, data = heapq.heappop(heap)
            if i < len(hops):
                self._forward(hops, i, flow, to, data, t)
            else:
                flow.inbox.append((to, data))

    def drops(self) -> int:
        links = [*self.up, *self.down, *(x for row in self.to_spine for x in row),
                 *(x for row in self.from_spine for x in row)]
        return sum(link.drops for link in links)


class FabricFlow:
    """One flow's view of the fabric, with the interface ``simnet.drive`` expects of a network."""

    def __init__(self, fabric: Fabric, src: int, dst: int) -> None:
        self.fabric = fabric
        self.src, self.dst = src, dst
        self.inbox: list[tuple[int, bytes]] = []

    def send(self, side: int, data: bytes, ev: int, now: float) -> None:
        self.fabric.inject(self, side, data, ev, now)

    def next_time(self) -> float | None:
        return self.fabric.next_time()

    def pop_due(self, now: float) -> list[tuple[int, bytes]]:
        self.fabric.advance(now)
        out, self.inbox = self.inbox, []
        return out


@dataclass
class FlowsResult:
    completed: bool
    fct: list[float]  # per flow: when its last byte was delivered (all flows start at 0)
    flow_bytes: list[int]
    drops: int
    packets_sent: int
    retransmissions: int
    peak_downlink_queue: dict[int, int]  # receiving host -> the most packets its downlink ever queued
    duration: float
    sender_metrics: list[dict] = field(default_factory=list)


def run_flows(
    config: TransportConfig, spec: FabricSpec, flows: list[tuple[int, int, int]], *, seed: int = 0,
    message_size: int = 65536, time_limit: float = 120.0,
) -> FlowsResult:
    """Run ``flows`` (source host, destination host, bytes), all starting at 0, until each is delivered
    and acknowledged or ``time_limit`` of virtual time passes."""
    fabric = Fabric(spec)
    rng = random.Random(seed ^ 0xFAB)
    conns: list[Connection] = []
    nets: list[tuple[FabricFlow, int, int]] = []
    schedulers: dict[int, CreditScheduler] = {}
    remaining: list[int] = []
    delivered = [0] * len(flows)
    fct = [0.0] * len(flows)
    acked_msgs = [0] * len(flows)
    n_msgs: list[int] = []
    for i, (src, dst, size) in enumerate(flows):
        tx = Connection(config, 100 + i, seed=seed * 1000 + 2 * i)
        rx = Connection(config, 100 + i, seed=seed * 1000 + 2 * i + 1)
        if rx.credit_receiver is not None:
            # Every connection into one host draws on that host's one link: one scheduler for them all.
            sched = schedulers.get(dst)
            if sched is None:
                sched = schedulers[dst] = CreditScheduler.from_config(config)
            rx.use_credit_scheduler(sched)
        left = size
        count = 0
        while left > 0:
            n = min(message_size, left)
            tx.send_message(rng.randbytes(n), now=0.0)
            left -= n
            count += 1
        n_msgs.append(count)
        remaining.append(size)
        conns += [tx, rx]
        nets.append((FabricFlow(fabric, src, dst), 2 * i, 2 * i + 1))

    def on_event(index: int, event: object, now: float) -> None:
        flow = index // 2
        if index % 2 and isinstance(event, MessageReceived):
            delivered[flow] += len(event.data)
            if delivered[flow] >= flows[flow][2]:
                fct[flow] = now
        elif not index % 2 and isinstance(event, MessageAcked):
            acked_msgs[flow] += 1

    def done() -> bool:
        return all(a >= n for a, n in zip(acked_msgs, n_msgs, strict=True)) and all(
            d >= f[2] for d, f in zip(delivered, flows, strict=True))

    end = drive(conns, nets, done=done, time_limit=time_limit, on_event=on_event,  # type: ignore[arg-type]
                schedulers=list(schedulers.values()))
    senders = [conns[2 * i].metrics() for i in range(len(flows))]
    return FlowsResult(
        completed=done(),
        fct=fct,
        flow_bytes=[f[2] for f in flows],
        drops=fabric.drops(),
        packets_sent=sum(m["sender"]["packets_sent"] for m in senders),
        retransmissions=sum(m["sender"]["retransmissions"] for m in senders),
        peak_downlink_queue={dst: fabric.down[dst].peak for _, dst, _ in flows},
        duration=end,
        sender_metrics=senders,
    )
