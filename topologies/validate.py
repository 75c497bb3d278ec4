"""Checks that a topology can be emulated, with one-line errors that name the field and the fix.

`validate()` is the single gate every builder, spec and file passes through. The small `check_*`
helpers are shared with the spec parser and the builders so that a bad number reads the same
wherever it was typed.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections import deque
from collections.abc import Iterable
from typing import Any

from topologies.model import HOST_ROLES, MAX_MTU, MIN_MTU, SWITCH_ROLES, Link, Node, Topology

# Names end up in shell commands and interface names, so keep them to a safe alphabet.
NAME_RE = re.compile(r"[a-z][a-z0-9]*\Z")
# Linux IFNAMSIZ is 16 including the terminating NUL.
MAX_IFNAME = 15
MAC_RE = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}\Z")
MAX_DPID = 2**64 - 1
# OpenFlow 1.3 OFPP_MAX: ports above it are reserved.
MAX_PORT = 0xFFFFFF00
ALL_ROLES = HOST_ROLES + SWITCH_ROLES
# Sizes past which a fabric is refused before it is built: two cores emulate a few hundred nodes at
# most, and a fabric of millions would take minutes and gigabytes just to describe. The settings
# FABRICLAB_MAX_NODES and FABRICLAB_MAX_LINKS (environment variables) raise them for pure analysis.
MAX_NODES = 2048
MAX_LINKS = 8192
# The simulated engine's sizes (simulated_sizes): the field's fabrics (16,384 hosts, Llama 3.1's GPU count,
# is 16,704 nodes and 32,768 links as a two-tier leaf-spine) with room to spare.
SIM_MAX_NODES = 40_000
SIM_MAX_LINKS = 100_000
_defaults = {"nodes": MAX_NODES, "links": MAX_LINKS}


def simulated_sizes() -> None:
    """From now on (this process), fabrics up to the simulated engine's sizes are accepted: they are only
    simulated, never emulated. The environment's settings still win."""
    _defaults.update(nodes=SIM_MAX_NODES, links=SIM_MAX_LINKS)


class SpecError(ValueError):
    """A topology spec, file or object that cannot be used. The message is always one line."""

    def __init__(self, message: str) -> None:
        # Collapse any embedded line breaks (e.g. from a parser's message) so the CLI prints one line.
        super().__init__(" ".join(str(message).split()))


# -- shared field checks ---------------------------------------------------------------------------


def check_number(
    value: Any,
    field: str,
    *,
    example: str,
    integer: bool = False,
    minimum: float | None = None,
    above: float | None = None,
    below: float | None = None,
    unit: str = "",
) -> int | float:
    """Return `value` as an int or float, or raise SpecError naming `field` and showing `example`."""
    kind = "whole number" if integer else "number"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"{field}={short_repr(value)} is not a {kind}; use e.g. {example}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int too large for a float: no rate, count or port is that big
        raise SpecError(f"{field} has {len(str(value))} digits, far too large; use e.g. {example}") from None
    if not finite:
        raise SpecError(f"{field}={value!r} is not a {kind}; use e.g. {example}")
    if integer:
        if isinstance(value, float):
            if not value.is_integer():
                raise SpecError(f"{field}={value!r} is not a {kind}; use e.g. {example}")
            value = int(value)
    else:
        value = float(value)
    suffix = f" {unit}" if unit else ""
    if minimum is not None and below is not None and not minimum <= value < below:
        raise SpecError(f"{field}={value:g} must be in [{minimum:g}, {below:g}){suffix}; use e.g. {example}")
    if minimum is not None and value < minimum:
        raise SpecError(f"{field}={value:g} must be >= {minimum:g}{suffix}; use e.g. {example}")
    if above is not None and value <= above:
        raise SpecError(f"{field}={value:g} must be > {above:g}{suffix}; use e.g. {example}")
    if below is not None and value >= below:
        raise SpecError(f"{field}={value:g} must be < {below:g}{suffix}; use e.g. {example}")
    return value


def short_repr(value: Any, limit: int = 40) -> str:
    """repr() cut to `limit` characters: a bad value is quoted, not a whole file of it."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def size_limits() -> tuple[int, int]:
    """(most nodes, most links) a fabric may have: MAX_NODES, MAX_LINKS or their settings."""
    limits = []
    for name, default in (("FABRICLAB_MAX_NODES", _defaults["nodes"]), ("FABRICLAB_MAX_LINKS", _defaults["links"])):
        raw = os.environ.get(name, "").strip()
        if not raw:
            limits.append(default)
        elif raw.isdigit() and len(raw) < 10 and int(raw) > 0:
            limits.append(int(raw))
        else:
            raise SpecError(f"{name}={raw[:20]!r} is not a whole number > 0; unset it or use e.g. {name}={default}")
    return limits[0], limits[1]


def check_size(nodes: int, links: int, where: str) -> None:
    """Refuse a fabric of more nodes or links than `size_limits()` allows, naming the setting that raises it."""
    most_nodes, most_links = size_limits()
    for count, most, what, setting in ((nodes, most_nodes, "nodes", "FABRICLAB_MAX_NODES"),
                                       (links, most_links, "links", "FABRICLAB_MAX_LINKS")):
        if count > most:
            raise SpecError(f"{where} has {count} {what}, more than the {most} allowed; make it smaller, or set "
                            f"{setting}={count} to allow it (for analysis: two cores emulate a few hundred nodes; "
                            f"the simulated engine takes up to {SIM_MAX_NODES:,} nodes)")


def check_count(value: Any, field: str, example: str) -> int:
    return int(check_number(value, field, example=example, integer=True, minimum=1))


def check_rate(value: Any, field: str, example: str) -> float:
    return float(check_number(value, field, example=example, above=0, unit="Mbit/s"))


def check_delay(value: Any, field: str, example: str) -> float:
    return float(check_number(value, field, example=example, minimum=0, unit="ms"))


def check_loss(value: Any, field: str, example: str) -> float:
    return float(check_number(value, field, example=example, minimum=0, below=100, unit="percent"))


def check_queue(value: Any, field: str, example: str) -> int | None:
    if value is None:
        return None
    return int(check_number(value, field, example=example, integer=True, minimum=1, unit="packets"))


def check_mtu(value: Any, field: str, example: str) -> int:
    mtu = int(check_number(value, field, example=example, integer=True))
    if not MIN_MTU <= mtu <= MAX_MTU:
        raise SpecError(f"{field}={mtu} must be in [{MIN_MTU}, {MAX_MTU}] bytes; use e.g. {example}")
    return mtu


def check_unknown_keys(given: Iterable[str], known: Iterable[str], where: str) -> None:
    """Raise for the first key of `given` not in `known`, listing the known ones."""
    known = sorted(known)
    for key in given:
        if key not in known:
            raise SpecError(f"unknown key {key!r} in {where}; known keys: {', '.join(known)}")


def check_name(name: Any, field: str) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise SpecError(
            f"{field} {short_repr(name)} is not a usable name; use a lowercase letter then lowercase letters "
            f"or digits ([a-z][a-z0-9]*), e.g. leaf1"
        )
    return name


def check_ifname(node: str, port: int) -> None:
    """The emulator names interfaces `<node>-eth<port>`; Linux caps them at 15 characters."""
    ifname = f"{node}-eth{port}"
    if len(ifname) > MAX_IFNAME:
        max_name = MAX_IFNAME - len(f"-eth{port}")
        raise SpecError(
            f"node name {node!r} is too long: interface {ifname!r} has {len(ifname)} characters, "
            f"Linux allows {MAX_IFNAME}; with port {port} node names can have at most {max_name} characters"
        )


# -- the topology ----------------------------------------------------------------------------------


def _check_node(node: Any) -> None:
    if not isinstance(node, Node):
        raise SpecError(f"nodes must be Node objects, got {type(node).__name__}")
    check_name(node.name, "node name")
    where = f"node {node.name}"
    if node.role not in ALL_ROLES:
        raise SpecError(f"{where} role {node.role!r} is unknown; roles: {', '.join(ALL_ROLES)}")
    if not isinstance(node.labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in node.labels.items()
    ):
        raise SpecError(f"{where} labels must map strings to strings, e.g. {{server: s1}}")
    if node.is_host:
        if node.dpid is not None:
            raise SpecError(f"{where} is a {node.role} and cannot have a dpid; remove dpid")
        _check_ip(node)
        _check_mac(node)
    else:
        if node.ip is not None or node.mac is not None:
            raise SpecError(f"{where} is a {node.role} switch and cannot have ip or mac; remove them")
        dpid = node.dpid
        if isinstance(dpid, bool) or not isinstance(dpid, int) or not 1 <= dpid <= MAX_DPID:
            raise SpecError(f"{where} dpid={dpid!r} must be a whole number in [1, 2**64-1], e.g. dpid=1")


def _check_ip(node: Node) -> None:
    ip = node.ip
    try:
        if not isinstance(ip, str) or "/" not in ip:
            raise ValueError
        iface = ipaddress.IPv4Interface(ip)
    except ValueError:
        raise SpecError(
            f"node {node.name} ip={ip!r} is not an IPv4 address with prefix length; use e.g. ip=10.0.0.1/16"
        ) from None
    net = iface.network
    if net.prefixlen < 31 and iface.ip in (net.network_address, net.broadcast_address):
        raise SpecError(f"node {node.name} ip={ip} is the network or broadcast address of {net}; use a host address")


def _check_mac(node: Node) -> None:
    mac = node.mac
    if not isinstance(mac, str) or not MAC_RE.match(mac.lower()):
        raise SpecError(f"node {node.name} mac={mac!r} is not a MAC address; use e.g. mac=02:00:00:00:00:01")
    if int(mac[:2], 16) & 1:
        raise SpecError(f"node {node.name} mac={mac} is a multicast address; use e.g. mac=02:00:00:00:00:01")


def _check_link(link: Any, nodes: dict[str, Node], ports: dict[tuple[str, int], str]) -> None:
    if not isinstance(link, Link):
        raise SpecError(f"links must be Link objects, got {type(link).__name__}")
    for end in (link.a, link.b):
        if not isinstance(end, str) or end not in nodes:
            raise SpecError(f"link {short_repr(link.a)}-{short_repr(link.b)} ends at unknown node {short_repr(end)}; "
                            "declare it in nodes first")
    where = f"link {link.name}"
    if link.a == link.b:
        raise SpecError(f"{where} joins {link.a} to itself; a link needs two different nodes")
    if nodes[link.a].is_host and nodes[link.b].is_host:
        raise SpecError(f"{where} joins two hosts; connect hosts through a switch")
    for end, port, field in ((link.a, link.a_port, "a_port"), (link.b, link.b_port, "b_port")):
        # Hosts number interfaces from eth0; OpenFlow port 0 is invalid, so switch ports start at 1.
        low = 0 if nodes[end].is_host else 1
        if isinstance(port, bool) or not isinstance(port, int) or not low <= port <= MAX_PORT:
            raise SpecError(f"{where} {field}={port!r} on {nodes[end].role} {end} must be a whole number >= {low}")
        if (end, port) in ports:
            raise SpecError(
                f"{where} {field}={port}: port {port} of {end} is already used by link {ports[end, port]}; "
                f"give each link on {end} its own port"
            )
        ports[end, port] = link.name
        check_ifname(end, port)
    check_rate(link.rate_mbps, f"{where} rate_mbps", "rate_mbps=20")
    check_delay(link.delay_ms, f"{where} delay_ms", "delay_ms=0.5")
    check_loss(link.loss_pct, f"{where} loss_pct", "loss_pct=1")
    check_queue(link.queue_packets, f"{where} queue_packets", "queue_packets=100")


def _check_unique(hosts: list[Node], switches: list[Node]) -> None:
    seen: dict[tuple[str, Any], str] = {}
    values = [("ip", h.address, h.name) for h in hosts]
    values += [("mac", h.mac.lower() if h.mac else None, h.name) for h in hosts]
    values += [("dpid", s.dpid, s.name) for s in switches]
    for field, value, name in values:
        if (field, value) in seen:
            raise SpecError(
                f"duplicate {field} {value} on {seen[field, value]} and {name}; give each node its own "
                f"{field} or leave {field} out to use the address plan"
            )
        seen[field, value] = name
    # Hosts are plain Mininet hosts without routes: they reach each other only inside one subnet.
    if hosts:
        first = ipaddress.IPv4Interface(hosts[0].ip)
        for h in hosts[1:]:
            iface = ipaddress.IPv4Interface(h.ip)
            if iface.network != first.network:
                raise SpecError(
                    f"node {h.name} ip={h.ip} is not in subnet {first.network} of {hosts[0].name}; "
                    f"put all hosts in one subnet"
                )


def _check_connected(topo: Topology, nodes: dict[str, Node]) -> None:
    adjacency: dict[str, list[str]] = {name: [] for name in nodes}
    for lk in topo.links:
        adjacency[lk.a].append(lk.b)
        adjacency[lk.b].append(lk.a)
    # Hosts do not forward, so reachability is through switches only.
    start = next((n.name for n in topo.nodes if n.is_switch), topo.nodes[0].name)
    seen = {start}
    queue = deque([start])
    while queue:
        here = queue.popleft()
        if nodes[here].is_host and here != start:
            continue
        for peer in adjacency[here]:
            if peer not in seen:
                seen.add(peer)
                queue.append(peer)
    for n in topo.nodes:
        if n.name not in seen:
            raise SpecError(
                f"node {n.name} cannot be reached from {start} through switches (disconnected fabric); "
                f"add a link that joins it to the rest"
            )


def validate(topo: Topology) -> Topology:
    """Check `topo` and return it unchanged; raise SpecError (one line) on the first problem."""
    if not isinstance(topo, Topology):
        raise SpecError(f"expected a Topology, got {type(topo).__name__}")
    if not isinstance(topo.name, str) or not topo.name.strip() or len(topo.name.splitlines()) != 1:
        raise SpecError(f"topology name {topo.name!r} must be a non-empty single-line string")
    check_mtu(topo.mtu, "mtu", "mtu=9000")
    if not topo.nodes:
        raise SpecError("topology has no nodes; add at least one switch and one host")
    check_size(len(topo.nodes), len(topo.links), f"topology {topo.name}")
    nodes: dict[str, Node] = {}
    for node in topo.nodes:
        _check_node(node)
        if node.name in nodes:
            raise SpecError(f"duplicate node name {node.name!r}; give every node its own name")
        nodes[node.name] = node
    hosts = [n for n in topo.nodes if n.is_host]
    switches = [n for n in topo.nodes if n.is_switch]
    if not hosts:
        raise SpecError("topology has no hosts; add at least one node with role host or gpu")
    ports: dict[tuple[str, int], str] = {}
    for link in topo.links:
        _check_link(link, nodes, ports)
    linked = {end for end, _ in ports}
    for h in hosts:
        if h.name not in linked:
            raise SpecError(f"host {h.name} has no link; connect it to a switch")
    _check_unique(hosts, switches)
    _check_connected(topo, nodes)
    return topo
