"""`pid_alive`, which `fabriclab clean` asks before it tears a recorded run down: a running process is
alive, an exited one is not, and neither is a zombie (exited, its parent not having waited yet), so that a
run killed under a parent that has not reaped it is still cleaned."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from emulator.state import pid_alive, process_state


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
