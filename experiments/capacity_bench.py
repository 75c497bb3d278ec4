"""`fabriclab bench capacity`: how fast can each fabric run and stay trusted, and what does a packet cost?

For each fabric shape (the demo's, 4x4x4 leaf-spine at 1500 and 9000 bytes, fat-tree k=4 and k=8) and
each way of running its switches (the fabric's own Open vSwitch, a private one per switch, or the
system's shared daemon), it

- measures what one switch traversal costs Open vSwitch (`emulator.traversal`: paced UDP across the
  fabric, vswitchd CPU over packets received by all switches);
- finds by bisection the highest per-host link rate at which the sprayed permutation of ecmp-vs-spray
  stays trusted (CPU idle min >= 35 % during traffic, the Mininet-HiFi rule the runner applies), and
  reports, at that rate, goodput and CPU seconds per million delivered packets per component.

Rates are searched geometrically: doubling (or halving) from a start until the verdict flips, then
bisecting between the last trusted and the first untrusted rate. Each probe is one real run.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from experiments.analysis.fidelity import CPU_REASON, STEAL_NOTE
from experiments.scenarios import ecmp_vs_spray

log = logging.getLogger(__name__)

EXPERIMENT = ecmp_vs_spray.NAME
ARM = ecmp_vs_spray.SPRAY
TRUST_IDLE = 0.35


@dataclass(frozen=True)
class Case:
    name: str
    template: str  # a topology spec with {rate} (and {fabric_rate}) for the per-host rate in Mb/s
    fabric_factor: float = 1.0  # fabric links run at this multiple of the host rate

    def spec(self, rate: float) -> str:
        return self.template.format(rate=_fmt(rate), fabric_rate=_fmt(rate * self.fabric_factor))


CASES: tuple[Case, ...] = (
    # The demo's own fabric: three hosts per leaf over two uplinks at 1.5x the host rate.
    Case("demo", "leaf-spine:spines=2,leaves=2,hosts=3,host_rate={rate},fabric_rate={fabric_rate},mtu=1500", 1.5),
    Case("4x4x4-1500", "leaf-spine:spines=4,leaves=4,hosts=4,rate={rate},mtu=1500"),
    Case("4x4x4-9000", "leaf-spine:spines=4,leaves=4,hosts=4,rate={rate},mtu=9000"),
    Case("fat-tree-k4", "fat-tree:k=4,rate={rate},mtu=9000"),
    Case("fat-tree-k8", "fat-tree:k=8,rate={rate},mtu=9000"),
)
QUICK = ("demo", "4x4x4-1500")
ISOLATIONS = ("shared", "private")  # the system's daemon against the default; "all" adds per-switch


def _fmt(x: float) -> str:
    return f"{x:.3g}"


@dataclass
class Probe:
    rate_mbps: float
    trusted: bool
    cpu_idle_min: float | None
    goodput_mbps: float | None
    goodput_of_ideal: float | None
    packets_delivered: int | None
    cpu_s_per_mpkt: dict[str, float | None] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    error: str | None = None
    # The most the hypervisor stole in a judged sample: a verdict on a busy host is the host's too.
    cpu_steal_max: float | None = None


@dataclass
class CaseResult:
    case: str
    isolation: str
    us_per_traversal: float | None
    traversal: dict[str, Any]
    capacity_mbps: float | None  # highest per-host rate found trusted (None: not even the lowest)
    first_untrusted_mbps: float | None
    at_capacity: Probe | None
    probes: list[Probe]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def probe_once(case: Case, rate: float, duration: float, out: Path) -> Probe:
    """One run of the sprayed arm at `rate` Mb/s per host."""
    from experiments import driver
    from experiments.fidelity_bench import arm_summary

    exp, topo = driver.prepare(EXPERIMENT, case.spec(rate), duration, None, None, arms=[ARM])
    rendered = driver.execute(exp, topo, out)
    arm = arm_summary(rendered.doc["arms"][0])
    return Probe(
        rate_mbps=rate, trusted=bool(arm["trusted"]) and not arm["error"], cpu_idle_min=arm["cpu_idle_min"],
        goodput_mbps=arm["goodput_mbps"], goodput_of_ideal=arm["goodput_of_ideal"],
        packets_delivered=arm["packets_delivered"], cpu_s_per_mpkt=dict(arm["cpu_s_per_mpkt"] or {}),
        reasons=list(arm["reasons"]), error=arm["error"], cpu_steal_max=arm.get("cpu_steal_max"),
    )


def search(run: Callable[[float], Probe], start: float, lo: float, hi: float, steps: int) -> list[Probe]:
    """Probes in the order run: expand from `start` by factors of 2 within [lo, hi] until the verdict
    flips, then `steps` geometric bisections between the last trusted and the first untrusted rate."""
    probes = [run(start)]
    rate = start
    if probes[-1].trusted:
        while probes[-1].trusted and rate * 2 <= hi:
            rate *= 2
            probes.append(run(rate))
    else:
        while not probes[-1].trusted and rate / 2 >= lo:
            rate /= 2
            probes.append(run(rate))
    for _ in range(steps):
        low, high = bracket(probes)
        if low is None or high is None:
            break
        probes.append(run(math.sqrt(low * high)))
    return probes


def bracket(probes: list[Probe]) -> tuple[float | None, float | None]:
    """The highest trusted rate and the lowest untrusted rate above it (None where there is none)."""
    good = [p.rate_mbps for p in probes if p.trusted]
    low = max(good) if good else None
    above = [p.rate_mbps for p in probes if not p.trusted and (low is None or p.rate_mbps > low)]
    return low, (min(above) if above else None)


def not_cpu(p: Probe) -> str | None:
    """Why an untrusted probe was untrusted when the CPU was not (or not only) the reason, in a
    clause: a failed run's error, or the runner's other verdicts (packets lost outside the queues),
    each cut before its explanation. None for a trusted probe or one the CPU alone condemned."""
    if p.trusted:
        return None
    if p.error:
        return p.error.splitlines()[0][:160]
    other = [r.split(": ", 1)[-1] for r in p.reasons if CPU_REASON not in r]
    return "; ".join(r.split(" (")[0].split(": ")[0] for r in other) or None


def summarise(case: str, isolation: str, traversal: dict[str, Any], probes: list[Probe]) -> CaseResult:
    low, high = bracket(probes)
    best = next((p for p in probes if p.trusted and p.rate_mbps == low), None)
    return CaseResult(
        case=case, isolation=isolation, us_per_traversal=traversal.get("us_per_traversal"), traversal=traversal,
        capacity_mbps=low, first_untrusted_mbps=high, at_capacity=best, probes=probes,
    )


# The links' rate while one traversal is measured, whatever rate the bisection starts from: the probe
# stays within its host's link (emulator.traversal), and on links much slower than this it carries so
# few packets that the daemons' own housekeeping, shared out over them, becomes the figure (772 µs
# per traversal on the k=8 fat-tree at 0.5 Mb/s against 176 at 4, on one machine: its ten daemons spent
# 0.2 CPU seconds a second on their own).
TRAVERSAL_RATE_MBPS = 4.0


def run_capacity_bench(cases: list[Case], isolations: list[str], out: Path, start: float = 4.0,
                       lo: float = 0.25, hi: float = 256.0, steps: int = 2, duration: float = 6.0,
                       progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    from emulator.network import ISOLATION_ENV
    from emulator.traversal import measure

    rows: list[CaseResult] = []
    saved = os.environ.get(ISOLATION_ENV)
    try:
        for case in cases:
            for isolation in isolations:
                os.environ[ISOLATION_ENV] = isolation  # the runner's fabrics follow it
                progress(f"{case.name} ({isolation}): switch traversal cost")
                traversal = measure(case.spec(TRAVERSAL_RATE_MBPS), isolation).to_dict()

                def run(rate: float, case: Case = case, isolation: str = isolation) -> Probe:
                    progress(f"{case.name} ({isolation}): sprayed permutation at {_fmt(rate)} Mb/s per host")
                    try:
                        p = probe_once(case, rate, duration, out / "capacity" / case.name / isolation)
                    except Exception as exc:  # a rate the fabric cannot even run is untrusted, and said
                        log.exception("probe failed")
                        p = Probe(rate, False, None, None, None, None, error=f"{type(exc).__name__}: {exc}")
                    stolen = p.cpu_steal_max or 0.0
                    why = not_cpu(p)
                    progress(f"  -> {'trusted' if p.trusted else 'untrusted'}{f' ({why})' if why else ''}, idle min "
                             f"{'-' if p.cpu_idle_min is None else f'{p.cpu_idle_min:.0%}'}"
                             + (f" (the hypervisor stole up to {stolen:.0%})" if stolen >= STEAL_NOTE else ""))
                    return p

                rows.append(summarise(case.name, isolation, traversal, search(run, start, lo, hi, steps)))
    finally:
        if saved is None:
            os.environ.pop(ISOLATION_ENV, None)
        else:
            os.environ[ISOLATION_ENV] = saved
    return {"experiment": EXPERIMENT, "arm": ARM, "trusted_idle_min": TRUST_IDLE, "duration_s": duration,
            "cases": [r.to_dict() for r in rows]}


COMPONENTS = ("ovs", "endpoints", "controller", "runner", "other")


def text_report(result: dict[str, Any]) -> str:
    head = (f"{'fabric':<12} {'switches':<10} {'µs/traversal':>12} {'trusted Mb/s/host':>17} {'goodput':>8}  "
            "CPU s per million packets: " + ", ".join(COMPONENTS))
    lines = [head]
    for c in result["cases"]:
        at = c["at_capacity"] or {}
        per = at.get("cpu_s_per_mpkt") or {}
        cap = "none" if c["capacity_mbps"] is None else _fmt(c["capacity_mbps"])
        if c["first_untrusted_mbps"] is not None:
            cap += f" (<{_fmt(c['first_untrusted_mbps'])})"
        us = "-" if c["us_per_traversal"] is None else f"{c['us_per_traversal']:g}"
        gp = "-" if at.get("goodput_of_ideal") is None else f"{at['goodput_of_ideal']:.0%}"
        comps = ", ".join("-" if per.get(k) is None else f"{per[k]:g}" for k in COMPONENTS)
        lines.append(f"{c['case']:<12} {c['isolation']:<10} {us:>12} {cap:>17} {gp:>8}  {comps}")
    for c in result["cases"]:
        # A verdict the CPU did not give is no capacity figure: say what gave it, once per case.
        probes = [Probe(**p) for p in c["probes"]]
        first = next((p for p in probes if not p.trusted and (c["capacity_mbps"] is None
                                                              or p.rate_mbps > c["capacity_mbps"])), None)
        why = not_cpu(first) if first else None
        if why:
            lines.append(f"{c['case']} ({c['isolation']}) at {_fmt(first.rate_mbps)} Mb/s was untrusted for "
                         f"another reason than the CPU: {why}.")
    stolen = [(c["case"], p["rate_mbps"], p["cpu_steal_max"]) for c in result["cases"] for p in c["probes"]
              if (p.get("cpu_steal_max") or 0.0) >= STEAL_NOTE]
    if stolen:
        lines.append("The hypervisor stole CPU during " + ", ".join(
            f"{case} at {_fmt(rate)} Mb/s ({share:.0%})" for case, rate, share in stolen)
            + ": those verdicts are the host's as much as the fabric's; rerun on a quieter host.")
    return "\n".join(lines)
