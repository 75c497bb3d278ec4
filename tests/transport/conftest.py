"""Shared helpers for the transport tests: a connected pair driven by hand, with a virtual clock."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from transport.core.config import TransportConfig
from transport.core.connection import Connection, MessageAcked, MessageReceived


@dataclass
class Pair:
    """Two connections and an in-memory wire between them, like aioquic's roundtrip() helpers."""

    a: Connection
    b: Connection
    now: float = 0.0
    received: dict[str, list[MessageReceived]] = field(default_factory=lambda: {"a": [], "b": []})
    acked: dict[str, list[MessageAcked]] = field(default_factory=lambda: {"a": [], "b": []})

    def conn(self, side: str) -> Connection:
        return self.a if side == "a" else self.b

    def other(self, side: str) -> Connection:
        return self.b if side == "a" else self.a

    def drain(self, side: str) -> list[tuple[bytes, int]]:
        return self.conn(side).datagrams_to_send(self.now)

    def deliver(self, side: str, datagrams: list[tuple[bytes, int]]) -> None:
        """Hand datagrams sent by ``side`` to the other end."""
        for data, _ev in datagrams:
            self.other(side).receive_datagram(data, self.now)
        self.collect()

    def collect(self) -> None:
        for side in ("a", "b"):
            conn = self.conn(side)
            while (ev := conn.next_event()) is not None:
                if isinstance(ev, MessageReceived):
                    self.received[side].append(ev)
                elif isinstance(ev, MessageAcked):
                    self.acked[side].append(ev)

    def roundtrip(self, side: str = "a", rtt: float = 0.001) -> int:
        """Send everything ``side`` has, deliver it after rtt/2, deliver the answers after rtt/2."""
        sent = self.drain(side)
        self.now += rtt / 2
        self.deliver(side, sent)
        back = self.drain("b" if side == "a" else "a")
        self.now += rtt / 2
        self.deliver("b" if side == "a" else "a", back)
        return len(sent)

    def fire_timers(self) -> None:
        for conn in (self.a, self.b):
            t = conn.get_timer()
            if t is not None and t <= self.now:
                conn.handle_timer(self.now)
        self.collect()

    def run(self, rounds: int = 1000, rtt: float = 0.001) -> None:
        """Round trips until both ends are idle (timers fired as the clock passes them)."""
        for _ in range(rounds):
            if self.a.idle and self.b.idle:
                return
            self.roundtrip("a", rtt)
            self.roundtrip("b", rtt)
            self.fire_timers()
        raise AssertionError("connections did not become idle")


def make_pair(config: TransportConfig | None = None, peer: TransportConfig | None = None, **kw) -> Pair:
    config = config or TransportConfig()
    return Pair(Connection(config, 7, seed=1, **kw), Connection(peer or config, 7, seed=2, **kw))


@pytest.fixture
def pair() -> Pair:
    return make_pair()
