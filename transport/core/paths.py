"""Path (entropy value) policies: which EV each packet is sent on, and per-EV feedback.

The connection asks ``next_ev(now, avoid=...)`` for every transmission and reports per-EV
outcomes (``on_ack``, ``on_loss``, ``on_timeout``, and, to a policy that has it, ``on_suspect`` for
a packet overdue but not yet lost), the shape of the UEC simulator's ``nextEntropy()`` /
``processEv()``. The EV becomes the UDP source port, which the fabric hashes
(ECMP) or maps to an uplink (spray).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Protocol

from transport.core.registry import Registry
from transport.core.rtt import RttEstimator


class PathPolicy(Protocol):
    name: str

    def next_ev(self, now: float, avoid: int | None = None) -> int: ...

    def on_ack(self, ev: int, rtt: float, now: float) -> None: ...

    def on_loss(self, ev: int, now: float) -> None: ...

    def on_timeout(self, ev: int, now: float) -> None: ...

    def state(self) -> dict: ...


class _Oblivious:
    """A policy that ignores feedback: the EV choice does not depend on what the paths do."""

    def on_ack(self, ev: int, rtt: float, now: float) -> None:
        pass

    def on_loss(self, ev: int, now: float) -> None:
        pass

    def on_timeout(self, ev: int, now: float) -> None:
        pass


class SinglePath(_Oblivious):
    """One EV for the whole connection, drawn from the rng: what ECMP hashing does to a flow.

    A retransmission asked to avoid that EV goes on the next one, so a dead path cannot hold a
    packet hostage; new packets stay on the chosen EV.
    """

    name = "single"

    def __init__(self, num_evs: int, rng: random.Random) -> None:
        self.num_evs = num_evs
        self.ev = rng.randrange(num_evs)

    def next_ev(self, now: float, avoid: int | None = None) -> int:
        if avoid == self.ev and self.num_evs > 1:
            return (self.ev + 1) % self.num_evs
        return self.ev

    def state(self) -> dict:
        return {"ev": self.ev}


class Spray(_Oblivious):
    """Round-robin over all EVs, starting at a random one (oblivious packet spraying)."""

    name = "spray"

    def __init__(self, num_evs: int, rng: random.Random) -> None:
        self.num_evs = num_evs
        self._next = rng.randrange(num_evs)

    def next_ev(self, now: float, avoid: int | None = None) -> int:
        ev = self._next
        self._next = (ev + 1) % self.num_evs
        if ev == avoid and self.num_evs > 1:
            ev = self._next
            self._next = (ev + 1) % self.num_evs
        return ev

    def state(self) -> dict:
        return {}


class Adaptive:
    """SRD-like adaptive spraying: round-robin over the EVs currently in good standing.

    An EV that loses a packet or times out is benched for a cool-down; repeated offences soon after
    coming back double the cool-down (up to ``max_backoff``), so a dead path carries only the occasional
    probe packet. An EV whose smoothed RTT exceeds ``rtt_factor`` times the *median* EV's is benched
    too, for half as long and softly: the median, not the best, because queueing that every path shares
    (the sender's own window, a last hop all paths end on) inflates every EV alike and says nothing
    about one path, and judged against the best EV most of them looked slow and were benched, leaving
    one or two EVs to carry everything. An EV with a packet overdue (``on_suspect``: later packets on
    other EVs were acknowledged, this one not, past its round trip and variation) gets no new packets for
    ``suspect_rtts`` best RTTs, without counting as an offence: a dead path's packets are declared lost
    only a reordering allowance later, and until then each EV it owns would go on taking its share.
    When every EV is benched or overdue, the softly benched (slow or overdue, not losing) ones carry
    the traffic before any benched for loss; the cool-down scales with the best RTT so the policy
    behaves the same on slow and fast fabrics.

    An EV back from a cool-down for loss is on probation: it carries one packet, then nothing for
    ``suspect_rtts`` best RTTs unless that packet is acknowledged (``on_delivered``, for the EVs in
    ``probing``), which restores it at once. Without probation every EV a cut benched came back
    together, a cool-down later, each with its share of the traffic, and half of it died again
    until each was found overdue once more: a second dip as deep as the first.
    """

    name = "adaptive"
    # It sends nothing new on an EV with an overdue packet, so loss recovery may leave such packets
    # out of the window (transport.core.recovery).
    avoids_overdue = True

    def __init__(
        self,
        num_evs: int,
        rng: random.Random,
        *,
        cooldown_rtts: float = 16.0,
        min_cooldown: float = 0.002,
        rtt_factor: float = 2.0,
        max_backoff: int = 64,
        suspect_rtts: float = 4.0,
    ) -> None:
        self.num_evs = num_evs
        self._next = rng.randrange(num_evs)
        self.cooldown_rtts = cooldown_rtts
        self.min_cooldown = min_cooldown
        self.rtt_factor = rtt_factor
        self.max_backoff = max_backoff
        # Per-EV RTT of its own, not loss recovery's: an EV benched for an inflated RTT starts afresh.
        self.rtt: dict[int, RttEstimator] = {}
        self.benched_until = [float("-inf")] * num_evs
        self.lossy_until = [float("-inf")] * num_evs  # the part of benched_until owed to loss or timeout
        self.backoff = [1] * num_evs
        self.penalties = [0] * num_evs
        self.suspect_rtts = suspect_rtts
        self.suspect_until = [float("-inf")] * num_evs
        self.on_probation = [False] * num_evs  # benched for loss and not yet seen to deliver since
        self.probing: set[int] = set()  # EVs on probation with a packet out (see on_delivered)

    def _best_rtt(self) -> float | None:
        known = [est.srtt for est in self.rtt.values() if est.srtt is not None]
        return min(known) if known else None

    def _typical_rtt(self) -> float | None:
        """The median EV's smoothed RTT, once three EVs have one."""
        known = sorted(est.srtt for est in self.rtt.values() if est.srtt is not None)
        return known[len(known) // 2] if len(known) >= 3 else None

    def _penalise(self, ev: int, now: float, weight: float = 1.0) -> None:
        if not 0 <= ev < self.num_evs or self.benched_until[ev] > now:
            return  # already benched: one episode is one offence
        best = self._best_rtt() or self.min_cooldown / self.cooldown_rtts
        cooldown = max(self.min_cooldown, self.cooldown_rtts * best) * weight
        # An offence soon after the last cool-down ended means the path is still bad: back off more.
        if now - self.benched_until[ev] < cooldown * self.backoff[ev]:
            self.backoff[ev] = min(self.backoff[ev] * 2, self.max_backoff)
        else:
            self.backoff[ev] = 1
        self.benched_until[ev] = now + cooldown * self.backoff[ev]
        self.penalties[ev] += 1

    def next_ev(self, now: float, avoid: int | None = None) -> int:
        n = self.num_evs
        benched, suspect = self.benched_until, self.suspect_until
        for _ in range(n):
            ev = self._next
            self._next = (ev + 1) % n
            if ev != avoid and benched[ev] <= now and suspect[ev] <= now:
                if self.on_probation[ev]:
                    # One packet, then wait for its ACK (or the suspect spell) before the next.
                    suspect[ev] = now + self._probe_wait()
                    self.probing.add(ev)
                return ev
        # Every EV is benched or overdue: those slow or overdue, not losing, carry the traffic.
        lossy = self.lossy_until
        for _ in range(n):
            ev = self._next
            self._next = (ev + 1) % n
            if ev != avoid and lossy[ev] <= now:
                return ev
        # Everything lost packets lately (or only the avoided EV is usable): take the one back soonest.
        candidates = [e for e in range(n) if e != avoid] or [0]
        return min(candidates, key=lambda e: self.lossy_until[e])

    def on_ack(self, ev: int, rtt: float, now: float) -> None:
        if not 0 <= ev < self.num_evs:
            return
        if self.on_probation[ev]:
            self.on_delivered(ev, now)
        est = self.rtt.get(ev)
        if est is None:
            est = self.rtt[ev] = RttEstimator()
        est.update(rtt)
        typical = self._typical_rtt()
        if typical is not None and est.srtt > self.rtt_factor * typical:  # type: ignore[operator]
            self._penalise(ev, now, weight=0.5)
            # Forget the inflated estimate so the probe after the cool-down is judged afresh.
            del self.rtt[ev]

    def _probe_wait(self) -> float:
        best = self._best_rtt() or self.min_cooldown
        return max(self.min_cooldown, self.suspect_rtts * best)

    def on_suspect(self, ev: int, now: float) -> None:
        if 0 <= ev < self.num_evs:
            self.suspect_until[ev] = now + self._probe_wait()

    def on_delivered(self, ev: int, now: float) -> None:
        """A packet sent on ``ev`` while it was on probation was acknowledged: the path works again."""
        if 0 <= ev < self.num_evs and self.on_probation[ev]:
            self.on_probation[ev] = False
            self.probing.discard(ev)
            self.suspect_until[ev] = float("-inf")

    def _benched_for_loss(self, ev: int, now: float, weight: float) -> None:
        self._penalise(ev, now, weight)
        if 0 <= ev < self.num_evs:
            self.lossy_until[ev] = self.benched_until[ev]
            self.on_probation[ev] = True
            self.probing.discard(ev)

    def on_loss(self, ev: int, now: float) -> None:
        self._benched_for_loss(ev, now, 1.0)

    def on_timeout(self, ev: int, now: float) -> None:
        self._benched_for_loss(ev, now, 2.0)

    def state(self) -> dict:
        return {"penalties": list(self.penalties), "backoff": list(self.backoff)}


def is_plugin(name: str) -> bool:
    """A user's own policy, `FILE.py:ClassName` (transport.core.policy_plugin), rather than a registered name."""
    return isinstance(name, str) and ".py:" in name


PolicyFactory = Callable[[int, random.Random], PathPolicy]

# The path policies by name: `factory(num_evs, rng)`. A user's own policy needs no registration: a
# `FILE.py:ClassName` spec stands wherever a name does (transport.core.policy_plugin.make_policy).
POLICIES: Registry[PolicyFactory] = Registry("path policy")
POLICIES.register("single", SinglePath, "one EV per connection: what ECMP does to a flow")
POLICIES.register("spray", Spray, "rotate over all EVs, packet by packet")
POLICIES.register("adaptive", Adaptive, "spray over the EVs in good standing, bench those with loss or high delay")


def make_builtin_policy(name: str, num_evs: int, rng: random.Random) -> PathPolicy:
    """The registered policy `name`; ValueError naming the choices for an unknown one."""
    return POLICIES.get(name)(num_evs, rng)
