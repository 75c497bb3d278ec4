"""Integration tests of a fabric's life: teardown on exit, SIGTERM and SIGINT, `clean` after a kill,
and the commands' behaviour (doctor, up)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emulator.network import Fabric
from emulator.procs import process_state
from tests.emulator_helpers import assert_no_leftovers, new_leftovers
from topologies import parse_spec

pytestmark = [pytest.mark.root, pytest.mark.slow]

FABRICLAB = [sys.executable, "-m", "cli"]
SMALL = "leaf-spine:spines=2,leaves=2,hosts=1,rate=20"


def test_context_manager_tears_down():
    assert_no_leftovers()
    with Fabric(parse_spec(SMALL)) as fab:
        assert fab.api.health()["ready"]
        live = new_leftovers()
        assert live["ovs_daemons"] and live["mininet_shells"] and live["controllers"] and live["run_records"]
        assert fab.isolation == "private"  # the userspace datapath's default
        # a database and a switch daemon for each group of switches
        assert len(live["ovs_daemons"]) == 2 * len(fab.daemon_groups()) < 2 * len(fab.topology.switches)
    assert_no_leftovers()
    assert fab.timings.bring_up_s > 0 and fab.timings.teardown_s > 0


def test_exception_inside_block_tears_down():
    with pytest.raises(RuntimeError, match="boom"), Fabric(parse_spec(SMALL)):
        raise RuntimeError("boom")
    assert_no_leftovers()


def _start_up(tmp_path: Path, daemons: str = "per-switch") -> subprocess.Popen:
    proc = subprocess.Popen([*FABRICLAB, "up", "--topo", SMALL, "--switch-daemons", daemons], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    assert proc.stdout is not None
    for line in proc.stdout:
        if "press Ctrl-C" in line or time.monotonic() > deadline:
            break
    assert proc.poll() is None, "fabriclab up exited early"
    return proc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_up_tears_down_on_signal(tmp_path, sig):
    proc = _start_up(tmp_path)
    assert new_leftovers()["ovs_daemons"]
    proc.send_signal(sig)
    assert proc.wait(timeout=60) in (0, 130)
    assert_no_leftovers()


# What a killed run leaves for `clean` to find, and the line clean prints for it, per kind of switch daemon.
KILL_LEFTOVERS = {"per-switch": ("ovs_daemons", "removed Open vSwitch daemon"),
                  "private": ("ovs_daemons", "removed Open vSwitch daemon"),
                  "shared": ("bridges", "removed bridge")}


@pytest.mark.parametrize("daemons", sorted(KILL_LEFTOVERS))
def test_clean_after_kill(tmp_path, daemons):
    proc = _start_up(tmp_path, daemons)
    os.kill(proc.pid, signal.SIGKILL)
    try:
        # Not reaped yet: the killed run is a zombie of this process, as it would be of a script that has
        # not waited for it, and clean must still take its record for what it is, a dead run.
        deadline = time.monotonic() + 10
        while process_state(proc.pid) != "Z":
            assert time.monotonic() < deadline, "the killed run did not die"
            time.sleep(0.01)
        kind, line = KILL_LEFTOVERS[daemons]
        left = new_leftovers()
        assert left[kind] and left["work_directories"], f"a killed run should leave {kind} for clean to find"
        out = subprocess.run([*FABRICLAB, "clean"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert "still active" not in out.stdout + out.stderr
        assert line in out.stdout
    finally:
        proc.wait()
    assert_no_leftovers()


def test_doctor_passes_here():
    out = subprocess.run([*FABRICLAB, "doctor"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all required parts are present" in out.stdout


def test_up_restarts_a_controller_that_dies(tmp_path):
    """`up` notices its controller's death at once, says so, and brings it back; the switches reconnect."""
    from emulator.state import active_runs

    proc = _start_up(tmp_path)
    try:
        runs = [r for r in active_runs() if r.pid == proc.pid]
        assert runs and runs[0].controller_pid
        first = runs[0].controller_pid
        os.kill(first, signal.SIGKILL)
        lines = []
        deadline = time.monotonic() + 60
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "controller back" in line or time.monotonic() > deadline:
                break
        text = "".join(lines)
        assert "the controller exited" in text, text
        assert "controller back" in text and "every switch reconnected" in text, text
        again = next(r for r in active_runs() if r.pid == proc.pid).controller_pid
        assert again and again != first
        assert proc.poll() is None, "up should keep the fabric after the restart"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert_no_leftovers()


@pytest.mark.parametrize("isolation", ["private", "per-switch"])
def test_each_way_of_running_private_daemons_forwards(isolation):
    """A daemon for a group of switches puts the group in one namespace; one per switch, each in its
    own. Either way the fabric forwards, and leaves nothing."""
    with Fabric(parse_spec(SMALL), isolation=isolation) as fab:
        switches = [s.name for s in fab.topology.switches]
        groups = fab.daemon_groups()
        assert len(groups) == (2 if isolation == "private" else len(switches))  # this machine has 2 CPUs
        for group in groups:
            assert len({os.readlink(f"/proc/{fab.net[s].pid}/ns/net") for s in group}) == 1
        namespaces = {os.readlink(f"/proc/{fab.net[s].pid}/ns/net") for s in switches}
        assert len(namespaces) == len(fab.ovs_pids()) == len(groups)
        out = fab.host("h1").cmd(f"ping -c 3 -i 0.2 -W 2 {fab.ip('h2')}")
        assert " 0% packet loss" in out, out
    assert_no_leftovers()
