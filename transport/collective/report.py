"""What a collective's time is measured against, and how it is reported: the way nccl-tests does.

nccl-tests prints, per size: size (bytes), count (elements), type, reduction, time, algbw = size /
time and busbw = algbw x a factor that makes every collective comparable with the link rate:

==============  ============  =========================================================================
collective      busbw factor  bound at link rate B (n bytes, p ranks)
==============  ============  =========================================================================
all-reduce      2(p-1)/p      2(p-1)/p * n/B: a ring moves 2(p-1)/p of the array over each rank's link
reduce-scatter  (p-1)/p       (p-1)/p * n/B
all-gather      (p-1)/p       (p-1)/p * n/B
all-to-all      (p-1)/p       (p-1)/p * n/B at full bisection: every rank sends (p-1)/p of its buffer
hierarchical    2(p-1)/p      per level, p = G groups of L: local 2(L-1)/L * n/B_local (reduce-scatter
                              and all-gather in the group), fabric 2(G-1)/G * (n/L)/B_fabric (each
                              rank's shard across groups); combined = local + fabric, the levels in
                              turn as the algorithm orders them (pipelining can overlap them, down to
                              the larger of the two)
==============  ============  =========================================================================

Rates are in Mb/s as everywhere in fabriclab; algbw and busbw in Gb/s (nccl-tests prints GB/s).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from transport.collective.plan import canonical

TYPE = "float"
REDOP = {"all-reduce": "sum", "reduce-scatter": "sum", "hierarchical": "sum"}


def bus_factor(name: str, n_ranks: int) -> float:
    name = canonical(name)
    if n_ranks < 2:
        return 0.0
    if name in ("all-reduce", "hierarchical"):
        return 2 * (n_ranks - 1) / n_ranks
    return (n_ranks - 1) / n_ranks


@dataclass
class Bound:
    total_s: float
    levels: dict[str, float] = field(default_factory=dict)  # hierarchical: "local", "fabric"
    overlap_s: float | None = None  # hierarchical: the larger level, if the levels overlapped fully


def bound(name: str, n_ranks: int, nbytes: int, rate_mbps: float | None, *, group: int = 1,
          local_rate_mbps: float | None = None) -> Bound | None:
    """The time bound of one operation, or None without a rate (or with one rank)."""
    name = canonical(name)
    if not rate_mbps or n_ranks < 2:
        return None
    bits = nbytes * 8
    if name != "hierarchical":
        return Bound(bus_factor(name, n_ranks) * bits / (rate_mbps * 1e6))
    local_rate = local_rate_mbps or rate_mbps
    n_groups = n_ranks // group
    local = 2 * (group - 1) / group * bits / (local_rate * 1e6)
    fabric = 2 * (n_groups - 1) / n_groups * bits / group / (rate_mbps * 1e6)
    return Bound(local + fabric, {"local": local, "fabric": fabric}, max(local, fabric))


@dataclass
class Row:
    """One line of the report: one collective at one size."""

    collective: str
    n_ranks: int
    size: int  # bytes
    count: int  # elements
    time_s: float | None
    bound: Bound | None = None
    type: str = TYPE

    @property
    def redop(self) -> str:
        return REDOP.get(self.collective, "none")

    @property
    def algbw_gbps(self) -> float | None:
        return self.size * 8 / self.time_s / 1e9 if self.time_s else None

    @property
    def busbw_gbps(self) -> float | None:
        alg = self.algbw_gbps
        return alg * bus_factor(self.collective, self.n_ranks) if alg is not None and self.n_ranks > 1 else None

    @property
    def ratio_to_bound(self) -> float | None:
        return self.time_s / self.bound.total_s if self.time_s is not None and self.bound else None

    def to_dict(self) -> dict:
        b = self.bound
        return {
            "collective": self.collective, "ranks": self.n_ranks, "size": self.size, "count": self.count,
            "type": self.type, "redop": self.redop, "time_s": self.time_s, "algbw_gbps": self.algbw_gbps,
            "busbw_gbps": self.busbw_gbps, "bound_s": b.total_s if b else None,
            "bound_levels_s": dict(b.levels) if b else {}, "ratio_to_bound": self.ratio_to_bound,
        }


HEADINGS = ("size", "count", "type", "redop", "time", "algbw", "busbw", "bound", "x_bound")
UNITS = ("(B)", "(elements)", "", "", "(us)", "(Gb/s)", "(Gb/s)", "(us)", "")
WIDTHS = (12, 12, 6, 6, 10, 8, 8, 10, 7)


def _cell(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def format_rows(rows: Sequence[Row]) -> str:
    """nccl-tests' table (commented headings, one line per row), plus the bound and time/bound;
    a hierarchical row is followed by its levels' bounds."""
    def line(cells: Sequence[str]) -> str:
        return " ".join(c.rjust(w) for c, w in zip(cells, WIDTHS, strict=True))

    out = ["#" + line(HEADINGS)[1:], "#" + line(UNITS)[1:]]
    for r in rows:
        b = r.bound
        out.append(line((
            str(r.size), str(r.count), r.type, r.redop,
            _cell(r.time_s * 1e6 if r.time_s is not None else None, ".1f"),
            _cell(r.algbw_gbps, ".3f"), _cell(r.busbw_gbps, ".3f"),
            _cell(b.total_s * 1e6 if b else None, ".1f"), _cell(r.ratio_to_bound, ".2f"),
        )))
        if b and b.levels:
            levels = ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in b.levels.items())
            out.append(f"#  {r.collective} bound by level: {levels}; combined {b.total_s * 1e6:.1f} us, "
                       f"fully overlapped {b.overlap_s * 1e6:.1f} us")
    return "\n".join(out)
