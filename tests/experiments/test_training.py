"""`fabriclab run training` without root: its arms, the nodes' command lines, a whole job run by real
`train-node` nodes over 127.0.0.1 sockets, and the results, summary and plots built from their files."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from cli.main import build_parser
from cli.training_node import node_options
from experiments import catalogue, driver, plots, runner, schema
from experiments.arms import describe, get
from experiments.arms.training import TrainingLayout, node_commands
from experiments.runner import RunOutcome
from experiments.scenarios import training
from topologies import parse_spec
from transport.io.endpoint import write_json
from transport.io.training import UdpTrainingNode

SMALL = {"steps": 4, "compute_s": 0.01, "collective_bytes": 16 * 1024, "data_bytes": 4096, "checkpoint_every": 2,
         "checkpoint_bytes": 32 * 1024, "collective_timeout_s": 10.0}


def test_the_arms_answer_the_questions_side_by_side() -> None:
    exp = catalogue.get("training").build()
    by = {a.name: a for a in exp.arms}
    assert tuple(by) == training.ARMS and all(a.kind == "training" for a in exp.arms)
    assert (by[training.ECMP].mode, by[training.ECMP].policy) == ("ecmp", "single")
    assert by[training.LOSS_GBN].recovery == "gobackn" and by[training.LOSS_SR].recovery == "selective"
    assert by[training.FAR_ASYNC].labels == {"checkpoint_storage": "far", "checkpoint_mode": "async"}
    assert "async checkpoints to far storage" in describe(by[training.FAR_ASYNC])
    assert any(f.kind == "link_down" for f in by[training.CUT].faults)
    topo = parse_spec(exp.topology)
    layout = TrainingLayout.from_dict(exp.extra["training"])
    names = {h.name for h in topo.hosts}
    assert set(layout.ranks) | set(layout.storage_hosts()) <= names
    leaf = {h.name: h.labels.get("leaf") for h in topo.hosts}
    # Ring neighbours sit on different leaves, so every edge crosses the oversubscribed uplinks...
    ring = layout.ranks
    assert all(leaf[ring[i]] != leaf[ring[(i + 1) % len(ring)]] for i in range(len(ring)))
    # ... near storage shares its ranks' leaf, the far one does not.
    assert all(leaf[r] == leaf[layout.near[r]] for r in ring)
    assert all(leaf[layout.far] != leaf[r] for r in ring)
    assert [c for _, _, c in layout.placement({"checkpoint_storage": "far"})] == [layout.far] * len(ring)
    with pytest.raises(ValueError, match="checkpoint_storage"):
        layout.placement({"checkpoint_storage": "moon"})


def _commands(layout: TrainingLayout, labels: dict, base: int, raw_dir: Path) -> list:
    hosts = [*layout.ranks, *layout.storage_hosts()]
    ip = {h: f"127.0.0.1:{base + i}" for i, h in enumerate(hosts)}
    return node_commands(layout, labels, ip, ["--policy", "spray", "--seed", "3"], str(raw_dir))


def test_every_node_command_parses_and_carries_the_arm_settings(tmp_path: Path) -> None:
    layout = TrainingLayout.from_dict(training.LAYOUT.to_dict())
    cmds = _commands(layout, {"checkpoint_storage": "far", "checkpoint_mode": "async"}, 21000, tmp_path)
    assert [h for h, _ in cmds] == [*layout.storage_hosts(), *layout.ranks]
    parser = build_parser(("cli.training_node",))
    for host, cmd in cmds:
        assert cmd[1:4] == ["-m", "cli.endpoint", "train-node"]
        opts = node_options(parser.parse_args(cmd[3:]))
        opts.validate()
        assert opts.spec.checkpoint_mode == "async" and opts.spec.steps == training.LAYOUT.job["steps"]
        if opts.is_rank:
            assert opts.hosts.checkpoint == layout.far and opts.hosts.data == layout.near[host]


def _run_job(layout: TrainingLayout, labels: dict, raw_dir: Path) -> list[UdpTrainingNode]:
    """Every node of the job in its own thread over loopback, its file written where the arm says."""
    base = 20000 + (os.getpid() % 500) * 40
    parser = build_parser(("cli.training_node",))
    nodes, outs = [], []
    for i, (_, cmd) in enumerate(_commands(layout, labels, base, raw_dir)):
        args = parser.parse_args(cmd[3:])
        opts = node_options(args)
        opts.base_port = base + 1000 + 32 * i
        opts.config.num_evs = 4
        opts.timeout = 20.0
        nodes.append(UdpTrainingNode(opts))
        outs.append(args.json_out)
    for n in nodes:
        n.open()
    ranks = [n for n in nodes if n.rank is not None]
    threads = [threading.Thread(target=n.run, daemon=True) for n in nodes]
    for t in threads:
        t.start()
    for t, n in zip(threads, nodes, strict=True):
        if n.rank is not None or n.storage.coordinator is not None:
            t.join(timeout=60)
            assert not t.is_alive(), f"{n.name} did not finish"
    for n in nodes:
        if n.rank is None and n.storage.coordinator is None:
            n.stop("signal SIGTERM")  # as the runner stops receivers
    for t in threads:
        t.join(timeout=5)
    for n, out in zip(nodes, outs, strict=True):
        write_json(n.results(), out)
        n.close()
    return ranks


def test_a_job_over_loopback_sockets_becomes_the_arms_results(tmp_path: Path) -> None:
    exp = catalogue.get("training").build()
    layout = TrainingLayout.from_dict({**exp.extra["training"], "job": {**exp.extra["training"]["job"], **SMALL}})
    exp.extra["training"] = layout.to_dict()
    arms = [a for a in exp.arms if a.name in (training.SPRAY, training.FAR_SYNC)]
    raws = []
    for arm in arms:
        raw_dir = tmp_path / arm.name
        raw_dir.mkdir()
        ranks = _run_job(layout, arm.labels, raw_dir)
        assert all(r.rank.done and r.error is None for r in ranks)
        raws.append((arm, {"t0": 0.0, "traffic_s": 1.0, "samples": [{"t": 0.0, "links": []}],
                           "cpu": [], "endpoints": runner.read_endpoints(raw_dir)}))
    exp.arms = arms
    topo = parse_spec(exp.topology)
    flows = runner.plan_flows(exp.workload, topo, exp.seed)
    doc = driver.build_document(exp, topo, RunOutcome(raws=raws, complete=True, started=0.0, finished=1.0,
                                                      flows={a.name: flows for a in arms},
                                                      bytes_per_flow={a.name: 0 for a in arms}))
    assert schema.validate(doc) == []
    for a in doc["arms"]:
        assert a["error"] is None and len(a["flows"]) == len(layout.ranks)
        for key in ("step_time_p50_s", "step_time_p99_s", "compute_share", "checkpoint_stall_s", "steps_lost"):
            assert key in a, key
        assert a["correct"] and a["steps_lost"] == 0 and 0 < a["compute_share"] < 1
        assert a["step_time_p99_s"] >= a["step_time_p50_s"] > 0
    t = doc["analysis"]["training"]
    assert t[training.SPRAY]["useful_steps"] == SMALL["steps"] and t[training.SPRAY]["checkpoints"] == 2
    # The job starts at its first GO, on the runner's clock.
    kind = get("training")
    assert kind.traffic_starts(raws[0][1], 0.0) == min(f["training"]["started_at"] for f in doc["arms"][0]["flows"])
    text = driver.sentences_for(doc)
    assert any(s.startswith(f"{training.SPRAY}: step time p50") for s in text)
    assert any("far storage stalls the job" in s for s in text)
    written = plots.render_all(doc, tmp_path)
    assert {"training_timeline.png", "step_time_cdf.png"} <= set(written)
    assert all((tmp_path / w).stat().st_size > 0 for w in written)


def test_the_default_arms_on_the_virtual_clock_show_what_the_network_costs() -> None:
    doc = training.simulate()
    t = doc["analysis"]["training"]
    assert set(t) == set(training.ARMS)
    assert all(s["finished"] and s["correct"] and s["useful_steps"] == s["steps"] for s in t.values())
    near, far, far_async = t[training.SPRAY], t[training.FAR_SYNC], t[training.FAR_ASYNC]
    assert far["checkpoint_stall_s"] > 3 * near["checkpoint_stall_s"] > 0
    assert far_async["checkpoint_stall_s"] <= 0.5 * far["checkpoint_stall_s"]
    assert far_async["wall_s"] < far["wall_s"]
    cut = t[training.CUT]
    assert cut["rollbacks"] >= 1 and cut["step_attempts"] > near["step_attempts"]
    assert cut["goodput_steps_per_s"] < near["goodput_steps_per_s"]
    assert t[training.LOSS_GBN]["retransmissions"] > t[training.LOSS_SR]["retransmissions"]
    doc["arms"] = [{"name": n} for n in t]
    text = training.sentences(doc)
    assert any(s.startswith("Asynchronous checkpointing hides") for s in text)
    assert any(s.startswith("The cut link timed a collective out") for s in text)


def test_bench_training_prints_the_simulated_arms(capsys) -> None:
    import json

    from cli.main import main

    assert main(["bench", "training", "--arms", f"{training.SPRAY},{training.FAR_SYNC}"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["arms"]) == {training.SPRAY, training.FAR_SYNC}
    assert "timeline" not in out["arms"][training.SPRAY] and out["sentences"]
    assert main(["bench", "training", "--arms", "nope"]) == 2


def test_duration_scales_the_jobs_steps_and_keeps_a_checkpoint() -> None:
    from experiments import overrides

    exp = catalogue.get("training").build()
    job = exp.extra["training"]["job"]
    longer = overrides.with_overrides(exp, duration=2 * exp.duration_s)
    assert longer.extra["training"]["job"]["steps"] == 2 * job["steps"]
    smoke = overrides.with_overrides(exp, duration=0.1)
    assert smoke.extra["training"]["job"]["steps"] == job["checkpoint_every"]
    assert exp.extra["training"]["job"]["steps"] == job["steps"]  # the original is left alone


def test_a_cut_that_times_nothing_out_is_not_said_to() -> None:
    # A shorter --duration moves the cut's end closer: steps stall, no collective times out.
    doc = training.simulate()
    t = doc["analysis"]["training"]
    t[training.CUT].update(rollbacks=0, steps_lost=0, restore_s=None)
    doc["arms"] = [{"name": n} for n in t]
    text = " ".join(training.sentences(doc))
    assert "timed a collective out" not in text
    assert "timed no collective out, so nothing rolled back" in text
