"""Your own path policy, `FILE.py:ClassName`: loaded, checked, and run behind a guard.

A plug-in policy is a class with the methods of `transport.core.paths.PathPolicy` (``next_ev``, ``on_ack``,
``on_loss``, ``on_timeout``, ``state``), built like the built-in policies as ``ClassName(num_evs, rng)``.
Wherever a policy name is accepted (``TransportConfig.path_policy``, ``--path-policy`` on
``fabriclab srd send``, ``run`` and ``live``) a spec ``/abs/path/file.py:ClassName`` may stand instead.

What can be checked before anything starts is checked by `load_class` (the file exists, it imports
within IMPORT_BUDGET_S, the class exists and has every method): a `PolicySpecError`, one line. What
can only go wrong while the policy runs is caught by `GuardedPolicy`, which wraps every call into the
user's code: an exception, a return value that is not an EV in range, or calls that are too slow. The
first such fault is logged as one warning naming the method and the problem, the connection carries on
with a built-in fallback (spray), and the fault stays in the connection's metrics
(``path_policy_fault``) for graders to see.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import numbers
import random
import reprlib
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transport.core.config import env_positive
from transport.core.paths import PathPolicy, make_builtin_policy
from transport.core.paths import is_plugin as is_spec

log = logging.getLogger(__name__)

METHODS = ("next_ev", "on_ack", "on_loss", "on_timeout", "state")
FALLBACK = "spray"

# Time budgets for the user's code. The policy runs inside the sender's event loop, once per packet
# sent (next_ev) and once per packet acknowledged (on_ack); while it runs nothing else does: no ACK
# is read, no timer fires. A call over CALL_BUDGET_S holds every timer of the connection for ten RTO
# floors (5 ms) and is a fault, but only the second such call: a loaded machine can deschedule the
# process for tens of milliseconds, and one stall landing inside a call is bad luck, two are the code.
# On average the built-in policies take about a microsecond per call; MEAN_BUDGET_S is 200 times that.
# At two calls per packet, 0.2 ms per call is 0.4 ms of CPU per packet: four senders at the live
# view's 4 Mb/s would take well over a quarter of a core just choosing paths, which the emulator
# (two cores for Open vSwitch and every endpoint) cannot spare. Calls over CALL_BUDGET_S are left out
# of the mean, so a descheduled process does not spoil it either.
CALL_BUDGET_S = 0.050
SLOW_CALLS = 2
MEAN_BUDGET_S = 0.0002
MEAN_WINDOW = 500

# Importing the file runs its top level, before anything starts: a file that waits there (a sleep, a
# network call, a loop) would hang the command with nothing said. Importing numpy or torch takes a few
# seconds on a cold cache; IMPORT_BUDGET_S (FABRICLAB_POLICY_IMPORT_S) allows several times that.
IMPORT_BUDGET_S = 20.0
IMPORT_BUDGET_ENV = "FABRICLAB_POLICY_IMPORT_S"

_loaded: dict[tuple[str, str, int, int], type] = {}


class PolicySpecError(ValueError):
    """A `FILE.py:ClassName` that cannot be used: one line saying what is wrong and how to fix it."""


@dataclass(frozen=True)
class PolicySpec:
    path: Path  # absolute: endpoints in emulated hosts are separate processes with their own cwd
    class_name: str

    def __str__(self) -> str:
        return f"{self.path}:{self.class_name}"


def label(policy: str) -> str:
    """What to call a policy in tables and on the page: a built-in's name, a plug-in's class name."""
    return policy.rpartition(":")[2] if is_spec(policy) else policy


def parse_spec(text: str) -> PolicySpec:
    """`FILE.py:ClassName` -> PolicySpec with the file's absolute path (nothing is loaded yet)."""
    file, sep, cls = text.strip().rpartition(":")
    if not sep or not file.endswith(".py"):
        raise PolicySpecError(f"{_shown(text)!r} is not FILE.py:ClassName; e.g. my_policy.py:MyPolicy")
    if not cls.isidentifier():
        raise PolicySpecError(f"{_shown(text)}: {cls!r} is not a Python class name; e.g. my_policy.py:MyPolicy")
    try:
        path = Path(file).expanduser().resolve()
    except RuntimeError as exc:  # `~nosuchuser/...`, or a symlink loop
        problem = " ".join(str(exc).split()).rstrip(".")
        if file.startswith("~") and not file.startswith(("~/", "~" + "\\")):
            problem = f"there is no user {file[1:].partition('/')[0]!r} for '~' to stand for"
        raise PolicySpecError(f"{_shown(file)}: {problem}; give the path of your policy's .py file") from None
    except OSError as exc:
        raise PolicySpecError(f"{_shown(file)}: {exc.strerror or exc}; give the path of your policy's .py file") \
            from None
    return PolicySpec(path, cls)


def _shown(text: str, limit: int = 80) -> str:
    """A path as it goes into a one-line error: cut in the middle when it is very long."""
    return text if len(text) <= limit else text[: limit // 2] + "…" + text[-(limit // 2 - 1):]


def load_class(spec: PolicySpec | str) -> type:
    """Import the spec's file and return its policy class; PolicySpecError (one line) if it cannot be used.

    A file is imported once per process while it is unchanged (endpoints load it when their options
    are checked and again for every connection)."""
    if isinstance(spec, str):
        spec = parse_spec(spec)
    path = spec.path
    try:
        if not path.is_file():
            raise PolicySpecError(f"{_shown(str(path))} does not exist; give the path of your policy's .py file")
        st = path.stat()
    except OSError as exc:  # a name too long for the file system, a directory we may not read
        raise PolicySpecError(f"{_shown(str(path))}: {exc.strerror or exc}; give the path of your policy's "
                              ".py file") from None
    key = (str(path), spec.class_name, st.st_mtime_ns, st.st_size)
    cls = _loaded.get(key)
    if cls is None:
        cls = _loaded[key] = _check_class(_import(path), spec)
    return cls


def _import(path: Path) -> Any:
    name = "fabriclab_policy_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise PolicySpecError(f"{path} cannot be imported as Python")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses in the user's module look themselves up here
    budget = _import_budget()
    try:
        with _deadline(budget):
            module_spec.loader.exec_module(module)
    except _TooSlow:
        sys.modules.pop(name, None)
        raise PolicySpecError(f"importing {path} took longer than {budget:g} s; a policy file must not wait at "
                              f"import (do slow setup in the class's __init__, or set {IMPORT_BUDGET_ENV} to "
                              "more seconds)") from None
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        raise PolicySpecError(f"{path} line {exc.lineno}: syntax error: {exc.msg}") from None
    except SystemExit as exc:
        # Otherwise the command would end with the policy file's exit status, before it said anything.
        sys.modules.pop(name, None)
        raise PolicySpecError(f"importing {path} called sys.exit({exc.code!r}); a policy file must not exit "
                              f"(put scripts under `if __name__ == \"__main__\":`)") from None
    except Exception as exc:
        sys.modules.pop(name, None)
        raise PolicySpecError(f"importing {path} raised {describe_exception(exc)}") from None
    return module


class _TooSlow(BaseException):
    """Raised into the user's top-level code when its import runs out of time; a BaseException, so that
    the file's own `except Exception` does not swallow it."""


def _import_budget() -> float:
    try:
        return env_positive(IMPORT_BUDGET_ENV, IMPORT_BUDGET_S, "seconds")
    except ValueError as exc:
        raise PolicySpecError(str(exc)) from None


@contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Interrupt the block with _TooSlow after `seconds` (SIGALRM: the main thread only, elsewhere
    unbounded); a timer already set is restored afterwards, less the time spent here."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise _TooSlow

    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, expire)
    pending, interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if pending:
            signal.setitimer(signal.ITIMER_REAL, max(pending - (time.monotonic() - started), 1e-3), interval)


def _check_class(module: Any, spec: PolicySpec) -> type:
    cls = getattr(module, spec.class_name, None)
    if cls is None:
        found = sorted(n for n, v in vars(module).items() if isinstance(v, type) and v.__module__ == module.__name__)
        have = f"it defines {', '.join(found)}" if found else "it defines no class"
        raise PolicySpecError(f"{spec.path} has no class {spec.class_name} ({have})")
    if not isinstance(cls, type):
        raise PolicySpecError(f"{spec.class_name} in {spec.path} is a {type(cls).__name__}, not a class")
    missing = [m for m in METHODS if not callable(getattr(cls, m, None))]
    if missing:
        raise PolicySpecError(
            f"{spec.class_name} is not a path policy: it has no {', '.join(m + '()' for m in missing)} "
            f"(a policy needs {', '.join(METHODS)}; see transport/core/paths.py)")
    return cls


def check_spec(text: str) -> str:
    """The canonical spec (absolute path) of a usable plug-in; PolicySpecError otherwise."""
    spec = parse_spec(text)
    load_class(spec)
    return str(spec)


def describe_exception(exc: BaseException) -> str:
    """'ValueError: msg (my_policy.py line 12)', on one line: the user's own innermost frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if not f.filename.replace("\\", "/").endswith("transport/core/policy_plugin.py")]
    at = f" ({Path(own[-1].filename).name} line {own[-1].lineno})" if own else ""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}{': ' + text[:200] if text else ''}{at}"


def _show(value: Any) -> str:
    return f"{reprlib.repr(value)} ({type(value).__name__})"


class _Failed:
    """The result of a call into the user's code that did not return normally."""


_FAILED = _Failed()


class GuardedPolicy:
    """A user's policy behind checks; after its first fault, the fallback policy answers instead.

    Only the first fault is reported (`fault`, one log warning): from then on the user's code is not
    called again, so one broken method cannot flood the log or leave the policy half-updated.
    `timer` times the user's code (wall time: a call that blocks stalls the endpoint however it
    blocks); it is never used for protocol time, which comes from the `now` the connection passes.
    """

    def __init__(self, cls: type, num_evs: int, rng: random.Random, *, fallback: str = FALLBACK,
                 timer: Callable[[], float] = time.perf_counter, source: str = "") -> None:
        self.name = self.label = cls.__name__
        self.source = source
        self.num_evs = num_evs
        self.fallback_name = fallback
        self.fault: str | None = None
        self.fault_method: str | None = None
        self.calls = 0
        self._rng = rng
        self._timer = timer
        self._active: PathPolicy | None = None  # the fallback, once a fault happened
        self._slow_calls = 0
        self._window_n = 0
        self._window_s = 0.0
        self._window_by: dict[str, list[float]] = {}
        self._busy_s = 0.0
        try:
            self._inner = cls(num_evs, rng)
        except (Exception, SystemExit) as exc:
            self._inner = None
            self._fail("__init__", f"raised {describe_exception(exc)}", call=f"{self.label}(num_evs, rng)")
        if callable(getattr(cls, "on_suspect", None)):
            # Loss recovery looks the hook up once (getattr): only a class that has it gets the calls.
            self.on_suspect = self._on_suspect

    # -- the PathPolicy interface ----------------------------------------------------------------
    def next_ev(self, now: float, avoid: int | None = None) -> int:
        if self._active is None:
            ev = self._call("next_ev", now, avoid)
            if self._active is None:
                if isinstance(ev, numbers.Integral) and not isinstance(ev, bool) and 0 <= ev < self.num_evs:
                    return int(ev)
                self._fail("next_ev", f"returned {_show(ev)}, expected an int EV in 0..{self.num_evs - 1}")
        assert self._active is not None
        return self._active.next_ev(now, avoid)

    def on_ack(self, ev: int, rtt: float, now: float) -> None:
        if self._active is None:
            self._call("on_ack", ev, rtt, now)
        else:
            self._active.on_ack(ev, rtt, now)

    def on_loss(self, ev: int, now: float) -> None:
        if self._active is None:
            self._call("on_loss", ev, now)
        else:
            self._active.on_loss(ev, now)

    def on_timeout(self, ev: int, now: float) -> None:
        if self._active is None:
            self._call("on_timeout", ev, now)
        else:
            self._active.on_timeout(ev, now)

    def _on_suspect(self, ev: int, now: float) -> None:
        if self._active is None:
            self._call("on_suspect", ev, now)
        # The fallback (spray) does not steer: it has no use for the hint.

    def state(self) -> dict:
        inner: Any = None
        if self._active is None:
            inner = self._call("state")
            if self._active is None and not _json_dict(inner):
                self._fail("state", f"returned {_show(inner)}, expected a dict of JSON values (numbers, "
                           "strings, lists, dicts)")
        return {
            "plugin": self.label, "source": self.source, "fault": self.fault, "fault_method": self.fault_method,
            "fallback": self.fallback_name if self._active is not None else None, "calls": self.calls,
            "mean_call_us": round(1e6 * self._busy_s / self.calls, 2) if self.calls else None,
            "state": inner if self._active is None else None,
        }

    # -- the guard -------------------------------------------------------------------------------
    def _call(self, method: str, *args: Any) -> Any:
        t0 = self._timer()
        try:
            result = getattr(self._inner, method)(*args)
        except (Exception, SystemExit) as exc:  # sys.exit() in a policy must not end the endpoint
            self._fail(method, f"raised {describe_exception(exc)}")
            return _FAILED
        self._account(method, self._timer() - t0)
        return result

    def _account(self, method: str, dt: float) -> None:
        self.calls += 1
        self._busy_s += dt
        if dt > CALL_BUDGET_S:
            self._slow_calls += 1
            if self._slow_calls >= SLOW_CALLS:
                self._fail(method, f"took {dt * 1e3:.0f} ms, call {self._slow_calls} over the budget of "
                           f"{CALL_BUDGET_S * 1e3:.0f} ms per call (it stalls the whole endpoint)")
            return
        self._window_n += 1
        self._window_s += dt
        per = self._window_by.setdefault(method, [0, 0.0])
        per[0] += 1
        per[1] += dt
        if self._window_n < MEAN_WINDOW:
            return
        mean = self._window_s / self._window_n
        if mean > MEAN_BUDGET_S:
            slowest, (n, total) = max(self._window_by.items(), key=lambda kv: kv[1][1])
            self._fail(slowest, f"took {1e3 * total / n:.2f} ms per call on average (all methods: "
                       f"{mean * 1e3:.2f} ms over {self._window_n} calls; budget {MEAN_BUDGET_S * 1e3:.1f} ms)")
        self._window_n, self._window_s, self._window_by = 0, 0.0, {}

    def _fail(self, method: str, problem: str, call: str = "") -> None:
        if self._active is not None:
            return
        self.fault_method = method
        self.fault = f"{call or f'{self.label}.{method}()'} {problem}"
        log.warning("path policy %s; using %s from now on", self.fault, self.fallback_name)
        self._active = make_builtin_policy(self.fallback_name, self.num_evs, self._rng)


def _json_dict(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def make_guarded(policy: str, num_evs: int, rng: random.Random) -> GuardedPolicy:
    """The plug-in `policy` (a spec) for one connection, behind its guard."""
    spec = parse_spec(policy)
    return GuardedPolicy(load_class(spec), num_evs, rng, source=str(spec))


def make_policy(name: str, num_evs: int, rng: random.Random) -> PathPolicy:
    """A connection's path policy: a registered one by name (transport.core.paths.POLICIES), or a user's
    plug-in (`FILE.py:ClassName`) behind its guard."""
    if is_spec(name):
        return make_guarded(name, num_evs, rng)
    return make_builtin_policy(name, num_evs, rng)
