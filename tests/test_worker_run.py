"""cli/worker_run.py: how a worker process's run ends (exit status, its one error line, the JSON written)."""

from __future__ import annotations

import argparse
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from cli.worker_run import run_to_end


class WorkerFailed(Exception):
    pass


class FakeWorker:
    """The surface run_to_end drives, with `run` doing what a test tells it."""

    def __init__(self, run: Callable[[FakeWorker], None] = lambda w: None) -> None:
        self.error: str | None = None
        self.stop_reason = ""
        self.closed = False
        self._run = run

    def run(self) -> None:
        self._run(self)

    def stop(self, reason: str = "stopped") -> None:
        self.stop_reason = reason

    def results(self) -> dict:
        return {"error": self.error, "closed_before": self.closed}

    def close(self) -> None:
        self.closed = True


def _args(json_out: Path | None) -> argparse.Namespace:
    return argparse.Namespace(prog="fabriclab test", json_out=str(json_out) if json_out else None)


def _stderr_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


def test_done_writes_the_json_and_says_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    worker, out = FakeWorker(), tmp_path / "r.json"
    code, results = run_to_end(worker, _args(out), (WorkerFailed,), lambda: False)
    assert code == 0 and worker.closed
    assert json.loads(out.read_text()) == results == {"error": None, "closed_before": False}
    assert _stderr_lines(capsys) == []


def test_unwritable_output_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "missing" / "r.json"
    worker = FakeWorker()
    code, _ = run_to_end(worker, _args(out), (WorkerFailed,), lambda: False)
    assert code == 2 and worker.closed
    assert _stderr_lines(capsys) == [f"fabriclab test: error: cannot write {out}: No such file or directory"]
    assert not out.parent.exists()


def test_unwritable_output_keeps_a_mismatch_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "missing" / "r.json"
    code, _ = run_to_end(FakeWorker(), _args(out), (WorkerFailed,), lambda: True)
    assert code == 1
    assert len(_stderr_lines(capsys)) == 1


def test_a_worker_error_is_exit_2_and_in_the_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def fail(_w: FakeWorker) -> None:
        raise WorkerFailed("barrier not complete")

    out = tmp_path / "r.json"
    worker = FakeWorker(fail)
    code, _ = run_to_end(worker, _args(out), (WorkerFailed,), lambda: pytest.fail("asked after a failure"))
    assert code == 2 and worker.closed
    assert json.loads(out.read_text())["error"] == "barrier not complete"
    assert _stderr_lines(capsys) == ["fabriclab test: error: barrier not complete"]


def test_another_exception_still_writes_the_json(tmp_path: Path) -> None:
    def crash(_w: FakeWorker) -> None:
        raise RuntimeError("bug")

    out = tmp_path / "r.json"
    worker = FakeWorker(crash)
    with pytest.raises(RuntimeError, match="bug"):
        run_to_end(worker, _args(out), (WorkerFailed,), lambda: False)
    assert worker.closed and out.exists()


@pytest.mark.parametrize("note_signal", [True, False])
def test_sigterm_is_exit_143_and_restores_the_handlers(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      note_signal: bool) -> None:
    def signalled(_w: FakeWorker) -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    out = tmp_path / "r.json"
    worker = FakeWorker(signalled)
    code, _ = run_to_end(worker, _args(out), (WorkerFailed,), lambda: pytest.fail("asked after a signal"),
                         note_signal=note_signal)
    assert code == 143 and worker.stop_reason == "signal SIGTERM"
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    error = "stopped by SIGTERM" if note_signal else None
    assert json.loads(out.read_text())["error"] == error
    assert _stderr_lines(capsys) == ([f"fabriclab test: error: {error}"] if note_signal else [])
