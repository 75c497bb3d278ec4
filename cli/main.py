"""The `fabriclab` command line: its parser, dispatch to the command modules, one-line user errors, -v.

Each module named in COMMAND_MODULES holds one area's commands. Its `register(commands, bench)` adds
its sub-commands to `commands` and its benchmarks to `bench` (the sub-commands of `fabriclab bench`,
created here once); each sub-command's handler, `func(args)`, returns the exit status. The module's
USER_ERRORS name the exceptions that mean bad input or environment: those are shown as one line with
the fix, exit status 2 and no traceback. So a new area is one more line in COMMAND_MODULES, and a new
option of a command goes where that command's parser is built, in its area's module.

`python -m cli.endpoint` (cli/endpoint.py) runs this same `main` over the transport's modules only.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from cli.args import OneLineParser, show_help

COMMAND_MODULES = (
    "cli.fabric",
    "cli.srd",
    "cli.allreduce",
    "cli.training_node",
    "cli.experiments",
    "cli.live",
    "cli.labs",
    "cli.cluster",
)

# Commands their module alone can serve. Endpoints start once per emulated host and flow; importing
# every command module (the emulator, the runner, plotting) would add ~0.2 s of CPU to each start.
SOLE_MODULE = {"srd": "cli.srd", "allreduce": "cli.allreduce", "tcpflow": "cli.tcpflow",
               "train-node": "cli.training_node"}

DESCRIPTION = ("Emulate AI data-centre fabrics (Mininet + Open vSwitch + an OpenFlow controller) "
               "and measure an SRD-like multipath transport on them.")


class _Version(argparse.Action):
    """--version, read from the installed metadata only when asked: reading it costs every start ~15 ms."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show the version and exit", **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        try:
            from importlib.metadata import version

            text = version("fabriclab")
        except Exception:
            text = "unknown"
        print(f"fabriclab {text}")
        parser.exit()


def _load(modules: Sequence[str]) -> list[ModuleType]:
    return [importlib.import_module(name) for name in modules]


def build_parser(modules: Sequence[str] = COMMAND_MODULES, prog: str = "fabriclab",
                 description: str = DESCRIPTION) -> argparse.ArgumentParser:
    parser = OneLineParser(prog=prog, description=description)
    parser.add_argument("--version", action=_Version)
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    bench = commands.add_parser("bench", help="benchmarks that print figures as JSON",
                                description="Benchmarks of this machine and of the transport; each prints JSON.")
    bench.set_defaults(func=show_help(bench))
    bench_commands = bench.add_subparsers(dest="bench_command", metavar="WHAT")
    for module in _load(modules):
        module.register(commands, bench_commands)
    return parser


def main(argv: Sequence[str] | None = None, *, modules: Sequence[str] = COMMAND_MODULES,
         prog: str = "fabriclab", description: str = DESCRIPTION) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    sole = SOLE_MODULE.get(args_list[0]) if args_list else None
    if sole in modules:
        modules = (sole,)
    parser = build_parser(modules, prog, description)
    args = parser.parse_args(args_list)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    args.prog = f"{prog} {args.command}"  # the command as it was invoked, for the handlers' own messages
    user_errors = tuple(e for m in _load(modules) for e in getattr(m, "USER_ERRORS", ()))
    try:
        return int(args.func(args) or 0)
    except user_errors as exc:
        print(f"{args.prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{args.prog}: interrupted", file=sys.stderr)
        return 130
    except BaseException as exc:
        if not _terminated(exc):
            raise
        print(f"{args.prog}: terminated ({exc.args[0] if exc.args else 'SIGTERM'})", file=sys.stderr)
        return 143


def _terminated(exc: BaseException) -> bool:
    """Whether `exc` is the emulator's Terminated (SIGTERM or SIGHUP, raised where a command brings
    fabrics up): only a command that imported emulator.network can have raised it, and the transport's
    commands, which run inside the emulated hosts, stay without that import."""
    network = sys.modules.get("emulator.network")
    return network is not None and isinstance(exc, network.Terminated)

