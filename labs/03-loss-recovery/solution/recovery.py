"""Lab 3, loss recovery: SOLUTION (the answer key; students start from starter/).

Three small models: how many packets a sender puts on the wire to deliver a transfer when some
packets are lost, with selective repeat and with go-back-N; the share of transmissions that deliver
something new under random loss (efficiency); and how likely a collective is to wait for a loss at
all. Run this file to see them in numbers and, given a results directory of `fabriclab run
loss-recovery`, next to what the emulated fabric measured:

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
    lost = {p for p in lost if 0 <= p < packets}
    if recovery == "selective":
        return packets + len(lost)
    if recovery != "gobackn":
        raise ValueError(f"unknown recovery {recovery!r}: use selective or gobackn")
    sent, psn = 0, 0
    while psn < packets:
        if psn in lost:
            burst = range(psn, min(psn + window, packets))
            sent += len(burst)
            lost.difference_update(burst)  # their first transmission is spent: the resend gets through
        else:
            sent += 1
            psn += 1
    return sent


def efficiency(loss: float, recovery: str, window: int) -> float:
    """Expected share of transmissions that deliver a new packet when every transmission is lost with
    probability `loss` (1.0 = nothing wasted).

    selective: each packet takes 1/(1-p) tries on average. gobackn: each try of the next packet either
    gets through (probability 1-p, one transmission) or is lost and wastes the whole window (window
    transmissions): E[transmissions per packet] = 1 + p*window/(1-p)."""
    if recovery == "selective":
        return 1.0 - loss
    if recovery != "gobackn":
        raise ValueError(f"unknown recovery {recovery!r}: use selective or gobackn")
    return (1.0 - loss) / (1.0 - loss + loss * window)


def stall_probability(loss: float, packets: int, flows: int) -> float:
    """Probability that at least one of `flows` flows, each sending `packets` packets, loses at least
    one of them when every packet is lost with probability `loss`: the chance that a collective step,
    which ends only when all its flows are done, waits for a loss recovery."""
    return 1.0 - (1.0 - loss) ** (packets * flows)


if __name__ == "__main__":
    from labs.script import run

    sys.exit(run(3, sys.modules[__name__], sys.argv[1:]))
