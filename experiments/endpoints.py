"""How the experiments and the live view start the transport's endpoints in emulated hosts.

Each endpoint is its own process, `python -m cli.endpoint COMMAND ...` (cli/endpoint.py): started by
its module name like any other program, which loads only the transport and its argument parsing.
"""

from __future__ import annotations

import sys

from transport.core.paths import is_plugin

ENTRY_MODULE = "cli.endpoint"


def command_line(*args: str) -> list[str]:
    """The command that runs the transport's `COMMAND ARGS` with this interpreter, e.g. in an emulated host."""
    return [sys.executable, "-m", ENTRY_MODULE, *args]


def sender_args(policy: str) -> list[str]:
    """The `srd send` (or all-reduce worker) options that select `policy`: a registered name or a plug-in."""
    return ["--path-policy", policy] if is_plugin(policy) else ["--policy", policy]
