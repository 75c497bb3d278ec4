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
    (["train-node", "--name", "rank0", "--nodes", "rank0"], "NAME=IP"),
    (["train-node", "--name", "rank0", "--nodes", "rank0=127.0.0.1:7000,near0=127.0.0.1:7001",
      "--checkpoint-mode", "sometimes"], "--checkpoint-mode"),
    (["train-node", "--name", "rank5", "--nodes", "rank0=127.0.0.1:7000,near0=127.0.0.1:7001"], "rank5"),
    (["train-node", "--name", "rank0", "--nodes", "rank0=127.0.0.1:7000,near0=127.0.0.1:7001",
      "--checkpoint-host", "far0"], "--checkpoint-host far0"),
    (["train-node", "--name", "rank0", "--nodes", "rank1=127.0.0.1:7000,rank0=127.0.0.1:7002,near0=127.0.0.1:7001",
      "--steps", "0"], "--steps"),
    (["run", "ecmp-vs-spray", "--repetitions", "0"], "--repetitions"),
    (["run", "training", "--topo", "leaf-spine:spines=2,leaves=4,hosts=2"], "h7-leaf3"),
    (["run", "allreduce", "--seed", "-1"], "--seed"),
    (["live", "--seed", "-2"], "--seed"),
    (["allreduce", "--rank", "0", "--peers", "127.0.0.1:7000", "--size", "1", "--seed", "-1"], "--seed"),
    (["bench", "capacity", "--start", "0"], "argument --start"),
    (["bench", "capacity", "--steps", "-1"], "argument --steps"),
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


# -- hostile topology specs and files (each was a traceback or ran away before it was checked) --------

FABRIC = "nodes: [{name: s1, role: leaf}, {name: h1, role: host}]\n"


def _one_line(args: list[str], env: dict[str, str] | None = None) -> str:
    out = subprocess.run([*FABRICLAB, *args], capture_output=True, text=True, timeout=60, env=env)
    err = out.stderr.strip()
    assert out.returncode == 2, out
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def _alias_bomb(levels: int = 9) -> str:
    """`params` of ten-fold aliases, `levels` deep: a few hundred bytes that stand for 10**levels strings
    (safe_load shares them; they multiply when the topology is written out as JSON at bring-up)."""
    lines = ["params:", '  l0: &l0 ["x","x","x","x","x","x","x","x","x","x"]']
    for i in range(1, levels):
        lines.append(f"  l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 10)}]")
    return "\n".join(lines) + "\n"


def test_a_number_too_large_for_a_float_is_one_line():
    assert "401 digits" in _one_line(["probe", "--topo", "leaf-spine:rate=1" + "0" * 400])


def test_a_path_component_too_long_is_one_line(tmp_path):
    err = _one_line(["probe", "--topo", str(tmp_path / ("a" * 300) / "fabric.yaml")])
    assert "File name too long" in err and len(err) < 300


@pytest.mark.parametrize("end", ["[h1]", "{x: 1}"], ids=["list", "map"])
def test_a_link_end_that_is_not_a_name_is_one_line(tmp_path, end):
    bad = tmp_path / "fabric.yaml"
    bad.write_text(FABRIC + f"links: [{{a: {end}, b: s1}}]\n")
    assert "links[0].a" in _one_line(["probe", "--topo", str(bad)])


@pytest.mark.parametrize(("top", "fragment"), [
    ("description: 2020-01-01\n", "description is a date"),
    ("params: {built: 2020-01-01}\n", "params.built is a date"),
    ("params: {blob: !!binary aGVsbG8=}\n", "params.blob is a bytes"),
    ("params: {big: " + "9" * 30 + "}\n", "params.big is a whole number too large"),
], ids=["description-date", "params-date", "params-binary", "params-bignum"])
def test_params_that_are_not_json_are_refused_at_load(tmp_path, top, fragment):
    bad = tmp_path / "fabric.yaml"
    bad.write_text(top + FABRIC + "links: [{a: h1, b: s1}]\n")
    assert fragment in _one_line(["probe", "--topo", str(bad)])


def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path):
    bad = tmp_path / "fabric.yaml"
    bad.write_text(_alias_bomb() + FABRIC + "links: [{a: h1, b: s1}]\n")
    assert bad.stat().st_size < 700
    assert "aliases (*l0) are not allowed" in _one_line(["probe", "--topo", str(bad)])


def test_node_and_link_caps_and_their_settings(tmp_path, monkeypatch):
    from topologies import SpecError, parse_spec

    err = _one_line(["probe", "--topo", "leaf-spine:hosts=10000"])
    assert "leaf-spine 2x2x10000 has 20004 nodes" in err and "FABRICLAB_MAX_NODES" in err
    assert "FABRICLAB_MAX_LINKS" in _one_line(["probe", "--topo", "leaf-spine:spines=100,leaves=100,hosts=1"])
    many = tmp_path / "many.yaml"
    many.write_text(f"hosts: [{', '.join(f'h{i}' for i in range(3000))}]\nnodes: []\nlinks: []\n")
    assert "3000 nodes" in _one_line(["probe", "--topo", str(many)])
    # The setting raises the cap (the topology is only described, nothing is brought up).
    spec = "leaf-spine:spines=2,leaves=2,hosts=1100"
    with pytest.raises(SpecError, match="2204 nodes"):
        parse_spec(spec)
    monkeypatch.setenv("FABRICLAB_MAX_NODES", "3000")
    assert len(parse_spec(spec).hosts) == 2200
    monkeypatch.setenv("FABRICLAB_MAX_NODES", "x")
    assert "FABRICLAB_MAX_NODES='x'" in _one_line(["probe", "--topo", "leaf-spine"])


def test_a_type_that_raises_oserror_or_runtimeerror_is_a_usage_error(capsys):
    from cli.args import OneLineParser

    def refuses(text: str) -> str:
        if text == "loop":
            raise RuntimeError(f"Symlink loop from {text!r}")
        raise OSError(36, "File name too long")

    parser = OneLineParser(prog="fabriclab x")
    parser.add_argument("--file", type=refuses)
    for value, words in (("loop", "Symlink loop from 'loop'"), ("a" * 300, "File name too long")):
        with pytest.raises(SystemExit) as stop:
            parser.parse_args(["--file", value])
        err = capsys.readouterr().err.strip()
        assert stop.value.code == 2 and len(err.splitlines()) == 1 and len(err) < 200, err
        assert err.startswith("fabriclab x: error: argument --file: ") and words in err


def test_clean_without_root_says_it_needs_root(monkeypatch, capsys):
    # "nothing to clean" would be wrong: without root the run records cannot all be read.
    import os

    from cli.main import main

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert main(["clean"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "clean needs root" in err and "sudo" in err, err
