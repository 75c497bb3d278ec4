"""Integration tests: real Mininet, real Open vSwitch, the real controller process.

Only one fabric can run at a time (fabrics share interface names), so the tests are grouped by
topology: the fixture keeps the current fabric up while tests ask for the same one, and tears it down
before bringing up another. Each test leaves the fabric as it found it (mode back to ecmp, links up).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from emulator.network import Fabric
from emulator.probe import run_probe
from experiments.endpoints import command_line
from tests.emulator_helpers import assert_no_leftovers
from topologies import parse_spec

pytestmark = [pytest.mark.root, pytest.mark.slow]

ROUTING_MODES = ("ecmp", "spray", "single", "local", "via-tor")
PROBE_PPS = 2000
# The probe is UDP without retransmission: a CPU stall of the userspace switch (another busy process on
# 2 cores) can drop a few packets at a socket buffer. Path spread is what these tests are about.
MIN_DELIVERED = 0.97


def ping_all(fab: Fabric) -> float:
    """Percent of host pairs that failed to ping (Mininet's pingAll, 1 s timeout per ping)."""
    return fab.net.pingAll(timeout="1")


@pytest.fixture(scope="module")
def fabric_factory():
    current: dict[str, Fabric] = {}

    def make(spec: str) -> Fabric:
        if spec not in current:
            for fab in current.values():
                fab.stop()
            current.clear()
            assert_no_leftovers()
            current[spec] = Fabric(parse_spec(spec)).__enter__()
        return current[spec]

    try:
        yield make
    finally:
        for fab in current.values():
            fab.stop()
        assert_no_leftovers()


@pytest.fixture
def ls222(fabric_factory) -> Fabric:
    return fabric_factory("leaf-spine:spines=2,leaves=2,hosts=2,rate=50")


@pytest.fixture
def ls442(fabric_factory) -> Fabric:
    return fabric_factory("leaf-spine:spines=4,leaves=4,hosts=2,rate=20")


@pytest.fixture
def narrowing(fabric_factory) -> Fabric:
    # Hosts at 50 Mb/s, the leaf's uplink at 10: a burst from h1 queues at leaf1's uplink.
    return fabric_factory("leaf-spine:spines=1,leaves=2,hosts=1,host_rate=50,fabric_rate=10")


@pytest.fixture
def wide_leaf(fabric_factory) -> Fabric:
    # 41 ports on each leaf: a start script longer than the 4,095 bytes a terminal line holds.
    return fabric_factory("leaf-spine:spines=1,leaves=2,hosts=40")


@pytest.fixture
def in_server(fabric_factory) -> Fabric:
    return fabric_factory("in-server:servers=2,gpus=8")


@pytest.fixture
def restore_mode():
    touched: list[Fabric] = []
    yield touched.append
    for fab in touched:
        fab.set_mode("ecmp")


def _all_modes_ping(fab: Fabric, restore_mode) -> None:
    restore_mode(fab)
    for mode in ROUTING_MODES:
        fab.set_mode(mode)
        assert fab.api.mode() == mode
        assert ping_all(fab) == 0, f"ping loss in mode {mode}"


def test_leaf_spine_222_pings_in_every_mode(ls222, restore_mode):
    _all_modes_ping(ls222, restore_mode)


def test_iperf3_tcp_reaches_80_percent_of_link_rate(ls222):
    rate = ls222.topology.links[0].rate_mbps
    server = ls222.host("h4").popen(["iperf3", "-s", "-1", "-B", ls222.ip("h4")],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        out = ls222.host("h1").cmd(f"iperf3 -c {ls222.ip('h4')} -t 4 -O 1 -J")
        report = json.loads(out)
        mbps = report["end"]["sum_received"]["bits_per_second"] / 1e6
    finally:
        server.kill()
        server.wait()
    assert mbps >= 0.8 * rate, f"iperf3 TCP {mbps:.1f} Mb/s on a {rate} Mb/s path"


def test_a_runtime_rate_survives_a_later_loss_change(ls222):
    sw, _ = ls222.topology.host_switch("h1")
    intf = ls222.topology.links_between("h1", sw)[0].intf("h1")
    rate = ls222.topology.links_between("h1", sw)[0].rate_mbps

    def htb_rate() -> str:
        return ls222.host("h1").cmd(f"tc class show dev {intf}")

    try:
        ls222.set_rate("h1", sw, 10)
        assert "rate 10Mbit" in htb_rate()
        # Loss re-shapes the interface from its recorded impairment, which must hold the new rate.
        ls222.set_loss("h1", sw, 1.0)
        assert "rate 10Mbit" in htb_rate(), htb_rate()
    finally:
        ls222.set_loss("h1", sw, 0.0)
        ls222.set_rate("h1", sw, rate)
    assert f"rate {int(rate)}Mbit" in htb_rate()


def test_full_loss_drops_everything_while_the_link_stays_up(ls222):
    """Lab 4's silent failure: 100 % loss on a link whose ports stay up."""
    sw, _ = ls222.topology.host_switch("h1")
    intf = ls222.topology.links_between("h1", sw)[0].intf("h1")
    h1, dst = ls222.host("h1"), ls222.ip("h4")
    try:
        ls222.set_loss("h1", sw, 100.0)
        assert " 0 received" in h1.cmd(f"ping -c 5 -i 0.2 -W 1 {dst}")
        assert "state UP" in h1.cmd(f"ip link show {intf}")
    finally:
        ls222.set_loss("h1", sw, 0.0)
    assert " 0% packet loss" in h1.cmd(f"ping -c 3 -i 0.2 -W 1 {dst}")


def test_links_api_reports_utilisation(ls222):
    before = ls222.api.links()
    run_probe(ls222, "h1", "h4", packets=2000, entropy="rotate", rate_pps=4000)
    time.sleep(2 * ls222.poll_interval + 0.2)
    after = ls222.api.links()
    names = {lk.name for lk in ls222.topology.links}
    assert {lk["name"] for lk in after["links"]} == names
    moved = {lk["name"]: lk["tx_packets"] + lk["rx_packets"] for lk in after["links"]}
    base = {lk["name"]: lk["tx_packets"] + lk["rx_packets"] for lk in before["links"]}
    assert sum(moved.values()) - sum(base.values()) >= 2000 * 3  # host link, fabric links, host link


def test_leaf_spine_442_pings_in_every_mode(ls442, restore_mode):
    _all_modes_ping(ls442, restore_mode)


def test_spray_rotate_splits_evenly_over_four_spines(ls442, restore_mode):
    restore_mode(ls442)
    ls442.set_mode("spray")
    r = run_probe(ls442, "h1", "h8", packets=4000, entropy="rotate", rate_pps=PROBE_PPS)
    assert r.packets_sent == 4000 and r.packets_received >= MIN_DELIVERED * 4000, r
    counts = list(r.per_spine.values())
    assert len(counts) == 4 and min(counts) > 0
    assert max(counts) / min(counts) <= 1.10, r.per_spine


def test_ecmp_fixed_keeps_one_flow_on_one_spine(ls442):
    r = run_probe(ls442, "h1", "h8", packets=4000, entropy="fixed", rate_pps=PROBE_PPS)
    assert r.packets_received >= MIN_DELIVERED * 4000, r
    assert max(r.per_spine.values()) >= 0.99 * sum(r.per_spine.values()), r.per_spine


def test_ecmp_rotate_uses_every_spine(ls442):
    r = run_probe(ls442, "h1", "h8", packets=4000, entropy="rotate", rate_pps=PROBE_PPS)
    assert r.packets_received >= MIN_DELIVERED * 4000, r
    assert all(v > 0 for v in r.per_spine.values()), r.per_spine


def test_link_cut_during_probe_reroutes(ls442, restore_mode):
    restore_mode(ls442)
    ls442.set_mode("spray")
    t_cut: list[float] = []
    try:
        r = run_probe(ls442, "h1", "h8", packets=6000, entropy="rotate", rate_pps=3000,
                      during=lambda: t_cut.append(ls442.set_link_up("leaf1", "spine1", False)), during_at=0.5)
        # Traffic went on over the other spines: most packets arrived, and the outage was short.
        assert r.packets_received >= 0.9 * r.packets_sent, r
        assert r.max_gap_s < 1.0, r
        events = ls442.api.events()
        assert any(e.get("kind") in ("port_down", "link_down") for e in events), events
        after = run_probe(ls442, "h1", "h8", packets=1200, entropy="rotate", rate_pps=PROBE_PPS)
        assert after.packets_received >= MIN_DELIVERED * after.packets_sent, after
        assert after.per_spine["spine1"] < 10, after.per_spine
        assert all(after.per_spine[s] > 0 for s in ("spine2", "spine3", "spine4")), after.per_spine
    finally:
        ls442.set_link_up("leaf1", "spine1", True)
    # Restored: the spine carries traffic again once the controller sees the port up.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        again = run_probe(ls442, "h1", "h8", packets=400, entropy="rotate", rate_pps=PROBE_PPS)
        if again.per_spine["spine1"] > 0:
            break
    assert again.per_spine["spine1"] > 0


def test_a_reaction_delay_holds_the_reroute_back(ls442, restore_mode):
    """With a real fabric's reaction time set, the controller reroutes that long after the cut."""
    restore_mode(ls442)
    try:
        assert ls442.api.set_reaction_delay(0.4)["seconds"] == 0.4
        before = len(ls442.api.events())
        ls442.set_link_up("leaf1", "spine2", False)
        deadline = time.monotonic() + 10
        down: list[dict] = []
        while time.monotonic() < deadline and not (down and down[-1].get("took_ms")):
            down = [e for e in ls442.api.events()[before:] if e.get("kind") == "link_down"]
            time.sleep(0.1)
        assert down and down[-1]["took_ms"] >= 400, down
    finally:
        ls442.api.set_reaction_delay(0.0)
        ls442.set_link_up("leaf1", "spine2", True)
        time.sleep(0.5)


def test_in_server_2x8_pings_in_every_mode(in_server, restore_mode):
    _all_modes_ping(in_server, restore_mode)


def test_via_tor_hairpins_through_the_tor(in_server, restore_mode):
    restore_mode(in_server)
    tor_before = _rx(in_server, "tor1")
    in_server.set_mode("local")
    assert ping_count(in_server, "s1g1", "s1g2", 20) == 20
    assert _rx(in_server, "tor1") - tor_before < 5  # local: GPU to GPU stays on the local switch
    in_server.set_mode("via-tor")
    tor_before = _rx(in_server, "tor1")
    assert ping_count(in_server, "s1g1", "s1g2", 20) == 20
    assert _rx(in_server, "tor1") - tor_before >= 40  # each request and reply crosses the ToR


def _rx(fab: Fabric, switch: str) -> int:
    from emulator.probe import switch_rx_packets

    return switch_rx_packets(fab.ofctl_target(switch))


def ping_count(fab: Fabric, src: str, dst: str, n: int) -> int:
    out = fab.host(src).cmd(f"ping -c {n} -i 0.01 -W 1 {fab.ip(dst)}")
    for line in out.splitlines():
        if "received" in line:
            return int(line.split(",")[1].split()[0])
    return 0


def test_transport_over_real_sockets_sprays_across_spines(ls442, restore_mode, tmp_path):
    """The transport's UDP endpoint in two emulated hosts: all bytes arrive, and in spray mode its EVs
    (source ports) spread the packets over every spine."""

    restore_mode(ls442)
    ls442.set_mode("spray")
    spines = [s.name for s in ls442.topology.by_role("spine")]
    # Data enters the spines from h1's leaf; ACKs come back from the receiver's one port, so one path.
    from_leaf1 = {s: ls442.topology.links_between("leaf1", s)[0].port(s) for s in spines}
    before = {s: port_rx_packets(ls442.ofctl_target(s), from_leaf1[s]) for s in spines}
    recv_json, send_json = tmp_path / "recv.json", tmp_path / "send.json"
    cli = command_line("srd")
    recv = ls442.host("h8").popen([*cli, "recv", "--bind", ls442.ip("h8"), "--expect-bytes", "2M",
                                   "--json-out", str(recv_json)])
    try:
        wait_udp_listening(ls442.host("h8"), 7471)
        send = ls442.host("h1").popen([*cli, "send", "--to", ls442.ip("h8"), "--bytes", "2M",
                                       "--policy", "spray", "--json-out", str(send_json)],
                                      stderr=subprocess.PIPE)
        assert send.wait(timeout=90) == 0, send.stderr.read()
        assert recv.wait(timeout=30) == 0
    finally:
        for p in (recv,):
            if p.poll() is None:
                p.kill()
                p.wait()
    sent = json.loads(send_json.read_text())
    got = json.loads(recv_json.read_text())
    assert sent["completed"] and got["bytes"] == sent["bytes"] == 2 * 2**20
    crossed = {s: port_rx_packets(ls442.ofctl_target(s), from_leaf1[s]) - before[s] for s in spines}
    assert all(v > 0.15 * sum(crossed.values()) for v in crossed.values()), crossed
    # Traffic classes: the receiver's ACKs (its socket marks them) leave its host in the control class
    # (5:3), the sender's data in the data class (5:2).
    def classes(host: str) -> dict[str, int]:
        sw, _ = ls442.topology.host_switch(host)
        intf = ls442.topology.links_between(host, sw)[0].intf(host)
        return htb_class_packets(ls442.host(host).cmd(f"tc -s class show dev {intf}"))

    acks, data = classes("h8"), classes("h1")
    assert acks["5:3"] >= sent["datagrams_received"] > 0 and acks["5:2"] < 0.01 * acks["5:3"], acks
    assert data["5:2"] >= sent["datagrams_sent"] and data["5:3"] < 0.01 * data["5:2"], data


def htb_class_packets(tc_output: str) -> dict[str, int]:
    """classid -> packets sent, from `tc -s class show`."""
    found = re.findall(r"^class htb (\S+) .*?\n\s*Sent \d+ bytes (\d+) pkt", tc_output, re.M)
    return {classid: int(packets) for classid, packets in found}


def wait_udp_listening(host, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while f":{port} " not in host.cmd(f"ss -Hlun 'sport = :{port}'"):
        assert time.monotonic() < deadline, f"nothing listens on UDP port {port} in {host.name}"
        time.sleep(0.05)


def port_rx_packets(switch: str, port: int) -> int:
    out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-ports", switch, str(port)],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split("rx pkts=")[1].split(",")[0])


def test_every_switch_daemon_sends_through_a_buffer_that_holds_its_queues(narrowing):
    from emulator import port_buffers

    assert narrowing.isolated, "this machine runs the userspace datapath: private switch daemons"
    want = port_buffers.buffer_bytes(port_buffers.DEFAULT_QUEUE_PACKETS, narrowing.topology.mtu, 2)
    for pid in narrowing.ovs_pids():
        buffers = port_buffers.send_buffers(pid)
        assert 0 in buffers, f"daemon {pid} has no send socket yet: {buffers}"
        assert min(buffers.values()) >= want, buffers


def _minor_faults(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def _fd_targets(fds: Path) -> set[str]:
    out = set()
    for fd in fds.iterdir():
        try:
            out.add(os.readlink(fd))
        except OSError:  # closed meanwhile
            pass
    return out


def test_switch_daemons_keep_their_heap_between_wake_ups(narrowing):
    # Each port poll allocates a burst of MTU-sized buffers; had the daemons' heaps been trimmed on
    # every free, each paced packet would fault those pages in again (tens of faults per packet).
    pids = narrowing.ovs_pids()
    for pid in pids:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert any(e.startswith(b"MALLOC_TRIM_THRESHOLD_=") for e in env), f"daemon {pid} trims its heap"
        # make setup installs tcmalloc, whose free lists hold those buffers (glibc's malloc of them is slow).
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert "libtcmalloc_minimal.so" in maps, f"daemon {pid} runs on glibc's malloc"
        # ... and pollskip, built by make setup, saves the reads its poll() found empty.
        assert "fabriclab-pollskip.so" in maps, f"daemon {pid} runs without pollskip"
    run_probe(narrowing, "h1", "h2", packets=50, rate_pps=500.0, size=1000)  # warm: heaps at their peak
    # pollskip answers each daemon's main-loop poll() from an epoll set: one in every daemon, which
    # picked it after detaching (a fork before its first poll must not leave it on poll()).
    for pid in pids:
        fds = Path(f"/proc/{pid}/fd")
        assert "anon_inode:[eventpoll]" in _fd_targets(fds), f"daemon {pid}'s main loop polls without epoll"
    before = sum(_minor_faults(p) for p in pids)
    res = run_probe(narrowing, "h1", "h2", packets=400, rate_pps=500.0, size=1000)
    faults = sum(_minor_faults(p) for p in pids) - before
    assert res.packets_received == 400, res
    assert faults < 0.5 * res.packets_received, f"{faults} page faults for {res.packets_received} packets"


def test_a_queue_deeper_than_the_default_socket_buffer_loses_nothing(narrowing):
    # 300 frames of 1400 bytes at 4000/s into a 10 Mb/s uplink: ~230 wait in its queue (limit 1000),
    # far beyond the ~90 that the kernel's default socket buffer let userspace OVS hold, where the rest
    # vanished uncounted.
    res = run_probe(narrowing, "h1", "h2", packets=300, rate_pps=4000.0, size=1400)
    assert res.packets_sent == 300
    assert res.packets_received == 300, res


def test_a_leaf_with_forty_hosts_comes_up_and_forwards(wide_leaf):
    hosts = [h.name for h in wide_leaf.topology.hosts]
    assert wide_leaf.isolated and wide_leaf.ovs_pids(), "its private daemon runs"
    script = Path(wide_leaf.net[wide_leaf.topology.switches[0].name].dir) / "start.sh"
    assert len(script.read_text()) > 4095, "the start script should outgrow a terminal line"
    for dst in (hosts[39], hosts[-1]):  # under the same leaf, and across the spine
        out = wide_leaf.host(hosts[0]).cmd("ping -c2 -W2", wide_leaf.ip(dst))
        assert " 0% packet loss" in out, out
