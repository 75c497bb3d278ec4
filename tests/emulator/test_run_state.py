"""What `fabriclab clean` asks before it tears a recorded run down: whether the run's process still runs.
A running process is alive, an exited one is not, and neither is a zombie (exited, its parent not having
waited yet), so that a run killed under a parent that has not reaped it is still cleaned; and a record
names its process by pid and start time, so that a pid the kernel has given to another process since does
not keep a dead run's record "active"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace

from emulator.procs import pid_alive, process_start, process_state
from emulator.state import RunState


def test_a_running_process_is_alive_and_a_zombie_is_not():
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert pid_alive(proc.pid)
        assert proc.stdin is not None
        proc.stdin.close()  # it exits; unreaped, it stays a zombie
        deadline = time.monotonic() + 10
        while process_state(proc.pid) != "Z":
            assert time.monotonic() < deadline, "the child did not exit"
            time.sleep(0.01)
        os.kill(proc.pid, 0)  # the pid still answers signals...
        assert not pid_alive(proc.pid)  # ...but holds nothing
    finally:
        proc.kill()
        proc.wait()
    assert not pid_alive(proc.pid) and process_state(proc.pid) == ""


def test_no_pid_is_not_alive():
    assert not pid_alive(None) and not pid_alive(0)
    assert pid_alive(os.getpid())


def test_a_record_names_its_runner_by_pid_and_start_so_a_reused_pid_is_not_taken_for_it(tmp_path):
    own = RunState(run_id="t")
    assert own.pid == os.getpid() and own.pid_start == process_start(os.getpid()) is not None
    assert own.runner_alive()
    # The same pid given to a process that started later: not the run's runner.
    assert not replace(own, pid_start=own.pid_start - 1).runner_alive()
    # A record written before the start was kept is judged by its pid alone.
    assert replace(own, pid_start=None).runner_alive()
    legacy = tmp_path / "old.json"
    legacy.write_text(json.dumps({"run_id": "old", "pid": os.getpid()}))
    assert RunState.load(legacy).runner_alive()


def test_a_saved_record_reads_back_with_its_start(tmp_path, monkeypatch):
    monkeypatch.setattr("emulator.state.STATE_DIR", tmp_path)
    state = RunState(run_id="saved")
    state.save()
    assert RunState.load(state.path) == state
