"""Traffic matrices in htsim's connection-matrix format (`.cm`): a workload for `fabriclab run --traffic`.

The format is the one htsim's `ConnectionMatrix::load` reads (sim/datacenter/connection_matrix.cpp in
Broadcom/csg-htsim and ultraethernet/uet-htsim), so one file drives both the simulator and the emulator:

    # permutation, 6 hosts
    Nodes 6
    Connections 2
    0->3 id 1 start 0 size 2000000
    1->4 start 0 size 500000

Host i is the i-th host of the topology in topology order (h1 is 0). `size` is in bytes; `start` is in
picoseconds after the traffic starts, as htsim's parser and its matrix generators use it (0 = at once).
`id` (a flow id, not 0) is kept; `prio` is accepted and ignored (the emulated fabric has no priority
queues). htsim's triggers (`Triggers`, `trigger` lines and the `trigger`, `send_done_trigger`,
`recv_done_trigger` keys), failures, and uet-htsim's `msg` / csg-htsim's `addon` are refused, as are
unknown keys: htsim stops on an unknown token too, and a misspelt key must not silently drop a size.

Every problem is one line naming the file, the line and the fix (TrafficError).
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from experiments.analysis.framing import srd_framing, wire_bytes
from experiments.arms import get as arm_kind
from experiments.model import Experiment, SizedFlow, Workload
from topologies import Topology
from transport.core.headers import datagram_size_for_mtu

log = logging.getLogger(__name__)

PS_PER_S = 1e12
# Bounds on what a matrix may ask for. A number of more digits than MAX_DIGITS is no count, size or
# time anyone means (and Python refuses to read integers of over 4,300 digits at all); MAX_SIZE is
# far beyond what an emulated link carries in an hour; MAX_FILE_BYTES holds a permutation of 65,534
# hosts several times over, and keeps `--traffic /dev/zero` from reading until memory runs out.
MAX_DIGITS = 24
MAX_SIZE = 1 << 40  # bytes per flow (1 TiB)
MAX_DURATION_S = 3600.0  # per arm: the latest start, or the makespan at the fabric's rates
MAX_FILE_BYTES = 16 << 20
_INT = re.compile(r"\d+")
_FLOAT = re.compile(r"(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_CONN = re.compile(r"(\d+)->(\d+)")
UNSUPPORTED = {
    "trigger": "triggers (a flow started by another's completion) are not supported; give it a start time",
    "send_done_trigger": "triggers are not supported; remove the key",
    "recv_done_trigger": "triggers are not supported; remove the key",
    "msg": "messages on an existing connection (uet-htsim's 'msg') are not supported; make it its own flow",
    "addon": "'addon' trigger signals are not supported; remove the key",
}


class TrafficError(ValueError):
    """A traffic matrix that cannot be used; the message is one line with the file, line and fix."""


@dataclass(frozen=True)
class Connection:
    """One `src->dst` line: host indices, bytes, start in picoseconds, htsim's flow id (0 = none)."""

    src: int
    dst: int
    size: int
    start_ps: float = 0.0
    flow_id: int = 0
    line: int = field(default=0, compare=False)  # where it was read (for errors); 0 = not from a file

    @property
    def start_s(self) -> float:
        return self.start_ps / PS_PER_S


@dataclass(frozen=True)
class TrafficMatrix:
    nodes: int
    connections: tuple[Connection, ...]
    source: str = "<matrix>"


def parse(text: str, source: str = "<matrix>", hosts: int | None = None) -> TrafficMatrix:
    """Parse a connection matrix; `hosts` (the topology's host count) must then equal its `Nodes`."""
    header: dict[str, tuple[int, int]] = {}  # keyword -> (value, line)
    conns: list[tuple[Connection, int]] = []
    ids: dict[int, int] = {}

    def fail(line: int, problem: str) -> TrafficError:
        return _error(source, line, problem)

    for n, raw in enumerate(text.splitlines(), start=1):
        tokens = raw.split()
        if not tokens or tokens[0].startswith("#"):
            continue
        key = tokens[0]
        if key in ("Nodes", "Connections", "Triggers", "Failures"):
            if conns:
                raise fail(n, f"'{key}' after the first connection; put the header lines first")
            if key in header:
                raise fail(n, f"a second '{key}' line (the first is line {header[key][1]}); keep one")
            if len(tokens) != 2 or not _INT.fullmatch(tokens[1]):
                raise fail(n, f"'{key}' needs one whole number, as in '{key} 6'")
            _check_digits(tokens[1], key, source, n)
            value = int(tokens[1])
            if key in ("Triggers", "Failures") and value:
                what = "triggers" if key == "Triggers" else "link failures (use an experiment's faults)"
                raise fail(n, f"{what} are not supported; remove the '{key}' line and its entries")
            if key == "Nodes" and hosts is not None and value != hosts:
                raise fail(n, f"Nodes {value}, but the topology has {hosts} hosts; write the matrix for {hosts} "
                           f"hosts or choose a --topo with {value}")
            header[key] = (value, n)
        elif key in ("trigger", "failure"):
            raise fail(n, f"'{key}' lines are not supported; remove them")
        elif "->" in key:
            if "Nodes" not in header or "Connections" not in header:
                raise fail(n, "a connection before the 'Nodes N' and 'Connections C' lines; start the file "
                           "with them")
            conn = _connection(tokens, header["Nodes"][0], source, n)
            if conn.flow_id:
                if conn.flow_id in ids:
                    raise fail(n, f"flow id {conn.flow_id} is used again (first on line {ids[conn.flow_id]}); "
                               "give every flow its own id")
                ids[conn.flow_id] = n
            conns.append((conn, n))
        else:
            raise fail(n, f"unknown line starting '{_short(key)}'; expected 'Nodes N', 'Connections C' or "
                       "'SRC->DST start T size BYTES'")
    for key, example in (("Nodes", "Nodes 6"), ("Connections", "Connections 6")):
        if key not in header:
            raise fail(1, f"no '{key}' line; start the file with '{example}'")
    nodes = header["Nodes"][0]
    count, count_line = header["Connections"]
    if count != len(conns):
        raise fail(count_line, f"Connections {count}, but the file lists {len(conns)} connection line(s); "
                   f"set it to {len(conns)}")
    if not conns:
        raise fail(count_line, "no connections; list at least one 'SRC->DST start 0 size BYTES' line")
    return TrafficMatrix(nodes, tuple(c for c, _ in conns), source)


def _error(source: str, line: int, problem: str) -> TrafficError:
    return TrafficError(f"{source}:{line}: {problem}")


def _connection(tokens: list[str], nodes: int, source: str, n: int) -> Connection:
    """One 'SRC->DST key value ...' line (line `n`) of a matrix of `nodes` hosts."""

    def fail(line: int, problem: str) -> TrafficError:
        return _error(source, line, problem)

    m = _CONN.fullmatch(tokens[0])
    if not m:
        raise fail(n, f"'{_short(tokens[0])}' is not 'SRC->DST' with host indices, as in '0->3'")
    _check_digits(max(m.group(1), m.group(2), key=len), "a host index", source, n)
    src, dst = int(m.group(1)), int(m.group(2))
    for what, i in (("source", src), ("destination", dst)):
        if i >= nodes:
            raise fail(n, f"{what} host {i} is out of range: Nodes is {nodes}; use 0-{max(0, nodes - 1)} "
                       "(the topology's hosts in order, h1 = 0)")
    if src == dst:
        raise fail(n, f"host {src} sends to itself; give the flow another destination")
    values: dict[str, str] = {}
    rest = tokens[1:]
    for i in range(0, len(rest), 2):
        key = rest[i]
        if key in UNSUPPORTED:
            raise fail(n, f"'{key}': {UNSUPPORTED[key]}")
        if key not in ("start", "size", "id", "prio"):
            raise fail(n, f"unknown key '{_short(key)}'; a connection takes 'start T' (picoseconds), "
                       "'size BYTES', 'id N' and 'prio P'")
        if i + 1 >= len(rest):
            raise fail(n, f"'{key}' has no value; write it as '{key} VALUE'")
        if key in values:
            raise fail(n, f"'{key}' is given twice; keep one")
        values[key] = rest[i + 1]
    if "start" not in values:
        raise fail(n, "no start time; add 'start 0' (picoseconds after the traffic starts)")
    if "size" not in values:
        raise fail(n, "no size; add 'size BYTES' (flows that run for the whole simulation, htsim's "
                   "'size 0', are not supported)")
    for key in ("start", "size", "id"):
        if key in values:
            _check_digits(values[key], f"'{key}'", source, n)
    start_txt = values["start"]
    if not _FLOAT.fullmatch(start_txt) or not math.isfinite(float(start_txt)):
        raise fail(n, f"start '{_short(start_txt)}' is not a number of picoseconds >= 0; use e.g. 'start 0'")
    if float(start_txt) / PS_PER_S > MAX_DURATION_S:
        raise fail(n, f"start {_short(start_txt)} ps is {float(start_txt) / PS_PER_S:.3g} s after the traffic "
                   f"starts, more than the {MAX_DURATION_S:g} s an arm may run; starts are in picoseconds "
                   "(1 s = 1000000000000)")
    size_txt = values["size"]
    if not _INT.fullmatch(size_txt) or int(size_txt) <= 0:
        raise fail(n, f"size '{_short(size_txt)}' is not a whole number of bytes > 0; use e.g. 'size 2000000'")
    if int(size_txt) > MAX_SIZE:
        raise fail(n, f"size {_short(size_txt)} bytes is more than the {MAX_SIZE >> 40} TiB a flow may have; "
                   "use e.g. 'size 2000000'")
    flow_id = 0
    if "id" in values:
        if not _INT.fullmatch(values["id"]) or int(values["id"]) == 0:
            raise fail(n, f"id '{_short(values['id'])}' is not a whole number > 0 (htsim refuses id 0); "
                       "number flows from 1")
        flow_id = int(values["id"])
    if "prio" in values:
        log.warning("%s:%d: 'prio %s' ignored: the emulated fabric has no priority queues", source, n,
                    values["prio"])
    return Connection(src, dst, int(size_txt), float(start_txt), flow_id, n)


def _check_digits(text: str, what: str, source: str, n: int) -> None:
    digits = sum(ch.isdigit() for ch in text)
    if digits > MAX_DIGITS:
        raise _error(source, n, f"{what} has {digits} digits, more than the {MAX_DIGITS} any count, size or time "
                     f"needs; check the number ('{_short(text)}')")


def _short(text: str, limit: int = 24) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def load(path: Path | str, hosts: int | None = None) -> TrafficMatrix:
    """Read and parse a matrix file (see `parse`)."""
    p = Path(path)
    try:
        # Read one byte past the cap rather than trust st_size: a device or a pipe has none.
        with p.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise TrafficError(f"{p}: more than {MAX_FILE_BYTES >> 20} MiB, too large for a connection matrix; "
                               "give a .cm file")
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise TrafficError(f"{p}: no such file; give the path of a connection matrix (.cm)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TrafficError(f"{p}: cannot read it ({exc}); give a readable text file") from None
    return parse(text, str(p), hosts)


def dumps(matrix: TrafficMatrix) -> str:
    """The matrix as htsim writes and reads it (start times exact: whole numbers, or Python's repr)."""
    lines = [f"Nodes {matrix.nodes}", f"Connections {len(matrix.connections)}"]
    for c in matrix.connections:
        start = str(int(c.start_ps)) if float(c.start_ps).is_integer() else repr(float(c.start_ps))
        ident = f" id {c.flow_id}" if c.flow_id else ""
        lines.append(f"{c.src}->{c.dst}{ident} start {start} size {c.size}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# As an experiment's workload


def workload(matrix: TrafficMatrix, topo: Topology, base: Workload | None = None) -> Workload:
    """The matrix's flows as a "matrix" workload, with `base`'s message size."""
    hosts = [h.name for h in topo.hosts]
    flows = tuple(SizedFlow(hosts[c.src], hosts[c.dst], c.size, c.start_s, c.flow_id) for c in matrix.connections)
    return Workload(pattern="matrix", flows=flows, message_size=(base or Workload()).message_size)


def makespan_s(w: Workload, topo: Topology) -> float:
    """Seconds the busiest host link needs for the matrix's bytes (the transport's framing), after the
    latest start: the least time the whole matrix can take."""
    framing = srd_framing(datagram_size_for_mtu(topo.mtu), w.message_size)
    load: dict[tuple[str, str], float] = {}
    for f in w.flows:
        bits = 8 * wire_bytes(f.size, framing)
        for host, way in ((f.src, "out"), (f.dst, "in")):
            rate = min(lk.rate_mbps for lk in topo.links_of(host)) * 1e6
            load[(host, way)] = load.get((host, way), 0.0) + bits / rate
    return max(load.values(), default=0.0) + max((f.start_s for f in w.flows), default=0.0)


def apply(exp: Experiment, topo: Topology, matrix: TrafficMatrix, keep_duration: bool = False) -> Experiment:
    """`exp` with the matrix's flows in place of its planned ones (every arm: the transport's and TCP's).

    Unless `keep_duration` (the user gave --duration), the duration per arm becomes the matrix's
    makespan, rounded up to 0.1 s and at least 1 s: the base of the senders' safety cap (3x) and of
    the progress bar. Fault times scale with it as they do with --duration.
    """
    from experiments import overrides

    other = sorted({a.kind for a in exp.arms if not arm_kind(a.kind).point_to_point})
    if other:
        raise TrafficError(f"{matrix.source}: experiment '{exp.name}' runs {', '.join(other)} arms; a traffic "
                           "matrix drives transport and TCP flows: use it with e.g. ecmp-vs-spray")
    w = workload(matrix, topo, exp.workload)
    arms = [replace(a, workload=w) if a.workload is not None else a for a in exp.arms]
    extra = {**exp.extra, "traffic_matrix": {"file": matrix.source, "nodes": matrix.nodes,
                                             "connections": len(matrix.connections)}}
    out = replace(exp, workload=w, arms=arms, extra=extra)
    if not keep_duration:
        least = makespan_s(w, topo)
        if least > MAX_DURATION_S:
            raise TrafficError(f"{matrix.source}: the matrix needs at least {least:.3g} s per arm at the fabric's "
                               f"link rates, more than the {MAX_DURATION_S:g} s an arm may run; use smaller sizes, "
                               "or give --duration to cut the run short")
        out = overrides.with_overrides(out, duration=max(1.0, math.ceil(10 * least) / 10))
    return out
