"""The RTT estimate (RFC 6298 gains) and the retransmission timeout computed from it.

Loss recovery keeps one estimate per connection and one per EV, congestion control reads the
connection's, the adaptive path policy keeps its own per EV and the endpoints' metrics report the RTO
by the same rule: all of them import it from here, the bottom of the core.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class RttEstimator:
    """Smoothed RTT and its variation (RFC 6298 gains), the minimum and the latest sample."""

    srtt: float | None = None
    rttvar: float = 0.0
    min_rtt: float | None = None
    latest: float | None = None
    # The latest sample's queueing on the way out, where the peer reports one-way delays (loss
    # recovery sets it before congestion control reads the sample); None: only the round trip is known.
    queueing: float | None = None

    def update(self, rtt: float) -> None:
        self.latest = rtt
        srtt = self.srtt
        if srtt is None:
            self.min_rtt = self.srtt = rtt
            self.rttvar = rtt / 2
        else:
            min_rtt = self.min_rtt
            if min_rtt is None or rtt < min_rtt:
                self.min_rtt = rtt
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(srtt - rtt)
            self.srtt = 0.875 * srtt + 0.125 * rtt


_HALF = 1 << 31
_U32 = 0xFFFFFFFF


@dataclass(slots=True)
class OneWayDelay:
    """Queueing on the way out, from the one-way delays a peer reports: each in the peer's clock less
    ours, modulo 2^32 microseconds. The clocks' offset is unknown but constant, so a sample less the
    smallest so far is the queueing it met (as LEDBAT reads its base delay), whichever clock is ahead.
    Samples are read relative to the first, so the field's wrap is harmless within +-35 minutes."""

    ref: int | None = None
    min_us: int = 0

    def sample(self, raw: int) -> float:
        """Seconds of queueing in the sample ``raw`` (the ACK's owd field)."""
        ref = self.ref
        if ref is None:
            self.ref = raw
            return 0.0
        rel = ((raw - ref + _HALF) & _U32) - _HALF
        if rel < self.min_us:
            self.min_us = rel
            return 0.0
        return (rel - self.min_us) * 1e-6


def rto(est: RttEstimator, initial_rtt: float, rto_min: float, rto_max: float, backoff: int) -> float:
    """Retransmission timeout: srtt + 4 rttvar but at least 2 srtt and rto_min (3 initial_rtt before
    the first sample), doubled per consecutive timeout, at most rto_max. The 2 srtt term keeps a
    queue building up faster than the variance estimator follows (delay-based CC probing) from
    firing spurious timeouts."""
    srtt = est.srtt
    base = 3 * initial_rtt if srtt is None else max(srtt + 4 * est.rttvar, 2 * srtt)
    return min(rto_max, max(rto_min, base) * (2 ** min(backoff, 16)))
