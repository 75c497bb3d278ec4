"""Arms of kind "allreduce": the transport's ring all-reduce worker on every host of the flows' sources,
in ring order, each rank sending to the next."""

from __future__ import annotations

import time
from typing import Any

from experiments.analysis.placement import capacities, host_rate_mbps, max_min_rates, path_weights
from experiments.arms import base
from experiments.endpoints import command_line
from transport.core.headers import datagram_size_for_mtu
from transport.core.schema import AllreduceMetrics
from transport.io.addressing import DEFAULT_PORT


class Allreduce(base.ArmKind):
    name = "allreduce"
    description = "ring all-reduce, {policy} over {mode}"
    reports_reordering = True
    # The workers meet at a barrier and run every iteration, however long the arm's duration.
    min_wait_s = 120.0

    def start(self, ctx: base.ArmContext) -> base.Procs:
        w = ctx.workload
        ranks = [f.src for f in ctx.flows]
        peers = ",".join(f"{ctx.fab.ip(h)}:{DEFAULT_PORT}" for h in ranks)
        workers = []
        ctx.t0 = time.monotonic()
        for r, h in enumerate(ranks):
            cmd = command_line("allreduce", "--rank", str(r), "--peers", peers,
                               "--size", str(w.elements), "--iterations", str(w.iterations),
                               "--json-out", str(ctx.raw_dir / f"allreduce-{r}-{h}.json"))
            cmd += _options(ctx, ranks)
            if w.collective != "ring":
                cmd += ["--collective", w.collective, "--group", str(w.group)]
                if w.group > 1:
                    cmd += ["--local-rate-mbps", f"{bottleneck_mbps(ctx.topo, _group_ring(ranks, w.group)):g}"]
            workers.append(base.popen(ctx, h, cmd))
        return [], workers

    def traffic_starts(self, raw: dict[str, Any], t0: float) -> float:
        return _first_iteration(raw, t0)

    def parse(self, raw: dict[str, Any], t0: float, n_bins: int) -> list[dict[str, Any]]:
        """One entry per rank: its iterations, correctness and its connections' counters."""
        flows = []
        m: AllreduceMetrics
        for name, m in base.endpoint_files(raw, "allreduce-"):
            _, idx, host = name.split("-", 2)
            times = m.get("iteration_times_s") or []
            transport = m.get("transport") or {}
            snd, rcv = _sides(transport)
            flows.append({
                "src": host, "dst": "", "index": int(idx), "bytes": m.get("bytes", 0) or 0,
                # A rank's share of the ring's traffic: it sends 2(N-1)/N of its array per iteration.
                "goodput_bps": (m.get("busbw_gbps") or 0.0) * 1e9,
                "duration_s": sum(times) if times else None,
                "completed": m.get("correct") is not None and m.get("error") is None,
                "correct": m.get("correct"),
                "mismatch": m.get("mismatch"),
                "iteration_times_s": times,
                "iteration_mean_s": m.get("mean_s"),
                "bound_s": m.get("bound_s"),
                "ratio_to_bound": m.get("ratio_to_bound"),
                "retransmissions": snd.get("retransmissions", 0),
                "spurious_retransmissions": snd.get("spurious_retransmissions", 0),
                "out_of_order": rcv.get("out_of_order", 0),
                "data_packets": rcv.get("data_packets", 0),
                "reorder_distance": rcv.get("reorder_distance", {}),
                "peak_reassembly_bytes": rcv.get("peak_reassembly_bytes", 0),
                "socket_drops": transport.get("socket_drops") or 0,
                "error": m.get("error"),
                "stop_reason": m.get("stop_reason"),
                "series_bps": [],
            })
        return flows


def _first_iteration(raw: dict[str, Any], t0: float) -> float:
    """The workers start as processes at t0, then load numpy, make their arrays and meet at a barrier;
    the collective's traffic begins when the last of them starts iteration 1 (`started_unix`)."""
    t0_unix = raw.get("t0_unix")
    starts = [m.get("started_unix") for _, m in base.endpoint_files(raw, "allreduce-")]
    starts = [s for s in starts if isinstance(s, (int, float))]
    if not isinstance(t0_unix, (int, float)) or not starts:
        return t0
    return t0 + max(0.0, max(starts) - t0_unix)


def _sides(transport: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The rank's sender and receiver counters: the ring's one connection each way, or the sums over a
    plan collective's connections (one to each peer it sends to, one from each it receives from)."""
    if "sends" not in transport:
        return (transport.get("send") or {}).get("sender", {}), (transport.get("recv") or {}).get("receiver", {})
    return _summed(transport.get("sends") or [], "sender"), _summed(transport.get("recvs") or [], "receiver")


def _summed(sides: list[dict[str, Any]], key: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for side in sides:
        for k, v in (side.get(key) or {}).items():
            if isinstance(v, int | float) and not isinstance(v, bool):
                out[k] = out.get(k, 0) + v
    return out


def bottleneck_mbps(topo: Any, pairs: list[tuple[str, str]]) -> float:
    """The rate every one of these transfers gets when they run at once, sharing the fabric max-min
    fairly: the link rate a collective's bound must use. A flat ring across servers is held to the
    servers' NICs, not to its GPUs' links; a hierarchical all-reduce's inner level to the local links."""
    flows = [path_weights(topo, s, d, spray=True) for s, d in pairs if s != d]
    if not flows:
        return host_rate_mbps(topo)
    return min(max_min_rates(flows, capacities(topo))) / 1e6


def _ring_edges(ranks: list[str]) -> list[tuple[str, str]]:
    return [(ranks[i], ranks[(i + 1) % len(ranks)]) for i in range(len(ranks))]


def _group_ring(ranks: list[str], group: int) -> list[tuple[str, str]]:
    """The ring edges inside each group of `group` consecutive ranks (the inner level's transfers)."""
    return [e for g in range(0, len(ranks), group) for e in _ring_edges(ranks[g:g + group])]


def _across_groups(ranks: list[str], group: int) -> list[tuple[str, str]]:
    """Rank i of every group to rank i of the next group (the outer level's ring, one per shard)."""
    groups = [ranks[g:g + group] for g in range(0, len(ranks), group)]
    if len(groups) < 2:
        return []
    return [(groups[k][i], groups[(k + 1) % len(groups)][i]) for k in range(len(groups)) for i in range(group)]


def _options(ctx: base.ArmContext, ranks: list[str] | None = None) -> list[str]:
    """Transport settings of the arm, datagrams sized to the fabric's MTU (as the srd arms do; jumbo
    frames cut the packets, and so the emulator's work, six-fold), and the host link rate for the
    worker's bandwidth bound."""
    arm = ctx.arm
    return ["--policy", arm.policy, "--recovery", arm.recovery, "--delivery", arm.delivery,
            "--mtu", str(datagram_size_for_mtu(ctx.topo.mtu)),
            "--seed", str(ctx.seed), "--link-rate-mbps", f"{_link_rate(ctx, ranks):g}", "--timeout", "30"]


def _link_rate(ctx: base.ArmContext, ranks: list[str] | None) -> float:
    """The bound's link rate: the host links', as the ring has always reported it; for a collective
    chosen by name, the rate its transfers actually get through the fabric's bottleneck."""
    w = ctx.workload
    if not ranks or w.collective == "ring":
        return host_rate_mbps(ctx.topo)
    if w.collective == "hierarchical" and w.group > 1:
        return bottleneck_mbps(ctx.topo, _across_groups(ranks, w.group))
    return bottleneck_mbps(ctx.topo, _ring_edges(ranks))
