"""The emulator's commands: `fabriclab doctor`, `clean`, `up`, `probe` and `bench fabric`."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import time

from cli.args import add_servers_argument
from emulator.cluster import new_fabric
from emulator.errors import EmulatorError
from emulator.network import (
    ISOLATION_ENV,
    ISOLATIONS,
    MODES,
    Fabric,
    Terminated,
    raise_terminated,
    terminate_on_hangup,
)
from topologies import DEFAULT_SPEC, SpecError, parse_spec

log = logging.getLogger(__name__)

USER_ERRORS = (EmulatorError, SpecError)

DATAPATH_NOTE = {
    True: "openvswitch kernel module present",
    False: "no openvswitch kernel module: userspace netdev datapath",
}

TOPO_HELP = (
    "fabric to build: a spec such as 'leaf-spine:spines=4,leaves=4,hosts=2,rate=20' or "
    "'in-server:servers=2,gpus=8', or a .yaml/.json file (default: %(default)s)"
)
MODE_HELP = (
    "routing: ecmp (per-flow hash incl. UDP ports), spray (UDP source port's low bits pick the path), "
    "single (one path per destination), local / via-tor (in-server: GPU traffic through the local "
    "switch, or up to the ToR and back) (default: %(default)s)"
)


def add_fabric_args(p: argparse.ArgumentParser, default_mode: str = "ecmp", extra_modes: tuple = ()) -> None:
    p.add_argument("--topo", default=DEFAULT_SPEC, metavar="SPEC", help=TOPO_HELP)
    p.add_argument("--mode", default=default_mode, choices=MODES + extra_modes, help=MODE_HELP)
    add_servers_argument(p)


# `probe --mode all`: what each routing mode does to one flow and to a sender rotating its source port.
ALL_MODE_CASES = (
    ("ecmp", "fixed"),
    ("ecmp", "rotate"),
    ("spray", "fixed"),
    ("spray", "rotate"),
    ("single", "rotate"),
)


def register(commands: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    p = commands.add_parser("doctor", help="check this machine: root, Open vSwitch, datapath, netem, nftables, ...",
                            description="Check what the emulator needs and what this machine offers. Exits "
                            "non-zero, with the fix, when something required is missing.")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.set_defaults(func=cmd_doctor)

    p = commands.add_parser("clean", help="remove what fabriclab left behind (and nothing else)",
                            description="Remove what fabriclab runs that are no longer running recorded: node shells, "
                            "per-switch Open vSwitch daemons, controller processes (each by the pid it recorded, "
                            "checked against its command line), work directories, and OVS bridges, interfaces "
                            "and nftables tables of shared-daemon runs. Touches nothing fabriclab did not "
                            "create.")
    p.add_argument("--force", action="store_true", help="also tear down runs whose process is still alive")
    p.set_defaults(func=cmd_clean)

    p = commands.add_parser("up", help="bring a fabric up, print its hosts, tear it down on exit",
                            description="Bring the fabric up with its controller, print hosts and addresses, "
                            "then wait (Ctrl-C to tear down) or open the Mininet CLI with --cli.")
    add_fabric_args(p)
    p.add_argument("--cli", action="store_true", help="open the Mininet CLI; the fabric goes down when you exit it")
    p.add_argument("--hold", type=float, default=None, metavar="S",
                   help="tear down after S seconds instead of waiting for Ctrl-C")
    p.add_argument("--switch-daemons", choices=ISOLATIONS, default=None,
                   help="private: Open vSwitch daemons of the fabric's own, each forwarding for a group of up to "
                   "8 switches in a namespace of its own (the default on the userspace datapath: the least CPU "
                   "per packet, see the README's capacity section); per-switch: each switch runs its own "
                   "Open vSwitch in its own namespace; shared: every switch a bridge of the system's daemon "
                   "(the default on the kernel datapath). "
                   f"Other commands follow {ISOLATION_ENV}")
    p.set_defaults(func=cmd_up)

    p = commands.add_parser("probe", help="send UDP packets src->dst and count how many crossed each spine",
                            description="The path-spread probe: brings the fabric up, sends N UDP packets from "
                            "--src to --dst with a fixed source port or one that rotates per packet, and reads "
                            "from the switches' own counters how many packets crossed each spine. With --mode all, "
                            "one fabric is brought up and the controller is switched live between ecmp, spray "
                            "and single, with fixed and rotating source ports: a table of where packets went.")
    add_fabric_args(p, extra_modes=("all",))
    p.add_argument("--src", default=None, help="sending host (default: the first host)")
    p.add_argument("--dst", default=None, help="receiving host (default: the last host)")
    p.add_argument("--packets", type=int, default=4000, help="packets to send (default: %(default)s)")
    p.add_argument("--entropy", choices=("fixed", "rotate"), default="rotate",
                   help="fixed: one source port (one flow); rotate: a new source port per packet "
                   "(default: %(default)s)")
    p.add_argument("--rate", type=float, default=2000.0, metavar="PPS",
                   help="sending rate in packets/s (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_probe)

    p = bench.add_parser("fabric", help="bring-up/teardown times, OVS forwarding ceiling, reroute time",
                         description="Measure the emulator on this machine: bring-up and teardown times for a "
                         "ladder of leaf-spine fabrics, the Open vSwitch forwarding ceiling, and the "
                         "controller's reroute time after a link cut. Prints one JSON object.")
    p.add_argument("--quick", action="store_true", help="a shorter ladder and flood (about 30 s)")
    p.add_argument("--budget", type=float, default=60.0, metavar="S",
                   help="stop the ladder after the first fabric slower than S seconds to bring up "
                   "(default: %(default)s)")
    p.add_argument("--json", action="store_true", help="JSON only (the output is JSON either way)")
    p.set_defaults(func=cmd_bench_fabric)


def cmd_bench_fabric(args: argparse.Namespace) -> int:
    from emulator.bench import run_fabric_bench

    signal.signal(signal.SIGTERM, raise_terminated)
    terminate_on_hangup()
    try:
        result = run_fabric_bench(quick=args.quick, budget_s=args.budget,
                                  progress=lambda s: print(f"  {s} ...", file=sys.stderr, flush=True))
    except (KeyboardInterrupt, Terminated):
        print("interrupted; fabric torn down", file=sys.stderr)
        return 130
    print(json.dumps(result, indent=1))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from emulator.system import OVS_CTL, capabilities

    c = capabilities()
    checks = [
        # (name, ok, required, detail or fix)
        ("root", c.root, True, "yes" if c.root else "run as root (sudo)"),
        ("mininet", c.mininet is not None, True, c.mininet or "apt-get install mininet; use the venv from make setup"),
        ("openvswitch", c.ovs_version is not None, True, c.ovs_version or "apt-get install openvswitch-switch"),
        ("ovs running", c.ovs_running, True,
         "yes" if c.ovs_running else f"{OVS_CTL} start --system-id=random --no-monitor"),
        ("datapath", True, False, f"{c.datapath} ({DATAPATH_NOTE[c.kernel_datapath]})"),
        ("htb (link rates)", c.htb, True, "yes" if c.htb else "kernel lacks sch_htb"),
        ("netem (delay, loss)", c.netem, False,
         "yes" if c.netem else "no: link delay unavailable; loss falls back to nftables"),
        ("red (ecn marking)", c.red_ecn, False,
         "yes" if c.red_ecn else "no: this kernel has no sch_red (the VM's has: make vm-shell)"),
        ("nftables", c.nftables, False, "yes" if c.nftables else "apt-get install nftables"),
        ("nft egress loss", c.nft_egress, False, "yes" if c.nft_egress else "no netdev egress hook"),
        ("loss method", c.loss_method is not None, False, c.loss_method or "none: random loss unavailable"),
        ("controller", c.controller_framework is not None, True, c.controller_framework or "pip install os-ken"),
        ("iperf3", c.iperf3 is not None, False, c.iperf3 or "apt-get install iperf3 (TCP by hand in the hosts)"),
        ("ethtool", c.ethtool, c.datapath == "user", "yes" if c.ethtool else "apt-get install ethtool"),
    ]
    failed = [name for name, ok, required, _ in checks if required and not ok]
    if args.json:
        print(json.dumps({"ok": not failed, "capabilities": c.to_dict(), "missing": failed}, indent=1))
    else:
        for name, ok, required, detail in checks:
            mark = "ok  " if ok else ("FAIL" if required else "warn")
            print(f"  [{mark}] {name:<20} {detail}")
        print("all required parts are present" if not failed else f"missing: {', '.join(failed)}")
    return 1 if failed else 0


def cmd_clean(args: argparse.Namespace) -> int:
    import os

    from emulator.state import clean

    if os.geteuid() != 0:
        # Without root the run records cannot all be read, nor anything they name removed: saying
        # "nothing to clean" would be wrong.
        raise EmulatorError("clean needs root (it removes namespaces, Open vSwitch bridges and daemons a run "
                            "left); run it with sudo")
    removed, skipped = clean(force=args.force)
    for item in removed:
        print(f"removed {item}")
    for item in skipped:
        print(f"skipped {item} (use --force to tear it down)")
    if not removed and not skipped:
        print("nothing to clean")
    return 0


def _describe(fab: Fabric) -> str:
    lines = [f"fabric {fab.topology.name}: {len(fab.topology.switches)} switches, {len(fab.topology.hosts)} hosts, "
             f"mode {fab.mode}, {fab.datapath} datapath ({fab.isolation} switch daemons), "
             f"up in {fab.timings.bring_up_s:.1f} s",
             f"controller API: {fab.api.base}"]
    for h in fab.topology.hosts:
        sw, port = fab.topology.host_switch(h.name)
        lines.append(f"  {h.name:<8} {h.address:<15} {h.mac}  on {sw} port {port}")
    return "\n".join(lines)


def cmd_up(args: argparse.Namespace) -> int:
    topo = parse_spec(args.topo)
    signal.signal(signal.SIGTERM, raise_terminated)
    # Ctrl-C tears the fabric down even when `up` was started where SIGINT is ignored (a background
    # job of a non-interactive shell inherits it ignored, and Python then leaves it so).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    terminate_on_hangup()
    rc = 0
    try:
        with new_fabric(topo, mode=args.mode, isolation=args.switch_daemons) as fab:
            print(_describe(fab), flush=True)
            if args.cli:
                from cli.mininet_cli import run_cli

                run_cli(fab.net)
            else:
                if args.hold is None:
                    print("fabric is up; press Ctrl-C to tear it down", flush=True)
                rc = _watch(fab, args.hold)
    except (KeyboardInterrupt, Terminated):
        pass
    with contextlib.suppress(OSError):  # after a hangup the terminal is gone
        print("fabric torn down", file=sys.stderr)
    return rc


# Restarts of a dying controller before `up` gives up and tears the fabric down.
MAX_CONTROLLER_RESTARTS = 3


def _watch(fab: Fabric, hold: float | None, poll: float = 0.5) -> int:
    """Hold the fabric up (for `hold` seconds, or until a signal), watching its controller: when it
    dies, say so at once and start it again; after MAX_CONTROLLER_RESTARTS failures in a row, give up."""
    deadline = None if hold is None else time.monotonic() + hold
    failures = 0
    while deadline is None or time.monotonic() < deadline:
        time.sleep(poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic())))
        code = fab.controller_exit()
        if code is None:
            failures = 0
            continue
        print(f"the controller exited (status {code}): the switches keep their rules, but nothing reroutes "
              f"or counts until it is back; restarting it", file=sys.stderr, flush=True)
        try:
            took = fab.restart_controller()
        except EmulatorError as exc:
            failures += 1
            first = str(exc).splitlines()[0]
            if failures >= MAX_CONTROLLER_RESTARTS:
                print(f"fabriclab up: the controller did not come back after {failures} restarts ({first}); "
                      "tearing the fabric down", file=sys.stderr, flush=True)
                return 1
            print(f"restart failed ({first}); trying again", file=sys.stderr, flush=True)
            continue
        print(f"controller back (pid {fab.controller.pid if fab.controller else '?'}): every switch "
              f"reconnected and has its rules again, in {took:.1f} s", file=sys.stderr, flush=True)
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    from emulator.probe import run_probe

    topo = parse_spec(args.topo)
    if args.packets <= 0:
        raise EmulatorError("--packets must be a positive number, e.g. --packets 4000")
    if args.rate <= 0:
        raise EmulatorError("--rate must be a positive number of packets per second")
    hosts = [h.name for h in topo.hosts]
    src = args.src or hosts[0]
    dst = args.dst or hosts[-1]
    cases = ALL_MODE_CASES if args.mode == "all" else ((args.mode, args.entropy),)
    signal.signal(signal.SIGTERM, raise_terminated)
    terminate_on_hangup()
    results = []
    try:
        with Fabric(topo, mode=cases[0][0]) as fab:
            for mode, entropy in cases:
                if fab.mode != mode:
                    fab.set_mode(mode)
                if len(cases) > 1:
                    print(f"  {mode} / {entropy} ...", file=sys.stderr, flush=True)
                results.append(run_probe(fab, src, dst, packets=args.packets, entropy=entropy, rate_pps=args.rate))
    except (KeyboardInterrupt, Terminated):
        print("interrupted; fabric torn down", file=sys.stderr)
        return 130
    if args.json:
        docs = [r.to_dict() for r in results]
        print(json.dumps(docs[0] if len(docs) == 1 else docs, indent=1))
    else:
        print(format_probe_table(results))
    return 0


def format_probe_table(results: list) -> str:
    spines = sorted({s for r in results for s in r.per_spine}, key=lambda s: (len(s), s))
    head = f"{'mode':<8} {'entropy':<7} {'sent':>6} {'recv':>6} " + " ".join(f"{s:>8}" for s in spines)
    head += f" {'max/min':>8}"
    rows = [head, "-" * len(head)]
    for r in results:
        bal = f"{r.balance:.2f}" if r.balance else "-"
        if r.balance and len([v for v in r.per_spine.values() if v > 0]) < len(r.per_spine):
            bal += "*"
        rows.append(f"{r.mode:<8} {r.entropy:<7} {r.packets_sent:>6} {r.packets_received:>6} "
                    + " ".join(f"{r.per_spine.get(s, 0):>8}" for s in spines) + f" {bal:>8}")
    rows.append("(max/min over the spines that carried traffic; * = some spines carried none)")
    return "\n".join(rows)
