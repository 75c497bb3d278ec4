"""A path policy on trial in the simulated network: goodput, tail completion time and failover.

One connection sends over several equal paths (transport.sim.simnet), closed loop: a few messages always
outstanding, a new one as each completes, for a fixed time. Halfway through, the path that has carried
the most so far fails — cut (everything on it is lost) or slowed to a fraction of its rate — as the
experiments' `auto` faults pick the busiest link: a policy that keeps one path is hit, one that
spreads loses a share. Every policy meets the same network with the same seed, so the built-ins
(single, spray, adaptive) are the yardstick a user's policy (`FILE.py:ClassName`) is measured against.

A policy is graded over `GRADING`: each fault at several times, on four paths and on eight, with
several seeds, and a control without a fault, so that a policy cannot pass by knowing which path the
trial fails or when. Messages still unfinished at the end count in the tail with their age then (a
policy that stalls has an endless tail, not a short one), and a recovery counts only if it lasts to
the end. `conformance` calls every method directly, with every EV and every `avoid`, the calls a
trial may never make (a timeout on an EV never acknowledged, for one).

Everything runs on the virtual clock: a trial is deterministic for its seed and takes well under a
second of CPU (lab 6's grader runs about 30, some 10 s in all).
"""

from __future__ import annotations

import functools
import json
import numbers
import random
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from transport.core.config import PATH_POLICIES, TransportConfig
from transport.core.connection import Connection, MessageAcked
from transport.core.metrics import percentile
from transport.core.policy_plugin import describe_exception, load_class
from transport.sim.simnet import PathSpec, SimNetwork, drive

BUILTINS = PATH_POLICIES  # every registered policy is a yardstick
SETTLE_S = 0.25  # after the fault, time given to every policy before "after" goodput is counted
BIN_S = 0.05  # goodput series bin


@dataclass(frozen=True)
class Scenario:
    name: str
    # "cut": the path drops everything from fault_at on; "slow": its rate falls to rate/slow_factor;
    # "none": a control, nothing fails
    fault: str
    paths: int = 4
    rate_bps: float = 8e6
    delay_s: float = 0.001
    queue_packets: int = 32
    duration_s: float = 3.0
    fault_at_s: float = 1.0
    slow_factor: float = 4.0
    message_size: int = 16384
    outstanding: int = 8
    num_evs: int = 16

    def describe(self) -> str:
        what = "is cut" if self.fault == "cut" else f"drops to 1/{self.slow_factor:g} of its rate"
        event = "no fault" if self.fault == "none" else f"at {self.fault_at_s:g} s the busiest path {what}"
        return (f"{self.paths} paths of {self.rate_bps / 1e6:g} Mb/s, {2e3 * self.delay_s:g} ms RTT; {event}; "
                f"{self.duration_s:g} s of {self.message_size // 1024} KiB messages, {self.outstanding} outstanding")


# A cut path costs a sprayer little (what it sends there is lost at once and resent elsewhere), but
# one policy that keeps a single path loses it all. A slowed path is worse for sprayers: a quarter of
# every window waits in its queue, and only a policy that notices the delay steers around it.
SCENARIOS = (Scenario("cut", "cut"), Scenario("slow", "slow"))
CONTROL = Scenario("control", "none")


@dataclass(frozen=True)
class Case:
    """One trial of the grading set: a scenario and a seed."""

    scenario: Scenario
    seed: int

    @property
    def label(self) -> str:
        return f"{self.scenario.name} seed {self.seed}"


def _variant(sc: Scenario, tag: str, fault_at_s: float, paths: int = 4) -> Scenario:
    # Eight paths at half the rate: the same 32 Mb/s in all, so a trial costs about the same CPU.
    rate = sc.rate_bps * 4 / paths
    return replace(sc, name=f"{sc.name}-{tag}", fault_at_s=fault_at_s, paths=paths, rate_bps=rate)


# What lab 6 grades over: each fault midway, late and early, on four paths and on eight (where EV e
# is on path e % 8, not e % 4), with three seeds (where the round robins start, and so which path is
# busiest), and two controls without a fault. The built-ins run exactly these too.
GRADING = (
    *(Case(_variant(sc, tag, t, paths), seed) for sc in SCENARIOS
      for tag, t, paths, seed in (("mid", 1.0, 4, 1), ("late", 1.6, 4, 3), ("early-8", 0.7, 8, 2))),
    Case(_variant(CONTROL, "4", CONTROL.fault_at_s), 1),
    Case(_variant(CONTROL, "8", CONTROL.fault_at_s, 8), 2),
)


@dataclass
class TrialResult:
    policy: str
    scenario: str
    seed: int
    goodput_bps: float  # message bytes acknowledged over the whole run
    before_bps: float  # ... from BIN_S * 2 until the fault
    after_bps: float  # ... from SETTLE_S after the fault to the end
    kept: float  # after_bps / before_bps: how much of its goodput the policy kept through the fault
    recovery_s: float | None  # fault to the first 0.25 s back at >= 60 % of before_bps (None: never)
    # Message completion time percentiles, over the finished messages and the unfinished ones at their
    # age when the trial ended: a policy that stalls has a long tail, not a short one.
    p50_s: float | None
    p99_s: float | None
    messages: int  # finished
    failed_path: int
    fault: str | None  # the plug-in's fault (transport.core.policy_plugin), None for none
    mean_call_us: float | None
    series_bps: list[float] = field(default_factory=list)
    unfinished: int = 0  # messages sent and not acknowledged when the trial ended
    ended_s: float = 0.0  # when it ended: the duration, or the plug-in's fault with stop_on_fault

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@functools.lru_cache(maxsize=64)
def builtin_trial(policy: str, scenario: Scenario, seed: int = 1) -> TrialResult:
    """A built-in policy's trial: deterministic, so computed once per process."""
    if policy not in BUILTINS:
        raise ValueError(f"{policy!r} is not one of {', '.join(BUILTINS)}")
    return run_trial(policy, scenario, seed)


def run_trial(policy: str, scenario: Scenario, seed: int = 1, stop_on_fault: bool = False) -> TrialResult:
    """Run `policy` (a built-in's name or a plug-in spec) through `scenario` with `seed`. With
    `stop_on_fault`, a plug-in's fault ends the trial there (a grader has seen enough)."""
    sc = scenario
    paths = [PathSpec(rate_bps=sc.rate_bps, delay=sc.delay_s, queue_packets=sc.queue_packets) for _ in range(sc.paths)]
    net = SimNetwork(paths, seed=seed)
    sender = Connection(TransportConfig(path_policy=policy, num_evs=sc.num_evs), 1, seed=seed)
    receiver = Connection(TransportConfig(num_evs=sc.num_evs), 1, seed=seed + 1)
    payload = random.Random(seed).randbytes(sc.message_size)
    completions: list[float] = []
    acked: list[tuple[float, int]] = []
    failed = [-1]
    pending: dict[int, float] = {}  # message id -> when it was sent
    clock = [0.0]

    def submit(now: float) -> None:
        pending[sender.send_message(payload, now=now)] = now

    for _ in range(sc.outstanding):
        submit(0.0)

    def on_event(side: int, event: object, now: float) -> None:
        clock[0] = max(clock[0], now)
        if side == 0 and isinstance(event, MessageAcked):
            pending.pop(event.msg_id, None)
            completions.append(event.latency)
            acked.append((now, sc.message_size))
            if now < sc.duration_s:
                submit(now)

    def check(now: float) -> None:
        clock[0] = max(clock[0], now)
        if failed[0] < 0 and sc.fault != "none" and now >= sc.fault_at_s:
            sent = [link.stats.sent for link in net.links[0]]
            failed[0] = busiest = max(range(len(sent)), key=lambda i: (sent[i], -i))
            spec = paths[busiest]  # both directions share the spec: the path fails both ways
            if sc.fault == "cut":
                spec.down.append((now, float("inf")))
            else:
                spec.rate_bps = sc.rate_bps / sc.slow_factor

    policy_obj = sender.path_policy

    def done() -> bool:
        return stop_on_fault and getattr(policy_obj, "fault", None) is not None

    drive([sender, receiver], [(net, 0, 1)], done=done, time_limit=sc.duration_s, on_event=on_event, check=check)
    ended = sc.duration_s if not done() else min(clock[0], sc.duration_s)
    ages = [max(0.0, ended - t) for t in pending.values()]

    n_bins = round(sc.duration_s / BIN_S)
    series = [0.0] * n_bins
    for t, nbytes in acked:
        i = int(t / BIN_S)
        if 0 <= i < n_bins:
            series[i] += 8 * nbytes / BIN_S

    def mean_rate(t0: float, t1: float) -> float:
        bins = series[round(t0 / BIN_S): round(t1 / BIN_S)]
        return sum(bins) / len(bins) if bins else 0.0

    before = mean_rate(2 * BIN_S, sc.fault_at_s)
    after = mean_rate(sc.fault_at_s + SETTLE_S, sc.duration_s)
    # Recovered: from the first quarter second, after the fault, whose goodput is back to 60 % of
    # before, and every quarter second after it too, to the end: a recovery that does not last is
    # none. Single bins say little (a probe's loss or the packets in flight at the fault).
    span = round(SETTLE_S / BIN_S)
    recovery = None
    first = round(sc.fault_at_s / BIN_S) + 1
    if before > 0:
        for i in range(n_bins - span, first - 1, -1):
            if sum(series[i: i + span]) / span < 0.6 * before:
                break
            recovery = i * BIN_S - sc.fault_at_s
    metrics = sender.metrics()
    pstate = metrics["state"]["path_policy"]
    return TrialResult(
        policy=policy, scenario=sc.name, seed=seed,
        goodput_bps=8 * sum(n for _, n in acked) / sc.duration_s, before_bps=before, after_bps=after,
        kept=after / before if before > 0 else 0.0, recovery_s=recovery,
        p50_s=percentile(completions + ages, 50), p99_s=percentile(completions + ages, 99),
        messages=len(completions), unfinished=len(ages), ended_s=ended,
        failed_path=failed[0], fault=metrics.get("path_policy_fault"),
        mean_call_us=pstate.get("mean_call_us") if isinstance(pstate, dict) else None,
        series_bps=[round(x, 1) for x in series],
    )


# --------------------------------------------------------------------------------------------------
# Conformance: every method called directly, as the trials may never call it


@dataclass(frozen=True)
class Conformance:
    name: str
    what: str  # what was called
    problem: str | None  # None: it behaved


def conformance(spec: str, num_evs: int = 16, seed: int = 1) -> list[Conformance]:
    """Call each method of the plug-in `spec` on fresh instances: next_ev for many `now`s and with
    every `avoid`, on_ack / on_loss / on_timeout (and on_suspect, where the class has it) on every EV
    (on_timeout first on EVs never acknowledged), next_ev after each, and state() before and after (a
    dict of JSON values)."""
    cls = load_class(spec)
    evs = range(num_evs)
    results: list[Conformance] = []

    def valid(ev: Any, avoid: int | None = None) -> str | None:
        if not isinstance(ev, numbers.Integral) or isinstance(ev, bool) or not 0 <= ev < num_evs:
            return f"returned {ev!r} ({type(ev).__name__}), expected an int EV in 0..{num_evs - 1}"
        if avoid is not None and num_evs > 1 and ev == avoid:
            return f"returned {ev} when asked to avoid it (a retransmission of a packet lost on EV {ev})"
        return None

    def after(policy: Any, now: float) -> str | None:
        if results and results[0].problem is not None:
            return None  # next_ev is broken anyway, and its own check says so
        try:
            problem = valid(policy.next_ev(now))
        except (Exception, SystemExit) as exc:
            problem = f"raised {describe_exception(exc)}"
        return f"next_ev() afterwards {problem}" if problem else None

    def next_ev() -> str | None:
        p = cls(num_evs, random.Random(seed))
        for i in range(4 * num_evs):
            if problem := valid(p.next_ev(i * 1e-4) if i % 2 else p.next_ev(i * 1e-4, None)):
                return f"call {i + 1}: {problem}"
        return None

    def avoid() -> str | None:
        p = cls(num_evs, random.Random(seed))
        # Every EV as `avoid`, three times, in a shuffled order: a rotation that ignores `avoid` cannot
        # stay clear of it by keeping in step.
        order = random.Random(seed).sample(list(evs) * 3, 3 * num_evs)
        for i, a in enumerate(order):
            if problem := valid(p.next_ev(0.01 + i * 1e-4, a), a):
                return f"avoid={a}: {problem}"
        return None

    def on_ack() -> str | None:
        p = cls(num_evs, random.Random(seed))
        for i, ev in enumerate(evs):
            for rtt in (1e-5, 0.002, 0.5):
                p.on_ack(ev, rtt, 0.01 + i * 1e-3)
        return after(p, 0.1)

    def on_loss() -> str | None:
        p = cls(num_evs, random.Random(seed))
        for i, ev in enumerate(evs):
            p.on_loss(ev, 0.01 + i * 1e-4)
        return after(p, 0.02)

    def on_timeout() -> str | None:
        p = cls(num_evs, random.Random(seed))
        for i, ev in enumerate(evs):  # never acknowledged: nothing is known about these EVs yet
            p.on_timeout(ev, 0.01 + i * 1e-4)
        if problem := after(p, 0.02):
            return problem
        for ev in evs:
            p.on_ack(ev, 0.002, 0.03)
            p.on_timeout(ev, 0.04)
        return after(p, 0.05)

    def on_suspect() -> str | None:
        p = cls(num_evs, random.Random(seed))
        for i, ev in enumerate(evs):
            p.on_suspect(ev, 0.01 + i * 1e-4)
        return after(p, 0.02)

    def state() -> str | None:
        p = cls(num_evs, random.Random(seed))
        for when, policy in (("on a new policy", p), ("after feedback", _exercised(p, num_evs))):
            value = policy.state()
            if not isinstance(value, dict):
                return f"{when} returned {type(value).__name__}, expected a dict"
            try:
                json.dumps(value)
            except (TypeError, ValueError) as exc:
                return f"{when} returned a dict that is not JSON: {exc}"
        return None

    checks = [
        ("next_ev", f"next_ev(now) {4 * num_evs} times", next_ev),
        ("avoid", f"next_ev(now, avoid) with every avoid in 0..{num_evs - 1}, three times", avoid),
        ("on_ack", "on_ack(ev, rtt, now) on every EV, RTTs of 10 µs to 0.5 s", on_ack),
        ("on_loss", "on_loss(ev, now) on every EV", on_loss),
        ("on_timeout", "on_timeout(ev, now) on every EV, first on EVs never acknowledged", on_timeout),
    ]
    if callable(getattr(cls, "on_suspect", None)):  # optional: only a policy that has it is told
        checks.append(("on_suspect", "on_suspect(ev, now) on every EV", on_suspect))
    checks.append(("state", "state() on a new policy and after feedback, as JSON", state))
    for name, what, body in checks:
        try:
            problem = body()
        except (Exception, SystemExit) as exc:
            problem = f"raised {describe_exception(exc)}"
        results.append(Conformance(name, what, problem))
    return results


def _exercised(policy: Any, num_evs: int) -> Any:
    """`policy` after some of every kind of feedback; what raises here is the other checks' to report."""
    for ev in range(num_evs):
        for call, args in (("next_ev", (0.01,)), ("on_ack", (ev, 0.002, 0.02)), ("on_loss", (ev, 0.03)),
                           ("on_timeout", (ev, 0.04))):
            try:
                getattr(policy, call)(*args)
            except (Exception, SystemExit):
                pass
    return policy
