"""The simulated-network trial lab 6 grades policies with: deterministic, and the built-ins behave as
the physics says (a single path loses its flow to a cut, a sprayer keeps most of it; a slowed path
holds oblivious spraying back and only a delay-aware policy steers around it)."""

from __future__ import annotations

import pytest

from transport.sim.policy_trial import GRADING, SCENARIOS, builtin_trial, conformance, run_trial

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


# -- grading honestly: unfinished messages, lasting recovery, many trials, conformance ---------------

STALLS = """
from transport.core.paths import Spray

class Stalls(Spray):
    # Spray until 1.35 s, then every packet, retransmissions too, on EV 0.
    def next_ev(self, now, avoid=None):
        return 0 if now >= 1.35 else super().next_ev(now, avoid)
"""


def test_unfinished_messages_count_in_the_tail_and_a_recovery_must_last(tmp_path):
    (tmp_path / "p.py").write_text(STALLS)
    spec = f"{tmp_path / 'p.py'}:Stalls"
    # EV 0 is on path 0, the one the trial cuts at 1 s (the busiest; ties go to the lowest index).
    r = run_trial(spec, CUT)
    assert r.failed_path == 0 and r.unfinished == CUT.outstanding
    # Nothing finished after the stall: the tail is the age of the stuck messages, not a few RTTs.
    assert r.p99_s > CUT.duration_s - 1.4
    spray = builtin_trial("spray", CUT)
    assert r.p99_s > 10 * spray.p99_s
    # It was back to 60 % of before for a while after the cut (as spray), but it did not stay.
    assert spray.recovery_s is not None and r.recovery_s is None


def test_the_grading_set_varies_fault_time_paths_and_seed_and_has_controls():
    kinds = {c.scenario.fault for c in GRADING}
    assert kinds == {"cut", "slow", "none"}
    for kind in ("cut", "slow"):
        cases = [c for c in GRADING if c.scenario.fault == kind]
        assert len({c.scenario.fault_at_s for c in cases}) >= 3
        assert {c.scenario.paths for c in cases} == {4, 8} and len({c.seed for c in cases}) >= 3
    control = next(c for c in GRADING if c.scenario.fault == "none")
    r = run_trial("spray", control.scenario, control.seed)
    assert r.failed_path == -1 and r.kept == pytest.approx(1.0, abs=0.1) and r.recovery_s is not None
    # A total rate kept the same on eight paths: the trials cost about the same.
    assert {c.scenario.paths * c.scenario.rate_bps for c in GRADING} == {32e6}


def test_the_busiest_path_differs_between_grading_trials():
    failed = {builtin_trial("spray", c.scenario, c.seed).failed_path for c in GRADING if c.scenario.fault == "cut"}
    assert len(failed) > 1


CONFORMING = """
class P:
    def __init__(self, num_evs, rng):
        self.n, self.i, self.acked = num_evs, 0, set()
    def next_ev(self, now, avoid=None):
        self.i = (self.i + 1) % self.n
        return (self.i + 1) % self.n if self.i == avoid else self.i
    def on_ack(self, ev, rtt, now):
        self.acked.add(ev)
    def on_loss(self, ev, now):
        pass
    def on_timeout(self, ev, now):
        pass
    def state(self):
        return {"acked": sorted(self.acked)}
"""


@pytest.mark.parametrize(("change", "failing", "words"), [
    (None, set(), ""),
    ("    def on_timeout(self, ev, now):\n        self.acked.remove(ev)\n", {"on_timeout"}, "raised KeyError"),
    ("    def next_ev(self, now, avoid=None):\n        return 3\n", {"avoid"}, "returned 3 when asked to avoid it"),
    ("    def state(self):\n        return {'acked': self.acked}\n", {"state"}, "not JSON"),
    ("    def on_loss(self, ev, now):\n        self.n = 0\n", {"on_loss"}, "next_ev() afterwards raised"),
], ids=["conforming", "timeout-never-acked", "ignores-avoid", "state-not-json", "breaks-after-loss"])
def test_conformance_calls_every_method_directly(tmp_path, change, failing, words):
    source = CONFORMING + (f"\nclass Q(P):\n{change}" if change else "\nclass Q(P):\n    pass\n")
    (tmp_path / "p.py").write_text(source)
    results = conformance(f"{tmp_path / 'p.py'}:Q")
    assert [r.name for r in results] == ["next_ev", "avoid", "on_ack", "on_loss", "on_timeout", "state"]
    bad = {r.name: r.problem for r in results if r.problem}
    assert set(bad) == failing, bad
    assert all(words in p for p in bad.values())
