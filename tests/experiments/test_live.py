"""Every experiment at a reduced size on a real fabric: results.json validates, and the effects that are
robust at this size with a fixed seed point the right way. No magic numbers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from experiments import driver, schema

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _run(tmp_path: Path, name: str, duration: float, arms: list[str] | None = None, topo: str | None = None):
    exp, topology = driver.prepare(name, topo=topo, duration=duration)
    if arms is not None:
        exp = replace(exp, arms=[a for a in exp.arms if a.name in arms])
    rendered = driver.execute(exp, topology, out_dir=tmp_path / name)
    doc = rendered.doc
    assert schema.validate(doc) == [], schema.validate(doc)
    assert doc["complete"]
    assert (rendered.out_dir / "summary.md").exists() and rendered.plots
    by = {a["name"]: a for a in doc["arms"]}
    for a in doc["arms"]:
        assert a["error"] is None, f"{a['name']}: {a['error']}"
    return doc, by


def _sane(arm):
    assert arm["goodput_bps"] >= 0 and arm["ideal_bps"] >= 0
    assert arm["goodput_bps"] <= 1.05 * arm["ideal_bps"] or arm["ideal_bps"] == 0


def test_ecmp_vs_spray(tmp_path):
    # Three hosts per leaf over two uplinks: ECMP collides on every leaf whatever the hash (pigeonhole).
    doc, by = _run(tmp_path, "ecmp-vs-spray", 3)
    for a in by.values():
        _sane(a)
        assert a["goodput_bps"] > 0
    assert by["spray"]["goodput_bps"] > by["ecmp-single"]["goodput_bps"]
    assert by["spray"]["link_imbalance"] < by["ecmp-single"]["link_imbalance"]
    assert doc["analysis"]["ecmp_expectation"]["prob_any_collision"] == 1.0
    # The same definition on the simulated engine (a small `fabriclab validate-engines`): spraying's
    # goodput agrees within 10 %, and ECMP puts every flow on the same fabric links as the live switches.
    from experiments import validate_engines
    from experiments.analysis.links import fabric_hops
    from experiments.model import experiment_from_dict

    exp = experiment_from_dict(doc["experiment_definition"])
    exp = replace(exp, arms=[a for a in exp.arms if a.kind == "srd"])
    topo = driver.parse_spec(exp.topology)
    sim = driver.execute(exp, topo, out_dir=tmp_path / "sim", engine="sim").doc
    rows = {(r["arm"], r["key"]): r for r in validate_engines.compare(doc, sim, fabric_hops(topo))}
    assert not rows[("spray", "goodput_fraction")]["over"], rows[("spray", "goodput_fraction")]
    assert not rows[("ecmp-single", "paths")]["over"], rows[("ecmp-single", "paths")]


def test_loss_recovery_selective_at_least_gobackn(tmp_path):
    _doc, by = _run(tmp_path, "loss-recovery", 3, arms=["selective@1%", "gobackn@1%", "tcp@1%"])
    assert by["selective@1%"]["goodput_bps"] >= by["gobackn@1%"]["goodput_bps"]
    assert by["selective@1%"]["retransmissions"] > 0
    assert by["selective@1%"]["loss_method"] in ("netem", "nftables")
    # TCP, timed by tcpflow: what was acknowledged within the arm's time, the kernel's retransmissions.
    tcp = by["tcp@1%"]
    assert tcp["goodput_bps"] > 0 and tcp["retransmissions"] > 0
    assert all(f["completed"] and f["stop_reason"] == "duration" for f in tcp["flows"])


def test_reordering(tmp_path):
    _doc, by = _run(tmp_path, "reordering", 3)
    assert by["spray-unordered"]["reorder"]["out_of_order"] > by["single-ordered"]["reorder"]["out_of_order"]


def test_hot_link(tmp_path):
    doc, by = _run(tmp_path, "hot-link", 4)
    assert "share_after_fault" in doc["analysis"]
    assert all(a["faults"] and a["faults"][0]["kind"] == "rate" for a in by.values())


def test_failover(tmp_path):
    _doc, by = _run(tmp_path, "failover", 4)
    for a in by.values():
        assert a["faults"] and a["faults"][0]["kind"] == "link_down"
        assert "recovery_s" in a


def test_in_server(tmp_path):
    doc, _by = _run(tmp_path, "in-server", 2)
    lat = doc["analysis"]["latency"]
    # Fewer switches, a lower median. Not the mean (0.54 ms locally against 0.51 via the ToR once, on a
    # slow machine: one slow reply moves it), nor the minimum, which is whether some ping found its
    # daemons awake (local 45-200 µs over runs of one machine, once 160 against 152 via the ToR).
    assert 0 < lat["local"]["rtt_p50_s"] < lat["via-tor"]["rtt_p50_s"]
    assert all(lat[m]["rtt_min_s"] <= lat[m]["rtt_p50_s"] for m in ("local", "via-tor"))
    for mode in ("local", "via-tor"):
        assert doc["analysis"]["allreduce"][mode]["correct"] is True


def test_allreduce_equals_numpy(tmp_path):
    _doc, by = _run(tmp_path, "allreduce", 3, arms=["ecmp", "spray"])
    for a in by.values():
        assert a["correct"] is True
        assert a["iteration_s"] and a["bound_s"] and a["iteration_s"] >= a["bound_s"] * 0.95


def test_run_with_a_traffic_matrix(tmp_path):
    # A small htsim connection matrix through the command line: each flow carries its own size in every
    # arm (transport and TCP), and the sized flows get slowdowns.
    import json
    import subprocess
    import sys

    cm = tmp_path / "small.cm"
    cm.write_text("Nodes 6\nConnections 3\n0->3 id 1 start 0 size 300000\n1->4 id 2 start 0 size 150000\n"
                  "5->2 id 3 start 0 size 300000\n")
    out = subprocess.run([sys.executable, "-m", "cli", "run", "ecmp-vs-spray", "--traffic", str(cm),
                          "--out", str(tmp_path / "results"), "--json", "--no-progress"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    assert schema.validate(doc) == [], schema.validate(doc)
    assert doc["complete"] and doc["extra"]["traffic_matrix"]["connections"] == 3
    want = [("h1", "h4", 300000), ("h2", "h5", 150000), ("h6", "h3", 300000)]
    for a in doc["arms"]:
        assert a["error"] is None, f"{a['name']}: {a['error']}"
        got = sorted((f["src"], f["dst"], f["bytes"]) for f in a["flows"])
        assert [g[:2] for g in got] == [w[:2] for w in want], a["name"]
        for (_, _, size), (_, _, wanted) in zip(got, want, strict=True):
            # Both the transport and the sized-TCP tool send exactly the bytes asked for.
            assert size == wanted, (a["name"], got)
        assert a["completion_kind"] == "flow" and a["slowdown_flows"] == 3
        # A shaped link starts with a full token bucket (HTB burst, 15 kB), so a flow of a few hundred kB
        # can beat size / rate by a few per cent: slowdown a little under 1 is the emulated link, not an error.
        assert a["slowdown_max"] >= a["slowdown_mean"] >= 0.9
        assert all(f["base_rtt_s"] > 0 and f["ideal_fct_s"] > 0 for f in a["flows"])


def test_incast_credit_shares_the_receiver_and_nothing_vanishes(tmp_path):
    # The default 8:1 incast (2 MB flows, jumbo frames) with receiver credit and with the delay
    # controller: credit keeps the receiver's queue shorter and the flows closer together; neither
    # loses a packet where no queue counts it (the switches' send sockets hold their queues).
    _doc, by = _run(tmp_path, "incast", 6, arms=["credit-spray", "delay-spray"])
    credit, delay = by["credit-spray"], by["delay-spray"]
    for a in (credit, delay):
        assert a["vanished_packets"] == 0, a["name"]
        assert a["incast_completion_ratio"] is not None and a["incast_completion_ratio"] >= 1.0
    assert credit["receiver_queue_drops"] == 0
    # The target is 1.05; measured 1.02-1.04 (five runs), 1.01 later. Once, in a full suite, it
    # read 1.11: a starved emulator finishes late. When the arm's own CPU verdict says it was starved,
    # the figure is the machine's, not credit's; a broken credit scheme still reads far above 1.25.
    bound = 1.10 if credit["fidelity"]["trusted"] else 1.25
    assert credit["incast_completion_ratio"] <= bound, (credit["incast_completion_ratio"], credit["fidelity"])
    assert credit["queue_max_packets"] < delay["queue_max_packets"]
    assert credit["completion_spread"] <= delay["completion_spread"]
