"""In-server: GPU latency and ring all-reduce through the local switch vs the ToR hairpin."""

from __future__ import annotations

from typing import Any

from experiments.model import Arm, Experiment, Workload
from experiments.scenarios.common import allreduce_summary, ok_arms, secs
from experiments.schema import ArmResult, ResultsDocument
from topologies import Topology

NAME = "in-server"
SUMMARY = "GPU latency and all-reduce through the local switch vs the ToR hairpin"
ROUTES = ("local", "via-tor")  # the routing modes compared; each has a ping and an all-reduce arm


def ping_arm(mode: str) -> str:
    return f"ping-{mode}"


def allreduce_arm(mode: str) -> str:
    return f"allreduce-{mode}"


def build() -> Experiment:
    pairs = (("s1g1", "s1g2"),)
    ring = tuple((f"s1g{i}", f"s1g{i % 4 + 1}") for i in range(1, 5))
    # 256 KiB per rank: 126 ms an iteration through the local switch at its 25 Mb/s, ~2.5 s via the ToR.
    ar = Workload(pattern="pairs", pairs=ring, elements=65536, iterations=3)
    return Experiment(
        name=NAME,
        title="In-server: GPU to GPU through the local switch vs the ToR hairpin",
        description="Latency (ping) between two GPUs of one server, and a ring all-reduce among four of "
        "its GPUs, routed through the server's local switch (NVSwitch-like) or up to the ToR and back.",
        # A quarter of the builder's rates (as `hierarchical`), in jumbo frames: four GPU edges at the
        # builder's 100 Mb/s in 1,500-byte frames left 5-10 % of two cores idle (the emulator, not the
        # links, set the pace); at 25 Mb/s in 9,000-byte frames they leave 73-86 %.
        topology="in-server:servers=2,gpus=8,gpu_rate=25,nic_rate=5",
        arms=[
            Arm(ping_arm("local"), kind="ping", mode="local"),
            Arm(ping_arm("via-tor"), kind="ping", mode="via-tor"),
            Arm(allreduce_arm("local"), kind="allreduce", mode="local", policy="spray", workload=ar),
            Arm(allreduce_arm("via-tor"), kind="allreduce", mode="via-tor", policy="spray", workload=ar),
        ],
        workload=Workload(pattern="pairs", pairs=pairs),
        duration_s=3.0,
        seed=1,
    )


def ping_latency(arm: ArmResult) -> dict[str, float | None]:
    """A ping arm's RTT figures (its flow's minimum, median and mean, s): the minimum counts the switches
    a ping crosses, the median and the mean also carry the emulator's wake-ups."""
    f = next((f for f in arm.get("flows", []) if f.get("rtt_avg_s") is not None), {})
    return {k: f.get(k) for k in ("rtt_min_s", "rtt_p50_s", "rtt_avg_s")}


def analyse(doc: ResultsDocument, topo: Topology) -> dict[str, Any]:
    out: dict[str, Any] = {"latency": {}, "allreduce": {}}
    for a in ok_arms(doc["arms"]):
        if a["kind"] == "ping":
            out["latency"][a["mode"]] = lat = ping_latency(a)
            a["completion_p50_s"] = lat["rtt_p50_s"] or lat["rtt_avg_s"]
        elif a["kind"] == "allreduce":
            out["allreduce"][a["mode"]] = s = allreduce_summary(a)
            a.update({"iteration_s": s["iteration_s"], "bound_s": s["bound_s"],
                      "ratio_to_bound": s["ratio_to_bound"], "correct": s["correct"]})
    return out


def _rtt(x: float) -> str:
    """An RTT to the microsecond: a switch traversal costs tens of them, which `secs` rounds away."""
    return f"{x * 1e6:.0f} µs" if x < 1e-3 else secs(x)


def sentences(doc: ResultsDocument) -> list[str]:
    an = doc["analysis"]
    out = []
    lat = an.get("latency", {})
    lo, vt = lat.get("local", {}), lat.get("via-tor", {})
    if lo.get("rtt_min_s") and vt.get("rtt_min_s") and lo.get("rtt_p50_s") and vt.get("rtt_p50_s"):
        # The minimum counts the switches a ping crosses; the median adds the emulator's wake-ups.
        out.append(f"Ping between two GPUs of one server, median (minimum): {_rtt(lo['rtt_p50_s'])} "
                   f"({_rtt(lo['rtt_min_s'])}) through the local switch, {_rtt(vt['rtt_p50_s'])} "
                   f"({_rtt(vt['rtt_min_s'])}) via the ToR hairpin ({vt['rtt_min_s'] / lo['rtt_min_s']:.2f}x "
                   "at the minimum).")
    elif lo.get("rtt_avg_s") and vt.get("rtt_avg_s"):
        out.append(f"Ping between two GPUs of one server: {secs(lo['rtt_avg_s'])} through the local switch, "
                   f"{secs(vt['rtt_avg_s'])} via the ToR hairpin ({vt['rtt_avg_s'] / lo['rtt_avg_s']:.2f}x).")
    for mode, s in an.get("allreduce", {}).items():
        out.append(f"All-reduce {mode}: {secs(s['iteration_s'])} per iteration, "
                   + (f"{s['ratio_to_bound']:.2f}x the bandwidth bound {secs(s['bound_s'])}; " if s["ratio_to_bound"]
                      else "")
                   + ("result equal to numpy's." if s["correct"] else "RESULT DIFFERS from numpy's (or incomplete)."))
    return out
