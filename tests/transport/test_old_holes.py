"""What a lost packet changes at either end before it is declared lost: the receiver acknowledges
every arrival once a hole has grown old, and a steering sender stops counting overdue packets
against its window."""

from __future__ import annotations

import random

from tests.transport.conftest import make_pair
from transport.core.config import TransportConfig

HOLD = dict(ack_delay=0.010, ack_batch=8, ack_on_message=False)


GAP = 0.003  # between arrivals


def _acks_per_arrival(straggler_at: float) -> tuple[list[tuple[float, int]], int]:
    """Packet 1 of a 24-packet message is held back and arrives ``straggler_at`` seconds after the
    hole it leaves opens (when packet 2 arrives); the others arrive GAP apart. Per arrival, its time
    since the hole opened and the ACKs the receiver sends right after it; and the receiver's count of
    quick ACKs."""
    config = TransportConfig(num_evs=16, cc="fixed", window=32, max_window=32, pacing=False, **HOLD)
    pair = make_pair(config)
    pair.a.send_message(random.Random(1).randbytes(config.max_payload * 24), now=0.0)
    sent = pair.drain("a")
    assert len(sent) == 24
    t0 = 0.001
    opened = t0 + GAP
    arrivals = [(t0 + GAP * i, k) for i, k in enumerate([0, *range(2, 24)])]
    arrivals = sorted([*arrivals, (opened + straggler_at + GAP / 2, 1)])
    per_arrival = []
    for t, k in arrivals:
        pair.now = t
        pair.b.receive_datagram(sent[k][0], t)
        per_arrival.append((round(t - opened, 4), len(pair.drain("b"))))
    return per_arrival, pair.b.stats.quick_acks


def test_an_old_hole_gets_every_arrival_acknowledged_at_once() -> None:
    # A hole older than the ACK hold (10 ms) is a lost packet, not sprayed reordering: each arrival
    # is acknowledged as it comes, so that the sender's window, full while the loss is repaired, moves
    # packet by packet rather than per batch of 8.
    per_arrival, quick = _acks_per_arrival(straggler_at=0.040)
    young = [n for age, n in per_arrival if age < 0.010]
    old = [n for age, n in per_arrival if 0.010 < age <= 0.0415]  # the straggler's arrival included
    after = [n for age, n in per_arrival if age > 0.0415]
    assert sum(young) <= 1, per_arrival  # held for the batch (the hold's own deadline may send one)
    assert old and all(n == 1 for n in old), per_arrival
    assert quick == len(old)
    # Once the straggler has filled the hole, ACKs are coalesced again.
    assert sum(after) <= 2, per_arrival


def test_a_young_hole_is_left_to_the_ack_hold() -> None:
    # The straggler arrives 4 ms late: reordering, and the ACKs stay coalesced.
    per_arrival, quick = _acks_per_arrival(straggler_at=0.004)
    assert quick == 0
    assert sum(n for _, n in per_arrival) <= 6, per_arrival


def test_overdue_packets_hold_no_window_for_a_steering_sender() -> None:
    """Sixteen packets fill the window, one per EV; packets 0, 1 and 3 are delivered, not 2, and their
    ACKs come back once packet 2 is overdue (past the RTT and its variation, long before its loss
    deadline, which allows for the 10 ms ACK hold). Packet 2 is likely on a dead path: the adaptive
    sender sends one packet more than the three acknowledged ones free, on other EVs. Spraying,
    which cannot steer, keeps counting it."""
    sent_after = {}
    for policy in ("adaptive", "spray"):
        config = TransportConfig(num_evs=16, cc="fixed", window=16, max_window=16, pacing=False,
                                 path_policy=policy, ack_delay=0.010, ack_batch=1)
        pair = make_pair(config)
        pair.a.send_message(random.Random(1).randbytes(config.max_payload * 64), now=0.0)
        # A first round trip, whole, for an RTT sample of 1 ms.
        first = pair.drain("a")
        assert len(first) == 16
        pair.now = 0.0005
        pair.deliver("a", first)
        pair.now = 0.001
        pair.deliver("b", pair.drain("b"))
        window = pair.drain("a")
        assert len(window) == 16
        lost_ev = window[2][1]
        pair.now = 0.0015
        pair.deliver("a", [window[0], window[1], window[3]])
        acks = pair.drain("b")
        pair.now = 0.006  # packet 2 is 5 ms old: overdue, not yet lost
        pair.deliver("b", acks)
        more = pair.drain("a")
        sent_after[policy] = len(more)
        if policy == "adaptive":
            assert pair.a.stats.losses_detected == 0
            assert all(ev != lost_ev for _, ev in more)
    assert sent_after == {"adaptive": 4, "spray": 3}
