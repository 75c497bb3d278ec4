"""Spec strings, custom fabric files (YAML/JSON), the JSON hand-off, and the one-line error table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from topologies import (
    DEFAULT_MTU,
    DEFAULT_SPEC,
    Link,
    Node,
    SpecError,
    Topology,
    clos,
    dump,
    equal_cost_paths,
    fat_tree,
    leaf_spine,
    load,
    load_json,
    parse_spec,
    validate,
)

YAML_FABRIC = """\
name: small
description: two leaves, one spine
defaults: {rate_mbps: 10, delay_ms: 0.5}
nodes:
  - {name: spine1, role: spine, dpid: 100}
  - {name: h1, role: host, ip: 10.0.0.10, mac: "12:34:56:00:00:01", labels: {rack: r1}}
switches: {leaf1: leaf, leaf2: leaf}
hosts: [h2]
links:
  - {a: h1, b: leaf1}
  - {a: h2, b: leaf2, loss_pct: 1}
  - {a: leaf1, b: spine1, rate_mbps: 40, a_port: 1}
  - {a: leaf2, b: spine1}
"""


def test_default_spec() -> None:
    topo = parse_spec(DEFAULT_SPEC)
    assert len(topo.by_role("spine")) == 4
    assert len(topo.hosts) == 8
    assert topo.params["spec"] == DEFAULT_SPEC


def test_bare_builder_uses_defaults() -> None:
    assert parse_spec("leaf-spine") == leaf_spine()
    assert len(parse_spec("in-server").hosts) == 16


def test_spec_keys_map_to_builder_arguments() -> None:
    topo = parse_spec("leaf-spine:spines=2, leaves=3,hosts=1,rate=10,fabric_rate=30,delay=2,loss=0.5,queue=64")
    p = topo.params
    assert (p["spines"], p["leaves"], p["hosts_per_leaf"]) == (2, 3, 1)
    assert (p["host_rate"], p["fabric_rate"]) == (10.0, 30.0)
    assert (p["delay_ms"], p["loss_pct"], p["queue_packets"]) == (2.0, 0.5, 64)
    # A specific rate wins over `rate` whichever comes first.
    assert parse_spec("leaf-spine:host_rate=5,rate=10").params["host_rate"] == 5.0
    topo = parse_spec("in-server:servers=3,gpus=2,gpu_rate=50,nic_rate=10,nics=2")
    assert len(topo.hosts) == 6
    assert len(topo.links_between("nv3", "tor1")) == 2
    assert parse_spec("leaf_spine:spines=1").params["spines"] == 1


def test_three_tier_specs() -> None:
    topo = parse_spec("fat-tree:k=6,rate=10,core_rate=30,mtu=9000")
    assert topo == fat_tree(k=6, host_rate=10, agg_rate=10, core_rate=30, mtu=9000)
    assert topo.mtu == 9000 and topo.params["spec"] == "fat-tree:k=6,rate=10,core_rate=30,mtu=9000"
    assert parse_spec("fat-tree") == fat_tree(k=4)
    assert parse_spec("fat_tree:k=2") == fat_tree(k=2)
    topo = parse_spec("clos:pods=3,leaves=4,spines=2,superspines=2,hosts=1,spine_rate=40,delay=1,queue=50")
    assert topo == clos(3, 4, 2, 2, 1, spine_rate=40, delay_ms=1, queue_packets=50)
    assert (topo.params["host_rate"], topo.params["spine_rate"], topo.params["superspine_rate"]) == (20, 40, 20)
    # A specific rate wins over `rate` whichever comes first.
    assert parse_spec("clos:superspine_rate=5,rate=10").params["superspine_rate"] == 5.0


def test_mtu_in_every_spec_and_file(tmp_path: Path) -> None:
    assert parse_spec("leaf-spine").mtu == 9000
    assert parse_spec("leaf-spine:mtu=1500,spines=2").mtu == 1500
    assert parse_spec("in-server:mtu=576").mtu == 576
    assert parse_spec("clos:mtu=9216").mtu == 9216
    path = tmp_path / "standard.yaml"
    path.write_text("mtu: 1500\n" + YAML_FABRIC)
    assert load(path).mtu == 1500
    assert load(tmp_path / "standard.yaml") != load(_write(tmp_path / "jumbo.yaml", YAML_FABRIC))
    assert load(tmp_path / "jumbo.yaml").mtu == 9000
    # The JSON hand-off keeps it, and a dump without the key reads back with the default.
    back = load_json(dump(parse_spec("fat-tree:k=2,mtu=4000"), tmp_path / "t.json"))
    assert back.mtu == 4000 and back == fat_tree(k=2, mtu=4000)
    data = leaf_spine().to_dict()
    del data["mtu"]
    assert load_json(_write(tmp_path / "old.json", json.dumps(data))).mtu == DEFAULT_MTU
    data["mtu"] = 100
    with pytest.raises(SpecError, match=r"old\.json: mtu=100 must be in \[576, 9216\] bytes"):
        load_json(_write(tmp_path / "old.json", json.dumps(data)))


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_yaml_fabric(tmp_path: Path) -> None:
    path = tmp_path / "small.yaml"
    path.write_text(YAML_FABRIC)
    topo = parse_spec(str(path))
    assert topo.name == "small"
    assert [n.name for n in topo.nodes] == ["spine1", "h1", "leaf1", "leaf2", "h2"]
    assert topo.node("spine1").dpid == 100
    assert topo.node("leaf1").dpid == 2  # second switch in node order
    assert topo.node("h1").ip == "10.0.0.10/16"
    assert topo.node("h1").labels == {"rack": "r1"}
    assert topo.node("h2").ip == "10.0.0.2/16"  # second host in node order
    assert topo.params["description"] == "two leaves, one spine"
    # Auto ports: host 0; leaf1 already has explicit port 1, so h1 lands on 2.
    assert topo.host_switch("h1") == ("leaf1", 2)
    assert topo.host_switch("h2") == ("leaf2", 1)
    (up2,) = topo.links_between("leaf2", "spine1")
    assert (up2.port("leaf2"), up2.port("spine1")) == (2, 2)
    (up1,) = topo.links_between("leaf1", "spine1")
    assert (up1.rate_mbps, up1.delay_ms) == (40.0, 0.5)
    assert topo.links_of("h2")[0].loss_pct == 1.0
    assert topo.links_of("h1")[0].rate_mbps == 10.0


def test_json_fabric_and_file_name_as_topology_name(tmp_path: Path) -> None:
    path = tmp_path / "mini.json"
    path.write_text(
        json.dumps(
            {"switches": {"sw": "switch"}, "hosts": ["a", "b"], "links": [{"a": "a", "b": "sw"}, {"a": "b", "b": "sw"}]}
        )
    )
    topo = load(path)
    assert topo.name == "mini"
    assert topo.host_switch("b") == ("sw", 2)
    assert topo.links_of("a")[0].rate_mbps == 20.0


def test_dump_and_load_json_round_trip(tmp_path: Path) -> None:
    topo = parse_spec("in-server:servers=2,gpus=2,nics=2")
    path = dump(topo, tmp_path / "topo.json")
    back = load_json(path)
    assert back == topo
    assert back.params == json.loads(json.dumps(topo.params))
    assert [n.labels for n in back.nodes] == [n.labels for n in topo.nodes]
    # load() accepts the dumped form too.
    assert load(path) == topo


def test_to_dict_from_dict_round_trip() -> None:
    topo = leaf_spine(delay_ms=1, queue_packets=10)
    assert validate(Topology.from_dict(topo.to_dict())) == topo
    jumbo = clos(mtu=9000)
    assert jumbo.to_dict()["mtu"] == 9000
    assert Topology.from_dict(json.loads(json.dumps(jumbo.to_dict()))) == jumbo
    assert Topology.from_dict(json.loads(json.dumps(topo.to_dict()))) == topo


def test_load_json_is_strict(tmp_path: Path) -> None:
    data = leaf_spine().to_dict()
    del data["links"][0]["a_port"]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SpecError, match="links\\[0\\] has no 'a_port'"):
        load_json(path)


def _topo(nodes: list[Node], links: list[Link]) -> Topology:
    return Topology("t", tuple(nodes), tuple(links))


H1 = Node("h1", "host", ip="10.0.0.1/16", mac="02:00:00:00:00:01")
H2 = Node("h2", "host", ip="10.0.0.2/16", mac="02:00:00:00:00:02")
S1 = Node("s1", "switch", dpid=1)
S2 = Node("s2", "switch", dpid=2)
L1 = Link("h1", 0, "s1", 1, 10.0)
L2 = Link("h2", 0, "s1", 2, 10.0)

# (spec or file body, expected one-line fragment). A file body is a dict written as JSON.
BAD_SPECS = [
    ("", "empty topology spec"),
    ("mesh:k=4", "unknown topology 'mesh'; builders: clos, fat-tree, in-server, leaf-spine"),
    ("fat-tree:k=3", "k=3 must be even (k pods of k/2 edge and k/2 aggregation switches); use e.g. k=4"),
    ("fat-tree:k=0", "k=0 must be >= 1; use e.g. k=4"),
    ("fat-tree:k=four", "k='four' is not a whole number; use e.g. k=4"),
    (
        "fat-tree:spines=2",
        "unknown key 'spines' in fat-tree spec; known keys: agg_rate, core_rate, delay, host_rate, k",
    ),
    ("fat-tree:core_rate=-1", "core_rate=-1 must be > 0 Mbit/s"),
    ("fat-tree:k=64", "65536 hosts do not fit the address plan"),
    ("clos:superspines=3", "superspines=3 must be a multiple of spines=2"),
    ("clos:spines=3,superspines=4", "superspines=4 must be a multiple of spines=3 (spine j of every pod links"),
    ("clos:spines=3,superspines=7", "super-spines); use e.g. superspines=9"),
    ("clos:k=4", "unknown key 'k' in clos spec; known keys: delay, host_rate, hosts, leaves, loss, mtu, pods"),
    ("clos:pods=0", "pods=0 must be >= 1"),
    ("clos:spine_rate=0", "spine_rate=0 must be > 0 Mbit/s"),
    ("leaf-spine:mtu=100", "mtu=100 must be in [576, 9216] bytes; use e.g. mtu=9000"),
    ("in-server:mtu=10000", "mtu=10000 must be in [576, 9216] bytes"),
    ("fat-tree:mtu=1500.5", "mtu=1500.5 is not a whole number"),
    ("clos:mtu=jumbo", "mtu='jumbo' is not a whole number; use e.g. mtu=9000"),
    ("leaf-spine:spine=2", "unknown key 'spine' in leaf-spine spec; known keys: delay, fabric_rate"),
    ("in-server:hosts=2", "unknown key 'hosts' in in-server spec; known keys: delay, gpu_rate, gpus"),
    ("leaf-spine:spines", "malformed option 'spines'"),
    ("leaf-spine:spines=", "malformed option 'spines='"),
    ("leaf-spine:=4", "malformed option '=4'"),
    ("leaf-spine:spines=0", "spines=0 must be >= 1"),
    ("leaf-spine:hosts=abc", "hosts='abc' is not a whole number; use e.g. hosts=2"),
    ("leaf-spine:leaves=2.5", "leaves=2.5 is not a whole number"),
    ("leaf-spine:rate=-5", "rate=-5 must be > 0 Mbit/s; use e.g. rate=20"),
    ("leaf-spine:rate=nan", "rate=nan is not a number"),
    ("leaf-spine:loss=100", "loss=100 must be in [0, 100) percent"),
    ("leaf-spine:loss=-1", "loss=-1 must be in [0, 100)"),
    ("leaf-spine:delay=-2", "delay=-2 must be >= 0 ms"),
    ("leaf-spine:queue=0", "queue=0 must be >= 1 packets"),
    ("leaf-spine:spines=2,spines=3", "option spines given twice"),
    ("leaf-spine:spines=100,leaves=10000,hosts=1", "node name 'spine100' is too long"),
    ("in-server:servers=300,gpus=300", "90000 hosts do not fit the address plan 10.0.0.0/16"),
    ("missing.yaml", "topology file missing.yaml does not exist"),
    ({"nodes": [], "links": [], "colour": 1}, "unknown key 'colour' in the top level; known keys: defaults"),
    (
        {"hosts": ["h1"], "switches": {"s1": "leaf"}, "links": [{"a": "h1", "b": "s1", "speed": 1}]},
        "unknown key 'speed' in links[0]; known keys: a, a_port",
    ),
    ({"defaults": {"rate": 1}}, "unknown key 'rate' in defaults; known keys: delay_ms, loss_pct"),
    ({"nodes": [{"name": "H1", "role": "host"}]}, "nodes[0].name 'H1' is not a usable name"),
    ({"nodes": [{"name": "h-1", "role": "host"}]}, "nodes[0].name 'h-1' is not a usable name"),
    ({"nodes": [{"name": "x", "role": "router"}]}, "nodes[0].role 'router' (node x) is unknown; roles: host, gpu"),
    ({"switches": {"s1": "host"}}, "switches.s1 role 'host' is not a switch role"),
    (
        {"hosts": ["h1"], "switches": {"s1": "leaf"}, "links": [{"a": "h1", "b": "s9"}]},
        "links[0].b 's9' is not a declared node",
    ),
    (
        {"hosts": ["h1"], "switches": {"s1": "leaf"}, "links": [{"a": "h1", "b": "s1", "rate_mbps": 0}]},
        "links[0].rate_mbps=0 must be > 0",
    ),
    (
        {"hosts": ["h1"], "switches": {"s1": "leaf"}, "links": [{"a": "h1", "b": "s1", "loss_pct": 100}]},
        "links[0].loss_pct=100 must be in [0, 100)",
    ),
    (
        {"hosts": ["h1", "h2"], "switches": {"s1": "leaf"}, "links": [{"a": "h1", "b": "s1"}]},
        "host h2 has no link; connect it to a switch",
    ),
    (
        {"hosts": ["h1", "h1"], "switches": {"s1": "leaf"}, "links": [{"a": "h1", "b": "s1"}]},
        "duplicate node name 'h1'",
    ),
    ({"hosts": ["h1"], "switches": {"s1": "leaf"}, "links": [{"a": "s1", "b": "s1"}]}, "joins s1 to itself"),
    (
        {
            "hosts": ["h1", "h2"],
            "switches": {"s1": "leaf"},
            "links": [{"a": "h1", "b": "s1", "b_port": 3}, {"a": "h2", "b": "s1", "b_port": 3}],
        },
        "port 3 of s1 is already used by link h1-s1",
    ),
    (
        {"hosts": ["h1"], "switches": {"s1": "leaf"}, "links": [{"a": "h1", "b": "s1", "b_port": 0}]},
        "b_port=0 on leaf s1 must be a whole number >= 1",
    ),
    (
        {
            "hosts": ["h1", "h2"],
            "switches": {"s1": "leaf", "s2": "leaf"},
            "links": [{"a": "h1", "b": "s1"}, {"a": "h2", "b": "s2"}],
        },
        "node s2 cannot be reached from s1",
    ),
    (
        {
            "nodes": [{"name": "h1", "role": "host", "ip": "10.0.0.2"}],
            "hosts": ["h2"],
            "switches": {"s1": "leaf"},
            "links": [{"a": "h1", "b": "s1"}, {"a": "h2", "b": "s1"}],
        },
        "duplicate ip 10.0.0.2 on h1 and h2",
    ),
    (
        {
            "nodes": [{"name": "h1", "role": "host", "mac": "02:00:00:00:00:02"}],
            "hosts": ["h2"],
            "switches": {"s1": "leaf"},
            "links": [{"a": "h1", "b": "s1"}, {"a": "h2", "b": "s1"}],
        },
        "duplicate mac 02:00:00:00:00:02 on h1 and h2",
    ),
    (
        {
            "nodes": [{"name": "s1", "role": "leaf", "dpid": 2}, {"name": "s2", "role": "leaf"}],
            "hosts": ["h1"],
            "links": [{"a": "h1", "b": "s1"}, {"a": "s1", "b": "s2"}],
        },
        "duplicate dpid 2 on s1 and s2",
    ),
    (
        {
            "nodes": [{"name": "h1", "role": "host", "ip": "10.1.0.1/16"}],
            "hosts": ["h2"],
            "switches": {"s1": "leaf"},
            "links": [{"a": "h1", "b": "s1"}, {"a": "h2", "b": "s1"}],
        },
        "is not in subnet 10.1.0.0/16 of h1; put all hosts in one subnet",
    ),
    (
        {
            "nodes": [{"name": "h1", "role": "host", "ip": "10.0.0.300"}],
            "switches": {"s1": "leaf"},
            "links": [{"a": "h1", "b": "s1"}],
        },
        "ip='10.0.0.300/16' is not an IPv4 address",
    ),
    (
        {
            "nodes": [{"name": "h1", "role": "host", "mac": "zz"}],
            "switches": {"s1": "leaf"},
            "links": [{"a": "h1", "b": "s1"}],
        },
        "mac='zz' is not a MAC address",
    ),
    (
        {
            "hosts": ["averyveryverylonghost"],
            "switches": {"s1": "leaf"},
            "links": [{"a": "averyveryverylonghost", "b": "s1"}],
        },
        "node name 'averyveryverylonghost' is too long: interface 'averyveryverylonghost-eth0' has 26 characters, "
        "Linux allows 15; with port 0 node names can have at most 10 characters",
    ),
    ({"hosts": [], "switches": {"s1": "leaf"}}, "topology has no hosts"),
    ({"hosts": ["h1", "h2"], "links": [{"a": "h1", "b": "h2"}]}, "joins two hosts"),
    ([1, 2], "the top level must be a mapping"),
    (
        {"mtu": 20000, "hosts": ["h1"], "switches": {"s1": "leaf"}, "links": [{"a": "h1", "b": "s1"}]},
        "mtu=20000 must be in [576, 9216] bytes; use e.g. mtu: 9000",
    ),
    (
        {"mtu": "9000", "hosts": ["h1"], "switches": {"s1": "leaf"}, "links": [{"a": "h1", "b": "s1"}]},
        "mtu='9000' is not a whole number",
    ),
    ({"switches": {"s1": "router"}}, "switches.s1 role 'router' is not a switch role; roles: spine, leaf, tor"),
]


@pytest.mark.parametrize(("spec", "fragment"), BAD_SPECS, ids=[str(i) for i in range(len(BAD_SPECS))])
def test_bad_specs_give_one_line_errors(
    spec: str | dict | list, fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    if not isinstance(spec, str):
        path = tmp_path / "fabric.json"
        path.write_text(json.dumps(spec))
        spec = str(path)
    with pytest.raises(SpecError) as err:
        parse_spec(spec)
    message = str(err.value)
    assert "\n" not in message
    assert fragment in message, message
    if spec.endswith(".json"):
        assert message.startswith(f"{spec}: "), "file errors name the file"


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("nodes: [\n  {name: h1", "cannot parse topology file"),
        ("nodes:\n  - {name: h1, role: host, mac: 12:34:56:00:00:01}\n", "was read as a number; quote it"),
    ],
)
def test_bad_yaml(tmp_path: Path, body: str, fragment: str) -> None:
    path = tmp_path / "bad.yml"
    path.write_text(body)
    with pytest.raises(SpecError) as err:
        load(path)
    assert "\n" not in str(err.value)
    assert fragment in str(err.value)
    assert str(path) in str(err.value)


def test_bad_json_and_suffix(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{nope")
    with pytest.raises(SpecError, match=r"cannot parse topology file .*bad\.json: .* at line 1 column 2"):
        parse_spec(str(path))
    other = tmp_path / "fabric.txt"
    other.write_text("x")
    with pytest.raises(SpecError, match=r"must end in \.yaml, \.yml or \.json"):
        parse_spec(str(other))


@pytest.mark.parametrize(
    ("topo", "fragment"),
    [
        (_topo([H1, S1, H2], [L1, L2]), None),
        (_topo([H1, Node("s1", "switch", dpid=0), H2], [L1, L2]), "node s1 dpid=0 must be a whole number"),
        (_topo([H1, Node("s1", "switch"), H2], [L1, L2]), "node s1 dpid=None"),
        (_topo([Node("h1", "host"), S1, H2], [L1, L2]), "node h1 ip=None"),
        (_topo([H1, Node("s1", "switch", dpid=1, ip="10.0.0.9/16"), H2], [L1, L2]), "cannot have ip or mac"),
        (_topo([H1, S1, H2, S2], [L1, L2]), "node s2 cannot be reached"),
        (_topo([H1, S1, H2], [L1, L2, Link("s1", 3, "h2", 1, 10.0)]), None),  # multi-homed host
        (_topo([H1, S1, H2], [L1, Link("h2", 0, "s1", 2, "fast")]), "rate_mbps='fast' is not a number"),
        (_topo([H1, S1, H2], [L1, Link("h2", 0, "s1", 2, 10.0, queue_packets=2.5)]), "queue_packets=2.5"),
        (_topo([H1, S1], [L1, Link("h1", 1, "s2", 1, 10.0)]), "ends at unknown node 's2'"),
        (_topo([H1, S1, H2], []), "host h1 has no link"),
        (Topology("t", (H1, S1, H2), (L1, L2), mtu=9000), None),
        (Topology("t", (H1, S1, H2), (L1, L2), mtu=100), "mtu=100 must be in [576, 9216] bytes"),
        (Topology("t", (H1, S1, H2), (L1, L2), mtu=True), "mtu=True is not a whole number"),
    ],
)
def test_validate_topology_objects(topo: Topology, fragment: str | None) -> None:
    if fragment is None:
        assert validate(topo) is topo
        return
    with pytest.raises(SpecError) as err:
        validate(topo)
    assert "\n" not in str(err.value)
    assert fragment in str(err.value)


def test_spec_error_is_value_error_and_one_line() -> None:
    assert issubclass(SpecError, ValueError)
    assert str(SpecError("a\nb")) == "a b"


def test_documented_example_loads(tmp_path: Path) -> None:
    doc = (Path(__file__).parents[2] / "docs" / "topologies.md").read_text()
    body = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "two-tier.yaml"
    path.write_text(body)
    topo = load(path)
    assert topo.name == "two-tier"
    assert len(equal_cost_paths(topo, "h1", "h3")) == 1
