"""A path policy on trial in the simulated network: goodput, tail completion time and failover.

One connection sends over several equal paths (transport.sim.simnet), closed loop: a few messages always
outstanding, a new one as each completes, for a fixed time. Halfway through, the path that has carried
the most so far fails — cut (everything on it is lost) or slowed to a fraction of its rate — as the
experiments' `auto` faults pick the busiest link: a policy that keeps one path is hit, one that
spreads loses a share. Every policy meets the same network with the same seed, so the built-ins
(single, spray, adaptive) are the yardstick a user's policy (`FILE.py:ClassName`) is measured against.

Everything runs on the virtual clock: a trial is deterministic for its seed and takes well under a
second of CPU (lab 6's grader runs a dozen).
"""

from __future__ import annotations

import functools
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from transport.core.config import PATH_POLICIES, TransportConfig
from transport.core.connection import Connection, MessageAcked
from transport.core.metrics import percentile
from transport.sim.simnet import PathSpec, SimNetwork, drive

BUILTINS = PATH_POLICIES  # every registered policy is a yardstick
SETTLE_S = 0.25  # after the fault, time given to every policy before "after" goodput is counted
BIN_S = 0.05  # goodput series bin


@dataclass(frozen=True)
class Scenario:
    name: str
    fault: str  # "cut": the path drops everything from fault_at on; "slow": its rate falls to rate/slow_factor
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
        return (f"{self.paths} paths of {self.rate_bps / 1e6:g} Mb/s, {2e3 * self.delay_s:g} ms RTT; at "
                f"{self.fault_at_s:g} s the busiest path {what}; {self.duration_s:g} s of {self.message_size // 1024} "
                f"KiB messages, {self.outstanding} outstanding")


# A cut path costs a sprayer little (what it sends there is lost at once and resent elsewhere), but
# one policy that keeps a single path loses it all. A slowed path is worse for sprayers: a quarter of
# every window waits in its queue, and only a policy that notices the delay steers around it.
SCENARIOS = (Scenario("cut", "cut"), Scenario("slow", "slow"))


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
    p50_s: float | None  # message completion time percentiles (transport.core.metrics.percentile)
    p99_s: float | None
    messages: int
    failed_path: int
    fault: str | None  # the plug-in's fault (transport.core.policy_plugin), None for none
    mean_call_us: float | None
    series_bps: list[float] = field(default_factory=list)

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

    def submit(now: float) -> None:
        sender.send_message(payload, now=now)

    for _ in range(sc.outstanding):
        submit(0.0)

    def on_event(side: int, event: object, now: float) -> None:
        if side == 0 and isinstance(event, MessageAcked):
            completions.append(event.latency)
            acked.append((now, sc.message_size))
            if now < sc.duration_s:
                submit(now)

    def check(now: float) -> None:
        if failed[0] < 0 and now >= sc.fault_at_s:
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
    # Recovered: the first quarter second, from the bin after the fault's on, whose goodput is back to
    # 60 % of before. Single bins say little (a probe's loss or the packets in flight at the fault).
    span = round(SETTLE_S / BIN_S)
    recovery = None
    for i in range(round(sc.fault_at_s / BIN_S) + 1, n_bins - span + 1):
        if before > 0 and sum(series[i: i + span]) / span >= 0.6 * before:
            recovery = i * BIN_S - sc.fault_at_s
            break
    metrics = sender.metrics()
    pstate = metrics["state"]["path_policy"]
    return TrialResult(
        policy=policy, scenario=sc.name, seed=seed,
        goodput_bps=8 * sum(n for _, n in acked) / sc.duration_s, before_bps=before, after_bps=after,
        kept=after / before if before > 0 else 0.0, recovery_s=recovery,
        p50_s=percentile(completions, 50), p99_s=percentile(completions, 99), messages=len(completions),
        failed_path=failed[0], fault=metrics.get("path_policy_fault"),
        mean_call_us=pstate.get("mean_call_us") if isinstance(pstate, dict) else None,
        series_bps=[round(x, 1) for x in series],
    )
