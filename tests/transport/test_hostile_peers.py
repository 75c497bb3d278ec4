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

from transport import wire
from transport.config import TransportConfig
from transport.connection import Connection, MessageReceived


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


def test_fragments_in_any_order_reassemble_exactly() -> None:
    """The sparse fragment table still yields the message in index order."""
    config = TransportConfig()
    a, b = Connection(config, 3, seed=1), Connection(config, 3, seed=2)
    message = random.Random(5).randbytes(40 * config.max_payload + 17)
    a.send_message(message, 0.0)
    out = [d for d, _ in a.datagrams_to_send(0.0)]
    assert len(out) == 41  # the whole message fits the initial window
    random.Random(6).shuffle(out)
    for d in out:
        b.receive_datagram(d, 0.0)
    events = list(iter(b.next_event, None))
    assert [e.data for e in events if isinstance(e, MessageReceived)] == [message]
