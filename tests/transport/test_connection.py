"""The sans-I/O connection driven by hand: delivery, acks, recovery modes, caps, timers."""

from __future__ import annotations

import pytest

from transport.config import ConfigError, TransportConfig
from transport.connection import Connection, MessageAcked
from transport.simnet import PathSpec, run_transfer
from transport.wire import AckPacket, DataPacket, decode, encode

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
    p.a.send_message(_msg(3000, 1))  # 3 fragments
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
    assert p.b.metrics()["receiver"]["reassembly_bytes"] == 3000 - p.a.config.max_payload + 6
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
