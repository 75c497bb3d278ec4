"""Builders for the standard fabrics, and the deterministic address plan every topology uses.

Address plan: the i-th host (1-based, in node order) gets ip 10.0.{i >> 8}.{i & 255}/16 and mac
02:00:00:00:{i >> 8:02x}:{i & 255:02x}; the j-th switch gets dpid j. Rates are in Mbit/s: fabriclab
emulates on a couple of CPU cores (userspace OVS moves about 100 kpps in total), so the defaults are
tens of Mbit/s, low enough that the emulated links, not the CPU, are the bottleneck.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable

from topologies.model import DEFAULT_MTU, Link, Node, Topology
from topologies.validate import (
    SpecError,
    check_count,
    check_delay,
    check_ifname,
    check_loss,
    check_mtu,
    check_queue,
    check_rate,
    check_size,
    validate,
)

log = logging.getLogger(__name__)

SUBNET = "10.0.0.0/16"
PREFIX_LEN = 16
# Host i maps to 10.0.(i >> 8).(i & 255); 65535 would be the /16 broadcast address.
MAX_HOSTS = 65534


def host_ip(i: int) -> str:
    """Address-plan IP (CIDR form) of host number `i` (1-based)."""
    return f"10.0.{i >> 8}.{i & 255}/{PREFIX_LEN}"


def host_mac(i: int) -> str:
    """Address-plan MAC of host number `i` (1-based); 02: is a locally administered unicast prefix."""
    return f"02:00:00:00:{i >> 8:02x}:{i & 255:02x}"


def _check_host_count(count: int) -> None:
    if count > MAX_HOSTS:
        raise SpecError(f"{count} hosts do not fit the address plan {SUBNET} (at most {MAX_HOSTS}); use fewer hosts")


def assign_addresses(nodes: Iterable[Node]) -> tuple[Node, ...]:
    """Fill in missing host ip/mac and switch dpid from the address plan; explicit values are kept.

    Numbering is by position (host i, switch j, in node order) whether or not a value was explicit,
    so a node's planned address does not depend on which other nodes were given addresses.
    Uniqueness is checked by `validate()`.
    """
    nodes = tuple(nodes)
    _check_host_count(sum(1 for n in nodes if n.is_host))
    out = []
    hosts = switches = 0
    for n in nodes:
        if n.is_host:
            hosts += 1
            n = dataclasses.replace(n, ip=n.ip or host_ip(hosts), mac=n.mac or host_mac(hosts))
        elif n.is_switch:
            switches += 1
            n = dataclasses.replace(n, dpid=n.dpid if n.dpid is not None else switches)
        out.append(n)
    return tuple(out)


def leaf_spine(
    spines: int = 2,
    leaves: int = 2,
    hosts_per_leaf: int = 2,
    host_rate: float = 20.0,
    fabric_rate: float | None = None,
    delay_ms: float = 0.0,
    loss_pct: float = 0.0,
    queue_packets: int | None = None,
    mtu: int = DEFAULT_MTU,
) -> Topology:
    """A two-tier Clos: every leaf links to every spine; hosts hang off leaves.

    Names: spine1..S, leaf1..L, hosts h1..hN numbered leaf by leaf (label {"leaf": "leafK"}).
    Ports: a host uses port 0; leaf K has host ports 1..H and its uplink to spine j on port H+j;
    spine j reaches leaf K on port K. `fabric_rate` (leaf-spine links) defaults to `host_rate`;
    params["oversubscription"] = H * host_rate / (S * fabric_rate). `delay_ms`, `loss_pct` and
    `queue_packets` apply to every link; `mtu` to every interface.
    """
    spines = check_count(spines, "spines", "spines=4")
    leaves = check_count(leaves, "leaves", "leaves=4")
    hosts_per_leaf = check_count(hosts_per_leaf, "hosts_per_leaf", "hosts_per_leaf=2")
    host_rate = check_rate(host_rate, "host_rate", "host_rate=20")
    fabric_rate = host_rate if fabric_rate is None else check_rate(fabric_rate, "fabric_rate", "fabric_rate=20")
    delay_ms, loss_pct, queue_packets = _impairments(delay_ms, loss_pct, queue_packets)
    _check_host_count(leaves * hosts_per_leaf)
    # Fail on the longest interface names before building anything large.
    check_ifname(f"spine{spines}", leaves)
    check_ifname(f"leaf{leaves}", hosts_per_leaf + spines)
    check_ifname(f"h{leaves * hosts_per_leaf}", 0)
    n_hosts = leaves * hosts_per_leaf
    check_size(spines + leaves + n_hosts, n_hosts + leaves * spines, f"leaf-spine {spines}x{leaves}x{hosts_per_leaf}")

    def link(a: str, a_port: int, b: str, b_port: int, rate: float) -> Link:
        return Link(a, a_port, b, b_port, rate, delay_ms, loss_pct, queue_packets)

    nodes = [Node(f"spine{j}", "spine") for j in range(1, spines + 1)]
    nodes += [Node(f"leaf{k}", "leaf") for k in range(1, leaves + 1)]
    links = []
    for k in range(1, leaves + 1):
        for i in range(1, hosts_per_leaf + 1):
            host = f"h{(k - 1) * hosts_per_leaf + i}"
            nodes.append(Node(host, "host", labels={"leaf": f"leaf{k}"}))
            links.append(link(host, 0, f"leaf{k}", i, host_rate))
    for k in range(1, leaves + 1):
        for j in range(1, spines + 1):
            links.append(link(f"leaf{k}", hosts_per_leaf + j, f"spine{j}", k, fabric_rate))
    params = {
        "builder": "leaf-spine",
        "spines": spines,
        "leaves": leaves,
        "hosts_per_leaf": hosts_per_leaf,
        "host_rate": host_rate,
        "fabric_rate": fabric_rate,
        "delay_ms": delay_ms,
        "loss_pct": loss_pct,
        "queue_packets": queue_packets,
        "oversubscription": hosts_per_leaf * host_rate / (spines * fabric_rate),
    }
    return _finish(f"leaf-spine-{spines}x{leaves}x{hosts_per_leaf}", nodes, links, params, mtu)


def in_server(
    servers: int = 2,
    gpus_per_server: int = 8,
    gpu_rate: float = 100.0,
    nic_rate: float = 20.0,
    nics_per_server: int = 1,
    delay_ms: float = 0.0,
    loss_pct: float = 0.0,
    queue_packets: int | None = None,
    mtu: int = DEFAULT_MTU,
) -> Topology:
    """GPU servers: each server's GPUs sit on a local (NVSwitch-like) switch whose NICs go to one ToR.

    Names: tor1; nv{S} (role "local") per server; GPUs s{S}g{G} (role "gpu", label {"server": "s{S}"}).
    Ports: a GPU uses port 0; nv{S} has GPU ports 1..G and NIC uplinks G+1..G+nics; on tor1, server
    s's NIC n is port (s-1)*nics + n. Defaults: GPU links 100 Mbit/s and one 20 Mbit/s NIC per server,
    so the in-server fabric is 5x faster per GPU than the NIC, like NVLink against the scale-out
    network, while staying well within what two emulator cores can forward. params["oversubscription"]
    = G * gpu_rate / (nics * nic_rate). `delay_ms`, `loss_pct` and `queue_packets` apply to every link;
    `mtu` to every interface.
    """
    servers = check_count(servers, "servers", "servers=2")
    gpus_per_server = check_count(gpus_per_server, "gpus_per_server", "gpus_per_server=8")
    gpu_rate = check_rate(gpu_rate, "gpu_rate", "gpu_rate=100")
    nic_rate = check_rate(nic_rate, "nic_rate", "nic_rate=20")
    nics_per_server = check_count(nics_per_server, "nics_per_server", "nics_per_server=1")
    delay_ms, loss_pct, queue_packets = _impairments(delay_ms, loss_pct, queue_packets)
    _check_host_count(servers * gpus_per_server)
    check_ifname("tor1", servers * nics_per_server)
    check_ifname(f"nv{servers}", gpus_per_server + nics_per_server)
    check_ifname(f"s{servers}g{gpus_per_server}", 0)
    check_size(1 + servers * (1 + gpus_per_server), servers * (gpus_per_server + nics_per_server),
               f"in-server {servers}x{gpus_per_server}")

    def link(a: str, a_port: int, b: str, b_port: int, rate: float) -> Link:
        return Link(a, a_port, b, b_port, rate, delay_ms, loss_pct, queue_packets)

    nodes = [Node("tor1", "tor")]
    nodes += [Node(f"nv{s}", "local", labels={"server": f"s{s}"}) for s in range(1, servers + 1)]
    links = []
    for s in range(1, servers + 1):
        for g in range(1, gpus_per_server + 1):
            gpu = f"s{s}g{g}"
            nodes.append(Node(gpu, "gpu", labels={"server": f"s{s}"}))
            links.append(link(gpu, 0, f"nv{s}", g, gpu_rate))
    for s in range(1, servers + 1):
        for n in range(1, nics_per_server + 1):
            links.append(link(f"nv{s}", gpus_per_server + n, "tor1", (s - 1) * nics_per_server + n, nic_rate))
    params = {
        "builder": "in-server",
        "servers": servers,
        "gpus_per_server": gpus_per_server,
        "gpu_rate": gpu_rate,
        "nic_rate": nic_rate,
        "nics_per_server": nics_per_server,
        "delay_ms": delay_ms,
        "loss_pct": loss_pct,
        "queue_packets": queue_packets,
        "oversubscription": gpus_per_server * gpu_rate / (nics_per_server * nic_rate),
    }
    return _finish(f"in-server-{servers}x{gpus_per_server}", nodes, links, params, mtu)


@dataclasses.dataclass(frozen=True)
class _Tiers:
    """Shape, names and roles of a three-tier Clos (a fat-tree is one with k/2 of everything)."""

    pods: int
    edges: int  # bottom-tier switches per pod (hosts hang off them)
    aggs: int  # middle-tier switches per pod: one plane each
    per_plane: int  # top-tier switches per plane: middle switch j of every pod links to plane j
    hosts: int  # per bottom-tier switch
    roles: tuple[str, str, str]  # bottom, middle, top
    edge_name: Callable[[int, int], str]
    agg_name: Callable[[int, int], str]
    top_name: Callable[[int], str]


def _three_tier(
    shape: _Tiers,
    rates: tuple[float, float, float],
    delay_ms: float,
    loss_pct: float,
    queue_packets: int | None,
) -> tuple[list[Node], list[Link]]:
    """Nodes (top tier, middle tier, bottom tier, hosts: that order fixes DPIDs and IPs) and links.

    Ports: a host uses port 0; bottom switch e of a pod has host ports 1..H and its uplink to middle
    switch a on port H+a; middle switch a reaches bottom switch e on port e and the m-th top switch of
    its plane on port E+m; top switch x (plane a, m-th in it) reaches pod p on port p.
    """
    t = shape
    bottom, middle, top = t.roles
    host_rate, mid_rate, top_rate = rates

    def link(a: str, a_port: int, b: str, b_port: int, rate: float) -> Link:
        return Link(a, a_port, b, b_port, rate, delay_ms, loss_pct, queue_packets)

    pods = range(1, t.pods + 1)
    nodes = [
        Node(t.top_name((a - 1) * t.per_plane + m), top, labels={"plane": str(a)})
        for a in range(1, t.aggs + 1)
        for m in range(1, t.per_plane + 1)
    ]
    nodes += [Node(t.agg_name(p, a), middle, labels={"pod": f"p{p}"}) for p in pods for a in range(1, t.aggs + 1)]
    nodes += [Node(t.edge_name(p, e), bottom, labels={"pod": f"p{p}"}) for p in pods for e in range(1, t.edges + 1)]
    links = []
    host = 0
    for p in pods:
        for e in range(1, t.edges + 1):
            edge = t.edge_name(p, e)
            for i in range(1, t.hosts + 1):
                host += 1
                nodes.append(Node(f"h{host}", "host", labels={bottom: edge, "pod": f"p{p}"}))
                links.append(link(f"h{host}", 0, edge, i, host_rate))
    for p in pods:
        for e in range(1, t.edges + 1):
            for a in range(1, t.aggs + 1):
                links.append(link(t.edge_name(p, e), t.hosts + a, t.agg_name(p, a), e, mid_rate))
    for p in pods:
        for a in range(1, t.aggs + 1):
            for m in range(1, t.per_plane + 1):
                top_switch = t.top_name((a - 1) * t.per_plane + m)
                links.append(link(t.agg_name(p, a), t.edges + m, top_switch, p, top_rate))
    return nodes, links


def _check_three_tier(t: _Tiers) -> None:
    """Fail on the host count and the longest interface names before building anything large."""
    _check_host_count(t.pods * t.edges * t.hosts)
    check_ifname(t.top_name(t.aggs * t.per_plane), t.pods)
    check_ifname(t.agg_name(t.pods, t.aggs), t.edges + t.per_plane)
    check_ifname(t.edge_name(t.pods, t.edges), t.hosts + t.aggs)
    check_ifname(f"h{t.pods * t.edges * t.hosts}", 0)
    hosts, tops = t.pods * t.edges * t.hosts, t.aggs * t.per_plane
    check_size(t.pods * (t.edges + t.aggs) + hosts + tops, hosts + t.pods * t.aggs * (t.edges + t.per_plane),
               f"{'/'.join(t.roles)} fabric of {t.pods} pods")


def fat_tree(
    k: int = 4,
    host_rate: float = 20.0,
    agg_rate: float | None = None,
    core_rate: float | None = None,
    delay_ms: float = 0.0,
    loss_pct: float = 0.0,
    queue_packets: int | None = None,
    mtu: int = DEFAULT_MTU,
) -> Topology:
    """The k-ary fat-tree: k pods of k/2 edge and k/2 aggregation switches, (k/2)^2 cores, k^3/4 hosts.

    Names: cores c1..c(k/2)^2 (role "core", label {"plane": "a"}); per pod p aggregation switches
    p{p}a1.. (role "agg") and edge switches p{p}e1.. (role "edge"), label {"pod": "p{p}"}; hosts h1..
    numbered pod by pod, edge by edge (labels {"edge": "p{p}e{e}", "pod": "p{p}"}). Aggregation switch a
    of every pod links to the a-th group of k/2 cores (plane a). Ports as in `_three_tier`.
    `agg_rate` (edge-agg links) and `core_rate` (agg-core links) default to `host_rate`.
    """
    k = check_count(k, "k", "k=4")
    if k % 2:
        raise SpecError(f"k={k} must be even (k pods of k/2 edge and k/2 aggregation switches); use e.g. k=4")
    half = k // 2
    shape = _Tiers(
        pods=k,
        edges=half,
        aggs=half,
        per_plane=half,
        hosts=half,
        roles=("edge", "agg", "core"),
        edge_name=lambda p, e: f"p{p}e{e}",
        agg_name=lambda p, a: f"p{p}a{a}",
        top_name=lambda x: f"c{x}",
    )
    rates, common = _tier_rates(host_rate, agg_rate, core_rate, ("host_rate", "agg_rate", "core_rate"))
    delay_ms, loss_pct, queue_packets = _impairments(delay_ms, loss_pct, queue_packets)
    _check_three_tier(shape)
    nodes, links = _three_tier(shape, rates, delay_ms, loss_pct, queue_packets)
    params = {
        "builder": "fat-tree",
        "k": k,
        **common,
        "delay_ms": delay_ms,
        "loss_pct": loss_pct,
        "queue_packets": queue_packets,
        **_oversubscription(shape, rates),
    }
    return _finish(f"fat-tree-k{k}", nodes, links, params, mtu)


def clos(
    pods: int = 2,
    leaves: int = 2,
    spines: int = 2,
    superspines: int = 4,
    hosts_per_leaf: int = 2,
    host_rate: float = 20.0,
    spine_rate: float | None = None,
    superspine_rate: float | None = None,
    delay_ms: float = 0.0,
    loss_pct: float = 0.0,
    queue_packets: int | None = None,
    mtu: int = DEFAULT_MTU,
) -> Topology:
    """A three-tier Clos: pods of leaves and spines, joined by super-spines in planes.

    Every leaf links to every spine of its pod; spine j of every pod links to the j-th plane of
    superspines/spines super-spines (so `superspines` must be a multiple of `spines`). Names: super-spines
    ss1.. (role "superspine", label {"plane": "j"}); per pod p spines p{p}s1.. (role "spine") and leaves
    p{p}l1.. (role "leaf"), label {"pod": "p{p}"}; hosts h1.. numbered pod by pod, leaf by leaf (labels
    {"leaf": "p{p}l{l}", "pod": "p{p}"}). Ports as in `_three_tier`. `spine_rate` (leaf-spine links) and
    `superspine_rate` (spine-super-spine links) default to `host_rate`.
    """
    pods = check_count(pods, "pods", "pods=2")
    leaves = check_count(leaves, "leaves", "leaves=2")
    spines = check_count(spines, "spines", "spines=2")
    superspines = check_count(superspines, "superspines", "superspines=4")
    hosts_per_leaf = check_count(hosts_per_leaf, "hosts_per_leaf", "hosts_per_leaf=2")
    if superspines % spines:
        raise SpecError(
            f"superspines={superspines} must be a multiple of spines={spines} (spine j of every pod links to "
            f"plane j of superspines/spines super-spines); use e.g. superspines={-(-superspines // spines) * spines}"
        )
    shape = _Tiers(
        pods=pods,
        edges=leaves,
        aggs=spines,
        per_plane=superspines // spines,
        hosts=hosts_per_leaf,
        roles=("leaf", "spine", "superspine"),
        edge_name=lambda p, e: f"p{p}l{e}",
        agg_name=lambda p, a: f"p{p}s{a}",
        top_name=lambda x: f"ss{x}",
    )
    rates, common = _tier_rates(host_rate, spine_rate, superspine_rate, ("host_rate", "spine_rate", "superspine_rate"))
    delay_ms, loss_pct, queue_packets = _impairments(delay_ms, loss_pct, queue_packets)
    _check_three_tier(shape)
    nodes, links = _three_tier(shape, rates, delay_ms, loss_pct, queue_packets)
    params = {
        "builder": "clos",
        "pods": pods,
        "leaves": leaves,
        "spines": spines,
        "superspines": superspines,
        "hosts_per_leaf": hosts_per_leaf,
        **common,
        "delay_ms": delay_ms,
        "loss_pct": loss_pct,
        "queue_packets": queue_packets,
        **_oversubscription(shape, rates),
    }
    return _finish(f"clos-{pods}x{leaves}x{spines}x{superspines}x{hosts_per_leaf}", nodes, links, params, mtu)


def _tier_rates(
    host_rate: float, mid_rate: float | None, top_rate: float | None, names: tuple[str, str, str]
) -> tuple[tuple[float, float, float], dict[str, float]]:
    """Checked (host, middle, top) link rates, the upper two defaulting to the host rate."""
    host_rate = check_rate(host_rate, names[0], f"{names[0]}=20")
    mid = host_rate if mid_rate is None else check_rate(mid_rate, names[1], f"{names[1]}=20")
    top = host_rate if top_rate is None else check_rate(top_rate, names[2], f"{names[2]}=20")
    return (host_rate, mid, top), dict(zip(names, (host_rate, mid, top), strict=True))


def _impairments(delay_ms: float, loss_pct: float, queue_packets: int | None) -> tuple[float, float, int | None]:
    return (
        check_delay(delay_ms, "delay_ms", "delay_ms=0.5"),
        check_loss(loss_pct, "loss_pct", "loss_pct=1"),
        check_queue(queue_packets, "queue_packets", "queue_packets=100"),
    )


def _oversubscription(t: _Tiers, rates: tuple[float, float, float]) -> dict[str, float]:
    """Bottom tier: host capacity over uplink capacity (as for leaf-spine); middle tier: downlink
    capacity over uplink capacity, under f"{middle role}_oversubscription"."""
    host_rate, mid_rate, top_rate = rates
    return {
        "oversubscription": t.hosts * host_rate / (t.aggs * mid_rate),
        f"{t.roles[1]}_oversubscription": t.edges * mid_rate / (t.per_plane * top_rate),
    }


def _finish(name: str, nodes: list[Node], links: list[Link], params: dict, mtu: int = DEFAULT_MTU) -> Topology:
    """Address the nodes, assemble and validate: the last step every builder shares."""
    mtu = check_mtu(mtu, "mtu", "mtu=9000")
    topo = Topology(name, assign_addresses(nodes), tuple(links), params, mtu)
    log.debug("built %s: %d nodes, %d links", topo.name, len(topo.nodes), len(topo.links))
    return validate(topo)


# Builder name (as typed in a spec) -> function.
BUILDERS: dict[str, Callable[..., Topology]] = {
    "leaf-spine": leaf_spine,
    "in-server": in_server,
    "fat-tree": fat_tree,
    "clos": clos,
}
