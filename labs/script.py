"""What a lab's code file does when a student runs it (`python lab1/hotlinks.py results/lab1`): the lab's
`show.py` prints the student's functions applied to a simulation or a measured run, next to fabriclab's
own numbers.

The display code lives once, beside the lab's checker, so the student's file holds only what the student
writes. A function not written yet shows as TODO instead of stopping the script, and bad input (no such
results) is one line and exit code 2.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from labs.catalogue import LABS_DIR, LabError, find_lab


def attempt(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args), or None while the student has not written fn yet."""
    try:
        return fn(*args)
    except NotImplementedError:
        return None


def run(number: int, student: ModuleType, argv: list[str], root: Path = LABS_DIR) -> int:
    """Lab `number`'s show.py on the student's module: its exit code (2 with one line on bad input)."""
    name = Path(student.__file__ or "lab code").name
    try:
        lab = find_lab(number, root)
        path = lab.path / "show.py"
        spec = importlib.util.spec_from_file_location(f"labs_show_{lab.number:02d}", path)
        if spec is None or spec.loader is None or not path.is_file():
            raise LabError(f"lab {number} has nothing to show ({path} is missing)")
        show = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(show)
        return int(show.main(student, argv) or 0)
    except LabError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
