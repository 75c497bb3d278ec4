"""The lab machinery without any lab: finding labs, grading helpers, the commands, README step parsing."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from labs import catalogue, grading, script
from tests.labs import shell_blocks

FABRICLAB = [sys.executable, "-m", "cli"]


def _lab(root: Path, folder: str, title: str = "A lab", body: str = "What it is about.\n") -> Path:
    path = root / folder
    path.mkdir(parents=True)
    (path / "README.md").write_text(f"# {title}\n\n{body}\n## Steps\n")
    return path


def test_catalogue_finds_numbered_folders_with_a_readme(tmp_path):
    _lab(tmp_path, "02-second", "Second", "Two.\nStill two.\n")
    _lab(tmp_path, "01-first", "First")
    (tmp_path / "03-no-readme").mkdir()
    (tmp_path / "notes").mkdir()
    labs = catalogue.all_labs(tmp_path)
    assert [(lab.number, lab.title) for lab in labs] == [(1, "First"), (2, "Second")]
    assert labs[1].summary == "Two. Still two."
    assert catalogue.find_lab(2, tmp_path).slug == "02-second"
    with pytest.raises(catalogue.LabError, match="no lab 7; the labs are 1, 2"):
        catalogue.find_lab(7, tmp_path)


def test_thresholds_say_value_and_bound():
    assert grading.at_least("goodput", 3.0, 2.0).passed
    c = grading.at_most("imbalance", 1.8, 1.3, "max/min")
    assert not c.passed and "max/min = 1.8 > 1.3" in c.reason
    assert not grading.at_least("x", None, 1).passed
    assert grading.close_to("p", 10.5, 10.0, 0.1).passed
    assert not grading.close_to("p", "10", 10.0, 0.1).passed


def test_student_code_errors_are_failed_checks_naming_the_function(tmp_path):
    (tmp_path / "work.py").write_text(
        "def ok(x):\n    return x + 1\n\n"
        "def todo():\n    raise NotImplementedError('TODO: count the collisions')\n\n"
        "def broken():\n    return {}['missing']\n")
    mod = grading.load_module(tmp_path, "work.py")
    assert not isinstance(mod, grading.Check)
    assert grading.call(mod, "ok", 1) == (2, None)
    _, c = grading.call(mod, "todo")
    assert c and not c.passed and "todo() is not written yet" in c.reason and "collisions" in c.reason
    _, c = grading.call(mod, "broken")
    assert c and "KeyError" in c.reason and "work.py line 8" in c.reason
    _, c = grading.call(mod, "absent")
    assert c and "no function absent()" in c.reason
    missing = grading.load_module(tmp_path, "other.py")
    assert isinstance(missing, grading.Check) and not missing.passed
    (tmp_path / "bad.py").write_text("def f(:\n")
    bad = grading.load_module(tmp_path, "bad.py")
    assert isinstance(bad, grading.Check) and "SyntaxError" in bad.reason


def test_agrees_compares_student_code_with_a_reference_on_every_case(tmp_path):
    (tmp_path / "work.py").write_text(
        "import math\n\n"
        "def half(x):\n    return x / 2\n\n"
        "def sloppy(x):\n    return x / 2 + (0.2 if x > 5 else 0)\n\n"
        "def ratio(a, b):\n    return a / b if b else math.inf\n\n"
        "def evens(xs):\n    return [x for x in xs if x % 2 == 0]\n\n"
        "def todo(x):\n    raise NotImplementedError('TODO: halve it')\n")
    mod = grading.load_module(tmp_path, "work.py")
    assert not isinstance(mod, grading.Check)
    cases = {"x=1": (1,), "x=10": (10,)}
    c = grading.agrees("halving", mod, "half", cases, lambda x: x / 2, what="division")
    assert c.passed and "all 2 cases" in c.reason
    c = grading.agrees("halving", mod, "sloppy", cases, lambda x: x / 2, rel=0.01, what="division")
    assert not c.passed and "on x=10 gave 5.2; division gives 5 within 1 %" in c.reason
    assert grading.agrees("halving", mod, "sloppy", cases, lambda x: x / 2, rel=0.05).passed
    c = grading.agrees("ratio", mod, "ratio", {"b=0": (1, 0), "b=2": (1, 2)},
                       lambda a, b: a / b if b else math.inf)
    assert c.passed
    c = grading.agrees("evens", mod, "evens", {"1..4": ([1, 2, 3, 4],)}, lambda xs: [2, 4])
    assert c.passed
    c = grading.agrees("evens", mod, "evens", {"1..4": ([1, 2, 3, 4],)}, lambda xs: [2])
    assert not c.passed and "gave [2, 4]" in c.reason
    c = grading.agrees("halving", mod, "todo", cases, lambda x: x / 2)
    assert not c.passed and "todo() is not written yet" in c.reason and "(on x=1)" in c.reason
    c = grading.agrees("halving", mod, "evens", cases, lambda x: x / 2)
    assert not c.passed and "TypeError" in c.reason


def test_a_student_file_run_as_a_script_shows_through_the_labs_show_py(tmp_path, capsys):
    lab = _lab(tmp_path, "01-first")
    (lab / "show.py").write_text(
        "from labs.catalogue import LabError\n"
        "from labs.script import attempt\n\n"
        "def main(student, argv):\n"
        "    if argv == ['missing']:\n"
        "        raise LabError('no results under missing')\n"
        "    print('double:', attempt(student.double, 21), 'todo:', attempt(student.todo))\n"
        "    return 0\n")
    (tmp_path / "work.py").write_text(
        "def double(x):\n    return 2 * x\n\n"
        "def todo():\n    raise NotImplementedError('TODO')\n")
    student = grading.load_module(tmp_path, "work.py")
    assert not isinstance(student, grading.Check)
    assert script.run(1, student, [], root=tmp_path) == 0
    assert capsys.readouterr().out == "double: 42 todo: None\n"
    assert script.run(1, student, ["missing"], root=tmp_path) == 2
    assert capsys.readouterr().err == "work.py: no results under missing\n"
    assert script.run(2, student, [], root=tmp_path) == 2
    assert "no lab 2" in capsys.readouterr().err
    (lab / "show.py").unlink()
    assert script.run(1, student, [], root=tmp_path) == 2
    assert "has nothing to show" in capsys.readouterr().err


def test_results_are_found_in_a_run_or_the_newest_under_a_root(tmp_path):
    for stamp in ("20260101-000000", "20260102-000000"):
        run = tmp_path / "exp" / stamp
        run.mkdir(parents=True)
        (run / "results.json").write_text(json.dumps({"experiment": "exp", "stamp": stamp,
                                                      "arms": [{"name": "a"}, {"name": "b", "error": "x"}]}))
    assert grading.load_results(tmp_path, "exp")["stamp"] == "20260102-000000"
    assert grading.load_results(tmp_path / "exp" / "20260101-000000", "exp")["stamp"] == "20260101-000000"
    with pytest.raises(catalogue.LabError, match="fabriclab run other"):
        grading.load_results(tmp_path, "other")
    with pytest.raises(catalogue.LabError, match="holds 'exp', not 'other'"):
        grading.load_results(tmp_path / "exp" / "20260101-000000", "other")
    doc = grading.load_results(tmp_path, "exp")
    assert grading.arm(doc, "a") == {"name": "a"}
    with pytest.raises(catalogue.LabError, match="failed in this run"):
        grading.arm(doc, "b")
    with pytest.raises(catalogue.LabError, match="arms: a, b"):
        grading.arm(doc, "c")


def test_render_gives_a_verdict_and_exit_code():
    text, code = grading.render([grading.passed("a", "fine"), grading.failed("b", "too slow")])
    assert code == 1 and "PASS  a: fine" in text and "FAIL  b: too slow" in text and "1 of 2" in text
    assert grading.render([grading.passed("a", "fine")])[1] == 0
    assert grading.render([])[1] == 1


@pytest.mark.parametrize(("args", "fragment"), [
    (["lab", "check", "99"], "no lab 99"),
    (["lab", "check", "x"], "not a lab number"),
    (["lab", "check", "1", "/nonexistent/results"], "does not exist"),
])
def test_lab_command_bad_input_is_one_line(args, fragment):
    out = subprocess.run([*FABRICLAB, *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out
    assert fragment in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_readme_blocks_are_shrunk_and_sizeless_steps_reported(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# L\n\n```sh\nfabriclab run ecmp-vs-spray --duration 20 \\\n  --out results/lab1\n"
                      "# a comment\nfabriclab lab check 1 results/lab1\n```\n\n```text\nnot run\n```\n"
                      "```bash\nfabriclab live --mode ecmp\n```\n")
    found = shell_blocks.blocks(readme)
    assert [b.line for b in found] == [4, 14]
    script = shell_blocks.smoke_script(found[0])
    assert "fabriclab run ecmp-vs-spray --duration 3 --out results/lab1" in script
    assert "rc=0; fabriclab lab check 1 results/lab1 || rc=$?; test $rc -le 1" in script
    assert shell_blocks.missing_size(shell_blocks.commands(found[1].text)[0]) is not None
    assert shell_blocks.missing_size("fabriclab probe --packets 100 --mode spray") is None


def test_a_checker_may_define_dataclasses(tmp_path):
    # dataclasses resolve a class's module through sys.modules while the checker is being imported
    lab = _lab(tmp_path, "01-first")
    (lab / "check.py").write_text(
        "from __future__ import annotations\nfrom dataclasses import dataclass\n\n"
        "@dataclass(frozen=True)\nclass Case:\n    name: str\n\n"
        "def check(target):\n    return [Case('x')]\n")
    assert catalogue.load_checker(catalogue.find_lab(1, tmp_path)).check(tmp_path)[0].name == "x"
