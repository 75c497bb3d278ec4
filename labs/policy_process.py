"""A student's path policy in a process of its own, for lab 6's grader.

In the grader's process a policy could read what it is graded on off the call stack (the simulated
network's paths, which one the trial is about to fail) instead of learning it from feedback. Here the
policy lives in a child process that holds nothing but the policy and what its methods are given:
`num_evs`, the random generator's state, and each call's arguments. The grader's side is a stand-in
class with the same methods (`stand_in`), which the transport loads and guards like any plug-in; each
call is one JSON line to the child, and every call but the per-packet feedback (on_ack, on_suspect)
waits for one back; what that feedback raised comes back with the next answer, naming the method.

The child times every call in its own CPU time (`time.thread_time`), so a verdict on how long a
policy takes does not change with the machine's load, and `cpu_clock` hands the sum to the
transport's guard as its timer. An exception in the child is raised again on the grader's side with
the same type name, message and line of the student's file, so the guard reports it as it would an
in-process one.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# A call the child has not answered in this long (wall time) has hung: a loop that never returns.
ANSWER_TIMEOUT_S = 20.0
# The calls made once per packet that return nothing: sent without waiting for the child. (Losses and
# timeouts are rare and wait, so what they raise is raised from the call itself.)
_FEEDBACK = ("on_ack", "on_suspect")


class PolicyProcessError(Exception):
    """The child could not load the policy, or stopped answering."""


class _Child:
    """One child process serving every instance of one policy class."""

    def __init__(self, path: Path, class_name: str) -> None:
        repo = Path(__file__).resolve().parent.parent
        # -I: none of the user's environment; the repository on the path only for the plug-in loader.
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(repo)!r}); "
             "from labs.policy_process import serve; serve()", str(path), class_name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=str(path.parent))
        self.cpu_s = 0.0
        self.calls = 0
        self.next_id = 0
        self.dead: str | None = None  # why the child stopped answering: every later call fails at once
        hello = self.ask({"op": "hello"})
        if "err" in hello:
            self.close()
            raise PolicyProcessError(hello["err"])
        self.has_suspect = bool(hello.get("on_suspect"))

    def tell(self, message: dict[str, Any]) -> None:
        """A call that returns nothing (feedback): written, not waited for. The child runs it in order
        and reports what it raised with the next answer: a round trip per acknowledgement would double the cost."""
        assert self.proc.stdin is not None
        if self.dead:
            raise PolicyProcessError(self.dead)
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        except (BrokenPipeError, OSError):
            self.dead = "the policy's process has ended"
            raise PolicyProcessError(self.dead) from None

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.tell(message)
        try:
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.dead = "the policy's process has ended"
            raise PolicyProcessError(self.dead) from None
        ready, _, _ = select.select([self.proc.stdout], [], [], ANSWER_TIMEOUT_S)
        if not ready:
            self.dead = f"did not answer within {ANSWER_TIMEOUT_S:g} s (a loop that never returns?)"
            self.close()
            raise PolicyProcessError(self.dead)
        line = self.proc.stdout.readline()
        if not line:
            self.dead = "the policy's process ended (it exited or crashed the interpreter)"
            raise PolicyProcessError(self.dead)
        answer: dict[str, Any] = json.loads(line)
        self.cpu_s += float(answer.get("cpu", 0.0))
        self.calls += int(answer.get("calls", 1))
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


_child: _Child | None = None


@contextmanager
def serving(path: Path, class_name: str) -> Iterator[_Child]:
    """A child process for the policy `class_name` in `path` while the block runs; the stand-ins made
    meanwhile talk to it."""
    global _child
    if _child is not None:
        raise RuntimeError("one policy process at a time")
    _child = _Child(path, class_name)
    try:
        yield _child
    finally:
        _child.close()
        _child = None


def cpu_clock() -> float:
    """The CPU seconds the policy's calls have taken so far: a timer for the transport's guard."""
    return _child.cpu_s if _child is not None else 0.0


def _reraise(answer: dict[str, Any]) -> Any:
    """The child's exception, raised here with its type name, message and the student's file and line."""
    err = answer["err"]
    kind = type(str(err.get("type", "Exception")), (Exception,), {})
    exc = kind(err.get("message", ""))
    where, line = err.get("file"), err.get("line")
    if isinstance(where, str) and isinstance(line, int) and line > 0:
        # Raised from code compiled under the student's file name and line, so that the traceback's
        # innermost frame is theirs, as it would be in-process.
        exec(compile("\n" * (line - 1) + "raise _exc", Path(where).name, "exec"), {"_exc": exc})
    raise exc


class _NotJSON:
    """What a method returned that does not travel as JSON: shown by its repr and type."""

    def __init__(self, text: str, kind: str) -> None:
        self.text, self.kind = text, kind

    def __repr__(self) -> str:
        return self.text


class StandIn:
    """The grader's side of one policy instance."""

    def __init__(self, num_evs: int, rng: Any) -> None:
        if _child is None:
            raise PolicyProcessError("no policy process is running")
        self._child = _child
        self._id = _child.next_id
        _child.next_id += 1
        version, internal, gauss = rng.getstate()
        self._call("new", num_evs, [version, list(internal), gauss])

    def _call(self, op: str, *args: Any) -> Any:
        answer = self._child.ask({"op": op, "id": self._id, "args": list(args)})
        if "err" in answer:
            return _reraise(answer)
        if "not_json" in answer:
            return _NotJSON(*answer["not_json"])
        return answer.get("value")

    def _tell(self, op: str, *args: Any) -> None:
        self._child.tell({"op": op, "id": self._id, "args": list(args)})

    def next_ev(self, now: float, avoid: int | None = None) -> Any:
        return self._call("next_ev", now, avoid)

    def on_ack(self, ev: int, rtt: float, now: float) -> None:
        self._tell("on_ack", ev, rtt, now)

    def on_loss(self, ev: int, now: float) -> None:
        self._call("on_loss", ev, now)

    def on_timeout(self, ev: int, now: float) -> None:
        self._call("on_timeout", ev, now)

    def state(self) -> Any:
        return self._call("state")


class StandInWithSuspect(StandIn):
    """For a class that has the optional on_suspect hook: only such a class is told (the transport
    looks the hook up on the class)."""

    def on_suspect(self, ev: int, now: float) -> None:
        self._tell("on_suspect", ev, now)


def stand_in(class_name: str) -> type:
    """The stand-in class for the running child's policy, under the policy's own class name (the
    guard names it in what it reports)."""
    if _child is None:
        raise PolicyProcessError("no policy process is running")
    return type(class_name, (StandInWithSuspect if _child.has_suspect else StandIn,), {})


# ---- the child ------------------------------------------------------------------------------------


def _error(exc: BaseException, path: Path, op: str, reply: bool) -> dict[str, Any]:
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).name == path.name]
    text = " ".join(str(exc).split())[:200]
    if not reply:
        # Raised by feedback, reported with the next answer: say which method it was.
        text = f"in {op}(): {text}"
    out: dict[str, Any] = {"type": type(exc).__name__, "message": text}
    if frames:
        out["file"], out["line"] = path.name, frames[-1].lineno
    return out


def serve() -> None:
    """The child's loop: requests on stdin, answers on the stdout it was started with (the policy's
    own prints go to stderr, so they cannot corrupt the answers)."""
    import numbers
    import random

    path, class_name = Path(sys.argv[1]), sys.argv[2]
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    instances: dict[int, Any] = {}
    cls: Any = None
    pending_err: dict[str, Any] | None = None  # raised by feedback, not yet reported
    cpu, calls, value = 0.0, 0, None
    for line in sys.stdin:
        request = json.loads(line)
        op, args = request["op"], request.get("args", [])
        answer: dict[str, Any]
        if op == "hello":
            from transport.core.policy_plugin import PolicySpecError, load_class

            try:
                cls = load_class(f"{path}:{class_name}")
                answer = {"on_suspect": callable(getattr(cls, "on_suspect", None))}
            except PolicySpecError as exc:
                answer = {"err": str(exc)}
            answers.write(json.dumps(answer) + "\n")
            answers.flush()
            continue
        reply = op not in _FEEDBACK
        t0 = time.thread_time()
        try:
            if op == "new":
                num_evs, (version, internal, gauss) = args
                rng = random.Random()
                rng.setstate((version, tuple(internal), gauss))
                instances[request["id"]] = cls(num_evs, rng)
                value = None
            else:
                value = getattr(instances[request["id"]], op)(*args)
                if op == "next_ev" and isinstance(value, numbers.Integral) and not isinstance(value, bool):
                    value = int(value)  # a numpy integer is an EV in-process too
        except (Exception, SystemExit) as exc:
            if pending_err is None:  # the first: later ones are likely its consequences
                pending_err = _error(exc, path, op, reply)
        cpu += time.thread_time() - t0
        calls += 1
        if not reply:
            continue
        if pending_err is not None:
            answer = {"err": pending_err}
            pending_err = None
        else:
            answer = {"value": value}
            try:
                json.dumps(answer)
            except (TypeError, ValueError):
                answer = {"not_json": [repr(value)[:80], type(value).__name__]}
        answer["cpu"], answer["calls"] = cpu, calls
        cpu, calls = 0.0, 0
        answers.write(json.dumps(answer) + "\n")
        answers.flush()
