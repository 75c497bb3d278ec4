"""Fuzzing: random, mutated and re-sealed datagrams never raise out of the connection, are counted
as dropped, and leave its state intact (a real transfer afterwards is still exact)."""

from __future__ import annotations

import random
import struct
import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from transport.core.config import TransportConfig
from transport.core.connection import Connection
from transport.core.wire import (
    ACK_FIELDS,
    CTRL_FIELDS,
    CTRL_TYPES,
    DATA_FIELDS,
    MAGIC,
    VERSION,
    AckPacket,
    DataPacket,
    decode,
    encode,
)
from transport.sim.simnet import PathSpec, SimNetwork, drive

from .conftest import make_pair


def _sample_datagrams() -> list[bytes]:
    """Real DATA, ACK, CREDIT and REQUEST datagrams of small exchanges, as mutation seeds."""
    out = []
    for cc in ("delay", "credit"):
        # Under credit the unscheduled window is 2 packets and the message needs 5: a REQUEST goes out,
        # and the receiver's credit rides in its ACKs and in CREDIT packets.
        p = make_pair(TransportConfig(mtu=300, pacing=False, cc=cc, link_rate_bps=1e6, base_rtt=0.001))
        p.a.send_message(bytes(range(256)) * 4)
        data = p.drain("a")
        p.deliver("a", data)
        p.now += 0.01
        p.fire_timers()
        acks = p.drain("b")
        out += [d for d, _ in data + acks]
    return out


SEEDS = _sample_datagrams()


def _reseal(raw: bytes) -> bytes:
    """Recompute the CRC so that a mutated header reaches the connection's own checks."""
    if len(raw) < 4:
        return raw
    is_ack = raw[3] == 2 or raw[3] in CTRL_TYPES
    table = ACK_FIELDS if raw[3] == 2 else CTRL_FIELDS if raw[3] in CTRL_TYPES else DATA_FIELDS
    hlen = struct.calcsize("!" + "".join(c for _, c, _ in table))
    if len(raw) < hlen:
        return raw
    head = raw[: hlen - 4]
    crc = zlib.crc32(raw[hlen:], zlib.crc32(head)) if not is_ack else zlib.crc32(head)
    return head + crc.to_bytes(4, "big") + raw[hlen:]


@st.composite
def hostile_datagrams(draw) -> bytes:
    kind = draw(st.sampled_from(["random", "flip", "truncate", "extend", "reseal"]))
    if kind == "random":
        return draw(st.binary(max_size=400))
    raw = bytearray(draw(st.sampled_from(SEEDS)))
    if kind == "flip":
        for _ in range(draw(st.integers(1, 8))):
            bit = draw(st.integers(0, len(raw) * 8 - 1))
            raw[bit // 8] ^= 1 << (bit % 8)
        return bytes(raw)
    if kind == "truncate":
        return bytes(raw[: draw(st.integers(0, len(raw) - 1))])
    if kind == "extend":
        return bytes(raw) + draw(st.binary(min_size=1, max_size=20))
    # Valid CRC, garbage in the header fields after the magic/version/type prefix.
    for _ in range(draw(st.integers(1, 6))):
        i = draw(st.integers(4, min(len(raw), 42) - 5))
        raw[i] = draw(st.integers(0, 255))
    return _reseal(bytes(raw))


def _feed(conn: Connection, datagrams: list[bytes]) -> dict:
    """With a message outstanding, hand `conn` each datagram 1 ms apart, firing its timers; its metrics."""
    conn.send_message(b"outstanding" * 50)
    conn.datagrams_to_send(0.0)
    for i, d in enumerate(datagrams):
        conn.receive_datagram(d, 0.001 * i)
        conn.datagrams_to_send(0.001 * i)
        t = conn.get_timer()
        if t is not None:
            conn.handle_timer(t)
    return conn.metrics()


@settings(max_examples=300, deadline=None)
@given(st.lists(hostile_datagrams(), min_size=1, max_size=30))
def test_hostile_datagrams_never_raise(datagrams: list[bytes]) -> None:
    m = _feed(Connection(TransportConfig(mtu=300), 7, seed=3), datagrams)
    assert m["receiver"]["dropped"].get("internal_error", 0) == 0
    # Everything that was not accepted as data or as an ACK is counted as dropped or duplicate.
    handled = (m["receiver"]["dropped_total"] + m["receiver"]["data_packets"] + m["receiver"]["duplicates"]
               + m["sender"]["acks_received"])
    assert handled == len(datagrams)


@settings(max_examples=150, deadline=None)
@given(st.lists(hostile_datagrams(), min_size=1, max_size=30))
def test_hostile_datagrams_never_raise_under_credit(datagrams: list[bytes]) -> None:
    # A receiver-driven connection also parses CREDIT and REQUEST and keeps credit state on both sides.
    m = _feed(Connection(TransportConfig(mtu=300, cc="credit", link_rate_bps=1e6, base_rtt=0.001), 7, seed=3),
              datagrams)
    assert m["receiver"]["dropped"].get("internal_error", 0) == 0
    credit = m["state"]["cc"]["credit"]
    assert credit["scheduler"]["outstanding"] >= 0 and credit["used"] <= max(credit["granted"], credit["demand"])


def _garbage(rng: random.Random, conn_id: int) -> bytes:
    """Structurally invalid, foreign or out-of-range datagrams that must not be accepted."""
    kind = rng.randrange(9)
    if kind == 0:
        return rng.randbytes(rng.randrange(0, 200))
    if kind == 1:  # another connection
        return encode(DataPacket(conn_id + 1, 0, 0, 0, 1, 4, 0, 0, b"evil"))
    if kind == 2:  # PSN far beyond the receive window
        return encode(DataPacket(conn_id, 2**31 - 5, 0, 0, 1, 4, 0, 0, b"evil"))
    if kind == 3:  # fragment sizes that cannot add up to the message length
        return encode(DataPacket(conn_id, rng.randrange(2**32), rng.randrange(2**32), 0, 3, 20, 0, 0, b"evil"))
    if kind == 4:  # ACK for PSNs never sent
        return encode(AckPacket(conn_id, 2**30, 2**30, 1, 2**30, 0, 0, 64))
    if kind == 5:  # SACK bits for PSNs never sent
        return encode(AckPacket(conn_id, 0, 10**6, 2**63, 0, 0, 0, 64))
    if kind == 6:  # bad magic with a valid CRC
        raw = bytearray(encode(DataPacket(conn_id, 0, 0, 0, 1, 1, 0, 0, b"x")))
        raw[0:2] = (MAGIC ^ 1).to_bytes(2, "big")
        return _reseal(bytes(raw))
    if kind == 7:  # a future version
        raw = bytearray(encode(AckPacket(conn_id, 0, 0, 0, 0, 0, 0, 0)))
        raw[2] = VERSION + 1
        return _reseal(bytes(raw))
    # oversized payload for the receiver's MTU
    return encode(DataPacket(conn_id, 0, 0, 0, 1, 5000, 0, 0, bytes(5000)))


def test_garbage_mixed_into_a_transfer_leaves_it_exact() -> None:
    cfg = TransportConfig(mtu=600)
    net = SimNetwork([PathSpec(loss=0.05), PathSpec(reorder=0.3)], seed=9)
    a, b = Connection(cfg, 5, seed=1), Connection(cfg, 5, seed=2)
    msgs = [bytes([i]) * (1000 + 97 * i) for i in range(25)]
    for m in msgs:
        a.send_message(m)
    rng = random.Random(11)
    got: list[tuple[int, bytes]] = []
    injected = [0]

    def inject(now: float) -> None:
        if injected[0] < 2000:
            for conn in (a, b):
                conn.receive_datagram(_garbage(rng, 5), now)
                injected[0] += 1

    def on_event(side: int, ev: object, now: float) -> None:
        if side == 1:
            got.append((ev.msg_id, ev.data))  # type: ignore[attr-defined]

    drive((a, b), [(net, 0, 1)], done=lambda: len(got) == len(msgs) and a.idle and b.idle, time_limit=30,
          on_event=on_event, check=inject)
    assert sorted(got) == list(enumerate(msgs))
    # Every piece of garbage is counted as dropped, or as a duplicate when its PSN is an old one.
    rejected = sum(c.metrics()["receiver"]["dropped_total"] + c.metrics()["receiver"]["duplicates"] for c in (a, b))
    assert rejected >= injected[0]
    assert a.metrics()["receiver"]["dropped"].get("internal_error", 0) == 0


def test_mutated_copies_of_real_traffic_do_not_disturb_it() -> None:
    """A network that delivers every datagram plus a bit-flipped or truncated copy of it."""
    cfg = TransportConfig()
    a, b = Connection(cfg, 3, seed=1), Connection(cfg, 3, seed=2)
    rng = random.Random(5)
    msgs = [rng.randbytes(rng.randrange(1, 20_000)) for _ in range(20)]
    for m in msgs:
        a.send_message(m)
    got = []
    now = 0.0
    for _ in range(10_000):
        if a.idle and b.idle:
            break
        now += 0.0005
        for src, dst in ((a, b), (b, a)):
            for data, _ev in src.datagrams_to_send(now):
                bad = bytearray(data)
                if rng.random() < 0.5:
                    bad[rng.randrange(len(bad))] ^= 1 << rng.randrange(8)
                else:
                    bad = bad[: rng.randrange(len(bad))]
                dst.receive_datagram(bytes(bad), now)
                dst.receive_datagram(data, now)
        for c in (a, b):
            t = c.get_timer()
            if t is not None and t <= now:
                c.handle_timer(now)
        while (ev := b.next_event()) is not None:
            got.append(ev.data)
    assert sorted(got) == sorted(msgs)
    assert b.metrics()["receiver"]["dropped"]["malformed"] > 0


def test_resealed_seed_datagrams_still_decode() -> None:
    for raw in SEEDS:
        assert decode(_reseal(raw)) == decode(raw)
