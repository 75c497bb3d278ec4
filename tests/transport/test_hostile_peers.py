"""Hostile datagrams and forged ACKs against the sans-I/O core and the receiver: memory stays bounded
by what was received, one ACK cannot stall recovery, addresses come only from checked datagrams.

Memory is measured with tracemalloc around the attack; each bound is stated next to its test.
"""

from __future__ import annotations

import gc
import random
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from tests.transport.attacks.scenarios import feed as _feed
from tests.transport.attacks.scenarios import receiver as _receiver
from transport.core import wire
from transport.core.config import TransportConfig
from transport.core.connection import Connection, MessageReceived


def _held_bytes(attack: Callable[[], Any]) -> tuple[int, Any]:
    """Bytes still allocated after ``attack()`` ran (what the attacked state holds), and its result."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = attack()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before, result
    finally:
        tracemalloc.stop()


def _first_fragment(cid: int, psn: int, msg_id: int, count: int) -> bytes:
    """The 1-byte first fragment of a message claiming ``count`` 1-byte fragments: 43 bytes."""
    return wire.pack_data(0, 0, cid, psn, msg_id, 0, count, count, 0, b"x")


# --------------------------------------------------------------------------------------------------
# 1. Reassembly memory follows what arrived, not what a packet claims

# Bookkeeping per fragment held (its table entry, the message's record, the out-of-order index),
# on top of the payload itself: a few hundred bytes measured, stated with room to spare.
PER_FRAGMENT_BOUND = 1024


def test_first_fragments_of_huge_messages_hold_only_what_arrived() -> None:
    """1,024 first fragments (44 kB on the wire), each claiming the largest message the window
    allows: the receiver once held a table of 6,000+ slots per message (51 MB)."""
    conn = Connection(TransportConfig(), 1)
    count = conn._rx.window_psns
    datagrams = [_first_fragment(1, i + 1, i + 1, count) for i in range(1024)]

    def attack() -> None:
        for d in datagrams:
            conn.receive_datagram(d, 0.0)

    held, _ = _held_bytes(attack)
    accepted = conn.stats.reassembly_bytes  # one 1-byte payload per accepted fragment
    assert accepted == conn.config.max_reassembly_messages - 1  # message 1024 is beyond the message cap
    assert held <= accepted * PER_FRAGMENT_BOUND, f"{held} bytes held for {accepted} fragments"


@pytest.mark.parametrize("fragments", [41, 400])  # a preallocated table, and a sparse one
def test_fragments_in_any_order_reassemble_exactly(fragments: int) -> None:
    config = TransportConfig(window=512)
    a, b = Connection(config, 3, seed=1), Connection(config, 3, seed=2)
    message = random.Random(5).randbytes((fragments - 1) * config.max_payload + 17)
    a.send_message(message, 0.0)
    out = [d for d, _ in a.datagrams_to_send(0.0)]
    assert len(out) == fragments  # the whole message fits the initial window
    random.Random(6).shuffle(out)
    for d in out:
        b.receive_datagram(d, 0.0)
    events = list(iter(b.next_event, None))
    assert [e.data for e in events if isinstance(e, MessageReceived)] == [message]


# --------------------------------------------------------------------------------------------------
# 3. A forged ACK delay is believed only as far as it is plausible


def _forged_ack(conn_id: int, psn: int, echo_ts: int, delay_us: int = 0xFFFFFFFF) -> bytes:
    """An ACK of ``psn`` (nothing cumulative, no SACK) claiming to have been held ``delay_us``."""
    return wire.pack_ack(0, 0, conn_id, 0, 0, 0, psn, echo_ts, delay_us, 64)


def test_forged_ack_delay_is_clamped_to_max_ack_delay() -> None:
    """On a 100 ms path the forged hold is below the round trip, so only the configured maximum
    stops it: the next loss or RTO deadline stays within rto_max + max_ack_delay (it was 4,295 s)."""
    config = TransportConfig()
    a = Connection(config, 7, seed=1)
    a.send_message(bytes(50_000), 0.0)
    first = wire.decode(a.datagrams_to_send(0.0)[0][0])
    now = 0.1
    a.receive_datagram(_forged_ack(7, first.psn, first.timestamp), now)
    timer = a.get_timer()
    assert timer is not None
    assert timer - now <= config.rto_max + config.max_ack_delay


def test_forged_ack_does_not_stall_a_lossy_transfer() -> None:
    """One forged ACK early in a transfer with 2 % loss: it finishes as fast as without it."""
    from transport.sim.simnet import PathSpec, SimNetwork, drive

    def transfer(forge: bool) -> tuple[float, int, int]:
        config = TransportConfig()
        net = SimNetwork([PathSpec(loss=0.02) for _ in range(4)], seed=3)
        a, b = Connection(config, 9, seed=1), Connection(config, 9, seed=2)
        messages = [bytes(65536)] * 16
        for m in messages:
            a.send_message(m, 0.0)
        delivered: list[int] = []
        forged = [not forge]

        def on_event(side: int, event: object, now: float) -> None:
            if side == 1 and isinstance(event, MessageReceived):
                delivered.append(event.msg_id)

        def check(now: float) -> None:
            if not forged[0] and now > 0:
                forged[0] = True  # PSN 0 left at t = 0: its wire timestamp is 0
                a.receive_datagram(_forged_ack(9, 0, 0), now)

        end = drive((a, b), [(net, 0, 1)], done=lambda: len(delivered) == len(messages) and a.idle,
                    time_limit=20.0, on_event=on_event, check=check)
        return end, len(delivered), a.stats.retransmissions

    clean, n_clean, retx = transfer(False)
    attacked, n_attacked, _ = transfer(True)
    assert n_clean == n_attacked == 16
    assert retx > 0  # the loss recovery the forged delay would stall was needed
    assert attacked <= 1.5 * clean, f"{attacked:.3f} s with one forged ACK, {clean:.3f} s without"


# --------------------------------------------------------------------------------------------------
# 4. Addresses come only from datagrams that parsed and passed the CRC


def test_receive_datagram_says_whether_the_datagram_was_genuine() -> None:
    conn = Connection(TransportConfig(), 5)
    good = wire.pack_data(0, 3, 5, 0, 0, 0, 2, 2000, 0, bytes(1000))
    corrupt = bytearray(good)
    corrupt[-1] ^= 1
    other = wire.pack_data(0, 3, 6, 0, 0, 0, 2, 2000, 0, bytes(1000))
    assert conn.receive_datagram(good, 0.0) is True
    assert conn.receive_datagram(good, 0.0) is True  # a duplicate is genuine, if useless
    assert conn.receive_datagram(bytes(corrupt), 0.0) is False
    assert conn.receive_datagram(other, 0.0) is False
    assert conn.receive_datagram(b"\xfa\xb1", 0.0) is False


def test_a_corrupt_datagram_from_a_forged_source_does_not_redirect_acks() -> None:
    r = _receiver()
    try:
        good = wire.pack_data(0, 3, 5, 0, 0, 0, 2, 2000, 0, bytes(1000))
        forged = bytearray(wire.pack_data(0, 3, 5, 1, 0, 1, 2, 2000, 0, bytes(1000)))
        forged[-1] ^= 1  # fails the CRC
        _feed(r, [(good, ("10.0.0.1", 4003))], 0.0)
        _feed(r, [(bytes(forged), ("10.0.0.1", 6666))], 0.001)
        peer = next(iter(r.peers.values()))
        assert peer.addr == ("10.0.0.1", 4003)
        assert peer.evaddr == {3: ("10.0.0.1", 4003)}
        assert r.sock.sent and {addr for _, addr in r.sock.sent} == {("10.0.0.1", 4003)}  # type: ignore[union-attr]
    finally:
        r.close()


# --------------------------------------------------------------------------------------------------
# 2. The receiver's connections: capped, expired when idle, timers in a heap

# A connection as the receiver holds it (its Connection, peer record, heap entries): ~12 kB
# measured, stated with room to spare.
PER_CONNECTION_BOUND = 20_000


def _one_byte_message(cid: int) -> bytes:
    """A whole 1-byte message: the smallest DATA that opens a connection (43 bytes)."""
    return wire.pack_data(0, 0, cid, 0, 0, 0, 1, 1, 0, b"x")


def test_one_source_opens_at_most_max_connections_per_source() -> None:
    """20,000 datagrams of 43 bytes, each a new connection id: they once made 20,000 connections
    (+256 MB); now one source gets max_connections_per_source and the rest are refused."""
    r = _receiver()
    try:
        cap = r.config.max_connections_per_source
        datagrams = [(_one_byte_message(cid), ("10.0.0.9", 4000)) for cid in range(1, 20_001)]
        held, _ = _held_bytes(lambda: _feed(r, datagrams, 0.0))
        assert len(r.peers) == cap
        assert r.connections_refused == 20_000 - cap
        assert held <= cap * PER_CONNECTION_BOUND, f"{held} bytes for {cap} connections"
        assert r.metrics()["connections_refused"] == 20_000 - cap
    finally:
        r.close()


def test_many_sources_open_at_most_max_connections() -> None:
    r = _receiver(TransportConfig(max_connections=64))
    try:
        datagrams = [(_one_byte_message(1), (f"10.{i >> 8}.{i & 255}.1", 4000)) for i in range(5000)]
        held, _ = _held_bytes(lambda: _feed(r, datagrams, 0.0))
        assert len(r.peers) == 64
        assert r.connections_refused == 5000 - 64
        assert held <= 64 * PER_CONNECTION_BOUND
    finally:
        r.close()


def test_an_idle_loop_turn_touches_no_connection(monkeypatch: Any) -> None:
    """With 1,000 connections that have nothing due, a loop turn asks none of them for its timer
    (it once walked all of them twice: 53 ms per turn at 20,000)."""
    r = _receiver(TransportConfig(max_connections_per_source=1000))
    try:
        _feed(r, [(_one_byte_message(cid), ("10.0.0.9", 4000)) for cid in range(1, 1001)], 0.0)
        assert len(r.peers) == 1000
        calls = []
        real = Connection.get_timer
        monkeypatch.setattr(Connection, "get_timer", lambda self: calls.append(self) or real(self))
        r._turn(1.0)
        assert calls == []
    finally:
        r.close()


def test_timers_in_the_heap_still_fire() -> None:
    """A coalesced ACK is held, and sent when its deadline comes."""
    r = _receiver(TransportConfig(ack_delay=0.01))
    try:
        _feed(r, [(wire.pack_data(0, 2, 5, 0, 0, 0, 1, 100, 0, bytes(100)), ("10.0.0.1", 4002))], 0.0)
        assert r.sock.sent == []  # type: ignore[union-attr]
        assert r._turn(0.005) == 0.01
        assert r.sock.sent == []  # type: ignore[union-attr]
        r._turn(0.01)
        assert [addr for _, addr in r.sock.sent] == [("10.0.0.1", 4002)]  # type: ignore[union-attr]
        assert wire.decode(r.sock.sent[0][0]).ack_delay == 10_000  # type: ignore[union-attr]
    finally:
        r.close()


def test_idle_connections_are_forgotten_sooner_while_unproven() -> None:
    """A connection that delivered a message is forgotten after idle_timeout of silence; one that
    only holds a fragment (it proved nothing) after UNPROVEN_RTOS x rto_max: it was once kept for good."""
    from transport.core.schema import ReceiverMetrics, problems
    from transport.io.receiver import UNPROVEN_RTOS

    config = TransportConfig(idle_timeout=30.0, max_connections_per_source=2)
    unproven = UNPROVEN_RTOS * config.rto_max
    r = _receiver(config)
    try:
        src = ("10.0.0.9", 4000)
        partial = wire.pack_data(0, 0, 2, 0, 0, 0, 2, 2, 0, b"x")  # half of a 2-byte message
        _feed(r, [(_one_byte_message(1), src), (partial, src)], 0.0)
        assert len(r.peers) == 2
        _feed(r, [(_one_byte_message(3), src)], 1.0)
        assert r.connections_refused == 1  # the source is at its cap
        assert r._turn(unproven - 1) == unproven  # the loop wakes for the expiry
        r._turn(unproven)
        # Connection 2 holds a fragment of a message it has not delivered: forgotten first.
        assert [p.connection_id for p in r.peers.values()] == [1]
        _feed(r, [(_one_byte_message(3), src)], unproven + 1)  # room again for this source
        assert r._turn(29.0) == 30.0
        r._turn(30.0)
        # Connection 1 delivered its message and sent its ACK: forgotten after idle_timeout.
        assert [p.connection_id for p in r.peers.values()] == [3]
        assert r.connections_expired == 2
        metrics = r.metrics()
        assert sorted(c["connection_id"] for c in metrics["connections"]) == [1, 2, 3]
        assert metrics["connections_expired"] == 2
        assert problems(metrics, ReceiverMetrics) == []
    finally:
        r.close()
