"""`fabriclab run uec-validation --engine sim`: the Ultra Ethernet simulator's validation scenarios,
run on the simulated engine with fabriclab's own transport, and each scenario's tail FCT set beside
the target uet-htsim's suite holds its own sender to.

The scenarios and targets are uet-htsim's `htsim/sim/datacenter/validate_uec_sender.txt`: 2 MB flows
at 100 Gb/s, 4 KiB MTU, 1 µs per hop, on a three-tier fat-tree (k=4 for 16 nodes, k=16 for 1,024:
12 µs base RTT between pods) or, oversubscribed, a two-tier leaf-spine of 32 leaves of 32 hosts with
8 (4:1) or 4 (8:1) spines. Sprayed scenarios spread over 128 EVs ("-paths 128"), single-path ones
hash each flow onto one path (ECMP, one EV). The permutations and the incast are drawn as htsim's
generators draw them: every host sends once and receives once, to another host (a seeded shuffle),
and 15 hosts send to the 16th.

Queues are sized as htsim sizes them for a fabric that drops rather than trims (fabriclab's transport
recovers a dropped packet; it has no packet trimming): five bandwidth-delay products of the fabric's
unloaded RTT (htsim's calculate_bdp_pkt: 43 packets of 4,150 bytes at 100 Gb/s, so 892 kB per port),
with ECN marking from a fifth of one BDP (9 packets, 37 kB).

The tail FCT is the slowest flow's completion time (what htsim's `tailFCT` reads).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from experiments import results
from experiments.arms import Flow
from experiments.model import Arm, Experiment, SenderSettings, Workload
from topologies import Topology, parse_spec
from transport.core.config import TransportConfig

log = logging.getLogger(__name__)

SIZE = 2_000_000
RATE_MBPS = 100_000
MTU = 4096
DELAY_MS = 0.001  # 1 µs per hop
HTSIM_PACKET = 4150  # htsim's data packet at its 4 KiB MTU
BDP_PACKETS = 43  # htsim's calculate_bdp_pkt for the 3-tier fat-tree at 100 Gb/s, 1 µs hops
QUEUE_BYTES = 5 * BDP_PACKETS * HTSIM_PACKET  # DEFAULT_NONTRIMMING_QUEUESIZE_FACTOR = 5
ECN_BYTES = 9 * HTSIM_PACKET  # ceil(0.2 BDP) packets
ECN_FRACTION = ECN_BYTES / QUEUE_BYTES
SPRAY_EVS = 128
SOURCE = "uet-htsim htsim/sim/datacenter/validate_uec_sender.txt"


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    topology: str
    traffic: str  # "one" | "permutation" | "incast"
    sprayed: bool
    target_us: float

    @property
    def large(self) -> bool:
        return "1024" in self.name or "oversub" in self.name


def _fat_tree(k: int) -> str:
    return f"fat-tree:k={k},rate={RATE_MBPS},mtu={MTU},delay={DELAY_MS}"


def _oversubscribed(spines: int) -> str:
    return f"leaf-spine:spines={spines},leaves=32,hosts=32,rate={RATE_MBPS},mtu={MTU},delay={DELAY_MS}"


SCENARIOS = (
    Scenario("single-flow", "a single flow", _fat_tree(4), "one", True, 190),
    Scenario("perm-16-spray", "16-node permutation, sprayed over 128 EVs", _fat_tree(4), "permutation", True, 210),
    Scenario("perm-16-single", "16-node permutation, one path", _fat_tree(4), "permutation", False, 1300),
    Scenario("perm-1024-spray", "1,024-node permutation, sprayed", _fat_tree(16), "permutation", True, 220),
    Scenario("perm-1024-single", "1,024-node permutation, one path", _fat_tree(16), "permutation", False, 1300),
    Scenario("incast-15", "15:1 incast on 16 nodes", _fat_tree(4), "incast", True, 2550),
    Scenario("oversub-4", "4:1 oversubscribed", _oversubscribed(8), "permutation", True, 880),
    Scenario("oversub-8", "8:1 oversubscribed", _oversubscribed(4), "permutation", True, 1760),
)
NAMES = tuple(s.name for s in SCENARIOS)


def flows_for(scenario: Scenario, topo: Topology, seed: int) -> list[Flow]:
    hosts = [h.name for h in topo.hosts]
    if scenario.traffic == "one":
        return [Flow(hosts[0], hosts[13], 0, SIZE)]  # htsim's one.cm: 0->13, across pods
    if scenario.traffic == "incast":
        return [Flow(h, hosts[15], 0, SIZE) for h in hosts[:15]]  # incast.cm: 0..14 -> 15
    # htsim's permutation generator: a shuffle in which no host sends to itself.
    rng = random.Random(seed)
    while True:
        dsts = hosts[:]
        rng.shuffle(dsts)
        if all(s != d for s, d in zip(hosts, dsts, strict=True)):
            return [Flow(s, d, 0, SIZE) for s, d in zip(hosts, dsts, strict=True)]


def arm_for(scenario: Scenario, cc: str) -> Arm:
    if scenario.sprayed:
        return Arm(f"spray-{cc}", mode="spray", policy="spray", sender=SenderSettings(cc=cc, evs=SPRAY_EVS))
    return Arm(f"single-{cc}", mode="ecmp", policy="single", sender=SenderSettings(cc=cc))


def run_scenario(scenario: Scenario, cc: str, seed: int = 1) -> dict[str, Any]:
    """One scenario with one congestion controller: its tail FCT and what the engine did."""
    from experiments.sim_arm import run_arm_sim

    topo = parse_spec(scenario.topology)
    flows = flows_for(scenario, topo, seed)
    arm = arm_for(scenario, cc)
    exp = Experiment("uec-validation", scenario.title, "", scenario.topology, [arm],
                     Workload(pattern="matrix", bytes_per_flow=SIZE), duration_s=1.0, seed=seed,
                     extra={"sim_queue_bytes": QUEUE_BYTES, "sim_ecn_fraction": ECN_FRACTION})
    t = time.monotonic()
    raw = run_arm_sim(exp, arm, topo, flows, exp.duration_s, seed, SIZE)
    entry = results.arm_result(arm, raw, topo, 0.0, True)
    fcts = [f["duration_s"] for f in entry["flows"] if f.get("completed")]
    done = len(fcts)
    tail = max(fcts) if fcts and done == len(flows) else None
    return {
        "scenario": scenario.name, "title": scenario.title, "cc": cc, "topology": scenario.topology,
        "hosts": len(topo.hosts), "flows": len(flows), "completed": done, "target_us": scenario.target_us,
        "tail_fct_us": None if tail is None else round(tail * 1e6, 1),
        "median_fct_us": round(sorted(fcts)[len(fcts) // 2] * 1e6, 1) if fcts else None,
        "within": tail is not None and tail * 1e6 <= scenario.target_us,
        "retransmissions": entry["retransmissions"], "slowdown_max": entry["slowdown_max"],
        "sim": raw["sim"], "wall_s": round(time.monotonic() - t, 2),
    }


def run(ccs: tuple[str, ...] = (TransportConfig.cc,), names: tuple[str, ...] = NAMES, seed: int = 1,
        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    rows = []
    for scenario in (s for s in SCENARIOS if s.name in names):
        for cc in ccs:
            if progress:
                progress(f"{scenario.name} ({cc})")
            rows.append(run_scenario(scenario, cc, seed))
    return {"experiment": "uec-validation", "engine": "sim", "source": SOURCE, "seed": seed, "ccs": list(ccs),
            "size": SIZE, "rate_mbps": RATE_MBPS, "mtu": MTU, "hop_delay_us": DELAY_MS * 1e3,
            "queue_bytes": QUEUE_BYTES, "ecn_fraction": ECN_FRACTION, "rows": rows}


def text_report(doc: dict[str, Any]) -> str:
    ccs = doc["ccs"]
    head = ["scenario", "hosts", "target µs", *[f"tail FCT µs ({cc})" for cc in ccs]]
    table = [head]
    by = {(r["scenario"], r["cc"]): r for r in doc["rows"]}
    for s in SCENARIOS:
        if not any((s.name, cc) in by for cc in ccs):
            continue
        cells = []
        for cc in ccs:
            r = by.get((s.name, cc))
            if r is None:
                cells.append("-")
            elif r["tail_fct_us"] is None:
                cells.append(f"{r['completed']}/{r['flows']} done")
            else:
                cells.append(f"{r['tail_fct_us']:,.0f} {'ok' if r['within'] else 'OVER'}")
        hosts = next(by[(s.name, cc)]["hosts"] for cc in ccs if (s.name, cc) in by)
        table.append([s.title, f"{hosts:,}", f"{s.target_us:,.0f}", *cells])
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = [f"Ultra Ethernet validation scenarios ({doc['source']}): 2 MB flows, 100 Gb/s, MTU {doc['mtu']}, "
             f"1 µs hops, queues of {doc['queue_bytes'] / 1e3:.0f} kB with ECN from "
             f"{doc['queue_bytes'] * doc['ecn_fraction'] / 1e3:.0f} kB; "
             "simulated engine, fabriclab's transport.", ""]
    for i, row in enumerate(table):
        lines.append("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths,
                                                                                                  strict=True))))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    walls = sum(r["wall_s"] for r in doc["rows"])
    lines += ["", f"ok: the slowest flow finished within the target; wall time {walls:.0f} s in all."]
    return "\n".join(lines)
