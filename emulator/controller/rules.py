"""Pure rule computation: topology + routing mode + down links -> abstract flow entries per switch.

No OpenFlow library is imported here; `app.py` translates `FlowEntry` into OpenFlow 1.3 flow mods.

Pipeline installed on every switch:

- table 0: ARP -> controller (proxy ARP), IPv6 and anything unmatched -> drop, and one entry per
  destination host (`ipv4_dst`). A destination with a single next hop outputs directly; several next
  hops run the Nicira `multipath` hash (symmetric_l3l4+udp, so TCP and UDP ports are hashed) into
  reg0, write the next-hop set id into the metadata and go to table 1.
- table 1: (metadata = set id, reg0 = bucket) -> output port. In `spray` mode higher-priority entries
  match the low bits of the UDP source port (the entropy value, EV) and pick the next hop directly,
  so non-UDP traffic still falls through to the hash entries; replies from a receiver's port (the
  contract's DEFAULT_PORT: ACKs) match the low bits of their destination port instead, the EV of the
  packet they answer, and so return along their data's path.
- `single` skips table 1: every switch outputs one next hop per destination host, chosen from the
  host's index the way spray chooses from the EV.

Spraying over several tiers. If every switch mapped EV i to next_hops[i % n], an aggregation switch
would only ever see the EVs its edge switch had already sorted onto it, and re-sort them the same
way: on a k=4 fat-tree, 2 of the 4 paths between pods would carry everything. Instead each choice
reads its own digit of the EV. A switch with n next hops toward a destination edge switch outputs
next_hops[(EV // D) % n], where the divisor D is the product of the fan-outs of the choices a packet
made before it (1 at the sender's edge switch, n_edge at an aggregation switch, ...). Along a path
the choices are then the mixed-radix digits of EV mod P, P being the number of equal-cost paths: a
one-to-one map from residues mod P onto paths. A sender rotating over N consecutive EVs therefore
puts N // P or N // P + 1 packets on every path, exactly N / P when P divides N (16 EVs: leaf-spine
with 2, 4, 8 or 16 spines; fat-trees with k = 4 and k = 8, 4 and 16 paths between pods). A leaf-spine
keeps EV i -> next_hops[i % n] (D = 1 at every leaf). D comes from one pass over the shortest-path
DAG toward the destination, farthest switches first: D(s) = max(1, D(p) * n(p) over the switches p
one hop farther that forward to s); in a symmetric Clos every such p gives the same product. The
entries match the low SPRAY_BITS bits of the source port, more when D * n exceeds 2**SPRAY_BITS; the
transport and the probe rotate over 16 EVs from a base port that is a multiple of 16, so one flow
covers every path of a fabric with at most 16 of them.

ECMP needs nothing of the kind: each switch seeds the multipath hash with its own `basis` (unique per
switch), and OVS starts the hash chain from the basis, so tiers hash a flow independently. Which next
hop OVS picks for a packet is computable without a switch: `Multipath.link` (the hash, reproduced in
`ovs_multipath`) and `ecmp_port` (that link through table 1).

Same-switch traffic is delivered locally except in `via-tor` mode, where priority-300 entries keyed on
the host ports send it to an upper-tier neighbour, whose hairpin entries (in_port = the port toward
the destination's edge switch) send it back out of the port it came in on.

A next-hop set id is derived from the set's ports (a bitmask of the ports) and, for spray sets, the
divisor alone, so the table-1 entries of a set are identical in every generation; a table-0 entry can
therefore be replaced in place without ever pointing at table-1 entries of a different set.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from emulator.controller.ovs_multipath import Address, multipath_link
from topologies.model import ROLE_TIER, Link, Node, Topology
from transport.core.contract import DEFAULT_PORT, EV_BITS, ROUTING_MODES, UDP_PORT_BITS

MODES = ROUTING_MODES  # the fabric contract's (transport.core.contract)

TABLE_FORWARD = 0
TABLE_NEXT_HOP = 1

PRIO_MISS = 0
PRIO_IPV6_DROP = 10
PRIO_ARP = 100
PRIO_DST = 200
PRIO_VIA_TOR = 300
PRIO_HASH_BUCKET = 100
PRIO_SPRAY_BUCKET = 200
PRIO_SPRAY_REPLY = 210

ETH_IPV4 = 0x0800
ETH_ARP = 0x0806
ETH_IPV6 = 0x86DD
IPPROTO_UDP = 17

# Spray uses the low SPRAY_BITS bits of the UDP source port, where the contract puts the EV: 16 buckets
# spread evenly over 2, 4, 8 or 16 paths when a sender rotates its source port over 16 consecutive values.
SPRAY_BITS = EV_BITS

# Output pseudo-ports (translated to OFPP_IN_PORT / OFPP_CONTROLLER by the app).
IN_PORT = "in_port"
CONTROLLER = "controller"


# -- abstract actions ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Output:
    port: int | str  # an OpenFlow port number, IN_PORT or CONTROLLER

    def __str__(self) -> str:
        return f"output:{self.port}"


@dataclass(frozen=True)
class Multipath:
    """Hash (symmetric_l3l4+udp, HRW) into reg0, a value in [0, n_links)."""

    n_links: int
    basis: int

    FIELDS: ClassVar[str] = "symmetric_l3l4+udp"
    ALGORITHM: ClassVar[str] = "hrw"
    REG0_BITS: ClassVar[int] = 16  # the app writes reg0[0..15]

    def __str__(self) -> str:
        return (f"multipath({self.FIELDS},{self.basis},{self.ALGORITHM},{self.n_links},0,"
                f"reg0[0..{self.REG0_BITS - 1}])")

    def link(self, ip_src: Address, ip_dst: Address, proto: int, sport: int = 0, dport: int = 0) -> int:
        """The value Open vSwitch writes into reg0 for this packet (emulator.controller.ovs_multipath)."""
        return multipath_link(ip_src, ip_dst, proto, sport, dport, self.basis, self.n_links, self.ALGORITHM,
                              fields=self.FIELDS)


@dataclass(frozen=True)
class WriteNextHopSet:
    set_id: int  # written to the OpenFlow metadata

    def __str__(self) -> str:
        return f"write_metadata:{self.set_id:#x}"


@dataclass(frozen=True)
class GotoTable:
    table: int

    def __str__(self) -> str:
        return f"goto_table:{self.table}"


Action = Output | Multipath | WriteNextHopSet | GotoTable
MatchValue = int | str | tuple[int, int]


@dataclass(frozen=True)
class FlowEntry:
    """One flow entry. `match` holds sorted (OXM field name, value) pairs; no actions means drop."""

    table: int
    priority: int
    match: tuple[tuple[str, MatchValue], ...]
    actions: tuple[Action, ...] = ()

    @classmethod
    def make(cls, table: int, priority: int, actions: Iterable[Action] = (), **match: MatchValue) -> FlowEntry:
        return cls(table, priority, tuple(sorted(match.items())), tuple(actions))

    @property
    def key(self) -> tuple[int, int, tuple[tuple[str, MatchValue], ...]]:
        """What identifies the entry in the switch (adding an entry with the same key replaces it)."""
        return (self.table, self.priority, self.match)

    def match_dict(self) -> dict[str, MatchValue]:
        return dict(self.match)

    def __str__(self) -> str:
        def fmt(v: MatchValue) -> str:
            if isinstance(v, tuple):
                return f"{v[0]:#x}/{v[1]:#x}"
            return f"{v:#x}" if isinstance(v, int) and v > 9 else str(v)

        match = ",".join(f"{k}={fmt(v)}" for k, v in self.match) or "any"
        actions = ",".join(str(a) for a in self.actions) or "drop"
        return f"table={self.table},priority={self.priority},{match} actions={actions}"


# -- paths ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Attachment:
    host: Node
    index: int  # position among topo.hosts (the `single` mode's path choice)
    switch: str
    port: int
    link: Link
    up: bool


class Graph:
    """Adjacency index of a topology with some links down, so path computation stays linear in its
    size (links are compared by index: hashing Link dataclasses dominated the running time)."""

    def __init__(self, topo: Topology, down: Iterable[Link] = ()) -> None:
        self.topo = topo
        down = frozenset(down)
        self.nodes: dict[str, Node] = {n.name: n for n in topo.nodes}
        self.is_switch = {name: n.is_switch for name, n in self.nodes.items()}
        self.link_up = [lk not in down for lk in topo.links]
        # node -> [(link index, peer, port on node)]
        self.adj: dict[str, list[tuple[int, str, int]]] = {n.name: [] for n in topo.nodes}
        for i, lk in enumerate(topo.links):
            self.adj[lk.a].append((i, lk.b, lk.a_port))
            self.adj[lk.b].append((i, lk.a, lk.b_port))
        self.attachments: list[Attachment] = []
        for i, h in enumerate(topo.hosts):
            if not self.adj[h.name] or not h.address:
                continue
            li, sw, _ = self.adj[h.name][0]
            if self.is_switch[sw]:
                lk = topo.links[li]
                self.attachments.append(Attachment(h, i, sw, lk.port(sw), lk, self.link_up[li]))
        self._dist: dict[str, dict[str, int]] = {}
        self._next: dict[tuple[str, str], tuple[int, ...]] = {}
        self._div: dict[str, dict[str, int]] = {}

    def tier(self, name: str) -> int:
        # Via-tor detours go up a tier; the role says which way is up.
        return ROLE_TIER.get(self.nodes[name].role, 0)

    def distances(self, target: str) -> dict[str, int]:
        """Hop counts from every switch to switch `target` over switch-to-switch links that are up
        (hosts never forward)."""
        if target in self._dist:
            return self._dist[target]
        dist = {target: 0}
        queue = deque([target])
        while queue:
            u = queue.popleft()
            for li, v, _ in self.adj[u]:
                if v in dist or not self.link_up[li] or not self.is_switch[v]:
                    continue
                dist[v] = dist[u] + 1
                queue.append(v)
        self._dist[target] = dist
        return dist

    def next_hop_ports(self, switch: str, target: str) -> tuple[int, ...]:
        """Ports of `switch` on a shortest path toward switch `target` (sorted; empty when none)."""
        key = (switch, target)
        if key not in self._next:
            dist = self.distances(target)
            ports: tuple[int, ...] = ()
            if dist.get(switch, 0) > 0:
                want = dist[switch] - 1
                ports = tuple(sorted({p for li, v, p in self.adj[switch] if self.link_up[li] and dist.get(v) == want}))
            self._next[key] = ports
        return self._next[key]

    def divisors(self, target: str) -> dict[str, int]:
        """Switch -> spray divisor toward switch `target`: the product of the fan-outs of the choices a
        packet made on its way to the switch (the max over the ways in), 1 where none was made."""
        if target in self._div:
            return self._div[target]
        dist = self.distances(target)
        div = dict.fromkeys(dist, 1)
        # Farthest first, so every switch one hop farther has its final divisor before it is used.
        for here in sorted(dist, key=dist.__getitem__, reverse=True):
            fan_out = len(self.next_hop_ports(here, target))
            if fan_out == 0:
                continue
            want = dist[here] - 1
            for li, v, _ in self.adj[here]:
                if self.link_up[li] and dist.get(v) == want:
                    div[v] = max(div[v], div[here] * fan_out)
        self._div[target] = div
        return div

    def uplink_ports(self, switch: str) -> tuple[int, ...]:
        """Ports of `switch` toward higher-tier switches that are up (the via-tor detour), sorted."""
        tier = self.tier(switch)
        return tuple(
            sorted(
                {p for li, v, p in self.adj[switch] if self.link_up[li] and self.is_switch[v] and self.tier(v) > tier}
            )
        )

    def host_ports(self, switch: str) -> list[int]:
        return sorted(p for _, v, p in self.adj[switch] if not self.is_switch[v])


def next_hops_to_host(topo: Topology, switch: str, host: str, down: Iterable[Link] = ()) -> tuple[int, ...]:
    """Output ports of `switch` toward `host` (the host port itself on the host's edge switch)."""
    g = Graph(topo, down)
    att = next((a for a in g.attachments if a.host.name == host), None)
    if att is None or not att.up:
        return ()
    if switch == att.switch:
        return (att.port,)
    return g.next_hop_ports(switch, att.switch)


def next_hop_set_id(ports: tuple[int, ...], divisor: int = 1) -> int:
    """Metadata value naming a set of ports (and, for spray, the divisor its choice uses): a bitmask
    (readable in dump-flows) while all ports are below 63 and the divisor is 1, otherwise a stable
    64-bit hash with the top bit set (never equal to a bitmask)."""
    if divisor == 1 and all(0 < p < 63 for p in ports):
        return sum(1 << p for p in ports)
    key = ",".join(map(str, ports)) + (f"/{divisor}" if divisor != 1 else "")
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") | (1 << 63)


def spray_buckets(n_ports: int, divisor: int = 1) -> int:
    """Number of UDP-source-port buckets: 16, or more when the digit a set reads (divisor * ports
    values) does not fit in 16 (a sender then needs as many EVs to reach every path)."""
    bits = SPRAY_BITS
    while (1 << bits) < n_ports * divisor and bits < UDP_PORT_BITS:
        bits += 1
    return 1 << bits


def spray_choice(ev: int, n_ports: int, divisor: int = 1) -> int:
    """Index of the next hop that entropy value `ev` takes out of `n_ports` (see the module docstring)."""
    return (ev // divisor) % n_ports


def ecmp_port(
    entry: FlowEntry, flows: Iterable[FlowEntry], ip_src: Address, ip_dst: Address, proto: int,
    sport: int = 0, dport: int = 0,
) -> int | str:
    """The port a switch's table-0 `entry` sends a packet to when the packet takes the hash: the entry's
    own output, or the table-1 bucket entry (metadata = the entry's next-hop set, reg0 = the link Open
    vSwitch's multipath picks) among the switch's `flows`. Spray's entries on the UDP ports, which
    outrank the buckets in spray mode, are not consulted."""
    link = set_id = None
    for a in entry.actions:
        if isinstance(a, Output):
            return a.port
        if isinstance(a, Multipath):
            link = a.link(ip_src, ip_dst, proto, sport, dport)
        elif isinstance(a, WriteNextHopSet):
            set_id = a.set_id
    if link is None or set_id is None:
        raise ValueError(f"entry neither outputs nor hashes onto a next-hop set: {entry}")
    bucket = (("metadata", set_id), ("reg0", link))
    for f in flows:
        if f.table == TABLE_NEXT_HOP and f.match == bucket and f.actions and isinstance(f.actions[0], Output):
            return f.actions[0].port
    raise ValueError(f"no table-{TABLE_NEXT_HOP} entry for next-hop set {set_id:#x}, link {link}")


def multipath_bases(topo: Topology) -> dict[str, int]:
    """Per-switch 16-bit seed of the multipath hash: the low 16 bits of the dpid, or the switch's
    position when two dpids share them. Distinct seeds keep tiers from hashing a flow alike."""
    bases = {s.name: (s.dpid or 0) & 0xFFFF for s in topo.switches}
    if len(set(bases.values())) < len(bases):
        bases = {s.name: i & 0xFFFF for i, s in enumerate(topo.switches, 1)}
    return bases


# -- rules ----------------------------------------------------------------------------------------
@dataclass
class _SwitchRules:
    name: str
    basis: int
    flows: dict[tuple, FlowEntry] = field(default_factory=dict)
    # (next-hop set, spray divisor) reached through table 1 -> their table-0 actions
    hashed: dict[tuple[tuple[int, ...], int], tuple[Action, ...]] = field(default_factory=dict)

    def add(self, flow: FlowEntry) -> None:
        self.flows[flow.key] = flow


def base_flows() -> list[FlowEntry]:
    """Entries every switch gets regardless of routes: table-miss drops, IPv6 drop, ARP to us."""
    return [
        FlowEntry.make(TABLE_FORWARD, PRIO_MISS),
        FlowEntry.make(TABLE_NEXT_HOP, PRIO_MISS),
        FlowEntry.make(TABLE_FORWARD, PRIO_IPV6_DROP, eth_type=ETH_IPV6),
        FlowEntry.make(TABLE_FORWARD, PRIO_ARP, [Output(CONTROLLER)], eth_type=ETH_ARP),
    ]


def _spread(
    sw: _SwitchRules, ports: tuple[int, ...], mode: str, host_index: int, divisor: int = 1
) -> tuple[Action, ...]:
    """Actions that send a packet to one of `ports` according to the mode."""
    if len(ports) == 1:
        return (Output(ports[0]),)
    if mode == "single":
        return (Output(ports[spray_choice(host_index, len(ports), divisor)]),)
    if mode != "spray":
        divisor = 1  # only spray's table-1 entries depend on it
    key = (ports, divisor)
    actions = sw.hashed.get(key)
    if actions is None:
        actions = sw.hashed[key] = (
            Multipath(len(ports), sw.basis),
            WriteNextHopSet(next_hop_set_id(ports, divisor)),
            GotoTable(TABLE_NEXT_HOP),
        )
    return actions


def _ev_matches(ev: int, mask: int) -> tuple[tuple[int, dict[str, MatchValue]], ...]:
    """The spray bucket `ev`'s two entries, data then reply: their priority and where each finds the EV.

    Data carries it in the low bits of its source port. A reply from a receiver's port (an ACK) carries
    the EV of the packet it answers in its destination port: sprayed by that, it goes back along its
    data's path, and the ACKs of a flow spread as its data does. By its fixed source port alone every
    ACK would take one path, and a dead one would stall every flow that answers through it.
    """
    return ((PRIO_SPRAY_BUCKET, {"udp_src": (ev, mask)}),
            (PRIO_SPRAY_REPLY, {"udp_src": DEFAULT_PORT, "udp_dst": (ev, mask)}))


def _next_hop_table(ports: tuple[int, ...], divisor: int, mode: str) -> list[FlowEntry]:
    set_id = next_hop_set_id(ports, divisor)
    flows = [
        FlowEntry.make(TABLE_NEXT_HOP, PRIO_HASH_BUCKET, [Output(p)], metadata=set_id, reg0=j)
        for j, p in enumerate(ports)
    ]
    if mode == "spray":
        n_buckets = spray_buckets(len(ports), divisor)
        for ev in range(n_buckets):
            out = [Output(ports[spray_choice(ev, len(ports), divisor)])]
            for priority, ev_match in _ev_matches(ev, n_buckets - 1):
                flows.append(FlowEntry.make(TABLE_NEXT_HOP, priority, out, metadata=set_id, eth_type=ETH_IPV4,
                                            ip_proto=IPPROTO_UDP, **ev_match))
    return flows


def compute_rules(topo: Topology, mode: str, down: Iterable[Link] = ()) -> dict[str, tuple[FlowEntry, ...]]:
    """Flow entries for every switch of `topo` (by name) in routing `mode` with `down` links removed.

    Entries are sorted (table, priority, match) so results compare and print deterministically.
    """
    if (err := mode_error(mode)) is not None:
        raise ValueError(err)
    g = Graph(topo, down)
    bases = multipath_bases(topo)
    switches = {s.name: _SwitchRules(s.name, basis=bases[s.name]) for s in topo.switches}
    for sw in switches.values():
        for f in base_flows():
            sw.add(f)

    for att in g.attachments:
        for sw in switches.values():
            for f in _toward(g, sw, att, mode):
                sw.add(f)

    out: dict[str, tuple[FlowEntry, ...]] = {}
    for name, sw in switches.items():
        for ports, divisor in sw.hashed:
            for f in _next_hop_table(ports, divisor, mode):
                sw.add(f)
        out[name] = tuple(sorted(sw.flows.values(), key=_sort_key))
    return out


def _toward(g: Graph, sw: _SwitchRules, att: Attachment, mode: str) -> list[FlowEntry]:
    """Switch `sw`'s table-0 entries toward the host of `att` (recording in sw.hashed the next-hop sets
    they hash onto, whose table-1 entries _next_hop_table gives)."""
    if not att.up:
        return []  # the host is cut off: every switch drops its traffic at table-miss
    ip = att.host.address
    name = sw.name
    out = []
    if name == att.switch:
        out.append(FlowEntry.make(TABLE_FORWARD, PRIO_DST, [Output(att.port)], eth_type=ETH_IPV4, ipv4_dst=ip))
        up = g.uplink_ports(name) if mode == "via-tor" else ()
        if up:
            # Traffic from a local host to a local host goes up first.
            actions = _spread(sw, up, mode, att.index)
            for p in g.host_ports(name):
                if p != att.port:
                    out.append(FlowEntry.make(TABLE_FORWARD, PRIO_VIA_TOR, actions, eth_type=ETH_IPV4, ipv4_dst=ip,
                                              in_port=p))
        return out
    ports = g.next_hop_ports(name, att.switch)
    if not ports:
        return out
    actions = _spread(sw, ports, mode, att.index, g.divisors(att.switch)[name])
    out.append(FlowEntry.make(TABLE_FORWARD, PRIO_DST, actions, eth_type=ETH_IPV4, ipv4_dst=ip))
    if g.distances(att.switch)[name] == 1 and g.tier(name) > g.tier(att.switch):
        # The hairpin: a packet that came up from the destination's own edge switch goes
        # back down the port it arrived on (a plain output to the ingress port is dropped).
        # Only via-tor sends such packets, but the entries stay in every mode: removing them
        # on a switch back from via-tor would drop packets that the edge switch's datapath
        # cache still sends up for a few milliseconds after the barrier.
        for p in ports:
            out.append(FlowEntry.make(TABLE_FORWARD, PRIO_VIA_TOR, [Output(IN_PORT)], eth_type=ETH_IPV4, ipv4_dst=ip,
                                      in_port=p))
    return out


LAZY_CACHE = 65536  # (switch, destination) entry lists LazyRules keeps


class LazyRules:
    """compute_rules one destination at a time: the entries a switch holds toward a host, and a next-hop
    set's table-1 entries, made (by the same code) when first asked for. A fabric of 8,192 hosts has
    ten million entries in all; a simulation needs those of the destinations its packets go to."""

    def __init__(self, topo: Topology, mode: str, down: Iterable[Link] = ()) -> None:
        if (err := mode_error(mode)) is not None:
            raise ValueError(err)
        self.mode = mode
        self.g = Graph(topo, down)
        bases = multipath_bases(topo)
        self.switches = {s.name: _SwitchRules(s.name, basis=bases[s.name]) for s in topo.switches}
        self.by_address = {a.host.address: a for a in self.g.attachments}
        self._table0: dict[tuple[str, str], list[FlowEntry]] = {}
        self._table1: dict[tuple[str, int], list[FlowEntry]] = {}

    def toward(self, switch: str, address: str) -> list[FlowEntry]:
        """Table-0 entries of `switch` that match destination `address` ([] for an address no host has)."""
        key = (switch, address)
        got = self._table0.get(key)
        if got is None:
            if len(self._table0) >= LAZY_CACHE:
                self._table0.clear()  # made again when asked: the same code gives the same entries
            att = self.by_address.get(address)
            got = self._table0[key] = [] if att is None else _toward(self.g, self.switches[switch], att, self.mode)
        return got

    def next_hop_set(self, switch: str, set_id: int) -> list[FlowEntry]:
        """Table-1 entries of `switch` for next-hop set `set_id` (after toward() has named the set)."""
        key = (switch, set_id)
        got = self._table1.get(key)
        if got is None:
            sw = self.switches[switch]
            got = []
            for ports, divisor in sw.hashed:
                if next_hop_set_id(ports, divisor if self.mode == "spray" else 1) == set_id:
                    got = _next_hop_table(ports, divisor, self.mode)
                    break
            self._table1[key] = got
        return got


def _sort_key(f: FlowEntry) -> tuple:
    # Values of one field share a type except ipv4 strings, which sort as strings.
    return (
        f.table,
        -f.priority,
        tuple((k, (isinstance(v, str), str(v) if isinstance(v, str) else v)) for k, v in f.match),
    )


# -- installing changes ---------------------------------------------------------------------------
@dataclass(frozen=True)
class RuleDiff:
    """Entries to add (or replace in place) and entries to delete, in a safe order."""

    add: tuple[FlowEntry, ...]
    delete: tuple[FlowEntry, ...]

    def __bool__(self) -> bool:
        return bool(self.add or self.delete)

    def __len__(self) -> int:
        return len(self.add) + len(self.delete)


def diff_rules(old: Iterable[FlowEntry], new: Iterable[FlowEntry]) -> RuleDiff:
    """What to send to move a switch from `old` to `new` without a blackhole.

    Adds come table 1 first, so a table-0 entry never points at next-hop entries that are not there
    yet; deletes come table 0 first, for the same reason. The switch applies them in order.
    """
    old_by_key = {f.key: f for f in old}
    new_by_key = {f.key: f for f in new}
    add = [f for k, f in new_by_key.items() if old_by_key.get(k) != f]
    delete = [f for k, f in old_by_key.items() if k not in new_by_key]
    add.sort(key=lambda f: (-f.table, _sort_key(f)))
    delete.sort(key=_sort_key)
    return RuleDiff(tuple(add), tuple(delete))


def describe(flows: Iterable[FlowEntry]) -> list[str]:
    return [str(f) for f in flows]


def mode_error(mode: Any) -> str | None:
    """One-line reason why `mode` is not a routing mode, or None when it is."""
    if isinstance(mode, str) and mode in MODES:
        return None
    return f"unknown mode {mode!r}; expected one of: {', '.join(MODES)}"
