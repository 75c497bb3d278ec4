"""The SRD-like transport; `python -m transport` (transport/__main__.py) starts its endpoints."""

import sys


def command_line(*args: str) -> list[str]:
    """The command that runs `python -m transport ARGS` with this interpreter, e.g. in an emulated host."""
    return [sys.executable, "-m", "transport", *args]
