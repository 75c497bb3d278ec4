"""Integration tests of fabrics split across servers: namespace servers with their own sshd and Open
vSwitch, Mininet's cluster engine, `cluster selftest`, `clean` after a killed cluster run, and the
one-line errors for servers that cannot be used."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.emulator_helpers import assert_no_leftovers, new_leftovers

pytestmark = [pytest.mark.root, pytest.mark.slow]

FABRICLAB = [sys.executable, "-m", "cli"]
SMALL = "leaf-spine:spines=2,leaves=2,hosts=1,rate=20"


def test_selftest_passes_and_leaves_nothing():
    out = subprocess.run([*FABRICLAB, "cluster", "selftest", "--servers", "2", "--json"], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc["ok"] and doc["servers"] == 2
    names = [c["name"] for c in doc["checks"]]
    assert names == ["servers", "bring-up", "ping all", "spray across servers", "teardown", "overhead",
                     "ecmp-vs-spray"]
    m = doc["measured"]
    assert m["rtt_cross_server_ms"] > 0 and m["rtt_one_machine_ms"] > 0
    assert m["tunnel_cpu_us_per_packet"] > 0
    assert set(m["server_cpu_idle_pct"]) == {"10.99.0.2", "10.99.0.3"}
    verdict = m["ecmp_vs_spray"]
    assert verdict["spray"]["link_imbalance"] < verdict["ecmp-single"]["link_imbalance"]
    for arm in verdict.values():  # the run itself measured every server's CPU and knew what crossed
        assert set(arm["server_cpu_idle"]) == {"10.99.0.2", "10.99.0.3"} and arm["cross_server_links"] > 0
    assert_no_leftovers()


def test_clean_after_a_killed_cluster_run():
    proc = subprocess.Popen([*FABRICLAB, "up", "--topo", SMALL, "--servers", "ns:2"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "press Ctrl-C" in line or time.monotonic() > deadline:
                break
        assert proc.poll() is None, "fabriclab up exited early: " + "".join(seen)[-2000:]
        left = new_leftovers()
        assert left["namespaces"] and left["ssh_processes"] and left["underlay"]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    out = subprocess.run([*FABRICLAB, "clean"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # The ssh clients' pipes closed with their parent, so they may have exited before `clean` looked:
    # it removes those still running, and none may remain.
    assert "removed namespace flc-" in out.stdout
    assert_no_leftovers()


def test_up_on_a_cluster_tears_down_on_sigterm():
    proc = subprocess.Popen([*FABRICLAB, "up", "--topo", SMALL, "--servers", "ns:2"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    text = ""
    for line in proc.stdout:
        text += line
        if "press Ctrl-C" in line:
            break
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) in (0, 130), text
    assert "leaf1" in text
    assert_no_leftovers()


def test_an_unreachable_server_is_one_line_and_leaves_nothing():
    # Nothing listens on this machine's ssh port: the connection is refused at once, and stays local.
    out = subprocess.run([*FABRICLAB, "up", "--topo", SMALL, "--servers", "127.0.0.1", "--hold", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and "server 127.0.0.1: " in err[0], out.stderr
    assert "Traceback" not in out.stderr
    assert_no_leftovers()
