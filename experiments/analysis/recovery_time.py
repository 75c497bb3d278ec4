"""How long a flow took to get back to its goodput after a fault: whether the fault hit it and its
time back to 90 % of its baseline."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def time_to_recover(times: Sequence[float], rates: Sequence[float], fault_t: float, baseline: float,
                    threshold: float = 0.9) -> float | None:
    """Seconds after `fault_t` until the rate is back to `threshold` x baseline and stays there for
    the next sample too (None when it never is)."""
    target = threshold * baseline
    pts = [(t, r) for t, r in zip(times, rates, strict=False) if t >= fault_t]
    for i, (t, r) in enumerate(pts):
        if r >= target and (i + 1 >= len(pts) or pts[i + 1][1] >= target):
            return max(0.0, t - fault_t)
    return None


def flow_recovery(series: list[float], bin_s: float, fault_t: float, smooth: int = 2) -> dict[str, Any]:
    """A flow's goodput series around a fault: its baseline before, whether the fault hit it (its rate
    fell under 90 % of the baseline within half a second) and its time back to 90 % of the baseline."""
    x = np.asarray(series, dtype=float)
    if x.size == 0:
        return {"hit": False, "recovery_s": None, "baseline_bps": None}
    k = max(1, smooth)
    sm = np.convolve(x, np.ones(k) / k, mode="same")
    i0 = round(fault_t / bin_s)
    pre = sm[max(1, i0 - int(1.5 / bin_s)): max(1, i0 - 1)]
    base = float(np.mean(pre)) if pre.size else 0.0
    times = [i * bin_s for i in range(sm.size)]
    post = sm[i0: i0 + max(2, int(0.5 / bin_s))]
    hit = base > 0 and post.size > 0 and float(post.min()) < 0.9 * base
    rec = time_to_recover(times, list(sm), fault_t, base) if hit else 0.0
    return {"hit": bool(hit), "recovery_s": rec, "baseline_bps": base}
