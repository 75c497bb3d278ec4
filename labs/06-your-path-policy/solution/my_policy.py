"""SOLUTION (the answer key of lab 6): spraying that rests the entropy values that misbehave.

Every packet goes on the next EV in turn, like `spray`, skipping the EVs that are resting. An EV rests
after a loss or a timeout (its path may be cut), or when its smoothed RTT climbs above twice the
typical EV's (its path is queueing: a hot link shows up as delay long before it drops anything).
A rest lasts a few RTTs and doubles each time the EV misbehaves again soon after coming back, so a
dead or slow path gets only the odd probe packet, while a path that heals is back in use within a
few round trips. A packet overdue on an EV (the optional hook on_suspect: later packets on other EVs
were acknowledged, this one not, a round trip on) gives the EV a short pause, no rest: it may only be
late, but if its path died the pause keeps new packets off it until the loss is declared.
"""

from __future__ import annotations

import random

MIN_REST_S = 0.005  # never rest for less than this: the transport's own timer floor (rto_min)
REST_RTTS = 8.0  # a rest lasts this many typical RTTs (times the back-off)
PAUSE_RTTS = 4.0  # an EV with a packet overdue gets no new packets for this many typical RTTs
SLOW_FACTOR = 2.0  # an EV whose smoothed RTT is above this many times the typical one is queueing
MAX_BACKOFF = 64


class MyPolicy:
    def __init__(self, num_evs: int, rng: random.Random) -> None:
        self.num_evs = num_evs
        self.next = rng.randrange(num_evs)  # where the round robin starts
        self.srtt: list[float | None] = [None] * num_evs  # smoothed RTT per EV (None: not known)
        self.rest_until = [0.0] * num_evs
        self.pause_until = [0.0] * num_evs
        self.backoff = [1] * num_evs
        self.rests = [0] * num_evs  # how often each EV was rested (shown in the metrics)

    def next_ev(self, now: float, avoid: int | None = None) -> int:
        for _ in range(self.num_evs):
            ev = self.next
            self.next = (ev + 1) % self.num_evs
            if ev != avoid and self.rest_until[ev] <= now and self.pause_until[ev] <= now:
                return ev
        # Every EV is resting: take the one back soonest (not the one to avoid, if there is another).
        others = [e for e in range(self.num_evs) if e != avoid] or [0]
        return min(others, key=lambda e: self.rest_until[e])

    def on_ack(self, ev: int, rtt: float, now: float) -> None:
        prev = self.srtt[ev]
        self.srtt[ev] = rtt if prev is None else 0.875 * prev + 0.125 * rtt
        typical = self._typical_rtt()
        if typical is not None and self.srtt[ev] > SLOW_FACTOR * typical:
            self._rest(ev, now)
            self.srtt[ev] = None  # judge the EV afresh when it comes back

    def on_loss(self, ev: int, now: float) -> None:
        self._rest(ev, now)

    def on_timeout(self, ev: int, now: float) -> None:
        self._rest(ev, now)

    def on_suspect(self, ev: int, now: float) -> None:
        self.pause_until[ev] = now + max(MIN_REST_S, PAUSE_RTTS * (self._typical_rtt() or MIN_REST_S))

    def state(self) -> dict:
        return {"rests": list(self.rests), "backoff": list(self.backoff)}

    def _typical_rtt(self) -> float | None:
        # The median, not the minimum: the best of sixteen noisy estimates is an outlier itself, and
        # measured against it every EV would look slow now and then.
        known = sorted(r for r in self.srtt if r is not None)
        return known[len(known) // 2] if known else None

    def _rest(self, ev: int, now: float) -> None:
        if self.rest_until[ev] > now:
            return  # already resting: one episode, one rest
        rest = max(MIN_REST_S, REST_RTTS * (self._typical_rtt() or MIN_REST_S))
        # Misbehaving again soon after the last rest ended: the path is still bad, so rest longer.
        if now - self.rest_until[ev] < rest * self.backoff[ev]:
            self.backoff[ev] = min(2 * self.backoff[ev], MAX_BACKOFF)
        else:
            self.backoff[ev] = 1
        self.rest_until[ev] = now + rest * self.backoff[ev]
        self.rests[ev] += 1
