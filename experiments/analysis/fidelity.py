"""Whether the emulator kept up during an arm: CPU idle, switch load against userspace OVS's
ceiling, drops outside the shaped queues; the verdict and its reasons."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

# Below this CPU idle fraction the emulator cannot be trusted: Mininet-HiFi's rule of thumb (35 %).
MIN_IDLE = 0.35
# Userspace OVS on this class of machine moves about 90-100 kpps over all switch traversals.
OVS_CEILING_PPS = 90_000.0
# "Near" the ceiling: above this share of it, forwarding itself may be what limits the run.
CEILING_WARN = 0.8
# Drops outside the shaped queues above this share of the packets forwarded make results suspect.
OUTSIDE_DROP_WARN = 0.001
# A CPU shortage is said to come partly from the host when the hypervisor stole at least this share of
# the machine's time in the worst sample (a cloud VM on a busy host: other guests ran meanwhile).
STEAL_NOTE = 0.05
# How the low-idle reason begins: what tells it from the other reasons (experiments.capacity_bench).
CPU_REASON = "CPU idle fell"


@dataclass
class Fidelity:
    cpu_idle_min: float | None
    cpu_idle_mean: float | None
    switch_pps_peak: float
    ovs_ceiling_pps: float
    drops_outside_queues: int
    packets_forwarded: int
    trusted: bool
    reasons: list[str]
    # The largest share of the machine's time the hypervisor gave other guests in a judged sample:
    # counted as busy (the emulator lost that time all the same), reported so a verdict says why.
    cpu_steal_max: float | None = None

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def fidelity_verdict(idle: Iterable[float], switch_pps: float, drops_outside: int, packets: int,
                     ceiling: float = OVS_CEILING_PPS, servers_idle: dict[str, float] | None = None,
                     steal: Iterable[float | None] | None = None) -> Fidelity:
    """Whether the emulator kept up: CPU idle above MIN_IDLE, OVS below its ceiling, no stray drops;
    across servers, every server's CPU idle over the traffic above MIN_IDLE too (`servers_idle`).
    `steal`, sample for sample with `idle`: the share the hypervisor stole, which a low-idle reason names."""
    pairs = list(zip(idle, steal, strict=True)) if steal is not None else [(x, None) for x in idle]
    pairs = [(x, s) for x, s in pairs if x is not None]
    idle = [x for x, _ in pairs]
    stolen = [s for _, s in pairs if s is not None]
    lo = min(idle) if idle else None
    mean = float(np.mean(idle)) if idle else None
    reasons = []
    if lo is not None and lo < MIN_IDLE:
        reason = (f"{CPU_REASON} to {lo:.0%} (under {MIN_IDLE:.0%}): the emulator, not the fabric, "
                  "may be the bottleneck; lower the link rates or the number of flows")
        worst_steal = next((s for x, s in pairs if x == lo and s is not None), None)
        if worst_steal is not None and worst_steal >= STEAL_NOTE:
            reason += (f" (in that sample the hypervisor gave {worst_steal:.0%} of this machine's CPU to other "
                       "guests: on a quieter host the same run may keep up)")
        reasons.append(reason)
    for server, share in sorted((servers_idle or {}).items()):
        if share < MIN_IDLE:
            reasons.append(f"server {server}'s CPU was {share:.0%} idle over the traffic (under {MIN_IDLE:.0%}): "
                           "it could not keep up; place fewer switches on it or lower the rates")
    if switch_pps >= CEILING_WARN * ceiling:
        reasons.append(f"switches forwarded {switch_pps / 1e3:.0f} kpps, near userspace OVS's ceiling of "
                       f"~{ceiling / 1e3:.0f} kpps: lower the link rates")
    if packets > 0 and drops_outside > OUTSIDE_DROP_WARN * packets:
        reasons.append(f"{drops_outside} packets were lost outside the shaped queues (socket buffers, OVS "
                       "itself, or sent and never received with no queue dropping them): the hosts or "
                       "switches could not keep up; lower the rates")
    return Fidelity(
        cpu_idle_min=None if lo is None else round(lo, 4),
        cpu_idle_mean=None if mean is None else round(mean, 4),
        switch_pps_peak=round(switch_pps, 1),
        ovs_ceiling_pps=ceiling,
        drops_outside_queues=int(drops_outside),
        packets_forwarded=int(packets),
        trusted=not reasons,
        reasons=reasons,
        cpu_steal_max=round(max(stolen), 4) if stolen else None,
    )


def simulated_verdict(switch_pps: float, drops_outside: int, packets: int) -> Fidelity:
    """A simulated arm's verdict: the virtual clock waits for the CPU, so every link keeps its timing
    and nothing is lost outside the modelled queues (a loss there is a bug, and says so)."""
    reasons = []
    if drops_outside:
        reasons.append(f"{drops_outside} packets vanished outside the simulated queues: a bug in the simulator")
    return Fidelity(cpu_idle_min=None, cpu_idle_mean=None, switch_pps_peak=round(switch_pps, 1),
                    ovs_ceiling_pps=OVS_CEILING_PPS, drops_outside_queues=int(drops_outside),
                    packets_forwarded=int(packets), trusted=not reasons, reasons=reasons)
