"""Pure numbers behind the experiments: flow placement, fair shares, balls-in-bins, link statistics, fidelity.

Nothing here needs root or a running fabric: the runner feeds it topologies and counters, the tests
feed it hand-made ones.

Fair shares are max-min fair rates found by progressive filling over link *directions*: every flow
uses each directed link with a weight (the fraction of its bytes crossing it). A flow pinned to one
path (ECMP) has weight 1 on that path's links; a sprayed flow splits evenly at every hop, as the
fabric's spray mode does. The ideal of a workload is its max-min total with spraying: what the
fabric can carry when no path is wasted.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from topologies import Link, Topology, next_hops
from transport.core.headers import ACK_FRAME, DATA_WIRE_OVERHEAD, ETHERNET_HEADER, IPV4_HEADER
from transport.core.metrics import percentile
from transport.core.wire import DATA_HEADER_LEN

# A directed link: (link name, the node the bytes leave from).
Hop = tuple[str, str]

# Below this CPU idle fraction the emulator cannot be trusted: Mininet-HiFi's rule of thumb (35 %).
MIN_IDLE = 0.35
# Userspace OVS on this class of machine moves about 90-100 kpps over all switch traversals.
OVS_CEILING_PPS = 90_000.0
# "Near" the ceiling: above this share of it, forwarding itself may be what limits the run.
CEILING_WARN = 0.8
# A link direction is hot when it runs this full and this far above the fabric's mean.
HOT_UTIL = 0.75
HOT_OVER_MEAN = 1.25
# Drops outside the shaped queues above this share of the packets forwarded make results suspect.
OUTSIDE_DROP_WARN = 0.001


# --------------------------------------------------------------------------------------------------
# Workload placement


def derangement_across(topo: Topology, seed: int, group_label: str | None = None) -> list[tuple[str, str]]:
    """Permutation traffic: each host sends to exactly one host, and receives from exactly one,
    always on another leaf (or server): a random derangement across groups, drawn from `seed`.

    Groups come from the hosts' `leaf` / `server` labels (or `group_label`); with a single group the
    constraint is only src != dst.
    """
    hosts = [h.name for h in topo.hosts]
    label = group_label or _group_label(topo)
    group = {h.name: h.labels.get(label, h.name) if label else h.name for h in topo.hosts}
    rng = random.Random(seed)
    single_group = len(set(group.values())) <= 1
    for _ in range(10_000):
        dsts = hosts[:]
        rng.shuffle(dsts)
        if all(s != d and (single_group or group[s] != group[d]) for s, d in zip(hosts, dsts, strict=True)):
            return list(zip(hosts, dsts, strict=True))
    # Fall back to a shift by one group (always valid when groups are equal-sized).
    n = len(hosts)
    per = max(1, n // max(1, len(set(group.values()))))
    return [(hosts[i], hosts[(i + per) % n]) for i in range(n)]


def _group_label(topo: Topology) -> str | None:
    # On three tiers the pod comes first, so that every flow crosses the top tier (the cores), where
    # multi-stage hashing and spraying differ most.
    for label in ("pod", "leaf", "edge", "server"):
        if any(label in h.labels for h in topo.hosts):
            return label
    return None


def host_rate_mbps(topo: Topology) -> float:
    """The slowest host link's rate: what every host can send at (flow sizes, all-reduce's bound)."""
    return min(lk.rate_mbps for h in topo.hosts for lk in topo.links_of(h.name))


def path_weights(topo: Topology, src: str, dst: str, spray: bool = True,
                 rng: random.Random | None = None) -> dict[Hop, float]:
    """Fraction of a src->dst flow's bytes on each directed link.

    spray=True splits evenly over the next hops at every switch (the fabric's spray mode); otherwise
    one next hop is drawn at random at every switch (`rng`): one sample of ECMP hashing.
    """
    weights: dict[Hop, float] = {}
    frontier: dict[str, float] = {src: 1.0}
    guard = 0
    while frontier:
        guard += 1
        if guard > 64:
            raise ValueError(f"no loop-free path from {src} to {dst}")
        nxt: dict[str, float] = {}
        for node, w in frontier.items():
            if node == dst:
                continue
            hops = next_hops(topo, node, dst)
            if not hops:
                raise ValueError(f"{dst} is unreachable from {node}")
            if not spray:
                hops = [(rng or random).choice(hops)]
            share = w / len(hops)
            for lk in hops:
                key = (lk.name, node)
                weights[key] = weights.get(key, 0.0) + share
                peer = lk.peer(node)
                nxt[peer] = nxt.get(peer, 0.0) + share
        frontier = {n: w for n, w in nxt.items() if n != dst}
    return weights


def capacities(topo: Topology, overrides: dict[Hop, float] | None = None) -> dict[Hop, float]:
    """Capacity in bit/s of every directed link."""
    caps: dict[Hop, float] = {}
    for lk in topo.links:
        caps[(lk.name, lk.a)] = lk.rate_mbps * 1e6
        caps[(lk.name, lk.b)] = lk.rate_mbps * 1e6
    if overrides:
        caps.update(overrides)
    return caps


def max_min_rates(flows: Sequence[dict[Hop, float]], caps: dict[Hop, float]) -> list[float]:
    """Max-min fair rates (bit/s) by progressive filling; `flows[i]` maps directed links to weights."""
    n = len(flows)
    rates = [0.0] * n
    frozen = [False] * n
    residual = dict(caps)
    for _ in range(n + len(caps) + 1):
        active = [i for i in range(n) if not frozen[i]]
        if not active:
            break
        # Load per unit of common rate increase on each link still used by an active flow.
        load: dict[Hop, float] = {}
        for i in active:
            for hop, w in flows[i].items():
                load[hop] = load.get(hop, 0.0) + w
        if not load:
            break
        step = min(residual[h] / w for h, w in load.items() if w > 0)
        for i in active:
            rates[i] += step
        for hop, w in load.items():
            residual[hop] -= step * w
        saturated = {h for h, w in load.items() if w > 0 and residual[h] <= 1e-6 * caps[h]}
        for i in active:
            if any(h in saturated for h in flows[i]):
                frozen[i] = True
    return rates


def ideal_bps(topo: Topology, pairs: Sequence[tuple[str, str]], caps: dict[Hop, float] | None = None) -> float:
    """What the fabric can carry for these flows: their max-min total with even spraying."""
    flows = [path_weights(topo, s, d, spray=True) for s, d in pairs]
    return float(sum(max_min_rates(flows, caps or capacities(topo))))


# --------------------------------------------------------------------------------------------------
# Balls in bins: what ECMP hashing is expected to do


@dataclass
class EcmpExpectation:
    """Monte Carlo expectation of ECMP hashing for a set of flows on a topology."""

    trials: int
    expected_goodput_bps: float
    goodput_p10_bps: float
    goodput_p90_bps: float
    ideal_bps: float
    expected_fraction: float
    expected_max_load: float  # flows on the busiest fabric link direction
    expected_colliding_flows: float  # flows sharing a fabric link direction with another flow
    prob_any_collision: float
    balls_in_bins: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def balls_in_bins(balls: int, bins: int, trials: int = 20_000, seed: int = 0) -> dict[str, float]:
    """F balls thrown into S bins uniformly: expected max load, expected balls that share a bin,
    and the probability of at least one collision (exact: 1 - S!/(S-F)!/S^F)."""
    if balls <= 0 or bins <= 0:
        return {"balls": balls, "bins": bins, "expected_max_load": 0.0, "expected_colliding": 0.0,
                "prob_collision": 0.0}
    rng = np.random.default_rng(seed)
    throws = rng.integers(0, bins, size=(trials, balls))
    counts = np.zeros((trials, bins), dtype=np.int64)
    np.add.at(counts, (np.arange(trials)[:, None], throws), 1)
    max_load = counts.max(axis=1).mean()
    colliding = np.where(counts > 1, counts, 0).sum(axis=1).mean()
    no_collision = math.prod((bins - i) / bins for i in range(balls)) if balls <= bins else 0.0
    # Expected balls alone in their bin, exactly: F * ((S-1)/S)^(F-1).
    exact_colliding = balls - balls * ((bins - 1) / bins) ** (balls - 1)
    return {
        "balls": balls,
        "bins": bins,
        "expected_max_load": float(max_load),
        "expected_colliding": float(exact_colliding),
        "expected_colliding_mc": float(colliding),
        "prob_collision": float(1.0 - no_collision),
    }


def fabric_hops(topo: Topology) -> set[str]:
    """Names of links between two switches (the fabric, not host access links)."""
    return {lk.name for lk in topo.links if topo.node(lk.a).is_switch and topo.node(lk.b).is_switch}


def ecmp_expectation(topo: Topology, pairs: Sequence[tuple[str, str]], trials: int = 2000,
                     seed: int = 0) -> EcmpExpectation:
    """Expected goodput, max load and collisions when each flow is hashed onto one path at random."""
    rng = random.Random(seed)
    caps = capacities(topo)
    fabric = fabric_hops(topo)
    goodputs, max_loads, colliding = [], [], []
    for _ in range(trials):
        flows = [path_weights(topo, s, d, spray=False, rng=rng) for s, d in pairs]
        goodputs.append(sum(max_min_rates(flows, caps)))
        per_hop: dict[Hop, int] = {}
        for f in flows:
            for hop in f:
                if hop[0] in fabric:
                    per_hop[hop] = per_hop.get(hop, 0) + 1
        max_loads.append(max(per_hop.values(), default=0))
        colliding.append(sum(1 for f in flows if any(per_hop.get(h, 0) > 1 for h in f if h[0] in fabric)))
    ideal = ideal_bps(topo, pairs, caps)
    g = np.array(goodputs)
    # The textbook view: the flows leaving the busiest leaf, hashed onto its uplinks.
    per_src_switch: dict[str, int] = {}
    uplinks = 1
    for s, _d in pairs:
        sw, _ = topo.host_switch(s)
        per_src_switch[sw] = per_src_switch.get(sw, 0) + 1
    if pairs:
        sw, _ = topo.host_switch(pairs[0][0])
        uplinks = max(1, len(next_hops(topo, sw, pairs[0][1])))
    bib = balls_in_bins(max(per_src_switch.values(), default=0), uplinks, seed=seed)
    return EcmpExpectation(
        trials=trials,
        expected_goodput_bps=float(g.mean()) if g.size else 0.0,
        goodput_p10_bps=percentile(goodputs, 10) or 0.0,
        goodput_p90_bps=percentile(goodputs, 90) or 0.0,
        ideal_bps=ideal,
        expected_fraction=float(g.mean() / ideal) if ideal > 0 and g.size else 0.0,
        expected_max_load=float(np.mean(max_loads)) if max_loads else 0.0,
        expected_colliding_flows=float(np.mean(colliding)) if colliding else 0.0,
        prob_any_collision=float(np.mean([c > 0 for c in colliding])) if colliding else 0.0,
        balls_in_bins=bib,
    )


# --------------------------------------------------------------------------------------------------
# Link counters over time


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


# --------------------------------------------------------------------------------------------------
# CPU and fidelity


@dataclass
class Fidelity:
    cpu_idle_min: float | None
    cpu_idle_mean: float | None
    switch_pps_peak: float
    ovs_ceiling_pps: float
    drops_outside_queues: int
    packets_forwarded: int
    trusted: bool
    reasons: list[str]

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def fidelity_verdict(idle: Iterable[float], switch_pps: float, drops_outside: int, packets: int,
                     ceiling: float = OVS_CEILING_PPS) -> Fidelity:
    """Whether the emulator kept up: CPU idle above MIN_IDLE, OVS below its ceiling, no stray drops."""
    idle = [x for x in idle if x is not None]
    lo = min(idle) if idle else None
    mean = float(np.mean(idle)) if idle else None
    reasons = []
    if lo is not None and lo < MIN_IDLE:
        reasons.append(f"CPU idle fell to {lo:.0%} (under {MIN_IDLE:.0%}): the emulator, not the fabric, "
                       "may be the bottleneck; lower the link rates or the number of flows")
    if switch_pps >= CEILING_WARN * ceiling:
        reasons.append(f"switches forwarded {switch_pps / 1e3:.0f} kpps, near userspace OVS's ceiling of "
                       f"~{ceiling / 1e3:.0f} kpps: lower the link rates")
    if packets > 0 and drops_outside > OUTSIDE_DROP_WARN * packets:
        reasons.append(f"{drops_outside} packets were dropped outside the shaped queues (socket buffers or "
                       "OVS itself): the hosts or switches could not keep up; lower the rates")
    return Fidelity(
        cpu_idle_min=None if lo is None else round(lo, 4),
        cpu_idle_mean=None if mean is None else round(mean, 4),
        switch_pps_peak=round(switch_pps, 1),
        ovs_ceiling_pps=ceiling,
        drops_outside_queues=int(drops_outside),
        packets_forwarded=int(packets),
        trusted=not reasons,
        reasons=reasons,
    )


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


# --------------------------------------------------------------------------------------------------
# Flow completion time against the ideal: the slowdown htsim and ns-3 report
#
# ideal FCT = bytes on the wire / bottleneck rate + base RTT; slowdown = FCT / ideal FCT. The bytes on
# the wire are the flow's payload plus every packet's headers as a shaped link counts them (HTB counts
# the Ethernet header, not the preamble, FCS or inter-frame gap).

# Linux's TCP over a 1500-byte MTU: 1448 payload bytes per segment (timestamps on), 66 bytes of headers.
TCP_PMTU = 1500
TCP_MSS = 1448
TCP_ACK_FRAME = IPV4_HEADER + 32 + ETHERNET_HEADER


@dataclass(frozen=True)
class Framing:
    """How a transport cuts a flow into packets: at most `payload` bytes per packet, `overhead` bytes of
    headers on the link per packet, a new packet at every `message` bytes (0 = one byte stream), and
    `ack` bytes per ACK frame on the way back."""

    payload: int
    overhead: int
    message: int = 0
    ack: int = 0


def srd_framing(mtu: int = 1400, message_size: int = 65536) -> Framing:
    """The transport's DATA datagrams: `mtu` bytes of UDP payload including its own 42-byte header, cut
    per message, plus UDP, IPv4 and Ethernet: 84 bytes of overhead per packet
    (transport.core.headers.DATA_WIRE_OVERHEAD)."""
    return Framing(payload=mtu - DATA_HEADER_LEN, overhead=DATA_WIRE_OVERHEAD, message=message_size, ack=ACK_FRAME)


def tcp_framing(mss: int = TCP_MSS, pmtu: int = TCP_PMTU) -> Framing:
    """TCP segments of `mss` payload bytes in IP packets of `pmtu` bytes, plus Ethernet."""
    return Framing(payload=mss, overhead=pmtu - mss + ETHERNET_HEADER, message=0, ack=TCP_ACK_FRAME)


def wire_bytes(size: int, framing: Framing) -> int:
    """Bytes a flow of `size` payload bytes puts on each link of its path (its packets' headers included)."""
    if size <= 0:
        return 0
    per_message = framing.message if framing.message > 0 else size
    full, rest = divmod(size, per_message)
    packets = full * math.ceil(per_message / framing.payload) + math.ceil(rest / framing.payload)
    return size + packets * framing.overhead


def path_links(topo: Topology, src: str, dst: str) -> list[Link]:
    """The links of one shortest src->dst path (the first next hop at every step; equal-cost paths have
    as many hops)."""
    links: list[Link] = []
    node = src
    while node != dst:
        hops = next_hops(topo, node, dst)
        if not hops or len(links) > 64:
            raise ValueError(f"{dst} is unreachable from {node}")
        links.append(hops[0])
        node = hops[0].peer(node)
    return links


def bottleneck_bps(topo: Topology, src: str, dst: str) -> float:
    """The rate a src->dst flow gets alone in the fabric, spread over every equal-cost path: the lowest
    link rate along its path, unless parallel fabric links slower than the host links add up to less."""
    return ideal_bps(topo, [(src, dst)])


def topology_base_rtt(topo: Topology, src: str, dst: str, framing: Framing) -> float:
    """Base RTT from the fabric's description when the endpoint measured none: propagation both ways
    plus, at every hop, storing and forwarding one full packet out and one ACK back."""
    packet = framing.payload + framing.overhead
    rtt = 0.0
    for lk in path_links(topo, src, dst):
        rtt += 2 * lk.delay_ms / 1e3 + 8 * (packet + framing.ack) / (lk.rate_mbps * 1e6)
    return rtt


def wire_efficiency(framing: Framing, size: int = 64 << 20) -> float:
    """Payload bytes per byte on the wire for a long transfer cut this way (ACKs, which travel the
    other way, are not counted)."""
    return size / wire_bytes(size, framing)


def first_packet_bytes(size: int, framing: Framing) -> int:
    """Bytes on the wire of a flow's first packet."""
    if size <= 0:
        return 0
    per_message = framing.message if framing.message > 0 else size
    return min(size, per_message, framing.payload) + framing.overhead


def ideal_fct(size: int, framing: Framing, bottleneck: float, base_rtt: float) -> float:
    """Seconds a flow of `size` bytes takes alone on an idle fabric: one base RTT (the first packet out,
    its ACK back), and the rest of its bytes on the wire behind it at the bottleneck rate.

    The first packet's own serialisation is part of the base RTT, so it is not counted twice: a
    transfer that keeps the bottleneck busy from its first byte has a slowdown of exactly 1.
    """
    return base_rtt + 8 * (wire_bytes(size, framing) - first_packet_bytes(size, framing)) / bottleneck


def slowdown(fct: float, ideal: float) -> float | None:
    """FCT / ideal FCT (1.0 = as fast as the fabric allows); None without both."""
    if fct is None or ideal is None or ideal <= 0:
        return None
    return fct / ideal
