"""Per-wake-up batching of the endpoints and the ACK rules it rests on: a burst on the socket read in
one wake-up, reads deferred while a held ACK waits (arrival times from the kernel), a message's last
packet acknowledged at once, and recovery under loss with the endpoints' coalescing settings. Pacing
in ACK-sized quanta is tested with the other pacing rules, in test_connection.py."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transport.core import wire
from transport.core.config import ACK_HOLD_MAX, ConfigError, TransportConfig, path_ack_delay
from transport.core.wire import AckPacket, decode
from transport.io.endpoint import Receiver, Sender, Workload, payload_seq
from transport.io.eventloop import read_stamped_batch
from transport.sim.simnet import PathSpec, run_transfer

from .conftest import make_pair

# What the UDP endpoints run with (cli/srd.py): an ACK per 4 packets, held at most 100 ms, at once
# for a message's last packet; a sender wake-up sends 4 packets' worth.
ENDPOINT = dict(ack_delay=0.1, ack_batch=4, ack_on_message=True, pacing_packets=4)


def _data(psn: int, cid: int = 5, count: int = 1, idx: int = 0, size: int = 100) -> bytes:
    """A valid DATA datagram: fragment `idx` of a `count`-fragment message `psn - idx`."""
    return wire.pack_data(0, psn % 16, cid, psn, psn - idx, idx, count, size * count, 0, bytes(size))


def _client(r: Receiver) -> socket.socket:
    c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    c.bind(("127.0.0.1", 0))
    c.connect(r.address)
    return c


def _wait_readable(r: Receiver) -> None:
    import select

    assert select.select([r.sock], [], [], 2.0)[0], "nothing arrived"
    time.sleep(0.05)  # let the rest of the burst land


# --------------------------------------------------------------------------------------------------
# Real sockets on 127.0.0.1


def test_a_burst_on_the_socket_is_read_in_one_wake_up() -> None:
    """N datagrams waiting on the receiver's socket are all read, and handled, before one turn."""
    n = 200
    r = Receiver(TransportConfig(), bind="127.0.0.1", port=0, duration=0.3)
    r.open()
    c = _client(r)
    try:
        for psn in range(n):
            c.send(_data(psn))
        _wait_readable(r)
        seen: list[int] = []
        turn = r._turn

        def counting_turn(now: float) -> float | None:
            seen.append(r.datagrams_received)
            return turn(now)

        r._turn = counting_turn  # type: ignore[method-assign]
        r._run_loop()
        # The first turn comes before any wake-up; the second is the first wake-up's, and by then
        # the whole burst has been read and delivered.
        assert seen[0] == 0 and seen[1] == n
        assert r.messages == n
        assert r.datagrams_received == n  # the read that found EAGAIN counted nothing
    finally:
        c.close()
        r.close()


def test_receiver_defers_reads_while_one_connection_holds_an_ack() -> None:
    r = Receiver(TransportConfig(ack_delay=0.05, ack_batch=4), bind="127.0.0.1", port=0)
    r.open()
    c = _client(r)
    try:
        c.send(_data(0, count=8, idx=0))
        _wait_readable(r)
        r._drain(r.sock.recvfrom, 1.0)
        assert r.peers and next(iter(r.peers.values())).conn.ack_room == 3
        # No gap measured yet: sleep through the arrivals until the ACK's deadline.
        assert r._turn(1.0) == pytest.approx(1.05) and r.defer_reads
        r.defer_reads = False
        # Packets 10 ms apart: wake when the 3 the batch still waits for should be in.
        r._gap = 0.01
        assert r._turn(1.001) == pytest.approx(1.031) and r.defer_reads
        r.defer_reads = False
        # Packets too close together to be worth a deferral: the loop watches the socket again.
        r._gap = 0.0001
        r._turn(1.002)
        assert not r.defer_reads
        # A second connection: its first packet must not wait behind the first one's hold.
        r._gap = 0.01
        c.send(_data(0, cid=6, count=8, idx=0))
        _wait_readable(r)
        r._drain(r.sock.recvfrom, 1.003)
        assert len(r.peers) == 2
        r._turn(1.003)
        assert not r.defer_reads
    finally:
        c.close()
        r.close()


def test_deferred_reads_answer_every_packet_with_one_ack() -> None:
    """The loop sleeps through a batch held for coalescing and its ACK still covers every packet."""
    # The six packets come 5 ms apart and the ACK is held 200 ms from the first's arrival: all six are in
    # its batch unless the feeder stalls for ~175 ms. The loop runs 0.6 s, so the ACK (at ~0.2 s) leaves
    # within it even when the first packet comes ~0.4 s late.
    r = Receiver(TransportConfig(ack_delay=0.2, ack_batch=16), bind="127.0.0.1", port=0, duration=0.6)
    r.open()
    c = _client(r)
    c.settimeout(2.0)
    try:
        import threading

        def feed() -> None:
            for psn in range(6):
                c.send(_data(psn, count=8, idx=psn))
                time.sleep(0.005)

        t = threading.Thread(target=feed)
        t.start()
        wakes: list[bool] = []
        turn = r._turn

        def recording_turn(now: float) -> float | None:
            wake = turn(now)
            wakes.append(r.defer_reads)
            return wake

        r._turn = recording_turn  # type: ignore[method-assign]
        r._run_loop()
        t.join()
        acks = [decode(c.recv(2048))]
        assert isinstance(acks[0], AckPacket)
        c.settimeout(0.05)
        with pytest.raises(TimeoutError):
            acks.append(decode(c.recv(2048)))
        assert acks[0].cum_psn == 6  # one ACK for all six packets
        assert acks[0].ack_psn == 0 and acks[0].ack_delay >= 190_000  # echoing the first, held ~200 ms
        assert any(wakes), "the loop deferred its reads"
        assert r.datagrams_received == 6
    finally:
        c.close()
        r.close()


def test_loopback_exactly_once_with_the_endpoints_coalescing() -> None:
    config = TransportConfig(**ENDPOINT)
    total, size = 2 << 20, 50_000
    messages: list[bytes] = []
    r = Receiver(config, bind="127.0.0.1", port=0, expect_bytes=total, verify=True, linger=0.2,
                 on_message=lambda _c, _m, d: messages.append(d))
    r.open()
    import threading

    rm: dict = {}
    t = threading.Thread(target=lambda: rm.update(r.run()), daemon=True)
    t.start()
    sender = Sender(config, "127.0.0.1", r.address[1], Workload(total_bytes=total, size=size),
                    bind="127.0.0.1", base_port=0, duration=30)
    sm = sender.run()
    t.join(10)
    assert sm["completed"] and sm["bytes"] == total
    n = -(-total // size)
    assert sorted(payload_seq(d) for d in messages) == list(range(n))
    assert rm["connections"][0]["duplicate_messages"] == 0 and rm["connections"][0]["corrupt_messages"] == 0
    data = sm["connection"]["sender"]["packets_sent"]
    assert sm["datagrams_received"] < data  # ACKs were coalesced


# --------------------------------------------------------------------------------------------------
# The core's rules the batching relies on


def test_a_messages_last_packet_is_acknowledged_at_once() -> None:
    cfg = TransportConfig(pacing=False, ack_delay=0.1, ack_batch=16, ack_on_message=True)
    p = make_pair(cfg)
    p.a.send_message(bytes(cfg.max_payload * 3))
    p.a.send_message(bytes(cfg.max_payload * 3))
    sent = p.drain("a")
    for d, _ in sent[:2]:
        p.b.receive_datagram(d, 0.001)
    assert p.drain("b") == [] and p.b.ack_room == 1  # held; the message's last packet will send it
    p.b.receive_datagram(sent[2][0], 0.002)
    acks = [decode(d) for d, _ in p.drain("b")]
    assert len(acks) == 1 and acks[0].cum_psn == 3 and acks[0].ack_delay == 1000
    p.b.receive_datagram(sent[3][0], 0.003)
    assert p.drain("b") == [] and p.b.ack_room == 2
    # Without the rule, the same packets wait for the batch or the deadline.
    q = make_pair(TransportConfig(pacing=False, ack_delay=0.1, ack_batch=16))
    q.a.send_message(bytes(cfg.max_payload * 3))
    for d, _ in q.drain("a"):
        q.b.receive_datagram(d, 0.001)
    assert q.drain("b") == [] and q.b.ack_room == 13


def test_ack_room_is_zero_without_a_held_ack() -> None:
    p = make_pair(TransportConfig(pacing=False))  # an ACK per packet: never held
    p.a.send_message(bytes(3000))
    for d, _ in p.drain("a"):
        p.b.receive_datagram(d, 0.001)
        assert p.b.ack_room == 0


def test_pacing_packets_is_validated() -> None:
    with pytest.raises(ConfigError, match="pacing_packets"):
        TransportConfig(pacing_packets=0).validate()


@pytest.mark.parametrize("mtu", [1472, 8972])
def test_endpoint_coalescing_recovers_losses_by_fast_retransmit(mtu: int) -> None:
    """The demo's conditions in the simulator: 4 Mb/s sprayed over 8 paths, 5 % loss on one (ACKs
    lost too). With the endpoints' coalescing, every message arrives once, losses are found by the
    ACKs (RACK) rather than timeouts, retransmissions stay close to the drops, and goodput stays
    close to the same transfer with an ACK per packet."""

    def paths() -> list[PathSpec]:
        out = [PathSpec(rate_bps=0.5e6, delay=0.0005, queue_packets=1000) for _ in range(8)]
        out[0] = PathSpec(rate_bps=0.5e6, delay=0.0005, queue_packets=1000, loss=0.05)
        return out

    total = 2 << 20
    coalesced = TransportConfig(mtu=mtu, **ENDPOINT)
    r = run_transfer(coalesced, coalesced, paths(), total_bytes=total, seed=3, time_limit=120.0)
    assert r.completed
    ids = [m for m, _ in r.delivered]
    assert len(ids) == len(set(ids)) == -(-total // 65536)
    s = r.sender_metrics["sender"]
    dropped = sum(link["a_to_b"]["lost"] + link["b_to_a"]["lost"] for link in r.network)
    data_dropped = sum(link["a_to_b"]["lost"] for link in r.network)
    assert data_dropped > 0
    # Beyond the drops, a few more: jumbo frames here take 144 ms on a path, and slow start's first
    # timeouts resend packets that were only queued (up to 7 more than twice the drops over 15 seeds,
    # since ACKs are spread over every path, the lossy one included).
    assert s["retransmissions"] <= 2 * dropped + 8
    assert s["timeouts"] <= max(2, data_dropped // 4)
    acks, data = r.receiver_metrics["receiver"]["acks_sent"], r.receiver_metrics["receiver"]["data_packets"]
    assert acks < data / 2  # coalesced
    per_packet = TransportConfig(mtu=mtu)
    base = run_transfer(per_packet, per_packet, paths(), total_bytes=total, seed=3, time_limit=120.0)
    assert base.completed
    assert r.goodput_bps >= 0.9 * base.goodput_bps


@contextmanager
def _stamped_receiver() -> Iterator[tuple[Receiver, socket.socket]]:
    """A receiver holding ACKs up to 50 ms or 4 packets, its socket stamping arrivals, and a client."""
    r = Receiver(TransportConfig(ack_delay=0.05, ack_batch=4, ack_on_message=True), bind="127.0.0.1", port=0)
    r.open()
    c = _client(r)
    try:
        if not r._stamped:
            pytest.skip("this kernel does not stamp datagrams (SO_TIMESTAMPNS)")
        # Linux turns receive stamping on from a work queue (net_enable_timestamp) when no socket had
        # it: a datagram that arrives before then is stamped when it is read. Wait until it is on: a
        # probe read 5 ms after it was sent, read from the socket directly (the receiver never sees it),
        # is stamped on arrival (5 ms before the read) rather than at the read (after it).
        give_up = time.monotonic() + 5.0
        while True:
            c.send(b"probe")
            time.sleep(0.005)
            reading = time.monotonic()
            _batch, times, _reads = read_stamped_batch(r.sock.recvmsg, 2048)
            if times and times[0] < reading - 0.001:
                break
            assert time.monotonic() < give_up, "the kernel did not start stamping arrivals"
        yield r, c
    finally:
        c.close()
        r.close()


def test_a_coalescing_receiver_hands_the_core_each_packets_arrival_time() -> None:
    """Read 80 ms late, a datagram still counts as arrived when the kernel stamped it: the held
    ACK's deadline runs from the arrival, not from the read."""
    with _stamped_receiver() as (r, c):
        sent_at = time.monotonic()
        c.send(_data(0, count=8, idx=0))  # over loopback it arrives, and is stamped, within the send
        sent_by = time.monotonic()
        time.sleep(0.08)
        read_at = time.monotonic()
        assert r._handlers[r.sock.fileno()](read_at) == 1
        peer = next(iter(r.peers.values()))
        assert sent_at - 0.001 <= peer.last <= sent_by + 0.02 < read_at
        assert peer.conn.get_timer() == pytest.approx(peer.last + 0.05)
        # A message streaming in with no ACK held: sleep until the next batch should be complete
        # (7 of its 8 packets still to come, an ACK per 4).
        r._turn(read_at)  # the held ACK is overdue: it leaves now
        assert peer.conn.ack_room == 0 and peer.conn.message_packets_left == 7
        r._gap, r._last_rx = 0.01, read_at
        assert r._turn(read_at) == pytest.approx(read_at + 0.04) and r.defer_reads
        r.defer_reads = False
        # Packets further apart than half the hold: until the next one (0.03 s away) has waited its
        # hold (0.05 s), when its ACK is due, rather than the hold from now, which ends before it.
        r._gap = 0.03
        assert r._turn(read_at) == pytest.approx(read_at + 0.08) and r.defer_reads
        r.defer_reads = False
        r._gap = 0.01
        # Once the message is complete, the next packet (a request, say) is read as it arrives.
        for psn in range(1, 8):
            c.send(_data(psn, count=8, idx=psn))
        _wait_readable(r)
        later = time.monotonic()
        r._handlers[r.sock.fileno()](later)
        r._turn(later)
        assert r.messages == 1 and peer.conn.message_packets_left == 0 and peer.conn.ack_room == 0
        r._gap, r._last_rx = 0.01, later
        r._turn(later)
        assert not r.defer_reads


def test_a_messages_last_packet_is_read_as_it_arrives() -> None:
    with _stamped_receiver() as (r, c):
        for psn in range(4):  # a batch of a 5-packet message: its ACK leaves at once
            c.send(_data(psn, count=5, idx=psn))
        _wait_readable(r)
        now = time.monotonic()
        while r._handlers[r.sock.fileno()](now):
            pass
        r._turn(now)
        peer = next(iter(r.peers.values()))
        assert peer.conn.ack_room == 0 and peer.conn.message_packets_left == 1
        r._gap, r._last_rx = 0.01, now
        r._turn(now)
        assert not r.defer_reads


def test_path_ack_delay_is_a_quarter_of_a_long_base_rtt() -> None:
    assert path_ack_delay(0.010, 0.0) == 0.010  # base RTT unknown: the endpoint's own hold
    assert path_ack_delay(0.010, 0.02) == 0.010  # a short path: the hold is already shorter
    assert path_ack_delay(0.010, 0.44) == pytest.approx(0.11)
    assert path_ack_delay(0.010, 40.0) == ACK_HOLD_MAX
    assert path_ack_delay(0.0, 0.44) == 0.0  # an ACK per packet stays so
    TransportConfig(ack_delay=path_ack_delay(0.010, 40.0)).validate()


@settings(max_examples=200, deadline=None)
@given(st.floats(0.0, 1.0), st.floats(0.0, 100.0))
def test_path_ack_delay_bounds(ack_delay: float, base_rtt: float) -> None:
    hold = path_ack_delay(ack_delay, base_rtt)
    if ack_delay == 0:
        assert hold == 0
    else:
        assert ack_delay <= hold <= max(ack_delay, ACK_HOLD_MAX)
        assert hold <= max(ack_delay, base_rtt / 4)


def test_a_hold_sized_to_a_slow_path_halves_its_acks_and_keeps_its_rate() -> None:
    """At 1 Mb/s in jumbo frames a DATA packet takes 72 ms, so a 10 ms hold answers every packet
    with its own ACK, each one a packet for the emulated switches. A quarter of the 0.43 s base RTT
    answers two or more, without a spurious retransmission or a slower transfer."""
    base_rtt = 0.43
    paths = [PathSpec(rate_bps=1e6, delay=0.18, queue_packets=1000)]

    def transfer(ack_delay: float) -> tuple[int, int, int, float]:
        config = TransportConfig(mtu=8972, link_rate_bps=1e6, base_rtt=base_rtt, ack_delay=ack_delay,
                                 ack_batch=8, ack_on_message=True)
        r = run_transfer(config, config, paths, total_bytes=1 << 20, seed=5, time_limit=60.0)
        assert r.completed
        rm = r.receiver_metrics["receiver"]
        return rm["acks_sent"], rm["data_packets"], r.sender_metrics["sender"]["retransmissions"], r.goodput_bps

    acks, data, retx, goodput = transfer(path_ack_delay(0.010, base_rtt))
    fixed_acks, fixed_data, fixed_retx, fixed_goodput = transfer(0.010)
    assert fixed_acks >= 0.9 * fixed_data  # the fixed hold: an ACK for (nearly) every packet
    assert acks <= 0.6 * data
    assert retx == fixed_retx == 0
    assert goodput >= 0.97 * fixed_goodput
