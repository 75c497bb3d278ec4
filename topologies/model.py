"""Plain-data description of a fabric: nodes, links and their ports.

A `Topology` is everything the emulator, the controller and the experiments need to know about a
fabric, and nothing about how it runs. It is immutable, JSON-round-trippable and testable without root.

Conventions every user of the model relies on:
- Port numbers are explicit on both ends of every link; the emulator creates interface
  `<node>-eth<port>` with exactly that OpenFlow port number, so the controller knows the wiring from
  this description alone.
- Hosts have one or more links; a host's address is on its first link (`<host>-eth<first port>`).
- Switch DPIDs are unique positive integers; host IPs and MACs are unique.
- A switch's role names its tier (`ROLE_TIER`): uplinks lead from a tier to the one above it, so the
  controller, the probe and the experiments can tell up from down without guessing from the wiring.
- One MTU (IP packet bytes) applies to every interface of the fabric.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

HOST_ROLES = ("host", "gpu")
SWITCH_ROLES = ("spine", "leaf", "tor", "local", "switch", "edge", "agg", "core", "superspine")
FABRIC_ROLES = ("spine", "leaf", "tor", "edge", "agg", "core", "superspine")
# Tier of each switch role, counted up from the hosts. Two-tier fabrics are leaf (or tor) and spine;
# a fat-tree is edge, agg and core; a three-tier Clos is leaf, spine and superspine. `switch` is a
# generic role whose tier is unknown, so it sits with the edge switches.
ROLE_TIER = {
    "local": 1,
    "leaf": 2,
    "tor": 2,
    "edge": 2,
    "switch": 2,
    "spine": 3,
    "agg": 3,
    "core": 4,
    "superspine": 4,
}

# Jumbo frames by default, as AI fabrics run them (SRD and EFA use about 9,000 bytes; RoCE fabrics
# 4,096 or more), and because the emulator's cost follows packets, not bytes: at 1,500 bytes a
# 16-host permutation at 4 Mb/s per host makes six times the switch traversals and cannot be emulated
# at fidelity on two cores. `mtu=1500` asks for standard frames.
DEFAULT_MTU = 9000
# What a Linux interface has unless told otherwise: only a different MTU needs setting.
KERNEL_MTU = 1500
# 576 is the smallest datagram every IPv4 host must accept; 9216 is the usual jumbo-frame ceiling.
MIN_MTU = 576
MAX_MTU = 9216


def natural_key(name: str) -> tuple:
    """Sort key for node names: 'leaf10' after 'leaf9', 'h2' before 'h10' (digits compare as numbers)."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


@dataclass(frozen=True)
class Node:
    """A host or a switch. Hosts carry `ip` (CIDR form, e.g. 10.0.0.1/16) and `mac`; switches `dpid`."""

    name: str
    role: str
    ip: str | None = None
    mac: str | None = None
    dpid: int | None = None
    # Free-form grouping used by builders, e.g. {"leaf": "leaf1"} or {"server": "s1"}.
    labels: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def is_host(self) -> bool:
        return self.role in HOST_ROLES

    @property
    def is_switch(self) -> bool:
        return self.role in SWITCH_ROLES

    @property
    def tier(self) -> int:
        """The switch tier of the role (`ROLE_TIER`); 0 for hosts."""
        return ROLE_TIER.get(self.role, 0)

    @property
    def address(self) -> str | None:
        """The IP without the prefix length."""
        return self.ip.split("/")[0] if self.ip else None


@dataclass(frozen=True)
class Link:
    """A full-duplex link; rate, delay and loss apply in each direction."""

    a: str
    a_port: int
    b: str
    b_port: int
    rate_mbps: float
    delay_ms: float = 0.0
    loss_pct: float = 0.0
    queue_packets: int | None = None

    @property
    def name(self) -> str:
        return f"{self.a}-{self.b}"

    def intf(self, node: str) -> str:
        """Interface name of this link on `node` (`<node>-eth<port>`)."""
        return f"{node}-eth{self.port(node)}"

    def port(self, node: str) -> int:
        if node == self.a:
            return self.a_port
        if node == self.b:
            return self.b_port
        raise KeyError(f"{node} is not an end of link {self.name}")

    def peer(self, node: str) -> str:
        if node == self.a:
            return self.b
        if node == self.b:
            return self.a
        raise KeyError(f"{node} is not an end of link {self.name}")


@dataclass(frozen=True)
class Topology:
    """A named fabric. Build one with a builder, `parse_spec()` or `load()`; `validate()` checks it."""

    name: str
    nodes: tuple[Node, ...]
    links: tuple[Link, ...]
    # Where it came from (builder name and parameters, or file), for results files.
    params: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    # IP MTU of every interface (hosts and switch ports), in bytes.
    mtu: int = DEFAULT_MTU

    # -- lookups -------------------------------------------------------------------------------
    @cached_property
    def _nodes_by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    @cached_property
    def _links_by_node(self) -> dict[str, list[Link]]:
        out: dict[str, list[Link]] = {n.name: [] for n in self.nodes}
        for lk in self.links:
            for end in dict.fromkeys((lk.a, lk.b)):
                out.setdefault(end, []).append(lk)
        return out

    def node(self, name: str) -> Node:
        # Indexed: analyses call this per link per sample, and a 1,024-host fabric has 3,072 links.
        try:
            return self._nodes_by_name[name]
        except KeyError:
            raise KeyError(name) from None

    @property
    def hosts(self) -> list[Node]:
        return [n for n in self.nodes if n.is_host]

    @property
    def switches(self) -> list[Node]:
        return [n for n in self.nodes if n.is_switch]

    def by_role(self, role: str) -> list[Node]:
        return [n for n in self.nodes if n.role == role]

    def tiers(self) -> dict[str, list[Node]]:
        """Switches grouped by role, highest tier first (ties in order of first appearance)."""
        groups: dict[str, list[Node]] = {}
        for n in self.switches:
            groups.setdefault(n.role, []).append(n)
        return dict(sorted(groups.items(), key=lambda item: -item[1][0].tier))

    def links_of(self, node: str) -> list[Link]:
        return list(self._links_by_node.get(node, ()))

    def links_between(self, a: str, b: str) -> list[Link]:
        return [lk for lk in self._links_by_node.get(a, ()) if {lk.a, lk.b} == {a, b}]

    def host_switch(self, host: str) -> tuple[str, int]:
        """(switch, switch port) of the host's first link."""
        lk = self.links_of(host)[0]
        return lk.peer(host), lk.port(lk.peer(host))

    # -- plain data ------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "params": dict(self.params),
            "mtu": self.mtu,
            "nodes": [{k: v for k, v in asdict(n).items() if v not in (None, {})} for n in self.nodes],
            "links": [{k: v for k, v in asdict(lk).items() if v is not None} for lk in self.links],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Topology:
        """Inverse of to_dict(); no validation (see topologies.validate)."""
        return cls(
            name=data["name"],
            nodes=tuple(Node(**n) for n in data["nodes"]),
            links=tuple(Link(**lk) for lk in data["links"]),
            params=dict(data.get("params", {})),
            mtu=data.get("mtu", DEFAULT_MTU),
        )
