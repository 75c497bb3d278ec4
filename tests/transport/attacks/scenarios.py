"""Attacks on the transport by a hostile or confused peer, each run on the virtual clock and
measured: what a forged CREDIT, phantom credit connections, forged go-back-N NAKs, spoofed first
fragments, partial messages and a forged request to an echoing receiver cost the victim.

Each function returns plain figures (a dict); ``tests/transport/attacks/test_attacks.py`` holds
them to bounds, and ``python -m tests.transport.attacks.scenarios`` prints them all.
"""

from __future__ import annotations

import gc
import json
import logging
import tracemalloc
from collections.abc import Callable, Iterable
from typing import Any

from transport.core import wire
from transport.core.config import TransportConfig
from transport.core.connection import Connection, MessageAcked, MessageReceived
from transport.core.credit import CreditScheduler
from transport.io.receiver import Receiver
from transport.sim.simnet import PathSpec, SimNetwork, drive

log = logging.getLogger(__name__)

# A credit fabric: one 100 Mb/s path with a 64-packet queue, the receiver granting at that rate.
_CREDIT = dict(cc="credit", link_rate_bps=100e6, base_rtt=0.0012, path_policy="single")


def _messages(total: int, size: int = 65536) -> list[bytes]:
    return [bytes(min(size, total - i)) for i in range(0, total, size)]


# ---------------------------------------------------------------------------------------------- CREDIT


def _one_path_transfer(config: TransportConfig, cid: int, total: int, seed: int,
                       attack: Callable[[Connection, float], None]) -> tuple[float, SimNetwork, Connection, bool]:
    """``total`` bytes from A to B over one 100 Mb/s path with a 64-packet queue, ``attack(a, now)``
    called every turn; returns the end time, the network, the sender and whether all was delivered."""
    net = SimNetwork([PathSpec(rate_bps=100e6, queue_packets=64)], seed=seed)
    a, b = Connection(config, cid, seed=1), Connection(config, cid, seed=2)
    msgs = _messages(total)
    for m in msgs:
        a.send_message(m, 0.0)
    delivered = [0]

    def on_event(side: int, event: object, now: float) -> None:
        if side == 1 and isinstance(event, MessageReceived):
            delivered[0] += 1

    end = drive((a, b), [(net, 0, 1)], done=lambda: delivered[0] == len(msgs) and a.idle, time_limit=30.0,
                on_event=on_event, check=lambda now: attack(a, now))
    return end, net, a, delivered[0] == len(msgs)


def forged_credit(forge: bool = True, total: int = 4 << 20) -> dict[str, Any]:
    """A credit sender moving ``total`` bytes over one path with a 64-packet queue; with ``forge``,
    one forged CREDIT claiming a limit of 2^31 - 1 PSNs arrives 2 ms in. Queue drops and the
    duration are the cost."""
    forged = [not forge]

    def attack(a: Connection, now: float) -> None:
        if not forged[0] and now >= 0.002:
            forged[0] = True
            a.receive_datagram(wire.pack_ctrl(wire.TYPE_CREDIT, 0, 0, 11, 0x7FFFFFFF), now)

    end, net, a, delivered = _one_path_transfer(TransportConfig(**_CREDIT), 11, total, 1, attack)  # type: ignore[arg-type]
    link = net.link_stats()
    return {"duration_s": round(end, 4), "queue_drops": sum(s["a_to_b"]["queue_drops"] for s in link),
            "retransmissions": a.stats.retransmissions, "delivered": delivered}


def phantom_credit(phantoms: int = 10, total: int = 2 << 20) -> dict[str, Any]:
    """Two genuine credit flows of ``total`` bytes into one receiving endpoint (one shared
    CreditScheduler); ``phantoms`` connections opened there by two forged datagrams each (a first
    fragment and a REQUEST for 2^30 PSNs), whose senders never answer. The genuine flows' completion
    time is the cost."""
    config = TransportConfig(**_CREDIT)
    sched = CreditScheduler.from_config(config)
    conns: list[Connection] = []
    nets: list[tuple[SimNetwork, int, int]] = []
    done_at: dict[int, float] = {}
    for i in range(2):
        a, b = Connection(config, 100 + i, seed=2 * i), Connection(config, 100 + i, seed=2 * i + 1)
        b.use_credit_scheduler(sched)
        for m in _messages(total):
            a.send_message(m, 0.0)
        nets.append((SimNetwork([PathSpec(rate_bps=100e6, queue_packets=64)], seed=i), len(conns), len(conns) + 1))
        conns += [a, b]
    for k in range(phantoms):
        cid = 1000 + k
        victim = Connection(config, cid, seed=50 + k)
        victim.use_credit_scheduler(sched)
        victim.receive_datagram(wire.pack_data(0, 0, cid, 0, 0, 0, 2, 2, 0, b"x"), 0.0)
        victim.receive_datagram(wire.pack_ctrl(wire.TYPE_REQUEST, 0, 0, cid, 1 << 30), 0.0)
        # Its peer is a connection of another id: everything the phantom sends is lost on it.
        nets.append((SimNetwork([PathSpec()], seed=100 + k), len(conns), len(conns) + 1))
        conns += [victim, Connection(config, 0xDEAD0000 + k, seed=k)]
    n_msgs = len(_messages(total))
    acked = [0, 0]

    def on_event(side: int, event: object, now: float) -> None:
        if side in (0, 2) and isinstance(event, MessageAcked):
            acked[side // 2] += 1
            if acked[side // 2] == n_msgs:
                done_at[side] = now

    drive(conns, nets, done=lambda: len(done_at) == 2, time_limit=60.0, on_event=on_event, schedulers=[sched])
    return {"phantoms": phantoms, "completion_s": [round(done_at.get(s, float("inf")), 3) for s in (0, 2)],
            "phantom_grants": sum(c.credit_receiver.grants for c in conns[4::2]  # type: ignore[union-attr]
                                  if c.credit_receiver is not None)}


# ---------------------------------------------------------------------------------------------- NAK


def forged_nak(forge: bool = True, total: int = 1 << 20, every: float = 0.001) -> dict[str, Any]:
    """A go-back-N transfer of ``total`` bytes on one path; with ``forge``, every ``every`` seconds a
    forged NAK naming the sender's oldest unacknowledged PSN (what an attacker watching the flow, or
    guessing it, would name) and the PSN after it."""
    last = [0.0]

    def attack(a: Connection, now: float) -> None:
        if forge and now - last[0] >= every:
            last[0] = now
            una = a._recovery.una
            a.receive_datagram(wire.pack_ack(wire.FLAG_NAK, 0, 21, una & wire.PSN_MASK, 0, 0,
                                             (una + 1) & wire.PSN_MASK, 0, 0, 1 << 16), now)

    config = TransportConfig(recovery="gobackn", path_policy="single")
    end, _, a, delivered = _one_path_transfer(config, 21, total, 4, attack)
    return {"duration_s": round(end, 4), "packets_sent": a.stats.packets_sent,
            "rewinds": a.stats.gobackn_rewinds, "delivered": delivered}


# ---------------------------------------------------------------------------------------------- receiver


class _Socket:
    """What the receiver's loop turn sends through: records (datagram, destination)."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, tuple[Any, ...]]] = []

    def sendto(self, data: bytes, addr: tuple[Any, ...]) -> int:
        self.sent.append((data, addr))
        return len(data)

    def getsockname(self) -> tuple[str, int]:
        return "127.0.0.1", 7471

    def close(self) -> None:
        pass


def receiver(config: TransportConfig | None = None, **kwargs: Any) -> Receiver:
    """A Receiver driven by hand on a virtual clock (``feed``, ``run_until``)."""
    r = Receiver(config or TransportConfig(), **kwargs)
    r.sock = _Socket()  # type: ignore[assignment]
    return r


def feed(r: Receiver, datagrams: Iterable[tuple[bytes, tuple[Any, ...]]], now: float) -> None:
    """Hand ``datagrams`` (data, source address) to the receiver as its socket would."""
    it = iter(datagrams)

    def recvfrom(_size: int) -> tuple[bytes, tuple[Any, ...]]:
        try:
            return next(it)
        except StopIteration:
            raise BlockingIOError from None

    while r._drain(recvfrom, now):
        r._turn(now)


def run_until(r: Receiver, now: float, end: float) -> float:
    """Run the receiver's timers from ``now`` to ``end`` (virtual seconds); returns the time reached."""
    while True:
        wake = r._turn(now)
        if wake is None or wake > end:
            return end
        now = max(now, wake)


def _first_fragment(cid: int, psn: int = 0, msg_id: int = 0) -> bytes:
    """The 1-byte first fragment of a 2-byte message: 43 bytes that open a connection and stay."""
    return wire.pack_data(0, 0, cid, psn, msg_id, 0, 2, 2, 0, b"x")


def spoofed_slots(held_for: float = 600.0) -> dict[str, Any]:
    """1,024 first fragments from 1,024 spoofed sources fill the receiver's connections; after
    ``held_for`` seconds a genuine sender's message arrives. Connections still held and whether the
    genuine one was served are the cost."""
    r = receiver()
    try:
        spoofed = [(_first_fragment(7), (f"10.{i >> 8}.{i & 255}.9", 4000)) for i in range(1024)]
        feed(r, spoofed, 0.0)
        held_at_start = len(r.peers)
        now = run_until(r, 0.0, held_for)
        feed(r, [(wire.pack_data(0, 0, 99, 0, 0, 0, 1, 1, 0, b"y"), ("10.99.0.1", 4000))], now)
        served = any(p.connection_id == 99 for p in r.peers.values())
        return {"held_at_start": held_at_start, "held_after_s": held_for, "still_held": len(r.peers) - served,
                "genuine_served": served, "refused": r.connections_refused}
    finally:
        r.close()


def _held_bytes(attack: Callable[[], Any]) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        attack()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def partial_messages(ids: int = 16, fragments: int = 1024, later: float = 600.0) -> dict[str, Any]:
    """``ids`` connections (from as many sources) each sent ``fragments`` first fragments of distinct
    2-fragment messages, never completed: the receiver's memory right after, and ``later`` seconds
    later. Scaled down from 1,024 ids so as to stay fast; bytes per fragment are the figure to scale."""
    r = receiver()
    try:
        dgrams = [(_first_fragment(5, psn=2 * m, msg_id=m), (f"10.1.{i}.9", 4000))
                  for i in range(ids) for m in range(fragments)]
        held = _held_bytes(lambda: feed(r, dgrams, 0.0))
        run_until(r, 0.0, later)
        left = sum(p.conn.stats.reassembly_bytes for p in r.peers.values())
        return {"ids": ids, "fragments": fragments, "held_bytes": held,
                "bytes_per_fragment": round(held / (ids * fragments)),
                "connections_left_after_s": [later, len(r.peers)], "fragments_left": left}
    finally:
        r.close()


def echo_amplification(response_size: int = 150_000, horizon: float = 120.0) -> dict[str, Any]:
    """One forged request (a 100-byte message from a spoofed source, the victim) to a receiver run
    with ``--response-size``; the victim never answers. Bytes sent to the victim within ``horizon``
    seconds, and whether the receiver is still sending to it then, are the cost."""
    r = receiver(response_size=response_size)
    victim = ("10.0.0.66", 4000)
    try:
        request = wire.pack_data(0, 0, 31, 0, 0, 0, 1, 100, 0, bytes(100))
        feed(r, [(request, victim)], 0.0)
        run_until(r, 0.0, horizon)
        sent = [len(d) for d, addr in r.sock.sent if addr == victim]  # type: ignore[union-attr]
        data = [d for d, addr in r.sock.sent if addr == victim and d[wire.TYPE_OFFSET] == wire.TYPE_DATA]  # type: ignore[union-attr]
        before = len(r.sock.sent)  # type: ignore[union-attr]
        run_until(r, horizon, horizon + 10.0)
        still = len(r.sock.sent) > before  # type: ignore[union-attr]
        return {"request_bytes": len(request), "bytes_to_victim": sum(sent),
                "amplification": round(sum(sent) / len(request), 1), "data_packets": len(data),
                "still_sending_after_s": [horizon, still]}
    finally:
        r.close()


# ---------------------------------------------------------------------------------------------- restart


def _exchange(a: Connection, b: Connection, accept: Callable[[bytes], bool], until: float) -> float:
    """Run ``a`` and ``b`` against each other with instant, lossless delivery until both are idle or
    ``until`` (virtual seconds); what ``a`` sends reaches ``b`` only if ``accept(datagram)``."""
    now = 0.0
    while now <= until:
        moved = False
        for d, _ in a.datagrams_to_send(now):
            moved = True
            if accept(d):
                b.receive_datagram(d, now)
        for d, _ in b.datagrams_to_send(now):
            moved = True
            a.receive_datagram(d, now)
        if a.idle and b.idle:
            break
        if not moved:
            timers = [t for t in (a.get_timer(), b.get_timer()) if t is not None]
            if not timers:
                break
            now = max(now, min(timers))
            a.handle_timer(now)
            b.handle_timer(now)
    return now


def restart(fresh_ids: bool) -> dict[str, Any]:
    """A sender delivers 10 messages, restarts (a new Connection, fresh state) and sends 10 more to
    the receiver, which kept its state. With ``fresh_ids`` False both starts use the id the seed gives
    (what the all-reduce did); with True each start draws its own and the receiving side takes the
    first it sees from the peer (transport/io/incarnation.py). Messages the restarted sender was told
    were acknowledged, those delivered, and whether the restart was reported are the figures."""
    from transport.collective.ring import edge_connection_id
    from transport.io.incarnation import PeerIncarnation, PeerRestarted, fresh_connection_id

    config = TransportConfig()
    peer = PeerIncarnation("10.0.0.1")
    src = ("10.0.0.1", 5000)

    def start() -> int:
        return fresh_connection_id() if fresh_ids else edge_connection_id(2, 7, 0)

    first = start()
    a1 = Connection(config, first, seed=1)
    b = Connection(config, first, seed=2)
    reported: list[str] = []

    def accept(d: bytes) -> bool:
        cid = wire.read_conn_id(d)
        if fresh_ids and cid != peer.connection_id:
            try:
                peer.adopt(d, src)  # the peer's first DATA: its id is adopted; another id: a restart
            except PeerRestarted as exc:
                reported.append(str(exc))
                return False
        return cid == b.connection_id

    for i in range(10):
        a1.send_message(bytes(1000 + i), 0.0)
    _exchange(a1, b, accept, 5.0)
    before = sum(isinstance(e, MessageReceived) for e in iter(b.next_event, None))
    a2 = Connection(config, start(), seed=3)
    for i in range(10):
        a2.send_message(bytes(2000 + i), 0.0)
    _exchange(a2, b, accept, 5.0)
    acked = sum(isinstance(e, MessageAcked) for e in iter(a2.next_event, None))
    after = sum(isinstance(e, MessageReceived) for e in iter(b.next_event, None))
    return {"fresh_ids": fresh_ids, "delivered_before_restart": before, "acked_after_restart": acked,
            "delivered_after_restart": after, "restart_reported": bool(reported)}


ALL: dict[str, Callable[[], dict[str, Any]]] = {
    "forged_credit_clean": lambda: forged_credit(False),
    "forged_credit": forged_credit,
    "phantom_credit_clean": lambda: phantom_credit(0),
    "phantom_credit": phantom_credit,
    "forged_nak_clean": lambda: forged_nak(False),
    "forged_nak": forged_nak,
    "spoofed_slots": spoofed_slots,
    "partial_messages": partial_messages,
    "echo_amplification": echo_amplification,
    "restart_fixed_ids": lambda: restart(False),
    "restart_fresh_ids": lambda: restart(True),
}


if __name__ == "__main__":
    import sys

    logging.basicConfig(level=logging.ERROR)
    names = sys.argv[1:] or list(ALL)
    for name in names:
        sys.stdout.write(json.dumps({name: ALL[name]()}) + "\n")  # the figures are this script's output
