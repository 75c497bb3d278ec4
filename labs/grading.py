"""What a lab checker is made of: verdicts with reasons, thresholds, and safe calls into student code.

A checker (`labs/NN-slug/check.py`) defines `check(target: Path) -> list[Check]`. The target is what
the student points `fabriclab lab check N DIR` at: a results directory written by `fabriclab run`
(graded from its results.json), or a folder of code (the lab's `starter/`, `solution/`, or the
student's own copy), whose functions the checker calls. Thresholds are bounds with a margin, never
exact figures: the same lab gives different numbers on different machines and seeds.

A student's exception is a failed check that names the function and the error, not a crash: the rest
of the checks still run, and the student sees every problem at once.

Two things keep a checker honest. Part of its cases are drawn at random from a seed it prints
(`case_rng`), so answers copied for the fixed cases do not pass. And the student's module is imported
and called with fabriclab's own packages out of reach (`load_module`, `call`): an answer that hands
the question to the implementation it is graded against fails with the import it tried.
"""

from __future__ import annotations

import importlib.abc
import json
import math
import numbers
import random
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from experiments.schema import ArmResult, ResultsDocument
from labs.catalogue import LabError, import_file


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    reason: str
    # Passed, but close to failing: printed as WARN, so the student sees it before it becomes a FAIL.
    warning: bool = False


def passed(name: str, reason: str) -> Check:
    return Check(name, True, reason)


def failed(name: str, reason: str) -> Check:
    return Check(name, False, reason)


def holds(name: str, condition: bool, why_pass: str, why_fail: str) -> Check:
    return Check(name, bool(condition), why_pass if condition else why_fail)


def _fmt(value: float) -> str:
    return f"{value:.3g}"


def at_least(name: str, value: float | None, threshold: float, what: str = "") -> Check:
    label = what or name
    if value is None:
        return failed(name, f"{label} is missing from the results")
    ok = value >= threshold
    return Check(name, ok, f"{label} = {_fmt(value)} {'>=' if ok else '<'} {_fmt(threshold)}")


def at_most(name: str, value: float | None, threshold: float, what: str = "") -> Check:
    label = what or name
    if value is None:
        return failed(name, f"{label} is missing from the results")
    ok = value <= threshold
    return Check(name, ok, f"{label} = {_fmt(value)} {'<=' if ok else '>'} {_fmt(threshold)}")


def close_to(name: str, value: Any, expected: float, rel: float, what: str = "") -> Check:
    """value within a relative tolerance of expected (the reference the checker computed itself)."""
    label = what or name
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return failed(name, f"{label} should be a number, got {type(value).__name__} {value!r:.60}")
    ok = abs(value - expected) <= rel * max(abs(expected), 1e-12)
    return Check(name, ok, f"{label} = {_fmt(value)}, expected {_fmt(expected)} within {rel:.0%}")


# ---- results directories --------------------------------------------------------------------------


def is_code_dir(target: Path) -> bool:
    return target.is_dir() and not (target / "results.json").exists() and any(target.glob("*.py"))


def find_results(target: Path, experiment: str) -> Path:
    """results.json for `experiment` under target: the file itself, a run directory, or a results root
    (the newest run of that experiment, as `fabriclab run --out ROOT` lays them out)."""
    if target.is_file() and target.name == "results.json":
        return target
    if (target / "results.json").is_file():
        return target / "results.json"
    runs = sorted(p for p in (target / experiment).glob("*/results.json")) if target.is_dir() else []
    if runs:
        return runs[-1]
    raise LabError(f"no results of '{experiment}' under {target}; run `fabriclab run {experiment} --out "
                   f"{target}` first, or give the run's directory")


def load_results(target: Path, experiment: str) -> ResultsDocument:
    path = find_results(target, experiment)
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise LabError(f"cannot read {path}: {exc}; re-run the experiment") from None
    if doc.get("experiment") != experiment:
        raise LabError(f"{path} holds '{doc.get('experiment')}', not '{experiment}'; point at a run of "
                       f"{experiment}")
    return doc


def arm(doc: ResultsDocument, name: str) -> ArmResult:
    for a in doc.get("arms", []):
        if a.get("name") == name:
            if a.get("error"):
                raise LabError(f"arm '{name}' failed in this run ({a['error']}); re-run the experiment")
            return a
    have = ", ".join(a.get("name", "?") for a in doc.get("arms", []))
    raise LabError(f"no arm '{name}' in {doc.get('experiment')} results (arms: {have})")


# ---- random cases ---------------------------------------------------------------------------------

_seed: int | None = None


def use_seed(seed: int | None = None) -> int:
    """Draw this run's random cases from `seed` (a fresh one when None); the seed, to print."""
    global _seed
    _seed = seed if seed is not None else random.SystemRandom().randrange(1, 1_000_000)
    return _seed


def current_seed() -> int:
    """The seed the random cases come from (one is drawn on first use)."""
    return _seed if _seed is not None else use_seed()


def case_rng(salt: str) -> random.Random:
    """A generator for one family of random cases: the same seed gives the same cases, and each
    family (`salt`) its own, so adding a family does not change another's."""
    return random.Random(f"{current_seed()}:{salt}")


# ---- student code ---------------------------------------------------------------------------------

# What a student's module may not import: the implementations a lab asks the student to write are in
# these packages (the receiver, the sender, the link summaries, the checkers themselves).
FORBIDDEN = ("transport", "experiments", "emulator", "topologies", "labs", "cli", "fabriclab")
_FORBIDDEN_NAMES = ("labs_check_", "labs_show_")


class ForbiddenImport(ImportError):
    """The student's code reached for fabriclab's own implementation."""


def _forbidden(name: str) -> bool:
    top = name.split(".", 1)[0]
    return top in FORBIDDEN or name.startswith(_FORBIDDEN_NAMES)


class _Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if _forbidden(fullname):
            raise ForbiddenImport(f"it imports {fullname}, fabriclab's own code: the lab asks you to write this "
                                  "yourself, with the standard library")
        return None


@contextmanager
def isolated() -> Iterator[None]:
    """fabriclab's packages out of reach while the student's code runs: not importable, and not in
    sys.modules either (where an earlier import would otherwise be found without asking)."""
    hidden = {name: mod for name, mod in sys.modules.items() if _forbidden(name)}
    for name in hidden:
        del sys.modules[name]
    blocker = _Blocker()
    sys.meta_path.insert(0, blocker)
    try:
        yield
    finally:
        sys.meta_path.remove(blocker)
        for name in [n for n in sys.modules if _forbidden(n)]:
            del sys.modules[name]
        sys.modules.update(hidden)




def load_module(folder: Path, filename: str) -> ModuleType | Check:
    """Import folder/filename as a fresh module; a failure is a failed check naming the file and error."""
    path = folder / filename
    if not path.is_file():
        return failed(f"load {filename}", f"{path} does not exist; copy the lab's starter/ and edit it there")
    try:
        with isolated():
            return import_file(path, f"_lab_student_{abs(hash(path.resolve()))}")
    except Exception as exc:
        return failed(f"load {filename}", f"importing {path} raised {_where(exc)}")


def call(module: ModuleType, function: str, *args: Any, **kwargs: Any) -> tuple[Any, Check | None]:
    """Call the student's function; (result, None) or (None, a failed check naming it and the error)."""
    fn: Callable[..., Any] | None = getattr(module, function, None)
    if not callable(fn):
        return None, failed(function, f"{Path(module.__file__ or '?').name} has no function {function}()")
    try:
        with isolated():
            return fn(*args, **kwargs), None
    except NotImplementedError as exc:
        return None, failed(function, f"{function}() is not written yet ({exc or 'TODO'})")
    except Exception as exc:
        return None, failed(function, f"{function}() raised {_where(exc)}")


def agrees(name: str, module: ModuleType, function: str, cases: dict[str, tuple[Any, ...]],
           reference: Callable[..., Any], rel: float = 0.0, what: str = "the reference") -> Check:
    """The student's `function` against `reference` on every case (a label -> the positional
    arguments): numbers within `rel` of the reference's (infinities equal), anything else equal. One
    check, naming the first case that disagrees or raises, or how many agreed."""
    for label, args in cases.items():
        want = reference(*args)
        got, error = call(module, function, *args)
        if error is not None:
            return failed(name, f"{error.reason} (on {label})")
        if not _same(got, want, rel):
            within = f" within {_pct(rel)}" if rel else ""
            return failed(name, f"{function}() on {label} gave {_show(got)}; {what} gives {_show(want)}{within}")
    return passed(name, f"{function}() agrees with {what} on all {len(cases)} cases"
                  + (f" (within {_pct(rel)})" if rel else ""))


def _same(got: Any, want: Any, rel: float) -> bool:
    if isinstance(want, numbers.Real) and not isinstance(want, bool):
        if not isinstance(got, numbers.Real) or isinstance(got, bool):
            return False
        if math.isinf(want) or math.isinf(got):
            return got == want
        return abs(got - want) <= rel * abs(want) + 1e-9
    if isinstance(want, (list, tuple)):
        return isinstance(got, (list, tuple)) and len(got) == len(want) and all(
            _same(g, w, rel) for g, w in zip(got, want, strict=True))
    return bool(got == want)


def _pct(rel: float) -> str:
    # A tolerance this small only absorbs floating-point rounding: say so rather than print "1e-07 %".
    return "rounding" if rel < 1e-6 else f"{rel * 100:g} %"


def _show(value: Any) -> str:
    if isinstance(value, float):
        return _fmt(value)
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _where(exc: BaseException) -> str:
    """'ValueError: msg (file.py line N)': the student's own frame, not the checker's."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if "labs/grading.py" not in f.filename.replace("\\", "/")]
    at = f" ({Path(own[-1].filename).name} line {own[-1].lineno})" if own else ""
    return f"{type(exc).__name__}: {exc}{at}"


# ---- output ---------------------------------------------------------------------------------------


def render(checks: Iterable[Check]) -> tuple[str, int]:
    """One line per check, then the verdict; exit code 0 when every check passed (a warning passes), 1
    otherwise."""
    checks = list(checks)
    if not checks:
        return "FAIL: the checker found nothing to grade", 1
    lines = [f"{('WARN' if c.warning else 'PASS') if c.passed else 'FAIL'}  {c.name}: {c.reason}" for c in checks]
    bad = sum(not c.passed for c in checks)
    lines.append(f"\n{'PASS' if not bad else 'FAIL'}: {len(checks) - bad} of {len(checks)} checks passed")
    return "\n".join(lines), 0 if not bad else 1
