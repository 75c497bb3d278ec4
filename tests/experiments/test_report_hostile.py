"""`fabriclab report DIR` on a malformed or hostile results folder (no root): one line on stderr and
exit status 2, never a traceback, a hang or a read without bound; outputs written by rename, so a
symlink planted at an output path is replaced and its target is left as it was."""

from __future__ import annotations

import copy
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli.main import main
from experiments import driver, plots, records
from experiments.runner import Flow, RunOutcome
from tests.experiments.test_results import SPEC, _raw


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """A results folder as a run leaves it: results.json, run.json, the arm records, summary and plots."""
    exp, topo = driver.prepare("ecmp-vs-spray", topo=SPEC, duration=4)
    exp.arms = exp.arms[:2]
    outcome = RunOutcome(
        raws=[(exp.arms[0], _raw(topo, 6e6, "spine1")), (exp.arms[1], _raw(topo, 5e6, "spine2"))],
        complete=True, started=0.0, finished=10.0,
        flows={a.name: [Flow("h1", "h2", 0)] for a in exp.arms}, bytes_per_flow={a.name: 1 << 20 for a in exp.arms},
    )
    out = tmp_path_factory.mktemp("good")
    records.write_manifest(out, exp, topo, 0.0, 10.0, True)
    for i, (arm, raw) in enumerate(outcome.raws):
        records.write_arm(out, i, arm.name, arm, raw, outcome.flows[arm.name], 1 << 20)
    driver.render(driver.build_document(exp, topo, outcome), out)
    return out


def _edit(key_path: tuple, value: object) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        target = doc
        for k in key_path[:-1]:
            target = target[k]
        if value is KeyError:
            del target[key_path[-1]]
        else:
            target[key_path[-1]] = value
    return change


def _json(d: Path, name: str, change: Callable[[dict], None]) -> None:
    doc = json.loads((d / name).read_text())
    change(doc)
    (d / name).write_text(json.dumps(doc))


def _text(name: str, text: str | bytes) -> Callable[[Path], None]:
    return lambda d: (d / name).write_bytes(text.encode() if isinstance(text, str) else text)


def _truncate(name: str) -> Callable[[Path], None]:
    return lambda d: (d / name).write_bytes((d / name).read_bytes()[: (d / name).stat().st_size // 2])


def _sparse(d: Path) -> None:
    with open(d / "results.json", "r+b") as f:  # a hole: no disk used, no time spent
        f.truncate((records.MAX_READ_MB << 20) + 1)


def _replace(name: str, make: Callable[[Path], None]) -> Callable[[Path], None]:
    def tamper(d: Path) -> None:
        (d / name).unlink()
        make(d / name)
    return tamper


def _rebuild_only(tamper: Callable[[Path], None]) -> Callable[[Path], None]:
    """Without results.json, `report` rebuilds the run from run.json and the arm records."""
    def both(d: Path) -> None:
        (d / "results.json").unlink()
        tamper(d)
    return both


def _arm_record(d: Path) -> str:
    return "arms/" + sorted(p.name for p in (d / "arms").iterdir())[0]


TAMPERED: dict[str, Callable[[Path], None]] = {
    "truncated results.json": _truncate("results.json"),
    "empty results.json": _text("results.json", ""),
    "binary results.json": _text("results.json", b"\xff\xfe\x00garbage"),
    "a list at the top": _text("results.json", "[1, 2]"),
    "a string at the top": _text("results.json", '"results"'),
    "an empty object": _text("results.json", "{}"),
    "nested 100000 deep": _text("results.json", "[" * 100_000 + "]" * 100_000),
    "an integer of 10000 digits": _text("results.json", '{"seed": ' + "9" * 10_000 + "}"),
    "arms not a list": lambda d: _json(d, "results.json", _edit(("arms",), "many")),
    "an arm without a name": lambda d: _json(d, "results.json", _edit(("arms", 0, "name"), KeyError)),
    "goodput as text": lambda d: _json(d, "results.json", _edit(("arms", 0, "goodput_bps"), "fast")),
    "topology null": lambda d: _json(d, "results.json", _edit(("topology",), None)),
    "fidelity a list": lambda d: _json(d, "results.json", _edit(("fidelity",), [1])),
    "an arm a number": lambda d: _json(d, "results.json", _edit(("arms", 0), 7)),
    "negative goodput, name with a newline": lambda d: _json(d, "results.json", lambda doc: doc["arms"][0].update(
        goodput_bps=-1, name="x\n\x1b[2Jevil")),
    "huge sparse results.json": _sparse,
    "results.json a FIFO": _replace("results.json", os.mkfifo),
    "results.json -> /dev/zero": _replace("results.json", lambda p: p.symlink_to("/dev/zero")),
    "results.json a directory": _replace("results.json", lambda p: p.mkdir()),
    "run.json truncated": _rebuild_only(_truncate("run.json")),
    "run.json a FIFO": _rebuild_only(_replace("run.json", os.mkfifo)),
    "run.json without topology": _rebuild_only(lambda d: _json(d, "run.json", _edit(("topology",), KeyError))),
    "run.json links a number": _rebuild_only(lambda d: _json(d, "run.json", _edit(("topology", "links"), 3))),
    "run.json arms of text": _rebuild_only(lambda d: _json(d, "run.json", _edit(("experiment", "arms"), ["a"]))),
    "arm record -> /dev/zero": _rebuild_only(
        lambda d: _replace(_arm_record(d), lambda p: p.symlink_to("/dev/zero"))(d)),
    "arm record raw a list": _rebuild_only(lambda d: _json(d, _arm_record(d), _edit(("raw",), []))),
    "arm record samples of text": _rebuild_only(lambda d: _json(d, _arm_record(d), _edit(("raw", "samples"), "x"))),
    "arm record flows of numbers": _rebuild_only(lambda d: _json(d, _arm_record(d), _edit(("flows",), [1]))),
}


def _copy(good: Path, tmp_path: Path) -> Path:
    d = tmp_path / "run"
    shutil.copytree(good, d, symlinks=True)
    return d


@pytest.mark.parametrize("name", TAMPERED)
def test_a_tampered_folder_is_one_line_and_exit_2(name, good, tmp_path, capsys):
    d = _copy(good, tmp_path)
    TAMPERED[name](d)
    assert main(["report", str(d)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fabriclab report: error: ") and "Traceback" not in err
    assert "\x1b" not in err


def test_the_size_limit_names_the_file_the_limit_and_the_setting(good, tmp_path, capsys, monkeypatch):
    d = _copy(good, tmp_path)
    monkeypatch.setenv(records.MAX_READ_ENV, "0.01")
    assert main(["report", str(d)]) == 2
    err = capsys.readouterr().err
    assert str(d / "results.json") in err and "0.01 MB" in err and records.MAX_READ_ENV in err
    monkeypatch.setenv(records.MAX_READ_ENV, "64")
    assert main(["report", str(d)]) == 0


@pytest.mark.parametrize("output", ["summary.md", "link_utilisation.png"])
def test_a_symlinked_output_is_replaced_and_its_target_untouched(output, good, tmp_path, capsys):
    d = _copy(good, tmp_path)
    outside = tmp_path / "bashrc"
    outside.write_text("export PATH=/usr/bin\n")
    (d / output).unlink()
    (d / output).symlink_to(outside)
    assert main(["report", str(d)]) == 0
    assert outside.read_text() == "export PATH=/usr/bin\n"
    assert not (d / output).is_symlink() and (d / output).stat().st_size > 100
    assert (d / "summary.md").read_text() == (good / "summary.md").read_text()


def test_a_rebuilt_results_json_replaces_a_dangling_symlink_and_creates_nothing_outside(good, tmp_path, capsys):
    d = _copy(good, tmp_path)
    outside = tmp_path / "elsewhere" / "planted.json"
    (d / "results.json").unlink()
    (d / "results.json").symlink_to(outside)
    assert main(["report", str(d)]) == 0
    assert not outside.exists() and not (d / "results.json").is_symlink()
    assert json.loads((d / "results.json").read_text())["experiment"] == "ecmp-vs-spray"


def test_a_good_folder_renders_as_before(good, tmp_path, capsys):
    d = _copy(good, tmp_path)
    assert main(["report", str(d)]) == 0
    out = capsys.readouterr().out
    assert "ecmp-single" in out and f"summary: {d / 'summary.md'}" in out
    assert (d / "summary.md").read_text() == (good / "summary.md").read_text()


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=4), value=JSON)
def test_any_subtree_of_results_json_replaced_by_any_json_is_rendered_or_refused(
        where, value, good, tmp_path_factory, monkeypatch):
    monkeypatch.setattr(plots, "PLOTS", ())  # the plots catch their own errors; the table and summary do not
    doc = json.loads((good / "results.json").read_text())
    target, key = doc, None
    for i in where:  # walk down: the i-th key or item, as far as there is one
        inner = target if key is None else target[key]
        keys = list(inner) if isinstance(inner, dict) else range(len(inner)) if isinstance(inner, list) else []
        if not keys:
            break
        target, key = inner, list(keys)[i % len(keys)]
    if key is None:
        doc = value
    else:
        target[key] = copy.deepcopy(value)
    d = tmp_path_factory.mktemp("fuzz")
    (d / "results.json").write_text(json.dumps(doc))
    assert main(["report", str(d)]) in (0, 2)
