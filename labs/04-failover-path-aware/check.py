"""Lab 4 checker: link failures and path-aware transports.

On a folder of code (your copy of starter/, holding failover.py):
- `paths_to_avoid` gets per-EV counters of a window measured in the simulated network
  (transport.sim.simnet, the transport's own Connection spraying over 16 EVs) where one path is dead,
  two are dead, one is lossy, one is slow, all are healthy, or all are lossy, and must name exactly
  the EVs of the broken paths (EV mod the number of paths picks the path);
- `time_to_recover` must agree with experiments.analysis.recovery_time.time_to_recover on hand-made series and
  on goodput series of simulated transfers whose path fails.

On a results directory of `fabriclab run failover`: the link was cut in every arm, the controller
rerouted around it within a second, adaptive spraying and ECMP were back within a second or so, and
a second after the cut every arm carried at least 3/4 of its goodput from before (the surviving
spine has room for every host).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from experiments.analysis.recovery_time import time_to_recover
from experiments.scenarios import failover
from labs import grading
from labs.grading import Check
from transport.core.config import TransportConfig
from transport.sim.simnet import PathSpec, run_transfer

CODE = "failover.py"
NUM_EVS = 16
RATE = 10e6
DELAY = 0.0005
# The window the detector judges: after the failure has settled in, long enough for ~60 packets per EV.
WINDOW = (0.1, 0.3)
DIES_AT = 0.05
EV_KEYS = ("packets_sent", "acked", "losses", "timeouts")


def _path(**kw: Any) -> PathSpec:
    return PathSpec(rate_bps=RATE, delay=DELAY, **kw)


@dataclass(frozen=True)
class Scenario:
    name: str
    paths: list[PathSpec]
    broken: frozenset[int] = field(default_factory=frozenset)  # indices of the broken paths
    why: str = ""

    def bad_evs(self) -> set[int]:
        n = len(self.paths)
        return {ev for ev in range(NUM_EVS) if ev % n in self.broken}


def _scenarios() -> list[Scenario]:
    dead = [(DIES_AT, 1e9)]
    return [
        Scenario("one dead path of 4", [_path(), _path(), _path(down=dead), _path()], frozenset({2}),
                 "path 2 stopped forwarding"),
        Scenario("two dead paths of 8", [_path(down=dead) if i in (3, 6) else _path() for i in range(8)],
                 frozenset({3, 6}), "paths 3 and 6 stopped forwarding"),
        Scenario("one lossy path (30 %)", [_path(loss=0.3), _path(), _path(), _path()], frozenset({0}),
                 "path 0 drops 30 % of packets"),
        Scenario("one slow path (10 ms each way)",
                 [_path(), PathSpec(rate_bps=RATE, delay=0.010), _path(), _path()], frozenset({1}),
                 "path 1 has 20x the others' propagation delay"),
        Scenario("healthy paths (0.5 % loss, some reordering)",
                 [_path(loss=0.005, reorder=0.05) for _ in range(4)], frozenset(),
                 "no path is broken: the odd loss and a spread of RTTs are normal"),
        Scenario("every path lossy (40 %)", [_path(loss=0.4) for _ in range(4)], frozenset(),
                 "the loss is everywhere, so no path is better to move to"),
    ]


def measured_window(paths: list[PathSpec], seed: int = 3) -> dict[int, dict]:
    """Per-EV counters of a sprayed sender over WINDOW, as the transport's metrics count them: the
    same seeded transfer stopped at the window's start and at its end (the virtual clock makes the
    two runs identical up to the first stop), and the difference of their counters."""
    cfg = TransportConfig(path_policy="spray", num_evs=NUM_EVS)
    enough = int(len(paths) * RATE * WINDOW[1] / 8 * 1.5)

    def per_ev(until: float) -> dict[int, dict]:
        res = run_transfer(cfg, cfg, paths, total_bytes=enough, message_size=16384, seed=seed, time_limit=until)
        return {int(ev): s for ev, s in res.sender_metrics["sender"]["per_ev"].items()}

    before, after = per_ev(WINDOW[0]), per_ev(WINDOW[1])
    window = {}
    for ev, s in after.items():
        old = before.get(ev, {})
        window[ev] = {k: s[k] - old.get(k, 0) for k in EV_KEYS}
        window[ev]["rtt_p50"] = s["rtt"]["p50"]
    return window


def _as_evs(result: Any) -> set[int] | str:
    """The EVs a student's function returned, or what is wrong with its return value."""
    if not isinstance(result, (set, frozenset, list, tuple)):
        return f"returned {type(result).__name__} {result!r:.60}, expected a set of EVs (ints)"
    if not all(isinstance(e, (int, np.integer)) and not isinstance(e, bool) for e in result):
        return f"returned {sorted(result, key=str)!r:.80}, expected ints (EVs)"
    return {int(e) for e in result}


def _grade_avoid(mod: ModuleType, name: str, window: dict[int, dict], expected: set[int], why: str) -> Check:
    label = f"paths_to_avoid: {name}"
    result, err = grading.call(mod, "paths_to_avoid", window)
    if err:
        return grading.failed(label, err.reason)
    got = _as_evs(result)
    if isinstance(got, str):
        return grading.failed(label, got)
    if got == expected:
        return grading.passed(label, f"avoids {sorted(got) or 'nothing'} ({why})")
    missed, extra = sorted(expected - got), sorted(got - expected)
    return grading.failed(label, f"avoids {sorted(got) or 'nothing'}, expected {sorted(expected) or 'nothing'} ({why})"
                          + (f"; missed {missed}" if missed else "") + (f"; wrongly avoided {extra}" if extra else ""))


def _no_evidence_window() -> dict[int, dict]:
    healthy = {"packets_sent": 60, "acked": 60, "losses": 0, "timeouts": 0, "rtt_p50": 0.003}
    window = {ev: dict(healthy) for ev in range(NUM_EVS)}
    window[5] = {"packets_sent": 0, "acked": 0, "losses": 0, "timeouts": 0, "rtt_p50": None}
    return window


def check_avoid(mod: ModuleType) -> list[Check]:
    first = _grade_avoid(mod, "an EV that sent nothing", _no_evidence_window(), set(),
                         "EV 5 sent nothing in the window and has no RTT yet: no evidence against it")
    if "not written yet" in first.reason or "no function" in first.reason:
        return [first]  # no point simulating six networks for a function that is not there
    checks = [first]
    for sc in _scenarios():
        why = f"{sc.why}; EV mod {len(sc.paths)} picks the path" if sc.broken else sc.why
        checks.append(_grade_avoid(mod, sc.name, measured_window(sc.paths), sc.bad_evs(), why))
    return checks


# ---- time to recover --------------------------------------------------------------------------------


def _hand_made() -> list[tuple[str, list[float], list[float], float, float, float]]:
    """(case, times, rates, fault_t, baseline, threshold)."""
    t = [round(0.1 * i, 1) for i in range(21)]
    dip = [10.0] * 10 + [0.0, 0.0, 4.0] + [10.0] * 8
    blip = [10.0] * 10 + [0.0, 10.0, 0.0, 0.0] + [9.5] * 7
    never = [10.0] * 10 + [5.0] * 11
    last = [10.0] * 10 + [0.0] * 10 + [9.0]
    return [
        ("a dip, then back", t, dip, 1.0, 10.0, 0.9),
        ("one good sample between bad ones", t, blip, 1.0, 10.0, 0.9),
        ("never back", t, never, 1.0, 10.0, 0.9),
        ("back only at the last sample", t, last, 1.0, 10.0, 0.9),
        ("the fault between two samples", t, dip, 0.95, 10.0, 0.9),
        ("a lower threshold", t, never, 1.0, 10.0, 0.5),
        *_drawn_series(),
    ]


def _drawn_series(count: int = 3) -> list[tuple[str, list[float], list[float], float, float, float]]:
    """Series drawn from the seed the checker prints: a baseline, a fault somewhere, dips and good
    samples after it in any order, any threshold."""
    rng = grading.case_rng("lab4 recovery series")
    out = []
    for i in range(count):
        n, base = rng.randint(12, 40), round(rng.uniform(2.0, 20.0), 2)
        fault = rng.randint(3, n - 4)
        rates = [base] * fault + [round(rng.choice((0.0, rng.uniform(0, base), base)), 3) for _ in range(n - fault)]
        t = [round(0.05 * k, 2) for k in range(n)]
        fault_t = round(t[fault] - rng.choice((0.0, 0.02)), 2)
        out.append((f"drawn series {i + 1}", t, rates, fault_t, base, round(rng.uniform(0.5, 0.95), 2)))
    return out


def _same(got: Any, want: float | None) -> bool:
    if want is None or got is None:
        return got is None and want is None
    return isinstance(got, (int, float)) and not isinstance(got, bool) and abs(got - want) < 1e-6


def _fmt(x: Any) -> str:
    return "None" if x is None else f"{x:.3f} s" if isinstance(x, float) else repr(x)


def check_recovery_hand_made(mod: ModuleType) -> Check:
    label = "time_to_recover: hand-made series"
    for case, times, rates, fault_t, base, thr in _hand_made():
        want = time_to_recover(times, rates, fault_t, base, thr)
        got, err = grading.call(mod, "time_to_recover", times, rates, fault_t, base, thr)
        if err:
            return grading.failed(label, err.reason)
        if not _same(got, want):
            return grading.failed(label, f"'{case}': returned {_fmt(got)}, fabriclab's analysis gives {_fmt(want)}")
    return grading.passed(label, f"all {len(_hand_made())} cases agree with "
                          "experiments.analysis.recovery_time.time_to_recover "
                          "(dips, a lone good sample, never back, the last sample, lower thresholds, and series "
                          "drawn from the seed)")


def simulated_series(policy: str, down: tuple[float, float], threshold: float, bin_s: float = 0.02
                     ) -> tuple[list[float], list[float], float, float]:
    """Goodput series of a simulated transfer over 4 paths whose path 1 is down during `down`:
    (times, rates, fault time, baseline)."""
    paths = [_path(down=[down]) if i == 1 else _path() for i in range(4)]
    res = run_transfer(TransportConfig(path_policy=policy), TransportConfig(path_policy=policy), paths,
                       total_bytes=int(4 * RATE * 0.8 / 8), message_size=8192, seed=5, time_limit=2.0)
    g = res.receiver_metrics["receiver"]["goodput"]
    k = max(1, round(bin_s / g["bin"]))
    bps = np.asarray(g["bps"])
    n = len(bps) // k
    rates = bps[: n * k].reshape(n, k).mean(axis=1)
    times = [i * k * g["bin"] for i in range(n)]
    base = float(np.mean([r for t, r in zip(times, rates, strict=True) if 0.05 <= t < down[0]]))
    return times, [float(r) for r in rates], down[0], base


def check_recovery_simulated(mod: ModuleType) -> list[Check]:
    cases = [
        ("spray, path down for 0.1 s", "spray", (0.2, 0.3), 0.9),
        ("adaptive, path down for good", "adaptive", (0.2, 9.0), 0.7),
        ("spray, path down for good", "spray", (0.2, 9.0), 0.9),
    ]
    checks = []
    for case, policy, down, thr in cases:
        label = f"time_to_recover: simulated {case}"
        times, rates, fault_t, base = simulated_series(policy, down, thr)
        want = time_to_recover(times, rates, fault_t, base, thr)
        got, err = grading.call(mod, "time_to_recover", times, rates, fault_t, base, thr)
        if err:
            checks.append(grading.failed(label, err.reason))
            break
        checks.append(grading.holds(label, _same(got, want),
                                    f"{_fmt(got)} at threshold {thr:.0%}, as fabriclab's analysis",
                                    f"returned {_fmt(got)} at threshold {thr:.0%}; fabriclab's analysis gives "
                                    f"{_fmt(want)}"))
    return checks


def check_code(target: Path) -> list[Check]:
    mod = grading.load_module(target, CODE)
    if isinstance(mod, Check):
        return [mod]
    checks = check_avoid(mod)
    hand = check_recovery_hand_made(mod)
    checks.append(hand)
    if hand.passed:
        checks += check_recovery_simulated(mod)
    return checks


# ---- a results directory of `fabriclab run failover` -----------------------------------------------


def _cut(a: dict[str, Any]) -> tuple[str, str] | None:
    downs = [f for f in a.get("faults") or [] if f.get("kind") == "link_down"]
    return (downs[0]["a"], downs[0]["b"]) if downs else None


def _reroute_ms(a: dict[str, Any], cut: tuple[str, str]) -> float | None:
    for e in a.get("events") or []:
        if e.get("kind") == "link_down" and set(str(e.get("link", "")).split("-")) == set(cut):
            return e.get("took_ms")
    return None


def _before_after(a: dict[str, Any], fault_t: float, duration: float) -> tuple[float | None, float | None]:
    gs = a.get("goodput_series") or {}
    b, bps = gs.get("bin_s") or 0.1, gs.get("bps") or []

    def mean(lo: float, hi: float) -> float | None:
        vals = bps[int(lo / b): int(hi / b)]
        return float(np.mean(vals)) if vals else None

    return mean(0.5, fault_t), mean(fault_t + 1.0, duration - 0.2)


def check_results(target: Path) -> list[Check]:
    doc = grading.load_results(target, "failover")
    checks: list[Check] = []
    for name in (failover.ADAPTIVE, failover.ECMP_REROUTE, failover.TCP_ECMP):
        a = grading.arm(doc, name)
        cut = _cut(a)
        if cut is None:
            checks.append(grading.failed(f"{name}: link cut", "no link_down fault was applied in this arm"))
            continue
        fault_t = next(f["at_s"] for f in a["faults"] if f.get("kind") == "link_down")
        took = _reroute_ms(a, cut)
        checks.append(grading.at_most(f"{name}: controller reroute", None if took is None else took / 1e3, 1.0,
                                      f"{cut[0]}-{cut[1]} cut at {fault_t:.2f} s; seconds until the controller's "
                                      "new rules were confirmed"))
        if name != failover.TCP_ECMP:
            bound = 1.0 if name == failover.ADAPTIVE else 1.5
            checks.append(grading.at_most(f"{name}: recovery", a.get("recovery_s"), bound,
                                          f"seconds until the slowest of {a.get('hit_flows', 0)} hit flow(s) was "
                                          "back to 90 %"))
        before, after = _before_after(a, fault_t, doc.get("duration_s") or 0.0)
        ratio = after / before if before and after is not None else None
        checks.append(grading.at_least(f"{name}: goodput after the cut", ratio, 0.75,
                                       "goodput from 1 s after the cut / before the cut"))
    return checks


def check(target: Path) -> list[Check]:
    return check_code(target) if grading.is_code_dir(target) else check_results(target)
