"""A run's records on disk (experiments.records), through the runner with its fabric replaced by
simulated endpoints: every finished arm's record survives a crash in a later arm and `fabriclab
report` rebuilds the run from them; two runs in one second get their own directories; files are
written whole or not at all; an unwritable --out is one line and exit 2."""

from __future__ import annotations

import json
import os
import signal
import threading
from functools import cache
from pathlib import Path

import pytest

from experiments import driver, records, results, runner, schema
from experiments.model import Arm
from tests.experiments.simulated_endpoints import receiver_record, sender_record, transfer, write
from transport.sim.simnet import PathSpec

SPEC = "leaf-spine:spines=2,leaves=2,hosts=1,rate=10"
SIZE = 300_000
T0 = 1000.0


@cache
def _records(index: int, src: str, dst: str) -> tuple[dict, dict]:
    run = transfer(SIZE, PathSpec(rate_bps=10e6, delay=0.0005), seed=index + 1, connection_id=100 + index)
    return sender_record(run, SIZE), receiver_record([run])


def _samples(topo, secs: float, rate: float) -> list[dict]:
    out = []
    for i in range(int(secs / 0.5) + 1):
        links = [{"name": lk.name, "a": lk.a, "b": lk.b, "tx_bytes": int(rate * i * 0.5), "rx_bytes": 0,
                  "tx_packets": int(rate * i * 0.5) // 1400, "rx_packets": 0, "drops": 0,
                  "util_ab": 8 * rate / (lk.rate_mbps * 1e6), "util_ba": 0.0} for lk in topo.links]
        out.append({"t": T0 + i * 0.5, "links": links})
    return out


class FakeFabric:
    """runner.run_arm without a fabric: the arm's endpoints' files from transfers on the simulated
    network, link and CPU samples made up; the arm named `crash_in` takes the process down."""

    def __init__(self, crash_in: str | None = None) -> None:
        self.crash_in = crash_in
        self.returned: dict[str, dict] = {}

    def __call__(self, exp, arm: Arm, topo, flows, duration, seed, bytes_per_flow, raw_dir: Path, reporter):
        if arm.name == self.crash_in:
            raise SystemExit("killed in the middle of an arm")
        raw_dir.mkdir(parents=True, exist_ok=True)
        for i, f in enumerate(flows):
            sender, receiver = _records(i, f.src, f.dst)
            write(raw_dir, f"send-{i}-{f.src}-{f.dst}", sender)
            write(raw_dir, f"recv-{f.dst}", receiver)
        raw = {"t0": T0, "traffic_s": 2.0, "samples": _samples(topo, 2.0, 500_000.0),
               "cpu": [{"t": T0 + 0.5 * (i + 1), "dt": 0.5, "idle": 0.6 - 0.05 * i} for i in range(4)],
               "qdisc_before": {}, "qdisc_after": {}, "faults": [], "fault_errors": [], "endpoint_errors": [],
               "bring_up_s": 1.0, "teardown_s": 0.5, "wall_s": 4.0, "endpoints": runner.read_endpoints(raw_dir)}
        self.returned[arm.name] = json.loads(json.dumps(raw))
        return raw


def _leftover_temps(root: Path) -> list[Path]:
    return [p for p in root.rglob("*.tmp")]


def test_a_crash_in_the_last_arm_keeps_the_finished_arms_and_report_rebuilds_the_run(tmp_path, monkeypatch, capsys):
    fake = FakeFabric(crash_in="tcp-ecmp")
    monkeypatch.setattr(runner, "run_arm", fake)
    exp, topo = driver.prepare("ecmp-vs-spray", topo=SPEC, duration=2)
    with pytest.raises(SystemExit):
        driver.execute(exp, topo, out_root=tmp_path)
    (run_dir,) = (tmp_path / "ecmp-vs-spray").iterdir()
    assert not (run_dir / "results.json").exists() and not _leftover_temps(tmp_path)
    kept = sorted((run_dir / records.ARMS_DIR).iterdir())
    assert [p.name for p in kept] == ["000-ecmp-single.json", "001-spray.json"]
    for path, name in zip(kept, ("ecmp-single", "spray"), strict=True):
        rec = json.loads(path.read_text())
        assert rec["arm"]["name"] == name
        assert rec["raw"]["samples"] == fake.returned[name]["samples"]
        assert rec["raw"]["cpu"] == fake.returned[name]["cpu"]

    from cli.main import main

    assert main(["report", str(run_dir)]) == 0
    assert "ecmp-single" in capsys.readouterr().out
    doc = results.load(run_dir)
    assert schema.validate(doc) == []
    assert not doc["complete"] and [a["name"] for a in doc["arms"]] == ["ecmp-single", "spray"]
    assert (run_dir / "summary.md").read_text().count("incomplete run") == 1
    assert (run_dir / "link_utilisation.png").stat().st_size > 1000
    # The rebuilt arms are what the run would have computed from the same raw material.
    for arm in doc["arms"]:
        want = results.arm_result(next(a for a in exp.arms if a.name == arm["name"]), fake.returned[arm["name"]],
                                  topo, arm["ideal_bps"], sized=True)
        want = json.loads(json.dumps(want))
        for key in ("goodput_bps", "link_series", "cpu_idle", "flows", "fidelity", "completion_p99_s"):
            assert arm[key] == want[key], key
        assert arm["cpu_idle"] and arm["link_series"]["util"]


def test_a_finished_run_leaves_the_same_document_in_its_records(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "run_arm", FakeFabric())
    exp, topo = driver.prepare("ecmp-vs-spray", topo=SPEC, duration=2, arms=["ecmp-single", "spray"])
    rendered = driver.execute(exp, topo, out_root=tmp_path)
    assert rendered.doc["complete"]
    stored = json.loads((rendered.out_dir / "results.json").read_text())
    (rendered.out_dir / "results.json").unlink()
    again = driver.rerender(rendered.out_dir).doc
    assert again["complete"]
    for key in ("arms", "analysis", "fidelity", "flows", "experiment_definition", "started", "finished"):
        assert json.loads(json.dumps(again[key])) == stored[key], key


def test_two_runs_in_the_same_second_get_their_own_directories(tmp_path):
    now = 1_780_000_000.0
    made: list[Path] = []
    lock = threading.Lock()

    def make() -> None:
        d = records.new_run_dir(tmp_path, "exp", now=now)
        with lock:
            made.append(d)

    threads = [threading.Thread(target=make) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({d.name for d in made}) == 6 and all(d.is_dir() for d in made)
    names = sorted(d.name for d in made)
    assert names[1:] == [f"{names[0]}-{n:02d}" for n in range(2, 7)]  # one second, in the order taken


def test_files_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    records.atomic_write_json(path, {"v": 1})
    writers = [threading.Thread(target=records.atomic_write_json, args=(path, {"v": i, "pad": "x" * 100_000}))
               for i in range(2, 8)]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    assert json.loads(path.read_text())["v"] in range(2, 8) and not _leftover_temps(tmp_path)

    def full_disk(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    before = path.read_text()
    with pytest.raises(records.ResultsWriteError, match=r"^cannot write .*results.json: No space left on device$"):
        records.atomic_write_json(path, {"v": 99})
    assert path.read_text() == before and not _leftover_temps(tmp_path)


def test_an_unwritable_out_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    import emulator.system

    monkeypatch.setattr(runner, "run_arm", FakeFabric())
    monkeypatch.setattr(emulator.system, "require_ready", lambda _caps: None)
    monkeypatch.setattr(emulator.system, "capabilities", lambda: None)
    monkeypatch.setattr(signal, "signal", lambda *_args: None)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    from cli.main import main

    assert main(["run", "ecmp-vs-spray", "--topo", SPEC, "--duration", "2", "--out", str(blocker / "out"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("fabriclab run: error: cannot write ") and str(blocker / "out") in err, err
