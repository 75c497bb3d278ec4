"""The experiment registry (experiments.catalogue): every scenario module is registered under its own
name, and a new experiment is one module plus its registry line, which the CLI, the driver, the
analysis and the summary all find."""

from __future__ import annotations

import dataclasses
import importlib
import json
import textwrap

import pytest

from experiments import catalogue, driver, report
from experiments.model import DoesNotFit
from experiments.runner import Flow, RunOutcome
from topologies import parse_spec

TOY = '''
"""A toy experiment: two arms on the smallest leaf-spine."""

from experiments.model import Arm, Experiment, Workload

NAME = "toy"
SUMMARY = "a toy: ecmp against spray on two hosts"
FAST, SLOW = "fast", "slow"


def build():
    return Experiment(name=NAME, title="Toy", description="Two arms.", topology="leaf-spine:spines=2,leaves=2,hosts=1",
                      arms=[Arm(FAST, mode="spray"), Arm(SLOW, mode="ecmp", policy="single")],
                      workload=Workload(pattern="pairs", pairs=(("h1", "h2"),)), duration_s=2.0)


def analyse(doc, topo):
    return {"arm_names": [a["name"] for a in doc["arms"]], "hosts": len(topo.hosts)}


def sentences(doc):
    return [f"The toy ran {len(doc['analysis']['arm_names'])} arms on {doc['analysis']['hosts']} hosts."]
'''


def test_every_scenario_module_is_registered_under_its_name():
    assert len(catalogue.SCENARIOS) == len(catalogue.CATALOGUE) == 10
    for module_name in catalogue.SCENARIOS:
        module = importlib.import_module(module_name)
        entry = catalogue.get(module.NAME)
        assert entry.build is module.build and entry.analyse is module.analyse
        assert entry.build().name == module.NAME
    with pytest.raises(KeyError):
        catalogue.get("no-such-experiment")


def test_a_new_experiment_is_one_module_and_one_registry_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(catalogue, "CATALOGUE", dict(catalogue.CATALOGUE))  # the toy leaves with the test
    (tmp_path / "toy_scenario.py").write_text(textwrap.dedent(TOY))
    monkeypatch.syspath_prepend(str(tmp_path))
    catalogue.register(importlib.import_module("toy_scenario"))  # the registry line

    from cli.main import main

    assert main(["list", "--json"]) == 0
    listed = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert listed["toy"]["arms"] == ["fast", "slow"] and listed["toy"]["summary"].startswith("a toy")
    exp, topo = driver.prepare("toy", duration=4.0)
    assert exp.duration_s == 4.0 and len(topo.hosts) == 2
    outcome = RunOutcome([(a, {"error": "not run", "repetition": 0}) for a in exp.arms], True, 0.0, 1.0,
                         {a.name: [Flow("h1", "h2", 0)] for a in exp.arms}, {a.name: 0 for a in exp.arms})
    doc = driver.build_document(exp, topo, outcome)
    assert doc["analysis"] == {"arm_names": ["fast", "slow"], "hosts": 2}
    assert driver.sentences_for(doc) == ["The toy ran 2 arms on 2 hosts."]
    assert [row[:2] for row in report.table_rows(doc)] == [["fast", "ERROR: not run"], ["slow", "ERROR: not run"]]


@pytest.mark.parametrize(("name", "spec", "named"), [
    ("training", "leaf-spine:spines=2,leaves=4,hosts=2", "h7-leaf3"),  # far storage sits on leaf4 there
    ("reordering", "in-server:servers=2,gpus=4", "leaf1-spine2"),
    ("hot-link", "fat-tree:k=4", "leaf1-spine1"),
    ("loss-recovery", "clos:pods=2,leaves=2,spines=2,superspines=2,hosts=1", "leaf1-spine1"),
])
def test_an_experiment_on_a_fabric_without_its_named_links_does_not_fit(name, spec, named):
    exp, topo = driver.prepare(name, topo=spec)
    with pytest.raises(DoesNotFit, match=named) as failed:
        driver.check_fits(exp, topo)
    assert "its own fabric" in str(failed.value)


def test_a_run_that_does_not_fit_fails_before_its_results_directory(tmp_path):
    exp, topo = driver.prepare("training", topo="leaf-spine:spines=2,leaves=4,hosts=2")
    with pytest.raises(DoesNotFit):
        driver.execute(exp, topo, out_root=tmp_path)
    assert not any(tmp_path.iterdir())


def test_an_experiment_whose_flows_name_missing_hosts_fails_before_bring_up(tmp_path):
    exp, _ = driver.prepare("reordering")
    topo = parse_spec("in-server:servers=2,gpus=4")
    with pytest.raises(DoesNotFit, match=r"\(h1, h2\)"):
        driver.check_fits(dataclasses.replace(exp, arms=[dataclasses.replace(a, faults=()) for a in exp.arms]), topo)


def test_the_default_fabrics_and_auto_faults_fit():
    for name in catalogue.CATALOGUE:
        exp, topo = driver.prepare(name)
        driver.check_fits(exp, topo)
    exp, topo = driver.prepare("failover", topo="fat-tree:k=4")  # its cut picks the busiest link
    driver.check_fits(exp, topo)


def test_a_run_whose_arms_all_failed_gives_no_fidelity_verdict():
    # Nothing ran, so nothing was measured: blaming the emulator would send the reader after the wrong cause.
    exp, topo = driver.prepare("ecmp-vs-spray")
    outcome = RunOutcome([(a, {"error": "terminated (SIGTERM)", "repetition": 0}) for a in exp.arms], False, 0.0,
                         1.0, {a.name: [] for a in exp.arms}, {a.name: 0 for a in exp.arms})
    doc = driver.build_document(exp, topo, outcome)
    assert report.fidelity_sentences(doc) == ["Fidelity: not measured, since no arm ran its traffic."]
