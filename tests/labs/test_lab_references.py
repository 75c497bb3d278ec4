"""Every lab ships a reference run (labs/NN/reference/, made by scripts/lab-references.sh with the lab's
own commands), so that its results checker, its show script and its measured questions work without
root: the checker passes on it, the solution's show script prints from it, and the run trusted itself."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from labs.catalogue import all_labs

LABS = all_labs()


@pytest.fixture(params=LABS, ids=[lab.path.name for lab in LABS])
def lab(request):
    return request.param


def _runs(lab):
    return sorted((lab.path / "reference").glob("*/*/results.json"))


def test_reference_run_is_there_and_small(lab):
    runs = _runs(lab)
    assert runs, f"{lab.path.name}: no reference run (sudo bash scripts/lab-references.sh {lab.number})"
    for r in runs:
        assert (r.parent / "summary.md").is_file()
        assert list(r.parent.glob("*.png")), f"{r.parent}: no plots"
        size = sum(f.stat().st_size for f in r.parent.iterdir())
        assert size < 2_000_000, f"{r.parent} holds {size} bytes: keep results.json, summary.md and plots only"


def test_reference_run_trusted_itself(lab):
    for r in _runs(lab):
        doc = json.loads(r.read_text())
        assert doc["complete"], r
        untrusted = [a["name"] for a in doc["arms"] if not a["fidelity"]["trusted"]]
        assert not untrusted, f"{r}: arms {untrusted} untrusted; remake it on an idle machine"


def test_checker_passes_on_the_reference_run(lab):
    out = subprocess.run([sys.executable, "-m", "cli", "lab", "check", str(lab.number), str(lab.path / "reference")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PASS" in out.stdout and "FAIL" not in out.stdout


# Labs 4 to 6 have no show script: their code is graded by the checker alone.
SHOWN = [lab for lab in LABS if (lab.path / "show.py").is_file()]


@pytest.mark.parametrize("shown", SHOWN, ids=[lab.path.name for lab in SHOWN])
def test_show_script_prints_from_the_reference_run(shown):
    lab = shown
    assert SHOWN, "no lab has a show script"
    solution = next(p for p in (lab.path / "solution").glob("*.py"))
    out = subprocess.run([sys.executable, str(solution), str(lab.path / "reference")], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "TODO" not in out.stdout and out.stdout.strip()
