"""Answers that once passed a lab's checker without doing what the lab asks (each kept as a fixture in
lab_cheats/): answers copied for the fixed cases, fabriclab's own receiver called in place of the
student's, a model one packet off that hid in a tolerance, stalls of the wrong shape, and a results
folder with one easy arm. Each now fails the checks named here, with a reason, and each lab's solution
still passes on the same seeds. No root; a few seconds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from labs import catalogue, grading
from labs.catalogue import load_checker

CHEATS = Path(__file__).resolve().parent / "lab_cheats"
LABS = {lab.number: lab for lab in catalogue.all_labs()}
MODULES = {1: "hotlinks.py", 2: "reorder.py", 3: "recovery.py", 7: "model.py"}
SEEDS = (1, 2)
# Cheats that change a function or two of the solution and keep the rest.
ON_SOLUTION = {"lab01_copied_cases", "lab03_one_short", "lab07_whole_write", "lab07_negative_stall",
               "lab07_hardcoded_steps_lost"}
# One checker module per lab for the whole file: lab 7's simulated jobs are cached in it.
CHECKERS = {n: load_checker(LABS[n]) for n in MODULES}


def student_file(lab: int, fixture: str) -> str:
    """The fixture as a student would hand it in: a cheat that changes a function or two of the lab's
    solution holds only those (later definitions replace earlier ones), the others the whole file."""
    cheat = (CHEATS / f"{fixture}.py").read_text()
    if fixture not in ON_SOLUTION:
        return cheat
    solution = (LABS[lab].path / "solution" / MODULES[lab]).read_text()
    body = cheat.split('"""', 2)[2].replace("from __future__ import annotations", "")
    return f"{solution}\n\n# ---- {fixture}\n{body}"


def grade(tmp_path: Path, lab: int, fixture: str, seed: int) -> dict[str, grading.Check]:
    folder = tmp_path / fixture
    folder.mkdir(exist_ok=True)
    (folder / MODULES[lab]).write_text(student_file(lab, fixture))
    grading.use_seed(seed)
    return {c.name: c for c in CHECKERS[lab].check(folder)}


@pytest.mark.parametrize("seed", SEEDS[:1])
@pytest.mark.parametrize(("lab", "fixture", "must_fail", "reason"), [
    (1, "lab01_copied_cases", {"collision probability", "busiest uplink"}, "gave"),
    (2, "lab02_calls_the_receiver", {"load reorder.py"}, "imports labs, fabriclab's own code"),
    (2, "lab02_lazy_receiver", {"reorder distances", "buffer, unordered delivery", "buffer, ordered delivery"},
     "raised"),
    (3, "lab03_one_short", {"transmissions"}, "gave 301; the transport's sender in transport.sim.simnet gives 300"),
    (7, "lab07_whole_write", {"async_checkpoint_stall: a checkpoint every 1 step(s)"}, "expected 0.85x to 1.25x"),
    (7, "lab07_negative_stall", {"async_checkpoint_stall"}, "cannot be negative"),
    (7, "lab07_hardcoded_steps_lost", {"steps_lost: drawn cases"}, "the steps done since the last checkpoint"),
])
def test_a_cheat_fails_with_a_reason(tmp_path, lab, fixture, must_fail, reason, seed):
    checks = grade(tmp_path, lab, fixture, seed)
    assert must_fail <= set(checks), sorted(checks)
    failing = {name: checks[name] for name in must_fail}
    assert not any(c.passed for c in failing.values()), failing
    assert any(reason in c.reason for c in failing.values()), failing
    _, code = grading.render(checks.values())
    assert code == 1


# Lab 3's sender runs cost a second or two a seed: one seed there, two elsewhere.
@pytest.mark.parametrize(("lab", "seed"), [(lab, seed) for lab in sorted(MODULES) for seed in SEEDS
                                           if lab != 3 or seed == SEEDS[0]])
def test_the_solution_passes_on_the_same_seeds(lab, seed):
    grading.use_seed(seed)
    checks = CHECKERS[lab].check(LABS[lab].path / "solution")
    assert checks and all(c.passed for c in checks), [c for c in checks if not c.passed]


def test_the_drawn_cases_change_with_the_seed_and_repeat_with_it():
    check = CHECKERS[3]
    grading.use_seed(11)
    first = check._random_sent_cases()
    grading.use_seed(12)
    other = check._random_sent_cases()
    grading.use_seed(11)
    assert check._random_sent_cases() == first and first != other


def test_the_student_cannot_reach_fabriclab_but_the_checker_still_can(tmp_path):
    (tmp_path / "reorder.py").write_text("import sys\n\ndef reorder_distances(a):\n"
                                         "    return sorted(n for n in sys.modules if n.startswith('transport'))\n")
    mod = grading.load_module(tmp_path, "reorder.py")
    assert not isinstance(mod, grading.Check)
    got, err = grading.call(mod, "reorder_distances", [])
    assert err is None and got == []
    assert "transport.core.connection" in sys.modules
    from transport.core.connection import Connection  # the checker's own imports are untouched after the call

    assert Connection


def test_a_lab7_run_with_one_easy_arm_fails_and_names_the_missing_arms(tmp_path):
    ref = next((LABS[7].path / "reference").glob("training/*/results.json"))
    doc = json.loads(ref.read_text())
    doc["arms"] = [a for a in doc["arms"] if a["name"] == "spray"]
    run = tmp_path / "training" / "20260101-000000"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps(doc))
    checks = CHECKERS[7].check(tmp_path)
    assert [c.passed for c in checks] == [False]
    assert "missing ecmp, spray-far-sync, spray-far-async" in checks[0].reason


def test_the_command_prints_the_seed_and_repeats_its_cases():
    cmd = [sys.executable, "-m", "cli", "lab", "check", "1", str(LABS[1].path / "solution"), "--seed", "4242"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "random cases drawn with seed 4242" in out.stdout


def _lab7_run(tmp_path: Path, arms: dict[str, dict]) -> Path:
    """The lab 7 reference run with its arms replaced: name -> fields set on a copy of `spray`."""
    ref = next((LABS[7].path / "reference").glob("training/*/results.json"))
    doc = json.loads(ref.read_text())
    spray = next(a for a in doc["arms"] if a["name"] == "spray")
    doc["arms"] = [{**spray, "name": name, **fields} for name, fields in arms.items()]
    doc["analysis"]["training"] = {name: doc["analysis"]["training"]["spray"] for name in arms}
    run = tmp_path / "training" / "20260101-000000"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps(doc))
    return tmp_path


def test_a_lab7_cut_run_is_graded_on_its_rollback(tmp_path):
    checks = {c.name: c for c in CHECKERS[7].check(_lab7_run(tmp_path / "a", {"spray-cut": {"rollbacks": 1,
                                                                                          "steps_lost": 2}}))}
    assert set(checks) == {"spray-cut: the job", "the cut: a rollback"} and all(c.passed for c in checks.values())
    none = CHECKERS[7].check(_lab7_run(tmp_path / "b", {"spray-cut": {"rollbacks": 0, "steps_lost": 0}}))
    assert [c.name for c in none if not c.passed] == ["the cut: a rollback"]
