"""Lab 6 checker: your path policy against the built-in single, spray and adaptive.

On a folder of code (the lab's starter/ or solution/, or your copy) it runs my_policy.py:MyPolicy in a
process of its own (labs/policy_process.py), which holds nothing but the policy and what its methods are
given, so the policy can learn about the paths only from its feedback. It calls every method directly
(conformance: every EV, every `avoid`, a timeout on an EV never acknowledged, state() as JSON), then
runs it in the simulated network (transport.sim.policy_trial.GRADING) beside the three built-ins on the
same paths and seeds: the busiest path cut, or slowed to a quarter of its rate, early, midway or late,
on four paths or eight, with three seeds, and two controls without a fault. For each fault it grades
goodput, tail (p99) message completion time, counting messages unfinished at the end at their age then,
failover (goodput kept after the fault) and a recovery that lasts to the end; for the controls, goodput.
Each is against the best built-in in that very trial — no built-in is best in all — and must hold in
every trial of its kind. Any fault the guard recorded (an exception, a bad EV, too slow) fails, and so
does one conformance found. The guard times the policy in its process's CPU time, not the wall clock,
and the CPU per call is graded too, with a warning band below the failing one. No root, about 20 s.

On a results directory of `fabriclab run hot-link --path-policy DIR/my_policy.py:MyPolicy` it grades
the arm that ran your policy against the experiment's own arms the same way, with wider margins: one
run on a real, shared machine is noisier than the simulator.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from experiments.scenarios import hot_link
from labs import grading, policy_process
from labs.catalogue import LabError
from transport.core.paths import is_plugin
from transport.core.policy_plugin import MEAN_BUDGET_S, GuardedPolicy, PolicySpecError, check_spec
from transport.sim.policy_trial import BUILTINS, GRADING, Case, TrialResult, builtin_trial, conformance, run_trial

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
# CPU per call: a warning from this share of the transport's budget (MEAN_BUDGET_S), a failure above it.
CPU_WARN_OF_BUDGET = 0.25


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
        return "never back to 60 % of before for good"
    return f"back to 60 % of before {s:.2f} s after the fault, and stayed"


def _finer(fmt: Any, x: float, decimals: int) -> str:
    """x as fmt shows it, with `decimals` more decimals."""
    if fmt is _pct:
        return f"{x:.{decimals}%}"
    if fmt is _mbps:
        return f"{x / 1e6:.{decimals + 1}f} Mb/s"
    if fmt is _ms and x < 1:
        return f"{x * 1e3:.{decimals}f} ms"
    return f"{x:.{decimals + 2}g}"


def _exact(fmt: Any, a: float, b: float) -> tuple[str, str]:
    """fmt(a), fmt(b), with more decimals when they would print alike ("63% < 63%")."""
    shown_a, shown_b = fmt(a), fmt(b)
    decimals = 1
    while shown_a == shown_b and a != b and decimals < 7:
        shown_a, shown_b = _finer(fmt, a, decimals), _finer(fmt, b, decimals)
        decimals += 1
    return shown_a, shown_b


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
    shown, shown_bound = _exact(fmt, mine, bound)
    return grading.Check(name, ok, f"{what} {shown} {('>=' if ok else '<') if higher else ('<=' if ok else '>')} "
                         f"{shown_bound} ({factor:g} x {best}'s {fmt(known[best])}, the best built-in; {others})")


# ---- a folder of code: the simulated network --------------------------------------------------------


@contextmanager
def _cpu_timed() -> Iterator[None]:
    """The transport's guard timing the policy by the CPU time its process spent in each call, not by
    the wall clock: the verdict on a slow policy must not depend on how busy the machine is."""
    defaults = GuardedPolicy.__init__.__kwdefaults__
    saved = defaults["timer"]
    defaults["timer"] = policy_process.cpu_clock
    try:
        yield
    finally:
        defaults["timer"] = saved


def check_code(folder: Path) -> list[grading.Check]:
    path = folder / FILE
    if not path.is_file():
        return [grading.failed(f"load {FILE}", f"{path} does not exist; copy the lab's starter/ and edit it there")]
    try:
        with policy_process.serving(path.resolve(), CLASS) as child, tempfile.TemporaryDirectory() as tmp:
            # What the transport loads: a stand-in that passes every call to the policy's own process.
            stand_in = Path(tmp) / FILE
            stand_in.write_text(f"from labs.policy_process import stand_in\n\n{CLASS} = stand_in({CLASS!r})\n")
            with _cpu_timed():
                return _check_in_process(f"{stand_in}:{CLASS}", child)
    except policy_process.PolicyProcessError as exc:
        return [grading.failed(f"load {FILE}", str(exc))]


def _check_in_process(spec: str, child: Any) -> list[grading.Check]:
    try:
        spec = check_spec(spec)
    except PolicySpecError as exc:
        return [grading.failed(f"load {FILE}", str(exc))]
    checks = [grading.passed(f"load {FILE}", f"{CLASS} has every method of a path policy (run in a process of "
                             "its own, which holds only what its methods are given)")]
    conform = [grading.Check(f"conformance: {c.name}", c.problem is None, f"{c.what}: {c.problem or 'fine'}")
               for c in conformance(spec)]
    checks += conform
    faults = []
    for kind in _kinds():
        cases = [c for c in GRADING if c.scenario.fault == kind]
        mine: dict[Case, TrialResult] = {}
        for case in cases:
            result = run_trial(spec, case.scenario, case.seed, stop_on_fault=True)
            if result.fault:
                # The guard stopped the trial at the fault: what came after is not the student's.
                faults.append(f"{case.label} ({case.scenario.describe()}): {result.fault}; the trial stopped there")
                break
            mine[case] = result
        if len(mine) < len(cases):
            checks.append(grading.failed(f"{_title(kind)}: policy fault", f"{faults[-1]}, so there is nothing of "
                                         "yours to grade in these trials"))
            continue
        checks += _graded(kind, mine)
    conform_bad = [c.name.removeprefix("conformance: ") for c in conform if not c.passed]
    if conform_bad and not faults:
        # The trials may not have called what conformance found broken: that is no clean bill.
        checks.append(grading.failed("no policy fault", f"the trials met none, but conformance did: "
                                     f"{', '.join(conform_bad)} (above)"))
    elif not faults and not conform_bad:
        checks.append(grading.passed("no policy fault", f"{CLASS} never raised and always returned a valid EV"))
    checks.append(_cpu(child.cpu_s, child.calls))
    return checks


def _cpu(cpu_s: float, calls: int) -> grading.Check:
    """CPU time per call against the guard's budget, with a warning band below it."""
    mean_us = 1e6 * cpu_s / calls if calls else 0.0
    budget_us, warn_us = 1e6 * MEAN_BUDGET_S, 1e6 * MEAN_BUDGET_S * CPU_WARN_OF_BUDGET
    what = (f"{mean_us:.1f} µs of CPU per call on average over {calls} calls (the built-ins take about 1 µs; "
            f"warning from {warn_us:.0f} µs, failing at {budget_us:.0f} µs)")
    if mean_us > budget_us:
        return grading.failed("CPU per call", what)
    return grading.Check("CPU per call", True, what, warning=mean_us >= warn_us)


def _kinds() -> list[str]:
    return list(dict.fromkeys(c.scenario.fault for c in GRADING))


def _title(kind: str) -> str:
    return "no fault" if kind == "none" else kind


def _graded(kind: str, mine: dict[Case, TrialResult]) -> list[grading.Check]:
    """One check per metric over every trial of `kind`: it holds in all of them, or names where not."""
    metrics: list[tuple[str, Any]] = [
        ("goodput", lambda c, r, refs: _versus(c.label, r.goodput_bps, {p: x.goodput_bps for p, x in refs.items()},
                                               GOODPUT_OF_BEST, True, _mbps, "goodput")),
    ]
    if kind != "none":
        # A control has no fault to fail over from, and its tail is the paths' own: goodput says enough.
        metrics += [
            ("tail", lambda c, r, refs: _versus(
                c.label, r.p99_s, {p: x.p99_s for p, x in refs.items()}, TAIL_OF_BEST, False, _ms,
                f"p99 message completion ({r.unfinished} unfinished at the end counted at their age)")),
            ("failover", lambda c, r, refs: _versus(
                c.label, r.kept, {p: x.kept for p, x in refs.items()}, KEPT_OF_BEST, True, _pct,
                "goodput kept after the fault (after/before)")),
            ("recovery", lambda c, r, refs: grading.Check(c.label, r.recovery_s is not None, _recovery(r.recovery_s))),
        ]
    cases = list(mine)
    out = []
    for metric, grade in metrics:
        per_case = [grade(c, mine[c], {p: builtin_trial(p, c.scenario, c.seed) for p in BUILTINS}) for c in cases]
        bad = [(c, g) for c, g in zip(cases, per_case, strict=True) if not g.passed]
        if bad:
            case, g = bad[0]
            reason = (f"{len(bad)} of {len(cases)} trials fail, e.g. {case.label} ({case.scenario.describe()}): "
                      f"{g.reason}")
        else:
            reason = f"in all {len(cases)} trials, e.g. {per_case[0].name}: {per_case[0].reason}"
        out.append(grading.Check(f"{_title(kind)}: {metric}", not bad, reason))
    return out


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
