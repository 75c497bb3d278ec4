"""A cheat lab 6's grader once passed 8/8: the lab's solution with an on_timeout that raises, which no
trial ever called (on_timeout 0 calls, next_ev 13,094)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import labs

_spec = importlib.util.spec_from_file_location(
    "lab6_solution", Path(labs.__file__).parent / "06-your-path-policy" / "solution" / "my_policy.py")
_solution = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_solution)


class MyPolicy(_solution.MyPolicy):
    def on_timeout(self, ev: int, now: float) -> None:
        raise RuntimeError("on_timeout was never written")
