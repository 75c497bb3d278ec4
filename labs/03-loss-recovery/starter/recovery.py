"""Lab 3, loss recovery: your code. Write the three functions marked TODO.

Three small models: how many packets a sender puts on the wire to deliver a transfer when some
packets are lost, with selective repeat and with go-back-N; the share of transmissions that deliver
something new under random loss (efficiency); and how likely a collective is to wait for a loss at
all. Run this file to see them in numbers and, given a results directory of `fabriclab run
loss-recovery`, next to what the emulated fabric measured; grade them with `fabriclab lab check 3 lab3`:

    python lab3/recovery.py results/lab3
"""

from __future__ import annotations

import sys


def transmissions(packets: int, lost: set[int], recovery: str, window: int) -> int:
    """Packets put on the wire to deliver PSNs 0 .. packets-1 when the first transmission of every PSN
    in `lost` is dropped (a retransmission always gets through), with `window` packets in flight.

    selective: only the lost packets are sent again. gobackn: the receiver throws away everything after
    a gap, so when PSN p is lost the sender has already sent the window p .. p+window-1 (or up to the
    last packet), all of it wasted, and sends it all again."""
    # TODO: selective repeat is one line. For go-back-N, walk the PSNs: an unlost packet costs one
    # transmission; a lost one costs the whole burst it starts, after which every packet in that burst
    # has had its first transmission (a later loss inside the burst costs nothing more). Examples with
    # 10 packets and window 4: lost {3} -> 14; lost {3, 5} -> 14; lost {3, 8} -> 16; lost {9} -> 11.
    raise NotImplementedError("TODO: count the transmissions")


def efficiency(loss: float, recovery: str, window: int) -> float:
    """Expected share of transmissions that deliver a new packet when every transmission is lost with
    probability `loss` (1.0 = nothing wasted)."""
    # TODO: selective repeat: how many tries does a packet take on average? Go-back-N: each try of the
    # next packet either gets through (probability 1-loss, one transmission) or is lost and wastes the
    # whole window; write the expected transmissions per delivered packet E as an equation in E, solve
    # it, and return 1/E.
    raise NotImplementedError("TODO: the expected efficiency")


def stall_probability(loss: float, packets: int, flows: int) -> float:
    """Probability that at least one of `flows` flows, each sending `packets` packets, loses at least
    one of them when every packet is lost with probability `loss`: the chance that a collective step,
    which ends only when all its flows are done, waits for a loss recovery."""
    # TODO: 1 minus the probability that no packet at all is lost.
    raise NotImplementedError("TODO: the chance that some flow of the step loses a packet")


if __name__ == "__main__":
    from labs.script import run

    sys.exit(run(3, sys.modules[__name__], sys.argv[1:]))
