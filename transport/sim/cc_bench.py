"""`fabriclab bench cc`: every registered congestion controller on the same simulated work, side by side.

On the two-leaf simulated fabric (transport.sim.fabric's TwoLeafSpec: 16 hosts, 8 spines, every link the same rate,
virtual clock, sprayed EVs), for each controller in the registry:

* permutation: every host sends one sized flow to the next host (always on the other leaf);
  ``goodput_vs_ideal`` is each flow's goodput over the wire allowance (link rate x payload / packet on
  the wire), the mean and the minimum over flows;
* incast 8:1 and 15:1: hosts 1..N each send one sized flow to host 0; ``completion_vs_ideal`` is the
  last byte's arrival over the ideal, all the incast's bytes on the wire (every packet with its
  headers) over the receiver's link rate; ``fct_spread`` is (slowest - fastest) / slowest flow
  completion; ``peak_queue`` the most packets the receiver's downlink held;
* for each: queue drops, and retransmissions as a percentage of the packets sent;
* ``core_us_per_packet``: process CPU of the protocol core per DATA packet (transport.sim.bench.bench_core:
  a sender and a receiver Connection handing datagrams to each other, no I/O, default configuration but
  the controller), the least of a few runs, and its ratio to the `delay` controller's.

Every connection is told the fabric's link rate and base RTT, so windows and credit are BDP-sized.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from transport.core.config import TransportConfig
from transport.core.congestion import CONTROLLERS
from transport.sim.fabric import TwoLeafSpec
from transport.sim.flows import FlowsResult, run_flows

MESSAGE_SIZE = 65536  # run_flows' default: flows are cut into messages of this size

TARGETS = {
    "incast_completion_vs_ideal": 1.05,
    "incast_fct_spread": 0.05,
    "retransmitted_percent_loss_free": 1.0,
    "core_cpu_vs_delay": 1.10,
}


def _retx_percent(r: FlowsResult) -> float:
    return 100.0 * r.retransmissions / r.packets_sent if r.packets_sent else 0.0


def permutation(config: TransportConfig, spec: TwoLeafSpec, size: int, seed: int) -> dict[str, Any]:
    flows = [(h, (h + 1) % spec.hosts, size) for h in range(spec.hosts)]
    r = run_flows(config, spec, flows, seed=seed)
    allowance = spec.rate_bps * config.max_payload / config.wire_packet_bytes
    ratios = [8 * b / t / allowance if t > 0 else 0.0 for b, t in zip(r.flow_bytes, r.fct, strict=True)]
    return {
        "completed": r.completed,
        "goodput_vs_ideal_mean": sum(ratios) / len(ratios),
        "goodput_vs_ideal_min": min(ratios),
        "fct_spread": _spread(r.fct),
        "drops": r.drops,
        "retransmitted_percent": _retx_percent(r),
        "packets_sent": r.packets_sent,
    }


def incast(config: TransportConfig, spec: TwoLeafSpec, fan_in: int, size: int, seed: int) -> dict[str, Any]:
    flows = [(h, 0, size) for h in range(1, fan_in + 1)]
    r = run_flows(config, spec, flows, seed=seed)
    ideal = sum(wire_bytes(b, config) for b in r.flow_bytes) * 8 / spec.rate_bps
    return {
        "completed": r.completed,
        "completion_vs_ideal": max(r.fct) / ideal,
        "ideal_s": ideal,
        "fct_spread": _spread(r.fct),
        "peak_queue": r.peak_downlink_queue[0],
        "drops": r.drops,
        "retransmitted_percent": _retx_percent(r),
        "packets_sent": r.packets_sent,
    }


def wire_bytes(size: int, config: TransportConfig, message_size: int = MESSAGE_SIZE) -> int:
    """Bytes a flow of ``size`` bytes puts on a link: its messages' fragments, each with the transport's,
    UDP, IP and Ethernet headers."""
    per_packet = config.wire_packet_bytes - config.max_payload
    total = 0
    while size > 0:
        msg = min(message_size, size)
        total += msg + per_packet * -(-msg // config.max_payload)
        size -= msg
    return total


def _spread(fct: list[float]) -> float:
    slowest = max(fct)
    return (slowest - min(fct)) / slowest if slowest > 0 else 0.0


def core_us_per_packet(cc: str, total_bytes: int, runs: int) -> float:
    """Process CPU per DATA packet of bench_core, the least of ``runs`` (others share the machine)."""
    import time

    from transport.sim.bench import bench_core

    best = float("inf")
    for _ in range(runs):
        t0 = time.process_time()
        r = bench_core(TransportConfig(cc=cc), total_bytes, 64 * 1024)
        cpu = time.process_time() - t0
        if r["core_data_packets"]:
            best = min(best, cpu / r["core_data_packets"] * 1e6)
    return best if best < float("inf") else 0.0


def run_cc_bench(quick: bool = False, controllers: list[str] | None = None, seed: int = 1,
                 progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    say = progress or (lambda _msg: None)
    spec = TwoLeafSpec()
    names = controllers or list(CONTROLLERS.names())
    perm_size = (512 if quick else 2048) * 1024
    incast_size = (256 if quick else 1024) * 1024
    core_bytes = (4 if quick else 16) << 20
    runs = 2 if quick else 3
    out: dict[str, Any] = {
        "parameters": {
            "hosts": spec.hosts, "spines": spec.spines, "rate_bps": spec.rate_bps, "hop_delay_s": spec.hop_delay,
            "queue_packets": spec.queue_packets, "base_rtt_s": spec.base_rtt(TransportConfig.mtu),
            "permutation_flow_bytes": perm_size, "incast_flow_bytes": incast_size, "core_bytes": core_bytes,
            "seed": seed, "path_policy": "spray", "quick": quick,
        },
        "targets": TARGETS,
        "controllers": {},
    }
    for cc in names:
        config = spec.config(replace(TransportConfig(), cc=cc))
        row: dict[str, Any] = {"initial_window": config.initial_window}
        say(f"{cc}: permutation")
        row["permutation"] = permutation(config, spec, perm_size, seed)
        for n in (8, 15):
            say(f"{cc}: incast {n}:1")
            row[f"incast_{n}"] = incast(config, spec, n, incast_size, seed)
        say(f"{cc}: core CPU")
        row["core_us_per_packet"] = core_us_per_packet(cc, core_bytes, runs)
        out["controllers"][cc] = row
    ref = out["controllers"].get("delay", {}).get("core_us_per_packet")
    for row in out["controllers"].values():
        row["core_cpu_vs_delay"] = row["core_us_per_packet"] / ref if ref else None
    return out


def text_report(result: dict[str, Any]) -> str:
    """One line per controller and scenario."""
    p = result["parameters"]
    lines = [
        f"simulated fabric: {p['hosts']} hosts, 2 leaves, {p['spines']} spines, {p['rate_bps'] / 1e6:g} Mb/s links, "
        f"base RTT {p['base_rtt_s'] * 1e3:.3f} ms, queues {p['queue_packets']} packets, spray",
        f"{'cc':8} {'scenario':12} {'goodput/ideal':>14} {'last/ideal':>10} {'spread':>7} {'peak q':>6} "
        f"{'drops':>6} {'retx %':>7}",
    ]
    for cc, row in result["controllers"].items():
        perm = row["permutation"]
        mean, low = perm["goodput_vs_ideal_mean"], perm["goodput_vs_ideal_min"]
        lines.append(f"{cc:8} {'permutation':12} {mean:>7.3f} ({low:.3f})"
                     f" {'':>10} {perm['fct_spread']:>7.3f} {'':>6} {perm['drops']:>6} "
                     f"{perm['retransmitted_percent']:>7.2f}")
        for n in (8, 15):
            r = row[f"incast_{n}"]
            lines.append(f"{cc:8} {f'incast {n}:1':12} {'':>14} {r['completion_vs_ideal']:>10.3f} "
                         f"{r['fct_spread']:>7.3f} {r['peak_queue']:>6} {r['drops']:>6} "
                         f"{r['retransmitted_percent']:>7.2f}")
        vs = row["core_cpu_vs_delay"]
        lines.append(f"{cc:8} core CPU {row['core_us_per_packet']:.2f} us/packet"
                     + (f" ({vs:.2f}x delay)" if vs else ""))
    return "\n".join(lines)
