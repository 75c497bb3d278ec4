"""Which paths ACKs take back: coalesced ACKs spread over the EVs the data uses, so that a path cut
in both directions cannot take every ACK of a connection with it."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

import pytest

from tests.transport.conftest import make_pair
from transport.core.config import TransportConfig
from transport.core.connection import Connection
from transport.sim.fabric import Fabric, TwoLeafSpec
from transport.sim.simnet import PathSpec, drive

COALESCING = dict(ack_delay=0.010, ack_batch=8, ack_on_message=True)


def _ack_evs(policy: str, rounds: int = 40) -> tuple[set[int], set[int]]:
    """The EVs DATA took and the EVs the coalescing receiver's ACKs took, over a long transfer."""
    pair = make_pair(TransportConfig(path_policy=policy, num_evs=16, window=16, max_window=16, **COALESCING))
    pair.a.send_message(random.Random(1).randbytes(pair.a.config.max_payload * 8 * rounds), now=0.0)
    data_evs: set[int] = set()
    ack_evs: set[int] = set()
    for _ in range(rounds):
        sent = pair.drain("a")
        data_evs.update(ev for _, ev in sent)
        pair.now += 0.0005
        pair.deliver("a", sent)
        pair.now += 0.011  # past the ACK hold: whatever is held goes
        pair.fire_timers()
        back = pair.drain("b")
        ack_evs.update(ev for _, ev in back)
        pair.now += 0.0005
        pair.deliver("b", back)
    return data_evs, ack_evs


def test_coalesced_acks_of_a_sprayed_flow_take_every_ev_back() -> None:
    # Batches of 8 over 16 round-robin EVs: ACKs on the EV they echo (a batch's first packet) took
    # one parity of EVs only, and with it one half of a two-spine fabric.
    data_evs, ack_evs = _ack_evs("spray")
    assert data_evs == set(range(16))
    assert ack_evs == set(range(16))


def test_coalesced_acks_of_a_single_path_flow_keep_its_ev() -> None:
    data_evs, ack_evs = _ack_evs("single")
    assert len(data_evs) == 1
    assert ack_evs == data_evs


@dataclass
class _TwoSpines(TwoLeafSpec):
    """The failover experiment's shape: uplinks at twice the hosts' rate."""

    fabric_rate_bps: float = 12e6

    def spine_link(self) -> PathSpec:
        return PathSpec(rate_bps=self.fabric_rate_bps, delay=self.hop_delay, queue_packets=self.queue_packets)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_link_cut_both_ways_leaves_every_adaptive_flow_delivering(seed: int) -> None:
    """Two leaves, two spines, a flow each way between every pair of hosts across them; at 3 s the
    link between leaf 0 and spine 1 goes down in both directions. Every flow steers its data around
    it and gets its ACKs back: from a quarter second after the cut each delivers at least 80 % of its
    rate before. (With ACKs on one parity of EVs, seed 2's flow from host 2 to 3 sent every ACK
    over the cut link and delivered 6 %.)"""
    spec = _TwoSpines(hosts=4, spines=2, rate_bps=6e6, hop_delay=0.00005, queue_packets=100)
    fabric = Fabric(spec, 4, seed=seed)
    config = spec.config(TransportConfig(path_policy="adaptive", **COALESCING))
    flows = [(0, 1), (2, 3), (1, 0), (3, 2)]  # hosts 0 and 2 on leaf 0, 1 and 3 on leaf 1
    conns: list[Connection] = []
    nets = []
    for i, (src, dst) in enumerate(flows):
        conns += [Connection(config, 100 + i, seed=seed * 1000 + 2 * i),
                  Connection(config, 100 + i, seed=seed * 1000 + 2 * i + 1)]
        nets.append((fabric.pair(src, dst), 2 * i, 2 * i + 1))
    payload = random.Random(seed).randbytes(65536)
    cut_at, end = 3.0, 3.5
    cut = [False]

    def check(now: float) -> None:
        for tx in conns[::2]:  # closed loop: eight messages outstanding per flow
            while tx.stats.messages_sent - tx.stats.messages_acked < 8:
                tx.send_message(payload, now=now)
        if not cut[0] and now >= cut_at:
            cut[0] = True
            for row in (fabric.to_spine, fabric.from_spine):
                row[0][1].spec = replace(row[0][1].spec, down=[(now, math.inf)])

    check(0.0)
    drive(conns, nets, done=lambda: False, time_limit=end, check=check)  # type: ignore[arg-type]
    kept = {}
    for i, rx in enumerate(conns[1::2]):
        series = rx.stats.arrivals.summary()
        width, start, bps = series["bin"], series["start"], series["bps"]

        def rate(t0: float, t1: float, width: float = width, start: float = start, bps: list = bps) -> float:
            bins = bps[int((t0 - start) / width): int((t1 - start) / width)]
            return sum(bins) / len(bins)

        kept[flows[i]] = round(rate(cut_at + 0.25, end) / rate(cut_at - 0.5, cut_at), 2)
    assert min(kept.values()) >= 0.8, f"goodput after the cut / before, per flow: {kept}"
