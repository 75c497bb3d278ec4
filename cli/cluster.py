"""`fabriclab cluster ...`: fabrics split across servers (emulator.cluster)."""

from __future__ import annotations

import argparse
import json
import signal

from cli.args import number_arg, show_help
from emulator.errors import EmulatorError

USER_ERRORS = (EmulatorError,)


def register(commands: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    p = commands.add_parser("cluster", help="fabrics split across servers (Mininet's cluster engine)",
                            description="Fabrics split across servers. `fabriclab up/run/live --servers` "
                            "bring one up; `cluster selftest` checks the whole path on this machine.")
    p.set_defaults(func=show_help(p))
    sub = p.add_subparsers(dest="cluster_command", metavar="WHAT")
    s = sub.add_parser("selftest", help="make N servers out of namespaces here and check a fabric across them",
                       description="Make N servers out of network and mount namespaces on this machine, each "
                       "with its own sshd (a key made for the run, listening only on a private underlay) and "
                       "its own Open vSwitch; bring up a leaf-spine split across them with Mininet's cluster "
                       "engine; ping all; probe spraying across server boundaries; measure what crossing "
                       "servers costs (round-trip time against the same fabric on one machine, ssh-tunnel CPU "
                       "per packet, each server's CPU idle); run a short ecmp-vs-spray across them; tear down "
                       "and check nothing is left. One line per check; exit 1 if one fails. Needs root.")
    s.add_argument("--servers", type=number_arg(int, "a whole number", 1, 8), default=2, metavar="N",
                   help="namespace servers to make (default: %(default)s)")
    s.add_argument("--duration", type=number_arg(float, "a number of seconds", 1, 120), default=4.0, metavar="S",
                   help="seconds of traffic per arm of the ecmp-vs-spray check (default: %(default)s)")
    s.add_argument("--no-experiment", action="store_true", help="skip the ecmp-vs-spray check")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    s.set_defaults(func=cmd_selftest)


def cmd_selftest(args: argparse.Namespace) -> int:
    from emulator.cluster.selftest import run_selftest
    from emulator.network import raise_terminated, terminate_on_hangup
    from emulator.system import capabilities, require_ready

    require_ready(capabilities())
    signal.signal(signal.SIGTERM, raise_terminated)
    terminate_on_hangup()

    def line(c) -> None:
        if not args.json:
            print(f"  [{'ok  ' if c.ok else 'FAIL'}] {c.name:<22} {c.detail}", flush=True)

    report = run_selftest(args.servers, duration=args.duration, progress=line, experiment=not args.no_experiment)
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        print("cluster selftest passed" if report.ok else "cluster selftest FAILED")
    return 0 if report.ok else 1
