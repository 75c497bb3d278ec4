"""Ranks joined by simulated switches, for collectives whose ranks talk to many peers at once.

A ring's edge is one `SimNetwork` of its own, but an all-to-all's rank sends to every other rank
through one network port, and that port is what limits it. Here every rank has a port on a
non-blocking fabric switch and, when ranks come in groups (a server's GPUs), another on its group's
local switch; traffic between two ranks of a group takes the local port, all other traffic the
fabric port. A port is an uplink (rank -> switch: the `PathSpec`'s rate, delay and seeded
impairments, behind the host's own queue of HOST_QUEUE_PACKETS) and a downlink (switch -> rank: same
rate, the `PathSpec`'s drop-tail queue, no impairments, so a datagram is lost or reordered once). The
downlinks are where incast queues and drops, as in a real switch.

`SwitchFabric.pair(a, b)` gives the two-ended view of ranks a and b that `transport.sim.simnet.drive`
runs a pair of Connections over; every view shares the fabric's ports and its one event heap, so the
switch serves datagrams in time order whichever pair they belong to.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, replace

from transport.sim.simnet import PathSpec, _Link


@dataclass
class FabricSpec:
    fabric: PathSpec  # every rank's port to the fabric switch
    local: PathSpec | None = None  # every rank's port to its group's switch (None: no local switch)
    group: int = 1  # ranks per group: ranks g*group .. g*group+group-1

    def level(self, a: int, b: int) -> str:
        same = self.local is not None and self.group > 1 and a // self.group == b // self.group
        return "local" if same else "fabric"


_TO_SWITCH = 0
_TO_RANK = 1


# A rank's own egress queue is its host's (Linux's default txqueuelen): a host holds back what its
# NIC cannot send yet rather than dropping it, and its data and its ACKs share that one queue.
HOST_QUEUE_PACKETS = 1000


class _Port:
    def __init__(self, spec: PathSpec) -> None:
        self.up = _Link(replace(spec, queue_packets=max(spec.queue_packets, HOST_QUEUE_PACKETS)))
        self.down = _Link(PathSpec(rate_bps=spec.rate_bps, delay=0.0, queue_packets=spec.queue_packets))


class PairView:
    """Ranks ``a`` (endpoint 0) and ``b`` (endpoint 1) over the fabric: SimNetwork's interface for drive."""

    def __init__(self, fabric: SwitchFabric, a: int, b: int) -> None:
        self.fabric = fabric
        self.ends = (a, b)
        self.outbox: list[tuple[int, bytes]] = []

    def send(self, src: int, data: bytes, ev: int, now: float) -> None:
        self.fabric._send(self, src, data, now)

    def next_time(self) -> float | None:
        if self.outbox:
            return self.fabric.now
        return self.fabric.next_time()

    def pop_due(self, now: float) -> list[tuple[int, bytes]]:
        self.fabric.advance(now)
        out, self.outbox = self.outbox, []
        return out

    def link_stats(self) -> list[dict]:
        return [self.fabric.port_stats(r) for r in self.ends]


class SwitchFabric:
    def __init__(self, n_ranks: int, spec: FabricSpec, seed: int = 0) -> None:
        self.spec = spec
        self.rng = random.Random(seed)
        self.ports: dict[str, list[_Port]] = {"fabric": [_Port(spec.fabric) for _ in range(n_ranks)]}
        if spec.local is not None:
            self.ports["local"] = [_Port(spec.local) for _ in range(n_ranks)]
        self._heap: list[tuple[float, int, int, PairView, int, str, bytes]] = []
        self._seq = 0
        self.now = 0.0

    def pair(self, a: int, b: int) -> PairView:
        return PairView(self, a, b)

    def _push(self, t: float, stage: int, view: PairView, dst_side: int, level: str, data: bytes) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, stage, view, dst_side, level, data))

    def _send(self, view: PairView, side: int, data: bytes, now: float) -> None:
        src, dst = view.ends[side], view.ends[1 - side]
        level = self.spec.level(src, dst)
        for t, payload in self.ports[level][src].up.transmit(data, now, self.rng):
            self._push(t, _TO_SWITCH, view, 1 - side, level, payload)

    def next_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def advance(self, now: float) -> None:
        """Move every datagram due by ``now``: into its downlink at the switch, or out to its rank."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            t, _, stage, view, dst_side, level, data = heapq.heappop(heap)
            if stage == _TO_RANK:
                view.outbox.append((dst_side, data))
                continue
            rank = view.ends[dst_side]
            for arrival, payload in self.ports[level][rank].down.transmit(data, t, self.rng):
                self._push(arrival, _TO_RANK, view, dst_side, level, payload)
        self.now = max(self.now, now)

    def port_stats(self, rank: int) -> dict:
        return {"rank": rank, **{level: {"up": vars(ports[rank].up.stats), "down": vars(ports[rank].down.stats)}
                                 for level, ports in self.ports.items()}}


def uniform(rate_bps: float, **impairments: float) -> FabricSpec:
    """A fabric of one switch whose ports all run at ``rate_bps`` (full bisection)."""
    return FabricSpec(replace(PathSpec(rate_bps=rate_bps), **impairments))
