"""The sans-I/O connection driven by hand: delivery, acks, recovery modes, caps, timers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transport.core.config import ConfigError, TransportConfig
from transport.core.connection import Connection, MessageAcked
from transport.core.wire import AckPacket, DataPacket, decode, encode
from transport.sim.simnet import PathSpec, run_transfer

from .conftest import make_pair


def _msg(n: int, seed: int = 0) -> bytes:
    return bytes((i * 31 + seed) & 0xFF for i in range(n))


def test_message_roundtrip_and_ack_latency(pair) -> None:
    msg_id = pair.a.send_message(b"hello fabric", now=0.0)
    assert msg_id == 0
    pair.roundtrip("a", rtt=0.002)
    assert [(e.msg_id, e.data) for e in pair.received["b"]] == [(0, b"hello fabric")]
    assert len(pair.acked["a"]) == 1
    assert pair.acked["a"][0].latency == pytest.approx(0.002)
    assert pair.acked["a"][0].completion_time == pair.acked["a"][0].latency
    assert pair.a.idle and pair.b.idle


def test_fragments_to_the_mtu() -> None:
    cfg = TransportConfig(mtu=200, pacing=False)
    p = make_pair(cfg)
    size = cfg.max_payload * 10 + 3
    p.a.send_message(_msg(size))
    sent = p.drain("a")
    assert len(sent) == 11
    assert all(len(d) <= 200 for d, _ in sent)
    assert all(0 <= ev < cfg.num_evs for _, ev in sent)
    p.now += 0.001
    p.deliver("a", sent)
    assert p.received["b"][0].data == _msg(size)


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 200_000), mtu=st.integers(300, 9000))
def test_a_message_is_cut_into_equal_fragments(size: int, mtu: int) -> None:
    cfg = TransportConfig(mtu=mtu, pacing=False, window=1024, max_window=1024)
    p = make_pair(cfg)
    p.a.send_message(_msg(size))
    sent = p.drain("a")
    frags = [decode(d).payload for d, _ in sent]
    # As few as the MTU allows, sharing the bytes equally: all but the last of one size, the last
    # short of it by less than one byte per fragment (what the division leaves), never empty.
    assert len(frags) == -(-size // cfg.max_payload)
    first = len(frags[0])
    assert first <= cfg.max_payload
    assert all(len(f) == first for f in frags[:-1]) and 0 < len(frags[-1]) <= first
    assert first - len(frags[-1]) < len(frags)
    p.now += 0.001
    p.deliver("a", sent)
    assert p.received["b"][0].data == _msg(size)


def test_a_sprayed_flow_puts_equal_bytes_on_every_path() -> None:
    # 64 KiB messages in 8972-byte datagrams are 8 packets each; sprayed round robin over 16 EVs onto
    # 4 paths (EV % 4), full fragments and a short remainder put the remainder on one path every time.
    cfg = TransportConfig(mtu=8972, pacing=False, window=1024, max_window=1024)
    p = make_pair(cfg)
    for _ in range(32):
        p.a.send_message(_msg(65536))
    per_path = [0] * 4
    for d, ev in p.drain("a"):
        per_path[ev % 4] += len(decode(d).payload)
    assert max(per_path) == min(per_path) == 32 * 65536 // 4


def test_empty_message(pair) -> None:
    pair.a.send_message(b"")
    pair.run()
    assert [e.data for e in pair.received["b"]] == [b""]


def test_bidirectional_request_response(pair) -> None:
    pair.a.send_message(b"request")
    pair.roundtrip("a")
    assert pair.received["b"][0].data == b"request"
    pair.b.send_message(b"response")
    pair.roundtrip("b")
    assert pair.received["a"][0].data == b"response"
    assert len(pair.acked["a"]) == len(pair.acked["b"]) == 1


def test_one_ack_per_packet_by_default() -> None:
    p = make_pair(TransportConfig(pacing=False))
    p.a.send_message(_msg(10_000))
    sent = p.drain("a")
    p.now += 0.001
    p.deliver("a", sent)
    acks = p.drain("b")
    assert len(acks) == len(sent) == 8
    assert all(isinstance(decode(d), AckPacket) for d, _ in acks)
    # Each ACK travels back on the EV of the packet that triggered it.
    assert [ev for _, ev in acks] == [ev for _, ev in sent]


def test_ack_coalescing_within_ack_delay() -> None:
    cfg = TransportConfig(pacing=False, ack_delay=0.001, ack_batch=100)
    p = make_pair(cfg)
    p.a.send_message(_msg(20_000))
    sent = p.drain("a")
    p.now += 0.0005
    p.deliver("a", sent)
    assert p.drain("b") == []  # held back
    assert p.b.get_timer() == pytest.approx(0.0015)
    assert not p.b.idle
    p.now = 0.0015
    p.b.handle_timer(p.now)
    acks = p.drain("b")
    assert len(acks) == 1
    ack = decode(acks[0][0])
    assert ack.cum_psn == len(sent) and ack.ack_delay == 1000
    p.deliver("b", acks)
    assert len(p.acked["a"]) == 1 and p.a.idle and p.b.idle


def test_no_ack_is_held_for_packets_arriving_further_apart_than_the_ack_delay() -> None:
    # Paced 20 ms apart against a 10 ms hold, no packet can join a held ACK: each is answered at
    # once (no timer, no hold reported). 1 ms apart, they are coalesced again.
    cfg = TransportConfig(pacing=False, ack_delay=0.01, ack_batch=4)
    p = make_pair(cfg)
    p.a.send_message(_msg(cfg.max_payload * 12))
    sent = p.drain("a")
    answered = []
    for d in sent[:6]:
        p.deliver("a", [d])
        answered.append(len(p.drain("b")))
        p.now += 0.02
    # The first two arrivals measure the gap; from then on every packet is answered as it arrives.
    assert answered[2:] == [1, 1, 1, 1] and p.b.get_timer() is None
    for d in sent[6:]:
        p.now += 0.001
        p.deliver("a", [d])
    # Once they come closer than the hold, ACKs are coalesced again: the first of these six (21 ms
    # after its predecessor) is answered at once, the next four together, the last one is held.
    assert len(p.drain("b")) == 2 and p.b.get_timer() is not None


def test_ack_batch_flushes_early() -> None:
    cfg = TransportConfig(pacing=False, ack_delay=0.01, ack_batch=4)
    p = make_pair(cfg)
    p.a.send_message(_msg(cfg.max_payload * 8))
    sent = p.drain("a")
    p.deliver("a", sent)
    assert len(p.drain("b")) == 2


def _drop_first_fragment_of_first_message(delivery: str):
    cfg = TransportConfig(delivery=delivery, pacing=False)
    p = make_pair(cfg)
    p.a.send_message(_msg(3000, 1))  # 3 fragments of 1000 bytes
    p.a.send_message(b"second")
    sent = p.drain("a")
    assert len(sent) == 4
    p.deliver("a", sent[1:])
    return p, sent


def test_unordered_delivers_a_complete_message_at_once() -> None:
    p, sent = _drop_first_fragment_of_first_message("unordered")
    assert [e.msg_id for e in p.received["b"]] == [1]
    p.deliver("a", sent[:1])
    assert [e.msg_id for e in p.received["b"]] == [1, 0]
    assert p.received["b"][1].data == _msg(3000, 1)


def test_ordered_holds_later_messages_back() -> None:
    p, sent = _drop_first_fragment_of_first_message("ordered")
    assert p.received["b"] == []
    # The held bytes: the first message but its first third (equal fragments of 1000 bytes), and the second.
    assert p.b.metrics()["receiver"]["reassembly_bytes"] == 3000 - 1000 + 6
    p.deliver("a", sent[:1])
    assert [e.msg_id for e in p.received["b"]] == [0, 1]
    assert p.b.metrics()["receiver"]["reassembly_bytes"] == 0


def test_lost_packet_is_retransmitted_on_another_ev_after_reordering_allowance() -> None:
    p = make_pair(TransportConfig(pacing=False))
    p.a.send_message(_msg(p.a.config.max_payload * 6))
    sent = p.drain("a")
    lost_ev = sent[0][1]
    p.now += 0.0005
    p.deliver("a", sent[1:])
    acks = p.drain("b")
    p.now += 0.0005
    p.deliver("b", acks)
    # Overtaken but not yet older than the per-EV RTT allowance: not lost yet, timer armed for it.
    assert p.a.datagrams_to_send(p.now) == []
    timer = p.a.get_timer()
    assert timer is not None and p.now < timer < 0.005
    p.now = timer
    p.a.handle_timer(p.now)
    retx = p.drain("a")
    assert len(retx) == 1
    pkt = decode(retx[0][0])
    assert isinstance(pkt, DataPacket) and pkt.psn == 0 and pkt.flags & 1
    assert retx[0][1] != lost_ev
    p.deliver("a", retx)
    p.deliver("b", p.drain("b"))
    assert len(p.acked["a"]) == 1
    m = p.a.metrics()["sender"]
    assert m["retransmissions"] == 1 and m["spurious_retransmissions"] == 0
    assert m["loss_recovery"]["count"] == 1


def test_tail_loss_is_recovered_by_rto_with_backoff() -> None:
    cfg = TransportConfig(pacing=False, rto_min=0.005)
    p = make_pair(cfg)
    p.a.send_message(b"x")
    first = p.drain("a")
    t1 = p.a.get_timer()
    assert t1 is not None and t1 >= 0.005
    p.now = t1
    p.a.handle_timer(p.now)
    second = p.drain("a")
    assert len(second) == 1 and second[0][1] != first[0][1]
    t2 = p.a.get_timer()
    assert t2 - p.now == pytest.approx(2 * t1)  # backed off
    p.deliver("a", second)
    p.deliver("b", p.drain("b"))
    assert len(p.acked["a"]) == 1
    assert p.a.metrics()["sender"]["timeouts"] == 1


def test_spurious_retransmission_is_detected_from_echoed_timestamp() -> None:
    p = make_pair(TransportConfig(pacing=False))
    p.a.send_message(b"late")
    original = p.drain("a")
    p.now = p.a.get_timer()
    p.a.handle_timer(p.now)
    retx = p.drain("a")
    p.now += 0.0001
    p.deliver("a", original)  # the original was only delayed
    p.deliver("b", p.drain("b"))
    p.deliver("a", retx)  # the copy is a duplicate at the receiver
    p.deliver("b", p.drain("b"))
    assert p.a.metrics()["sender"]["spurious_retransmissions"] == 1
    assert p.b.metrics()["receiver"]["duplicates"] == 1
    assert len(p.received["b"]) == 1


def test_gobackn_receiver_discards_out_of_order_and_naks_once() -> None:
    cfg = TransportConfig(recovery="gobackn", pacing=False)
    p = make_pair(cfg)
    p.a.send_message(_msg(cfg.max_payload * 5))
    sent = p.drain("a")
    p.deliver("a", sent[1:])
    naks = p.drain("b")
    assert len(naks) == 1 and decode(naks[0][0]).flags == 1 and decode(naks[0][0]).cum_psn == 0
    assert p.b.metrics()["receiver"]["dropped"]["out_of_order"] == 4
    p.deliver("b", naks)
    again = p.drain("a")
    assert [decode(d).psn for d, _ in again] == [0, 1, 2, 3, 4]  # everything from the lost PSN on
    p.deliver("a", again)
    p.deliver("b", p.drain("b"))
    assert len(p.received["b"]) == 1 and len(p.acked["a"]) == 1
    assert p.a.metrics()["sender"]["gobackn_rewinds"] == 1


def test_acks_for_unsent_psns_are_ignored(pair) -> None:
    pair.a.send_message(b"abc")
    pair.drain("a")
    bogus = encode(AckPacket(7, 50, 51, 0, 49, 0, 0, 64))
    pair.a.receive_datagram(bogus, 0.001)
    bogus_sack = encode(AckPacket(7, 0, 1, 0b101, 0, 0, 0, 64))
    pair.a.receive_datagram(bogus_sack, 0.001)
    assert pair.a.metrics()["receiver"]["dropped"]["ack_unsent"] == 2
    assert pair.acked["a"] == [] and not pair.a.idle


def test_wrong_connection_id_is_dropped(pair) -> None:
    pair.a.send_message(b"abc")
    data, _ = pair.drain("a")[0]
    other = Connection(TransportConfig(), 8)
    other.receive_datagram(data, 0.0)
    assert other.metrics()["receiver"]["dropped"] == {"wrong_connection": 1}
    assert other.next_event() is None


def test_timer_none_when_idle_and_armed_while_outstanding(pair) -> None:
    assert pair.a.get_timer() is None and pair.a.idle
    pair.a.send_message(b"abc")
    assert not pair.a.idle
    pair.drain("a")
    assert pair.a.get_timer() is not None


def test_message_larger_than_reassembly_limit_is_refused() -> None:
    cfg = TransportConfig(max_reassembly_bytes=10_000)
    conn = Connection(cfg, 1)
    assert conn.max_message_size <= 10_000
    conn.send_message(bytes(conn.max_message_size))
    with pytest.raises(ValueError, match="reassembly limit"):
        conn.send_message(bytes(conn.max_message_size + 1))


def test_receive_window_caps_bytes_and_messages() -> None:
    cfg = TransportConfig(max_reassembly_bytes=20_000, max_reassembly_messages=4, delivery="ordered")
    msgs = [_msg(3000 + i * 500, i) for i in range(30)]
    paths = [PathSpec(loss=0.1, reorder=0.3), PathSpec(delay=0.002)]
    r = run_transfer(cfg, cfg, paths, messages=msgs, seed=4, time_limit=30)
    assert r.completed
    assert [d for _, d in r.delivered] == msgs
    rm = r.receiver_metrics["receiver"]
    assert 0 < rm["peak_reassembly_bytes"] <= 20_000
    assert rm["peak_reassembly_messages"] <= 4


@pytest.mark.parametrize("delivery", ["unordered", "ordered"])
@pytest.mark.parametrize("recovery", ["selective", "gobackn"])
def test_psn_wraparound(delivery: str, recovery: str) -> None:
    cfg = TransportConfig(delivery=delivery, recovery=recovery, mtu=300)
    msgs = [_msg(1000 + i, i) for i in range(40)]
    r = run_transfer(cfg, cfg, [PathSpec(loss=0.05), PathSpec(reorder=0.2)], messages=msgs, seed=2,
                     initial_psn=2**32 - 60)
    assert r.completed
    assert sorted(r.delivered) == list(enumerate(msgs))
    assert r.sender_metrics["sender"]["packets_sent"] > 60  # the PSN really wrapped


def test_config_validation_names_field_and_fix() -> None:
    TransportConfig().validate()
    with pytest.raises(ConfigError, match=r"^delivery='sorted': use one of unordered, ordered"):
        TransportConfig(delivery="sorted").validate()
    with pytest.raises(ConfigError, match="mtu"):
        TransportConfig(mtu=20).validate()
    with pytest.raises(ConfigError, match="window"):
        TransportConfig(window=2000).validate()
    with pytest.raises(ConfigError, match="rto_max"):
        TransportConfig(rto_min=1.0, rto_max=0.5).validate()
    with pytest.raises(ValueError):
        Connection(TransportConfig(path_policy="ecmp"), 1)


def test_message_acked_event_type(pair) -> None:
    pair.a.send_message(b"a")
    pair.run()
    assert isinstance(pair.acked["a"][0], MessageAcked)


def test_coalesced_ack_echoes_the_oldest_packet_and_covers_the_batch() -> None:
    cfg = TransportConfig(pacing=False, ack_delay=0.01, ack_batch=4, window=128)
    p = make_pair(cfg)
    p.a.send_message(_msg(cfg.max_payload * 80))
    sent = p.drain("a")
    p.now = 0.001
    p.b.receive_datagram(sent[0][0], p.now)  # PSN 0: cumulative point moves to 1
    # Reordered arrivals beyond the cumulative point: 71 then 70, 75, 72, at 1 ms intervals.
    for i, k in enumerate((71, 70, 75, 72)):
        p.now = 0.002 + i * 0.001
        p.b.receive_datagram(sent[k][0], p.now)
    acks = [decode(d) for d, _ in p.drain("b")]
    assert len(acks) == 2
    ack = acks[1]
    assert ack.ack_psn == 71  # the batch's first arrival, held longest ...
    assert ack.ack_delay == 3000  # ... for 3 ms
    held = {ack.sack_base + i for i in range(64) if ack.sack_bitmap >> i & 1}
    assert {70, 71, 72, 75} <= held  # every packet of the batch, not just the 64 before PSN 71


def test_coalesced_ack_flushes_before_the_batch_outgrows_the_bitmap() -> None:
    cfg = TransportConfig(pacing=False, ack_delay=0.01, ack_batch=16, window=128)
    p = make_pair(cfg)
    p.a.send_message(_msg(cfg.max_payload * 120))
    sent = p.drain("a")
    p.b.receive_datagram(sent[5][0], 0.001)
    p.b.receive_datagram(sent[100][0], 0.001)  # 95 PSNs away: one bitmap cannot hold both
    acks = [decode(d) for d, _ in p.drain("b")]
    assert len(acks) == 1 and acks[0].ack_psn == 5
    assert acks[0].sack_bitmap >> (5 - acks[0].sack_base) & 1


def test_loss_detection_allows_for_the_peers_ack_delay() -> None:
    # The receiver holds ACKs up to 20 ms; the sender must not take a packet whose ACK is being
    # held for lost just because a later packet's (earlier flushed) ACK arrived first.
    cfg = TransportConfig(pacing=False, ack_delay=0.02, ack_batch=2, num_evs=1)
    p = make_pair(cfg)
    p.a.send_message(_msg(cfg.max_payload * 3))
    sent = p.drain("a")
    p.now = 0.001
    p.deliver("a", sent[1:3])  # 1 and 2 arrive: a batch of 2, flushed at once
    p.now = 0.002
    p.deliver("b", p.drain("b"))  # the sender learns 1-2 arrived; 0 is overtaken
    p.now = 0.003
    p.deliver("a", sent[:1])  # 0 arrives, its ACK held
    p.now = 0.015  # long past the RTT-based deadline (1 ms RTT), within the ACK delay
    p.fire_timers()
    assert p.a.stats.losses_detected == 0 and p.drain("a") == []
    p.now = 0.0231
    p.fire_timers()
    p.deliver("b", p.drain("b"))
    assert p.a.idle and p.a.stats.retransmissions == 0


def test_first_timeout_without_rtt_sample_probes_with_one_packet() -> None:
    cfg = TransportConfig(pacing=False, window=8)
    p = make_pair(cfg)
    p.a.send_message(_msg(cfg.max_payload * 8))
    assert len(p.drain("a")) == 8
    p.now = p.a.get_timer()
    p.a.handle_timer(p.now)
    assert p.a.stats.timeouts == 1 and p.a.stats.losses_detected == 1
    resent = p.drain("a")
    assert len(resent) <= 1


def test_timeout_waits_while_acks_keep_arriving() -> None:
    # A slow queue: the oldest packet is older than the RTO, but ACKs for newer data keep coming,
    # so the timer runs from the latest of them.
    cfg = TransportConfig(pacing=False, window=4, rto_min=0.005, initial_rtt=0.001)
    p = make_pair(cfg)
    p.a.send_message(_msg(cfg.max_payload * 4))
    sent = p.drain("a")
    p.now = 0.001
    p.deliver("a", sent[1:2])
    p.deliver("b", p.drain("b"))
    rto_from_oldest = p.a._recovery.rto()
    p.now = rto_from_oldest + 0.0005
    p.deliver("a", sent[2:3])
    p.deliver("b", p.drain("b"))  # progress: new data acknowledged
    p.a.handle_timer(p.now)
    assert p.a.stats.timeouts == 0
    assert p.a.get_timer() >= p.now


def _paced_wakeups(**cfg: float) -> tuple[int, int]:  # pacing_quantum or pacing_packets
    """(wake-ups, packets sent) in 0.5 s of a fixed window paced at 100 packets/s (10 ms apart), the
    driver waking only at get_timer()."""
    config = TransportConfig(cc="fixed", window=64, rto_min=1.0, rto_max=1.0, **cfg)
    p = make_pair(config)
    p.a.send_message(_msg(config.max_payload * 200))
    p.a._rtt.update(0.96)  # srtt so that pacing = 1.5 * 64 / srtt = 100 packets/s
    p.drain("a")  # the initial burst
    wakeups = packets = 0
    while True:
        t = p.a.get_timer()
        if t is None or t >= 0.5:
            return wakeups, packets
        p.now = t
        p.a.handle_timer(t)
        wakeups += 1
        packets += len(p.drain("a"))


def test_pacing_sends_in_quanta() -> None:
    # Without a quantum every wake-up sends one packet; with one, each wake-up also sends the
    # packet due within the next interval, so there are half as many wake-ups at the same rate.
    def run(quantum: float) -> tuple[int, int]:
        return _paced_wakeups(pacing_quantum=quantum)

    wakeups, packets = run(0.0)
    assert packets == pytest.approx(50, abs=2) and wakeups == packets
    wakeups, packets = run(0.001)
    assert packets == pytest.approx(50, abs=3) and wakeups <= packets / 2 + 1


def test_pacing_packets_send_an_acks_worth_per_wake_up() -> None:
    # The default 1 ms quantum sends a packet interval's worth per wake-up (2 packets);
    # pacing_packets=4 sends 4 intervals' worth, in a quarter of the wake-ups.
    one_w, one_p = _paced_wakeups(pacing_packets=1)
    four_w, four_p = _paced_wakeups(pacing_packets=4)
    assert four_p == pytest.approx(one_p, abs=4)  # the same rate ...
    assert one_w >= one_p / 2 - 1
    assert four_w <= four_p / 4 + 1  # ... in a quarter of the wake-ups

def test_coalesced_acks_do_not_inflate_retransmissions_under_loss() -> None:
    # 1 % loss on one of 8 sprayed paths (both directions, so ACKs are lost too): with ACKs held
    # up to 100 us, retransmissions stay close to the packets really dropped.
    paths = [PathSpec(rate_bps=100e6, delay=0.0005, queue_packets=64) for _ in range(8)]
    paths[0] = PathSpec(rate_bps=100e6, delay=0.0005, queue_packets=64, loss=0.01)
    cfg = TransportConfig(ack_delay=0.0001)
    r = run_transfer(cfg, cfg, paths, total_bytes=8 << 20, seed=1)
    assert r.completed
    dropped = sum(link["a_to_b"]["lost"] for link in r.network)
    assert dropped > 0
    assert r.sender_metrics["sender"]["retransmissions"] <= 2 * dropped + 5
