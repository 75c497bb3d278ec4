"""Link counters over time: per-direction utilisation series and byte/packet deltas from the
controller's `GET /links` samples, a leaf's share per uplink, and a window's summary (utilisation,
imbalance, hot links, switch load)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from experiments.analysis.placement import Hop
from topologies import Topology

# A link direction is hot when it runs this full and this far above the fabric's mean.
HOT_UTIL = 0.75
HOT_OVER_MEAN = 1.25


def fabric_hops(topo: Topology) -> set[str]:
    """Names of links between two switches (the fabric, not host access links)."""
    return {lk.name for lk in topo.links if topo.node(lk.a).is_switch and topo.node(lk.b).is_switch}


def directed_series(samples: Sequence[dict[str, Any]]) -> tuple[list[float], dict[Hop, list[float]]]:
    """From `GET /links` samples: times (s since the first) and per directed link its utilisation."""
    if not samples:
        return [], {}
    t0 = samples[0]["t"]
    times = [s["t"] - t0 for s in samples]
    series: dict[Hop, list[float]] = {}
    for i, s in enumerate(samples):
        for lk in s["links"]:
            for hop, util in (((lk["name"], lk["a"]), lk.get("util_ab", 0.0)),
                              ((lk["name"], lk["b"]), lk.get("util_ba", 0.0))):
                row = series.setdefault(hop, [0.0] * len(samples))
                row[i] = float(util or 0.0)
    return times, series


def window_bytes(samples: Sequence[dict[str, Any]]) -> tuple[float, dict[Hop, int], dict[Hop, int]]:
    """(seconds, bytes and packets per directed link) between the first and last sample."""
    if len(samples) < 2:
        return 0.0, {}, {}
    first = {lk["name"]: lk for lk in samples[0]["links"]}
    last = {lk["name"]: lk for lk in samples[-1]["links"]}
    secs = samples[-1]["t"] - samples[0]["t"]
    nbytes: dict[Hop, int] = {}
    npkts: dict[Hop, int] = {}
    for name, lk in last.items():
        f = first.get(name, {})
        nbytes[(name, lk["a"])] = max(0, lk.get("tx_bytes", 0) - f.get("tx_bytes", 0))
        nbytes[(name, lk["b"])] = max(0, lk.get("rx_bytes", 0) - f.get("rx_bytes", 0))
        npkts[(name, lk["a"])] = max(0, lk.get("tx_packets", 0) - f.get("tx_packets", 0))
        npkts[(name, lk["b"])] = max(0, lk.get("rx_packets", 0) - f.get("rx_packets", 0))
    return secs, nbytes, npkts


def path_share(arm: dict[str, Any], leaf: str) -> dict[str, Any]:
    """Share of `leaf`'s uplink traffic on each spine, per link sample of a results arm
    ({"t": [...], "share": {"leaf1->spine1": [...], ...}}; empty without such uplinks)."""
    ls = arm.get("link_series") or {}
    ups = {k: v for k, v in ls.get("util", {}).items() if k.startswith(f"{leaf}->spine")}
    if not ups:
        return {}
    arr = np.array(list(ups.values()))
    tot = arr.sum(axis=0)
    share = np.divide(arr, tot, out=np.zeros_like(arr), where=tot > 0)
    return {"t": ls["t"], "share": {k: [round(float(x), 3) for x in row] for k, row in zip(ups, share, strict=True)}}


@dataclass
class LinkSummary:
    utilisation: dict[str, float]  # "link>from" -> mean utilisation over the window
    link_imbalance: float  # max / mean over the fabric link directions
    hot_links: list[str]
    switch_pps: float  # packets entering any switch per second (OVS's load)
    fabric_bytes: int


def hop_label(hop: Hop) -> str:
    name, src = hop
    return f"{src}->{name.replace(src, '').strip('-')}"


def summarise_links(topo: Topology, samples: Sequence[dict[str, Any]], used_only: bool = False) -> LinkSummary:
    """Utilisation of every fabric link direction over the sampled window, imbalance and hot links.

    The mean is over all fabric link directions (leaf-spine links), because an idle uplink is exactly
    what ECMP wastes; `used_only` restricts it to directions that carried traffic.
    """
    secs, nbytes, npkts = window_bytes(samples)
    fabric = fabric_hops(topo)
    rate = {lk.name: lk.rate_mbps * 1e6 for lk in topo.links}
    util: dict[Hop, float] = {}
    for hop, b in nbytes.items():
        if hop[0] in fabric and secs > 0:
            util[hop] = 8 * b / secs / rate[hop[0]]
    values = [u for u in util.values() if u > 0.01] if used_only else list(util.values())
    mean = float(np.mean(values)) if values else 0.0
    peak = max(values, default=0.0)
    imbalance = peak / mean if mean > 0 else 0.0
    hot = sorted((hop_label(h) for h, u in util.items() if u >= HOT_UTIL and u >= HOT_OVER_MEAN * mean),
                 key=str)
    # Packets entering a switch: every directed link whose far end is a switch.
    ingress = 0
    for lk in topo.links:
        for src in (lk.a, lk.b):
            if topo.node(lk.peer(src)).is_switch:
                ingress += npkts.get((lk.name, src), 0)
    return LinkSummary(
        utilisation={hop_label(h): round(u, 4) for h, u in sorted(util.items())},
        link_imbalance=round(imbalance, 4),
        hot_links=hot,
        switch_pps=ingress / secs if secs > 0 else 0.0,
        fabric_bytes=sum(b for h, b in nbytes.items() if h[0] in fabric),
    )
