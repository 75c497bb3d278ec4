"""`fabriclab live` (the dashboard or, with --tui, the terminal view) and `fabriclab bench live`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from cli.args import (
    add_path_policy_argument,
    add_servers_argument,
    nonneg_int,
    number_arg,
    port_or_any,
    positive_seconds,
)
from emulator.errors import EmulatorError
from live.controls import MODES, POLICIES
from live.workload import WORKLOADS
from topologies import SpecError

log = logging.getLogger(__name__)

# Two leaves' worth of collisions to see: two hosts per leaf hashed over two uplinks collide half the
# time, and 8 flows at 10 Mb/s stay far below what userspace Open vSwitch forwards on two cores.
# 4 Mb/s per host: with every flow sprayed the fabric carries ~32 Mb/s, which two cores emulate with CPU to
# spare (`fabriclab bench fidelity`); at 10 Mb/s ECMP alone left under 40 % idle.
DEFAULT_LIVE_SPEC = "leaf-spine:spines=2,leaves=4,hosts=2,rate=4"


class LiveError(Exception):
    """Bad input or environment for the live view; shown as one line."""


USER_ERRORS = (LiveError, EmulatorError, SpecError)


_interval = number_arg(float, "a number of seconds", 0.1, 1.0, unit=" s",
                       why="the page must update at least once a second")


def register(commands: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "live", help="watch a running fabric in the browser (or --tui) and switch ECMP <-> spraying live",
        description="Bring a fabric up (routing --mode, ecmp by default), start continuous traffic in its hosts "
        "and serve a dashboard: the fabric drawn tier by tier with every link coloured by its utilisation, "
        "goodput, link imbalance and hot links over time with events marked, which uplinks the flows' hashes "
        "landed on (inferred from link counters), and controls to switch the routing mode (ecmp, spray, "
        f"single) and the transport's path policy ({', '.join(POLICIES)}: restarts the senders), cut and "
        "restore a link by clicking it, and set random loss on it. With --tui the same numbers and switches "
        "are in the terminal (for ssh-only use). Ctrl-C stops the traffic and tears the fabric down. "
        "Needs root, like `fabriclab up`; --engine sim runs the view on the simulated engine without root (the "
        "same transport and forwarding, paced to the clock), --fake on synthetic counters.",
        epilog="workloads: permutation = every host sends one long flow to a host on another leaf "
        "(`fabriclab srd send/recv`, one base port per sender); allreduce = the transport's ring all-reduce "
        "on every host, ranks alternating between leaves, many iterations. "
        "The server binds 127.0.0.1 unless --host says otherwise; it accepts controls only from its own page.")
    p.add_argument("--topo", default=DEFAULT_LIVE_SPEC, metavar="SPEC",
                   help="fabric: a spec such as 'leaf-spine:spines=4,leaves=4,hosts=2,rate=20' or a .yaml/.json "
                   "file (default: %(default)s)")
    p.add_argument("--workload", default="permutation", choices=WORKLOADS, help="traffic (default: %(default)s)")
    from transport.core.congestion import CONTROLLERS

    p.add_argument("--cc", default=None, choices=CONTROLLERS.names(),
                   help=f"the transport's congestion control, senders and receivers alike ({CONTROLLERS.help()}; "
                   "default: the transport's own)")
    add_servers_argument(p)
    p.add_argument("--mode", default="ecmp", choices=MODES, help="routing mode to start in (default: %(default)s)")
    p.add_argument("--policy", default="single", choices=POLICIES,
                   help="the transport's path policy to start with; single = one entropy value per flow, what "
                   "ECMP hashes (default: %(default)s)")
    add_path_policy_argument(p, "the senders start with it, and the policy control (page or --tui) offers it "
                             "beside single, spray and adaptive")
    p.add_argument("--port", type=port_or_any, default=8080,
                   help="HTTP port (default: %(default)s; 0 = any free port)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to serve on (default: %(default)s, this machine only; 0.0.0.0 exposes the "
                   "controls to the network)")
    p.add_argument("--tui", action="store_true",
                   help="terminal view instead of the web page: keys e/s/1 routing mode, p path policy, "
                   "c/r N cut/restore link N, l N P loss P %% on link N, q quit")
    p.add_argument("--fake", action="store_true",
                   help="no fabric: synthetic counters from the topology (no root needed; for trying the view)")
    p.add_argument("--engine", choices=("live", "sim"), default="live",
                   help="live: a fabric brought up in namespaces (root); sim: the simulated engine paced to the "
                   "clock, with the transport's own connections and the controller's rules (no root; the "
                   "permutation workload) (default: %(default)s)")
    p.add_argument("--seed", type=nonneg_int, default=1, metavar="N",
                   help="seed of the flow placement (default: %(default)s)")
    p.add_argument("--duration", type=positive_seconds, default=None, metavar="S",
                   help="stop after S seconds and tear the fabric down (default: run until Ctrl-C); for labs "
                   "and scripted demonstrations")
    p.add_argument("--interval", type=_interval, default=0.5, metavar="S",
                   help="seconds between counter reads and page updates (default: %(default)s)")
    p.set_defaults(func=cmd_live)

    b = bench.add_parser(
        "live", help="the live view: update rate, counter-to-page latency, its CPU use",
        description="Run `fabriclab live` as a child process, follow its event stream like a page does, and "
        "measure the update rate, the age of the numbers on arrival (server read -> client), the time "
        "from cutting a link until the stream shows it carrying nothing, and the CPU seconds the "
        "live-view process uses per second. Prints JSON. With --fake no fabric is brought up.")
    b.add_argument("--topo", default=DEFAULT_LIVE_SPEC, metavar="SPEC", help="fabric (default: %(default)s)")
    b.add_argument("--fake", action="store_true", help="synthetic counters instead of a real fabric")
    b.add_argument("--seconds", type=float, default=20.0, metavar="S",
                   help="how long to follow the stream (default: %(default)s)")
    b.add_argument("--json", action="store_true", help="JSON only (the output is JSON either way)")
    b.set_defaults(func=cmd_bench_live)


def build_backend(args: argparse.Namespace):
    from topologies import parse_spec

    topo = parse_spec(args.topo)
    if len(topo.hosts) < 2:
        raise LiveError(f"{args.topo} has {len(topo.hosts)} host(s); the workload needs at least two")
    policy = args.path_policy or args.policy
    if getattr(args, "engine", "live") == "sim":
        if args.fake or getattr(args, "servers", None):
            raise LiveError("--engine sim runs the simulated fabric on this machine: drop --fake and --servers")
        if args.workload != "permutation":
            raise LiveError(f"--engine sim runs the permutation workload, not {args.workload}; drop --workload or "
                            "use the live engine")
        from live.simulated import SimBackend

        return SimBackend(topo, mode=args.mode, policy=policy, workload=args.workload, seed=args.seed, cc=args.cc)
    if args.fake:
        from live.backend import FakeBackend

        return FakeBackend(topo, mode=args.mode, policy=policy, workload=args.workload, seed=args.seed)
    from emulator.system import capabilities, require_ready
    from live.backend import FabricBackend

    require_ready(capabilities())  # root, Open vSwitch, ...: one line with the fix, before serving anything
    return FabricBackend(topo, mode=args.mode, policy=policy, workload=args.workload, seed=args.seed, cc=args.cc,
                         poll_interval=args.interval)


def cmd_live(args: argparse.Namespace) -> int:
    from live.session import LiveSession

    backend = build_backend(args)
    session = LiveSession(backend, interval=args.interval)
    if args.tui:
        from live.tui import run_tui

        return asyncio.run(_with_signals(lambda stop: run_tui(session, stop), args.duration))
    from live.server import is_loopback, serve

    def announce(url: str) -> None:
        until = f"for {args.duration:g} s; " if args.duration else ""
        print(f"live view on {url}  ({until}Ctrl-C to stop and tear the fabric down)", flush=True)
        if not is_loopback(args.host):
            print(f"warning: serving on {args.host}: anyone who can reach it can drive the fabric", file=sys.stderr)

    try:
        return asyncio.run(_with_signals(lambda stop: serve(session, args.host, args.port, stop, announce),
                                         args.duration))
    except OSError as exc:
        raise LiveError(f"{exc}; pick another --port or --host") from None


async def _with_signals(main, duration: float | None = None) -> int:
    """Run main(stop) with SIGINT/SIGTERM/SIGHUP (or `duration` running out) setting `stop`: teardown then
    runs in order, never twice."""
    from emulator.network import detach_from_terminal, hangup_ignored

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    hits = 0
    timer = loop.call_later(duration, stop.set) if duration else None

    def on_signal(sig: int) -> None:
        nonlocal hits
        if sig == signal.SIGHUP:  # the terminal is gone: the last frame and teardown's lines go nowhere
            detach_from_terminal()
        hits += 1
        if hits > 1:
            print("still tearing the fabric down; please wait", file=sys.stderr, flush=True)
        stop.set()

    # SIGHUP too: the terminal went away (an ssh session that dropped); under nohup it stays ignored.
    signals = [signal.SIGINT, signal.SIGTERM]
    if not hangup_ignored():
        signals.append(signal.SIGHUP)
    for sig in signals:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        result = await main(stop)
    finally:
        if timer:
            timer.cancel()
        for sig in signals:
            loop.remove_signal_handler(sig)
    return int(result or 0)


def cmd_bench_live(args: argparse.Namespace) -> int:
    import json

    from live.bench import run_live_bench

    if args.seconds <= 0:
        raise LiveError("--seconds must be positive")
    result = run_live_bench(args.topo, fake=args.fake, seconds=args.seconds)
    print(json.dumps(result, indent=1))
    return 0
