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

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def fidelity_verdict(idle: Iterable[float], switch_pps: float, drops_outside: int, packets: int,
                     ceiling: float = OVS_CEILING_PPS, servers_idle: dict[str, float] | None = None) -> Fidelity:
    """Whether the emulator kept up: CPU idle above MIN_IDLE, OVS below its ceiling, no stray drops;
    across servers, every server's CPU idle over the traffic above MIN_IDLE too (`servers_idle`)."""
    idle = [x for x in idle if x is not None]
    lo = min(idle) if idle else None
    mean = float(np.mean(idle)) if idle else None
    reasons = []
    if lo is not None and lo < MIN_IDLE:
        reasons.append(f"CPU idle fell to {lo:.0%} (under {MIN_IDLE:.0%}): the emulator, not the fabric, "
                       "may be the bottleneck; lower the link rates or the number of flows")
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
    )
