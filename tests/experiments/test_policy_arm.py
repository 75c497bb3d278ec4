"""`fabriclab run NAME --path-policy FILE.py:ClassName`: the added arm copies the experiment's sprayed
transport arm, a policy fault reaches results.json and the summary, and bad input is one line."""

from __future__ import annotations

import pytest

from experiments import catalogue, driver
from experiments.policy_arm import PolicyArmError, fault_sentences, template_arm, with_policy_arm
from experiments.runner import Flow, RunOutcome
from tests.experiments.test_results import _raw

SPEC = "/abs/labs/my_policy.py:MyPolicy"
FAULT = "MyPolicy.next_ev() returned 'a' (str), expected an int EV in 0..15"


@pytest.mark.parametrize(("name", "template"), [
    ("hot-link", "spray"), ("ecmp-vs-spray", "spray"), ("failover", "adaptive"), ("reordering", "spray-unordered"),
    ("loss-recovery", "selective@0%"),
])
def test_the_added_arm_runs_the_policy_with_the_sprayed_arm_settings(name, template):
    exp = catalogue.get(name).build()
    out = with_policy_arm(exp, SPEC)
    assert [a.name for a in out.arms] == [a.name for a in exp.arms] + ["MyPolicy"]
    mine, like = out.arms[-1], next(a for a in exp.arms if a.name == template)
    assert template_arm(exp) == like
    assert (mine.kind, mine.mode, mine.recovery, mine.delivery, mine.faults, mine.sender, mine.workload) == (
        like.kind, like.mode, like.recovery, like.delivery, like.faults, like.sender, like.workload)
    assert mine.policy == SPEC and mine.labels["like"] == template


def test_an_arm_name_already_taken_gets_a_suffix():
    exp = catalogue.get("hot-link").build()
    assert with_policy_arm(exp, "/x/p.py:spray").arms[-1].name == "spray-plugin"


@pytest.mark.parametrize("name", ["in-server", "allreduce", "training"])
def test_experiments_without_a_transport_arm_refuse(name):
    with pytest.raises(PolicyArmError, match="no transport arm"):
        with_policy_arm(catalogue.get(name).build(), SPEC)


@pytest.mark.parametrize(("spec", "name", "words"), [
    ("{dir}/p.py:MyPolicy", "in-server", "in-server has no transport arm"),
    ("{dir}/missing.py:MyPolicy", "hot-link", "does not exist"),
    ("{dir}/p.py:Other", "hot-link", "has no class Other"),
])
def test_run_refuses_bad_input_in_one_line_before_anything_starts(tmp_path, monkeypatch, capsys, spec, name, words):
    from cli.main import main

    def no_fabric(*_args, **_kw):
        raise AssertionError("a fabric was about to be brought up")

    monkeypatch.setattr(driver, "execute", no_fabric)
    (tmp_path / "p.py").write_text("from transport.core.paths import Spray as MyPolicy\n")
    try:
        code = main(["run", name, "--path-policy", spec.format(dir=tmp_path), "--no-progress"])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err


def test_a_policy_fault_reaches_the_results_and_the_summary():
    exp, topo = driver.prepare("hot-link", topo="leaf-spine:spines=2,leaves=2,hosts=1,rate=10", duration=4)
    exp = with_policy_arm(exp, SPEC)
    good, broken = _raw(topo, 6e6, "spine1"), _raw(topo, 5e6, "spine2")
    broken["endpoints"]["send-0-h1-h2"]["connection"]["path_policy_fault"] = FAULT
    arms = [exp.arms[1], exp.arms[-1]]
    outcome = RunOutcome(raws=[(arms[0], good), (arms[1], broken)], complete=True, started=0.0, finished=10.0,
                         flows={a.name: [Flow("h1", "h2", 0)] for a in arms}, bytes_per_flow={a.name: 0 for a in arms})
    exp.arms = arms
    doc = driver.build_document(exp, topo, outcome)
    by = {a["name"]: a for a in doc["arms"]}
    assert by["MyPolicy"]["policy"] == SPEC and by["MyPolicy"]["flows"][0]["path_policy_fault"] == FAULT
    assert by["spray"]["flows"][0]["path_policy_fault"] is None
    said = fault_sentences(doc)
    assert said == [f"MyPolicy: the path policy broke in 1 of 1 flow(s), which went on with spray: {FAULT}."]
    assert said[0] in driver.sentences_for(doc)
