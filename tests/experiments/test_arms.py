"""The arm-kind registry (experiments.arms): every kind the catalogue uses is registered, says what it
runs as before, and a new kind is one class that the runner, the results and the model all find."""

from __future__ import annotations

from typing import Any

import pytest

from experiments import arms, catalogue, driver, results, traffic
from experiments.analysis.framing import srd_framing
from experiments.arms import Flow, base
from experiments.model import Arm, Fault, SenderSettings
from experiments.runner import RunOutcome
from topologies import parse_spec


def test_the_package_registers_every_kind_the_catalogue_uses():
    assert set(arms.names()) == {"srd", "tcp", "allreduce", "ping", "training"}
    used = {a.kind for e in catalogue.CATALOGUE.values() for a in e.build().arms}
    assert used == set(arms.names())
    with pytest.raises(KeyError, match="unknown arm kind 'nope'; known kinds: "):
        arms.get("nope")


def test_what_each_kind_promises_the_results():
    def having(flag: str) -> set[str]:
        return {n for n in arms.names() if getattr(arms.get(n), flag)}

    assert having("point_to_point") == {"srd", "tcp"}
    assert having("reports_reordering") == {"srd", "allreduce"}
    assert having("flows_required") == {"srd", "tcp", "allreduce", "training"}
    assert {n: arms.get(n).min_wait_s for n in arms.names()} == {"srd": 0.0, "tcp": 0.0, "allreduce": 120.0,
                                                                 "ping": 0.0, "training": 120.0}


@pytest.mark.parametrize(("arm", "text"), [
    (Arm("a", mode="spray", policy="adaptive", recovery="gobackn", delivery="ordered"),
     "transport adaptive/gobackn/ordered over spray"),
    (Arm("b", kind="tcp", mode="ecmp"), "TCP over ecmp"),
    (Arm("c", kind="allreduce", mode="via-tor", policy="single"), "ring all-reduce, single over via-tor"),
    (Arm("d", kind="ping", mode="local", faults=(Fault(1.0, "link_down", "leaf1", "spine1"),)),
     "ping over local; leaf1-spine1 cut at 1 s"),
])
def test_descriptions_come_from_the_kind(arm: Arm, text: str):
    assert arms.describe(arm) == text


def test_a_new_kind_is_one_class(monkeypatch, tmp_path):
    monkeypatch.setattr(base, "_KINDS", dict(base._KINDS))  # the test's kind leaves with the test

    class Echo(base.ArmKind):
        name = "echo"
        point_to_point = True

        def describe(self, arm: Arm) -> str:
            return f"echo over {arm.mode}"

        def parse(self, raw: dict[str, Any], t0: float, n_bins: int) -> list[dict[str, Any]]:
            return [{"src": "h1", "dst": "h2", "index": 0, "bytes": m["bytes"], "goodput_bps": m["bps"],
                     "series_bps": []} for _, m in base.endpoint_files(raw, "echo-")]

        def framing(self, flow: dict[str, Any]):
            return srd_framing()

    assert arms.get("echo").describe(Arm("x")) == "echo over ecmp" == arms.describe(Arm("x", kind="echo"))
    raw = {"t0": 0.0, "traffic_s": 1.0, "samples": [{"t": 0.0, "links": []}], "cpu": [],
           "endpoints": {"echo-0-h1-h2": {"bytes": 1000, "bps": 8000.0}}}
    entry = results.arm_result(Arm("x", kind="echo"), raw, parse_spec("leaf-spine"), ideal=1e6, sized=False)
    assert entry["goodput_bps"] == 8000.0 and entry["goodput_fraction"] == pytest.approx(0.008)
    assert "wire_efficiency" in entry and entry["reorder"] is None
    # A point-to-point kind gets the fabric's ideal, and a traffic matrix may drive it.
    exp, topo = driver.prepare("ecmp-vs-spray")
    exp.arms = [Arm("x", kind="echo")]
    outcome = RunOutcome([(exp.arms[0], raw)], True, 0.0, 1.0, {"x": [Flow("h1", "h4", 0)]}, {"x": 0})
    assert driver.build_document(exp, topo, outcome)["arms"][0]["ideal_bps"] == pytest.approx(4e6)
    matrix = traffic.parse("Nodes 6\nConnections 1\n0->3 start 0 size 10\n", "t.cm")
    assert traffic.apply(exp, topo, matrix).workload.pattern == "matrix"


def test_an_arms_sender_settings_are_typed_and_become_the_senders_options():
    assert SenderSettings().args() == []
    assert SenderSettings(cc="fixed", window=32).args() == ["--cc", "fixed", "--window", "32"]
    assert Arm("x").sender == SenderSettings()
    with pytest.raises(ValueError, match="unknown congestion control 'cubic'; use one of delay, fixed"):
        SenderSettings(cc="cubic")
    with pytest.raises(ValueError, match="window 0 is not a positive number"):
        SenderSettings(window=0)


def test_allreduce_traffic_starts_when_the_last_rank_starts_iterating():
    from experiments.arms import get

    kind = get("allreduce")
    raw = {"t0_unix": 1000.0, "endpoints": {"allreduce-0-h1.json": {"started_unix": 1002.5},
                                            "allreduce-1-h2.json": {"started_unix": 1003.0}}}
    assert kind.traffic_starts(raw, 50.0) == 53.0  # numpy, the arrays and the barrier come first
    assert kind.traffic_starts({"endpoints": {}}, 50.0) == 50.0
    assert get("srd").traffic_starts(raw, 50.0) == 50.0  # released once ready: t0 is the start


def test_a_ping_flow_reports_the_median_of_its_replies_beside_pings_summary():
    lines = [f"64 bytes from 10.0.0.2: icmp_seq={i + 1} ttl=64 time={t} ms"
             for i, t in enumerate((4.455, 0.111, 0.30, 0.25, 0.41))]
    text = "\n".join(["PING 10.0.0.2 (10.0.0.2) 56(84) bytes of data.", *lines, "",
                      "--- 10.0.0.2 ping statistics ---",
                      "5 packets transmitted, 5 received, 0% packet loss, time 81ms",
                      "rtt min/avg/max/mdev = 0.111/1.105/4.455/1.678 ms"])
    (flow,) = arms.get("ping").parse({"endpoints": {"ping-0-s1g1-s1g2": {"text": text}}}, 0.0, 10)
    assert (flow["src"], flow["dst"], flow["loss_pct"]) == ("s1g1", "s1g2", 0.0)
    assert flow["rtt_min_s"] == pytest.approx(0.111e-3) and flow["rtt_max_s"] == pytest.approx(4.455e-3)
    # One slow reply pulls the mean to 1.1 ms; the median stays with the rest.
    assert flow["rtt_avg_s"] == pytest.approx(1.105e-3) and flow["rtt_p50_s"] == pytest.approx(0.30e-3)


def test_a_ping_that_printed_no_replies_reports_none():
    (flow,) = arms.get("ping").parse({"endpoints": {"ping-0-h1-h2": {"text": "connect: Network is unreachable"}}},
                                     0.0, 10)
    assert flow["rtt_min_s"] is None and flow["rtt_p50_s"] is None and flow["loss_pct"] is None
