"""Every lab is complete, its checker passes on the solution and fails on the starter code, and its
steps carry the size flags the smoke run shrinks. (The steps themselves run in test_lab_steps.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from labs import catalogue, grading
from labs.catalogue import load_checker
from tests.labs import shell_blocks

LABS = catalogue.all_labs()
IDS = [lab.slug for lab in LABS]


def test_there_are_seven_labs_numbered_in_order():
    assert [lab.number for lab in LABS] == [1, 2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize("lab", LABS, ids=IDS)
def test_lab_is_complete(lab):
    text = (lab.path / "README.md").read_text()
    for section in ("## Background", "## Steps", "## What to observe", "## Questions", "## What to hand in"):
        assert section in text, f"{lab.slug}/README.md has no '{section}' section"
    # Students write their guesses down before they measure: a prediction step before the first command.
    steps = text.split("## Steps", 1)[1]
    assert "**Predict first.**" in steps and steps.index("**Predict first.**") < steps.index("```sh")
    # Every step that brings a fabric up has a way through without root.
    assert "**Without root.**" in steps
    if "fabriclab live " in steps:
        assert "`--fake`" in steps or "live --fake" in steps, f"{lab.slug}: a live-view step without a no-root route"
    assert lab.checker.is_file()
    assert any((lab.path / "starter").glob("*.py")), "starter/ has no code"
    solution = list((lab.path / "solution").glob("*.py"))
    assert solution, "solution/ has no code"
    for f in solution:
        assert "SOLUTION" in f.read_text().split("\n\n", 1)[0], f"{f} does not say it is the answer key"
    # The answer key sits outside the lab's folder, which students copy from.
    assert not (lab.path / "solution" / "ANSWERS.md").exists(), "the instructor's answers are in solution/"
    assert (catalogue.LABS_DIR / "answers" / f"{lab.slug}.md").is_file(), "no answer key in labs/answers/"
    assert "TODO" in "".join(f.read_text() for f in (lab.path / "starter").glob("*.py"))


@pytest.mark.parametrize("lab", LABS, ids=IDS)
def test_checker_passes_on_the_solution(lab):
    checks = load_checker(lab).check(lab.path / "solution")
    text, code = grading.render(checks)
    assert code == 0, text


@pytest.mark.parametrize("lab", LABS, ids=IDS)
def test_checker_fails_on_the_starter(lab):
    checks = load_checker(lab).check(lab.path / "starter")
    text, code = grading.render(checks)
    assert code == 1, text
    assert all(c.reason for c in checks)


@pytest.mark.parametrize("lab", LABS, ids=IDS)
def test_steps_have_sizes_and_name_existing_plots(lab):
    blocks = shell_blocks.blocks(lab.path / "README.md")
    assert blocks, f"{lab.slug}/README.md has no ```sh steps"
    for block in blocks:
        for command in shell_blocks.commands(block.text):
            problem = shell_blocks.missing_size(command)
            assert problem is None, f"{block.where()}: {problem}"
    # The plots a lab tells students to open are ones the experiments (or the lab's own code) write.
    from experiments import plots

    known = set(re.findall(r"\"(\w+\.png)\"", Path(plots.__file__).read_text()))
    known |= {m for f in lab.path.rglob("*.py") for m in re.findall(r"(\w+\.png)", f.read_text())}
    named = set(re.findall(r"\b(\w+\.png)\b", (lab.path / "README.md").read_text()))
    assert named <= known, f"{lab.slug} names plots no experiment writes: {sorted(named - known)}"
