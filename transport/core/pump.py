"""The one loop step every driver of a sans-I/O `Connection` takes: the pump.

A driver, whether the UDP endpoints (transport.io) over real sockets or the simulated network
(transport.sim.simnet) on a virtual clock, does the same few things with each connection it holds:
fire its timer once due, hand its events to the application, pass what it has to send to the network,
and find out when it next needs to run. `Pump` is that, once, for one connection; the driver supplies
only what is its own: how a batch of (datagram, EV) pairs leaves (`send`) and what an event does
(`on_event`). `linger` is the rule by which an endpoint that has finished stays a little while, so a
lost final ACK can still be repeated for its peer.

Like the connection it drives, the pump never reads a clock: every call takes `now`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from transport.core.connection import Connection
from transport.core.events import Event

Datagrams = list[tuple[bytes, int]]  # what Connection.datagrams_to_send returns: (datagram, EV)
SendBatch = Callable[[Datagrams, float], None]
OnEvent = Callable[[Event, float], None]


class Pump:
    """Drives one connection: `fire` its due timer, hand its `events` on, `flush` what is due to send."""

    __slots__ = ("conn", "on_event", "send")

    def __init__(self, conn: Connection, send: SendBatch, on_event: OnEvent | None = None) -> None:
        self.conn = conn
        self.send = send
        self.on_event = on_event

    def fire(self, now: float) -> bool:
        """Handle the connection's timer if it is due by `now`; whether it was."""
        conn = self.conn
        timer = conn.get_timer()
        if timer is not None and timer <= now:
            conn.handle_timer(now)
            return True
        return False

    def events(self, now: float) -> None:
        """Hand every pending event to `on_event` (dropped without one)."""
        next_event = self.conn.next_event
        on_event = self.on_event
        while (event := next_event()) is not None:
            if on_event is not None:
                on_event(event, now)

    def flush(self, now: float) -> int:
        """Pass what the connection has to send by `now` to `send`; the number of datagrams."""
        out = self.conn.datagrams_to_send(now)
        if out:
            self.send(out, now)
        return len(out)

    def turn(self, now: float) -> None:
        """One step in the usual order: timer, events (what they submit leaves at once), send."""
        self.fire(now)
        self.events(now)
        self.flush(now)

    def timer(self) -> float | None:
        return self.conn.get_timer()


def earliest(wake: float | None, pumps: Iterable[Pump]) -> float | None:
    """The sooner of `wake` and every pump's timer (None: nothing is scheduled)."""
    for pump in pumps:
        timer = pump.conn.get_timer()
        if timer is not None and (wake is None or timer < wake):
            wake = timer
    return wake


def linger(now: float, done_at: float, last_rx: float, period: float) -> tuple[bool, float]:
    """(over, until): an endpoint done at `done_at`, last hearing from its peer at `last_rx`, stays
    until the peer has been quiet for `period` (its final ACK was not lost, or was repeated), but no
    longer than 10 periods after it was done; `until` is when to look again while it stays."""
    quiet_since = last_rx if last_rx > done_at else done_at
    over = now - quiet_since >= period or now - done_at >= 10 * period
    return over, quiet_since + period
