"""A whole training job in one process over a simulated leaf-spine fabric, with a virtual clock.

Every rank runs the same `TrainingRank` (transport/training/rank.py) as in an emulated host, every
storage host the same `StorageHost`; each pair of nodes that talk is one pair of transport
`Connection`s, driven by `transport.sim.simnet.drive`. Unlike `SimNetwork`'s private paths, the links
here are shared, so that what shares a link in a fabric shares it here: a rank's access link carries
its collective and its checkpoint, a leaf's uplinks carry every rank of the leaf, the far storage's
private interconnect carries every rank's checkpoint.

The fabric: `leaves` leaves of `ranks_per_leaf` ranks each, `spines` spines, a near storage host on
every leaf, and one far storage host behind a slower, longer link from the spines (a private
interconnect to a colocation site). Ranks are placed round-robin over the leaves when `interleave` is
set, so that every ring edge crosses the spine and neighbours' flows meet on the uplinks. A packet's
spine is a hash of its pair and EV, as ECMP hashes the 5-tuple (the EV is the UDP source port), so a
single-path connection keeps one spine and a spraying one uses all of them.

A packet crosses its hops store-and-forward, each hop a drop-tail queue before a serialising link; a
packet's departure from every hop is worked out when it is sent (queues are FIFO in that order, not
strictly in arrival order at later hops, which is close enough for a model at these loads).
"""

from __future__ import annotations

import heapq
import random
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from transport.core.config import TransportConfig
from transport.core.connection import Connection
from transport.core.events import MessageReceived
from transport.sim.simnet import WIRE_OVERHEAD, SimNetwork, drive
from transport.training.messages import MessageError
from transport.training.metrics import job_summary, rank_report
from transport.training.rank import TrainingRank
from transport.training.spec import JobSpec, RankHosts, pair_connection_id, rank_name
from transport.training.storage import Coordinator, StorageHost

COORDINATOR = "near0"


@dataclass
class TrainFabric:
    """The simulated fabric's shape, rates (bit/s), delays (s) and faults."""

    leaves: int = 2
    ranks_per_leaf: int = 2
    spines: int = 2
    host_rate_bps: float = 100e6
    uplink_rate_bps: float = 50e6  # per leaf-spine link: 2 ranks x 100 over 2 x 50 is 2:1 oversubscribed
    hop_delay: float = 0.0001
    storage_rate_bps: float = 100e6  # a storage host's access link
    far_rate_bps: float = 20e6  # the private interconnect to the far storage
    far_delay: float = 0.005
    queue_packets: int = 128
    interleave: bool = True
    loss: float = 0.0  # random loss on leaf0-spine0, both ways
    cut: tuple[str, float, float] | None = None  # (node, from, to): the node's access link is down

    @property
    def n_ranks(self) -> int:
        return self.leaves * self.ranks_per_leaf

    def leaf_of(self, node: str) -> int | None:
        if node.startswith("rank"):
            r = int(node[4:])
            return r % self.leaves if self.interleave else r // self.ranks_per_leaf
        if node.startswith("near"):
            return int(node[4:])
        return None  # the far site

    def hosts_for(self, rank: int, data: str, checkpoint: str) -> RankHosts:
        """A rank's storage: `near` is its own leaf's storage host, `far` the far site's."""

        def pick(where: str) -> str:
            return f"near{self.leaf_of(rank_name(rank))}" if where == "near" else "far0"

        return RankHosts(data=pick(data), checkpoint=pick(checkpoint), coordinator=COORDINATOR)


@dataclass
class HopStats:
    sent: int = 0
    lost: int = 0
    queue_drops: int = 0
    down_drops: int = 0
    bytes: int = 0


@dataclass(eq=False)
class Hop:
    """One direction of one link, shared by every pair whose packets cross it."""

    name: str
    rate_bps: float
    delay: float
    queue_packets: int
    loss: float = 0.0
    down: list[tuple[float, float]] = field(default_factory=list)
    busy_until: float = 0.0
    departures: deque[float] = field(default_factory=deque)
    stats: HopStats = field(default_factory=HopStats)

    def cross(self, size: int, t: float, rng: random.Random) -> float | None:
        """When a packet of `size` bytes reaching the hop at `t` leaves its far end; None if dropped."""
        st = self.stats
        st.sent += 1
        if self.down and any(a <= t < b for a, b in self.down):
            st.down_drops += 1
            return None
        if self.loss and rng.random() < self.loss:
            st.lost += 1
            return None
        deps = self.departures
        while deps and deps[0] <= t:
            deps.popleft()
        if len(deps) >= self.queue_packets:
            st.queue_drops += 1
            return None
        self.busy_until = max(t, self.busy_until) + size * 8 / self.rate_bps
        deps.append(self.busy_until)
        st.bytes += size
        return self.busy_until + self.delay


class FabricLinks:
    """The fabric's hops and the path between any two nodes."""

    def __init__(self, fab: TrainFabric) -> None:
        self.fab = fab
        self.hops: dict[str, Hop] = {}
        cut_node, cut_from, cut_to = fab.cut if fab.cut else (None, 0.0, 0.0)

        def hop(name: str, rate: float, delay: float, loss: float = 0.0, down: bool = False) -> Hop:
            h = Hop(name, rate, delay, fab.queue_packets, loss, [(cut_from, cut_to)] if down else [])
            self.hops[name] = h
            return h

        self._nodes = [rank_name(r) for r in range(fab.n_ranks)] + [f"near{i}" for i in range(fab.leaves)] + ["far0"]
        for n in self._nodes:
            rate = fab.host_rate_bps if n.startswith("rank") else fab.storage_rate_bps
            hop(f"{n}>", rate, fab.hop_delay, down=n == cut_node)
            hop(f">{n}", rate, fab.hop_delay, down=n == cut_node)
        for leaf in range(fab.leaves):
            for s in range(fab.spines):
                loss = fab.loss if (leaf, s) == (0, 0) else 0.0
                hop(f"leaf{leaf}>spine{s}", fab.uplink_rate_bps, fab.hop_delay, loss)
                hop(f"spine{s}>leaf{leaf}", fab.uplink_rate_bps, fab.hop_delay, loss)
        hop("spines>far", fab.far_rate_bps, fab.far_delay)
        hop("far>spines", fab.far_rate_bps, fab.far_delay)

    def path(self, a: str, b: str, ev: int) -> list[Hop]:
        fab, h = self.fab, self.hops
        la, lb = fab.leaf_of(a), fab.leaf_of(b)
        if la is not None and la == lb:
            return [h[f"{a}>"], h[f">{b}"]]
        s = zlib.crc32(f"{a}|{b}|{ev}".encode()) % fab.spines
        out = [h[f"{a}>"]]
        out.append(h[f"leaf{la}>spine{s}"] if la is not None else h["far>spines"])
        out.append(h[f"spine{s}>leaf{lb}"] if lb is not None else h["spines>far"])
        out.append(h[f">{b}"])
        return out

    def stats(self) -> dict[str, dict]:
        return {name: vars(hop.stats) for name, hop in self.hops.items() if hop.stats.sent}


class PairNet(SimNetwork):
    """The network between two nodes, as `drive` sees one: endpoint 0 is `a`, 1 is `b`. Its deliveries
    are a SimNetwork's; its links are the fabric's shared hops."""

    def __init__(self, links: FabricLinks, a: str, b: str, seed: int) -> None:
        self.fabric = links
        self.ends = (a, b)
        self.rng = random.Random(seed)
        self._paths: dict[tuple[int, int], list[Hop]] = {}
        self._heap: list[tuple[float, int, int, bytes]] = []
        self._seq = 0

    def send(self, src: int, data: bytes, ev: int, now: float) -> None:
        key = (src, ev)
        path = self._paths.get(key)
        if path is None:
            path = self._paths[key] = self.fabric.path(self.ends[src], self.ends[1 - src], ev)
        t: float | None = now
        size = len(data) + WIRE_OVERHEAD
        for hop in path:
            t = hop.cross(size, t, self.rng)  # type: ignore[arg-type]
            if t is None:
                return
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, 1 - src, data))

    def link_stats(self) -> list[dict]:
        return [{"path": name, **stats} for name, stats in self.fabric.stats().items()]


@dataclass
class TrainSimResult:
    summary: dict[str, Any]
    reports: list[dict[str, Any]]
    storage: dict[str, dict]
    restarts: list[dict]
    links: dict[str, dict]
    duration: float
    completed: bool
    transport: dict[str, int] = field(default_factory=dict)


def train_simulated(
    spec: JobSpec,
    fabric: TrainFabric | None = None,
    config: TransportConfig | None = None,
    *,
    data_storage: str = "near",
    checkpoint_storage: str = "near",
    seed: int = 0,
    time_limit: float = 600.0,
) -> TrainSimResult:
    """Run the job on every rank over the simulated fabric; deterministic for a seed."""
    fab = fabric or TrainFabric()
    config = config or TransportConfig()
    config.validate()
    spec.validate()
    n = fab.n_ranks
    links = FabricLinks(fab)
    ranks = [TrainingRank(spec, r, n, fab.hosts_for(r, data_storage, checkpoint_storage)) for r in range(n)]
    storage = {name: StorageHost(name) for name in [f"near{i}" for i in range(fab.leaves)] + ["far0"]}
    coordinator = Coordinator(n)
    storage[COORDINATOR].coordinator = coordinator
    nodes: dict[str, TrainingRank | StorageHost] = {rk.name: rk for rk in ranks} | storage

    pairs: set[tuple[str, str]] = set()
    for r in range(n):
        for q in range(r + 1, n):
            pairs.add((rank_name(r), rank_name(q)))
        h = ranks[r].hosts
        for host in (h.data, h.checkpoint, h.coordinator):
            pairs.add((rank_name(r), host))
    conns: list[Connection] = []
    owner: list[tuple[str, str]] = []  # conns[i] belongs to node owner[i][0] and talks to owner[i][1]
    to: dict[tuple[str, str], Connection] = {}
    joins = []
    for k, (a, b) in enumerate(sorted(pairs)):
        cid = pair_connection_id(a, b, seed)
        for me, peer in ((a, b), (b, a)):
            c = Connection(config, cid, seed=seed * 100003 + 2 * k + (me == b))
            to[(me, peer)] = c
            conns.append(c)
            owner.append((me, peer))
        joins.append((PairNet(links, a, b, seed * 7919 + k), len(conns) - 2, len(conns) - 1))
    errors: list[str] = []

    def dispatch(src: str, sends: list[tuple[str, bytes]], now: float) -> None:
        for dst, msg in sends:
            to[(src, dst)].send_message(msg, now)

    def on_event(i: int, event: object, now: float) -> None:
        if isinstance(event, MessageReceived):
            me, peer = owner[i]
            try:
                dispatch(me, nodes[me].receive(peer, event.data, now), now)
            except MessageError as exc:
                errors.append(str(exc))

    # What ranks submit from `check` leaves in drive's next turn, which must then come at once.
    unsent: list[float] = []

    def check(now: float) -> None:
        unsent.clear()
        for rk in ranks:
            sends = rk.advance(now)
            if sends:
                dispatch(rk.name, sends, now)
                unsent.append(now)

    def wake() -> float | None:
        if unsent:
            return unsent[0]
        return min((t for rk in ranks if (t := rk.wake_time()) is not None), default=None)

    for rk in ranks:
        dispatch(rk.name, rk.start(0.0), 0.0)
    now = drive(conns, joins, done=lambda: all(rk.done for rk in ranks), time_limit=time_limit,
                on_event=on_event, check=check, wake=wake)
    reports = [rank_report(rk) for rk in ranks]
    retx = sum(c.metrics().get("sender", {}).get("retransmissions", 0) for c in conns)
    return TrainSimResult(
        summary=job_summary(reports),
        reports=reports,
        storage={name: s.stats() for name, s in storage.items()},
        restarts=coordinator.restarts,
        links=links.stats(),
        duration=now,
        completed=all(rk.done for rk in ranks),
        transport={"retransmissions": retx, "message_errors": len(errors)},
    )
