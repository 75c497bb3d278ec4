"""A packet network on a virtual clock: nodes joined by one-way ports, one event heap, and endpoints
that drive the transport's sans-I/O `Connection`s.

This is the simulator every simulated fabric runs on (the Topology-shaped one in emulator/sim, the
two-leaf and one-switch shapes of `transport.sim.fabric`). It knows nothing of topologies or
routing: whoever builds a `Network` gives it `route(key, node, via) -> tuple[Port, ...]`, the ports a
packet with header `key` takes from `node` to its destination host. A route is asked once per header
and cached until `reroute()` (the controller changed its rules), so the per-hop cost is a tuple index.

The model's rules (they are the emulator's, see emulator/shaping.py, unless said):

* A `Port` is one direction of a link: a drop-tail queue counted in bytes in front of a serialising
  link (the frame's bytes at the port's rate), then its propagation delay. A port that is down drops
  what is queued to it and what is on its wire when it arrives.
* Store and forward: a packet is queued on its next port when its last bit has reached the node.
  Departures are fixed when a packet is queued (FIFO), so one event per packet-hop.
* Two classes, as the emulator's shaped links have: control (ACKs, credit) waits only for the frame on
  the wire and the control queued before it, in a queue of its own; data waits for everything queued.
* ECN: a port with `ecn_bytes` marks a data packet CE when it finds at least that many bytes queued
  (a step, as DCTCP's switches mark); the receiving connection is told (`receive_datagram(ecn_ce)`).
  The kernel on these machines has no marking qdisc, so the emulator cannot do this; the simulator can.
* Random loss per port from one seeded generator, drawn in event order: a run is reproducible from
  its seed.
* Ties on the clock are served in the order they were scheduled.

An `Endpoint` is one side of a connection: it sends through `Network.inject` with the header of each
EV, receives what reaches its host for it, and is woken by its connection's timer. Timers are kept
lazily on the same heap (an entry that is no longer the connection's timer is skipped when it comes
up), so a turn costs the connection's own work, never a pass over every connection.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from heapq import heappush
from typing import Any

from transport.core.connection import Connection
from transport.core.events import Event
from transport.core.headers import UDP_FRAME_OVERHEAD
from transport.core.pump import Pump
from transport.core.wire import CONTROL_CLASS_TYPES, TYPE_OFFSET

# A header: (source address, destination address, protocol, source port, destination port).
Key = tuple[str, str, int, int, int]
IPPROTO_UDP = 17


@dataclass
class PortStats:
    packets: int = 0  # frames that left (reached the far end's wire)
    bytes: int = 0  # their wire bytes
    queue_drops: int = 0
    lost: int = 0  # random loss
    down_drops: int = 0
    ecn_marked: int = 0
    peak_bytes: int = 0  # the most bytes the data queue held, the frame in service included


class Port:
    """One direction of a link: `src` -> `dst` (node ids), `rate_bps`, `delay` seconds, a queue of
    `queue_bytes` (at least one frame always fits), ECN marking from `ecn_bytes` (0: never).

    The queue's bytes are the time its backlog still needs on the wire at the rate (`busy_until` -
    now), so queuing a data frame is a few float operations; the departures of data frames are kept
    only so that a control frame knows when the frame on the wire ends."""

    __slots__ = ("busy_until", "bytes_per_s", "cdeps", "delay", "deps", "dst", "ecn_bytes", "index", "loss", "name",
                 "queue_bytes", "rate_bps", "src", "stats", "up")

    def __init__(self, src: int, dst: int, rate_bps: float, delay: float, queue_bytes: int, *,
                 ecn_bytes: int = 0, loss: float = 0.0, name: str = "") -> None:
        if rate_bps <= 0:
            raise ValueError(f"port {name or (src, dst)}: rate must be positive, not {rate_bps}")
        self.src, self.dst = src, dst
        self.rate_bps = float(rate_bps)
        self.bytes_per_s = self.rate_bps / 8
        self.delay = float(delay)
        self.queue_bytes = int(queue_bytes)
        self.ecn_bytes = int(ecn_bytes)
        self.loss = float(loss)
        self.up = True
        self.name = name
        self.index = -1  # its position in Network.ports
        self.busy_until = 0.0  # when the last frame queued leaves
        self.deps: deque[float] = deque()  # data frames' departures, oldest first (see transmit)
        self.cdeps: deque[float] = deque()  # control frames' departures
        self.stats = PortStats()

    def backlog(self, now: float) -> int:
        """Bytes queued or on the wire at `now`."""
        left = self.busy_until - now
        return int(left * self.bytes_per_s) if left > 0 else 0

    def transmit(self, size: int, now: float, control: bool) -> tuple[float, bool] | None:
        """Queue a frame of `size` wire bytes at `now`: (departure time, marked CE), or None when the
        queue is full."""
        busy = self.busy_until
        if control:
            return self._control(size, now)
        if busy > now:
            queued = (busy - now) * self.bytes_per_s
            if queued + size > self.queue_bytes:
                return None
            mark = 0 < self.ecn_bytes <= queued
            departure = busy + size / self.bytes_per_s
            if queued + size > self.stats.peak_bytes:
                self.stats.peak_bytes = int(queued + size)
        else:
            mark = False
            departure = now + size / self.bytes_per_s
            if size > self.stats.peak_bytes:
                self.stats.peak_bytes = size
        self.busy_until = departure
        deps = self.deps
        deps.append(departure)
        if len(deps) > 256:  # a port that carries no control: forget what has left
            while deps[0] <= now:
                deps.popleft()
        return departure, mark

    def _control(self, size: int, now: float) -> tuple[float, bool] | None:
        """A control frame goes after the frame on the wire (the oldest data departure still ahead) and
        the control queued before it, in a queue of its own; its wire time delays the data queued
        after it, not the data already queued (their departures are fixed)."""
        deps, cdeps = self.deps, self.cdeps
        while deps and deps[0] <= now:
            deps.popleft()
        while cdeps and cdeps[0] <= now:
            cdeps.popleft()
        if cdeps and len(cdeps) * size >= self.queue_bytes:
            return None
        wire = size / self.bytes_per_s
        start = now
        if deps and deps[0] > start:
            start = deps[0]
        if cdeps and cdeps[-1] > start:
            start = cdeps[-1]
        cdeps.append(start + wire)
        self.busy_until = (self.busy_until if self.busy_until > now else now) + wire
        return start + wire, False

    def set_rate(self, rate_bps: float) -> None:
        """A new rate for frames queued from now on (those queued keep their departures)."""
        if rate_bps <= 0:
            raise ValueError(f"port {self.name}: rate must be positive, not {rate_bps}")
        self.rate_bps = float(rate_bps)
        self.bytes_per_s = self.rate_bps / 8

    def cut(self) -> None:
        """Down: what is queued is lost (counted when it would have arrived)."""
        self.up = False
        self.deps.clear()
        self.cdeps.clear()
        self.busy_until = 0.0


class Packet:
    """A datagram in the network: its bytes, header `key`, route and how far along it is, and the
    endpoint that takes it at the end."""

    __slots__ = ("ce", "control", "data", "gen", "hop", "key", "path", "size", "to")

    def __init__(self, data: bytes, key: Key, to: Endpoint, path: tuple[Port, ...], gen: int) -> None:
        self.data = data
        self.key = key
        self.to = to
        self.path = path
        self.gen = gen
        self.hop = 0
        self.ce = False
        self.size = len(data) + UDP_FRAME_OVERHEAD
        self.control = len(data) > TYPE_OFFSET and data[TYPE_OFFSET] in CONTROL_CLASS_TYPES


class Timed:
    """Something woken at a time on the network's clock: `wake(now)`."""

    def wake(self, now: float) -> None:  # pragma: no cover - interface
        raise NotImplementedError


@dataclass
class Counters:
    events: int = 0  # heap entries handled (packet-hops, timers, wake-ups)
    packet_hops: int = 0  # frames that crossed a port (Network.count_hops)
    delivered: int = 0  # datagrams handed to an endpoint
    undeliverable: int = 0  # datagrams with no route (their destination cut off)


class Network:
    """Nodes 0..n-1, their ports, one event heap and the clock.

    `route(key, node, via)` gives the ports from `node` to the key's destination host, or () when there
    is none: from a host `via` is None, from a switch it is the port the packet came in by.
    """

    def __init__(self, ports: Sequence[Port], route: Callable[[Key, int, Port | None], tuple[Port, ...]], *,
                 seed: int = 0) -> None:
        self.ports = list(ports)
        for i, p in enumerate(self.ports):
            p.index = i
        self.route = route
        self.rng = random.Random(seed)
        self.now = 0.0
        self.gen = 0  # bumped by reroute(): cached routes and packets' paths from before are stale
        self._routes: dict[tuple[Key, int, int], tuple[Port, ...]] = {}
        self._heap: list[tuple[float, int, Any]] = []
        self._seq = 0
        self.counters = Counters()

    # -- scheduling ------------------------------------------------------------------------------

    def at(self, when: float, what: Timed) -> None:
        """Wake `what` at `when` (not before now)."""
        self._seq += 1
        heapq.heappush(self._heap, (when if when > self.now else self.now, self._seq, what))

    def reroute(self) -> None:
        """The forwarding changed: routes are asked again, and packets in flight follow the new ones
        from the next node they reach."""
        self.gen += 1
        self._routes.clear()

    def path(self, key: Key, node: int, via: Port | None = None) -> tuple[Port, ...]:
        """The ports from `node` (a host, or the node `via` leads to) to the key's destination host."""
        k = (key, node, -1 if via is None else via.index)
        p = self._routes.get(k)
        if p is None:
            p = self._routes[k] = self.route(key, node, via)
        return p

    # -- packets ---------------------------------------------------------------------------------

    def inject(self, data: bytes, key: Key, node: int, to: Endpoint, now: float) -> None:
        """A host (`node`) sends `data` with header `key`, for endpoint `to` at the far end."""
        path = self.path(key, node)
        if not path:
            self.counters.undeliverable += 1
            return
        pkt = Packet(data, key, to, path, self.gen)
        self._queue(pkt, path[0], now)

    def _queue(self, pkt: Packet, port: Port, now: float) -> None:
        if not port.up:
            port.stats.down_drops += 1
            return
        if port.loss and self.rng.random() < port.loss:
            port.stats.lost += 1
            return
        got = port.transmit(pkt.size, now, pkt.control)
        if got is None:
            port.stats.queue_drops += 1
            return
        departure, mark = got
        if mark:
            pkt.ce = True
            port.stats.ecn_marked += 1
        arrival = departure + port.delay
        self._seq += 1
        heappush(self._heap, (arrival, self._seq, pkt))

    def _arrive(self, pkt: Packet, now: float) -> None:
        hop = pkt.hop
        path = pkt.path
        port = path[hop]
        if not port.up:
            port.stats.down_drops += 1
            return
        st = port.stats
        st.packets += 1
        st.bytes += pkt.size
        hop += 1
        pkt.hop = hop
        if hop == len(path):
            self.counters.delivered += 1
            pkt.to.receive(pkt.data, now, pkt.ce)
            return
        if pkt.gen != self.gen:
            # The rules changed since this packet's route was computed: the rest of the way is asked again.
            rest = self.path(pkt.key, port.dst, port)
            if not rest:
                self.counters.undeliverable += 1
                return
            pkt.path, pkt.hop, pkt.gen = rest, 0, self.gen
            hop = 0
        self._queue(pkt, pkt.path[hop], now)

    # -- the loop --------------------------------------------------------------------------------

    def run(self, until: float = float("inf"), done: Callable[[], bool] | None = None,
            check_every: int = 4096) -> float:
        """Handle events in time order until the clock would pass `until` (it then stands at `until`),
        the heap is empty, or `done()` (asked every `check_every` events) is true; returns the clock."""
        heap = self._heap
        pop = heapq.heappop
        counters = self.counters
        arrive = self._arrive
        n = 0
        while heap:
            if heap[0][0] > until:
                break
            t, _, what = pop(heap)
            self.now = t
            n += 1
            if type(what) is Packet:
                arrive(what, t)
            else:
                what.wake(t)
            if n >= check_every:
                counters.events += n
                n = 0
                if done is not None and done():
                    return self.now
        counters.events += n
        if until != float("inf") and self.now < until:
            self.now = until  # nothing happens before `until`: the clock stands there
        return self.now

    def count_hops(self) -> int:
        """Frames that crossed a port so far (counted per port, not per event: it costs the hot path nothing)."""
        self.counters.packet_hops = sum(p.stats.packets for p in self.ports)
        return self.counters.packet_hops

    def pending(self) -> int:
        return len(self._heap)


class Endpoint(Timed):
    """One end of a connection on a host: sends each (datagram, EV) the connection has with the
    header `keys[ev]`, hands what arrives to the connection, and keeps its timer on the heap.

    `on_event(endpoint, event, now)` is the application (a workload), `after(endpoint, now)` runs
    after every turn (to submit more, say)."""

    __slots__ = ("armed", "conn", "credit", "datagrams_received", "ev_received", "ev_sent", "keys", "net", "node",
                 "on_event", "peer", "pump", "sent")

    def __init__(self, net: Network, conn: Connection, node: int, keys: Sequence[Key],
                 on_event: Callable[[Endpoint, Event, float], None] | None = None) -> None:
        self.net = net
        self.conn = conn
        self.node = node
        self.keys = list(keys)
        self.peer: Endpoint | None = None
        self.armed: float | None = None
        self.credit: CreditHost | None = None
        self.on_event = on_event
        self.sent = 0
        self.datagrams_received = 0
        self.ev_sent = [0] * len(self.keys)
        self.ev_received = [0] * len(self.keys)
        handler = None if on_event is None else (lambda event, now: on_event(self, event, now))
        self.pump = Pump(conn, self._send, handler)

    def _send(self, out: list[tuple[bytes, int]], now: float) -> None:
        inject, keys, node, peer, ev_sent = self.net.inject, self.keys, self.node, self.peer, self.ev_sent
        n = len(keys)
        for data, ev in out:
            ev %= n
            ev_sent[ev] += 1
            inject(data, keys[ev], node, peer, now)  # type: ignore[arg-type]
        self.sent += len(out)

    def receive(self, data: bytes, now: float, ce: bool) -> None:
        self.datagrams_received += 1
        self.conn.receive_datagram(data, now, ce)
        self.turn(now)

    def turn(self, now: float) -> None:
        """Events to the application, then what is due leaves, then the timer is kept."""
        self.pump.events(now)
        self.pump.flush(now)
        self.schedule()
        if self.credit is not None:
            self.credit.after_turn(now)

    def schedule(self) -> None:
        t = self.conn.get_timer()
        if t is not None and (self.armed is None or t < self.armed):
            self.armed = t
            self.net.at(t, self)

    def wake(self, now: float) -> None:
        if self.armed is None or now != self.armed:
            return  # an entry the timer no longer holds
        self.armed = None
        t = self.conn.get_timer()
        if t is None:
            return
        if t <= now:
            self.conn.handle_timer(now)
            self.turn(now)
        else:
            self.schedule()


class Waker(Timed):
    """A callable woken at a time (a fault, a flow's start, a sample)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[float], None]) -> None:
        self.fn = fn

    def wake(self, now: float) -> None:
        self.fn(now)


class CreditHost(Timed):
    """A receiving host's one credit scheduler (transport.core.credit), shared by every connection into
    it as the receiving endpoint shares it: the connections it granted to take a turn (their CREDIT
    leaves), and its own timer is kept on the heap."""

    __slots__ = ("armed", "net", "scheduler")

    def __init__(self, net: Network, scheduler: Any) -> None:
        self.net = net
        self.scheduler = scheduler
        scheduler.keep_touched = True
        self.armed: float | None = None

    def attach(self, endpoint: Endpoint) -> None:
        endpoint.conn.use_credit_scheduler(self.scheduler).owner = endpoint  # type: ignore[union-attr]
        endpoint.credit = self

    def after_turn(self, now: float) -> None:
        for rx in self.scheduler.take_touched():
            rx.owner.pump.flush(now)
            rx.owner.schedule()
        self.schedule()

    def schedule(self) -> None:
        t = self.scheduler.get_timer()
        if t is not None and (self.armed is None or t < self.armed):
            self.armed = t
            self.net.at(t, self)

    def wake(self, now: float) -> None:
        if self.armed is None or now != self.armed:
            return
        self.armed = None
        t = self.scheduler.get_timer()
        if t is not None and t <= now:
            for rx in self.scheduler.handle_timer(now):
                rx.owner.turn(now)
        self.schedule()
