"""results.json from synthetic raw material (no root): schema, summary rendering, report re-render."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments import catalogue, driver, overrides, report, results, schema
from experiments.runner import Flow, RunOutcome
from experiments.scenarios.common import repetitions_sentence
from topologies import parse_spec
from transport.core import schema as transport_schema

SPEC = "leaf-spine:spines=2,leaves=2,hosts=1,rate=10"


def _samples(topo, t0, secs, bytes_on):
    out = []
    for i in range(int(secs / 0.5) + 1):
        links = []
        for lk in topo.links:
            b = int(bytes_on.get(lk.name, 0) * i * 0.5)
            links.append({"name": lk.name, "a": lk.a, "b": lk.b, "tx_bytes": b, "rx_bytes": b // 20,
                          "tx_packets": b // 1400, "rx_packets": b // 28000, "drops": 0,
                          "util_ab": 8 * bytes_on.get(lk.name, 0) / (lk.rate_mbps * 1e6), "util_ba": 0.0})
        out.append({"t": t0 + i * 0.5, "links": links})
    return out


def _raw(topo, goodput_bps, spine):
    t0 = 1000.0
    rate = goodput_bps / 8
    sender = {
        "bytes": int(rate * 4), "goodput_bps": goodput_bps, "duration": 4.0, "completed": True,
        "stop_reason": "completed", "connection_id": 7, "socket_drops": 0,
        "completion_times": {"count": 10, "p50": 0.05, "p99": 0.09},
        "connection": {"sender": {"retransmissions": 3, "spurious_retransmissions": 1, "timeouts": 0,
                                  "loss_recovery": {"p50": 0.004}, "rtt": {"p50": 0.002}},
                       "state": {"srtt": 0.002, "rttvar": 0.0005}},
    }
    receiver = {"socket_drops": 0, "connections": [{"connection_id": 7, "transport": {"receiver": {
        "out_of_order": 40, "data_packets": 1000, "reorder_distance": {"1": 30, "2-3": 10},
        "peak_reassembly_bytes": 5000, "goodput": {"start": t0 + 0.05, "bin": 0.05, "bps": [goodput_bps] * 80}}}}]}
    return {
        "t0": t0, "traffic_s": 4.0, "samples": _samples(topo, t0, 4.0, {"h1-leaf1": rate, f"leaf1-{spine}": rate}),
        "cpu": [{"t": t0 + 2 + i * 0.5, "idle": 0.5} for i in range(4)],
        "qdisc_before": {}, "qdisc_after": {}, "endpoints": {"send-0-h1-h2": sender, "recv-h2": receiver},
        "faults": [], "bring_up_s": 1.0, "teardown_s": 0.5, "wall_s": 7.0,
    }


@pytest.fixture
def doc():
    exp, topo = driver.prepare("ecmp-vs-spray", topo=SPEC, duration=4)
    arms = exp.arms[:2]
    outcome = RunOutcome(
        raws=[(arms[0], _raw(topo, 6e6, "spine1")), (arms[1], {"error": "RuntimeError: boom", "repetition": 0})],
        complete=True, started=0.0, finished=10.0,
        flows={a.name: [Flow("h1", "h2", 0)] for a in arms}, bytes_per_flow={a.name: 1 << 20 for a in arms},
    )
    exp.arms = arms
    return driver.build_document(exp, topo, outcome)


def test_document_has_the_schema(doc):
    assert schema.validate(doc) == []
    arm = doc["arms"][0]
    assert arm["goodput_bps"] == pytest.approx(6e6)
    assert arm["ideal_bps"] == pytest.approx(10e6)
    assert arm["retransmissions"] == 3
    assert arm["reorder"]["out_of_order_fraction"] == pytest.approx(0.04)
    assert arm["completion_kind"] == "flow" and arm["completion_p50_s"] == pytest.approx(4.0)
    assert arm["fidelity"]["trusted"] and arm["fidelity"]["cpu_idle_min"] == 0.5
    # The failing arm keeps its place and its error; the others are not lost.
    assert doc["arms"][1]["error"] == "RuntimeError: boom"
    assert "ecmp_expectation" in doc["analysis"]
    json.dumps(doc)


def test_validate_reports_missing_and_mistyped_keys(doc):
    bad = json.loads(json.dumps(doc))
    del bad["seed"]
    bad["arms"][0]["goodput_bps"] = "fast"
    problems = schema.validate(bad)
    assert "results: no key 'seed'" in problems and "results.arms[0].goodput_bps: str is not float" in problems
    # One checker for endpoints' files and results alike: unknown keys and nested types count too.
    bad = json.loads(json.dumps(doc))
    bad["arms"][0]["goodput_bsp"] = 1.0
    bad["arms"][0]["fidelity"]["trusted"] = "yes"
    bad["arms"][1]["goodput_bps"] = -1.0
    assert schema.validate(bad) == ["results.arms[0]: unknown key 'goodput_bsp'",
                                    "results.arms[0].fidelity.trusted: str is not bool",
                                    "results.arms[1] (spray): negative goodput"]
    assert schema.problems is transport_schema.problems


def test_summary_is_generated_from_the_numbers(doc):
    sentences = driver.sentences_for(doc)
    text = report.summary_markdown(doc, sentences, [])
    assert "| ecmp-single |" in text and "6.00 Mb/s" in text
    assert "Balls in bins" in text and "ERROR" in text
    assert "kept up" in text
    # Change the numbers: the text follows.
    doc["arms"][0]["fidelity"].update(trusted=False, reasons=["CPU idle fell to 5%"], cpu_idle_min=0.05)
    doc["fidelity"] = results.worst_fidelity(doc["arms"])
    text = report.summary_markdown(doc, driver.sentences_for(doc), [])
    assert "cannot be trusted" in text and "CPU idle fell to 5%" in text


def test_a_repeated_runs_rows_name_their_repetition(tmp_path: Path):
    exp, topo = driver.prepare("ecmp-vs-spray", topo=SPEC, duration=4, repetitions=2)
    arm = exp.arms[0]
    raws = []
    for rep in range(2):
        raw = _raw(topo, (6e6, 8e6)[rep], "spine1")
        raw["repetition"] = rep
        raws.append((arm, raw))
    exp.arms = [arm]
    outcome = RunOutcome(raws=raws, complete=True, started=0.0, finished=10.0,
                         flows={arm.name: [Flow("h1", "h2", 0)]}, bytes_per_flow={arm.name: 1 << 20})
    doc = driver.build_document(exp, topo, outcome)
    assert [a["label"] for a in doc["arms"]] == ["ecmp-single (rep 1)", "ecmp-single (rep 2)"]
    assert schema.validate(doc) == []
    text = report.summary_markdown(doc, driver.sentences_for(doc), [])
    assert "| ecmp-single (rep 1) |" in text and "| ecmp-single (rep 2) |" in text
    assert "seeds 1-2 (one per repetition)" in text and "1 arm(s), 2 repetitions of each" in text
    assert text.count("- **ecmp-single**:") == 1  # the arm's details once
    # Each arm's spread over the repetitions, and which repetition the comparisons read.
    assert ("Across 2 repetitions (one seed each), goodput min, median, max: ecmp-single 6.0 Mb/s, 7.0 Mb/s, "
            "8.0 Mb/s. The comparisons below read repetition 2.") in text
    assert "ECMP with one entropy value per flow carried 8.0 Mb/s" in text
    # An experiment whose analysis reads every repetition (failover's medians) names none.
    assert repetitions_sentence(doc, across=True)[0].endswith("8.0 Mb/s.")
    assert catalogue.get("failover").across_repetitions and not catalogue.get("ecmp-vs-spray").across_repetitions
    # A results.json stored before arms carried labels is labelled when rendered again.
    for a in doc["arms"]:
        del a["label"]
    driver.render(doc, tmp_path)
    assert "| ecmp-single (rep 2) |" in (tmp_path / "summary.md").read_text()


def test_report_rerenders_from_stored_results(doc, tmp_path: Path):
    rendered = driver.render(doc, tmp_path)
    assert (tmp_path / "results.json").exists() and rendered.summary.exists()
    (tmp_path / "summary.md").unlink()
    for p in rendered.plots:
        (tmp_path / p).unlink()
    again = driver.rerender(tmp_path)
    assert again.summary.read_text() == rendered.summary.read_text()
    assert sorted(again.plots) == sorted(rendered.plots) and "link_utilisation.png" in again.plots
    assert all((tmp_path / p).stat().st_size > 1000 for p in again.plots)


def test_catalogue_builds_every_experiment_and_scales_faults():
    for name, entry in catalogue.CATALOGUE.items():
        exp = entry.build()
        assert exp.name == name and exp.arms and exp.duration_s > 0
        parse_spec(exp.topology)
    fo = catalogue.get("failover").build()
    short = overrides.with_overrides(fo, duration=fo.duration_s / 2, seed=9)
    assert short.arms[0].faults[0].at_s == pytest.approx(fo.arms[0].faults[0].at_s / 2)
    assert short.seed == 9


def test_a_shorter_run_shrinks_an_all_reduce_array_with_a_floor():
    ar = catalogue.get("allreduce").build()
    assert overrides.with_overrides(ar, duration=ar.duration_s / 4).workload.elements == ar.workload.elements // 4
    tiny = overrides.with_overrides(ar, duration=0.01).workload
    assert tiny.elements == overrides.MIN_COLLECTIVE_ELEMENTS and tiny.iterations == ar.workload.iterations
    ecmp = catalogue.get("ecmp-vs-spray").build()
    assert overrides.with_overrides(ecmp, duration=1).workload == ecmp.workload
    # An arm's own all-reduce (in-server's, beside its pings) scales too.
    ins = catalogue.get("in-server").build()
    longer = overrides.with_overrides(ins, duration=4 * ins.duration_s)
    for before, after in zip(ins.arms, longer.arms, strict=True):
        if before.workload is None:
            assert after.workload is None
        else:
            assert after.workload.elements == 4 * before.workload.elements
            assert after.workload.pairs == before.workload.pairs


def test_cli_list_and_report(doc, tmp_path: Path, capsys):
    from cli.main import main

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in catalogue.CATALOGUE)
    driver.render(doc, tmp_path)
    assert main(["report", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["experiment"] == "ecmp-vs-spray"
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    assert main(["run", "no-such-experiment"]) == 2


def test_arms_keeps_the_named_arms_in_order_and_names_the_choices_when_wrong():
    lr = catalogue.get("loss-recovery").build()
    names = [a.name for a in lr.arms]
    picked = overrides.with_overrides(lr, arms=[names[3], names[0]])
    assert [a.name for a in picked.arms] == [names[0], names[3]]
    with pytest.raises(overrides.ArmNotFound, match=f"no arm 'nope'; its arms are {names[0]}"):
        overrides.with_overrides(lr, arms=["nope"])


def test_traffic_idle_judges_samples_inside_the_traffic_window_only():
    from experiments.results import traffic_idle

    # Samples every 0.5 s; traffic from t=10.25 to t=12.0. The sample ending at 10.5 is half start-up.
    cpu = [{"t": 10.0 + 0.5 * i, "dt": 0.5, "idle": idle} for i, idle in enumerate([0.0, 0.2, 0.7, 0.6, 0.8, 0.1])]
    assert traffic_idle(cpu, 10.25, 12.0) == [0.7, 0.6, 0.8]
    # A window shorter than a sample still has a verdict: the sample covering most of it.
    assert traffic_idle(cpu, 10.6, 10.9) == [0.7]
    assert traffic_idle([], 0.0, 1.0) == []


def test_traffic_ends_when_the_longest_flow_ends_not_when_endpoints_exit():
    from experiments.results import traffic_ends

    flows = [{"duration_s": 8.5}, {"duration_s": 7.0}]
    assert traffic_ends(flows, 100.0, 0.0, 112.5) == 108.5
    assert traffic_ends(flows, 100.0, 2.0, 112.5) == 110.5  # a later start counts in full
    assert traffic_ends(flows, 100.0, 5.0, 112.5) == 112.5  # never after the exit
    assert traffic_ends([{"duration_s": None}, {"duration_s": 3.0}], 100.0, 0.0, 112.5) == 112.5
    assert traffic_ends([], 100.0, 0.0, 112.5) == 112.5


def _vanishing_raw(topo, sent: int, arrived: int, queue_drops: int, completed: bool = True):
    raw = _raw(topo, 6e6, "spine1")
    sender = raw["endpoints"]["send-0-h1-h2"]
    sender["completed"] = completed
    sender["connection"]["sender"].update(packets_sent=sent, retransmissions=sent - 1000)
    rcv = raw["endpoints"]["recv-h2"]["connections"][0]["transport"]["receiver"]
    rcv.update(datagrams_seen=arrived, duplicates=arrived - 1000, dropped_total=0)
    raw["qdisc_before"] = {"leaf2-eth1": {"sent_packets": 0, "dropped": 0}}
    raw["qdisc_after"] = {"leaf2-eth1": {"sent_packets": 1000, "dropped": queue_drops}}
    return raw


@pytest.mark.parametrize("sent,arrived,queue_drops,completed,vanished", [
    (1060, 1005, 0, True, 55),    # 55 sent and never seen, no queue dropped any: the emulator lost them
    (1060, 1005, 55, True, 0),    # every loss is a drop some queue counted
    (1060, 1005, 70, True, 0),    # queues dropped more (ACKs too): still nothing unexplained
    (1060, 1005, 0, False, None),  # data still in flight: not judged
])
def test_packets_sent_and_never_received_beyond_queue_drops_make_an_arm_untrusted(
        sent, arrived, queue_drops, completed, vanished):
    exp, topo = driver.prepare("ecmp-vs-spray", topo=SPEC, duration=4)
    arm = exp.arms[1]
    entry = results.arm_result(arm, _vanishing_raw(topo, sent, arrived, queue_drops, completed), topo, 10e6, True)
    assert entry["vanished_packets"] == vanished
    fid = entry["fidelity"]
    assert fid["drops_outside_queues"] == (vanished or 0)
    assert fid["trusted"] is not bool(vanished)
    if vanished:
        assert any("never received" in r for r in fid["reasons"])


def test_vanished_packets_are_not_judged_where_the_arm_loses_packets_on_purpose():
    exp, topo = driver.prepare("ecmp-vs-spray", topo=SPEC + ",loss=1", duration=4)
    entry = results.arm_result(exp.arms[1], _vanishing_raw(topo, 1060, 1005, 0), topo, 10e6, True)
    assert entry["vanished_packets"] is None


def test_ovs_drops_count_from_a_links_first_reading_not_from_before_its_switch_was_read():
    topo = parse_spec("leaf-spine:spines=1,leaves=1,hosts=1")

    def row(drops: int, counted: bool) -> dict:
        return {"name": "leaf1-spine1", "drops": drops, "counted_at": "leaf1:2" if counted else None}

    def ovs_drops(*rows: dict) -> int:
        return results._drops({"samples": [{"t": float(i), "links": [r]} for i, r in enumerate(rows)]}, topo)[1]

    # Dropped at bring-up, before the controller's first read of the switch: not the arm's.
    assert ovs_drops(row(0, False), row(1, True), row(1, True)) == 0
    assert ovs_drops(row(0, True), row(1, True), row(3, True)) == 3  # counted from the first reading
    assert ovs_drops(row(0, False), row(2, True), row(5, True)) == 3
    assert ovs_drops(row(0, False), row(0, False)) == 0
