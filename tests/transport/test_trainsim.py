"""The training job over the simulated fabric: what the network costs it, on the virtual clock."""

from __future__ import annotations

import pytest

from transport.core.config import TransportConfig
from transport.sim.trainsim import TrainFabric, train_simulated
from transport.training.collective import CollectiveSpec
from transport.training.spec import JobSpec

BASE = {"steps": 12, "compute_s": 0.04, "collective": CollectiveSpec(nbytes=64 * 1024), "data_bytes": 16 * 1024,
        "checkpoint_every": 6, "checkpoint_bytes": 256 * 1024, "collective_timeout_s": 1.0}


def run(fabric: TrainFabric | None = None, config: TransportConfig | None = None, **kw):
    storage = {k: kw.pop(k) for k in ("data_storage", "checkpoint_storage") if k in kw}
    r = train_simulated(JobSpec(**{**BASE, **kw}), fabric or TrainFabric(), config, **storage)
    assert r.completed and r.summary["finished"] and r.summary["correct"]
    assert r.summary["useful_steps"] == r.summary["steps"]
    return r.summary


def test_far_checkpoint_stalls_and_async_hides_most_of_it() -> None:
    near = run(checkpoint_storage="near")
    far = run(checkpoint_storage="far")
    far_async = run(checkpoint_storage="far", checkpoint_mode="async")
    # Four ranks' checkpoints share the slow private link: far storage stalls each checkpoint longer.
    assert far["checkpoint_time_s"] > 2 * near["checkpoint_time_s"]
    assert far["checkpoint_stall_s"] > 2 * near["checkpoint_stall_s"] > 0
    hidden = 1 - far_async["checkpoint_stall_s"] / far["checkpoint_stall_s"]
    assert hidden >= 0.5
    assert far_async["wall_s"] < far["wall_s"]
    assert far["step_time_p99_s"] > far["step_time_p50_s"]  # the checkpoint steps are the tail


def test_a_cut_access_link_times_the_collective_out_and_costs_steps() -> None:
    s = run(TrainFabric(cut=("rank1", 0.6, 2.0)))
    clean = run()
    assert s["rollbacks"] >= 1 and s["steps_lost"] >= 1
    assert s["step_attempts"] > clean["step_attempts"]
    assert s["goodput_steps_per_s"] < clean["goodput_steps_per_s"]
    assert s["restore_s"] is not None and s["restore_s"] > 0


def test_go_back_n_resends_more_than_selective_repeat_under_loss() -> None:
    sel = train_simulated(JobSpec(**BASE), TrainFabric(loss=0.02), TransportConfig(recovery="selective"))
    gbn = train_simulated(JobSpec(**BASE), TrainFabric(loss=0.02), TransportConfig(recovery="gobackn"))
    assert sel.completed and gbn.completed
    assert gbn.transport["retransmissions"] > 2 * sel.transport["retransmissions"]


def test_simulation_is_deterministic_for_a_seed() -> None:
    a = run(checkpoint_storage="far")
    b = run(checkpoint_storage="far")
    assert a["step_time_p50_s"] == b["step_time_p50_s"] and a["wall_s"] == b["wall_s"]


@pytest.mark.parametrize("seed", [2, 3])
def test_spraying_avoids_the_uplink_ecmp_collides_on(seed: int) -> None:
    # Interleaved ranks: every ring edge crosses the 2:1 oversubscribed uplinks; with these seeds two
    # single-path flows of a leaf hash onto one spine.
    fab = TrainFabric(interleave=True)
    ecmp = train_simulated(JobSpec(**{**BASE, "checkpoint_every": 0}), fab, TransportConfig(path_policy="single"),
                           seed=seed).summary
    spray = train_simulated(JobSpec(**{**BASE, "checkpoint_every": 0}), fab, TransportConfig(path_policy="spray"),
                            seed=seed).summary
    assert spray["step_time_p99_s"] < ecmp["step_time_p99_s"]


def test_a_mixture_of_experts_job_runs_all_to_all_each_step_bit_for_bit() -> None:
    s = run(collective=CollectiveSpec(name="all-to-all", nbytes=64 * 1024))
    ring = run()
    # Every rank exchanges (p-1)/p of its bytes with every other rank each step, against the ring's
    # 2(p-1)/p in neighbour order; the job finishes every step with the numbers right either way.
    assert s["steps"] == ring["steps"] and s["step_time_p50_s"] > 0
