"""The attacks of ``scenarios.py`` held to bounds: what each costs the victim stays near what the
same run costs without it. The figures before the bounds were added are in each rule's text
(transport/core/credit.py, recovery.py, transport/io/receiver.py) and in docs/transport.md."""

from __future__ import annotations

from tests.transport.attacks import scenarios
from transport.core import wire
from transport.core.config import TransportConfig
from transport.core.connection import Connection
from transport.core.credit import receiver_window


def test_a_forged_credit_buys_at_most_one_receiver_window() -> None:
    """One forged CREDIT claiming 2^31 - 1 PSNs once made 25,683 queue drops in a 4 MiB transfer."""
    clean, attacked = scenarios.forged_credit(False), scenarios.forged_credit(True)
    assert attacked["delivered"] and attacked["queue_drops"] <= clean["queue_drops"] + 64
    assert attacked["duration_s"] <= 1.1 * clean["duration_s"]


def test_a_credit_limit_is_cut_to_the_highest_psn_sent_plus_the_window() -> None:
    config = TransportConfig(**scenarios._CREDIT)  # type: ignore[arg-type]
    a = Connection(config, 3, seed=1)
    a.send_message(bytes(1 << 20), 0.0)
    sent = len(a.datagrams_to_send(0.0)) - 1  # the unscheduled window and a REQUEST
    assert sent == config.initial_window
    a.receive_datagram(wire.pack_ctrl(wire.TYPE_CREDIT, 0, 0, 3, 0x7FFFFFFF), 0.001)
    burst = [d for d, _ in a.datagrams_to_send(0.001) if d[wire.TYPE_OFFSET] == wire.TYPE_DATA]
    assert len(burst) == receiver_window(config)
    assert a.datagrams_to_send(0.002) == []  # and the forged limit buys nothing more


def test_phantom_credit_connections_do_not_starve_genuine_flows() -> None:
    """Ten connections opened by two forged datagrams each once made two 2 MiB flows take 2.16 s
    instead of 0.36 s."""
    clean, attacked = scenarios.phantom_credit(0), scenarios.phantom_credit(10)
    assert max(attacked["completion_s"]) <= 1.1 * max(clean["completion_s"])
    assert attacked["phantom_grants"] <= 10 * receiver_window(TransportConfig(**scenarios._CREDIT))  # type: ignore[arg-type]


def test_a_connection_that_never_used_credit_goes_dormant_until_it_sends() -> None:
    from transport.core.credit import credit_timeout

    config = TransportConfig(**scenarios._CREDIT)  # type: ignore[arg-type]
    b = Connection(config, 9, seed=1)
    rx = b.credit_receiver
    assert rx is not None
    b.receive_datagram(wire.pack_data(0, 0, 9, 0, 0, 0, 2, 2, 0, b"x"), 0.0)
    b.receive_datagram(wire.pack_ctrl(wire.TYPE_REQUEST, 0, 0, 9, 1 << 30), 0.0)
    now = 0.0
    while now < 4 * credit_timeout(config):
        now = max(now, b.get_timer() or now + 0.001)
        b.handle_timer(now)
        b.datagrams_to_send(now)
    assert rx.dormant and rx.written_off >= 1 and not rx.queued
    granted = rx.granted
    b.receive_datagram(wire.pack_ctrl(wire.TYPE_REQUEST, 0, 0, 9, 1 << 30), now)
    assert [d[wire.TYPE_OFFSET] for d, _ in b.datagrams_to_send(now)] == [wire.TYPE_CREDIT]  # answered ...
    assert rx.dormant and rx.granted == granted  # ... with the limit it had, nothing more
    b.receive_datagram(wire.pack_data(0, 0, 9, 1, 0, 1, 2, 2, 0, b"y"), now)  # DATA: awake, and proven
    assert not rx.dormant and rx.proven and rx.queued


def test_forged_naks_do_not_rewind_go_back_n() -> None:
    """A forged NAK every millisecond once took 140 rewinds and twice the packets for 1 MiB."""
    clean, attacked = scenarios.forged_nak(False), scenarios.forged_nak(True)
    assert attacked["delivered"]
    assert attacked["packets_sent"] <= 1.2 * clean["packets_sent"]
    assert attacked["duration_s"] <= 1.1 * clean["duration_s"]
