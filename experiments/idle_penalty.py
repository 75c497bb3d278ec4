"""How much more the transport core's receive path costs after the process has slept a packet gap.

The same Python code can cost many times more CPU when it runs right after the process has slept than
when it runs back to back: caches and TLBs are cold, and a virtual machine's vCPU may have been
descheduled meanwhile. An endpoint woken for each packet of a paced flow pays that on every packet.
`receive_path_us` runs the sans-I/O core's receive path (a DATA datagram in, the ACK it makes out, its
events) in this process, with and without a sleep before each datagram, so that `fabriclab bench
endpoints` and `fabriclab bench fidelity` can say which of the two the endpoints' figures are made of.
"""

from __future__ import annotations

import time

from transport.core.config import TransportConfig
from transport.core.connection import Connection

# Datagrams measured per figure, after WARM_UP that are not (the connection's first allocations);
# fewer on slow paces, so that a probe sleeps at most about MAX_SLEEP_S, but at least MIN_PACKETS.
PACKETS = 100
MIN_PACKETS = 20
WARM_UP = 10
MAX_SLEEP_S = 5.0


def data_datagrams(datagram: int, count: int) -> list[bytes]:
    """`count` first transmissions of DATA from a sender Connection filling datagrams of `datagram`
    bytes, its window opened by a receiver's ACKs handed straight back."""
    config = TransportConfig(mtu=datagram)
    sender, helper = Connection(config, 1, seed=1), Connection(config, 1, seed=2)
    sender.send_message(bytes(datagram * (count + 8)))
    out: list[bytes] = []
    now = 0.0
    for _ in range(100 * count + 1000):
        if len(out) >= count:
            return out[:count]
        now += 0.001
        sent = sender.datagrams_to_send(now)
        for data, _ev in sent:
            out.append(data)
            helper.receive_datagram(data, now)
        for data, _ev in helper.datagrams_to_send(now):
            sender.receive_datagram(data, now)
        for conn in (sender, helper):
            while conn.next_event() is not None:
                pass
            timer = conn.get_timer()
            if not sent and timer is not None and timer <= now + 0.05:
                now = max(now, timer)
                conn.handle_timer(now)
    raise RuntimeError(f"the sender made {len(out)} of {count} DATA datagrams")


def receive_path_us(datagrams: list[bytes], gap_s: float) -> float:
    """CPU µs per datagram of a fresh receiver Connection's receive path (receive_datagram, the ACK
    it makes at once, its events), the process sleeping `gap_s` before each measured one (0: back to
    back)."""
    receiver = Connection(TransportConfig(mtu=max(map(len, datagrams))), 1, seed=2)
    cpu = time.process_time
    spent = 0.0
    now = 0.0
    for i, data in enumerate(datagrams):
        if gap_s > 0 and i >= WARM_UP:
            time.sleep(gap_s)
        t0 = cpu()
        took = receiver.receive_datagram(data, now)
        acks = receiver.datagrams_to_send(now)
        while receiver.next_event() is not None:
            pass
        if i >= WARM_UP:
            spent += cpu() - t0
        if not took or not acks:  # a figure for a path that did not run would mean nothing
            raise RuntimeError(f"datagram {i} was not received and acknowledged")
        now += gap_s or 0.001
    measured = len(datagrams) - WARM_UP
    return round(spent / measured * 1e6, 1) if measured > 0 else 0.0


def probe(datagram: int, gap_s: float) -> dict[str, float]:
    """The receive path's CPU µs per DATA datagram of `datagram` bytes, back to back and after sleeping
    `gap_s` (PACKETS of them, fewer where that would sleep more than MAX_SLEEP_S)."""
    packets = PACKETS if gap_s * PACKETS <= MAX_SLEEP_S else max(MIN_PACKETS, int(MAX_SLEEP_S / gap_s))
    datagrams = data_datagrams(datagram, packets + WARM_UP)
    return {"back_to_back": receive_path_us(datagrams, 0.0), "after_gap": receive_path_us(datagrams, gap_s),
            "gap_s": round(gap_s, 6)}

