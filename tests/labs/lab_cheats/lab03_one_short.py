"""Lab 3 with go-back-N that resends one packet too few per loss (window - 1), and selective repeat
counting one transmission too many, on top of the lab's solution: within the 2 % the checker used to
allow on every case.
"""

from __future__ import annotations


def transmissions(packets: int, lost: set[int], recovery: str, window: int) -> int:
    lost = {p for p in lost if 0 <= p < packets}
    if recovery == "selective":
        return packets + len(lost) + 1
    sent, psn = 0, 0
    while psn < packets:
        if psn in lost:
            burst = range(psn, min(psn + window, packets))
            sent += max(1, len(burst) - 1)
            lost.difference_update(burst)
        else:
            sent += 1
            psn += 1
    return sent
