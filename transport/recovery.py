"""Sender-side loss recovery pieces: sent-packet records, RTT estimation and the pacer.

Loss detection itself lives in the connection (it needs the path policy and congestion control),
but the rules are here in one place: RTO from smoothed RTT and variance (RFC 6298) with a floor
and exponential backoff, and a per-EV, time-based reordering allowance (RACK-like) so that
packets sprayed over paths of different delay are not declared lost just for arriving late.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class SentPacket:
    """One PSN the sender has transmitted at least once and not yet seen acknowledged.

    The latest transmission is kept in plain fields (``ts``, ``ev``, ``sent_time``, ``tx_order``);
    the list of every transmission (``tx``) is only built once the PSN is retransmitted, so the
    common, single-transmission case allocates one object per packet.
    """

    __slots__ = (
        "ev",
        "frag_count",
        "frag_index",
        "lost",
        "lost_time",
        "msg",
        "msg_id",
        "msg_len",
        "payload",
        "sent_time",
        "seq",
        "spurious",
        "ts",
        "tx",
        "tx_order",
    )

    def __init__(
        self,
        seq: int,
        msg_id: int,
        frag_index: int,
        frag_count: int,
        msg_len: int,
        payload: bytes,
        msg: Any = None,
    ) -> None:
        self.seq = seq  # unbounded sequence number; the PSN on the wire is (initial + seq) mod 2^32
        self.msg_id = msg_id
        self.frag_index = frag_index
        self.frag_count = frag_count
        self.msg_len = msg_len
        self.payload = payload
        self.msg = msg  # the sender's record of the message (completion accounting)
        self.sent_time = 0.0  # of the latest transmission
        self.ev = 0  # of the latest transmission
        self.ts = 0  # wire timestamp of the latest transmission
        self.tx_order = 0  # transmission counter of the latest transmission (orders sends made at one instant)
        # Every transmission as (wire timestamp, ev, time), oldest first; None while there was one.
        self.tx: list[tuple[int, int, float]] | None = None
        self.lost = False
        self.lost_time: float | None = None  # when first declared lost
        self.spurious = False

    def transmissions(self) -> list[tuple[int, int, float]]:
        """Every transmission as (wire timestamp, ev, time), oldest first."""
        return self.tx if self.tx is not None else [(self.ts, self.ev, self.sent_time)]


@dataclass(slots=True)
class RttEstimator:
    """Smoothed RTT and its variation (RFC 6298 gains)."""

    srtt: float | None = None
    rttvar: float = 0.0
    min_rtt: float | None = None
    latest: float | None = None

    def update(self, rtt: float) -> None:
        self.latest = rtt
        self.min_rtt = rtt if self.min_rtt is None else min(self.min_rtt, rtt)
        if self.srtt is None:
            self.srtt = rtt
            self.rttvar = rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt


def rto(est: RttEstimator, initial_rtt: float, rto_min: float, rto_max: float, backoff: int) -> float:
    """Retransmission timeout: srtt + 4 rttvar but at least 2 srtt and rto_min, doubled per
    consecutive timeout. The 2 srtt term keeps a queue building up faster than the variance
    estimator follows (delay-based CC probing) from firing spurious timeouts."""
    base = 3 * initial_rtt if est.srtt is None else max(est.srtt + 4 * est.rttvar, 2 * est.srtt)
    return min(rto_max, max(rto_min, base) * (2 ** min(backoff, 16)))


def reorder_allowance(est: RttEstimator, fallback: RttEstimator, initial_rtt: float, window: float) -> float:
    """How long after sending an overtaken packet it is declared lost (per EV, RACK-like)."""
    src = est if est.srtt is not None else fallback
    if src.srtt is None:
        return initial_rtt * (1 + window) * 2
    return src.srtt * (1 + window) + 2 * src.rttvar


class Pacer:
    """Spaces transmissions at a rate, allowing a small burst after idle time."""

    def __init__(self, burst: int = 4) -> None:
        self.burst = burst
        self.next_time = float("-inf")

    def can_send(self, now: float) -> bool:
        return self.next_time <= now

    def on_sent(self, now: float, rate: float | None) -> None:
        if not rate or rate <= 0:
            self.next_time = float("-inf")
            return
        interval = 1.0 / rate
        self.next_time = max(self.next_time, now - self.burst * interval) + interval
