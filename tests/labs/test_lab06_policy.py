"""Lab 6's checker on a results directory of `fabriclab run hot-link --path-policy ...`: it finds the arm
that ran the student's policy, fails a policy fault, and grades goodput and tail against the built-ins."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments import driver, results
from experiments.policy_arm import with_policy_arm
from experiments.runner import Flow, RunOutcome
from labs import catalogue, grading
from labs.catalogue import load_checker
from tests.experiments.test_results import _raw

SPEC = "/abs/lab6/my_policy.py:MyPolicy"
CHECKER = load_checker(catalogue.find_lab(6))


def write_run(root: Path, goodput: dict[str, float], fault: str | None = None, policy: str = SPEC) -> Path:
    """A hot-link run with the built-in arms and the policy's arm, each carrying `goodput` (Mb/s)."""
    exp, topo = driver.prepare("hot-link", topo="leaf-spine:spines=2,leaves=2,hosts=1,rate=10", duration=4)
    exp = with_policy_arm(exp, policy)
    raws = []
    for arm in exp.arms:
        raw = _raw(topo, goodput[arm.name] * 1e6, "spine1")
        if arm.name == "MyPolicy":
            raw["endpoints"]["send-0-h1-h2"]["connection"]["path_policy_fault"] = fault
        raws.append((arm, raw))
    outcome = RunOutcome(raws=raws, complete=True, started=0.0, finished=10.0,
                         flows={a.name: [Flow("h1", "h2", 0)] for a in exp.arms},
                         bytes_per_flow={a.name: 0 for a in exp.arms})
    doc = driver.build_document(exp, topo, outcome)
    out = root / "hot-link" / "20260101-000000"
    out.mkdir(parents=True)
    results.save(doc, out)
    return root


GOOD = {"ecmp-single": 3.0, "spray": 4.0, "adaptive": 5.0, "MyPolicy": 4.8}


def test_a_policy_as_good_as_the_builtins_passes(tmp_path):
    text, code = grading.render(CHECKER.check(write_run(tmp_path, GOOD)))
    assert code == 0, text
    assert "0.75 x adaptive's 5.0 Mb/s, the best built-in" in text


def test_a_policy_fault_fails_even_with_good_numbers(tmp_path):
    fault = "MyPolicy.on_ack() raised ZeroDivisionError: division by zero (my_policy.py line 9)"
    checks = CHECKER.check(write_run(tmp_path, GOOD, fault=fault))
    bad = [c for c in checks if not c.passed]
    assert [c.name for c in bad] == ["no policy fault"] and fault in bad[0].reason


def test_a_policy_far_below_the_best_builtin_fails(tmp_path):
    checks = CHECKER.check(write_run(tmp_path, {**GOOD, "MyPolicy": 3.0}))
    assert {c.name for c in checks if not c.passed} == {"goodput", "after the link degraded"}


def test_a_run_without_the_policy_says_how_to_make_one(tmp_path):
    exp, topo = driver.prepare("hot-link", topo="leaf-spine:spines=2,leaves=2,hosts=1,rate=10", duration=4)
    outcome = RunOutcome(raws=[(a, _raw(topo, 4e6, "spine1")) for a in exp.arms], complete=True, started=0.0,
                         finished=1.0, flows={a.name: [Flow("h1", "h2", 0)] for a in exp.arms},
                         bytes_per_flow={a.name: 0 for a in exp.arms})
    out = tmp_path / "hot-link" / "20260101-000000"
    out.mkdir(parents=True)
    results.save(driver.build_document(exp, topo, outcome), out)
    with pytest.raises(catalogue.LabError, match=r"--path-policy DIR/my_policy\.py:MyPolicy"):
        CHECKER.check(tmp_path)
