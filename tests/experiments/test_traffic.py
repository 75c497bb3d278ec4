"""Traffic matrices in htsim's connection-matrix format: parsing, the one-line errors, the round trip,
and the workload they become (no root: nothing here brings a fabric up)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments import driver, runner, traffic
from experiments.arms import base
from experiments.traffic import Connection, TrafficError, TrafficMatrix

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "permutation-6.cm"
FABRICLAB = [sys.executable, "-m", "cli"]


def test_the_example_matrix_fits_the_demo_fabric():
    exp, topo = driver.prepare("ecmp-vs-spray")
    m = traffic.load(EXAMPLE, hosts=len(topo.hosts))
    assert m.nodes == 6 and len(m.connections) == 6
    assert m.connections[0] == Connection(0, 4, 2_000_000, 0.0, 1)
    # Every host sends once and receives once, always to the other leaf.
    leaf = {h.name: h.labels["leaf"] for h in topo.hosts}
    w = traffic.workload(m, topo, exp.workload)
    assert sorted(f.src for f in w.flows) == sorted(f.dst for f in w.flows) == [h.name for h in topo.hosts]
    assert all(leaf[f.src] != leaf[f.dst] for f in w.flows)


def test_htsim_variants_parse():
    text = (
        "# comment\n\nNodes 4\nConnections 3\nTriggers 0\n"
        "0->1 start 0.000000 size 1000\n"
        "1->2 id 7 start 250 size 2000 prio 3\n"
        "3->0\tsize 5\t start 1.5e3 id 9\r\n"
    )
    m = traffic.parse(text, "x.cm", hosts=4)
    assert [(c.src, c.dst, c.size, c.start_ps, c.flow_id) for c in m.connections] == [
        (0, 1, 1000, 0.0, 0), (1, 2, 2000, 250.0, 7), (3, 0, 5, 1500.0, 9)]
    assert m.connections[1].start_s == pytest.approx(250e-12)


BAD = [
    # (matrix text, line the error names, fragment of the message)
    ("", 1, "no 'Nodes' line"),
    ("Nodes 6\n", 1, "no 'Connections' line"),
    ("Nodes six\nConnections 1\n0->1 start 0 size 1\n", 1, "one whole number"),
    ("Nodes 8\nConnections 1\n0->1 start 0 size 1\n", 1, "topology has 6 hosts"),
    ("Nodes 6\nNodes 6\n", 2, "second 'Nodes'"),
    ("Nodes 6\nConnections 2\n0->1 start 0 size 10\n", 2, "set it to 1"),
    ("Nodes 6\nConnections 1\n0->1 start 0 size 10\n1->2 start 0 size 10\n", 2, "set it to 2"),
    ("Nodes 6\nConnections 0\n", 2, "no connections"),
    ("0->1 start 0 size 10\nNodes 6\nConnections 1\n", 1, "before the 'Nodes N'"),
    ("Nodes 6\nConnections 1\n0->6 start 0 size 10\n", 3, "destination host 6 is out of range"),
    ("Nodes 6\nConnections 1\n9->1 start 0 size 10\n", 3, "source host 9 is out of range"),
    ("Nodes 6\nConnections 1\n2->2 start 0 size 10\n", 3, "sends to itself"),
    ("Nodes 6\nConnections 1\n0->1 start 0 size 0\n", 3, "size '0'"),
    ("Nodes 6\nConnections 1\n0->1 start 0 size -5\n", 3, "size '-5'"),
    ("Nodes 6\nConnections 1\n0->1 start 0 size 2e6\n", 3, "size '2e6'"),
    ("Nodes 6\nConnections 1\n0->1 start 0\n", 3, "no size"),
    ("Nodes 6\nConnections 1\n0->1 size 10\n", 3, "no start time"),
    ("Nodes 6\nConnections 1\n0->1 start -1 size 10\n", 3, "start '-1'"),
    ("Nodes 6\nConnections 1\n0->1 start soon size 10\n", 3, "start 'soon'"),
    ("Nodes 6\nConnections 1\n0->1 start 0 size 10 sise 4\n", 3, "unknown key 'sise'"),
    ("Nodes 6\nConnections 1\n0->1 start 0 size 10 size 4\n", 3, "given twice"),
    ("Nodes 6\nConnections 1\n0->1 start 0 size\n", 3, "'size' has no value"),
    ("Nodes 6\nConnections 1\n0->1 id 0 start 0 size 10\n", 3, "htsim refuses id 0"),
    ("Nodes 6\nConnections 2\n0->1 id 3 start 0 size 10\n1->0 id 3 start 0 size 10\n", 4, "flow id 3 is used again"),
    ("Nodes 6\nConnections 1\n0->1 id 1 trigger 2\n", 3, "triggers"),
    ("Nodes 6\nConnections 1\n0->1 start 0 size 10 send_done_trigger 1\n", 3, "triggers are not supported"),
    ("Nodes 6\nConnections 1\n0->1 start 0 size 10 msg 2\n", 3, "'msg'"),
    ("Nodes 6\nConnections 1\nTriggers 1\n", 3, "triggers are not supported"),
    ("Nodes 6\nConnections 1\nFailures 2\n", 3, "link failures"),
    ("Nodes 6\nConnections 1\n0->1 start 0 size 10\ntrigger id 1 oneshot\n", 4, "'trigger' lines"),
    ("Nodes 6\nConnections 1\n0-1 start 0 size 10\n", 3, "unknown line"),
    ("Nodes 6\nConnections 1\na->1 start 0 size 10\n", 3, "not 'SRC->DST'"),
    ("Nodes 6\nConnections 1\n0->1 start 0 size 10\nConnections 1\n", 4, "after the first connection"),
]


@pytest.mark.parametrize(("text", "line", "fragment"), BAD, ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD)])
def test_malformed_matrices_get_one_line_naming_file_line_and_fix(text, line, fragment):
    with pytest.raises(TrafficError) as err:
        traffic.parse(text, "perm.cm", hosts=6)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"perm.cm:{line}: "), msg
    assert fragment in msg, msg


def test_missing_and_unreadable_files(tmp_path):
    with pytest.raises(TrafficError, match=r"nowhere\.cm: no such file"):
        traffic.load(tmp_path / "nowhere.cm")
    binary = tmp_path / "bin.cm"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TrafficError, match=r"bin\.cm: cannot read it"):
        traffic.load(binary)


@st.composite
def matrices(draw) -> TrafficMatrix:
    nodes = draw(st.integers(2, 64))
    host = st.integers(0, nodes - 1)
    n = draw(st.integers(1, 40))
    ids = draw(st.lists(st.integers(1, 10**6), min_size=n, max_size=n, unique=True))
    conns = []
    for i in range(n):
        src = draw(host)
        dst = draw(host.filter(lambda d, s=src: d != s))
        start = draw(st.one_of(st.just(0.0), st.integers(0, 10**15).map(float),
                               st.floats(0, 1e15, allow_nan=False, allow_infinity=False)))
        conns.append(Connection(src, dst, draw(st.integers(1, 2**40)), start,
                                ids[i] if draw(st.booleans()) else 0))
    return TrafficMatrix(nodes, tuple(conns), "gen.cm")


@settings(max_examples=150, deadline=None)
@given(matrices())
def test_round_trip(m):
    text = traffic.dumps(m)
    assert traffic.parse(text, "gen.cm", hosts=m.nodes) == m
    assert traffic.dumps(traffic.parse(text, "gen.cm")) == text


def test_the_matrix_replaces_the_planned_flows_and_sets_the_duration():
    standard_frames = "leaf-spine:spines=2,leaves=2,hosts=3,host_rate=4,fabric_rate=6,mtu=1500"
    exp, topo = driver.prepare("ecmp-vs-spray", standard_frames)
    text = "Nodes 6\nConnections 3\n0->3 start 0 size 3000000\n0->4 start 0 size 1000000\n5->0 start 0 size 500000\n"
    out = traffic.apply(exp, topo, traffic.parse(text, "t.cm", hosts=6))
    flows = runner.plan_flows(out.workload, topo, out.seed)
    assert [(f.src, f.dst, f.index, f.size) for f in flows] == [
        ("h1", "h4", 0, 3_000_000), ("h1", "h5", 1, 1_000_000), ("h6", "h1", 0, 500_000)]
    assert runner.flow_bytes(out.workload, topo, out.duration_s) == 3_000_000
    # h1 sends 4 MB plus 84 bytes of headers per 1430-byte payload (1500-byte MTU) over its 4 Mb/s link:
    # 8.47 s, the makespan, rounded up to 0.1 s.
    assert out.duration_s == pytest.approx(8.5)
    assert out.extra["traffic_matrix"] == {"file": "t.cm", "nodes": 6, "connections": 3}
    kept = traffic.apply(exp, topo, traffic.parse(text, "t.cm", hosts=6), keep_duration=True)
    assert kept.duration_s == exp.duration_s
    # The experiment's own definition is untouched.
    assert exp.workload.pattern == "permutation"


def test_arms_with_their_own_workload_get_the_matrix_too():
    exp, topo = driver.prepare("loss-recovery")
    m = traffic.parse("Nodes 2\nConnections 1\n1->0 start 0 size 1000\n", "t.cm", hosts=len(topo.hosts))
    out = traffic.apply(exp, topo, m)
    for arm in out.arms:
        w = arm.workload or out.workload
        assert [(f.src, f.dst, f.size) for f in runner.plan_flows(w, topo, 1)] == [("h2", "h1", 1000)]


def test_experiments_without_flows_are_refused_and_later_starts_pass_through():
    exp, topo = driver.prepare("in-server")
    m = traffic.parse(f"Nodes {len(topo.hosts)}\nConnections 1\n0->1 start 0 size 10\n", "t.cm")
    with pytest.raises(TrafficError, match="runs allreduce, ping arms"):
        traffic.apply(exp, topo, m)
    exp, topo = driver.prepare("ecmp-vs-spray")
    late = traffic.parse("Nodes 6\nConnections 2\n0->3 start 0 size 10\n1->4 start 5e9 size 10\n", "t.cm")
    flows = runner.plan_flows(traffic.apply(exp, topo, late).workload, topo, 1)
    assert [f.start_s for f in flows] == [0.0, pytest.approx(0.005)]


def test_the_starters_release_each_flow_at_its_own_start():
    """What lets a matrix's later starts through: every kind releases its senders (or starts its
    clients) through one schedule, at the traffic's start plus the flow's own offset."""
    ctx = SimpleNamespace(t0=time.monotonic(), stop=threading.Event())
    started: dict[str, float] = {}
    done = threading.Event()

    def start(name: str) -> None:
        started[name] = time.monotonic() - ctx.t0
        if len(started) == 3:
            done.set()

    base._start_on_schedule(ctx, [(0.3, partial(start, "late")), (0.0, partial(start, "now")),
                                  (0.15, partial(start, "soon"))])
    assert list(started) == ["now"]  # due at once: started before the call returns
    assert done.wait(5)
    assert list(started) == ["now", "soon", "late"]
    assert started["soon"] >= 0.15 and started["late"] >= 0.3
    # Once the arm stops, starts still due are dropped: a held sender never released exits on SIGTERM.
    ctx = SimpleNamespace(t0=time.monotonic(), stop=threading.Event())
    started.clear()
    base._start_on_schedule(ctx, [(0.2, partial(start, "never"))])
    ctx.stop.set()
    time.sleep(0.3)
    assert started == {}


@pytest.mark.parametrize(("text", "fragment"), [
    ("Nodes 6\nConnections 1\n0->7 start 0 size 10\n", "perm.cm:3: destination host 7 is out of range"),
    ("Nodes 4\nConnections 1\n0->1 start 0 size 10\n", "perm.cm:1: Nodes 4, but the topology has 6 hosts"),
    ("Nodes 6\nConnections 1\n0->1 start 0 size 10 color red\n", "perm.cm:3: unknown key 'color'"),
])
def test_cli_refuses_a_bad_matrix_before_anything_starts(tmp_path, text, fragment):
    bad = tmp_path / "perm.cm"
    bad.write_text(text)
    out = subprocess.run([*FABRICLAB, "run", "ecmp-vs-spray", "--traffic", str(bad), "--no-progress"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out
    err = out.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("fabriclab run: error: ") and fragment in err, err


def test_cli_names_a_missing_matrix(tmp_path):
    out = subprocess.run([*FABRICLAB, "run", "ecmp-vs-spray", "--traffic", str(tmp_path / "none.cm")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "none.cm" in out.stderr


# -- hostile matrices: numbers, sizes, times and files that used to escape or run away --------------

HUGE = "1" + "0" * 4400


def _cli_error(tmp_path: Path, matrix: str) -> str:
    """`run --traffic MATRIX`'s one-line error. PATH holds no Open vSwitch, so a matrix the checks let
    through stops at the emulator's own readiness check instead of bringing a fabric up."""
    empty = tmp_path / "no-tools"
    empty.mkdir(exist_ok=True)
    out = subprocess.run([*FABRICLAB, "run", "ecmp-vs-spray", "--traffic", matrix, "--no-progress"],
                         capture_output=True, text=True, timeout=60, env={"PATH": str(empty)})
    err = out.stderr.strip()
    assert out.returncode == 2, out
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(("line", "fragment"), [
    (f"0->1 start 0 size {HUGE}", "perm.cm:3: 'size' has 4401 digits, more than the 24"),
    (f"0->1 start {HUGE} size 10", "perm.cm:3: 'start' has 4401 digits"),
    (f"0->1 id {HUGE} start 0 size 10", "perm.cm:3: 'id' has 4401 digits"),
    ("0->1 start 0 size " + "1" + "0" * 30, "perm.cm:3: 'size' has 31 digits"),
    ("0->1 start 0 size 1000000000000000000", "size 1000000000000000000 bytes is more than the 1 TiB"),
    ("0->1 start 1e309 size 10", "start '1e309' is not a number of picoseconds"),
    ("0->1 start 1e30 size 10", "start 1e30 ps is 1e+18 s after the traffic starts, more than the 3600 s"),
    ("0->1 start 0 size 100000000000", "s per arm at the fabric's link rates, more than the 3600 s"),
], ids=["size-4401-digits", "start-4401-digits", "id-4401-digits", "size-1e30", "size-1e18", "start-1e309",
        "start-1e30", "makespan-over-an-hour"])
def test_cli_caps_digits_sizes_and_duration(tmp_path, line, fragment):
    bad = tmp_path / "perm.cm"
    bad.write_text(f"Nodes 6\nConnections 1\n{line}\n")
    assert fragment in _cli_error(tmp_path, str(bad))


def test_cli_caps_header_digits(tmp_path):
    bad = tmp_path / "perm.cm"
    bad.write_text(f"Nodes {HUGE}\nConnections 1\n0->1 start 0 size 10\n")
    assert "perm.cm:1: Nodes has 4401 digits" in _cli_error(tmp_path, str(bad))


def test_cli_reads_no_more_than_the_file_cap(tmp_path):
    # Before the cap, /dev/zero was read until memory ran out; now the command stops after 16 MiB.
    err = _cli_error(tmp_path, "/dev/zero")
    assert "/dev/zero: more than 16 MiB, too large for a connection matrix" in err
    # That command alone stayed small: measured in a process of its own, whose only child it is (the
    # suite's own children, a simulated run among them, are not this command).
    empty = tmp_path / "no-tools"
    probe = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], capture_output=True, env={'PATH': "
             f"{str(empty)!r}}}); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", probe, *FABRICLAB, "run", "ecmp-vs-spray", "--traffic", "/dev/zero",
                          "--no-progress"], capture_output=True, text=True, timeout=60, check=True)
    assert int(out.stdout) < 512 * 1024


def test_an_explicit_duration_keeps_a_long_matrix():
    exp, topo = driver.prepare("ecmp-vs-spray", duration=5.0)
    m = traffic.parse("Nodes 6\nConnections 1\n0->1 start 0 size 100000000000\n", "t.cm", hosts=6)
    assert traffic.apply(exp, topo, m, keep_duration=True).duration_s == 5.0
