"""A cheat lab 6's grader once passed 8/8: spraying that ignores all feedback (even `avoid`) and, from
t = 1 s, skips the EVs that are 0 mod 4, which are the ones on the path a one-seed, one-fault-time,
four-path trial always failed. It knows the test, not the network."""

from __future__ import annotations

from transport.core.paths import Spray


class MyPolicy(Spray):
    def next_ev(self, now: float, avoid: int | None = None) -> int:
        while True:
            ev = super().next_ev(now)
            if not (now >= 1.0 and ev % 4 == 0):
                return ev
