"""Arms of kind "srd": the transport's own endpoints (`fabriclab srd send` / `srd recv`), one sender per
flow and one receiver per destination host, every sender held until all are ready."""

from __future__ import annotations

from typing import Any

from emulator.controller.rules import Graph
from experiments.analysis.framing import Framing, srd_framing, topology_base_rtt
from experiments.analysis.placement import host_rate_mbps
from experiments.arms import base
from experiments.endpoints import command_line, sender_args
from experiments.model import Arm
from topologies import Topology
from transport.core.contract import NUM_EVS, PORT_ALIGNMENT
from transport.core.headers import datagram_size_for_mtu
from transport.core.schema import ReceiverConnection, ReceiverMetrics, SenderMetrics
from transport.io.addressing import DEFAULT_BASE_PORT, DEFAULT_PORT


def fabric_paths(topo: Topology) -> int:
    """The most equal-cost paths between two hosts of `topo`: the spray divisor a packet reaches its
    destination's edge switch with (the product of the fan-outs on the way), over the edge switches."""
    g = Graph(topo)
    edges = sorted({a.switch for a in g.attachments})
    return max((g.divisors(s).get(s, 1) for s in edges[:1] + edges[-1:]), default=1)


def arm_evs(arm: Arm, topo: Topology) -> int:
    """EVs per flow: the arm's own, else 16 (the transport's default), or as many as the fabric has
    paths when that is more and the flow sprays: the controller's spray entries read one digit of the
    EV per tier, so 16 EVs on a k=16 fat-tree (64 paths between pods) would use 2 of every aggregation
    switch's 8 cores, a quarter of the top tier."""
    if arm.sender.evs is not None:
        return arm.sender.evs
    if arm.policy == "single":
        return NUM_EVS
    return max(NUM_EVS, fabric_paths(topo))


def port_stride(evs: int) -> int:
    """Source ports per flow leaving a host: 16 (EV e of its i-th flow at base + 16 i + e), more when a
    flow uses more EVs than that, a multiple of the alignment so the low bits stay the EV."""
    return max(PORT_ALIGNMENT, -(-evs // PORT_ALIGNMENT) * PORT_ALIGNMENT)


class Srd(base.ArmKind):
    name = "srd"
    description = "transport {policy}/{recovery}/{delivery} over {mode}"
    point_to_point = True
    reports_reordering = True

    def start(self, ctx: base.ArmContext) -> base.Procs:
        """Receivers first, then every sender held with its sockets open; traffic starts (t0) when all
        are ready, so interpreter start-up and imports stay out of the measured window."""
        arm, w = ctx.arm, ctx.workload
        datagram = datagram_size_for_mtu(ctx.topo.mtu)
        common = ["--recovery", arm.recovery, "--delivery", arm.delivery, "--mtu", str(datagram),
                  "--link-rate", f"{host_rate_mbps(ctx.topo):g}"]
        # Every endpoint is told its fabric's base RTT, so its initial window (and credit's unscheduled
        # one) is one bandwidth-delay product rather than a fixed 64 packets.
        framing = srd_framing(datagram, w.message_size)
        rtt = {i: topology_base_rtt(ctx.topo, f.src, f.dst, framing) for i, f in enumerate(ctx.flows)}
        receivers: list = []
        ready: list = []
        recv_entries: list[tuple[str, list[str], float]] = []
        for dst in sorted({f.dst for f in ctx.flows}):
            ready.append(base.ready_file(ctx, f"recv-{dst}"))
            base_rtt = max(rtt[i] for i, f in enumerate(ctx.flows) if f.dst == dst)
            cmd = command_line(
                "srd", "recv", "--bind", ctx.fab.ip(dst), "--port", str(DEFAULT_PORT), "--ready-file", str(ready[-1]),
                "--json-out", str(ctx.raw_dir / f"recv-{dst}.json"), *common, "--base-rtt", f"{base_rtt:.6g}")
            if arm.sender.cc:
                # The receiving end takes part in credit (it grants), and reads ECN marks for nscc.
                cmd += ["--cc", arm.sender.cc]
            if w.request_response:
                cmd += ["--response-size", "64"]
            recv_entries.append((dst, cmd[3:], 0.0))
        if base.grouped(ctx):
            receivers.append(base.start_group(ctx, "receivers", recv_entries, hold=False))
        else:
            receivers.extend(base.popen(ctx, host, command_line(*argv)) for host, argv, _ in recv_entries)
        base.wait_ready(ready, receivers)
        senders: list = []
        ready = []
        send_entries: list[tuple[str, list[str], float]] = []
        for i, f in enumerate(ctx.flows):
            ready.append(base.ready_file(ctx, f"send-{i}"))
            # EV e of the flow leaving its host i-th leaves from base + 16 i + e (port_stride): ECMP sees
            # other ports.
            evs = arm_evs(arm, ctx.topo)
            stride = port_stride(evs)
            cmd = command_line(
                "srd", "send", "--to", f"{ctx.fab.ip(f.dst)}:{DEFAULT_PORT}", *sender_args(arm.policy),
                "--seed", str(ctx.seed * 1000 + i), "--base-port", str(DEFAULT_BASE_PORT + stride * f.index),
                "--hold", "--ready-file", str(ready[-1]), "--size", str(w.message_size),
                "--json-out", str(ctx.raw_dir / f"send-{i}-{f.src}-{f.dst}.json"), *common,
                "--base-rtt", f"{rtt[i]:.6g}")
            if ctx.bytes_per_flow:
                # A cap so that a stuck flow cannot hold the run: 3x the time it needs at the host rate.
                cmd += ["--bytes", str(f.size or ctx.bytes_per_flow), "--duration", f"{3 * ctx.duration + 5:g}"]
            else:
                cmd += ["--duration", f"{ctx.duration:g}"]
            if w.request_response:
                cmd += ["--request-response", "--closed-loop", "8"]
            cmd += arm.sender.args()
            if arm.sender.evs is None and evs != NUM_EVS:
                cmd += ["--evs", str(evs)]
            send_entries.append((f.src, cmd[3:], f.start_s))
        if base.grouped(ctx):
            senders.append(base.start_group(ctx, "senders", send_entries, hold=True))
            base.release_group(ctx, ready, senders[0])
        else:
            senders.extend(base.popen(ctx, host, command_line(*argv)) for host, argv, _ in send_entries)
            base.release_when_ready(ctx, ready, senders)
        return receivers, senders

    def parse(self, raw: dict[str, Any], t0: float, n_bins: int) -> list[dict[str, Any]]:
        """One flow per sender, joined with the receiver's record of the same connection."""
        receivers: list[tuple[str, ReceiverMetrics]] = base.endpoint_files(raw, "recv-")
        by_cid: dict[int, ReceiverConnection] = {}
        for _, rm in receivers:
            for c in rm.get("connections", []):
                by_cid[c.get("connection_id")] = c
        flows = []
        fine_bins = round(n_bins * base.SERIES_BIN / base.FINE_BIN)
        sender: SenderMetrics
        for name, sender in base.endpoint_files(raw, "send-"):
            _, idx, src, dst = name.split("-", 3)
            conn = sender.get("connection", {})
            snd = conn.get("sender", {})
            rcv = by_cid.get(sender.get("connection_id"), {}).get("transport", {}).get("receiver", {})
            state = conn.get("state", {})
            gp = rcv.get("goodput") or {}
            series = base.rebin(gp.get("start"), gp.get("bin", base.SERIES_BIN), gp.get("bps", []), t0, n_bins)
            ct = sender.get("completion_times") or {}
            recovery = snd.get("loss_recovery") or {}
            flows.append({
                "src": src, "dst": dst, "index": int(idx),
                "bytes": sender.get("bytes", 0),
                "goodput_bps": sender.get("goodput_bps", 0.0),
                "duration_s": sender.get("duration"),
                "completed": sender.get("completed"),
                "stop_reason": sender.get("stop_reason"),
                "message_p50_s": ct.get("p50"), "message_p99_s": ct.get("p99"), "messages": ct.get("count", 0),
                "retransmissions": snd.get("retransmissions", 0),
                "spurious_retransmissions": snd.get("spurious_retransmissions", 0),
                "timeouts": snd.get("timeouts", 0),
                "gobackn_rewinds": snd.get("gobackn_rewinds", 0),
                "loss_recovery_p50_s": recovery.get("p50"),
                "loss_recovery_p99_s": recovery.get("p99"),
                "rtt_p50_s": (snd.get("rtt") or {}).get("p50"),
                "min_rtt_s": state.get("min_rtt"),
                "srtt_s": state.get("srtt"), "rttvar_s": state.get("rttvar"),
                "rto_s": sender.get("rto_s"),
                "out_of_order": rcv.get("out_of_order", 0),
                "data_packets": rcv.get("data_packets", 0),
                "reorder_distance": rcv.get("reorder_distance", {}),
                "peak_reassembly_bytes": rcv.get("peak_reassembly_bytes", 0),
                "duplicates": rcv.get("duplicates", 0),
                # Every DATA datagram the sender put on the wire, and every one that reached the receiver
                # (kept, duplicate or refused): their difference is what the fabric lost (results.py).
                "packets_sent": snd.get("packets_sent"),
                "datagrams_arrived": (None if "datagrams_seen" not in rcv
                                      else rcv["datagrams_seen"] + (rcv.get("dropped_total") or 0)),
                "ev_datagrams_sent": sender.get("ev_datagrams_sent", []),
                "socket_drops": (sender.get("socket_drops") or 0),
                "series_bps": base.rounded_series(series),
                "mtu": (sender.get("config") or {}).get("mtu"),
                "path_policy_fault": conn.get("path_policy_fault"),
                "message_size": (sender.get("workload") or {}).get("size"),
            })
            if raw.get("faults"):
                # From packet arrivals: messages complete too seldom for bins this fine.
                arr = rcv.get("arrivals") or {}
                fine = base.rebin(arr.get("start"), arr.get("bin", base.FINE_BIN), arr.get("bps", []), t0,
                                  fine_bins, base.FINE_BIN)
                flows[-1]["fine_series_bps"] = base.rounded_series(fine)
        if flows:
            flows[0]["receiver_socket_drops_total"] = sum((m.get("socket_drops") or 0) for _, m in receivers)
        return flows

    def framing(self, flow: dict[str, Any]) -> Framing:
        return srd_framing(flow.get("mtu") or 1400, flow.get("message_size") or 65536)
