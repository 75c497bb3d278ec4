"""A cheat lab 6's grader once passed 8/8: round robin that ignores all feedback and, from t = 1 s, skips
the EVs that are 0 mod 4, which are the ones on the path a one-seed, one-fault-time, four-path trial
always fails. It knows the test, not the network."""

from __future__ import annotations

import random


class MyPolicy:
    def __init__(self, num_evs: int, rng: random.Random) -> None:
        self.num_evs = num_evs
        self.next = 0

    def next_ev(self, now: float, avoid: int | None = None) -> int:
        while True:
            ev = self.next
            self.next = (ev + 1) % self.num_evs
            if not (now >= 1.0 and ev % 4 == 0):
                return ev

    def on_ack(self, ev: int, rtt: float, now: float) -> None:
        pass

    def on_loss(self, ev: int, now: float) -> None:
        pass

    def on_timeout(self, ev: int, now: float) -> None:
        pass

    def state(self) -> dict:
        return {}
