"""Sized flows over the simulated two-leaf fabric, for incast and permutations (`fabriclab bench cc`).

The fabric is `transport.sim.fabric`'s `TwoLeafSpec` shape (its rules are written there). Each flow
is a pair of Connections over the fabric's view of its two hosts, so ``simnet.drive`` runs them all;
the receiving sides on one host share one ``CreditScheduler`` when the controller is receiver-driven,
as the receiving endpoint does.

``run_flows`` runs a list of sized flows to completion and reports, per flow, its completion time,
and for the fabric its queue drops and the peak queue of every receiving host's downlink.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from transport.core.config import TransportConfig
from transport.core.connection import Connection, MessageAcked, MessageReceived
from transport.core.credit import CreditScheduler
from transport.sim.fabric import Fabric, PairView, TwoLeafSpec
from transport.sim.simnet import drive


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
    config: TransportConfig, spec: TwoLeafSpec, flows: list[tuple[int, int, int]], *, seed: int = 0,
    message_size: int = 65536, time_limit: float = 120.0,
) -> FlowsResult:
    """Run ``flows`` (source host, destination host, bytes), all starting at 0, until each is delivered
    and acknowledged or ``time_limit`` of virtual time passes."""
    fabric = Fabric(spec, spec.hosts)
    rng = random.Random(seed ^ 0xFAB)
    conns: list[Connection] = []
    nets: list[tuple[PairView, int, int]] = []
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
        nets.append((fabric.pair(src, dst), 2 * i, 2 * i + 1))

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
        peak_downlink_queue={dst: fabric.ports["fabric"][dst].down.stats.peak_queue for _, dst, _ in flows},
        duration=end,
        sender_metrics=senders,
    )
