"""`fabriclab bench sim`: what the simulated engine costs by fabric size.

For each fat-tree size it runs one sprayed and one ECMP permutation (every host sends one flow of
`--size` bytes to a host in another pod, a seeded random permutation) at the field's settings (100
Gb/s, 4 KiB MTU, 1 µs hops unless told), through the same arm runner `fabriclab run --engine sim`
uses, and prints per arm: events, packet-hops, virtual and wall time, events/s, CPU µs per
packet-hop, peak memory, and the slowdown figures (mean and max FCT over ideal). The cost per
packet-hop across sizes is the ratio to read (these machines are noisy: compare within one run).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

from experiments import results
from experiments.arms import Flow
from experiments.model import Arm, Experiment, Workload
from topologies import Topology, parse_spec

log = logging.getLogger(__name__)

DEFAULT_KS = (4, 8, 16)
DEFAULT_SIZE = 2_000_000
DEFAULT_RATE_MBPS = 100_000
DEFAULT_MTU = 4096
DEFAULT_DELAY_MS = 0.001


def permutation_across_pods(topo: Topology, seed: int) -> list[tuple[str, str]]:
    """A seeded random permutation in which every host sends to a host of another pod (or leaf):
    a shuffle, then each host still paired within its own group swaps destinations with a random
    other host where the swap leaves both across."""
    hosts = [h.name for h in topo.hosts]
    group = {h.name: h.labels.get("pod", h.labels.get("leaf", h.name)) for h in topo.hosts}
    rng = random.Random(seed)
    dsts = hosts[:]
    rng.shuffle(dsts)
    n = len(hosts)
    for _ in range(100):
        bad = [i for i in range(n) if group[hosts[i]] == group[dsts[i]]]
        if not bad:
            return list(zip(hosts, dsts, strict=True))
        for i in bad:
            for _ in range(64):
                j = rng.randrange(n)
                if group[hosts[i]] != group[dsts[j]] and group[hosts[j]] != group[dsts[i]]:
                    dsts[i], dsts[j] = dsts[j], dsts[i]
                    break
    raise ValueError(f"no permutation across groups found for {topo.name}")


def spec_for(k: int, rate_mbps: float = DEFAULT_RATE_MBPS, mtu: int = DEFAULT_MTU,
             delay_ms: float = DEFAULT_DELAY_MS) -> str:
    return f"fat-tree:k={k},rate={rate_mbps:g},mtu={mtu},delay={delay_ms:g}"


def run(ks: tuple[int, ...] = DEFAULT_KS, size: int = DEFAULT_SIZE, rate_mbps: float = DEFAULT_RATE_MBPS,
        mtu: int = DEFAULT_MTU, delay_ms: float = DEFAULT_DELAY_MS, seed: int = 1,
        modes: tuple[str, ...] = ("spray", "ecmp"), progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    from experiments.sim_arm import run_arm_sim

    arms = {"spray": Arm("spray", mode="spray", policy="spray"),
            "ecmp": Arm("ecmp-single", mode="ecmp", policy="single")}
    rows = []
    for k in ks:
        spec = spec_for(k, rate_mbps, mtu, delay_ms)
        topo = parse_spec(spec)
        pairs = permutation_across_pods(topo, seed)
        flows = [Flow(s, d, 0, size) for s, d in pairs]
        exp = Experiment("bench-sim", "bench sim", "", spec, [arms[m] for m in modes],
                         Workload(pattern="matrix", bytes_per_flow=size), duration_s=1.0, seed=seed)
        for mode in modes:
            arm = arms[mode]
            if progress:
                progress(f"k={k} ({len(topo.hosts)} hosts) {arm.name}")
            t = time.monotonic()
            raw = run_arm_sim(exp, arm, topo, flows, exp.duration_s, seed, size)
            entry = results.arm_result(arm, raw, topo, 0.0, True)
            s = raw["sim"]
            rows.append({
                "k": k, "hosts": len(topo.hosts), "flows": len(flows), "arm": arm.name, "spec": spec,
                "events": s["events"], "packet_hops": s["packet_hops"], "virtual_s": s["virtual_s"],
                "sim_wall_s": s["wall_s"], "wall_s": round(time.monotonic() - t, 2),
                "events_per_s": s["events_per_s"],
                "us_per_packet_hop": round(1e6 * s["cpu_s"] / s["packet_hops"], 2) if s["packet_hops"] else None,
                "cpu_s": s["cpu_s"],
                "peak_memory_mb": s["peak_memory_mb"],
                "completed": sum(1 for f in entry["flows"] if f.get("completed")),
                "slowdown_mean": entry["slowdown_mean"], "slowdown_max": entry["slowdown_max"],
            })
    return {"size": size, "rate_mbps": rate_mbps, "mtu": mtu, "delay_ms": delay_ms, "seed": seed, "rows": rows}


def text_report(result: dict[str, Any]) -> str:
    head = (f"sim engine: permutations of {result['size']:,}-byte flows at {result['rate_mbps'] / 1e3:g} Gb/s, "
            f"MTU {result['mtu']}, {result['delay_ms'] * 1e3:g} µs per hop, seed {result['seed']}")
    cols = ("hosts", "arm", "done", "events", "packet-hops", "virtual", "wall", "events/s", "µs/hop", "peak MB",
            "slowdown mean", "slowdown max")
    lines = [head, "", "  ".join(f"{c:>13}" for c in cols)]
    base = None
    for r in result["rows"]:
        per = r["us_per_packet_hop"]
        if base is None and per:
            base = per
        lines.append("  ".join(f"{v:>13}" for v in (
            r["hosts"], r["arm"], f"{r['completed']}/{r['flows']}", f"{r['events']:,}", f"{r['packet_hops']:,}",
            f"{r['virtual_s'] * 1e6:.0f} µs", f"{r['sim_wall_s']:.1f} s", f"{r['events_per_s']:,}",
            f"{per} ({per / base:.2f}x)" if per and base else "-", f"{r['peak_memory_mb']:.0f}",
            _fmt(r["slowdown_mean"]), _fmt(r["slowdown_max"]))))
    lines.append("")
    lines.append("µs/hop: CPU time per packet-hop (transport and forwarding included; CPU, not wall, so that other "
                 "work on the machine counts less); ratio to the first row.")
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"
