"""Topology specs from the command line, custom fabric files, and the JSON hand-off to the controller.

A spec is either a builder with options, `leaf-spine:spines=4,leaves=4,hosts=2,rate=20` (a bare
`leaf-spine` uses the defaults), or the path of a `.yaml`/`.yml`/`.json` fabric file.

Spec keys (rates in Mbit/s, delay in ms, loss in percent, queue in packets; they apply to all links;
`rate` sets every rate of the builder, a specific rate key wins):
  leaf-spine: spines, leaves, hosts (per leaf), rate, host_rate, fabric_rate
  in-server:  servers, gpus (per server), gpu_rate, nic_rate, nics (per server)
  fat-tree:   k (even), rate, host_rate, agg_rate (edge-agg links), core_rate (agg-core links)
  clos:       pods, leaves (per pod), spines (per pod), superspines (a multiple of spines), hosts (per
              leaf), rate, host_rate, spine_rate (leaf-spine links), superspine_rate (spine-super-spine)
  every one:  delay, loss, queue, mtu (IP MTU of every interface, bytes, default 9000)

Fabric file format (YAML or JSON)::

    name: two-tier                # optional, defaults to the file name without its suffix
    description: a small fabric   # optional, kept in params
    mtu: 9000                     # optional, IP MTU of every interface, default 9000, in [576, 9216]
    servers: ns:2                 # optional, where it runs, as --servers takes it (ns:N, or a list of
                                  # hosts); --servers on the command line wins
    defaults:                     # optional; apply to links that do not say otherwise
      rate_mbps: 20               # default 20
      delay_ms: 0                 # default 0
      loss_pct: 0                 # default 0, must be in [0, 100)
      queue_packets: 100          # default none (the emulator's default queue)
    nodes:                        # full form: name, role, and optional ip, mac, dpid, labels
      - {name: spine1, role: spine, dpid: 100}
      - {name: h1, role: host, ip: 10.0.0.10/16, labels: {rack: r1}}
    switches: {leaf1: leaf, leaf2: leaf}   # shorthand: name -> role
    hosts: [h2, h3]                        # shorthand: role host
    links:                        # a and b required; everything else optional
      - {a: h1, b: leaf1}
      - {a: h2, b: leaf2}
      - {a: h3, b: leaf2, loss_pct: 1}
      - {a: leaf1, b: spine1, rate_mbps: 40, a_port: 10, b_port: 1}
      - {a: leaf2, b: spine1}

Node order (which decides planned addresses) is `nodes`, then `switches`, then `hosts`. Roles: hosts
are `host` or `gpu`; switches are `leaf`, `tor`, `edge`, `spine`, `agg`, `superspine`, `core`, `local`
(in-server, NVSwitch-like) or `switch`; the role gives the tier (topologies.model.ROLE_TIER). Missing
ip/mac/dpid come from the address plan (see topologies.builders); an ip without a prefix length gets
/16. Missing ports are the next free port on that node: hosts count from 0, switches from 1, skipping
ports that any link gives explicitly. Quote MAC addresses in YAML.

A file is at most MAX_FILE_BYTES; YAML aliases are refused (they let a few hundred bytes stand for
billions of elements); `description` is text and `params` plain JSON values, as they go into every
results file. Every fabric, built or loaded, has at most MAX_NODES nodes and MAX_LINKS links
(topologies.validate; the FABRICLAB_MAX_NODES and FABRICLAB_MAX_LINKS settings raise them).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from topologies.builders import BUILDERS, PREFIX_LEN, assign_addresses
from topologies.model import DEFAULT_MTU, HOST_ROLES, SWITCH_ROLES, Link, Node, Topology
from topologies.validate import (
    ALL_ROLES,
    SpecError,
    check_count,
    check_delay,
    check_loss,
    check_mtu,
    check_name,
    check_queue,
    check_rate,
    check_size,
    check_unknown_keys,
    short_repr,
    validate,
)

log = logging.getLogger(__name__)

DEFAULT_SPEC = "leaf-spine:spines=4,leaves=4,hosts=2,rate=20"
FILE_SUFFIXES = (".yaml", ".yml", ".json")
# A fabric of MAX_NODES nodes and MAX_LINKS links in full form is well under 1 MiB.
MAX_FILE_BYTES = 4 << 20
# JSON values (scalars and containers) allowed in `params` and `description` together.
MAX_PARAM_VALUES = 10_000
DEFAULT_RATE_MBPS = 20.0

Check = Callable[[Any, str, str], Any]

# Keys every builder takes: impairments on every link and the fabric's MTU.
_COMMON_KEYS: dict[str, tuple[tuple[str, ...], Check, str]] = {
    "delay": (("delay_ms",), check_delay, "0.5"),
    "loss": (("loss_pct",), check_loss, "1"),
    "queue": (("queue_packets",), check_queue, "100"),
    "mtu": (("mtu",), check_mtu, "9000"),
}

# Spec key -> (builder argument(s), check, example value).
_SPEC_KEYS: dict[str, dict[str, tuple[tuple[str, ...], Check, str]]] = {
    "leaf-spine": {
        "spines": (("spines",), check_count, "4"),
        "leaves": (("leaves",), check_count, "4"),
        "hosts": (("hosts_per_leaf",), check_count, "2"),
        "rate": (("host_rate", "fabric_rate"), check_rate, "20"),
        "host_rate": (("host_rate",), check_rate, "20"),
        "fabric_rate": (("fabric_rate",), check_rate, "40"),
        **_COMMON_KEYS,
    },
    "in-server": {
        "servers": (("servers",), check_count, "2"),
        "gpus": (("gpus_per_server",), check_count, "8"),
        "gpu_rate": (("gpu_rate",), check_rate, "100"),
        "nic_rate": (("nic_rate",), check_rate, "20"),
        "nics": (("nics_per_server",), check_count, "1"),
        **_COMMON_KEYS,
    },
    "fat-tree": {
        "k": (("k",), check_count, "4"),
        "rate": (("host_rate", "agg_rate", "core_rate"), check_rate, "20"),
        "host_rate": (("host_rate",), check_rate, "20"),
        "agg_rate": (("agg_rate",), check_rate, "20"),
        "core_rate": (("core_rate",), check_rate, "20"),
        **_COMMON_KEYS,
    },
    "clos": {
        "pods": (("pods",), check_count, "2"),
        "leaves": (("leaves",), check_count, "2"),
        "spines": (("spines",), check_count, "2"),
        "superspines": (("superspines",), check_count, "4"),
        "hosts": (("hosts_per_leaf",), check_count, "2"),
        "rate": (("host_rate", "spine_rate", "superspine_rate"), check_rate, "20"),
        "host_rate": (("host_rate",), check_rate, "20"),
        "spine_rate": (("spine_rate",), check_rate, "20"),
        "superspine_rate": (("superspine_rate",), check_rate, "20"),
        **_COMMON_KEYS,
    },
}

_FILE_KEYS = ("name", "description", "params", "mtu", "servers", "defaults", "nodes", "switches", "hosts",
              "links")
_DEFAULT_KEYS = ("rate_mbps", "delay_ms", "loss_pct", "queue_packets")
_NODE_KEYS = tuple(f.name for f in dataclasses.fields(Node))
_LINK_KEYS = tuple(f.name for f in dataclasses.fields(Link))


def _number(text: str) -> int | float | str:
    """Parse a spec value; leave it as text when it is not a number so the check can say so."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_spec(text: str) -> Topology:
    """Build the topology a command-line spec describes (builder with options, or a fabric file)."""
    spec = text.strip()
    if not spec:
        raise SpecError(f"empty topology spec; use e.g. {DEFAULT_SPEC}")
    # A bare word is a builder name even if a file of that name happens to exist in the cwd.
    if spec.lower().endswith(FILE_SUFFIXES) or ("/" in spec and _is_file(spec)):
        return load(spec)
    name, _, options = spec.partition(":")
    builder = name.strip().lower().replace("_", "-")
    if builder not in BUILDERS:
        raise SpecError(
            f"unknown topology {name!r}; builders: {', '.join(sorted(BUILDERS))} "
            f"(or the path of a .yaml/.yml/.json fabric file), e.g. {DEFAULT_SPEC}"
        )
    keys = _SPEC_KEYS[builder]
    kwargs: dict[str, Any] = {}
    given: set[str] = set()
    for item in options.split(","):
        item = item.strip()
        if not item:
            continue
        key, eq, value = (part.strip() for part in item.partition("="))
        if not eq or not key or not value:
            raise SpecError(f"malformed option {item!r} in spec {spec!r}; write key=value, e.g. spines=4")
        check_unknown_keys([key], keys, f"{builder} spec")
        if key in given:
            raise SpecError(f"option {key} given twice in spec {spec!r}; give it once")
        given.add(key)
        args, check, example = keys[key]
        checked = check(_number(value), key, f"{key}={example}")
        for arg in args:
            # A specific key (host_rate) wins over a general one (rate) whatever the order.
            if arg not in kwargs or len(args) == 1:
                kwargs[arg] = checked
    topo = BUILDERS[builder](**kwargs)
    log.debug("spec %r -> %s", spec, topo.name)
    return dataclasses.replace(topo, params={**topo.params, "spec": spec})


def _is_file(spec: str) -> bool:
    try:
        return Path(spec).is_file()
    except (OSError, ValueError):  # a name too long, a NUL byte: not a file, so not a file spec either
        return False


# -- files -----------------------------------------------------------------------------------------


class _NoAliasLoader(yaml.SafeLoader):
    """Safe YAML without aliases: `*name` lets a few hundred bytes stand for billions of elements."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"aliases (*{event.anchor}) are not allowed; write the value out",
                event.start_mark)
        return super().compose_node(parent, index)


def _read(path: Path) -> Any:
    try:
        if not path.exists():
            raise SpecError(f"topology file {path} does not exist; check the path")
        if not path.is_file():
            raise SpecError(f"topology file {path} is not a file; give a .yaml/.yml/.json file")
        size = path.stat().st_size
    except OSError as exc:
        raise SpecError(f"cannot open topology file {_short_path(path)}: {exc.strerror or exc}") from None
    suffix = path.suffix.lower()
    if suffix not in FILE_SUFFIXES:
        raise SpecError(f"topology file {path} must end in .yaml, .yml or .json")
    if size > MAX_FILE_BYTES:
        raise SpecError(f"topology file {path} is {size} bytes, more than the {MAX_FILE_BYTES >> 20} MiB a "
                        "fabric file may have; give a fabric file")
    try:
        with path.open("rb") as f:
            text = f.read(MAX_FILE_BYTES + 1).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read topology file {path}: {exc}") from None
    if len(text) > MAX_FILE_BYTES:  # it grew while we looked, or it is a device that never ends
        raise SpecError(f"topology file {path} is more than {MAX_FILE_BYTES >> 20} MiB; give a fabric file")
    try:
        if suffix == ".json":
            return json.loads(text)
        return yaml.load(text, Loader=_NoAliasLoader)  # a SafeLoader: no Python objects
    except json.JSONDecodeError as exc:
        raise SpecError(
            f"cannot parse topology file {path}: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise SpecError(f"cannot parse topology file {path}: nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(f"cannot parse topology file {path}: {problem}{where}") from None


def _short_path(path: Path, limit: int = 80) -> str:
    text = str(path)
    return text if len(text) <= limit else text[: limit // 2] + "…" + text[-limit // 2:]


def _json_value(value: Any, field: str, budget: list[int]) -> None:
    """Refuse what is not plain JSON (dates, binary, sets...) or is too big: it goes into results.json."""
    budget[0] -= 1
    if budget[0] < 0:
        raise SpecError(f"{field}: params and description hold more than {MAX_PARAM_VALUES} values; keep them short")
    if value is None or isinstance(value, str | bool | int):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
            raise SpecError(f"{field} is a whole number too large for JSON readers; write it as a string")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SpecError(f"{field}={value!r} is not a finite number; write it as a string")
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            _json_value(item, f"{field}[{i}]", budget)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise SpecError(f"{field} has a key {key!r} ({type(key).__name__}); keys must be strings, quote it")
            _json_value(item, f"{field}.{key}", budget)
        return
    raise SpecError(f"{field} is a {type(value).__name__}, not a JSON value (text, number, true/false, list or "
                    "mapping); quote it as a string")


def _mapping(value: Any, field: str, example: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SpecError(f"{field} must be a mapping, e.g. {example}")
    return value


def _list(value: Any, field: str, example: str) -> list[Any]:
    if not isinstance(value, list):
        raise SpecError(f"{field} must be a list, e.g. {example}")
    return value


def _node_from(entry: Any, field: str) -> Node:
    entry = _mapping(entry, field, "{name: leaf1, role: leaf}")
    check_unknown_keys(entry, _NODE_KEYS, field)
    name = check_name(entry.get("name"), f"{field}.name")
    role = entry.get("role")
    if role not in ALL_ROLES:
        raise SpecError(f"{field}.role {role!r} (node {name}) is unknown; roles: {', '.join(ALL_ROLES)}")
    ip, mac = entry.get("ip"), entry.get("mac")
    if isinstance(ip, str) and "/" not in ip:
        ip = f"{ip}/{PREFIX_LEN}"
    if isinstance(mac, int):
        # YAML 1.1 reads some unquoted MACs (e.g. 12:34:56:00:00:01) as base-60 integers.
        raise SpecError(f'{field}.mac (node {name}) was read as a number; quote it, e.g. mac: "{mac}"')
    labels = entry.get("labels") or {}
    return Node(name, role, ip=ip, mac=mac, dpid=entry.get("dpid"), labels=labels)


def _nodes_from(data: dict[str, Any]) -> list[Node]:
    entries = _list(data.get("nodes", []), "nodes", "[{name: leaf1, role: leaf}]")
    nodes = [_node_from(entry, f"nodes[{i}]") for i, entry in enumerate(entries)]
    switches = _mapping(data.get("switches", {}), "switches", "{leaf1: leaf, spine1: spine}")
    for name, role in switches.items():
        check_name(name, "switches name")
        if role not in SWITCH_ROLES:
            raise SpecError(f"switches.{name} role {role!r} is not a switch role; roles: {', '.join(SWITCH_ROLES)}")
        nodes.append(Node(name, role))
    for i, name in enumerate(_list(data.get("hosts", []), "hosts", "[h1, h2]")):
        nodes.append(Node(check_name(name, f"hosts[{i}]"), HOST_ROLES[0]))
    return nodes


def _links_from(data: dict[str, Any], nodes: list[Node]) -> list[Link]:
    defaults = _mapping(data.get("defaults", {}) or {}, "defaults", "{rate_mbps: 20}")
    check_unknown_keys(defaults, _DEFAULT_KEYS, "defaults")
    base = {
        "rate_mbps": check_rate(defaults.get("rate_mbps", DEFAULT_RATE_MBPS), "defaults.rate_mbps", "rate_mbps: 20"),
        "delay_ms": check_delay(defaults.get("delay_ms", 0.0), "defaults.delay_ms", "delay_ms: 0.5"),
        "loss_pct": check_loss(defaults.get("loss_pct", 0.0), "defaults.loss_pct", "loss_pct: 1"),
        "queue_packets": check_queue(defaults.get("queue_packets"), "defaults.queue_packets", "queue_packets: 100"),
    }
    by_name = {n.name: n for n in nodes}
    entries = _list(data.get("links", []), "links", "[{a: h1, b: leaf1}]")
    rows = []
    for i, entry in enumerate(entries):
        field = f"links[{i}]"
        entry = _mapping(entry, field, "{a: h1, b: leaf1}")
        check_unknown_keys(entry, _LINK_KEYS, field)
        for end in ("a", "b"):
            if end not in entry:
                raise SpecError(f"{field} has no {end!r}; a link needs both ends, e.g. {{a: h1, b: leaf1}}")
            if not isinstance(entry[end], str) or entry[end] not in by_name:
                raise SpecError(
                    f"{field}.{end} {short_repr(entry[end])} is not a declared node; declare it in nodes, "
                    "switches or hosts"
                )
        for port in ("a_port", "b_port"):
            if port in entry and (isinstance(entry[port], bool) or not isinstance(entry[port], int)):
                raise SpecError(f"{field}.{port}={short_repr(entry[port])} is not a whole number; use e.g. {port}: 1")
        row = {**base, **entry}
        row["rate_mbps"] = check_rate(row["rate_mbps"], f"{field}.rate_mbps", "rate_mbps: 20")
        row["delay_ms"] = check_delay(row["delay_ms"], f"{field}.delay_ms", "delay_ms: 0.5")
        row["loss_pct"] = check_loss(row["loss_pct"], f"{field}.loss_pct", "loss_pct: 1")
        row["queue_packets"] = check_queue(row["queue_packets"], f"{field}.queue_packets", "queue_packets: 100")
        rows.append(row)
    # Explicit ports are reserved first so automatic ones never collide with them.
    used: dict[str, set[Any]] = {n.name: set() for n in nodes}
    for row in rows:
        for end in ("a", "b"):
            if f"{end}_port" in row:
                used[row[end]].add(row[f"{end}_port"])
    cursor = {n.name: 0 if n.is_host else 1 for n in nodes}
    for row in rows:
        for end in ("a", "b"):
            if f"{end}_port" not in row:
                node = row[end]
                while cursor[node] in used[node]:
                    cursor[node] += 1
                row[f"{end}_port"] = cursor[node]
                used[node].add(cursor[node])
    return [Link(**row) for row in rows]


def load(path: str | Path) -> Topology:
    """Load and validate a custom fabric from a YAML or JSON file (format in the module docstring)."""
    path = Path(path)
    data = _read(path)
    try:
        data = _mapping(data, "the top level", "name: ..., nodes: [...], links: [...]")
        check_unknown_keys(data, _FILE_KEYS, "the top level")
        name = data.get("name", path.stem)
        if not isinstance(name, str):
            raise SpecError(f"name {name!r} must be a string, e.g. name: two-tier")
        params = _mapping(data.get("params", {}) or {}, "params", "{site: lab1}")
        budget = [MAX_PARAM_VALUES]
        _json_value(params, "params", budget)
        params = {**params, "file": str(path)}
        if "description" in data:
            if not isinstance(data["description"], str):
                raise SpecError(f"description is a {type(data['description']).__name__}; write it as text, "
                                "e.g. description: a small fabric")
            params["description"] = data["description"]
        if "servers" in data:
            # Not "servers": the in-server builder's own parameter counts GPU servers by that name.
            params["run_on_servers"] = _servers(data["servers"])
        counts = [len(data[k]) for k in ("nodes", "switches", "hosts") if isinstance(data.get(k), list | dict)]
        links_given = data.get("links")
        check_size(sum(counts), len(links_given) if isinstance(links_given, list) else 0, "the file")
        mtu = check_mtu(data.get("mtu", DEFAULT_MTU), "mtu", "mtu: 9000")
        nodes = _nodes_from(data)
        links = _links_from(data, nodes)
        topo = validate(Topology(name, assign_addresses(nodes), tuple(links), params, mtu))
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from None
    log.debug("loaded %s from %s: %d nodes, %d links", topo.name, path, len(topo.nodes), len(topo.links))
    return topo


def _servers(value: Any) -> str:
    """A fabric file's `servers:` (where the fabric runs, as --servers takes it): 'ns:2', 'a,b' or a list."""
    if isinstance(value, list) and value and all(isinstance(v, str) and v.strip() for v in value):
        return ",".join(v.strip() for v in value)
    if isinstance(value, str) and value.strip():
        return value.strip()
    raise SpecError(f"servers: {value!r}; give ns:N (servers made of namespaces) or a list of hosts, "
                    "e.g. servers: [localhost, gpu-node2]")


def dump(topo: Topology, path: str | Path) -> Path:
    """Validate `topo` and write it as JSON (Topology.to_dict), the form the controller reads."""
    path = Path(path)
    validate(topo)
    path.write_text(json.dumps(topo.to_dict(), indent=2) + "\n", encoding="utf-8")
    return path


def load_json(path: str | Path) -> Topology:
    """Read a file written by `dump()` back, exactly as written (no defaults, no auto ports), validated."""
    path = Path(path)
    data = _read(path)
    try:
        data = _mapping(data, "the top level", '{"name": ..., "nodes": [...], "links": [...]}')
        check_unknown_keys(data, ("name", "params", "mtu", "nodes", "links"), "the top level")
        for key in ("name", "nodes", "links"):
            if key not in data:
                raise SpecError(f"missing key {key!r} at the top level; write the file with topologies.dump()")
        for kind, fields, required in (
            ("nodes", _NODE_KEYS, ("name", "role")),
            ("links", _LINK_KEYS, ("a", "a_port", "b", "b_port", "rate_mbps")),
        ):
            for i, entry in enumerate(_list(data[kind], kind, "[...]")):
                _mapping(entry, f"{kind}[{i}]", "{...}")
                check_unknown_keys(entry, fields, f"{kind}[{i}]")
                for key in required:
                    if key not in entry:
                        raise SpecError(f"{kind}[{i}] has no {key!r}; every entry needs {', '.join(required)}")
        _mapping(data.get("params", {}), "params", "{}")
        topo = validate(Topology.from_dict(data))
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from None
    return topo
