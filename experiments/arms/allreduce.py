"""Arms of kind "allreduce": the transport's ring all-reduce worker on every host of the flows' sources,
in ring order, each rank sending to the next."""

from __future__ import annotations

import time
from typing import Any

from experiments.analysis.placement import host_rate_mbps
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
            cmd += _options(ctx)
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
            snd = (transport.get("send") or {}).get("sender", {})
            rcv = (transport.get("recv") or {}).get("receiver", {})
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


def _options(ctx: base.ArmContext) -> list[str]:
    """Transport settings of the arm, datagrams sized to the fabric's MTU (as the srd arms do; jumbo
    frames cut the packets, and so the emulator's work, six-fold), and the host link rate for the
    worker's bandwidth bound."""
    arm = ctx.arm
    return ["--policy", arm.policy, "--recovery", arm.recovery, "--delivery", arm.delivery,
            "--mtu", str(datagram_size_for_mtu(ctx.topo.mtu)),
            "--seed", str(ctx.seed), "--link-rate-mbps", f"{host_rate_mbps(ctx.topo):g}", "--timeout", "30"]
