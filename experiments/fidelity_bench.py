"""`fabriclab bench fidelity`: does the emulator keep up with its own demo, and where does the CPU go?

Runs the ecmp-vs-spray experiment on a set of fabrics (by default the demo's own and a 16-host 4x4x4
permutation) and reports, per arm, the fidelity verdict (CPU idle min / mean over the traffic window,
the Mininet-HiFi 35 % rule), goodput as a share of what the wire format allows, and the CPU seconds each
component spent per million packets delivered to the hosts: Open vSwitch (with the kernel's forwarding
work done in its thread), the transport endpoints, the controller, the runner and everything else.
CPU seconds per million packets is microseconds per packet; the endpoints' figure (sender and
receiver processes together, from their own CPU reports) is also shown against the target of
`ENDPOINT_TARGET_US` microseconds per delivered packet, and beside it what the transport core's receive
path costs in this process back to back and after sleeping a flow's time between packets
(experiments.idle_penalty): an endpoint woken once per packet pays the second.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from experiments import idle_penalty
from experiments.scenarios import ecmp_vs_spray
from experiments.schema import ArmResult

log = logging.getLogger(__name__)

# Sender and receiver together, CPU microseconds per packet delivered to the hosts (DATA and ACKs).
ENDPOINT_TARGET_US = 30.0

EXPERIMENT = ecmp_vs_spray.NAME
# The demo's fabric (the experiment's default) and the 16-host permutation people scale up to, in
# jumbo frames: at 1500 bytes its 48 switch ports cost OVS too much per packet for two cores.
DEFAULT_CASES: tuple[tuple[str, str | None], ...] = (
    ("demo", None),
    ("permutation-4x4x4", "leaf-spine:spines=4,leaves=4,hosts=4,rate=4,mtu=9000"),
)


def arm_summary(arm: ArmResult) -> dict[str, Any]:
    """The bench's view of one arm of results.json."""
    fid = arm.get("fidelity") or {}
    budget = arm.get("cpu_budget") or {}
    return {
        "arm": arm["name"],
        "error": arm.get("error"),
        "trusted": fid.get("trusted"),
        "cpu_idle_min": fid.get("cpu_idle_min"),
        "cpu_idle_mean": fid.get("cpu_idle_mean"),
        "cpu_steal_max": fid.get("cpu_steal_max"),
        "reasons": fid.get("reasons", []),
        "goodput_mbps": round(arm.get("goodput_bps", 0.0) / 1e6, 2),
        "goodput_of_ideal": _round(arm.get("goodput_fraction")),
        "goodput_of_wire": _round(arm.get("goodput_of_wire")),
        "packets_delivered": budget.get("packets_delivered"),
        "cpu_s": budget.get("cpu_s"),
        "cpu_s_per_mpkt": budget.get("cpu_s_per_mpkt"),
        # CPU seconds per million packets = microseconds per packet.
        "endpoint_us_per_packet": (budget.get("cpu_s_per_mpkt") or {}).get("endpoints"),
    }


def flow_pace(arm: ArmResult) -> tuple[int, float] | None:
    """(datagram bytes, seconds between a flow's DATA datagrams: the median flow's) of an arm whose
    flows are the transport's; None for TCP or an arm without packets."""
    paces = sorted((f["duration_s"] / f["data_packets"], int(f["mtu"])) for f in arm.get("flows") or []
                   if f.get("data_packets") and f.get("duration_s") and f.get("mtu"))
    if not paces:
        return None
    gap, datagram = paces[(len(paces) - 1) // 2]
    return datagram, gap


def _core_probe(arm: ArmResult) -> dict[str, float] | None:
    """The core's receive path back to back and after sleeping the arm's pace (experiments.idle_penalty)."""
    pace = flow_pace(arm)
    return None if pace is None else idle_penalty.probe(*pace)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def run_fidelity_bench(cases: list[tuple[str, str | None]], duration: float | None, out: Path,
                       progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the experiment once per case; one JSON-able summary."""
    from experiments import driver

    result: dict[str, Any] = {"experiment": EXPERIMENT, "cases": []}
    for name, spec in cases:
        exp, topo = driver.prepare(EXPERIMENT, spec, duration, None, None)
        if progress:
            progress(f"{name}: {exp.topology} ({len(exp.arms)} arms, {exp.duration_s:g} s each)")
        rendered = driver.execute(exp, topo, out, None)
        doc = rendered.doc
        result["cases"].append({
            "case": name,
            "topology": exp.topology,
            "mtu": topo.mtu,
            "results": str(rendered.out_dir / "results.json"),
            "trusted": all(a.get("fidelity", {}).get("trusted") for a in doc["arms"] if not a.get("error")),
            "arms": [{**arm_summary(a), "core_receive_us": _core_probe(a)} for a in doc["arms"]],
        })
    result["trusted"] = all(c["trusted"] for c in result["cases"])
    return result


def text_report(result: dict[str, Any]) -> str:
    """A table per case: verdict, idle, goodput shares, CPU per million packets per component."""
    lines = []
    for case in result["cases"]:
        lines.append(f"{case['case']}: {case['topology']} (MTU {case['mtu']}), trusted: "
                     f"{str(case['trusted']).lower()}")
        for a in case["arms"]:
            if a["error"]:
                lines.append(f"  {a['arm']:<12} ERROR {a['error']}")
                continue
            per = a["cpu_s_per_mpkt"] or {}
            comps = ", ".join(f"{k} {v:g}" for k, v in per.items() if v is not None and k != "total")
            idle = "-" if a["cpu_idle_min"] is None else f"{a['cpu_idle_min']:.0%} min / {a['cpu_idle_mean']:.0%} mean"
            wire = "-" if a["goodput_of_wire"] is None else f"{a['goodput_of_wire']:.0%}"
            lines.append(f"  {a['arm']:<12} trusted {str(a['trusted']).lower():<5}  idle {idle}  goodput "
                         f"{a['goodput_mbps']:g} Mb/s ({wire} of wire)")
            lines.append(f"  {'':<12} CPU µs per delivered packet (= CPU s per million; {a['packets_delivered']} "
                         f"pkts): {comps}; total {per.get('total')}")
            ep = a.get("endpoint_us_per_packet")
            if ep is not None:
                verdict = "within" if ep < ENDPOINT_TARGET_US else "over"
                lines.append(f"  {'':<12} endpoints (sender + receiver): {ep:g} µs per delivered packet, {verdict} "
                             f"the target of {ENDPOINT_TARGET_US:g}")
            core = a.get("core_receive_us")
            if core:
                lines.append(f"  {'':<12} the core's receive path (a DATA datagram in, its ACK out): "
                             f"{core['back_to_back']:g} µs back to back, {core['after_gap']:g} after sleeping "
                             f"{core['gap_s'] * 1e3:.1f} ms, a flow's time between packets")
            for r in a["reasons"]:
                lines.append(f"  {'':<12} ! {r}")
    lines.append(f"overall trusted: {str(result['trusted']).lower()}")
    return "\n".join(lines)
