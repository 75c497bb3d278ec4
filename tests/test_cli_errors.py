"""Bad input on the command line: one line naming the problem and the fix, exit 2, no traceback.

These fail before anything is brought up, so they need no root.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

FABRICLAB = [sys.executable, "-m", "cli"]

CASES = [
    # (arguments, fragment the one-line error must contain)
    (["probe", "--topo", "leaf-spine:spines=0"], "spines"),
    (["probe", "--topo", "leaf-spine:spines=abc"], "spines"),
    (["probe", "--topo", "leaf-spine:rate=-5"], "rate"),
    (["probe", "--topo", "leaf-spine:spine=2"], "spine"),
    (["probe", "--topo", "leaf-spine:loss=100"], "loss"),
    (["probe", "--topo", "fat-tree:k=5"], "k"),
    (["probe", "--topo", "clos:superspines=3"], "superspines"),
    (["probe", "--topo", "leaf-spine:mtu=100000"], "mtu"),
    (["probe", "--topo", "leaf-spine:spines"], "spines"),
    (["probe", "--topo", "/nonexistent/fabric.yaml"], "fabric.yaml"),
    (["up", "--topo", "in-server:gpus=0"], "gpus"),
    (["up", "--topo", "in-server:servers=2,gpus=8,bogus=1"], "bogus"),
    (["probe", "--mode", "hash"], "--mode"),
    (["probe", "--entropy", "random"], "--entropy"),
    (["probe", "--packets", "lots"], "--packets"),
    (["nonsense"], "nonsense"),
]


@pytest.mark.parametrize(("args", "fragment"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_is_one_line(args, fragment):
    out = subprocess.run([*FABRICLAB, *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out
    err = out.stderr.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert fragment in err, err


def test_bad_custom_file_names_the_file(tmp_path):
    bad = tmp_path / "fabric.yaml"
    bad.write_text("name: x\nnodes: [{name: Bad-Name, role: spine}]\nlinks: []\n")
    out = subprocess.run([*FABRICLAB, "probe", "--topo", str(bad)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "fabric.yaml" in out.stderr


def test_help_explains_every_command():
    out = subprocess.run([*FABRICLAB, "--help"], capture_output=True, text=True, timeout=60)
    for cmd in ("doctor", "clean", "up", "probe", "demo", "srd", "bench"):
        assert cmd in out.stdout
