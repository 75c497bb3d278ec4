"""Subcommands of the experiments layer. For now: `demo`, the path-spread probe in each routing mode."""

from __future__ import annotations

import argparse
import signal
import sys

from emulator.errors import EmulatorError
from topologies import DEFAULT_SPEC, SpecError

USER_ERRORS = (EmulatorError, SpecError)

# (mode, entropy): what each routing mode does to one flow and to a sender that rotates its source port.
DEMO_CASES = (
    ("ecmp", "fixed"),
    ("ecmp", "rotate"),
    ("spray", "fixed"),
    ("spray", "rotate"),
    ("single", "rotate"),
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo", help="bring up the default leaf-spine and run the path-spread probe in each routing mode",
        description="Bring up a leaf-spine fabric once and, switching the controller's routing mode live, "
        "send UDP packets between hosts on different leaves with a fixed and a rotating source port; "
        "print how many packets crossed each spine.")
    p.add_argument("--topo", default=DEFAULT_SPEC, metavar="SPEC", help="fabric (default: %(default)s)")
    p.add_argument("--packets", type=int, default=4000, help="packets per probe (default: %(default)s)")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from emulator.cli import _on_sigterm, format_probe_table
    from emulator.network import Fabric, _Terminated
    from emulator.probe import run_probe
    from topologies import parse_spec

    topo = parse_spec(args.topo)
    hosts = topo.hosts
    src, dst = hosts[0].name, hosts[-1].name
    signal.signal(signal.SIGTERM, _on_sigterm)
    results = []
    try:
        with Fabric(topo, mode="ecmp") as fab:
            print(f"fabric {topo.name} up in {fab.timings.bring_up_s:.1f} s ({fab.datapath} datapath); "
                  f"probing {src} -> {dst} with {args.packets} packets per case", file=sys.stderr)
            for mode, entropy in DEMO_CASES:
                if fab.mode != mode:
                    fab.set_mode(mode)
                print(f"  {mode} / {entropy} ...", file=sys.stderr, flush=True)
                results.append(run_probe(fab, src, dst, packets=args.packets, entropy=entropy, rate_pps=4000))
    except (KeyboardInterrupt, _Terminated):
        print("interrupted; fabric torn down", file=sys.stderr)
        return 130
    print(format_probe_table(results))
    return 0
