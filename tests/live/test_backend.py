"""The fake backend behaves like the fabric where the live view looks (routing modes, policies, cuts,
loss), and the real backend's workload starts, restarts and stops its processes by id."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from live import state, workload
from live.backend import ControllerLost, FabricBackend, FakeBackend
from topologies import parse_spec

TOPO = parse_spec("leaf-spine:spines=2,leaves=4,hosts=2,rate=10")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def metrics(backend: FakeBackend, clock: Clock, dt: float = 1.0):
    clock.t += dt
    s = backend.links()
    util = state.directed_util(s)
    return state.fabric_metrics(TOPO, util, state.down_links(s)), util, s


def fake(**kw) -> tuple[FakeBackend, Clock]:
    clock = Clock()
    b = FakeBackend(TOPO, clock=clock, noise=0.0, **kw)
    b.start()
    return b, clock


def test_ecmp_single_collides_and_spraying_evens_out():
    b, clock = fake()
    ecmp, _, _ = metrics(b, clock)
    assert ecmp.imbalance > 1.3 and ecmp.hot
    b.set_policy("spray")
    b.set_mode("spray")
    spray, _, _ = metrics(b, clock)
    assert spray.imbalance == pytest.approx(1.0, abs=0.01) and spray.hot == []
    assert spray.goodput_bps >= ecmp.goodput_bps


def test_spray_routing_with_one_source_port_piles_onto_one_uplink():
    # The controller's spray mode reads the source port's low bits: one port per flow = one uplink.
    b, clock = fake(mode="spray", policy="single")
    _, util, _ = metrics(b, clock)
    for leaf in ("leaf1", "leaf2", "leaf3", "leaf4"):
        assert util[(f"{leaf}-spine2", leaf)] == 0.0 and util[(f"{leaf}-spine1", leaf)] > 0.9


def test_counters_grow_with_the_clock_and_match_the_rates():
    b, clock = fake(mode="spray", policy="spray")
    _, util, s0 = metrics(b, clock)
    _, _, s1 = metrics(b, clock, dt=2.0)
    hop = ("leaf1-spine1", "leaf1")
    lk0 = next(lk for lk in s0["links"] if lk["name"] == hop[0])
    lk1 = next(lk for lk in s1["links"] if lk["name"] == hop[0])
    assert (lk1["tx_bytes"] - lk0["tx_bytes"]) * 8 / 2.0 / 10e6 == pytest.approx(util[hop], rel=0.01)
    assert lk1["tx_packets"] > lk0["tx_packets"]


def test_a_cut_link_carries_nothing_and_traffic_moves():
    b, clock = fake(mode="spray", policy="spray")
    b.set_link_up("leaf1", "spine1", False)
    _, util, s = metrics(b, clock)
    assert "leaf1-spine1" in state.down_links(s)
    assert util[("leaf1-spine1", "leaf1")] == 0 and util[("leaf1-spine1", "spine1")] == 0
    assert util[("leaf1-spine2", "leaf1")] > 0.9
    b.set_link_up("spine1", "leaf1", True)
    _, util, s = metrics(b, clock)
    assert not state.down_links(s) and util[("leaf1-spine1", "leaf1")] > 0.4


def test_loss_costs_goodput_and_adaptive_steers_around_it():
    b, clock = fake(mode="spray", policy="spray")
    clean, _, _ = metrics(b, clock)
    b.set_loss("leaf1", "spine1", 5.0)
    lossy, _, _ = metrics(b, clock)
    assert lossy.goodput_bps < clean.goodput_bps
    b.set_policy("adaptive")
    _, util, _ = metrics(b, clock)
    assert util[("leaf1-spine1", "leaf1")] == 0.0  # adaptive backs off the lossy entropy values
    b.set_loss("leaf1", "spine1", 0)
    _, util, _ = metrics(b, clock)
    assert util[("leaf1-spine1", "leaf1")] > 0.4


def test_single_routing_pins_one_path_per_destination_whatever_the_ports():
    b, clock = fake(mode="single", policy="spray")
    _, sprayed, _ = metrics(b, clock)
    b.set_policy("single")
    _, pinned, _ = metrics(b, clock)
    assert sprayed == pytest.approx(pinned)


def test_faults_for_tests():
    b, clock = fake()
    b.kill_controller()
    with pytest.raises(ControllerLost):
        b.links()
    b.revive_controller()
    b.kill_workload("h1", "boom")
    st = b.workload_status()
    assert st["alive"] == st["processes"] - 1 and st["new_exits"] == ["sender on h1 exited: boom"]
    assert b.workload_status()["new_exits"] == []  # reported once
    _, util, _ = metrics(b, clock)
    assert util[("h1-leaf1", "h1")] == 0.0
    b.set_policy("spray")  # a policy change restarts the senders, as the real backend does
    assert b.workload_status()["alive"] == st["processes"]


def test_the_fake_draws_three_tier_fabrics_too():
    topo = parse_spec("fat-tree:k=4")
    b = FakeBackend(topo, mode="spray", policy="spray", noise=0.0)
    b.start()
    s = b.links()
    m = state.fabric_metrics(topo, state.directed_util(s))
    assert m.goodput_bps > 0 and m.imbalance < 1.5


# -- the real backend's parts that need no fabric ---------------------------------------------------


def test_plans():
    pairs = workload.plan_pairs(TOPO, "permutation", 1)
    leaf = {h.name: TOPO.host_switch(h.name)[0] for h in TOPO.hosts}
    assert sorted(s for s, _ in pairs) == sorted(d for _, d in pairs) == sorted(leaf)
    assert all(leaf[s] != leaf[d] for s, d in pairs)
    ring = workload.ring_order(TOPO)
    assert ring[:4] == ["h1", "h3", "h5", "h7"]
    assert all(leaf[s] != leaf[d] for s, d in workload.plan_pairs(TOPO, "allreduce", 1))
    with pytest.raises(ValueError, match="unknown workload"):
        workload.plan_pairs(TOPO, "incast", 1)


class StubHost:
    """Runs a stand-in process instead of the command (recorded), outside any namespace."""

    def __init__(self, log: list[list[str]], name: str) -> None:
        self.log, self.name = log, name

    def popen(self, cmd, **kw):
        self.log.append(cmd)
        script = "import sys,time; sys.stderr.write('srd: bound\\n'); sys.stderr.flush(); time.sleep(60)"
        if self.name == "h3" and "send" in cmd:
            script = "import sys; sys.stderr.write('srd send: error: no route to host\\n'); sys.exit(2)"
        return subprocess.Popen([sys.executable, "-c", script], **kw)


class StubFabric:
    def __init__(self) -> None:
        self.topology = TOPO
        self.cmds: list[list[str]] = []

    def host(self, name: str) -> StubHost:
        return StubHost(self.cmds, name)

    def ip(self, name: str) -> str:
        return TOPO.node(name).address


@pytest.mark.timeout(60)
def test_workload_starts_restarts_and_stops_by_pid():
    fab = StubFabric()
    w = workload.Workload(fab, "permutation", "single", seed=1)
    try:
        w.start()
        recv = [c for c in fab.cmds if "recv" in c]
        send = [c for c in fab.cmds if "send" in c]
        assert len(recv) == len(send) == len(TOPO.hosts)
        ports = [c[c.index("--base-port") + 1] for c in send]
        assert len(set(ports)) == len(ports)  # every sender its own base port
        assert all(c[c.index("--policy") + 1] == "single" for c in send)
        deadline = time.monotonic() + 10
        while not w.status()["exited"] and time.monotonic() < deadline:
            time.sleep(0.05)
        st = w.status()
        assert st["exited"] == ["sender on h3 exited with code 2: srd send: error: no route to host"]
        old = [p.popen for p in w.senders]
        receivers = [p.popen for p in w.receivers]
        w.set_policy("spray")
        assert all(p.poll() is not None for p in old)  # the old senders were ended
        assert all(p.poll() is None for p in receivers)  # the receivers kept running
        assert all(c[c.index("--policy") + 1] == "spray" for c in fab.cmds[-len(send):])
        assert w.status()["policy"] == "spray"
    finally:
        procs = [p.popen for p in w.senders + w.receivers]
        w.stop()
    assert all(p.poll() is not None for p in procs)
    assert not w.logdir.exists()


class StubProc:
    def __init__(self, code: int | None) -> None:
        self.returncode = code

    def poll(self) -> int | None:
        return self.returncode


class StubController:
    def __init__(self, code: int | None) -> None:
        self.proc = StubProc(code)  # None: still running
        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            self.api_port = s.getsockname()[1]


def test_fabric_backend_reports_a_lost_controller():
    b = FabricBackend(TOPO)
    with pytest.raises(ControllerLost, match="not running"):
        b.links()
    b.fab = type("F", (), {"controller": StubController(3)})()
    with pytest.raises(ControllerLost, match="exited with code 3"):
        b.links()
    b.fab = type("F", (), {"controller": StubController(None)})()
    with pytest.raises(ControllerLost, match="does not answer"):
        b.links()
    assert b.workload_status()["processes"] == 0


def test_the_live_view_has_the_controller_poll_at_its_own_interval(monkeypatch):
    """On a large fabric the emulator polls less often than every 0.5 s; the view asks for its --interval."""
    import emulator.system
    from cli.live import build_backend
    from cli.main import build_parser

    monkeypatch.setattr(emulator.system, "require_ready", lambda caps: None)
    monkeypatch.setattr(emulator.system, "capabilities", lambda: None)
    args = build_parser().parse_args(["live", "--topo", "fat-tree:k=8", "--interval", "0.25"])
    backend = build_backend(args)
    assert isinstance(backend, FabricBackend) and backend.poll_interval == 0.25
    import emulator.cluster

    asked: dict = {}

    def new_fabric(topo, **kwargs):
        asked.update(kwargs)
        raise RuntimeError("no fabric in a unit test")

    monkeypatch.setattr(emulator.cluster, "new_fabric", new_fabric)
    with pytest.raises(RuntimeError, match="no fabric"):
        backend.start()
    assert asked["poll_interval"] == 0.25
