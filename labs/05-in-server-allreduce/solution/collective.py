"""SOLUTION to lab 5 (the answer key): the ring schedule, bus bandwidth, the slowest-edge bound and a
server-local rank order. transport/collective/ring.py and transport/io/allreduce.py hold the same formulas.
"""

from __future__ import annotations

from collections.abc import Sequence


def send_chunk(rank: int, step: int, n: int) -> int:
    if step < n - 1:
        # Reduce-scatter: chunk r at step 0, then the chunk received one step earlier, (r-1) - (g-1).
        return (rank - step) % n
    # All-gather: at its first step rank r sends the chunk it finished summing, r + 1, then passes on.
    return (rank + 1 - (step - (n - 1))) % n


def _share_bits(n: int, nbytes: int) -> float:
    """Bits each rank sends in one all-reduce: 2(n-1)/n of its array."""
    return 2 * (n - 1) / n * nbytes * 8


def bus_bandwidth(n: int, nbytes: int, seconds: float) -> float:
    return _share_bits(n, nbytes) / seconds


def ring_time_bound(n: int, nbytes: int, edge_rates_bps: Sequence[float]) -> float:
    return _share_bits(n, nbytes) / min(edge_rates_bps)


def ring_order(server_of: dict[str, str]) -> list[str]:
    # Group by server (servers and GPUs in a stable order): only the edge from each server's last GPU
    # to the next server's first leaves a server, so k servers cost k crossing edges, the fewest a
    # ring through all of them can have.
    return sorted(server_of, key=lambda host: (server_of[host], host))
