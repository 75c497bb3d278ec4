"""Lab 6 checker: your path policy against the built-in single, spray and adaptive.

On a folder of code (the lab's starter/ or solution/, or your copy) it loads my_policy.py:MyPolicy
through the transport's plug-in loader and runs it in the simulated network (transport.policy_trial),
beside the three built-ins on the same paths and seed: one scenario cuts the busiest of four paths
halfway, the other slows it to a quarter of its rate. In each it grades goodput, tail (p99) message
completion time and failover (goodput kept after the fault), each against the best built-in in that
scenario — no built-in is best in both — and any fault the guard recorded (an exception, a bad EV,
too slow) fails. No root, a few seconds.

On a results directory of `fabriclab run hot-link --path-policy DIR/my_policy.py:MyPolicy` it grades
the arm that ran your policy against the experiment's own arms the same way, with wider margins: one
run on a real, shared machine is noisier than the simulator.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.scenarios import hot_link
from labs import grading
from labs.catalogue import LabError
from transport.paths import is_plugin
from transport.policy_plugin import PolicySpecError, check_spec
from transport.policy_trial import BUILTINS, SCENARIOS, builtin_trial, run_trial

FILE, CLASS = "my_policy.py", "MyPolicy"
EXPERIMENT = "hot-link"
BUILTIN_ARMS = {hot_link.ECMP_SINGLE: "single", hot_link.SPRAY: "spray", hot_link.ADAPTIVE: "adaptive"}

# Simulated network (deterministic): how close to the best built-in a policy must come.
GOODPUT_OF_BEST = 0.85
TAIL_OF_BEST = 1.5
KEPT_OF_BEST = 0.75
# Live fabric (one run, a shared machine): wider.
LIVE_GOODPUT_OF_BEST = 0.75
LIVE_TAIL_OF_BEST = 2.0


def check(target: Path) -> list[grading.Check]:
    if grading.is_code_dir(target):
        return check_code(target)
    return check_results(target)


def _mbps(bps: float | None) -> str:
    return "-" if bps is None else f"{bps / 1e6:.1f} Mb/s"


def _ms(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:.0f} ms" if s < 1 else f"{s:.2f} s"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _recovery(s: float | None) -> str:
    if s is None:
        return "never back to 60 % of before"
    return f"back to 60 % of before {s:.2f} s after the fault"


def _versus(name: str, mine: float | None, refs: dict[str, float | None], factor: float, higher: bool,
            fmt: Any, what: str) -> grading.Check:
    """mine against factor x the best of refs (the highest if higher is better, else the lowest)."""
    known = {k: v for k, v in refs.items() if v is not None}
    if mine is None or not known:
        return grading.failed(name, f"{what} is missing (yours {fmt(mine)}; built-ins "
                              f"{', '.join(f'{k} {fmt(v)}' for k, v in refs.items())})")
    best = (max if higher else min)(known, key=lambda k: known[k])
    bound = factor * known[best]
    ok = mine >= bound if higher else mine <= bound
    others = ", ".join(f"{k} {fmt(v)}" for k, v in refs.items() if k != best)
    return grading.Check(name, ok, f"{what} {fmt(mine)} {('>=' if ok else '<') if higher else ('<=' if ok else '>')} "
                         f"{fmt(bound)} ({factor:g} x {best}'s {fmt(known[best])}, the best built-in; {others})")


# ---- a folder of code: the simulated network --------------------------------------------------------


def check_code(folder: Path) -> list[grading.Check]:
    path = folder / FILE
    if not path.is_file():
        return [grading.failed(f"load {FILE}", f"{path} does not exist; copy the lab's starter/ and edit it there")]
    try:
        spec = check_spec(f"{path.resolve()}:{CLASS}")
    except PolicySpecError as exc:
        return [grading.failed(f"load {FILE}", str(exc))]
    checks = [grading.passed(f"load {FILE}", f"{CLASS} has every method of a path policy")]
    faulty, busy_us = False, 0.0
    for sc in SCENARIOS:
        mine = run_trial(spec, sc, stop_on_fault=True)
        label = f"{sc.name} ({sc.describe()})"
        if mine.fault:
            # The guard replaced the policy with spray: the trial's numbers are not the student's.
            faulty = True
            checks.append(grading.failed(f"{label}: policy fault", f"{mine.fault}; the trial went on with spray, "
                                         "so there is nothing of yours to grade here"))
            continue
        busy_us = max(busy_us, mine.mean_call_us or 0.0)
        refs = {p: builtin_trial(p, sc) for p in BUILTINS}
        checks += [
            _versus(f"{label}: goodput", mine.goodput_bps, {p: r.goodput_bps for p, r in refs.items()},
                    GOODPUT_OF_BEST, True, _mbps, "goodput"),
            _versus(f"{sc.name}: tail", mine.p99_s, {p: r.p99_s for p, r in refs.items()}, TAIL_OF_BEST, False,
                    _ms, "p99 message completion"),
            _versus(f"{sc.name}: failover", mine.kept, {p: r.kept for p, r in refs.items()}, KEPT_OF_BEST, True,
                    _pct, f"goodput kept after the fault (after/before; {_recovery(mine.recovery_s)})"),
        ]
    if not faulty:
        checks.append(grading.passed("no policy fault", f"{CLASS} never raised, always returned a valid EV and "
                                     f"took {busy_us:.1f} µs per call on average"))
    return checks


# ---- a results directory: the live fabric ------------------------------------------------------------


def check_results(target: Path) -> list[grading.Check]:
    doc = grading.load_results(target, EXPERIMENT)
    mine_arms = [a for a in doc.get("arms", []) if is_plugin(a.get("policy") or "")]
    if not mine_arms:
        raise LabError(f"this {EXPERIMENT} run has no arm running your policy; run `fabriclab run {EXPERIMENT} "
                       f"--path-policy DIR/{FILE}:{CLASS} --out {target}`")
    mine = grading.arm(doc, mine_arms[0]["name"])
    refs = {name: grading.arm(doc, name) for name in BUILTIN_ARMS}
    name = mine["name"]
    checks = []
    faults = [f["path_policy_fault"] for f in mine.get("flows", []) if f.get("path_policy_fault")]
    if faults:
        checks.append(grading.failed("no policy fault", f"{len(faults)} of {len(mine['flows'])} flows: {faults[0]} "
                                     "(they went on with spray)"))
    else:
        checks.append(grading.passed("no policy fault", f"{name} ran in {len(mine.get('flows', []))} flows without "
                                     "a fault"))

    def by(key: str) -> dict[str, float | None]:
        return {n: a.get(key) for n, a in refs.items()}

    checks += [
        _versus("goodput", mine.get("goodput_bps"), by("goodput_bps"), LIVE_GOODPUT_OF_BEST, True, _mbps,
                f"{name}'s goodput"),
        _versus("after the link degraded", mine.get("goodput_after_fault_bps"), by("goodput_after_fault_bps"),
                LIVE_GOODPUT_OF_BEST, True, _mbps, "goodput after the fault"),
        _versus("tail", mine.get("completion_p99_s"), by("completion_p99_s"), LIVE_TAIL_OF_BEST, False, _ms,
                "p99 message completion"),
    ]
    return checks
