"""Unit tests of the controller's pure rule computation (no root, no OpenFlow library).

A small interpreter runs the computed flow tables on abstract packets, so the tests check where
packets go (per mode, per UDP source port, with links down), not only what the entries look like.
Its `multipath` is Open vSwitch's own link choice (emulator.controller.ovs_multipath, checked against
ofproto/trace), because whether tiers hash a flow independently depends on the hash: a linear
stand-in such as CRC32 would show correlations OVS does not have.
"""

from __future__ import annotations

import collections
import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from emulator.controller import rules as rules_module
from emulator.controller.rules import (
    CONTROLLER,
    ETH_ARP,
    ETH_IPV4,
    ETH_IPV6,
    IN_PORT,
    IPPROTO_UDP,
    MODES,
    TABLE_FORWARD,
    TABLE_NEXT_HOP,
    FlowEntry,
    GotoTable,
    Graph,
    Multipath,
    Output,
    WriteNextHopSet,
    compute_rules,
    diff_rules,
    mode_error,
    multipath_bases,
    next_hop_set_id,
    next_hops_to_host,
    spray_buckets,
)
from emulator.controller.stats import PortTable, link_report
from topologies.builders import clos, fat_tree, in_server, leaf_spine
from topologies.model import Link, Node, Topology
from topologies.paths import equal_cost_paths, link_at, next_hops, path_count, routing_table
from topologies.spec import parse_spec

IPPROTO_TCP = 6


# -- a flow-table interpreter -------------------------------------------------------------------------
@dataclass(frozen=True)
class Pkt:
    src: str
    dst: str
    eth_type: int = ETH_IPV4
    ip_proto: int = IPPROTO_UDP
    sport: int = 40000
    dport: int = 9999


def _matches(flow: FlowEntry, fields: dict) -> bool:
    for name, want in flow.match:
        have = fields.get(name)
        if have is None:
            return False
        if isinstance(want, tuple):
            value, mask = want
            if have & mask != value & mask:
                return False
        elif have != want:
            return False
    return True


# Flow tables indexed by destination (table 0) and next-hop set (table 1), and lookups remembered per
# (switch, table, header fields): the fabric-wide walks below cross hundreds of thousands of switches,
# and scanning every entry each time would take minutes. The fields never include the source address,
# which only the multipath hash reads, so lookups are shared between senders.
_INDEX: dict[int, tuple[tuple[FlowEntry, ...], dict[tuple[int, object], list[FlowEntry]], dict]] = {}


def _lookup(flows: tuple[FlowEntry, ...], table: int, fields: dict) -> FlowEntry | None:
    """The highest-priority entry of `table` matching `fields` (None: table miss without an entry)."""
    hit = _INDEX.get(id(flows))
    if hit is None or hit[0] is not flows:
        index: dict[tuple[int, object], list[FlowEntry]] = {}
        for f in flows:
            m = f.match_dict()
            index.setdefault((f.table, m.get("ipv4_dst" if f.table == TABLE_FORWARD else "metadata")), []).append(f)
        hit = _INDEX[id(flows)] = (flows, index, {})
    _, index, memo = hit
    key = fields.get("ipv4_dst" if table == TABLE_FORWARD else "metadata")
    pool_key = ("pool", table, key)
    if pool_key not in memo:
        pool = index.get((table, None), []) + (index.get((table, key), []) if key is not None else [])
        # Only the fields some candidate matches on can change the answer.
        memo[pool_key] = pool, sorted({name for f in pool for name, _ in f.match})
    pool, used = memo[pool_key]
    memo_key = (table, key, *(fields.get(name) for name in used))
    if memo_key not in memo:
        candidates = [f for f in pool if _matches(f, fields)]
        best = max(candidates, key=lambda f: f.priority) if candidates else None
        if best is not None:
            assert sum(f.priority == best.priority for f in candidates) == 1, "ambiguous match"
        memo[memo_key] = best
    return memo[memo_key]


def forward(flows: tuple[FlowEntry, ...], pkt: Pkt, in_port: int) -> int | str | None:
    """Output port of `pkt` entering a switch with `flows` on `in_port` (None: dropped)."""
    fields = {"in_port": in_port, "eth_type": pkt.eth_type, "metadata": 0, "reg0": 0}
    if pkt.eth_type == ETH_IPV4:
        fields.update(ipv4_dst=pkt.dst, ip_proto=pkt.ip_proto)
        if pkt.ip_proto == IPPROTO_UDP:
            fields["udp_src"] = pkt.sport
            fields["udp_dst"] = pkt.dport
    table = TABLE_FORWARD
    while True:
        best = _lookup(flows, table, fields)
        if best is None:
            return None
        goto = None
        for a in best.actions:
            if isinstance(a, Output):
                return a.port
            if isinstance(a, Multipath):
                fields["reg0"] = a.link(pkt.src, pkt.dst, pkt.ip_proto, pkt.sport, pkt.dport)
            elif isinstance(a, WriteNextHopSet):
                fields["metadata"] = a.set_id
            elif isinstance(a, GotoTable):
                goto = a.table
        if goto is None:
            return None
        table = goto


def trace(
    topo: Topology, rules: dict, src: str, dst: str, **pkt_fields
) -> tuple[list[str], tuple[tuple[str, int], ...]]:
    """Nodes a packet from host `src` to host `dst` visits (ending with "DROP" when it is dropped) and
    the (node, port) it leaves each node by, which tells parallel links apart."""
    hosts = _host_links(topo)
    pkt = Pkt(hosts[src][0], hosts[dst][0], **pkt_fields)
    link = hosts[src][1]
    node, path, ports = link.peer(src), [src], [(src, link.port(src))]
    for _ in range(16):
        path.append(node)
        if node == dst:
            return path, tuple(ports)
        if node in hosts:
            return [*path, "DROP"], tuple(ports)
        in_port = link.port(node)
        out = forward(rules[node], pkt, in_port)
        if out is None:
            return [*path, "DROP"], tuple(ports)
        out_port = in_port if out == IN_PORT else int(out)
        ports.append((node, out_port))
        link = link_at(topo, node, out_port)
        node = link.peer(node)
    raise AssertionError(f"loop: {path}")


_HOST_LINKS: dict[int, tuple[Topology, dict[str, tuple[str, Link]]]] = {}


def _host_links(topo: Topology) -> dict[str, tuple[str, Link]]:
    """Host -> (address, first link), cached per topology (looking them up per packet dominated big walks)."""
    hit = _HOST_LINKS.get(id(topo))
    if hit is None or hit[0] is not topo:
        table = {h.name: (h.address or "", topo.links_of(h.name)[0]) for h in topo.hosts}
        hit = _HOST_LINKS[id(topo)] = (topo, table)
    return hit[1]


def walk(topo: Topology, rules: dict, src: str, dst: str, **pkt_fields) -> list[str]:
    """Nodes a packet from host `src` to host `dst` visits; ends with "DROP" when it is dropped."""
    return trace(topo, rules, src, dst, **pkt_fields)[0]


def all_pairs_reach(topo: Topology, rules: dict, **pkt_fields) -> bool:
    hosts = [h.name for h in topo.hosts]
    return all(walk(topo, rules, s, d, **pkt_fields)[-1] == d for s in hosts for d in hosts if s != d)


def uplink_for(topo: Topology, rules: dict, src: str, dst: str, **pkt_fields) -> str:
    """The second switch on the path (the spine in a leaf-spine)."""
    return walk(topo, rules, src, dst, **pkt_fields)[2]


# -- fixtures -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ls222() -> Topology:
    return leaf_spine(spines=2, leaves=2, hosts_per_leaf=2)


@pytest.fixture(scope="module")
def ls442() -> Topology:
    return leaf_spine(spines=4, leaves=4, hosts_per_leaf=2)


@pytest.fixture(scope="module")
def srv() -> Topology:
    return in_server(servers=2, gpus_per_server=4)


def link(topo: Topology, a: str, b: str) -> Link:
    return topo.links_between(a, b)[0]


# -- every mode ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("which", ["ls222", "ls442", "srv"])
def test_all_pairs_reachable_in_every_mode(mode, which, request):
    topo = request.getfixturevalue(which)
    rules = compute_rules(topo, mode)
    assert set(rules) == {s.name for s in topo.switches}
    for proto in (IPPROTO_UDP, IPPROTO_TCP):
        for sport in (40000, 40001, 40007):
            assert all_pairs_reach(topo, rules, ip_proto=proto, sport=sport)


@pytest.mark.parametrize("mode", MODES)
def test_base_entries_arp_to_controller_and_no_flooding(ls222, mode):
    for flows in compute_rules(ls222, mode).values():
        by_match = {f.match: f for f in flows if f.table == TABLE_FORWARD}
        assert by_match[(("eth_type", ETH_ARP),)].actions == (Output(CONTROLLER),)
        assert by_match[(("eth_type", ETH_IPV6),)].actions == ()
        # table-miss drops in both tables
        assert {f.table for f in flows if f.match == () and f.actions == ()} == {TABLE_FORWARD, TABLE_NEXT_HOP}
        for f in flows:
            for a in f.actions:
                if isinstance(a, Output):
                    assert a.port in (CONTROLLER, IN_PORT) or isinstance(a.port, int)


def test_ipv6_and_unknown_destinations_are_dropped(ls222):
    rules = compute_rules(ls222, "ecmp")
    assert forward(rules["leaf1"], Pkt("10.0.0.1", "::1", eth_type=ETH_IPV6), 1) is None
    assert forward(rules["leaf1"], Pkt("10.0.0.1", "10.0.9.9"), 1) is None


def test_unknown_mode_is_rejected(ls222):
    with pytest.raises(ValueError, match="unknown mode 'bogus'"):
        compute_rules(ls222, "bogus")
    assert mode_error("spray") is None
    assert "ecmp" in mode_error(42)


def test_rules_are_deterministic(ls442):
    assert compute_rules(ls442, "spray") == compute_rules(ls442, "spray")


# -- ecmp -------------------------------------------------------------------------------------------------
def test_ecmp_leaf_hashes_over_both_spines(ls222):
    rules = compute_rules(ls222, "ecmp")
    leaf1 = {f.match: f for f in rules["leaf1"]}
    local = leaf1[(("eth_type", ETH_IPV4), ("ipv4_dst", "10.0.0.2"))]
    assert local.actions == (Output(2),)
    remote = leaf1[(("eth_type", ETH_IPV4), ("ipv4_dst", "10.0.0.3"))]
    set_id = next_hop_set_id((3, 4))
    assert remote.actions == (Multipath(2, basis=3), WriteNextHopSet(set_id), GotoTable(TABLE_NEXT_HOP))
    buckets = {f.match: f.actions for f in rules["leaf1"] if f.table == TABLE_NEXT_HOP and f.actions}
    assert buckets == {
        (("metadata", set_id), ("reg0", 0)): (Output(3),),
        (("metadata", set_id), ("reg0", 1)): (Output(4),),
    }
    # no spray entries in ecmp
    assert not any("udp_src" in f.match_dict() for f in rules["leaf1"])


def test_spines_have_one_next_hop_per_host(ls222):
    rules = compute_rules(ls222, "ecmp")
    spine1 = {f.match_dict().get("ipv4_dst"): f.actions for f in rules["spine1"] if f.priority == 200}
    assert spine1 == {
        "10.0.0.1": (Output(1),),
        "10.0.0.2": (Output(1),),
        "10.0.0.3": (Output(2),),
        "10.0.0.4": (Output(2),),
    }


def test_ecmp_keeps_a_flow_on_one_path_and_spreads_flows(ls442):
    rules = compute_rules(ls442, "ecmp")
    one_flow = {uplink_for(ls442, rules, "h1", "h3", sport=41000) for _ in range(5)}
    assert len(one_flow) == 1
    spines = Counter(uplink_for(ls442, rules, "h1", "h3", sport=42000 + i) for i in range(400))
    assert set(spines) == {"spine1", "spine2", "spine3", "spine4"}


def test_local_mode_is_ecmp(srv):
    assert compute_rules(srv, "local") == compute_rules(srv, "ecmp")


# -- spray -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spines", [2, 4, 8])
def test_spray_16_consecutive_ports_spread_evenly(spines):
    topo = leaf_spine(spines=spines, leaves=2, hosts_per_leaf=1)
    rules = compute_rules(topo, "spray")
    for base in (40000, 40005, 51234):
        used = Counter(uplink_for(topo, rules, "h1", "h2", sport=base + i) for i in range(16))
        assert set(used) == {f"spine{j}" for j in range(1, spines + 1)}
        assert set(used.values()) == {16 // spines}


def _data_spray(f) -> bool:
    """A spray entry for data (EV in the source port), not for replies (EV in the destination port)."""
    return isinstance(f.match_dict().get("udp_src"), tuple)


def test_acks_from_the_receiver_port_return_along_their_data_path(ls442):
    """In spray mode an ACK (from DEFAULT_PORT to the EV port its data left from) crosses the same spine
    as its data, for every EV: a dead spine then costs only the ACKs of the EVs that die on it anyway."""
    from transport.core.contract import DEFAULT_BASE_PORT, DEFAULT_PORT

    rules = compute_rules(ls442, "spray")
    for ev in range(16):
        data = Pkt("10.0.0.1", "10.0.0.8", sport=DEFAULT_BASE_PORT + ev, dport=DEFAULT_PORT)
        ack = Pkt("10.0.0.8", "10.0.0.1", sport=DEFAULT_PORT, dport=DEFAULT_BASE_PORT + ev)
        up = forward(rules["leaf1"], data, 1)
        back = forward(rules["leaf4"], ack, 2)
        assert up - 2 == back - 2, f"EV {ev}: data to spine {up - 2}, its ACK from spine {back - 2}"
    replies = {f.match_dict()["udp_dst"][0] for f in rules["leaf1"] if "udp_dst" in f.match_dict()}
    assert replies == set(range(16))


def test_spray_bucket_i_maps_to_next_hop_i_mod_n(ls442):
    rules = compute_rules(ls442, "spray")
    uplinks = (3, 4, 5, 6)
    set_id = next_hop_set_id(uplinks)
    spray = {f.match_dict()["udp_src"][0]: f.actions for f in rules["leaf1"] if _data_spray(f)}
    assert spray == {i: (Output(uplinks[i % 4]),) for i in range(16)}
    f = next(f for f in rules["leaf1"] if _data_spray(f))
    assert f.match_dict()["udp_src"] == (f.match_dict()["udp_src"][0], 0xF)
    assert f.match_dict()["metadata"] == set_id
    assert f.match_dict()["ip_proto"] == IPPROTO_UDP


def test_spray_non_udp_falls_back_to_hashing(ls442):
    rules = compute_rules(ls442, "spray")
    # TCP ignores the spray entries: one path per flow, several paths over many flows.
    assert len({uplink_for(ls442, rules, "h1", "h3", ip_proto=IPPROTO_TCP, sport=5000) for _ in range(3)}) == 1
    used = {uplink_for(ls442, rules, "h1", "h3", ip_proto=IPPROTO_TCP, sport=5000 + i) for i in range(200)}
    assert len(used) == 4


def test_spray_buckets_grow_past_16_next_hops():
    assert spray_buckets(2) == 16
    assert spray_buckets(16) == 16
    assert spray_buckets(17) == 32


# -- single ------------------------------------------------------------------------------------------------
def test_single_pins_each_destination_to_one_uplink(ls442):
    rules = compute_rules(ls442, "single")
    for dst in ("h3", "h4", "h5", "h8"):
        assert len({uplink_for(ls442, rules, "h1", dst, sport=40000 + i) for i in range(16)}) == 1
    # destinations are spread by host index: h3..h6 (indexes 2..5) take spines 3, 4, 1, 2
    assert [uplink_for(ls442, rules, "h1", d) for d in ("h3", "h4", "h5", "h6")] == [
        "spine3",
        "spine4",
        "spine1",
        "spine2",
    ]
    assert not any(f.table == TABLE_NEXT_HOP and f.actions for f in rules["leaf1"])


# -- several tiers: spray, single and ECMP on fat-trees and three-tier Clos fabrics -----------------------
# The transport and the probe rotate over 16 EVs from a base port that is a multiple of 16.
EVS = 16
BASE_PORT = 40000

# Every builder, with shapes whose path counts divide 16 (exactly even) and shapes whose do not.
FABRICS: dict[str, Callable[[], Topology]] = {
    "leaf-spine-2x2x2": lambda: leaf_spine(2, 2, 2),
    "leaf-spine-3x3x2": lambda: leaf_spine(3, 3, 2),
    "leaf-spine-4x4x2": lambda: leaf_spine(4, 4, 2),
    "leaf-spine-16x2x1": lambda: leaf_spine(16, 2, 1),
    "in-server-2x4": lambda: in_server(2, 4),
    "in-server-3x2-two-nics": lambda: in_server(3, 2, nics_per_server=2),
    "fat-tree-k2": lambda: fat_tree(2),
    "fat-tree-k4": lambda: fat_tree(4),
    "fat-tree-k6": lambda: fat_tree(6),
    "fat-tree-k8": lambda: fat_tree(8),
    "clos-default": clos,
    "clos-3x2x3x6x1": lambda: clos(3, 2, 3, 6, 1),
    "clos-spec": lambda: parse_spec("clos:pods=2,leaves=3,spines=4,superspines=8,hosts=1"),
}


@functools.cache
def fabric(name: str) -> Topology:
    return FABRICS[name]()


@functools.cache
def rules_for(name: str, mode: str) -> dict[str, tuple[FlowEntry, ...]]:
    return compute_rules(fabric(name), mode)


def spray_spread(
    topo: Topology, rules: dict, src: str, dst: str, base: int = BASE_PORT, evs: int = EVS
) -> tuple[Counter, Counter]:
    """Packets per node path and per link path when `src` sprays `evs` packets to `dst`, one per EV."""
    nodes: Counter = Counter()
    links: Counter = Counter()
    for ev in range(evs):
        path, crossed = trace(topo, rules, src, dst, sport=base + ev)
        assert path[-1] == dst, path
        nodes[tuple(path)] += 1
        links[crossed] += 1
    return nodes, links


def assert_even(counts: Counter, paths: int, evs: int = EVS) -> None:
    """With P paths and N EVs, every path gets N // P or N // P + 1 packets (the best N allows);
    with more paths than EVs, every EV takes a path of its own."""
    if paths <= evs:
        assert len(counts) == paths, counts
        assert set(counts.values()) <= {evs // paths, -(-evs // paths)}, counts
    else:
        assert len(counts) == evs and set(counts.values()) == {1}, counts


def senders(topo: Topology) -> list[str]:
    """Every host, or on big fabrics the first host of each pod (pods are alike)."""
    hosts = [h.name for h in topo.hosts]
    if len(hosts) <= 64:
        return hosts
    firsts: dict[str, str] = {}
    for h in topo.hosts:
        firsts.setdefault(h.labels["pod"], h.name)
    return list(firsts.values())


@pytest.mark.parametrize("name", list(FABRICS))
def test_spray_uses_every_equal_cost_path_evenly(name):
    topo, rules = fabric(name), rules_for(name, "spray")
    hosts = [h.name for h in topo.hosts]
    for src in senders(topo):
        for dst in hosts:
            if src == dst:
                continue
            nodes, links = spray_spread(topo, rules, src, dst)
            assert set(nodes) == {tuple(p) for p in equal_cost_paths(topo, src, dst)}, (src, dst)
            # Link paths tell parallel links apart (two NICs per server).
            paths = path_count(topo, src, dst)
            assert_even(links, paths)
            if EVS % paths == 0:
                assert len(set(links.values())) == 1, (src, dst, links)


@functools.cache
def clos_spray(spec: str) -> tuple[Topology, dict[str, tuple[FlowEntry, ...]]]:
    topo = parse_spec(spec)
    return topo, compute_rules(topo, "spray")


@settings(max_examples=40, deadline=None)
@given(
    shape=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 4), st.integers(1, 3), st.integers(1, 2)),
    data=st.data(),
)
def test_spray_is_even_on_any_clos_from_any_base_port(shape, data):
    pods, leaves, spines, per_plane, hosts = shape
    assume(pods * leaves * hosts >= 2)
    topo, rules = clos_spray(
        f"clos:pods={pods},leaves={leaves},spines={spines},superspines={spines * per_plane},hosts={hosts}"
    )
    names = [h.name for h in topo.hosts]
    src = data.draw(st.sampled_from(names))
    dst = data.draw(st.sampled_from([h for h in names if h != src]))
    # Any 16 consecutive source ports: their low 4 bits are all 16 EVs, in some order.
    base = data.draw(st.integers(1024, 65535 - EVS))
    nodes, links = spray_spread(topo, rules, src, dst, base=base)
    assert set(nodes) == {tuple(p) for p in equal_cost_paths(topo, src, dst)}
    assert_even(links, path_count(topo, src, dst))


@functools.cache
def built(shape: tuple) -> Topology:
    kind, *args = shape
    return {"leaf-spine": leaf_spine, "in-server": in_server, "fat-tree": fat_tree, "clos": clos}[kind](*args)


BUILDER_SHAPES = st.one_of(
    st.tuples(st.just("leaf-spine"), st.integers(1, 4), st.integers(1, 4), st.integers(1, 3)),
    st.tuples(st.just("in-server"), st.integers(1, 3), st.integers(1, 4), st.just(100.0), st.just(20.0),
              st.integers(1, 2)),
    st.tuples(st.just("fat-tree"), st.sampled_from([2, 4, 6])),
    st.integers(1, 3).flatmap(lambda spines: st.tuples(
        st.just("clos"), st.integers(1, 3), st.integers(1, 3), st.just(spines),
        st.integers(1, 2).map(lambda per_plane: spines * per_plane), st.integers(1, 2))),
)


@settings(max_examples=60, deadline=None)
@given(shape=BUILDER_SHAPES, data=st.data())
def test_controller_next_hops_are_the_topologys_equal_cost_next_hops(shape, data):
    """The controller's next-hop search (rules.Graph, toward the destination's edge switch) and
    topologies.paths (toward the host itself) pick the same ports, at every switch for every
    destination host, on every fabric the builders make, with any links down."""
    topo = built(shape)
    down = frozenset(data.draw(st.sets(st.sampled_from(topo.links), max_size=3)))
    graph = Graph(topo, down)
    table = routing_table(topo, down)
    assert {a.host.name for a in graph.attachments} == {h.name for h in topo.hosts}
    for att in graph.attachments:
        for sw in topo.switches:
            if not att.up:
                controller: tuple[int, ...] = ()
            elif sw.name == att.switch:
                controller = (att.port,)
            else:
                controller = graph.next_hop_ports(sw.name, att.switch)
            paths = tuple(sorted({lk.port(sw.name) for lk in table[sw.name][att.host.name]}))
            assert controller == paths, (sw.name, att.host.name, sorted(lk.name for lk in down))
    # And through the controller's own entry point, for one switch and host.
    sw = data.draw(st.sampled_from([s.name for s in topo.switches]))
    host = data.draw(st.sampled_from([h.name for h in topo.hosts]))
    assert next_hops_to_host(topo, sw, host, down) == tuple(sorted(lk.port(sw) for lk in next_hops(topo, sw, host,
                                                                                                       down)))


def per_switch(topo: Topology, rules: dict, pairs, **pkt_fields) -> Counter:
    """Packets through each switch over `pairs` x 16 EVs."""
    seen: Counter = Counter()
    for src, dst in pairs:
        for ev in range(EVS):
            seen.update(walk(topo, rules, src, dst, sport=BASE_PORT + ev, **pkt_fields)[1:-1])
    return seen


def test_spray_k4_fat_tree_counts_per_core_and_aggregation_switch():
    topo, rules = fabric("fat-tree-k4"), rules_for("fat-tree-k4", "spray")
    # One sender to a host in another pod: 16 EVs, 4 per core, 8 per aggregation switch either side.
    seen = per_switch(topo, rules, [("h1", "h16")])
    assert {s: seen[s] for s in ("c1", "c2", "c3", "c4")} == {"c1": 4, "c2": 4, "c3": 4, "c4": 4}
    assert {s: seen[s] for s in ("p1a1", "p1a2", "p4a1", "p4a2")} == {"p1a1": 8, "p1a2": 8, "p4a1": 8, "p4a2": 8}
    # Every host to every host in other pods: each tier evenly loaded, switch by switch.
    pods = {h.name: h.labels["pod"] for h in topo.hosts}
    pairs = [(a, b) for a in pods for b in pods if pods[a] != pods[b]]
    seen = per_switch(topo, rules, pairs)
    for tier in ("core", "agg", "edge"):
        assert len({seen[n.name] for n in topo.by_role(tier)}) == 1, (tier, seen)
    assert seen["c1"] == len(pairs) * EVS // 4 == 768
    assert seen["p1a1"] == 2 * len(pairs) * EVS // 8 == 768


def test_spray_without_per_tier_digits_polarises(monkeypatch):
    """What the divisors prevent: with EV i -> next_hops[i % n] at every tier, the aggregation switch
    re-sorts the EVs its edge switch already sorted, and half the cores carry nothing."""
    monkeypatch.setattr(rules_module.Graph, "divisors", lambda self, target: collections.defaultdict(lambda: 1))
    topo = fat_tree(4)
    seen = per_switch(topo, compute_rules(topo, "spray"), [("h1", "h16")])
    assert {s: seen[s] for s in ("c1", "c2", "c3", "c4")} == {"c1": 8, "c2": 0, "c3": 0, "c4": 8}


def test_spray_divisors_and_entries_on_a_fat_tree():
    topo = fat_tree(4)
    div = Graph(topo).divisors("p4e2")
    assert (div["p1e1"], div["p1a1"], div["p1a2"], div["c1"], div["p4e1"]) == (1, 2, 2, 4, 1)
    leaves = Graph(leaf_spine(4, 4, 2)).divisors("leaf1")
    assert {leaves[f"leaf{k}"] for k in range(2, 5)} == {1}  # a leaf-spine keeps EV % n
    rules = rules_for("fat-tree-k4", "spray")
    # p1a1 reaches the cores of its plane on ports 3 and 4 and reads the second digit: EV // 2 % 2.
    set_id = next_hop_set_id((3, 4), 2)
    assert set_id >> 63 == 1 and set_id != next_hop_set_id((3, 4))
    h16 = next(f for f in rules["p1a1"] if f.match_dict().get("ipv4_dst") == "10.0.0.16")
    assert h16.actions[1:] == (WriteNextHopSet(set_id), GotoTable(TABLE_NEXT_HOP))
    spray = {f.match_dict()["udp_src"][0]: f.actions for f in rules["p1a1"] if _data_spray(f)}
    assert spray == {ev: (Output((3, 4)[ev // 2 % 2]),) for ev in range(16)}
    # The edge switch keeps EV % 2, and ECMP keeps the plain port bitmask.
    edge = {f.match_dict()["udp_src"][0]: f.actions for f in rules["p1e1"] if _data_spray(f)}
    assert edge == {ev: (Output((3, 4)[ev % 2]),) for ev in range(16)}
    ecmp = rules_for("fat-tree-k4", "ecmp")
    h16 = next(f for f in ecmp["p1a1"] if f.match_dict().get("ipv4_dst") == "10.0.0.16")
    assert h16.actions[1] == WriteNextHopSet(next_hop_set_id((3, 4)))


def test_spray_past_16_paths_widens_the_entropy():
    """8 spines x 4 super-spines per plane: 32 paths between pods. The spines' digit needs 5 bits, so
    one 16-EV flow takes 16 distinct paths and flows on the next base port the other 16."""
    assert spray_buckets(4, 8) == 32 and spray_buckets(2, 4) == 16 and spray_buckets(16, 1) == 16
    topo = clos(pods=2, leaves=1, spines=8, superspines=32, hosts_per_leaf=1)
    rules = compute_rules(topo, "spray")
    assert path_count(topo, "h1", "h2") == 32
    _, first = spray_spread(topo, rules, "h1", "h2", base=BASE_PORT)
    _, second = spray_spread(topo, rules, "h1", "h2", base=BASE_PORT + 16)
    assert_even(first, 32) and assert_even(second, 32)
    assert len(set(first) | set(second)) == 32
    _, both = spray_spread(topo, rules, "h1", "h2", evs=32)
    assert_even(both, 32, evs=32)


def test_spray_around_a_dead_core_link_uses_only_live_paths():
    topo = fat_tree(4)
    down = set(topo.links_between("p1a1", "c1"))
    rules = compute_rules(topo, "spray", down)
    assert all_pairs_reach(topo, rules)
    nodes, _ = spray_spread(topo, rules, "h1", "h16")
    assert set(nodes) == {tuple(p) for p in equal_cost_paths(topo, "h1", "h16", down)}
    # Per hop even: half the EVs go to p1a1 (now one core), half to p1a2 (two cores).
    assert sorted(Counter(p[3] for p in nodes.elements()).items()) == [("c2", 8), ("c3", 4), ("c4", 4)]


def test_single_spreads_destinations_over_every_core():
    topo, rules = fabric("fat-tree-k4"), rules_for("fat-tree-k4", "single")
    # h13..h16 (host indexes 12..15): edge choice index % 2, aggregation choice index // 2 % 2.
    cores = [walk(topo, rules, "h1", f"h{i}")[3] for i in (13, 14, 15, 16)]
    assert sorted(cores) == ["c1", "c2", "c3", "c4"]
    assert len({walk(topo, rules, "h1", "h16", sport=BASE_PORT + ev)[3] for ev in range(EVS)}) == 1


def core_counts(topo: Topology, rules: dict, src: str, dst: str, flows: int) -> Counter:
    return Counter(walk(topo, rules, src, dst, sport=BASE_PORT + i)[3] for i in range(flows))


@pytest.mark.parametrize("proto", [IPPROTO_UDP, IPPROTO_TCP])
def test_ecmp_tiers_hash_independently(proto):
    """Each switch seeds the hash with its own basis, so the aggregation tier's choice is independent
    of the edge tier's: 1024 flows cover all 4 core paths of a k=4 fat-tree about evenly."""
    topo, rules = fabric("fat-tree-k4"), rules_for("fat-tree-k4", "ecmp")
    cores = Counter(walk(topo, rules, "h1", "h16", sport=BASE_PORT + i, ip_proto=proto)[3] for i in range(1024))
    assert set(cores) == {"c1", "c2", "c3", "c4"}
    assert max(cores.values()) / min(cores.values()) < 1.3, cores
    # k=8: 16 paths between pods, 2048 flows, every path taken.
    topo, rules = fabric("fat-tree-k8"), rules_for("fat-tree-k8", "ecmp")
    paths = Counter(tuple(walk(topo, rules, "h1", "h128", sport=BASE_PORT + i)) for i in range(2048))
    assert len(paths) == 16 and max(paths.values()) / min(paths.values()) < 2, paths


def test_ecmp_with_one_basis_everywhere_would_polarise(monkeypatch):
    monkeypatch.setattr(rules_module, "multipath_bases", lambda topo: {s.name: 7 for s in topo.switches})
    topo = fat_tree(4)
    cores = Counter(walk(topo, compute_rules(topo, "ecmp"), "h1", "h16", sport=BASE_PORT + i)[3] for i in range(256))
    assert len(cores) == 2, cores


def test_multipath_bases_are_unique_per_switch():
    for name in FABRICS:
        topo = fabric(name)
        bases = multipath_bases(topo)
        assert len(set(bases.values())) == len(topo.switches)
        assert all(0 <= b <= 0xFFFF for b in bases.values())
    nodes = (
        Node("s1", "leaf", dpid=1),
        Node("s2", "leaf", dpid=0x10001),
        Node("a", "host", ip="10.0.0.1/24", mac="02:00:00:00:00:01"),
    )
    topo = Topology("clash", nodes, (Link("a", 0, "s1", 1, 10), Link("s1", 2, "s2", 1, 10)))
    # dpids 1 and 0x10001 share their low 16 bits: positions are used instead.
    assert multipath_bases(topo) == {"s1": 1, "s2": 2}
    assert multipath_bases(leaf_spine(2, 2, 2)) == {"spine1": 1, "spine2": 2, "leaf1": 3, "leaf2": 4}


# -- in-server and via-tor -----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["ecmp", "local", "spray", "single"])
def test_in_server_gpus_talk_through_the_local_switch(srv, mode):
    rules = compute_rules(srv, mode)
    assert walk(srv, rules, "s1g1", "s1g2") == ["s1g1", "nv1", "s1g2"]
    assert walk(srv, rules, "s1g1", "s2g3") == ["s1g1", "nv1", "tor1", "nv2", "s2g3"]


def test_via_tor_hairpins_at_the_tor(srv):
    rules = compute_rules(srv, "via-tor")
    assert walk(srv, rules, "s1g1", "s1g2") == ["s1g1", "nv1", "tor1", "nv1", "s1g2"]
    assert walk(srv, rules, "s2g4", "s2g1") == ["s2g4", "nv2", "tor1", "nv2", "s2g1"]
    assert walk(srv, rules, "s1g1", "s2g3") == ["s1g1", "nv1", "tor1", "nv2", "s2g3"]
    hairpins = [f for f in rules["tor1"] if f.actions == (Output(IN_PORT),)]
    assert len(hairpins) == 8  # one per GPU, on the port toward its server


def test_via_tor_in_leaf_spine_goes_up_to_a_spine(ls222):
    rules = compute_rules(ls222, "via-tor")
    paths = {tuple(walk(ls222, rules, "h1", "h2", sport=40000 + i)) for i in range(50)}
    assert paths == {("h1", "leaf1", "spine1", "leaf1", "h2"), ("h1", "leaf1", "spine2", "leaf1", "h2")}


def test_via_tor_with_two_nics_hashes_over_both():
    topo = in_server(servers=2, gpus_per_server=2, nics_per_server=2)
    rules = compute_rules(topo, "via-tor")
    assert all_pairs_reach(topo, rules)
    nv1_up = [f for f in rules["nv1"] if f.priority == 300]
    assert nv1_up and all(isinstance(f.actions[0], Multipath) for f in nv1_up)


def test_hairpins_stay_installed_in_every_mode(srv):
    # so that switching away from via-tor never drops packets still sent up by a cached path
    for mode in MODES:
        assert sum(f.actions == (Output(IN_PORT),) for f in compute_rules(srv, mode)["tor1"]) == 8


# -- failures ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["ecmp", "spray", "single"])
def test_down_link_removes_the_next_hop(ls222, mode):
    down = {link(ls222, "leaf1", "spine1")}
    rules = compute_rules(ls222, mode, down)
    assert next_hops_to_host(ls222, "leaf1", "h3", down) == (4,)
    assert next_hops_to_host(ls222, "leaf2", "h1", down) == (4,)
    assert next_hops_to_host(ls222, "leaf2", "h1") == (3, 4)
    for sport in range(40000, 40016):
        for proto in (IPPROTO_UDP, IPPROTO_TCP):
            assert uplink_for(ls222, rules, "h1", "h3", sport=sport, ip_proto=proto) == "spine2"
            assert uplink_for(ls222, rules, "h3", "h1", sport=sport, ip_proto=proto) == "spine2"
    assert all_pairs_reach(ls222, rules)
    # leaf1 now outputs directly; no next-hop set, no multipath left anywhere on it
    assert not any(isinstance(a, Multipath) for f in rules["leaf1"] for a in f.actions)


def test_down_link_in_4_spines_leaves_three(ls442):
    down = {link(ls442, "leaf1", "spine2")}
    rules = compute_rules(ls442, "spray", down)
    used = Counter(uplink_for(ls442, rules, "h1", "h3", sport=40000 + i) for i in range(16))
    assert used == {"spine1": 6, "spine3": 5, "spine4": 5}
    # every other leaf avoids spine2 toward leaf1's hosts, and keeps it toward the others
    assert next_hops_to_host(ls442, "leaf3", "h1", down) == (3, 5, 6)
    assert next_hops_to_host(ls442, "leaf3", "h7", down) == (3, 4, 5, 6)
    assert all_pairs_reach(ls442, rules)


def test_down_host_link_cuts_the_host_off(ls222):
    rules = compute_rules(ls222, "ecmp", {link(ls222, "h1", "leaf1")})
    for flows in rules.values():
        assert not any(f.match_dict().get("ipv4_dst") == "10.0.0.1" for f in flows)
    assert walk(ls222, rules, "h2", "h3")[-1] == "h3"


def test_partitioned_switch_gets_no_route():
    topo = leaf_spine(spines=1, leaves=2, hosts_per_leaf=1)
    rules = compute_rules(topo, "ecmp", {link(topo, "leaf1", "spine1")})
    assert walk(topo, rules, "h2", "h1")[-1] == "DROP"
    assert not any(f.match_dict().get("ipv4_dst") == "10.0.0.1" for f in rules["spine1"])


# -- installing changes -----------------------------------------------------------------------------------
def test_diff_replaces_in_place_and_orders_safely(ls222):
    before = compute_rules(ls222, "ecmp")["leaf1"]
    after = compute_rules(ls222, "ecmp", {link(ls222, "leaf1", "spine1")})["leaf1"]
    d = diff_rules(before, after)
    assert d and len(d) == len(d.add) + len(d.delete)
    # the two remote destinations are rewritten in place (same key), the hash buckets deleted
    assert {f.match_dict().get("ipv4_dst") for f in d.add} == {"10.0.0.3", "10.0.0.4"}
    assert all(f.table == TABLE_NEXT_HOP for f in d.delete)
    assert not diff_rules(after, after)
    # adds: table 1 before table 0; deletes: table 0 before table 1
    spray = compute_rules(ls222, "spray")["leaf1"]
    up = diff_rules(after, spray)
    assert [f.table for f in up.add] == sorted((f.table for f in up.add), reverse=True)
    down = diff_rules(spray, after)
    assert [f.table for f in down.delete] == sorted(f.table for f in down.delete)


def test_diff_from_empty_installs_everything(ls222):
    flows = compute_rules(ls222, "spray")["leaf2"]
    d = diff_rules((), flows)
    assert set(d.add) == set(flows) and not d.delete


def test_next_hop_set_ids():
    assert next_hop_set_id((3, 4)) == 0b11000
    assert next_hop_set_id((3, 4)) != next_hop_set_id((3, 5))
    big = next_hop_set_id((1, 100))
    assert big >> 63 == 1 and big == next_hop_set_id((1, 100))


def test_hand_built_topology_with_parallel_links():
    # two switches joined by two parallel links; hosts on either side
    nodes = (
        Node("s1", "leaf", dpid=1),
        Node("s2", "leaf", dpid=2),
        Node("a", "host", ip="10.0.0.1/24", mac="02:00:00:00:00:01"),
        Node("b", "host", ip="10.0.0.2/24", mac="02:00:00:00:00:02"),
    )
    links = (
        Link("a", 0, "s1", 1, 10),
        Link("b", 0, "s2", 1, 10),
        Link("s1", 2, "s2", 2, 10),
        Link("s1", 3, "s2", 3, 10),
    )
    topo = Topology("pair", nodes, links)
    rules = compute_rules(topo, "spray")
    assert next_hops_to_host(topo, "s1", "b") == (2, 3)
    assert Counter(walk(topo, rules, "a", "b", sport=7 + i)[1] for i in range(16)) == {"s1": 16}
    assert all_pairs_reach(topo, rules)
    rules = compute_rules(topo, "ecmp", {links[2]})
    assert next_hops_to_host(topo, "s1", "b", {links[2]}) == (3,)
    assert all_pairs_reach(topo, rules)


# -- link counters ----------------------------------------------------------------------------------------
def test_link_report_orientation_and_utilisation(ls222):
    ports = PortTable()
    leaf1, spine1 = ls222.node("leaf1").dpid, ls222.node("spine1").dpid
    zero = dict.fromkeys(
        ("rx_packets", "tx_packets", "rx_bytes", "tx_bytes", "rx_dropped", "tx_dropped", "rx_errors", "tx_errors"), 0
    )
    ports.update(leaf1, 1, 100.0, zero, uptime=10.0)  # h1 <-> leaf1 port 1
    ports.update(
        leaf1,
        1,
        100.5,
        {**zero, "rx_bytes": 1_250_000, "rx_packets": 1000, "tx_bytes": 125_000, "tx_packets": 100, "tx_dropped": 3},
        uptime=10.5,
    )
    ports.update(leaf1, 3, 100.5, {**zero, "tx_bytes": 42, "tx_packets": 1})  # leaf1 -> spine1
    report = link_report(ls222, ports, {link(ls222, "leaf1", "spine1")}, 101.0)
    by_name = {x["name"]: x for x in report["links"]}
    h1 = by_name["h1-leaf1"]
    # a = h1 is a host, so counters are read at leaf1 and reversed: h1 -> leaf1 is leaf1's rx
    assert (h1["tx_bytes"], h1["rx_bytes"], h1["tx_packets"], h1["rx_packets"]) == (1_250_000, 125_000, 1000, 100)
    assert h1["util_ab"] == pytest.approx(1_250_000 * 8 / 0.5 / 20e6)  # 20 Mbit/s host links
    assert h1["util_ba"] == pytest.approx(125_000 * 8 / 0.5 / 20e6)
    assert h1["utilisation"] == h1["util_ab"] and h1["drops"] == 3 and h1["up"]
    up = by_name["leaf1-spine1"]
    assert (up["tx_bytes"], up["up"]) == (42, False)
    assert by_name["leaf2-spine1"]["tx_bytes"] == 0 and spine1 not in {k[0] for k in ports.ports}


# -- translation to OpenFlow and the HTTP API (no switch, no root) -------------------------------------
def test_every_entry_serialises_as_an_openflow13_flow_mod(srv, ls442):
    from types import SimpleNamespace

    from emulator.controller.app import FabricController
    from emulator.controller.compat import ofproto_v1_3, ofproto_v1_3_parser

    dp = SimpleNamespace(ofproto=ofproto_v1_3, ofproto_parser=ofproto_v1_3_parser, id=1)
    fake_app = SimpleNamespace(generation=7)
    # fat-tree: spray sets whose ids are hashes; the Clos: 32 spray buckets per set.
    for topo in (srv, ls442, fat_tree(4), clos(pods=2, leaves=1, spines=8, superspines=32, hosts_per_leaf=1)):
        for mode in ("spray", "via-tor", "single"):
            for flows in compute_rules(topo, mode, {topo.links[-1]}).values():
                for f in flows:
                    for delete in (False, True):
                        msg = FabricController._flow_mod(fake_app, dp, f, delete=delete)
                        msg.serialize()
                        assert msg.table_id == f.table and msg.priority == f.priority
                        assert len(msg.buf) >= 56


def test_api_routes_and_errors():
    import json
    import urllib.error
    import urllib.request

    from emulator.controller.api import ApiServer

    class Fake:
        mode = "ecmp"

        def api_health(self):
            return {"ready": True, "mode": self.mode}

        def api_links(self):
            return {"time": 1.0, "links": []}

        def api_ports(self):
            return {"time": 1.0, "ports": []}

        def api_events(self):
            return [{"time": 1.0, "kind": "mode"}]

        def api_get_mode(self):
            return {"mode": self.mode}

        def api_set_mode(self, mode):
            if err := mode_error(mode):
                raise ValueError(err)
            self.mode = mode
            return {"mode": mode}

        def api_rules(self, switch):
            if switch not in (None, "leaf1"):
                raise KeyError(switch)
            return {"switches": {}}

    server = ApiServer(Fake(), "127.0.0.1", 0)
    server.start()
    base = "http://{}:{}".format(*server.address)

    def call(path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(base + path, data=data, method="GET" if body is None else "PUT",
                                     headers={} if body is None else {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e)

    try:
        assert call("/health") == (200, {"ready": True, "mode": "ecmp"})
        assert call("/events")[1][0]["kind"] == "mode"
        assert call("/mode", {"mode": "spray"}) == (200, {"mode": "spray"})
        assert call("/mode") == (200, {"mode": "spray"})
        status, body = call("/mode", {"mode": "bogus"})
        assert status == 400 and "unknown mode" in body["error"]
        assert call("/mode", {"nope": 1})[0] == 400
        assert call("/rules?switch=leaf9")[0] == 404
        assert call("/nothing")[0] == 404
    finally:
        server.stop()
