"""A user's own path policy (`FILE.py:ClassName`): loading errors are one line, a good plug-in runs like
a built-in on the simulated network, and every kind of broken plug-in falls back to spray with one
warning naming the method and the problem, recorded in the connection's metrics."""

from __future__ import annotations

import json
import logging
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from experiments.endpoints import sender_args
from transport.core import policy_plugin
from transport.core.config import ConfigError, TransportConfig
from transport.core.connection import Connection
from transport.core.paths import Spray
from transport.core.policy_plugin import GuardedPolicy, PolicySpecError, make_policy
from transport.sim.policy_trial import conformance
from transport.sim.simnet import PathSpec, run_transfer

ROOT = Path(__file__).resolve().parents[2]
FABRICLAB = [sys.executable, "-m", "cli"]

# A round-robin policy: the base every broken variant below changes one method of.
GOOD = """
class Good:
    def __init__(self, num_evs, rng):
        self.n = num_evs
        self.i = rng.randrange(num_evs)
        self.acks = 0

    def next_ev(self, now, avoid=None):
        self.i = (self.i + 1) % self.n
        return self.i

    def on_ack(self, ev, rtt, now):
        self.acks += 1

    def on_loss(self, ev, now):
        pass

    def on_timeout(self, ev, now):
        pass

    def state(self):
        return {"acks": self.acks}
"""

BROKEN = {
    # name: (method body replacing one method, the method, words the fault must contain)
    "raises": ("def next_ev(self, now, avoid=None):\n    return [][1]", "next_ev", "raised IndexError"),
    "todo": ("def next_ev(self, now, avoid=None):\n    raise NotImplementedError('TODO')", "next_ev",
             "raised NotImplementedError: TODO"),
    "string": ("def next_ev(self, now, avoid=None):\n    return 'a'", "next_ev",
               "returned 'a' (str), expected an int EV in 0..15"),
    "out_of_range": ("def next_ev(self, now, avoid=None):\n    return 16", "next_ev",
                     "returned 16 (int), expected an int EV in 0..15"),
    "negative": ("def next_ev(self, now, avoid=None):\n    return -1", "next_ev", "returned -1 (int)"),
    "float": ("def next_ev(self, now, avoid=None):\n    return 1.0", "next_ev", "returned 1.0 (float)"),
    "bool": ("def next_ev(self, now, avoid=None):\n    return True", "next_ev", "returned True (bool)"),
    "none": ("def next_ev(self, now, avoid=None):\n    self.i += 1", "next_ev", "returned None (NoneType)"),
    "on_ack": ("def on_ack(self, ev, rtt, now):\n    return 1 / 0", "on_ack", "raised ZeroDivisionError"),
    "on_loss": ("def on_loss(self, ev, now):\n    raise KeyError(ev)", "on_loss", "raised KeyError"),
    "on_timeout": ("def on_timeout(self, ev, now):\n    raise RuntimeError('no')", "on_timeout",
                   "raised RuntimeError: no"),
    "state_type": ("def state(self):\n    return [1, 2]", "state", "returned [1, 2] (list), expected a dict"),
    "state_json": ("def state(self):\n    return {'x': object()}", "state", "expected a dict of JSON values"),
    "init": ("def __init__(self, num_evs, rng):\n    raise ValueError('bad init')", "__init__",
             "Broken(num_evs, rng) raised ValueError: bad init"),
}


def write_policy(folder: Path, name: str, source: str) -> str:
    path = folder / f"{name}.py"
    path.write_text(source)
    return str(path)


def broken_source(method_src: str) -> str:
    return GOOD + "\n\nclass Broken(Good):\n" + textwrap.indent(method_src, "    ") + "\n"


# Paths that make every callback happen: random loss (on_loss), an outage of every path at once (the
# retransmission timer fires: on_timeout), and a path that dies for good.
OUTAGE = (0.04, 0.08)
PATHS = [PathSpec(rate_bps=20e6, loss=0.02, down=[OUTAGE]), PathSpec(rate_bps=20e6, down=[OUTAGE]),
         PathSpec(rate_bps=20e6, down=[(0.04, 99.0)]), PathSpec(rate_bps=20e6, down=[OUTAGE])]


def transfer(policy: str, nbytes: int = 1 << 20):
    return run_transfer(TransportConfig(path_policy=policy), TransportConfig(), PATHS, total_bytes=nbytes, seed=3,
                        time_limit=30.0)


# -- loading -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("source", "spec", "words"), [
    (None, "missing.py:Good", "does not exist"),
    (GOOD, "pol.py", "is not FILE.py:ClassName"),
    (GOOD, "pol.txt:Good", "is not FILE.py:ClassName"),
    (GOOD, "pol.py:1Good", "is not a Python class name"),
    (GOOD, "pol.py:Other", "has no class Other (it defines Good)"),
    ("x = 1\n", "pol.py:Good", "has no class Good (it defines no class)"),
    (GOOD + "\nGoodFn = len\n", "pol.py:GoodFn", "is a builtin_function_or_method, not a class"),
    ("class Good:\n    def next_ev(self, now, avoid=None):\n        return 0\n", "pol.py:Good",
     "no on_ack(), on_loss(), on_timeout(), state()"),
    ("class Good:\n    def next_ev(self:\n", "pol.py:Good", "line 2: syntax error"),
    ("import no_such_module_here\n", "pol.py:Good", "raised ModuleNotFoundError"),
])
def test_bad_specs_are_one_line_errors(tmp_path, source, spec, words):
    if source is not None:
        (tmp_path / "pol.py").write_text(source)
    file, _, cls = spec.partition(":")
    with pytest.raises(PolicySpecError) as err:
        policy_plugin.check_spec(str(tmp_path / file) + (f":{cls}" if cls else ""))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_spec_is_made_absolute_and_its_class_loaded_once(tmp_path, monkeypatch):
    write_policy(tmp_path, "pol", GOOD)
    monkeypatch.chdir(tmp_path)
    spec = policy_plugin.check_spec("pol.py:Good")
    assert spec == f"{tmp_path / 'pol.py'}:Good"
    assert policy_plugin.load_class(spec) is policy_plugin.load_class(spec)
    assert policy_plugin.label(spec) == "Good" and policy_plugin.label("spray") == "spray"
    assert sender_args(spec) == ["--path-policy", spec]
    assert sender_args("adaptive") == ["--policy", "adaptive"]


def test_config_takes_a_spec_and_still_refuses_unknown_names(tmp_path):
    spec = write_policy(tmp_path, "pol", GOOD) + ":Good"
    TransportConfig(path_policy=spec).validate()
    with pytest.raises(ConfigError, match=r"or FILE\.py:ClassName"):
        TransportConfig(path_policy="ecmp").validate()
    assert isinstance(make_policy(spec, 8, random.Random(1)), GuardedPolicy)


# -- running on the simulated network ------------------------------------------------------------------


def test_a_good_plugin_runs_like_spray(tmp_path, caplog):
    spec = write_policy(tmp_path, "pol", GOOD) + ":Good"
    with caplog.at_level(logging.WARNING, logger="transport.core.policy_plugin"):
        mine = transfer(spec)
    spray = transfer("spray")
    assert mine.completed and sorted(mine.delivered) == sorted(spray.delivered)
    assert mine.goodput_bps >= 0.8 * spray.goodput_bps
    assert mine.sender_metrics["path_policy_fault"] is None and not caplog.records
    state = mine.sender_metrics["state"]["path_policy"]
    assert state["plugin"] == "Good" and state["fault"] is None and state["state"]["acks"] > 100
    assert state["calls"] > 1000 and state["mean_call_us"] < policy_plugin.MEAN_BUDGET_S * 1e6
    sent = mine.sender_metrics["sender"]["per_ev"]
    assert len(sent) == 16  # every EV carried packets: the plug-in really chose them


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_broken_plugin_falls_back_to_spray_and_is_reported_once(tmp_path, caplog, kind):
    method_src, method, words = BROKEN[kind]
    spec = write_policy(tmp_path, "pol", broken_source(method_src)) + ":Broken"
    with caplog.at_level(logging.WARNING, logger="transport.core.policy_plugin"):
        result = transfer(spec)
    assert result.completed, "the connection must carry on with the fallback"
    fault = result.sender_metrics["path_policy_fault"]
    assert fault and words in fault, fault
    assert fault.startswith("Broken(" if method == "__init__" else f"Broken.{method}()")
    assert result.sender_metrics["state"]["path_policy"]["fallback"] == "spray"
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and fault in warnings[0] and "using spray" in warnings[0]
    assert "\n" not in warnings[0]


def test_a_fault_stops_calls_into_the_user_code(tmp_path):
    spec = write_policy(tmp_path, "pol", broken_source(BROKEN["on_ack"][0])) + ":Broken"
    conn = Connection(TransportConfig(path_policy=spec, num_evs=4), 1)
    policy = conn.path_policy
    policy.on_ack(0, 0.001, 0.0)
    calls = policy.calls
    for _ in range(10):
        assert 0 <= policy.next_ev(0.0) < 4
        policy.on_ack(1, 0.001, 0.0)
    assert policy.calls == calls and policy.fault_method == "on_ack"


# -- the time budget -----------------------------------------------------------------------------------


class Clock:
    """A timer the test moves: each call into the policy 'takes' `cost` seconds."""

    def __init__(self) -> None:
        self.t = 0.0
        self.cost = 0.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        if self.reads % 2 == 0:  # the second read of a pair ends the call
            self.t += self.cost
        return self.t


def guarded(cost: float) -> tuple[GuardedPolicy, Clock]:
    clock = Clock()
    clock.cost = cost
    return GuardedPolicy(Spray, 16, random.Random(1), timer=clock), clock


def test_one_slow_call_is_forgiven_the_second_is_a_fault():
    g, clock = guarded(0.0)
    clock.cost = 0.080
    g.next_ev(0.0)
    assert g.fault is None
    clock.cost = 0.00001
    for _ in range(100):
        g.next_ev(0.0)
    assert g.fault is None
    clock.cost = 0.120
    g.on_ack(3, 0.001, 0.0)
    assert g.fault == "Spray.on_ack() took 120 ms, call 2 over the budget of 50 ms per call (it stalls the whole " \
                      "endpoint)"


def test_slow_on_average_is_a_fault_naming_the_slowest_method():
    g, clock = guarded(0.00005)
    for _ in range(policy_plugin.MEAN_WINDOW):
        g.next_ev(0.0)
    assert g.fault is None  # 50 us per call is within the budget
    for _ in range(policy_plugin.MEAN_WINDOW // 2):
        clock.cost = 0.0004
        g.next_ev(0.0)
        clock.cost = 0.0002
        g.on_ack(1, 0.001, 0.0)
    assert g.fault and g.fault.startswith("Spray.next_ev() took 0.40 ms per call on average (all methods: 0.30 ms")
    assert "budget 0.2 ms" in g.fault


def test_a_really_slow_policy_falls_back_on_the_simulated_network(tmp_path, caplog):
    source = broken_source("def next_ev(self, now, avoid=None):\n    import time\n    time.sleep(0.06)\n"
                           "    return 0")
    spec = write_policy(tmp_path, "pol", source) + ":Broken"
    with caplog.at_level(logging.WARNING, logger="transport.core.policy_plugin"):
        result = transfer(spec, nbytes=200_000)
    assert result.completed
    assert "Broken.next_ev() took" in result.sender_metrics["path_policy_fault"]
    assert len(caplog.records) == 1


# -- whatever a policy returns, the connection gets a valid EV ------------------------------------------

VALUES = st.one_of(st.integers(-40, 40), st.booleans(), st.none(), st.floats(allow_nan=True), st.text(max_size=3),
                   st.lists(st.integers(), max_size=2))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(VALUES, min_size=1, max_size=30), num_evs=st.integers(1, 20))
def test_any_returned_value_gives_a_valid_ev(values, num_evs):
    feed = iter(values)

    class Scripted(Spray):
        def next_ev(self, now, avoid=None):
            return next(feed, 0)

    g = GuardedPolicy(Scripted, num_evs, random.Random(0))
    bad: list = []  # the first invalid value, once there was one
    for i, v in enumerate(values):
        ev = g.next_ev(float(i))
        assert isinstance(ev, int) and not isinstance(ev, bool) and 0 <= ev < num_evs
        valid = isinstance(v, int) and not isinstance(v, bool) and 0 <= v < num_evs
        if not bad and not valid:
            bad.append(v)
        if not bad:
            assert ev == v  # a valid answer is used as it is
    assert (g.fault is None) == (not bad)
    if bad:
        assert g.fault_method == "next_ev" and f"({type(bad[0]).__name__})" in g.fault


# -- the command line ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "words"), [
    ("nope.py:X", "does not exist"),
    ("pol.py:Missing", "has no class Missing"),
    ("pol.py", "is not FILE.py:ClassName"),
])
def test_srd_send_refuses_a_bad_policy_in_one_line(tmp_path, spec, words):
    write_policy(tmp_path, "pol", GOOD)
    out = subprocess.run([*FABRICLAB, "srd", "send", "--to", "127.0.0.1", "--path-policy", spec], cwd=tmp_path,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2, out
    assert words in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def _hostile_spec(folder: Path, kind: str) -> tuple[str, str]:
    """A --path-policy value that used to escape argparse (or end the command), and the words now shown."""
    if kind == "symlink-loop":
        (folder / "a.py").symlink_to(folder / "b.py")
        (folder / "b.py").symlink_to(folder / "a.py")
        return f"{folder}/a.py:C", "Symlink loop"
    if kind == "no-such-user":
        return "~nosuchuser/x.py:C", "there is no user 'nosuchuser'"
    if kind == "name-too-long":
        return f"{folder}/{'a' * 300}.py:C", "File name too long"
    write_policy(folder, "exits", "import sys\nsys.exit(3)\n")
    return f"{folder}/exits.py:C", "called sys.exit(3); a policy file must not exit"


@pytest.mark.parametrize("kind", ["symlink-loop", "no-such-user", "name-too-long", "sys-exit"])
def test_hostile_path_policy_specs_are_one_line_and_exit_2(tmp_path, kind):
    spec, words = _hostile_spec(tmp_path, kind)
    out = subprocess.run([*FABRICLAB, "srd", "send", "--to", "127.0.0.1", "--path-policy", spec], cwd=tmp_path,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                         timeout=60)
    err = out.stderr.strip()
    assert out.returncode == 2, out
    assert "Traceback" not in err and len(err.splitlines()) == 1 and len(err) < 400, err
    assert words in err, err


@pytest.mark.parametrize("command", [["srd", "send", "--to", "127.0.0.1"], ["run", "ecmp-vs-spray"]])
def test_a_policy_file_that_waits_at_import_is_cut_short_in_one_line(tmp_path, command):
    write_policy(tmp_path, "sleepy", "import time\ntry:\n    time.sleep(60)\nexcept Exception:\n    time.sleep(60)\n"
                 + GOOD)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", policy_plugin.IMPORT_BUDGET_ENV: "0.5"}
    out = subprocess.run([*FABRICLAB, *command, "--path-policy", f"{tmp_path}/sleepy.py:Good"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=30)
    err = out.stderr.strip()
    assert out.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, out
    assert "sleepy.py took longer than 0.5 s" in err and policy_plugin.IMPORT_BUDGET_ENV in err, err


def test_the_import_deadline_restores_a_timer_already_set():
    signal = pytest.importorskip("signal")
    signal.setitimer(signal.ITIMER_REAL, 100)
    try:
        with policy_plugin._deadline(5):
            pass
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 90 < left <= 100
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def test_a_policy_that_exits_while_running_is_a_fault_not_the_end(tmp_path):
    spec = write_policy(tmp_path, "pol", broken_source("def on_ack(self, ev, rtt, now):\n    raise SystemExit(3)"))
    guarded = policy_plugin.make_guarded(spec + ":Broken", 16, random.Random(1))
    guarded.on_ack(guarded.next_ev(0.0), 0.001, 0.001)
    assert guarded.fault_method == "on_ack" and "raised SystemExit: 3" in guarded.fault
    assert 0 <= guarded.next_ev(0.002) < 16


def test_allreduce_worker_takes_a_path_policy(tmp_path):
    from cli.allreduce import _options
    from cli.main import build_parser

    spec = write_policy(tmp_path, "pol", GOOD) + ":Good"
    args = build_parser().parse_args(["allreduce", "--rank", "0", "--peers", "127.0.0.1:7000,127.0.0.1:7001",
                                      "--size", "4", "--path-policy", spec])
    assert _options(args).config.path_policy == spec


def test_send_with_a_broken_policy_over_udp_records_the_fault(tmp_path):
    spec = write_policy(tmp_path, "pol", broken_source(BROKEN["string"][0])) + ":Broken"
    recv = subprocess.Popen([*FABRICLAB, "srd", "recv", "--bind", "127.0.0.1", "--port", "0", "--expect-bytes", "1M",
                             "--progress"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        port = int(recv.stderr.readline().rsplit(":", 1)[1])  # type: ignore[union-attr]
        send = subprocess.run([*FABRICLAB, "srd", "send", "--to", f"127.0.0.1:{port}", "--bytes", "1M",
                               "--base-port", "0", "--bind", "127.0.0.1", "--path-policy", spec,
                               "--json-out", str(tmp_path / "send.json")],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        recv.communicate(timeout=30)
    finally:
        if recv.poll() is None:
            recv.kill()
    assert send.returncode == 0, send.stderr
    metrics = json.loads((tmp_path / "send.json").read_text())
    fault = metrics["connection"]["path_policy_fault"]
    assert fault == "Broken.next_ev() returned 'a' (str), expected an int EV in 0..15"
    assert metrics["config"]["path_policy"] == spec
    lines = [ln for ln in send.stderr.splitlines() if "path policy" in ln]
    assert len(lines) == 1 and fault in lines[0]


def test_the_overdue_hint_reaches_only_a_plugin_that_has_on_suspect(tmp_path):
    with_hook = GOOD.replace("class Good:", "class Hinted:") + textwrap.indent(textwrap.dedent("""
        def on_suspect(self, ev, now):
            self.acks -= 1000
    """), "    ")
    hinted = make_policy(write_policy(tmp_path, "hinted", with_hook) + ":Hinted", 4, random.Random(0))
    plain = make_policy(write_policy(tmp_path, "plain", GOOD) + ":Good", 4, random.Random(0))
    assert getattr(plain, "on_suspect", None) is None  # loss recovery then never calls it
    hinted.on_suspect(1, 0.0)  # type: ignore[attr-defined]
    assert hinted._inner.acks == -1000 and hinted.calls == 1  # type: ignore[attr-defined]
    assert [c.name for c in conformance(str(tmp_path / "hinted.py") + ":Hinted")].count("on_suspect") == 1
    assert "on_suspect" not in [c.name for c in conformance(str(tmp_path / "plain.py") + ":Good")]
