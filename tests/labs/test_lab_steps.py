"""Labs must not rot: every lab README's shell steps run, in order, at smoke size, on a real fabric.

Each lab runs in a scratch folder holding a copy of `labs/` (as a student's clone would), with the
venv's `fabriclab` first on PATH. Sizes are shrunk by tests/labs/shell_blocks.py; everything else runs
as written, so a step that no longer works fails here with the README line it came from.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from labs import catalogue
from tests.emulator_helpers import new_leftovers
from tests.labs import shell_blocks

REPO = Path(__file__).resolve().parents[2]
LABS = catalogue.all_labs()
BLOCK_TIMEOUT_S = 420


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS, ids=[lab.slug for lab in LABS])
def test_lab_steps_run_at_smoke_size(lab, tmp_path):
    work = tmp_path / "clone"
    work.mkdir()
    shutil.copytree(REPO / "labs", work / "labs", ignore=shutil.ignore_patterns("__pycache__"))
    if (REPO / "docs" / "examples").is_dir():
        shutil.copytree(REPO / "docs" / "examples", work / "docs" / "examples")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    try:
        for block in shell_blocks.blocks(lab.path / "README.md"):
            script = shell_blocks.smoke_script(block)
            out = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True,
                                 timeout=BLOCK_TIMEOUT_S)
            assert out.returncode == 0, (f"{block.where()} failed (exit {out.returncode}):\n{script}\n"
                                         f"--- stdout\n{out.stdout[-3000:]}\n--- stderr\n{out.stderr[-3000:]}")
    finally:
        left = {k: v for k, v in new_leftovers().items() if v}
        if left:
            subprocess.run([sys.executable, "-m", "cli", "clean"], capture_output=True, timeout=120)
        assert not left, f"{lab.slug} left {left}"
