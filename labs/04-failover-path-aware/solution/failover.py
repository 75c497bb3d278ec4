"""SOLUTION to lab 4 (the answer key): a broken-path detector and the time to recover.

The thresholds below are one good choice, not the only one: the checker accepts any detector that
names exactly the EVs of the broken paths in its simulated scenarios.
"""

from __future__ import annotations

from collections.abc import Sequence

# Fewer packets than this in the window say too little to judge an EV on.
MIN_PACKETS = 10
# A path losing more than this share is broken; a healthy one loses a packet or two per hundred.
MAX_LOSS_SHARE = 0.1
# Queues alone can make one healthy path's median RTT twice another's; three times is a slow path.
RTT_FACTOR = 3.0


def paths_to_avoid(window: dict[int, dict]) -> set[int]:
    judged = {ev: w for ev, w in window.items() if w["packets_sent"] >= MIN_PACKETS}
    rtts = [w["rtt_p50"] for w in judged.values() if w["rtt_p50"] is not None]
    best = min(rtts) if rtts else None
    bad = set()
    for ev, w in judged.items():
        lossy = w["losses"] / w["packets_sent"] > MAX_LOSS_SHARE
        slow = best is not None and w["rtt_p50"] is not None and w["rtt_p50"] > RTT_FACTOR * best
        if lossy or slow:
            bad.add(ev)
    # When most paths look bad the fault is shared (the sender's own link, the receiver): moving
    # traffic between paths cannot help, and avoiding nearly all of them would pile it onto the rest.
    if 2 * len(bad) > len(window):
        return set()
    return bad


def time_to_recover(times: Sequence[float], rates: Sequence[float], fault_t: float, baseline: float,
                    threshold: float = 0.9) -> float | None:
    target = threshold * baseline
    after = [(t, r) for t, r in zip(times, rates, strict=False) if t >= fault_t]
    for i, (t, r) in enumerate(after):
        lasting = i + 1 == len(after) or after[i + 1][1] >= target
        if r >= target and lasting:
            return t - fault_t
    return None
