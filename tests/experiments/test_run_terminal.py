"""`fabriclab run` in a terminal, Ctrl-C pressed during its second arm: docs/experiments.md's promise that "Ctrl-C
tears the network down, keeps the finished arms and marks the run incomplete"."""

from __future__ import annotations

import json

import pytest

from tests.emulator_helpers import assert_no_leftovers
from tests.terminal import FABRICLAB, terminal
from tests.test_docs import flat, page

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(240)]


def test_ctrl_c_keeps_the_finished_arms_and_marks_the_run_incomplete(tmp_path):
    assert "Ctrl-C tears the network down, keeps the finished arms and marks the run incomplete" in flat(
        page("experiments.md"))
    out = tmp_path / "results"
    with terminal([FABRICLAB, "run", "ecmp-vs-spray", "--duration", "3", "--out", str(out)], cwd=tmp_path) as term:
        term.wait_for(r"spray: traffic", 150)  # the progress line: the first arm done, the second running
        term.send("\x03")
        assert term.exit_status(120) == 130
        assert "run interrupted: finished arms kept, marked incomplete" in term.text
    (run_dir,) = (out / "ecmp-vs-spray").iterdir()
    doc = json.loads((run_dir / "results.json").read_text())
    assert not doc["complete"]
    arms = {a["name"]: a.get("error") for a in doc["arms"]}
    assert arms == {"ecmp-single": None, "spray": "interrupted (Ctrl-C)"}
    assert "incomplete run" in (run_dir / "summary.md").read_text()
    assert_no_leftovers()


def test_closing_the_terminal_tears_the_running_arm_down(tmp_path):
    """A dropped ssh session hangs the run up (SIGHUP): the arm's fabric goes down as on SIGTERM."""
    out = tmp_path / "results"
    with terminal([FABRICLAB, "run", "ecmp-vs-spray", "--duration", "3", "--out", str(out)], cwd=tmp_path) as term:
        term.wait_for(r"ecmp-single: traffic", 150)
        assert term.hang_up(120) is not None  # it ended by itself, not by the signal
    (run_dir,) = (out / "ecmp-vs-spray").iterdir()
    (arm,) = (run_dir / "arms").iterdir()
    assert json.loads(arm.read_text())["raw"]["error"] == "terminated (SIGHUP)"
    assert_no_leftovers()
