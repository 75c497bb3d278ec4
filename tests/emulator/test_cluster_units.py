"""Cluster fabrics without root: placement, --servers parsing, the ssh options Mininet's nodes are
given, and the checks of a real server (against a stand-in ssh that answers as a server would)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.cluster.fabric import ServersSpec, check_server, parse_servers
from emulator.cluster.placement import crossing_links, place
from emulator.errors import EmulatorError
from topologies import parse_spec


@settings(max_examples=40, deadline=None)
@given(spines=st.integers(1, 4), leaves=st.integers(1, 6), hosts=st.integers(1, 3), n=st.integers(1, 5))
def test_leaf_switches_stay_with_their_hosts_and_only_fabric_links_cross(spines, leaves, hosts, n):
    topo = parse_spec(f"leaf-spine:spines={spines},leaves={leaves},hosts={hosts}")
    servers = [f"10.99.0.{i + 2}" for i in range(n)]
    where = place(topo, servers)
    assert set(where) == {node.name for node in topo.nodes}
    for name in crossing_links(topo, where):
        a, b = name.split("-", 1)
        assert topo.node(a).is_switch and topo.node(b).is_switch, f"host link {name} crosses servers"
    per_server = {s: sum(1 for sw in topo.switches if where[sw.name] == s and sw.role == "leaf") for s in servers}
    assert max(per_server.values()) - min(per_server.values()) <= 1


def test_fat_tree_edges_keep_their_hosts():
    topo = parse_spec("fat-tree:k=4")
    where = place(topo, ["a", "b"])
    for lk in topo.links:
        if topo.node(lk.a).is_host or topo.node(lk.b).is_host:
            assert where[lk.a] == where[lk.b]
    assert sorted(where.values()).count("a") == sorted(where.values()).count("b")


@pytest.mark.parametrize("text,expected", [
    ("ns:2", ServersSpec(namespace_servers=2)),
    ("localhost, 10.0.0.2", ServersSpec(hosts=("localhost", "10.0.0.2"))),
    ("root@gpu-node1", ServersSpec(hosts=("root@gpu-node1",))),
])
def test_servers_parse(text, expected):
    assert parse_servers(text) == expected


@pytest.mark.parametrize("text,message", [
    ("ns:0", "between 1 and"), ("ns:x", "after 'ns:'"), ("", "give 'ns:N'"), ("a,a", "listed twice"),
    ("a;rm -rf /", "not a host name"),
])
def test_bad_servers_are_one_line(text, message):
    with pytest.raises(EmulatorError, match=message):
        parse_servers(text)


def test_bad_servers_on_the_command_line_exit_2_without_traceback():
    out = subprocess.run([sys.executable, "-m", "cli", "up", "--servers", "ns:99"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2
    assert "between 1 and 32" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) <= 2  # argparse's usage line and the error


def test_nodes_put_the_run_config_into_every_ssh():
    from emulator.cluster.nodes import _with_config

    assert _with_config(["ssh", "-n", "-w", "9:9", "root@x", "echo @"], "/w/ssh/config")[:3] == [
        "ssh", "-F", "/w/ssh/config"]
    assert _with_config("ip link set tap9 up", "/w/c") == ["ip", "link", "set", "tap9", "up"]
    assert _with_config(["ssh", "x"], None) == ["ssh", "x"]


def _fake_ssh(tmp_path: Path, script: str) -> dict:
    """A stand-in `ssh` first on PATH: it runs `script` with the remote command in $CMD."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "ssh"
    fake.write_text("#!/bin/sh\nfor a; do CMD=$a; done\n" + script + "\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


@pytest.mark.parametrize("script,message", [
    ("echo 'ssh: connect to host s port 22: Connection refused' >&2; exit 255", "unreachable over ssh"),
    ("echo 'root@s: Permission denied (publickey).' >&2; exit 255", "ssh refused the key"),
    ('case "$CMD" in "sudo -n true") echo "sudo: a password is required" >&2; exit 1;; esac; exit 0',
     "passwordless sudo"),
    ('case "$CMD" in *ovs-vsctl*) exit 1;; esac; exit 0', "Open vSwitch is not running"),
    ('case "$CMD" in *mininet*) echo 9.9.9; echo 0.1.0;; esac; exit 0', "Mininet 9.9.9 there"),
    ('case "$CMD" in *mininet*) echo MININET_HERE; echo 0.0.1;; esac; exit 0', "fabriclab 0.0.1 there"),
])
def test_a_server_that_cannot_be_used_is_named_with_the_fix(tmp_path, monkeypatch, script, message):
    from mininet.net import VERSION

    for k, v in _fake_ssh(tmp_path, script.replace("MININET_HERE", VERSION)).items():
        monkeypatch.setenv(k, v)
    with pytest.raises(EmulatorError, match=message) as info:
        check_server("s")
    assert str(info.value).startswith("server s: ") and "\n" not in str(info.value)


def test_a_server_short_of_cpu_is_named_in_the_verdict():
    from experiments.analysis.fidelity import fidelity_verdict

    fid = fidelity_verdict([0.8, 0.7], 100.0, 0, 1000, servers_idle={"10.0.0.2": 0.9, "10.0.0.3": 0.2})
    assert not fid.trusted
    assert len(fid.reasons) == 1 and "server 10.0.0.3's CPU was 20% idle" in fid.reasons[0]
    assert fidelity_verdict([0.8], 100.0, 0, 1000, servers_idle={"10.0.0.2": 0.5}).trusted


def test_a_run_across_servers_says_so_in_its_fidelity_sentence():
    from experiments.report import fidelity_sentences

    doc = {"fidelity": {"cpu_idle_min": 0.5, "cpu_idle_mean": 0.7, "trusted": True, "reasons": []},
           "arms": [{"server_cpu_idle": {"10.99.0.2": 0.6, "10.99.0.3": 0.8}, "cross_server_links": 2},
                    {"server_cpu_idle": {"10.99.0.2": 0.5, "10.99.0.3": 0.9}, "cross_server_links": 2}]}
    text = fidelity_sentences(doc)[0]
    assert "Across 2 servers (2 links carried by ssh tunnels)" in text and "10.99.0.2 50%, 10.99.0.3 80%" in text


def test_a_fabric_file_can_name_its_servers(tmp_path, monkeypatch):
    from emulator.cluster import SERVERS_ENV, new_fabric
    from emulator.cluster.fabric import ClusterFabric
    from emulator.network import Fabric
    from topologies import SpecError
    from topologies.spec import load

    body = "nodes: [{name: s1, role: switch}, {name: h1, role: host}, {name: h2, role: host}]\n" \
           "links: [{a: h1, b: s1}, {a: h2, b: s1}]\n"
    f = tmp_path / "fab.yaml"
    f.write_text("servers: [localhost, gpu-node2]\n" + body)
    topo = load(f)
    assert topo.params["run_on_servers"] == "localhost,gpu-node2"
    monkeypatch.delenv(SERVERS_ENV, raising=False)
    fab = new_fabric(topo)
    assert isinstance(fab, ClusterFabric) and fab.servers.hosts == ("localhost", "gpu-node2")
    monkeypatch.setenv(SERVERS_ENV, "ns:3")  # --servers wins
    assert new_fabric(topo).servers.namespace_servers == 3
    monkeypatch.delenv(SERVERS_ENV)
    f.write_text(body)
    assert type(new_fabric(load(f))) is Fabric
    f.write_text("servers: 7\n" + body)
    with pytest.raises(SpecError, match="servers: 7; give ns:N"):
        load(f)


def test_an_in_server_fabric_s_own_servers_count_is_not_a_server_list(monkeypatch):
    from emulator.cluster import SERVERS_ENV, new_fabric
    from emulator.network import Fabric

    monkeypatch.delenv(SERVERS_ENV, raising=False)
    topo = parse_spec("in-server:servers=2,gpus=4")
    assert type(new_fabric(topo)) is Fabric


def test_under_nohup_node_shells_start_with_hangups_that_end_them():
    # Mininet ends a remote node's shell (an ssh client) with SIGHUP; a SIGHUP nohup made this process
    # ignore must not reach the programs it starts, or teardown waits on them for ever.
    import subprocess
    import sys

    child = (
        "import signal, subprocess\n"
        "from emulator.cluster.fabric import _hangups_reach_node_shells\n"
        "_hangups_reach_node_shells()\n"
        "assert signal.getsignal(signal.SIGHUP) not in (signal.SIG_IGN, signal.SIG_DFL)\n"
        "out = subprocess.run(['grep', 'SigIgn', '/proc/self/status'], capture_output=True, text=True).stdout\n"
        "print(int(out.split()[1], 16) & 1)\n"
    )
    out = subprocess.run(["nohup", sys.executable, "-c", child], capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0", out.stdout + out.stderr  # the child's SIGHUP is not ignored
