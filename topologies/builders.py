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

from topologies.model import Link, Node, Topology
from topologies.validate import (
    SpecError,
    check_count,
    check_delay,
    check_ifname,
    check_loss,
    check_queue,
    check_rate,
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
) -> Topology:
    """A two-tier Clos: every leaf links to every spine; hosts hang off leaves.

    Names: spine1..S, leaf1..L, hosts h1..hN numbered leaf by leaf (label {"leaf": "leafK"}).
    Ports: a host uses port 0; leaf K has host ports 1..H and its uplink to spine j on port H+j;
    spine j reaches leaf K on port K. `fabric_rate` (leaf-spine links) defaults to `host_rate`;
    params["oversubscription"] = H * host_rate / (S * fabric_rate). `delay_ms`, `loss_pct` and
    `queue_packets` apply to every link.
    """
    spines = check_count(spines, "spines", "spines=4")
    leaves = check_count(leaves, "leaves", "leaves=4")
    hosts_per_leaf = check_count(hosts_per_leaf, "hosts_per_leaf", "hosts_per_leaf=2")
    host_rate = check_rate(host_rate, "host_rate", "host_rate=20")
    fabric_rate = host_rate if fabric_rate is None else check_rate(fabric_rate, "fabric_rate", "fabric_rate=20")
    delay_ms = check_delay(delay_ms, "delay_ms", "delay_ms=0.5")
    loss_pct = check_loss(loss_pct, "loss_pct", "loss_pct=1")
    queue_packets = check_queue(queue_packets, "queue_packets", "queue_packets=100")
    _check_host_count(leaves * hosts_per_leaf)
    # Fail on the longest interface names before building anything large.
    check_ifname(f"spine{spines}", leaves)
    check_ifname(f"leaf{leaves}", hosts_per_leaf + spines)
    check_ifname(f"h{leaves * hosts_per_leaf}", 0)

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
    return _finish(f"leaf-spine-{spines}x{leaves}x{hosts_per_leaf}", nodes, links, params)


def in_server(
    servers: int = 2,
    gpus_per_server: int = 8,
    gpu_rate: float = 100.0,
    nic_rate: float = 20.0,
    nics_per_server: int = 1,
    delay_ms: float = 0.0,
    loss_pct: float = 0.0,
    queue_packets: int | None = None,
) -> Topology:
    """GPU servers: each server's GPUs sit on a local (NVSwitch-like) switch whose NICs go to one ToR.

    Names: tor1; nv{S} (role "local") per server; GPUs s{S}g{G} (role "gpu", label {"server": "s{S}"}).
    Ports: a GPU uses port 0; nv{S} has GPU ports 1..G and NIC uplinks G+1..G+nics; on tor1, server
    s's NIC n is port (s-1)*nics + n. Defaults: GPU links 100 Mbit/s and one 20 Mbit/s NIC per server,
    so the in-server fabric is 5x faster per GPU than the NIC, like NVLink against the scale-out
    network, while staying well within what two emulator cores can forward. params["oversubscription"]
    = G * gpu_rate / (nics * nic_rate). `delay_ms`, `loss_pct` and `queue_packets` apply to every link.
    """
    servers = check_count(servers, "servers", "servers=2")
    gpus_per_server = check_count(gpus_per_server, "gpus_per_server", "gpus_per_server=8")
    gpu_rate = check_rate(gpu_rate, "gpu_rate", "gpu_rate=100")
    nic_rate = check_rate(nic_rate, "nic_rate", "nic_rate=20")
    nics_per_server = check_count(nics_per_server, "nics_per_server", "nics_per_server=1")
    delay_ms = check_delay(delay_ms, "delay_ms", "delay_ms=0.5")
    loss_pct = check_loss(loss_pct, "loss_pct", "loss_pct=1")
    queue_packets = check_queue(queue_packets, "queue_packets", "queue_packets=100")
    _check_host_count(servers * gpus_per_server)
    check_ifname("tor1", servers * nics_per_server)
    check_ifname(f"nv{servers}", gpus_per_server + nics_per_server)
    check_ifname(f"s{servers}g{gpus_per_server}", 0)

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
    return _finish(f"in-server-{servers}x{gpus_per_server}", nodes, links, params)


def _finish(name: str, nodes: list[Node], links: list[Link], params: dict) -> Topology:
    """Address the nodes, assemble and validate: the last step every builder shares."""
    topo = Topology(name, assign_addresses(nodes), tuple(links), params)
    log.debug("built %s: %d nodes, %d links", topo.name, len(topo.nodes), len(topo.links))
    return validate(topo)


# Builder name (as typed in a spec) -> function.
BUILDERS: dict[str, Callable[..., Topology]] = {"leaf-spine": leaf_spine, "in-server": in_server}
