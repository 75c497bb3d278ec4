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


def rto(est: RttEstimator, initial_rtt: float, rto_min: float, rto_max: float, backoff: int) -> float:
    """Retransmission timeout: srtt + 4 rttvar but at least 2 srtt and rto_min (3 initial_rtt before
    the first sample), doubled per consecutive timeout, at most rto_max. The 2 srtt term keeps a
    queue building up faster than the variance estimator follows (delay-based CC probing) from
    firing spurious timeouts."""
    srtt = est.srtt
    base = 3 * initial_rtt if srtt is None else max(srtt + 4 * est.rttvar, 2 * srtt)
    return min(rto_max, max(rto_min, base) * (2 ** min(backoff, 16)))
