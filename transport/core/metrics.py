"""Counters and samples a connection keeps, and their summary as a JSON-serialisable dict.

Samples are kept in bounded buffers (the most recent ``MAX_SAMPLES``) so a long-running endpoint
does not grow without bound; statistics are computed with numpy only when ``summary()`` is called,
and numpy is imported only then: an endpoint process starts about 0.1 s sooner without it.
The keys of the summary are documented in docs/transport.md.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_SAMPLES = 200_000
# Reorder distance histogram bins: [1], [2,3], [4,7], ... [1024, inf).
_REORDER_EDGES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


def _samples() -> deque[float]:
    return deque(maxlen=MAX_SAMPLES)


def preload() -> None:
    """Import what computing the final metrics needs (numpy) now: an endpoint started by a runner calls
    this before it announces readiness, so that the import does not land inside the measured window
    when its flow ends. Interactive runs skip it and start faster."""
    import numpy as np

    np.percentile(np.zeros(2), [50, 99])  # its first call loads more of numpy (~20 ms)
    np.histogram(np.zeros(2), bins=[0, 1])


def quantiles(values: Iterable[float | None], qs: Sequence[float], *, interpolate: bool = True) -> list[float] | None:
    """The `qs`-th percentiles (0-100) of `values`, Nones left out; None when no value is left.

    interpolate: between the two nearest ranks, numpy's default ("linear"); otherwise the value at rank
    floor(q/100 * n) of the sorted values, which needs no numpy (an endpoint that was not asked to
    preload it reports its completion times without paying for the import).
    """
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    if not interpolate:
        vals.sort()
        n = len(vals)
        return [vals[min(n - 1, int(q / 100 * n))] for q in qs]
    import numpy as np

    return _interpolated(np.asarray(vals, dtype=float), qs)


def _interpolated(a: Any, qs: Sequence[float]) -> list[float]:
    """numpy's linearly interpolated percentiles of a float array: the one place they are computed."""
    import numpy as np

    return [float(x) for x in np.percentile(a, list(qs))]


def percentile(values: Iterable[float | None], q: float, *, interpolate: bool = True) -> float | None:
    """The q-th percentile (0-100) of `values` as `quantiles` computes it; None when there are none."""
    found = quantiles(values, (q,), interpolate=interpolate)
    return None if found is None else found[0]


def percentiles(samples: deque[float] | list[float]) -> dict:
    """count, mean, p50, p99, p999 and max of a sample set (None when empty)."""
    if not samples:
        return {"count": 0, "mean": None, "p50": None, "p99": None, "p999": None, "max": None}
    import numpy as np

    a = np.fromiter(samples, dtype=float, count=len(samples))
    p50, p99, p999 = _interpolated(a, (50, 99, 99.9))
    return {
        "count": int(a.size),
        "mean": float(a.mean()),
        "p50": p50,
        "p99": p99,
        "p999": p999,
        "max": float(a.max()),
    }


@dataclass
class EvStats:
    packets_sent: int = 0
    bytes_sent: int = 0
    retransmissions: int = 0
    acked: int = 0
    losses: int = 0
    timeouts: int = 0
    rtt: deque[float] = field(default_factory=_samples)

    def summary(self) -> dict:
        return {
            "packets_sent": self.packets_sent,
            "bytes_sent": self.bytes_sent,
            "retransmissions": self.retransmissions,
            "acked": self.acked,
            "losses": self.losses,
            "timeouts": self.timeouts,
            "rtt": percentiles(self.rtt),
        }


class GoodputSeries:
    """Bytes delivered per time bin; bins double in width (pairs merged) past ``max_bins``."""

    def __init__(self, bin_width: float = 0.001, max_bins: int = 4096) -> None:
        self.bin_width = bin_width
        self.max_bins = max_bins
        self.start: float | None = None
        self.bins: list[int] = []

    def add(self, now: float, nbytes: int) -> None:
        start = self.start
        if start is None:
            start = self.start = now
        i = int((now - start) / self.bin_width)
        bins = self.bins
        if 0 <= i < len(bins):  # the common case: the latest bin or one before it
            bins[i] += nbytes
            return
        i = max(0, i)
        while i >= self.max_bins:
            merged = [sum(self.bins[j : j + 2]) for j in range(0, len(self.bins), 2)]
            self.bins = merged
            self.bin_width *= 2
            i = max(0, int((now - self.start) / self.bin_width))
        if i >= len(self.bins):
            self.bins.extend([0] * (i + 1 - len(self.bins)))
        self.bins[i] += nbytes

    def summary(self) -> dict:
        return {
            "start": self.start,
            "bin": self.bin_width,
            "bps": [b * 8 / self.bin_width for b in self.bins],
        }


@dataclass
class Stats:
    """Everything one Connection counts, as sender and as receiver."""

    # sender
    messages_sent: int = 0
    messages_acked: int = 0
    bytes_acked: int = 0
    packets_sent: int = 0
    bytes_sent: int = 0
    retransmissions: int = 0
    spurious_retransmissions: int = 0
    losses_detected: int = 0
    timeouts: int = 0
    gobackn_rewinds: int = 0
    acks_received: int = 0
    ecn_ce_echoed: int = 0  # CE marks the peer's ACKs echoed
    rtt: deque[float] = field(default_factory=_samples)
    completion: deque[float] = field(default_factory=_samples)
    recovery: deque[float] = field(default_factory=_samples)
    per_ev: dict[int, EvStats] = field(default_factory=dict)
    # receiver
    data_received: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    reorder_distance: deque[int] = field(default_factory=_samples)
    messages_delivered: int = 0
    bytes_delivered: int = 0
    acks_sent: int = 0
    quick_acks: int = 0  # of them sent at once because a hole had grown old (reassembly.py)
    ecn_ce_received: int = 0  # DATA packets that arrived CE-marked
    credits_sent: int = 0  # CREDIT packets (cc "credit"; ACKs carry credit too)
    requests_received: int = 0  # REQUEST packets
    reassembly_bytes: int = 0
    peak_reassembly_bytes: int = 0
    peak_reassembly_messages: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    goodput: GoodputSeries = field(default_factory=GoodputSeries)
    # New payload bytes per bin as packets are accepted: progress inside a message, which message
    # deliveries show only once per message (a 64 kB message is ~100 ms at a few Mb/s).
    arrivals: GoodputSeries = field(default_factory=GoodputSeries)

    def ev(self, ev: int) -> EvStats:
        s = self.per_ev.get(ev)
        if s is None:
            s = self.per_ev[ev] = EvStats()
        return s

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def reorder_histogram(self) -> dict[str, int]:
        hist: dict[str, int] = {}
        if self.reorder_distance:
            import numpy as np

            a = np.fromiter(self.reorder_distance, dtype=np.int64, count=len(self.reorder_distance))
            counts = np.histogram(a, bins=[*_REORDER_EDGES, np.iinfo(np.int64).max])[0]
            for lo, hi, c in zip(_REORDER_EDGES, [*_REORDER_EDGES[1:], None], counts, strict=True):
                label = f"{lo}-{hi - 1}" if hi is not None and hi - 1 > lo else (str(lo) if hi else f"{lo}+")
                hist[label] = int(c)
        return hist

    def summary(self) -> dict:
        data_seen = self.data_received + self.duplicates
        return {
            "sender": {
                "messages_sent": self.messages_sent,
                "messages_acked": self.messages_acked,
                "bytes_acked": self.bytes_acked,
                "packets_sent": self.packets_sent,
                "bytes_sent": self.bytes_sent,
                "retransmissions": self.retransmissions,
                "spurious_retransmissions": self.spurious_retransmissions,
                "spurious_retx_fraction": (
                    self.spurious_retransmissions / self.packets_sent if self.packets_sent else 0.0
                ),
                "retx_fraction": self.retransmissions / self.packets_sent if self.packets_sent else 0.0,
                "losses_detected": self.losses_detected,
                "timeouts": self.timeouts,
                "gobackn_rewinds": self.gobackn_rewinds,
                "acks_received": self.acks_received,
                "ecn_ce_echoed": self.ecn_ce_echoed,
                "rtt": percentiles(self.rtt),
                "message_completion": percentiles(self.completion),
                "loss_recovery": percentiles(self.recovery),
                "per_ev": {str(ev): s.summary() for ev, s in sorted(self.per_ev.items())},
            },
            "receiver": {
                "data_packets": self.data_received,
                "duplicates": self.duplicates,
                "out_of_order": self.out_of_order,
                "out_of_order_fraction": self.out_of_order / self.data_received if self.data_received else 0.0,
                "reorder_distance": self.reorder_histogram(),
                "messages_delivered": self.messages_delivered,
                "bytes_delivered": self.bytes_delivered,
                "acks_sent": self.acks_sent,
                "quick_acks": self.quick_acks,
                "ecn_ce_received": self.ecn_ce_received,
                "credits_sent": self.credits_sent,
                "requests_received": self.requests_received,
                "reassembly_bytes": self.reassembly_bytes,
                "peak_reassembly_bytes": self.peak_reassembly_bytes,
                "peak_reassembly_messages": self.peak_reassembly_messages,
                "dropped": dict(sorted(self.dropped.items())),
                "dropped_total": sum(self.dropped.values()),
                "datagrams_seen": data_seen,
                "goodput": self.goodput.summary(),
                "arrivals": self.arrivals.summary(),
            },
        }
