"""Arms of kind "tcp", the everyday baseline: Linux's TCP through transport.io.tcpflow, sized flows complete
when the receiver has every byte, timed flows count what was acknowledged within the arm's duration."""

from __future__ import annotations

from typing import Any

import numpy as np

from experiments.analysis.framing import TCP_MSS, TCP_PMTU, Framing, tcp_framing
from experiments.arms import base
from experiments.endpoints import command_line
from transport.io.addressing import DEFAULT_BASE_PORT

TCP_PORT = 5201  # iperf3's default, which these flows used to run on; flow i listens on TCP_PORT + i


class Tcp(base.ArmKind):
    name = "tcp"
    description = "TCP over {mode}"
    point_to_point = True

    def start(self, ctx: base.ArmContext) -> base.Procs:
        """transport.io.tcpflow: a sized flow completes when the receiver has every byte (iperf3 -n ends a
        test once the sender has *written* its bytes, so a flow that fits the socket buffers "completes"
        before most of it has crossed a slow link); a timed one counts what the receiver acknowledged
        within the arm's duration (iperf3 -t, which this replaced, spun in select() while it waited for
        its server: see transport/io/tcpflow.py)."""
        return _start_tcpflow(ctx)

    def parse(self, raw: dict[str, Any], t0: float, n_bins: int) -> list[dict[str, Any]]:
        if any(name.startswith("tcp-send-") for name in raw.get("endpoints", {})):
            return _tcpflow_flows(raw, t0, n_bins)
        return _iperf_flows(raw, n_bins)

    def framing(self, flow: dict[str, Any]) -> Framing:
        return tcp_framing(flow.get("mss") or TCP_MSS, flow.get("pmtu") or TCP_PMTU)


def _client_port(ctx: base.ArmContext, i: int) -> int:
    # A fixed client port: ECMP hashes it, so the same seed gives the same paths.
    return DEFAULT_BASE_PORT + 256 + (ctx.seed * 7 + i * 16) % 4096


def _start_tcpflow(ctx: base.ArmContext) -> base.Procs:
    """One receiver per flow (each takes one connection), every sender connected and held, then all
    released together (or at their matrix start times), as the transport's senders are."""
    tcpflow = command_line("tcpflow")
    timeout = f"{3 * ctx.duration + 20:g}"
    sized = bool(ctx.bytes_per_flow or any(f.size for f in ctx.flows))
    receivers, ready = [], []
    for i, f in enumerate(ctx.flows):
        ready.append(base.ready_file(ctx, f"tcp-recv-{i}"))
        receivers.append(base.popen(ctx, f.dst, [
            *tcpflow, "recv", "--bind", ctx.fab.ip(f.dst), "--port", str(TCP_PORT + i), "--timeout", timeout,
            *([] if sized else ["--timed"]),
            "--ready-file", str(ready[-1]), "--json-out", str(ctx.raw_dir / f"tcp-recv-{i}-{f.dst}.json")]))
    base.wait_ready(ready, receivers)
    senders, ready = [], []
    for i, f in enumerate(ctx.flows):
        ready.append(base.ready_file(ctx, f"tcp-send-{i}"))
        size = ["--bytes", str(f.size or ctx.bytes_per_flow)] if sized else ["--seconds", f"{ctx.duration:g}"]
        senders.append(base.popen(ctx, f.src, [
            *tcpflow, "send", "--to", f"{ctx.fab.ip(f.dst)}:{TCP_PORT + i}", *size,
            "--cport", str(_client_port(ctx, i)), "--hold",
            "--timeout", timeout, "--ready-file", str(ready[-1]),
            "--json-out", str(ctx.raw_dir / f"tcp-send-{i}-{f.src}-{f.dst}.json")]))
    base.release_when_ready(ctx, ready, senders)
    return receivers, senders


def _tcpflow_flows(raw: dict[str, Any], t0: float, n_bins: int) -> list[dict[str, Any]]:
    """TCP flows of transport.io.tcpflow. Sized: the sender's completion is when the receiver had every
    byte, and the bytes counted are the receiver's. Timed: the bytes the receiver acknowledged within
    the sender's time (what it read after that died with the reset)."""
    recv = {name.split("-")[2]: m for name, m in base.endpoint_files(raw, "tcp-recv-")}
    flows = []
    for name, m in base.endpoint_files(raw, "tcp-send-"):
        _, _, idx, src, dst = name.split("-", 4)
        r = recv.get(idx, {})
        series = base.rebin(m.get("t_start"), m.get("bin_s", base.SERIES_BIN), m.get("series_bps") or [], t0, n_bins)
        completed = bool(m.get("completed"))
        # Timed: what was acknowledged within the time; sized: what the receiver read.
        sized_bytes = r.get("bytes", m.get("bytes", 0) if completed else 0)
        delivered = (m.get("bytes") or 0) if m.get("seconds") else sized_bytes
        flows.append({
            "src": src, "dst": dst, "index": int(idx),
            "bytes": delivered,
            "goodput_bps": m.get("goodput_bps", 0.0) if completed else 0.0,
            "duration_s": m.get("duration_s") if completed else None,
            "completed": completed,
            "stop_reason": m.get("stop_reason"),
            "retransmissions": m.get("retransmissions"),
            "series_bps": base.rounded_series(series),
            "min_rtt_s": m.get("min_rtt_s"), "mss": m.get("mss"), "pmtu": m.get("pmtu"),
        })
    return flows


def _iperf_flows(raw: dict[str, Any], n_bins: int) -> list[dict[str, Any]]:
    """Timed TCP flows of runs made before tcpflow timed them (`fabriclab report` of a stored run): the
    iperf3 client's JSON, its 0.1 s intervals as the goodput series."""
    flows = []
    for name, m in base.endpoint_files(raw, "iperf-client-"):
        _, _, idx, src, dst = name.split("-", 4)
        end = m.get("end", {}) if isinstance(m, dict) else {}
        recv = end.get("sum_received", {})
        sent = end.get("sum_sent", {})
        series = np.zeros(n_bins)
        for iv in m.get("intervals", []) if isinstance(m, dict) else []:
            s = iv.get("sum", {})
            i = int((s.get("start", 0.0) + 1e-9) // base.SERIES_BIN)
            if 0 <= i < n_bins:
                series[i] += s.get("bits_per_second", 0.0) * (s.get("seconds", base.SERIES_BIN) / base.SERIES_BIN)
        secs = max(recv.get("seconds", 0.0) or 0.0, sent.get("seconds", 0.0) or 0.0)
        flows.append({
            "src": src, "dst": dst, "index": int(idx),
            "bytes": recv.get("bytes", 0),
            "goodput_bps": recv.get("bits_per_second", 0.0),
            "duration_s": secs or None,
            "completed": bool(recv) and not m.get("error"),
            "stop_reason": m.get("error"),
            "retransmissions": sent.get("retransmits", 0),
            "series_bps": base.rounded_series(series),
            **_iperf_framing(m),
        })
    return flows


def _iperf_framing(m: Any) -> dict[str, Any]:
    """The client's minimum RTT (iperf3 reports the sender's RTTs in microseconds, on Linux), its MSS
    and the path MTU, for the flow's ideal completion time."""
    if not isinstance(m, dict):
        return {"min_rtt_s": None, "mss": None, "pmtu": None}
    streams = (m.get("end") or {}).get("streams") or [{}]
    min_rtt_us = (streams[0].get("sender") or {}).get("min_rtt")
    pmtu = next((st["pmtu"] for iv in m.get("intervals") or [] for st in iv.get("streams") or []
                 if st.get("pmtu")), None)
    return {"min_rtt_s": min_rtt_us / 1e6 if min_rtt_us else None,
            "mss": (m.get("start") or {}).get("tcp_mss_default"), "pmtu": pmtu}
