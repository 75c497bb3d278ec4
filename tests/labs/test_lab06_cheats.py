"""Lab 6's grader on code: policies that once passed it by knowing the test, or by failing where no
trial looked, now fail the named checks, while the lab's solution still passes every check."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from labs import catalogue
from labs.catalogue import load_checker

CHEATS = Path(__file__).resolve().parent / "lab06_cheats"
LAB6 = next(lab for lab in catalogue.all_labs() if lab.number == 6)


def grade(tmp_path: Path, cheat: str) -> dict[str, bool]:
    folder = tmp_path / cheat
    folder.mkdir()
    shutil.copy(CHEATS / f"{cheat}.py", folder / "my_policy.py")
    return {c.name: c.passed for c in load_checker(LAB6).check(folder)}


@pytest.mark.parametrize(("cheat", "must_fail"), [
    # Ignores feedback, skips EVs 0 mod 4 from 1 s: passed 8/8 when the trial always cut path 0 at 1 s.
    ("skips_evs", {"no fault: goodput", "cut: failover", "cut: recovery", "slow: failover", "slow: recovery",
                   "conformance: avoid"}),
    # The solution with an on_timeout that raises: passed 8/8, as no trial ever called on_timeout.
    ("raises_on_timeout", {"conformance: on_timeout"}),
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
