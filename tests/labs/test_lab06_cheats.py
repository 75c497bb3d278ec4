"""Lab 6's grader on code: policies that once passed it by knowing the test, by reading the simulated
network off the call stack, by failing where no trial looked, or by spinning on the CPU, now fail the
named checks, while the lab's solution still passes every check."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from labs import catalogue, grading, policy_process
from labs.catalogue import load_checker

CHEATS = Path(__file__).resolve().parent / "lab06_cheats"
LAB6 = next(lab for lab in catalogue.all_labs() if lab.number == 6)


def grade(tmp_path: Path, cheat: str) -> dict[str, bool]:
    folder = tmp_path / cheat
    folder.mkdir()
    shutil.copy(CHEATS / f"{cheat}.py", folder / "my_policy.py")
    # A cheat built on the solution finds it beside itself, as a student's copy would.
    shutil.copy(LAB6.path / "solution" / "my_policy.py", folder / "solution_policy.py")
    return {c.name: c.passed for c in load_checker(LAB6).check(folder)}


@pytest.mark.parametrize(("cheat", "must_fail"), [
    # Ignores feedback, skips EVs 0 mod 4 from 1 s: passed 8/8 when the trial always cut path 0 at 1 s.
    ("skips_evs", {"no fault: goodput", "cut: failover", "cut: recovery", "slow: failover", "slow: recovery",
                   "conformance: avoid"}),
    # The solution with an on_timeout that raises: passed 8/8, as no trial ever called on_timeout; later
    # its conformance failure stood beside "PASS no policy fault: never raised".
    ("raises_on_timeout", {"conformance: on_timeout", "no policy fault"}),
    # No feedback at all, the paths read off the grader's call stack: passed 17/17 in the grader's process.
    ("reads_the_stack", {"slow: goodput", "slow: failover", "slow: recovery"}),
    # 1 ms of CPU per next_ev: a fault by CPU time, whatever the machine's load.
    ("busy_waits", {"cut: policy fault", "slow: policy fault", "no fault: policy fault", "CPU per call"}),
    # The solution until 1.35 s, then everything on a cut path: its tail was "38 ms", finished messages only.
    ("stalls", {"cut: tail", "cut: recovery", "slow: tail"}),
])
def test_a_cheat_fails_the_checks_it_used_to_pass(tmp_path, cheat, must_fail):
    checks = grade(tmp_path, cheat)
    assert must_fail <= set(checks), sorted(checks)
    assert not any(checks[name] for name in must_fail), {n: checks[n] for n in must_fail}
    assert not all(checks.values())


def test_the_solution_passes_every_check_including_conformance():
    checks = {c.name: c for c in load_checker(LAB6).check(LAB6.path / "solution")}
    assert all(c.passed for c in checks.values()), [c for c in checks.values() if not c.passed]
    assert {"conformance: on_timeout", "conformance: avoid", "conformance: state", "no fault: goodput",
            "cut: recovery", "slow: tail"} <= set(checks)
    assert "in all 3 trials" in checks["cut: tail"].reason and "unfinished" in checks["cut: tail"].reason


def test_a_bound_and_a_value_that_round_alike_print_the_digits_that_differ():
    check = load_checker(LAB6)
    # 0.75 x 84.2 % = 63.15 %; 62.9 % is below it, and both print as 63 % at whole percents.
    result = check._versus("slow: failover", 0.629, {"adaptive": 0.842, "spray": 0.25}, 0.75, True, check._pct,
                           "goodput kept")
    assert not result.passed
    assert "63% < 63%" not in result.reason and "62.9% < 63.1%" in result.reason, result.reason
    ok = check._versus("tail", 0.062, {"spray": 0.062}, 1.5, False, check._ms, "p99")
    assert ok.passed and "62 ms <= 93 ms" in ok.reason


def test_a_policy_fault_stops_the_trial_and_says_so():
    checks = {c.name: c for c in load_checker(LAB6).check(LAB6.path / "starter")}
    fault = checks["cut: policy fault"]
    assert not fault.passed and "the trial stopped there" in fault.reason and "went on with spray" not in fault.reason


def test_cpu_per_call_warns_before_it_fails():
    check = load_checker(LAB6)
    calm, close, over = check._cpu(0.004, 1000), check._cpu(0.1, 1000), check._cpu(0.3, 1000)
    assert calm.passed and not calm.warning
    assert close.passed and close.warning and "100.0 µs of CPU per call" in close.reason
    assert not over.passed and "failing at 200 µs" in over.reason
    text, code = grading.render([close])
    assert code == 0 and text.startswith("WARN  CPU per call")


def test_the_policy_runs_in_a_process_of_its_own(tmp_path):
    """What the policy's methods see of the world is their arguments: not the grader's frames."""
    (tmp_path / "my_policy.py").write_text(
        "import os, sys\n\n"
        "class MyPolicy:\n"
        "    def __init__(self, num_evs, rng):\n        self.n = num_evs\n"
        "    def next_ev(self, now, avoid=None):\n"
        "        f, depth = sys._getframe(), 0\n"
        "        while f is not None:\n            depth, f = depth + 1, f.f_back\n"
        "        return depth\n"
        "    def on_ack(self, ev, rtt, now): pass\n    def on_loss(self, ev, now): pass\n"
        "    def on_timeout(self, ev, now): pass\n"
        "    def state(self): return {'pid': os.getpid(), 'sim': 'transport.sim.simnet' in sys.modules}\n")
    with policy_process.serving(tmp_path / "my_policy.py", "MyPolicy"):
        cls = policy_process.stand_in("MyPolicy")
        policy = cls(16, random.Random(1))
        assert cls.__name__ == "MyPolicy" and not hasattr(policy, "on_suspect")
        state = policy.state()
        assert state["pid"] != os.getpid() and state["sim"] is False
        assert policy.next_ev(0.0) < 6  # the child's own few frames, none of the grader's
