"""Connection ids that change on every start, so that a restarted peer is never matched to the
state an old incarnation left behind.

With one id for a pair agreed from the seed, a rank that restarted sent its first messages at PSN 0
to a neighbour still expecting where the old one left off: they were acknowledged as duplicates and
never delivered (5 of 10 messages reported acknowledged, none delivered), or the stream stalled. So
each start draws its sending side's id at random (``fresh_connection_id``), and the receiving side
takes the id of the first checked DATA packet of message 0 from the peer it expects
(``PeerIncarnation``): every incarnation's stream starts there, and a straggler of an earlier run
(a later message) is only a foreign datagram. A later DATA of message 0 from that peer under another
id is a restart, which the worker reports as an error rather than mixing the two incarnations'
streams. Neither side's loss is silent: the restarted sender is never acknowledged, and the survivor
says what happened.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from transport.core import wire

__all__ = ["TAG_BITS", "PeerIncarnation", "PeerRestarted", "fresh_connection_id", "tagged_connection_ids"]

# A tagged id (``tagged_connection_ids``) carries its sender's tag (a rank) in its high bits, so that
# a receiver with several peers on one host knows whose first DATA it is; the low bits are random.
TAG_BITS = 16


def fresh_connection_id() -> int:
    """A random, non-zero 32-bit connection id for this start."""
    return int.from_bytes(os.urandom(4), "big") or 1


def tagged_connection_ids(tag: int, count: int) -> list[int]:
    """``count`` distinct connection ids for this start, each ``tag`` in the high TAG_BITS bits and
    random low bits (a restart is missed only if it draws the same low bits: once in 65,536)."""
    if not 0 <= tag < 1 << (32 - TAG_BITS) or count > 1 << TAG_BITS:
        raise ValueError(f"tag {tag} or count {count} does not fit a tagged connection id")
    ids: list[int] = []
    while len(ids) < count:
        cid = tag << TAG_BITS | int.from_bytes(os.urandom(2), "big")
        if cid and cid not in ids:
            ids.append(cid)
    return ids


class PeerRestarted(Exception):
    """A peer's DATA came under a new connection id: it restarted, and what the old one sent may be lost."""


@dataclass
class PeerIncarnation:
    """The connection id the expected peer (``host``) sends on, taken from its first checked DATA."""

    host: str
    connection_id: int | None = None

    def adopt(self, data: bytes, addr: tuple[Any, ...]) -> bool:
        """Whether ``data`` (from ``addr``, not under the adopted id) makes its id the peer's: only a
        DATA packet of message 0 that decodes and passes its CRC, from the peer's host, and only the
        first. Raises PeerRestarted for such a packet under another id once one is adopted."""
        if addr[0] != self.host or len(data) <= wire.TYPE_OFFSET or data[wire.TYPE_OFFSET] != wire.TYPE_DATA:
            return False
        try:
            packet = wire.decode(data)
        except Exception:  # any decoding failure: not a packet of ours
            return False
        if not isinstance(packet, wire.DataPacket) or packet.msg_id != 0:
            return False
        if self.connection_id is not None:
            raise PeerRestarted(
                f"{self.host} restarted: its data now comes under connection id {packet.conn_id:#x}, not "
                f"{self.connection_id:#x}, so what it sent before may be lost; restart the whole run")
        self.connection_id = packet.conn_id
        return True
