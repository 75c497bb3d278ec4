"""The one argument-error parser and the argument types every command shares.

A usage error is one line naming the option and where to look, with exit status 2. Every type raises
`argparse.ArgumentTypeError` with a sentence saying what is accepted. This module imports nothing of the
project's own when it is loaded (--path-policy loads the plug-in checker when it is given): the
transport's entry point loads it on every endpoint start.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, NoReturn

# Binary multiples: K = 1024.
SIZE_SUFFIXES = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
COUNT_SUFFIXES = "kmg"


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line naming the problem and where to look, not usage + error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        # argparse turns a type's ValueError and TypeError into a usage error, but not the OSError of a
        # path the system refuses (too long, a symlink loop) or the RuntimeError of `~nosuchuser`.
        try:
            return super()._get_value(action, arg_string)
        except (OSError, RuntimeError) as exc:
            shown = arg_string if len(arg_string) <= 60 else arg_string[:30] + "…" + arg_string[-29:]
            problem = getattr(exc, "strerror", None) or " ".join(str(exc).split())
            raise argparse.ArgumentError(action, f"{shown!r}: {problem}") from None


def show_help(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """The handler of a command given without its sub-command: its help on stderr, exit status 2."""

    def handler(_args: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return 2

    return handler


# --------------------------------------------------------------------------------------------------
# Sizes and counts


def size_arg(text: str) -> int:
    """Bytes with an optional binary suffix: 1400, 64K, 2M, 1G (K = 1024)."""
    raw = text.strip().lower().removesuffix("ib").removesuffix("b")
    mult = 1
    if raw and raw[-1] in SIZE_SUFFIXES:
        mult = SIZE_SUFFIXES[raw[-1]]
        raw = raw[:-1]
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; use e.g. 1400, 64K, 2M or 1G") from None
    if value < 0 or value != value:
        raise argparse.ArgumentTypeError(f"{text!r} is negative; sizes must be >= 0")
    return int(value * mult)


def positive_size(text: str) -> int:
    value = size_arg(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1 byte")
    return value


def mtu_arg(text: str) -> int | str:
    """A datagram size in bytes, or `auto` (the path MTU, found once the destination is known)."""
    if text.strip().lower() == "auto":
        return "auto"
    return positive_size(text)


def count_arg(text: str) -> int:
    """A whole count with an optional K/M/G suffix (powers of 1024): 4096, 256K, 1M."""
    raw = text.strip().lower()
    mult = 1
    if raw and raw[-1] in COUNT_SUFFIXES:
        mult, raw = SIZE_SUFFIXES[raw[-1]], raw[:-1]
    if not raw.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a count; use e.g. 4096, 256K or 1M")
    return int(raw) * mult


# --------------------------------------------------------------------------------------------------
# Numbers


def number_arg(kind: Callable[[str], Any], what: str, low: float, high: float | None = None, *,
               strict: bool = False, unit: str = "", why: str = "") -> Callable[[str], Any]:
    """A parser of `kind` (int, float) accepting low..high (above low only, when strict)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        too_low = value <= low if strict else value < low
        if value != value or too_low or (high is not None and value > high):
            bounds = f"from {low:g} to {high:g}" if high is not None else f"{'>' if strict else '>='} {low:g}"
            raise argparse.ArgumentTypeError(f"{text!r} must be {bounds}{unit}" + (f" ({why})" if why else ""))
        return value

    return parse


positive_float = number_arg(float, "a number", 0, strict=True)
nonneg_float = number_arg(float, "a number", 0)
positive_int = number_arg(int, "a whole number", 0, strict=True)
nonneg_int = number_arg(int, "a whole number", 0)
positive_seconds = number_arg(float, "a number of seconds", 0, strict=True, unit=" seconds")


# --------------------------------------------------------------------------------------------------
# Ports and addresses


def port_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number; use 1-65535") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is out of range; use 1-65535")
    return value


def port_or_any(text: str) -> int:
    """A port, or 0 for any free one (the kernel picks it; where it matters, it is reported)."""
    if text.strip() == "0":
        return 0
    return port_arg(text)


def destination_arg(default_port: int | None) -> Callable[[str], tuple[str, int]]:
    """HOST, HOST:PORT, [V6ADDR] or [V6ADDR]:PORT -> (host, port); default_port None: the port is required."""

    def parse(text: str) -> tuple[str, int]:
        text = text.strip()
        if not text:
            raise argparse.ArgumentTypeError("empty address; use HOST or HOST:PORT")
        if text.startswith("["):
            host, sep, rest = text[1:].partition("]")
            if not sep:
                raise argparse.ArgumentTypeError(f"{text!r}: missing ']' in IPv6 address; use [ADDR]:PORT")
            port_text = rest.removeprefix(":") if rest else ""
            if rest and not rest.startswith(":"):
                raise argparse.ArgumentTypeError(f"{text!r}: use [ADDR]:PORT")
        elif text.count(":") == 1:
            host, _, port_text = text.partition(":")
        else:
            host, port_text = text, ""  # a bare IPv6 address or a host name
        if not host:
            raise argparse.ArgumentTypeError(f"{text!r} has no host; use HOST or HOST:PORT")
        if port_text:
            return host, port_arg(port_text)
        if default_port is None:
            raise argparse.ArgumentTypeError(f"{text!r} has no port; use HOST:PORT")
        return host, default_port

    return parse


def parse_peers(text: str) -> list[tuple[str, int]]:
    """IP:PORT,IP:PORT,... ([v6]:PORT for IPv6)."""
    peers = []
    for item in text.split(","):
        item = item.strip()
        host, sep, port_s = item.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if not sep or not host or not port_s.isdigit():
            raise argparse.ArgumentTypeError(f"{item!r} is not IP:PORT; use e.g. 10.0.0.1:7000,10.0.0.2:7000")
        port = int(port_s)
        if not 1 <= port <= 65535:
            raise argparse.ArgumentTypeError(f"port {port} in {item!r} is out of range; use 1-65535")
        peers.append((host, port))
    return peers


# --------------------------------------------------------------------------------------------------
# Path policies: the one definition of --path-policy for every command that takes it.


def path_policy_arg(text: str) -> str:
    """argparse type: a usable `FILE.py:ClassName` (transport.core.policy_plugin), as its canonical spec
    with an absolute path."""
    from transport.core.policy_plugin import PolicySpecError, check_spec

    try:
        return check_spec(text)
    except PolicySpecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_path_policy_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                             what: str = "overrides --policy") -> None:
    """Add --path-policy FILE.py:CLASS, checked when the options are parsed, before anything starts;
    `what` says what the command does with it."""
    parser.add_argument(
        "--path-policy", type=path_policy_arg, default=None, metavar="FILE.py:CLASS",
        help="your own path policy: a class in FILE.py with the methods of transport/core/paths.py's PathPolicy "
        f"(next_ev, on_ack, on_loss, on_timeout, state), built as CLASS(num_evs, rng); {what}. A policy "
        "that raises, returns a bad EV or is too slow is reported once and replaced by spray for the rest "
        "of the run")


class _ServersAction(argparse.Action):
    """--servers: checked now (one line, exit 2), then set for every fabric this process brings up."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        import os

        from emulator.cluster import SERVERS_ENV
        from emulator.cluster.fabric import parse_servers
        from emulator.errors import EmulatorError

        try:
            spec = parse_servers(str(values))
        except EmulatorError as exc:
            parser.error(str(exc))
        os.environ[SERVERS_ENV] = spec.text
        setattr(namespace, self.dest, spec.text)


def add_servers_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--servers", action=_ServersAction, default=None, metavar="ns:N|HOST,...",
                        help="split the fabric across servers with Mininet's cluster engine: HOST,... are "
                        "machines reached over ssh (each with Open vSwitch, passwordless sudo and the same "
                        "fabriclab and Mininet; 'localhost' puts nodes here too); ns:N makes N servers out of "
                        "namespaces on this machine, each with its own sshd and Open vSwitch. Leaf and edge "
                        "switches stay with their hosts; only fabric links cross servers (ssh tunnels). "
                        "Default: this machine alone (env FABRICLAB_SERVERS)")
