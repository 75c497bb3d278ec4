"""Lab 2, packet spraying and reordering: your code. Write the two functions marked TODO.

Both work on the order in which a receiver saw a flow's packets (their PSNs, 0, 1, 2, ...): how far
each late packet arrived behind (the reorder distance), and how many packets a receiver must hold at
once when it hands data over in whole messages, in order or not. Run this file to see them applied to
a sprayed transfer in fabriclab's simulated network, and, given a results directory of `fabriclab run
reordering`, next to what the emulated fabric measured; grade them with `fabriclab lab check 2 lab2`:

    python lab2/reorder.py results/lab2
"""

from __future__ import annotations

import sys


def reorder_distances(arrivals: list[int]) -> list[int]:
    """For every packet that arrives after a packet with a higher PSN: the highest PSN seen before it
    minus its own PSN, in arrival order. A PSN seen before is a duplicate: it is skipped."""
    # TODO: walk the arrivals keeping the highest PSN so far and the PSNs already seen.
    # Examples: [0, 1, 3, 4, 2, 5] -> [2] (2 arrived when 4 was the highest); [0, 2, 1, 1] -> [1].
    raise NotImplementedError("TODO: the reorder distance of every late packet")


def buffer_peak(arrivals: list[int], packets_per_message: int, ordered: bool) -> int:
    """The most packets the receiver holds at once: right after each arrival, before it hands anything
    over, count the packets in memory (the one just arrived included). Message m is PSNs
    m*k .. m*k+k-1 (k = packets_per_message). A complete message is handed over at once when
    unordered, and only once every earlier message has been handed over when ordered. Duplicates
    are dropped."""
    # TODO: count, per message, the packets held; after each arrival update the peak, then hand over
    # what may go. Examples with k=1: [0, 2, 3, 1] -> 3 ordered (when 1 arrives, 2 and 3 are still
    # waiting for it), 1 unordered. With k=2: [1, 2, 3, 0] -> 4 ordered, 3 unordered.
    raise NotImplementedError("TODO: the most packets held at once")


if __name__ == "__main__":
    from labs.script import run

    sys.exit(run(2, sys.modules[__name__], sys.argv[1:]))
