"""The `fabriclab` command line: one entry point whose subcommands live beside the code they drive.

Each package contributes a module with `register(subparsers)`; a subcommand's handler takes the parsed
arguments and returns an exit code. The module also names, in `USER_ERRORS`, the exception classes that
mean "bad input or environment": those are shown as one line with the fix, a non-zero exit and no
traceback. Packages stay independent of each other: none imports the CLI.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

# Modules that add subcommands; each has `register(subparsers) -> None`.
_COMMAND_MODULES = (
    "emulator.cli",
    "transport.cli",
    "experiments.commands",
    "experiments.live.commands",
    "labs.commands",
)


def _command_modules(only: str | None = None) -> list:
    modules = []
    for name in (only,) if only else _COMMAND_MODULES:
        try:
            modules.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
    return modules


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line naming the problem and where to look, not usage + error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="fabriclab",
        description="Emulate AI data-centre fabrics (Mininet + Open vSwitch + an OpenFlow controller) "
        "and measure an SRD-like multipath transport on them.",
    )
    parser.add_argument("--version", action="version", version=f"fabriclab {_version()}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # Several packages add benchmarks under one `bench` command.
    bench = sub.add_parser("bench", help="benchmarks that print figures as JSON",
                           description="Benchmarks of this machine and of the transport; each prints JSON.")
    bench.add_subparsers(dest="bench_command", metavar="WHAT")
    bench.set_defaults(func=lambda args: bench.print_help() or 2)
    for module in _command_modules(only):
        module.register(sub)
    return parser


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("fabriclab")
    except Exception:
        return "unknown"


# Subcommands whose module alone can serve them. `fabriclab srd ...` runs once per emulated host
# and flow; importing every command module (the emulator, the runner, numpy) would add ~0.2 s of
# CPU to each start, all of it charged to the flow's completion time.
_SOLE_MODULE = {"srd": "transport.cli"}


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    sole = _SOLE_MODULE.get(args_list[0]) if args_list else None
    parser = build_parser(only=sole)
    args = parser.parse_args(args_list)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    user_errors = tuple(e for m in _command_modules(sole) for e in getattr(m, "USER_ERRORS", ()))
    try:
        return int(args.func(args) or 0)
    except user_errors as exc:
        print(f"fabriclab {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fabriclab {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
