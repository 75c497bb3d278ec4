"""The simulated engine: ports and queues, forwarding by the controller's own entries (the same next
hop as `rules.ecmp_port` and spray's EV digits), whole arms on a seeded virtual clock, faults, the CLI."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from emulator.controller.rules import compute_rules, ecmp_port
from emulator.sim.fabric import SimFabric
from experiments import driver
from experiments.model import Arm, Fault
from experiments.runner import plan_flows
from experiments.sim_arm import SimUnsupported, check_arm, run_arm_sim
from topologies import parse_spec
from transport.core.contract import DEFAULT_BASE_PORT, DEFAULT_PORT
from transport.sim.netsim import Port

ROOT = Path(__file__).resolve().parents[2]
DEMO = "leaf-spine:spines=2,leaves=2,hosts=3,host_rate=4,fabric_rate=6,mtu=1500"


def test_a_port_queues_bytes_marks_ecn_and_lets_control_pass_data():
    p = Port(0, 1, rate_bps=8e6, delay=0.001, queue_bytes=3000, ecn_bytes=1000)  # 1 byte per µs
    first = p.transmit(1000, 0.0, control=False)
    assert first == (pytest.approx(0.001), False)
    second = p.transmit(1000, 0.0, control=False)
    assert second is not None and second[1] is True  # 1000 bytes were queued: marked
    assert p.transmit(1000, 0.0, control=False) is not None
    assert p.transmit(1000, 0.0, control=False) is None  # 3000 bytes queued: full
    ack = p.transmit(100, 0.0, control=True)
    assert ack is not None and ack[0] == pytest.approx(0.0011)  # after the frame on the wire only
    p.cut()
    assert not p.up and p.backlog(0.0) == 0


@pytest.mark.parametrize("mode", ["ecmp", "single", "spray"])
def test_each_hop_is_the_one_the_controllers_entries_choose(mode):
    topo = parse_spec("fat-tree:k=4,rate=1000")
    fab = SimFabric(topo, mode)
    rules = compute_rules(topo, mode)
    hosts = topo.hosts
    for i, src in enumerate(hosts):
        dst = hosts[(i + 5) % len(hosts)]
        for ev in (0, 3, 7):
            key = (src.address, dst.address, 17, DEFAULT_BASE_PORT + ev, DEFAULT_PORT)
            names = fab.route_names(key)
            assert names[0] == src.name and names[-1] == dst.name
            for here, nxt in itertools.pairwise(names[1:]):
                entry = next(e for e in rules[here] if e.table == 0 and dict(e.match).get("ipv4_dst") == dst.address
                             and "in_port" not in dict(e.match))
                if mode == "spray":
                    continue  # spray's EV entries outrank the hash: checked below
                port = ecmp_port(entry, rules[here], *key)
                assert topo.links_between(here, nxt)[0].port(here) == port


def test_spray_reads_one_digit_of_the_ev_per_tier():
    # k=4: 4 paths between pods; 16 consecutive EVs put 4 on each core.
    topo = parse_spec("fat-tree:k=4,rate=1000")
    fab = SimFabric(topo, "spray")
    src, dst = topo.hosts[0], topo.hosts[-1]
    cores = [fab.route_names((src.address, dst.address, 17, DEFAULT_BASE_PORT + ev, DEFAULT_PORT))[3]
             for ev in range(16)]
    assert sorted({c: cores.count(c) for c in cores}.values()) == [4, 4, 4, 4]
    # The ACK answering EV e takes the path back along its data's.
    for ev in range(16):
        there = fab.route_names((src.address, dst.address, 17, DEFAULT_BASE_PORT + ev, DEFAULT_PORT))
        back = fab.route_names((dst.address, src.address, 17, DEFAULT_PORT, DEFAULT_BASE_PORT + ev))
        assert back == there[::-1]


def _demo_arm(name, **kw):
    exp, topo = driver.prepare("ecmp-vs-spray", arms=[name])
    arm = exp.arms[0]
    for k, v in kw.items():
        arm = Arm(**{**arm.__dict__, k: v})
    flows = plan_flows(exp.workload, topo, exp.seed)
    from experiments.runner import flow_bytes

    return exp, topo, arm, flows, flow_bytes(exp.workload, topo, exp.duration_s)


def test_the_demo_on_the_simulated_engine_matches_what_the_live_one_measures():
    """The live demo measured spray at 0.98 of the wire with slowdown max 1.02, ECMP at ~0.5 (README)."""
    out = {}
    for name in ("spray", "ecmp-single"):
        exp, topo, arm, flows, nbytes = _demo_arm(name)
        raw = run_arm_sim(exp, arm, topo, flows, exp.duration_s, exp.seed, nbytes)
        from experiments.analysis.placement import ideal_bps
        from experiments.results import arm_result

        entry = arm_result(arm, raw, topo, ideal_bps(topo, [(f.src, f.dst) for f in flows]), True)
        assert entry["error"] is None and entry["fidelity"]["trusted"]
        assert all(f["completed"] for f in entry["flows"])
        out[name] = entry
    assert out["spray"]["goodput_of_wire"] > 0.95 and out["spray"]["slowdown_max"] < 1.06
    assert out["ecmp-single"]["goodput_of_wire"] < 0.6 and out["ecmp-single"]["link_imbalance"] > 1.5
    # Seeded: the same run twice gives the same figures.
    exp, topo, arm, flows, nbytes = _demo_arm("spray")
    again = run_arm_sim(exp, arm, topo, flows, exp.duration_s, exp.seed, nbytes)
    assert again["traffic_s"] == pytest.approx(out["spray"]["timings"]["traffic_s"])


def test_a_cut_is_rerouted_after_the_reaction_delay_and_every_flow_completes():
    exp, topo, arm, flows, nbytes = _demo_arm("spray")
    exp.extra["controller_reaction_s"] = 0.5
    arm = Arm(**{**arm.__dict__, "faults": (Fault(2.0, "link_down", "leaf1", "spine1"),)})
    raw = run_arm_sim(exp, arm, topo, flows, exp.duration_s, exp.seed, nbytes)
    assert raw["faults"][0]["at_s"] == pytest.approx(2.0)
    assert raw["events"]["rule_changes"][0]["t"] == pytest.approx(2.5)
    senders = [v for k, v in raw["endpoints"].items() if k.startswith("send-")]
    assert senders and all(s["completed"] for s in senders)
    assert sum(s["connection"]["sender"]["retransmissions"] for s in senders) > 0  # the cut lost packets


def test_arms_the_simulated_engine_does_not_model_are_named():
    exp, _ = driver.prepare("ecmp-vs-spray")
    tcp = next(a for a in exp.arms if a.kind == "tcp")
    with pytest.raises(SimUnsupported, match="tcp-ecmp runs tcp"):
        check_arm(tcp, exp.workload)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})


def test_run_engine_sim_needs_no_root_and_writes_the_results_and_the_engine(tmp_path):
    r = _cli("run", "ecmp-vs-spray", "--engine", "sim", "--no-progress", "--json", "--duration", "4",
             "--out", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "leaving out tcp-ecmp (tcp)" in r.stderr
    doc = json.loads(r.stdout)
    assert doc["engine"] == "sim" and [a["name"] for a in doc["arms"]] == ["ecmp-single", "spray"]
    assert all(a["sim"]["packet_hops"] > 0 for a in doc["arms"])
    # report re-renders a simulated run from its folder, with the engine's own counters.
    run_dir = next(tmp_path.glob("ecmp-vs-spray/*"))
    r = _cli("report", str(run_dir), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "packet-hops" in (run_dir / "summary.md").read_text() or "packet-hops" in r.stdout


@pytest.mark.parametrize("args,expected", [
    (("--engine", "sim", "--arms", "tcp-ecmp"), "tcp-ecmp runs tcp, which the simulated engine does not model"),
    (("--queue-bytes", "100000"), "add --engine sim"),
])
def test_run_engine_sim_bad_input_is_one_line(tmp_path, args, expected):
    r = _cli("run", "ecmp-vs-spray", "--no-progress", "--out", str(tmp_path), *args, cwd=tmp_path)
    assert r.returncode == 2
    assert expected in r.stderr and "Traceback" not in r.stderr
    assert not list(tmp_path.iterdir())  # nothing half-built


def test_uec_validation_small_scenarios_meet_their_targets_with_the_default_controller():
    from experiments import uec_validation as uec

    doc = uec.run(names=("single-flow", "incast-15"))
    rows = {r["scenario"]: r for r in doc["rows"]}
    assert rows["single-flow"]["completed"] == 1 and rows["incast-15"]["completed"] == 15
    # A 2 MB flow at 100 Gb/s takes 160 µs on the wire: the tail is measured, not assumed.
    assert 160 < rows["single-flow"]["tail_fct_us"] <= 190
    assert 2400 < rows["incast-15"]["tail_fct_us"] <= 2550  # 30 MB through one 100 Gb/s link: 2.4 ms at least
    assert "15:1 incast on 16 nodes" in uec.text_report(doc)


@pytest.mark.parametrize("args,expected", [
    (("uec-validation", "--arms", "single-flow"), "add --engine sim"),
    (("uec-validation", "--engine", "sim", "--arms", "nope"), "has no scenario 'nope'"),
    (("uec-validation", "--engine", "sim", "--topo", "leaf-spine"), "--topo does not apply to uec-validation"),
    (("ecmp-vs-spray", "--engine", "sim", "--cc", "delay,nscc"), "takes one congestion control"),
])
def test_uec_validation_bad_input_is_one_line(tmp_path, args, expected):
    r = _cli("run", *args, "--no-progress", "--out", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert expected in r.stderr and "Traceback" not in r.stderr
