"""A cheat of lab 6's tail metric: the lab's solution until 1.35 s, then every packet, retransmissions
included, on EV 0, whose path the one-seed cut trial has just cut. Nothing finishes after that, and a
tail counted over finished messages only stayed at 38 ms."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import labs

_spec = importlib.util.spec_from_file_location(
    "lab6_solution", Path(labs.__file__).parent / "06-your-path-policy" / "solution" / "my_policy.py")
_solution = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_solution)

STALL_AT_S = 1.35


class MyPolicy(_solution.MyPolicy):
    def next_ev(self, now: float, avoid: int | None = None) -> int:
        if now >= STALL_AT_S:
            return 0
        return super().next_ev(now, avoid)
