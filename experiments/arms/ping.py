"""Arms of kind "ping": round-trip latency with ping every 20 ms, one ping per flow.

Each reply's time is kept, so that a flow reports its median RTT beside ping's own minimum, mean and
maximum: in an emulator the mean carries the switches' wake-ups, and one slow reply moves it more than
a hop does (a local ping's mean of 0.54 ms against 0.51 via three more switch traversals, minima
0.068 against 0.111 ms); the minimum is the path's floor.
"""

from __future__ import annotations

import re
import statistics
import time
from typing import Any

from experiments.arms import base

_RTT = re.compile(r"= ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) ms")
_LOSS = re.compile(r"([\d.]+)% packet loss")
_REPLY = re.compile(r"icmp_seq=\d+ .*time=([\d.]+) ms")


class Ping(base.ArmKind):
    name = "ping"
    description = "ping over {mode}"
    # A ping that could not run leaves no summary to read; the arm still has its other measurements.
    flows_required = False

    def start(self, ctx: base.ArmContext) -> base.Procs:
        senders = []
        ctx.t0 = time.monotonic()
        count = max(20, int(ctx.duration / 0.02))
        for i, f in enumerate(ctx.flows):
            cmd = ["ping", "-n", "-i", "0.02", "-c", str(count), ctx.fab.ip(f.dst)]
            senders.append(base.popen(ctx, f.src, cmd, ctx.raw_dir / f"ping-{i}-{f.src}-{f.dst}.txt"))
        return [], senders

    def parse(self, raw: dict[str, Any], t0: float, n_bins: int) -> list[dict[str, Any]]:
        """ping's summary lines (min/avg/max RTT, the loss) and the median of its replies' times."""
        flows = []
        for name, m in sorted(raw.get("endpoints", {}).items()):
            if not name.startswith("ping-"):
                continue
            _, idx, src, dst = name.split("-", 3)
            text = m.get("text", "")
            rtt = _RTT.search(text)
            loss = _LOSS.search(text)
            replies = [float(t) for t in _REPLY.findall(text)]
            flows.append({
                "src": src, "dst": dst, "index": int(idx), "bytes": 0, "goodput_bps": 0.0,
                "rtt_min_s": float(rtt.group(1)) / 1e3 if rtt else None,
                "rtt_avg_s": float(rtt.group(2)) / 1e3 if rtt else None,
                "rtt_p50_s": statistics.median(replies) / 1e3 if replies else None,
                "rtt_max_s": float(rtt.group(3)) / 1e3 if rtt else None,
                "loss_pct": float(loss.group(1)) if loss else None,
                "series_bps": [],
            })
        return flows
