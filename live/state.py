"""Pure numbers of the live view: successive `GET /links` samples in, what the page shows out.

Per link direction: utilisation as a fraction of the link's rate. Over the fabric: aggregate goodput,
link imbalance and hot links with the experiments' own definitions (experiments.analysis: max/mean
over the switch-to-switch link directions; hot = at least HOT_UTIL full and HOT_OVER_MEAN above the
mean), kept as time series with the events (mode switches, link cuts, loss) that explain them.

ECMP's hash placement is not visible in port counters, so it is *inferred*: a flow can only be on an
equal-cost path whose every switch-to-switch hop carries bytes. When exactly one path qualifies the
placement is certain; otherwise the view lists the candidates and says so.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise
from typing import Any

from experiments.analysis.links import HOT_OVER_MEAN, HOT_UTIL, fabric_hops, hop_label
from experiments.analysis.placement import Hop
from live.layout import node_levels
from topologies import Topology, equal_cost_paths

# A link direction "carries" a flow's bytes above this utilisation; below it are ACKs and noise
# (acknowledgements of the reverse flows are a few percent of a data flow at most).
CARRY_UTIL = 0.05
HISTORY_POINTS = 600  # 5 minutes at two samples a second
EVENT_LIMIT = 200
BYTES_WINDOW_S = 10.0  # per-uplink bytes are shown over this window


# --------------------------------------------------------------------------------------------------
# One sample


def directed_util(sample: dict[str, Any], previous: dict[str, Any] | None = None) -> dict[Hop, float]:
    """Utilisation (fraction of rate) of every link direction in a `GET /links` sample.

    The controller's own rates (util_ab, util_ba) are used when present: they come from the switch's
    port counters over the controller's poll interval, timed by the port's own clock. Differencing two
    of our samples instead aliases against that interval (a window that holds zero or two polls reads
    0 % or 200 %). Byte deltas against `previous` are the fallback for samples without rates.
    """
    prev = {lk["name"]: lk for lk in previous["links"]} if previous else {}
    dt = float(sample.get("time", 0.0)) - float(previous.get("time", 0.0)) if previous else 0.0
    out: dict[Hop, float] = {}
    for lk in sample.get("links", []):
        ab, ba = lk.get("util_ab"), lk.get("util_ba")
        if ab is None or ba is None:
            p = prev.get(lk["name"])
            capacity = float(lk.get("rate_mbps", 0.0)) * 1e6
            if p is not None and dt > 0 and capacity > 0:
                ab = max(0, lk.get("tx_bytes", 0) - p.get("tx_bytes", 0)) * 8 / dt / capacity
                ba = max(0, lk.get("rx_bytes", 0) - p.get("rx_bytes", 0)) * 8 / dt / capacity
            else:
                ab = ba = 0.0
        out[(lk["name"], lk["a"])] = max(0.0, float(ab))
        out[(lk["name"], lk["b"])] = max(0.0, float(ba))
    return out


def down_links(sample: dict[str, Any]) -> set[str]:
    return {lk["name"] for lk in sample.get("links", []) if not lk.get("up", True)}


def hop_bytes(sample: dict[str, Any]) -> dict[Hop, int]:
    """Cumulative bytes per link direction (tx = a->b, rx = b->a, as the controller reports them)."""
    out: dict[Hop, int] = {}
    for lk in sample.get("links", []):
        out[(lk["name"], lk["a"])] = int(lk.get("tx_bytes", 0))
        out[(lk["name"], lk["b"])] = int(lk.get("rx_bytes", 0))
    return out


@dataclass
class FabricMetrics:
    goodput_bps: float  # delivered to the hosts (switch -> host directions), wire bytes
    imbalance: float  # max / mean utilisation over the fabric link directions that are up
    mean_util: float
    peak_util: float
    hot: list[Hop]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["hot"] = [{"link": h[0], "from": h[1], "label": hop_label(h)} for h in self.hot]
        d["hot_count"] = len(self.hot)
        return d


def fabric_metrics(topo: Topology, util: dict[Hop, float], down: Iterable[str] = ()) -> FabricMetrics:
    """Goodput, imbalance and hot links of one moment, as experiments.analysis.summarise_links defines
    them over a window. A cut link is left out of the mean: it is capacity the fabric does not have,
    not capacity the routing wastes."""
    fabric = fabric_hops(topo)
    down = set(down)
    values = {(lk.name, end): util.get((lk.name, end), 0.0) for lk in topo.links
              if lk.name in fabric and lk.name not in down for end in (lk.a, lk.b)}
    mean = sum(values.values()) / len(values) if values else 0.0
    peak = max(values.values(), default=0.0)
    hot = sorted((h for h, u in values.items() if u >= HOT_UTIL and u >= HOT_OVER_MEAN * mean), key=hop_label)
    goodput = 0.0
    for lk in topo.links:
        for host, switch in ((lk.a, lk.b), (lk.b, lk.a)):
            if topo.node(host).is_host and topo.node(switch).is_switch:
                goodput += util.get((lk.name, switch), 0.0) * lk.rate_mbps * 1e6
    return FabricMetrics(goodput_bps=goodput, imbalance=peak / mean if mean > 0 else 0.0, mean_util=mean,
                         peak_util=peak, hot=hot)


# --------------------------------------------------------------------------------------------------
# Where the flows go (inferred)


def path_hops(topo: Topology, path: Sequence[str]) -> list[Hop]:
    """The link directions along a node path (the first of parallel links)."""
    hops = []
    for x, y in pairwise(path):
        lk = topo.links_between(x, y)[0]
        hops.append((lk.name, x))
    return hops


def _switch_hops(topo: Topology, hops: Sequence[Hop]) -> list[Hop]:
    fabric = fabric_hops(topo)
    return [h for h in hops if h[0] in fabric]


def via(path: Sequence[str]) -> str:
    """What distinguishes one equal-cost path: the nodes between the two edge switches."""
    inner = list(path[2:-2])
    return ">".join(inner) if inner else "local"


@dataclass
class FlowPlacement:
    src: str
    dst: str
    src_edge: str
    paths: list[str]  # every equal-cost path that is up, by `via`
    carrying: list[str]  # paths whose every switch-to-switch hop carries bytes
    uplinks: list[str]  # hop labels of the first fabric hop of the carrying paths
    certain: bool  # exactly one path carries: the flow is on it (assuming one path per flow)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def infer_placement(topo: Topology, flows: Sequence[tuple[str, str]], util: dict[Hop, float],
                    down: Iterable[str] = (), threshold: float = CARRY_UTIL,
                    one_path_per_flow: bool = False) -> list[FlowPlacement]:
    """Which equal-cost paths each flow could be on, given which link directions carry bytes.

    A path qualifies when every switch-to-switch hop on it carries bytes. With `one_path_per_flow`
    (the transport's single policy: one source port, so one hashed path) a busy hop that only one
    flow could explain must be that flow's: its other candidates are dropped, repeatedly, until
    nothing changes.
    """
    down_set = set(down)
    down_objs = [lk for lk in topo.links if lk.name in down_set]
    rows = []
    for src, dst in flows:
        paths = equal_cost_paths(topo, src, dst, down_objs)
        hops = [_switch_hops(topo, path_hops(topo, p)) for p in paths]
        ok = [i for i, h in enumerate(hops) if h and all(util.get(x, 0.0) >= threshold for x in h)]
        rows.append((src, dst, paths, hops, ok))
    if one_path_per_flow:
        changed = True
        while changed:
            changed = False
            busy = {x for *_, hops, ok in rows for i in ok for x in hops[i]}
            for hop in busy:
                could = [r for r in rows if any(hop in r[3][i] for i in r[4])]
                if len(could) == 1:
                    r = could[0]
                    keep = [i for i in r[4] if hop in r[3][i]]
                    if len(keep) < len(r[4]):
                        r[4][:] = keep
                        changed = True
    out = []
    for src, dst, paths, hops, ok in rows:
        uplinks: list[str] = []
        for i in ok:
            label = hop_label(hops[i][0])
            if label not in uplinks:
                uplinks.append(label)
        src_edge = paths[0][1] if paths and len(paths[0]) > 2 else topo.host_switch(src)[0]
        out.append(FlowPlacement(src, dst, src_edge, [via(p) for p in paths], [via(paths[i]) for i in ok],
                                 uplinks, certain=len(ok) == 1))
    return out


def uplink_table(topo: Topology, placements: Sequence[FlowPlacement], util: dict[Hop, float],
                 window_bytes: dict[Hop, int]) -> list[dict[str, Any]]:
    """Per uplink of every edge switch: utilisation, bytes over the window, and the flows from that
    switch that the counters put on it (`ambiguous` when one of them could also be elsewhere)."""
    level = node_levels(topo)
    rows = []
    for lk in topo.links:
        for low, high in ((lk.a, lk.b), (lk.b, lk.a)):
            if level[low] != 1 or level[high] <= 1:
                continue
            hop = (lk.name, low)
            label = hop_label(hop)
            on = [p for p in placements if label in p.uplinks]
            rows.append({
                "link": lk.name, "from": low, "to": high, "label": label,
                "util": round(util.get(hop, 0.0), 4), "bytes": int(window_bytes.get(hop, 0)),
                "flows": [f"{p.src}->{p.dst}" for p in on],
                "ambiguous": any(not p.certain for p in on),
            })
    rows.sort(key=lambda r: (r["from"], r["to"]))
    return rows


# --------------------------------------------------------------------------------------------------
# Over time


@dataclass
class Event:
    id: int
    t: float  # UNIX time
    kind: str  # mode, policy, link_down, link_up, loss, workload, controller, info
    text: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class LiveState:
    """Successive samples -> the current picture, time series and events. Not thread-safe: one owner."""

    def __init__(self, topo: Topology, flows: Sequence[tuple[str, str]] = (), history: int = HISTORY_POINTS) -> None:
        self.topo = topo
        self.flows: list[tuple[str, str]] = list(flows)
        self.series: deque[dict[str, float]] = deque(maxlen=history)
        self.events: deque[Event] = deque(maxlen=EVENT_LIMIT)
        self.loss: dict[str, float] = {}
        # The transport's policy is `single`: each flow has one source port, so one path.
        self.one_path_per_flow = False
        self.samples = 0
        self.last_sample: dict[str, Any] | None = None
        self.last_sample_t: float | None = None
        self.util: dict[Hop, float] = {}
        self.down: set[str] = set()
        self.metrics: FabricMetrics | None = None
        self.placements: list[FlowPlacement] = []
        self._bytes: deque[tuple[float, dict[Hop, int]]] = deque()
        self._next_event = 1

    # -- inputs ----------------------------------------------------------------------------------
    def set_flows(self, flows: Sequence[tuple[str, str]]) -> None:
        self.flows = list(flows)

    def set_loss(self, link: str, pct: float) -> None:
        if pct > 0:
            self.loss[link] = pct
        else:
            self.loss.pop(link, None)

    def add_event(self, kind: str, text: str, t: float) -> Event:
        ev = Event(self._next_event, t, kind, text)
        self._next_event += 1
        self.events.append(ev)
        return ev

    def update(self, sample: dict[str, Any], now: float) -> None:
        """Take one `GET /links` body (`now` = when it arrived, UNIX time)."""
        self.util = directed_util(sample, self.last_sample)
        self.down = down_links(sample)
        self.metrics = fabric_metrics(self.topo, self.util, self.down)
        self.placements = infer_placement(self.topo, self.flows, self.util, self.down,
                                          one_path_per_flow=self.one_path_per_flow)
        self._bytes.append((now, hop_bytes(sample)))
        while len(self._bytes) > 2 and now - self._bytes[1][0] >= BYTES_WINDOW_S:
            self._bytes.popleft()
        self.series.append({"t": now, "goodput_bps": round(self.metrics.goodput_bps, 1),
                            "imbalance": round(self.metrics.imbalance, 4), "hot": len(self.metrics.hot)})
        self.last_sample, self.last_sample_t = sample, now
        self.samples += 1

    # -- outputs ---------------------------------------------------------------------------------
    def window_bytes(self) -> dict[Hop, int]:
        if len(self._bytes) < 2:
            return {}
        (_, first), (_, last) = self._bytes[0], self._bytes[-1]
        return {h: max(0, b - first.get(h, 0)) for h, b in last.items()}

    def links_view(self) -> list[dict[str, Any]]:
        hot = set(self.metrics.hot) if self.metrics else set()
        out = []
        for lk in self.topo.links:
            ab, ba = self.util.get((lk.name, lk.a), 0.0), self.util.get((lk.name, lk.b), 0.0)
            out.append({
                "name": lk.name, "a": lk.a, "b": lk.b, "rate_mbps": lk.rate_mbps,
                "up": lk.name not in self.down,
                "util_ab": round(ab, 4), "util_ba": round(ba, 4),
                "hot_ab": (lk.name, lk.a) in hot, "hot_ba": (lk.name, lk.b) in hot,
                "loss_pct": self.loss.get(lk.name, 0.0),
            })
        return out

    def view(self) -> dict[str, Any]:
        """The current picture (what every pushed update carries)."""
        placements = self.placements
        return {
            "links": self.links_view(),
            "metrics": self.metrics.to_dict() if self.metrics else None,
            "placement": {
                "flows": [p.to_dict() for p in placements],
                "uplinks": uplink_table(self.topo, placements, self.util, self.window_bytes()),
                "window_s": BYTES_WINDOW_S,
            },
            "samples": self.samples,
            "t_sample": self.last_sample_t,
        }

    def events_after(self, event_id: int) -> list[dict[str, Any]]:
        return [e.to_dict() for e in self.events if e.id > event_id]

    @property
    def last_event_id(self) -> int:
        return self._next_event - 1

    def snapshot(self) -> dict[str, Any]:
        """Everything, for a page that has just connected."""
        return self.view() | {"series": list(self.series), "events": [e.to_dict() for e in self.events]}
