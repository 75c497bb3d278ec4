"""Events a Connection hands to its application through ``next_event()``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    """Base class of all connection events."""


@dataclass(frozen=True)
class MessageReceived(Event):
    """A whole message from the peer, reassembled (in msg_id order when delivery is "ordered")."""

    msg_id: int
    data: bytes


@dataclass(frozen=True)
class MessageAcked(Event):
    """Every fragment of a message we sent has been acknowledged by the peer."""

    msg_id: int
    latency: float  # seconds from send_message() to the last fragment acknowledged

    @property
    def completion_time(self) -> float:
        return self.latency
