"""The simulated-network trial lab 6 grades policies with: deterministic, and the built-ins behave as
the physics says (a single path loses its flow to a cut, a sprayer keeps most of it; a slowed path
holds oblivious spraying back and only a delay-aware policy steers around it)."""

from __future__ import annotations

from transport.sim.policy_trial import SCENARIOS, builtin_trial, run_trial

CUT, SLOW = SCENARIOS


def test_a_trial_is_deterministic_and_fails_the_busiest_path():
    a, b = run_trial("spray", CUT, seed=4), run_trial("spray", CUT, seed=4)
    assert a.to_dict() == b.to_dict()
    assert 0 <= a.failed_path < CUT.paths and a.messages > 100 and a.fault is None
    assert len(a.series_bps) == round(CUT.duration_s / 0.05)


def test_the_builtins_meet_the_physics():
    single, spray, adaptive = (builtin_trial(p, CUT) for p in ("single", "spray", "adaptive"))
    # One path of four: a quarter of the sprayers' goodput at most, and the cut hits it.
    assert single.goodput_bps < 0.4 * spray.goodput_bps and single.kept < 0.5
    assert spray.kept > 0.6 and adaptive.kept > 0.5
    assert single.p99_s > 2 * spray.p99_s
    single, spray, adaptive = (builtin_trial(p, SLOW) for p in ("single", "spray", "adaptive"))
    assert spray.kept < 0.5 and adaptive.kept > 1.5 * spray.kept
    assert adaptive.after_bps > 1.5 * spray.after_bps


def test_a_faulty_plugin_can_end_the_trial_early(tmp_path):
    (tmp_path / "p.py").write_text("from transport.core.paths import Spray\n\nclass Todo(Spray):\n"
                                   "    def next_ev(self, now, avoid=None):\n        raise NotImplementedError\n")
    spec = f"{tmp_path / 'p.py'}:Todo"
    stopped = run_trial(spec, CUT, stop_on_fault=True)
    assert stopped.fault and "NotImplementedError" in stopped.fault and stopped.messages == 0
