"""In-memory simulated network: two endpoints joined by N paths, a virtual clock and an event heap.

Each path has, per direction, a drop-tail queue in front of a serialising link (rate, propagation
delay) and seeded impairments: random loss, duplication, corruption (one flipped bit), extra
random delay (reordering) and down intervals in which everything sent is dropped. A datagram's EV
picks its path (``ev % len(paths)``), ACKs likewise. ``drive`` runs any number of Connections over
such networks with the loop of any sans-I/O driver (handle events, drain what to send, deliver due
datagrams, fire due timers); ``run_transfer`` uses it for two Connections, the simulated all-reduce
for a whole ring. Everything is deterministic for a given seed.
"""

from __future__ import annotations

import heapq
import logging
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from transport.core.config import TransportConfig
from transport.core.connection import Connection, MessageAcked, MessageReceived
from transport.core.credit import CreditScheduler
from transport.core.headers import UDP_FRAME_OVERHEAD
from transport.core.pump import Datagrams, Pump, earliest

logger = logging.getLogger(__name__)

# Bytes of Ethernet + IPv4 + UDP overhead added to each datagram when computing serialisation time.
WIRE_OVERHEAD = UDP_FRAME_OVERHEAD


@dataclass
class PathSpec:
    rate_bps: float = 100e6
    delay: float = 0.0005  # one-way propagation delay, seconds
    queue_packets: int = 64  # drop-tail queue per direction
    loss: float = 0.0
    duplicate: float = 0.0
    corrupt: float = 0.0
    reorder: float = 0.0  # probability of an extra random delay
    reorder_delay: float = 0.001  # the extra delay is uniform in [0, reorder_delay]
    down: list[tuple[float, float]] = field(default_factory=list)  # [start, end) intervals dropping everything


@dataclass
class LinkStats:
    sent: int = 0
    delivered: int = 0
    lost: int = 0
    queue_drops: int = 0
    down_drops: int = 0
    duplicated: int = 0
    corrupted: int = 0
    reordered: int = 0
    peak_queue: int = 0  # the most packets the queue ever held, the one in service included


class Link:
    """One direction of one link: a path of a SimNetwork, or a hop of a simulated fabric
    (transport/sim/fabric.py)."""

    def __init__(self, spec: PathSpec) -> None:
        self.spec = spec
        self.busy_until = 0.0
        self.departures: deque[float] = deque()  # departure times of queued packets
        self.control_departures: deque[float] = deque()  # the same, of the control class (see transmit)
        self.stats = LinkStats()

    def is_down(self, now: float) -> bool:
        return any(start <= now < end for start, end in self.spec.down)

    def transmit(self, data: bytes, now: float, rng: random.Random, control: bool = False) -> list[tuple[float, bytes]]:
        """Send ``data`` at ``now``: the (arrival time, datagram) of each copy that gets through.

        ``control``: the datagram is in the control class, which the emulator's shaped links serve
        before data (emulator/shaping.py): it waits only for the frame on the wire and for control
        queued before it, in a queue of its own. Data departures are fixed when they are queued, so
        its wire time delays the data queued after it, not the data already queued; the link is
        busy exactly as long either way."""
        spec = self.spec
        st = self.stats
        st.sent += 1
        if spec.down and self.is_down(now):
            st.down_drops += 1
            return []
        if spec.loss and rng.random() < spec.loss:
            st.lost += 1
            return []
        copies = 1
        if spec.duplicate and rng.random() < spec.duplicate:
            copies = 2
            st.duplicated += 1
        out = []
        for _ in range(copies):
            departure = self._queue_control(data, now) if control else self._queue(data, now)
            if departure is None:
                st.queue_drops += 1
                continue
            arrival = departure + spec.delay
            if spec.reorder and rng.random() < spec.reorder:
                arrival += rng.random() * spec.reorder_delay
                st.reordered += 1
            payload = data
            if spec.corrupt and rng.random() < spec.corrupt:
                b = bytearray(data)
                if b:
                    i = rng.randrange(len(b))
                    b[i] ^= 1 << rng.randrange(8)
                payload = bytes(b)
                st.corrupted += 1
            out.append((arrival, payload))
            st.delivered += 1
        return out

    def _queue(self, data: bytes, now: float) -> float | None:
        """Queue a data frame: when it leaves the link, or None when the queue is full."""
        deps = self.departures
        while deps and deps[0] <= now:
            deps.popleft()
        if len(deps) >= self.spec.queue_packets:
            return None
        start = max(now, self.busy_until)
        self.busy_until = start + (len(data) + WIRE_OVERHEAD) * 8 / self.spec.rate_bps
        deps.append(self.busy_until)
        if len(deps) > self.stats.peak_queue:
            self.stats.peak_queue = len(deps)
        return self.busy_until

    def _queue_control(self, data: bytes, now: float) -> float | None:
        """Queue a control frame: after the frame on the wire (the first queued data frame's departure)
        and the control queued before it."""
        deps, cdeps = self.departures, self.control_departures
        while deps and deps[0] <= now:
            deps.popleft()
        while cdeps and cdeps[0] <= now:
            cdeps.popleft()
        if len(cdeps) >= self.spec.queue_packets:
            return None
        wire = (len(data) + WIRE_OVERHEAD) * 8 / self.spec.rate_bps
        start = max(now, deps[0] if deps else now, cdeps[-1] if cdeps else now)
        cdeps.append(start + wire)
        self.busy_until = max(self.busy_until, now) + wire
        return start + wire


class SimNetwork:
    """Endpoints 0 (A) and 1 (B) joined by ``paths``; call ``send`` and pop due deliveries."""

    def __init__(self, paths: list[PathSpec], seed: int = 0) -> None:
        if not paths:
            raise ValueError("at least one path is needed")
        self.paths = paths
        self.rng = random.Random(seed)
        self.links = [[Link(p) for p in paths], [Link(p) for p in paths]]  # [from A, from B]
        self._heap: list[tuple[float, int, int, bytes]] = []  # (time, seq, destination, datagram)
        self._seq = 0

    def send(self, src: int, data: bytes, ev: int, now: float) -> None:
        """Endpoint ``src`` (0 or 1) sends ``data`` on the path its EV maps to."""
        link = self.links[src][ev % len(self.paths)]
        for arrival, payload in link.transmit(data, now, self.rng):
            self._seq += 1
            heapq.heappush(self._heap, (arrival, self._seq, 1 - src, payload))

    def next_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[tuple[int, bytes]]:
        """Datagrams arriving at or before ``now``: (destination endpoint, datagram)."""
        out = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, dst, data = heapq.heappop(heap)
            out.append((dst, data))
        return out

    def link_stats(self) -> list[dict]:
        return [
            {"path": i, "a_to_b": vars(self.links[0][i].stats), "b_to_a": vars(self.links[1][i].stats)}
            for i in range(len(self.paths))
        ]


@dataclass
class TransferResult:
    duration: float
    goodput_bps: float
    delivered: list[tuple[int, bytes]]
    sender_metrics: dict
    receiver_metrics: dict
    completed: bool
    network: list[dict] = field(default_factory=list)
    timer_always_armed: bool = True  # a timer was armed whenever the sender had data outstanding
    acked: list[int] = field(default_factory=list)


def drive(
    conns: Sequence[Connection],
    nets: Sequence[tuple[SimNetwork, int, int]],
    *,
    done: Callable[[], bool],
    time_limit: float,
    on_event: Callable[[int, object, float], None] | None = None,
    check: Callable[[float], None] | None = None,
    start: float = 0.0,
    wake: Callable[[], float | None] | None = None,
    schedulers: Sequence[CreditScheduler] = (),
) -> float:
    """Run the loop of any sans-I/O driver over simulated networks until ``done()`` or the virtual
    clock passes ``time_limit``; returns the time.

    ``nets`` lists each network with the indices in ``conns`` of its endpoints 0 and 1. Every turn
    hands each connection's events to ``on_event(index, event, now)`` first, so that what it submits
    leaves in the same turn, then sends what is due, calls ``check(now)`` and asks ``done()``; then
    the clock moves to the next delivery or timer, which are delivered and fired. ``wake()`` gives the
    time the application's own clock next needs a turn (a modelled compute's end, say), if ever.
    ``schedulers``: the credit schedulers shared by receiving connections (transport.core.credit),
    whose timers are fired like the connections' own.
    """
    # Every connection is driven by the same Pump as over real sockets; its sends go into its network.
    side_of: dict[int, tuple[SimNetwork, int]] = {}
    for net, a, b in nets:
        side_of[a] = (net, 0)
        side_of[b] = (net, 1)
    if len(side_of) != len(conns):
        raise ValueError("every connection needs one end of one network")

    def sender(net: SimNetwork, side: int) -> Callable[[Datagrams, float], None]:
        send = net.send

        def send_all(out: Datagrams, now: float) -> None:
            for data, ev in out:
                send(side, data, ev, now)

        return send_all

    def handler(i: int) -> Callable[[object, float], None] | None:
        return None if on_event is None else lambda event, now: on_event(i, event, now)

    pumps = [Pump(conn, sender(*side_of[i]), handler(i)) for i, conn in enumerate(conns)]  # type: ignore[arg-type]
    networks = [net for net, _, _ in nets]
    ends = [(net, conns[a], conns[b]) for net, a, b in nets]
    now = start
    while True:
        for pump in pumps:
            pump.events(now)
        for _, a, b in nets:
            pumps[a].flush(now)
            pumps[b].flush(now)
        if check is not None:
            check(now)
        if done():
            return now
        nxt = earliest(min((t for net in networks if (t := net.next_time()) is not None), default=None), pumps)
        if wake is not None and (w := wake()) is not None and (nxt is None or w < nxt):
            nxt = w
        for sched in schedulers:
            t = sched.get_timer()
            if t is not None and (nxt is None or t < nxt):
                nxt = t
        if nxt is None:
            logger.debug("simulation stalled at %.6f: nothing scheduled", now)
            return now
        nxt = max(now, nxt)
        if nxt > time_limit:
            return now
        now = nxt
        for net, a, b in ends:
            for dst, data in net.pop_due(now):
                (b if dst else a).receive_datagram(data, now)
        for pump in pumps:
            pump.fire(now)
        for sched in schedulers:
            t = sched.get_timer()
            if t is not None and t <= now:
                sched.handle_timer(now)


def run_transfer(
    sender_cfg: TransportConfig,
    receiver_cfg: TransportConfig,
    paths: list[PathSpec],
    *,
    messages: list[bytes] | None = None,
    total_bytes: int = 0,
    message_size: int = 65536,
    seed: int = 0,
    time_limit: float = 60.0,
    connection_id: int = 1,
    initial_psn: int = 0,
) -> TransferResult:
    """Send ``messages`` (or ``total_bytes`` split into ``message_size`` messages of seeded random
    bytes) from A to B and run until every message is acknowledged or ``time_limit`` passes."""
    if messages is None:
        rng = random.Random(seed ^ 0x5EED)
        messages = []
        left = total_bytes
        while left > 0:
            n = min(message_size, left)
            messages.append(rng.randbytes(n))
            left -= n
    net = SimNetwork(paths, seed=seed)
    a = Connection(sender_cfg, connection_id, seed=seed, initial_psn=initial_psn)
    b = Connection(receiver_cfg, connection_id, seed=seed + 1, initial_psn=initial_psn)
    for m in messages:
        a.send_message(m, now=0.0)
    delivered: list[tuple[int, bytes]] = []
    acked: list[int] = []
    last_delivery = [0.0]
    armed = [True]

    def on_event(side: int, event: object, now: float) -> None:
        if side == 1 and isinstance(event, MessageReceived):
            delivered.append((event.msg_id, event.data))
            last_delivery[0] = now
        elif side == 0 and isinstance(event, MessageAcked):
            acked.append(event.msg_id)

    def check(now: float) -> None:
        if not a.idle and a.get_timer() is None and net.next_time() is None:
            armed[0] = False

    n = len(messages)
    end = drive(
        (a, b), [(net, 0, 1)], done=lambda: len(acked) >= n and len(delivered) >= n, time_limit=time_limit,
        on_event=on_event, check=check,
    )
    completed = len(acked) >= n and len(delivered) >= n
    duration = last_delivery[0] if completed else end
    nbytes = sum(len(d) for _, d in delivered)
    return TransferResult(
        duration=duration,
        goodput_bps=nbytes * 8 / duration if duration > 0 else 0.0,
        delivered=delivered,
        sender_metrics=a.metrics(),
        receiver_metrics=b.metrics(),
        completed=completed,
        network=net.link_stats(),
        timer_always_armed=armed[0],
        acked=acked,
    )
