"""Unit tests of the controller's pure rule computation (no root, no OpenFlow library).

A small interpreter runs the computed flow tables on abstract packets, so the tests check where
packets go (per mode, per UDP source port, with links down), not only what the entries look like.
"""

from __future__ import annotations

import zlib
from collections import Counter
from dataclasses import dataclass

import pytest

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
    Multipath,
    Output,
    WriteNextHopSet,
    compute_rules,
    diff_rules,
    mode_error,
    next_hop_set_id,
    next_hops_to_host,
    spray_buckets,
)
from emulator.controller.stats import PortTable, link_report
from topologies.builders import in_server, leaf_spine
from topologies.model import Link, Node, Topology

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


def forward(flows: tuple[FlowEntry, ...], pkt: Pkt, in_port: int) -> int | str | None:
    """Output port of `pkt` entering a switch with `flows` on `in_port` (None: dropped)."""
    fields = {"in_port": in_port, "eth_type": pkt.eth_type, "metadata": 0, "reg0": 0}
    if pkt.eth_type == ETH_IPV4:
        fields.update(ipv4_dst=pkt.dst, ip_proto=pkt.ip_proto)
        if pkt.ip_proto == IPPROTO_UDP:
            fields["udp_src"] = pkt.sport
    table = TABLE_FORWARD
    while True:
        candidates = [f for f in flows if f.table == table and _matches(f, fields)]
        if not candidates:
            return None
        best = max(candidates, key=lambda f: f.priority)
        assert sum(f.priority == best.priority for f in candidates) == 1, "ambiguous match"
        goto = None
        for a in best.actions:
            if isinstance(a, Output):
                return a.port
            if isinstance(a, Multipath):
                # Stand-in for OVS's symmetric_l3l4+udp hash: any deterministic per-flow function.
                key = f"{min(pkt.src, pkt.dst)}{max(pkt.src, pkt.dst)}{pkt.ip_proto}{pkt.sport}{pkt.dport}"
                fields["reg0"] = zlib.crc32(f"{key}/{a.basis}".encode()) % a.n_links
            elif isinstance(a, WriteNextHopSet):
                fields["metadata"] = a.set_id
            elif isinstance(a, GotoTable):
                goto = a.table
        if goto is None:
            return None
        table = goto


def walk(topo: Topology, rules: dict, src: str, dst: str, **pkt_fields) -> list[str]:
    """Nodes a packet from host `src` to host `dst` visits; ends with "DROP" when it is dropped."""
    pkt = Pkt(topo.node(src).address, topo.node(dst).address, **pkt_fields)
    link = topo.links_of(src)[0]
    node, path = link.peer(src), [src]
    for _ in range(16):
        path.append(node)
        if node == dst:
            return path
        if topo.node(node).is_host:
            return [*path, "DROP"]
        in_port = link.port(node)
        out = forward(rules[node], pkt, in_port)
        if out is None:
            return [*path, "DROP"]
        out_port = in_port if out == IN_PORT else out
        link = next(lk for lk in topo.links_of(node) if lk.port(node) == out_port)
        node = link.peer(node)
    raise AssertionError(f"loop: {path}")


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


def test_spray_bucket_i_maps_to_next_hop_i_mod_n(ls442):
    rules = compute_rules(ls442, "spray")
    uplinks = (3, 4, 5, 6)
    set_id = next_hop_set_id(uplinks)
    spray = {f.match_dict()["udp_src"][0]: f.actions for f in rules["leaf1"] if "udp_src" in f.match_dict()}
    assert spray == {i: (Output(uplinks[i % 4]),) for i in range(16)}
    f = next(f for f in rules["leaf1"] if "udp_src" in f.match_dict())
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
    for topo in (srv, ls442):
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
        req = urllib.request.Request(base + path, data=data, method="GET" if body is None else "PUT")
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
