"""Per-switch Open vSwitch daemons without a fabric: their pid records, stopping by pid and instance
directory only, the controller's unix-socket listener, CPU summed over many daemons, and batched tc."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from emulator import cpu
from emulator.controller.unix_listener import UnixConnection, listen_unix, serve_unix
from emulator.ovs_daemons import all_daemon_pids, daemon_pids, instance_dir, stop_daemons, vswitchd_pids
from emulator.shaping import Impairment, initial_shape_commands, shape_commands, tc_batch


def _sleeper(marker: Path) -> subprocess.Popen:
    # A stand-in daemon whose command line names its instance directory, as the real ones do.
    return subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(60)", str(marker)])


def test_pids_come_from_each_instance_directory(tmp_path):
    for name, pids in (("leaf1", (11, 12)), ("spine1", (21, 22))):
        d = instance_dir(tmp_path, name)
        d.mkdir(parents=True)
        (d / "ovs-vswitchd.pid").write_text(f"{pids[0]}\n")
        (d / "ovsdb-server.pid").write_text(f"{pids[1]}\n")
    (instance_dir(tmp_path, "half") / "").mkdir(parents=True)
    (instance_dir(tmp_path, "half") / "ovsdb-server.pid").write_text("garbage")
    assert daemon_pids(instance_dir(tmp_path, "leaf1")) == {"ovs-vswitchd": 11, "ovsdb-server": 12}
    assert sorted(all_daemon_pids(tmp_path)) == [11, 12, 21, 22]
    assert sorted(vswitchd_pids(tmp_path)) == [11, 21]
    assert all_daemon_pids(tmp_path / "nothing") == []


def test_stop_daemons_ends_only_processes_that_name_the_directory(tmp_path):
    ours = _sleeper(tmp_path / "ovs" / "leaf1")
    other = _sleeper(tmp_path.parent / "someone-else")
    try:
        time.sleep(0.2)
        stopped = stop_daemons([ours.pid, other.pid], must_contain=str(tmp_path))
        assert stopped == [ours.pid]
        assert ours.wait(timeout=5) is not None
        assert other.poll() is None, "a process that does not name the run's directory was touched"
    finally:
        for p in (ours, other):
            if p.poll() is None:
                p.kill()
            p.wait()


def test_unix_connection_ignores_tcp_options_only():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        conn = UnixConnection(a)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # what os-ken's Datapath does
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
        conn.sendall(b"hello")
        assert b.recv(5) == b"hello"
        with pytest.raises(OSError):
            a.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def test_unix_listener_hands_each_connection_on(tmp_path):
    path = tmp_path / "of.sock"
    srv = listen_unix(path)
    assert path.stat().st_mode & 0o077 == 0, "the controller's socket must be root's only"
    got: list[tuple[bytes, tuple]] = []
    stop = threading.Event()

    def handle(conn, address):
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        got.append((conn.recv(16), address))
        conn.close()

    def spawn(fn, *args):
        threading.Thread(target=fn, args=args, daemon=True).start()

    t = threading.Thread(target=serve_unix, args=(srv, handle, spawn, stop.is_set), daemon=True)
    t.start()
    for msg in (b"switch-1", b"switch-2"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.connect(str(path))
            c.sendall(msg)
            c.recv(1)  # until the handler closes
    stop.set()
    srv.close()
    assert sorted(got) == [(b"switch-1", ("unix", 1)), (b"switch-2", ("unix", 2))]


def test_cpu_ledger_sums_a_component_over_its_processes(monkeypatch):
    seconds = {1: 1.0, 2: 2.0, 3: 0.5}
    monkeypatch.setattr(cpu, "process_cpu_seconds", lambda pid: seconds.get(pid))
    ledger = cpu.CpuLedger({"ovs": [1, 2], "controller": 3, "gone": [1, 99]})
    snap = ledger.snapshot()
    assert snap.components["ovs"] == 3.0
    assert snap.components["controller"] == 0.5
    assert snap.components["gone"] is None  # a partial sum would undercount
    assert cpu.CpuLedger({"ovs": []}).snapshot().components["ovs"] is None


def test_cpu_ledger_keeps_stolen_time_out_of_what_the_machine_spent(monkeypatch):
    # /proc/stat jiffies (idle, total, steal): 20 CPU-seconds pass, 2 idle, 3 stolen, 15 spent here.
    ticks = iter([(1000, 2000, 100), (1200, 4000, 400)])
    monkeypatch.setattr(cpu, "cpu_times", lambda: next(ticks))
    monkeypatch.setattr(cpu, "_HZ", 100)
    monkeypatch.setattr(cpu, "own_cpu_seconds", lambda: 1.0)
    ledger = cpu.CpuLedger({})
    ledger.open()
    window = ledger.close()
    assert window == {"runner": 0.0, "other": 15.0, "total": 15.0, "steal": 3.0}
    assert cpu.steal_fraction((1000, 2000, 100), (1200, 4000, 400)) == 0.15


def test_initial_shaping_is_one_batch_without_deletes():
    imp = Impairment(rate_mbps=4.0, queue_packets=100)
    cmds = initial_shape_commands("leaf1-eth1", imp, netem=False)
    assert cmds == shape_commands("leaf1-eth1", imp, netem=False)[1:]
    assert all(c[2] != "del" for c in cmds)
    batch = tc_batch(cmds + initial_shape_commands("leaf1-eth2", imp, netem=False))
    lines = batch.splitlines()
    assert len(lines) == 2 * len(cmds)
    assert [shlex.split(line) for line in lines[: len(cmds)]] == [c[1:] for c in cmds]
    with pytest.raises(ValueError):
        tc_batch([["ip", "link", "show"]])


def test_a_dead_controller_is_reported_by_its_first_traceback_not_only_the_last_lines(tmp_path):
    # os-ken's shutdown raises again after a service thread fails ('HubThread' object has no attribute
    # 'kill'): the log's last lines then show that, and only the first traceback names the cause.
    from emulator.control import ControllerProcess

    proc = ControllerProcess(tmp_path / "topology.json", "ecmp", tmp_path)
    lines = [f"INFO step {i}" for i in range(40)] + [
        "ERROR controller failed", "Traceback (most recent call last):", '  File "hub.py", line 1, in joinall',
        "OSError: [Errno 98] Address already in use", "", "During handling of the above exception, another "
        "exception occurred:", "", "Traceback (most recent call last):",
        *[f'  File "app_manager.py", line {i}' for i in range(20)],
        "AttributeError: 'HubThread' object has no attribute 'kill'"]
    proc.log_file.write_text("\n".join(lines) + "\n")
    tail = proc.log_tail()
    assert "Address already in use" in tail and tail.endswith("no attribute 'kill'")
    assert "INFO step 5" not in tail


def test_controller_ports_are_picked_below_the_ephemeral_range():
    # A port from binding port 0 is in the ephemeral range: an outgoing connection can take it before
    # the controller binds it. Below the range, only a listener can.
    from emulator.control import LISTEN_PORTS_FROM, ephemeral_low, free_port

    low = ephemeral_low()
    ports = [free_port() for _ in range(20)]
    if low > LISTEN_PORTS_FROM:
        assert all(LISTEN_PORTS_FROM <= p < low for p in ports)
    assert free_port(avoid=set(range(LISTEN_PORTS_FROM, max(low, LISTEN_PORTS_FROM + 1)))) > 0  # falls back


def _groups(spec: str, isolation: str = "private") -> list[list[str]]:
    from emulator.network import Fabric
    from topologies import parse_spec

    fab = Fabric(parse_spec(spec), isolation=isolation)
    fab.isolation = isolation  # what start() settles
    return fab.daemon_groups()


def test_switches_share_daemons_eight_at_most_and_at_least_one_daemon_per_cpu(monkeypatch):
    monkeypatch.delenv("FABRICLAB_SWITCHES_PER_DAEMON", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert _groups("leaf-spine:spines=4,leaves=4,hosts=1") == [["spine1", "spine2", "spine3", "spine4"],
                                                               ["leaf1", "leaf2", "leaf3", "leaf4"]]
    assert [len(g) for g in _groups("fat-tree:k=4")] == [8, 8, 4]
    assert [len(g) for g in _groups("fat-tree:k=8")] == [8] * 10
    assert [len(g) for g in _groups("fat-tree:k=4", "per-switch")] == [1] * 20
    assert _groups("fat-tree:k=4", "shared") == []
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert [len(g) for g in _groups("leaf-spine:spines=2,leaves=2,hosts=1")] == [4]


def test_the_group_size_can_be_set_and_a_bad_one_is_refused(monkeypatch):
    from emulator.errors import EmulatorError
    from emulator.network import switches_per_daemon

    monkeypatch.setenv("FABRICLAB_SWITCHES_PER_DAEMON", "20")
    assert [len(g) for g in _groups("fat-tree:k=4")] == [20]
    for bad in ("0", "-1", "two", "1.5"):
        monkeypatch.setenv("FABRICLAB_SWITCHES_PER_DAEMON", bad)
        with pytest.raises(EmulatorError, match=r"FABRICLAB_SWITCHES_PER_DAEMON=.*whole number"):
            switches_per_daemon(8)


def test_the_controller_reads_a_large_fabric_less_often():
    from emulator.network import Fabric, poll_interval_for
    from topologies import parse_spec

    assert poll_interval_for(4) == poll_interval_for(20) == 0.5
    assert poll_interval_for(80) == 2.0  # fat-tree k=8: 40 switches a second
    assert Fabric(parse_spec("fat-tree:k=8")).poll_interval == 2.0
    assert Fabric(parse_spec("leaf-spine:spines=4,leaves=4,hosts=1")).poll_interval == 0.5
    assert Fabric(parse_spec("fat-tree:k=8"), poll_interval=0.25).poll_interval == 0.25
