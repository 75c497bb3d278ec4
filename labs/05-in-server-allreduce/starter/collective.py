"""Lab 5, your code: the ring all-reduce schedule, its bus bandwidth, its slowest edge and its rank order.

Copy this folder (`cp -r labs/05-in-server-allreduce/starter my-lab5`), fill in the TODOs, and grade
your copy with `fabriclab lab check 5 my-lab5`. The checker runs your schedule on real arrays and
compares it with fabriclab's ring (transport/collective/ring.py), checks your formulas against the transport's
bandwidth bound, and runs rings in fabriclab's simulated network in your rank order.
"""

from __future__ import annotations

from collections.abc import Sequence


def send_chunk(rank: int, step: int, n: int) -> int:
    """Which chunk rank `rank` of an `n`-rank ring sends to rank `rank + 1` at step `step`.

    Every rank's array is cut into n chunks, numbered 0 .. n-1. The ring runs 2(n-1) steps; at every
    step each rank sends one chunk to its right neighbour and receives one from its left neighbour.
    - Reduce-scatter, steps 0 .. n-2: the received chunk is ADDED to the local copy. At step 0 rank r
      sends its own chunk r; at every later step it sends on the chunk it has just received (and
      added to), so after n-1 steps each rank holds one chunk summed over all n ranks: rank r holds
      the full sum of chunk (r + 1) mod n.
    - All-gather, steps n-1 .. 2n-3: the received chunk REPLACES the local copy. Rank r first sends
      the summed chunk it holds, then passes on each chunk it receives.
    Return a chunk number in 0 .. n-1.
    """
    # TODO: one formula for the reduce-scatter steps and one for the all-gather steps.
    raise NotImplementedError("TODO: the chunk rank `rank` sends at step `step`")


def bus_bandwidth(n: int, nbytes: int, seconds: float) -> float:
    """Bus bandwidth in bit/s of an all-reduce of `nbytes` per rank over `n` ranks that took `seconds`.

    Each rank sends (and receives) 2(n-1)/n of its array: (n-1)/n in the reduce-scatter and as much
    again in the all-gather. Bus bandwidth is that traffic per second, so it can be compared with the
    rate of the link a rank sends on, whatever n is.
    """
    # TODO
    raise NotImplementedError("TODO: 2(n-1)/n * bytes * 8 / seconds")


def ring_time_bound(n: int, nbytes: int, edge_rates_bps: Sequence[float]) -> float:
    """The least time one all-reduce can take when ring edge r (rank r -> rank r+1) runs at
    `edge_rates_bps[r]` bit/s: every edge carries 2(n-1)/n of the array, and no rank can finish
    before the slowest edge has carried its share."""
    # TODO
    raise NotImplementedError("TODO: the time the slowest edge needs for its share")


def ring_order(server_of: dict[str, str]) -> list[str]:
    """Put the hosts in ring order (rank 0 first, and the last rank sends back to rank 0) so that as
    few ring edges as possible leave a server.

    `server_of` maps each host (GPU) to its server, in no particular order. An edge between two GPUs
    of one server stays on the server's local switch (fast); an edge between servers crosses the
    servers' NICs and the ToR (slow, and shared by every edge that crosses).
    """
    # TODO: keep each server's GPUs next to each other.
    raise NotImplementedError("TODO: order the hosts so that ring neighbours share a server")
