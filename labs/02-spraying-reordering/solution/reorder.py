"""Lab 2, packet spraying and reordering: SOLUTION (the answer key; students start from starter/).

Two functions over the order in which a receiver saw a flow's packets (their PSNs, 0, 1, 2, ...): how
far each late packet arrived behind (the reorder distance), and how many packets a receiver must hold
at once when it hands data over in whole messages, in order or not. Run this file to see them applied to
a sprayed transfer in fabriclab's simulated network, and, given a results directory of `fabriclab run
reordering`, next to what the emulated fabric measured:

    python lab2/reorder.py results/lab2
"""

from __future__ import annotations

import sys


def reorder_distances(arrivals: list[int]) -> list[int]:
    """For every packet that arrives after a packet with a higher PSN: the highest PSN seen before it
    minus its own PSN, in arrival order. A PSN seen before is a duplicate: it is skipped."""
    seen: set[int] = set()
    highest = -1
    out = []
    for psn in arrivals:
        if psn in seen:
            continue
        seen.add(psn)
        if psn < highest:
            out.append(highest - psn)
        else:
            highest = psn
    return out


def buffer_peak(arrivals: list[int], packets_per_message: int, ordered: bool) -> int:
    """The most packets the receiver holds at once: right after each arrival, before it hands anything
    over, count the packets in memory (the one just arrived included). Message m is PSNs
    m*k .. m*k+k-1 (k = packets_per_message). A complete message is handed over at once when
    unordered, and only once every earlier message has been handed over when ordered. Duplicates
    are dropped."""
    k = packets_per_message
    seen: set[int] = set()
    held: dict[int, int] = {}  # message -> packets of it in memory
    in_memory = 0
    next_msg = 0  # ordered: the next message to hand over
    peak = 0
    for psn in arrivals:
        if psn in seen:
            continue
        seen.add(psn)
        msg = psn // k
        held[msg] = held.get(msg, 0) + 1
        in_memory += 1
        peak = max(peak, in_memory)
        if ordered:
            while held.get(next_msg) == k:
                in_memory -= held.pop(next_msg)
                next_msg += 1
        elif held[msg] == k:
            in_memory -= held.pop(msg)
    return peak


if __name__ == "__main__":
    from labs.script import run

    sys.exit(run(2, sys.modules[__name__], sys.argv[1:]))
