"""The experiments' commands: `fabriclab run`, `list`, `report`, `demo` (ecmp-vs-spray on the default
fabric), `bench fidelity`, `bench capacity` and `bench endpoints`."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

from cli.args import (
    add_path_policy_argument,
    add_servers_argument,
    nonneg_int,
    number_arg,
    positive_float,
    positive_int,
    positive_seconds,
)
from emulator.errors import EmulatorError
from emulator.network import raise_terminated, terminate_on_hangup
from experiments.model import Arm, DoesNotFit, Experiment
from experiments.overrides import ArmNotFound
from experiments.policy_arm import PolicyArmError
from experiments.records import ResultsReadError, ResultsWriteError
from experiments.runner import Reporter
from experiments.schema import RawArm
from experiments.sim_arm import SimUnsupported
from experiments.traffic import TrafficError
from topologies import SpecError
from transport.core.congestion import CONTROLLERS

DEMO_EXPERIMENT = "ecmp-vs-spray"


class ExperimentNotFound(LookupError):
    pass


class UsageError(ValueError):
    """Options that do not go together (one line with the fix)."""


USER_ERRORS = (EmulatorError, SpecError, FileNotFoundError, ExperimentNotFound, ArmNotFound, TrafficError,
               PolicyArmError, ResultsWriteError, ResultsReadError, DoesNotFit, UsageError, SimUnsupported)


def register(commands: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    from experiments.catalogue import CATALOGUE

    names = ", ".join(CATALOGUE)
    p = commands.add_parser(
        "run", help="run an experiment: every arm on a fresh fabric, then a comparison table and plots",
        description="Run a named experiment. Every arm (routing mode + transport settings, or iperf3 TCP) "
        "runs on a freshly brought-up fabric with the same seed; results go to "
        "results/NAME/<timestamp>/ (results.json, summary.md, PNG plots). Ctrl-C tears the network "
        f"down and keeps the finished arms. Experiments: {names}.")
    p.add_argument("name", metavar="NAME", help="experiment name (see `fabriclab list`)")
    _common(p)
    p.add_argument("--traffic", type=Path, default=None, metavar="FILE.cm",
                   help="flows from a traffic matrix in htsim's connection-matrix format ('Nodes N', "
                   "'Connections C', then 'SRC->DST start PS size BYTES'; host i = the topology's i-th host) "
                   "instead of the experiment's own; the duration defaults to the matrix's makespan")
    add_path_policy_argument(p, "adds one arm, named after CLASS, that runs it with the settings of the "
                             "experiment's sprayed transport arm (see docs/experiments.md)")
    p.set_defaults(func=cmd_run)

    p = commands.add_parser(
        "validate-engines", help="each experiment's default on the live and the simulated engine, side by side",
        description="Run each experiment's default (its fabric, flows, seed and faults, the arms both engines run) "
        "on the live emulator and on the simulated engine, and print the headline figures side by side: goodput "
        "of ideal, slowdown mean and max, link imbalance, the incast's completion ratio, request completion; and, "
        "for ECMP, whether the same fabric links carried the flows. A difference over 10 %% is marked. Needs root "
        "(the live engine); about 10 minutes for the default set on 2 cores.")
    p.add_argument("--experiments", type=_names, default=None, metavar="NAME,...",
                   help="which experiments (default: those with arms the simulated engine runs)")
    p.add_argument("--duration", type=positive_seconds, default=None, metavar="S",
                   help="seconds of traffic per arm (default: each experiment's own)")
    p.add_argument("--out", type=Path, default=Path("results"), metavar="DIR",
                   help="results root; both engines' runs go under DIR/validate-engines (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.set_defaults(func=cmd_validate_engines)

    p = commands.add_parser("list", help="list the experiments", description="List the experiments with their "
                            "default fabric, duration and arms.")
    p.add_argument("--json", action="store_true", help="as JSON")
    p.set_defaults(func=cmd_list)

    p = commands.add_parser("report", help="re-render a results directory (table, summary.md, plots)",
                            description="Re-render summary.md and the plots of a stored run from its results.json, "
                            "and print its table. A run that never wrote results.json (it crashed or was "
                            "killed) is rebuilt from the records its finished arms left.")
    p.add_argument("dir", metavar="DIR", help="results directory (results/NAME/<timestamp>) or its results.json")
    p.add_argument("--json", action="store_true", help="print results.json to stdout instead of the table")
    p.set_defaults(func=cmd_report)

    p = commands.add_parser(
        "demo", help=f"run `{DEMO_EXPERIMENT}` on its default fabric and print its table and plots",
        description=f"Run the {DEMO_EXPERIMENT} experiment (permutation traffic: one entropy value per flow over "
        "ECMP vs spraying vs TCP) and print the comparison table, the balls-in-bins expectation and the "
        "paths of the plots.")
    _common(p)
    p.set_defaults(func=cmd_demo, name=DEMO_EXPERIMENT)

    p = bench.add_parser(
        "fidelity", help="does the emulator keep up with the demo? CPU idle and CPU per packet, per component",
        description="Run ecmp-vs-spray on the demo's fabric and on a 16-host 4x4x4 permutation (or the "
        "fabrics given with --topo) and print, per arm: the fidelity verdict (CPU idle min and mean over the "
        "traffic window; trusted needs at least 35 % idle), goodput as a share of the ideal and of what the "
        "wire format allows, and CPU seconds per million packets delivered for Open vSwitch, the "
        "endpoints, the controller, the runner and the rest; beside the endpoints', what the transport "
        "core's receive path costs in this process back to back and after sleeping a flow's time between "
        "packets. Takes a few minutes.")
    p.add_argument("--topo", action="append", default=None, metavar="SPEC",
                   help="a fabric to run instead of the defaults (repeatable)")
    p.add_argument("--duration", type=positive_seconds, default=None, metavar="S",
                   help="seconds of traffic per arm (default: the experiment's, 10)")
    p.add_argument("--out", type=Path, default=Path("results"), metavar="DIR",
                   help="results root (default: results)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_bench_fidelity)

    p = bench.add_parser(
        "capacity", help="the highest per-host rate each fabric carries trusted, and CPU per packet",
        description="For the demo's fabric, 4x4x4 leaf-spine at 1500 and 9000 bytes, and fat-tree k=4 and k=8: "
        "what one switch traversal costs Open vSwitch, and, found by bisection over real runs, the highest "
        "per-host link rate at which the sprayed permutation of ecmp-vs-spray stays trusted (CPU idle min >= "
        "35 %), with CPU seconds per million delivered packets per component at that rate. By default two "
        "ways of running the switches are measured side by side: the fabric's own Open vSwitch daemons (the "
        "default) and the system's shared daemon. The full bench takes about an hour; --quick about ten minutes.")
    p.add_argument("--cases", type=_case_names, default=None, metavar="NAME,...",
                   help="fabrics to measure (default: all): " + ", ".join(c.name for c in capacity_cases()))
    p.add_argument("--quick", action="store_true", help="only the demo and 4x4x4-1500, one bisection step")
    p.add_argument("--switch-daemons", choices=("both", "all", "per-switch", "private", "shared"), default="both",
                   help="which way of running the switches to measure: both is shared and private (the "
                   "default way), all adds per-switch (a daemon per switch) (default: %(default)s)")
    p.add_argument("--start", type=positive_float, default=4.0, metavar="MBPS",
                   help="first per-host rate to try (default: %(default)s)")
    p.add_argument("--steps", type=nonneg_int, default=2, metavar="N",
                   help="bisection steps after the verdict flips (default: %(default)s)")
    p.add_argument("--duration", type=positive_seconds, default=6.0, metavar="S",
                   help="seconds of traffic per probe (default: %(default)s)")
    p.add_argument("--out", type=Path, default=Path("results"), metavar="DIR",
                   help="results root; each probe's run lands in DIR/capacity/ (default: results)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_bench_capacity)

    p = bench.add_parser(
        "endpoints", help="CPU per delivered packet of the transport's sender and receiver, on loopback",
        description="Run a sender and a receiver as the fabric runs them (each its own `python -m cli.endpoint "
        "srd ...` process) on 127.0.0.1, with this process between them as the host's shaped link (a token "
        "bucket at --rate with a drop-tail queue and --delay each way), and print, per MTU, each endpoint's "
        "CPU microseconds per delivered packet (DATA to the receiver plus ACKs to the sender, as "
        "`bench fidelity` counts packets delivered to hosts), by the CPU time of its event loop; also that of "
        "the whole processes, start-up included. Then two bare Python loops run over the same link at the "
        "endpoints' pace, sending and answering datagrams of the same sizes as often and doing nothing else: "
        "what this machine charges for the wake-ups and the datagrams alone, to read the endpoints' figure "
        "against. Last, the transport core's receive path runs in this process back to back and after "
        "sleeping the run's gap between packets: where the second is many times the first, the endpoints' "
        "figure is mostly the machine's price of waking. Needs no root and no fabric; about --seconds plus "
        "4-6 per run.")
    p.add_argument("--mtu", type=_mtu_list, default=None, metavar="BYTES,...",
                   help="link MTUs to run (default: 1500,9000); datagrams fill them")
    p.add_argument("--rate", type=positive_float, default=None, metavar="MBPS",
                   help="the shaped link's rate in Mb/s (default: 4, the demo's host links)")
    p.add_argument("--delay", type=_delay, default=None, metavar="S",
                   help="one-way delay of the link in seconds (default: 0.0005)")
    p.add_argument("--seconds", type=positive_seconds, default=8.0, metavar="S",
                   help="seconds of traffic per run (default: %(default)s)")
    p.add_argument("--repeat", type=positive_int, default=1, metavar="N",
                   help="runs per MTU; the table shows the median run (default: %(default)s)")
    p.add_argument("--profile", type=Path, default=None, metavar="DIR",
                   help="run the endpoints under cProfile and write DIR/ROLE-MTU.prof")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_bench_endpoints)

    p = bench.add_parser(
        "sim", help="what the simulated engine costs by fabric size: events/s, µs per packet-hop, memory",
        description="Run a sprayed and an ECMP permutation (every host one flow of --size bytes to a host in "
        "another pod) on fat-trees of each --k, on the simulated engine at the field's settings (100 Gb/s, "
        "4 KiB MTU, 1 µs hops), and print per arm: events, packet-hops, virtual and wall time, events/s, CPU "
        "µs per packet-hop (and its ratio to the smallest fabric's), peak memory and the slowdowns. Needs no "
        "root. k=16 (1,024 hosts) takes minutes; k=32 (8,192 hosts) much longer.")
    p.add_argument("--k", type=_k_list, default=None, metavar="K,...",
                   help="fat-tree sizes (even; hosts = k^3/4; default: 4,8,16)")
    p.add_argument("--size", type=positive_int, default=2_000_000, metavar="BYTES",
                   help="bytes per flow (default: %(default)s)")
    p.add_argument("--rate", type=positive_float, default=100_000, metavar="MBPS",
                   help="every link's rate in Mb/s (default: %(default)s)")
    p.add_argument("--arms", type=_names, default=("spray", "ecmp"), metavar="spray,ecmp",
                   help="which arms (default: both)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_bench_sim)


_delay = number_arg(float, "a number of seconds", 0, 1.0, unit=" seconds")


def _mtu_list(text: str) -> tuple[int, ...]:
    """Comma-separated link MTUs, each 576 to 65535 bytes."""
    parse = number_arg(int, "an MTU in bytes", 576, 65535, unit=" bytes")
    return tuple(parse(part) for part in text.split(","))


def capacity_cases() -> tuple:
    from experiments.capacity_bench import CASES

    return CASES


def _case_names(text: str) -> tuple[str, ...]:
    known = {c.name for c in capacity_cases()}
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown fabric {', '.join(unknown) or '(none given)'}; choose from {', '.join(sorted(known))}")
    return names


def _names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError("give at least one arm name, e.g. spray,ecmp-single")
    return names


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topo", metavar="SPEC", default=None, help="fabric (default: the experiment's own)")
    add_servers_argument(p)
    p.add_argument("--duration", type=positive_seconds, default=None, metavar="S",
                   help="seconds of traffic per arm (fault times scale with it, and so does an all-reduce's "
                   "array)")
    p.add_argument("--seed", type=nonneg_int, default=None, metavar="N", help="seed (default: the experiment's)")
    p.add_argument("--reaction-delay", type=number_arg(float, "a number of seconds", 0, 10), default=None,
                   metavar="S", help="the controller reroutes S seconds after a link's state changes, as a real "
                   "fabric's detection and routing would (0: at once, ~30 ms; failover's default is 1 s)")
    p.add_argument("--repetitions", type=positive_int, default=None, metavar="N", help="run every arm N times")
    p.add_argument("--arms", type=_names, default=None, metavar="NAME,...",
                   help="run only these arms, in the experiment's order (default: all; see `fabriclab list`)")
    p.add_argument("--out", type=Path, default=Path("results"), metavar="DIR",
                   help="results root (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print results.json to stdout")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    from experiments import engines

    p.add_argument("--engine", choices=tuple(engines.ENGINES), default=engines.DEFAULT,
                   help=f"where the arms run (default {engines.DEFAULT}): {engines.help_text()}")
    p.add_argument("--queue-bytes", type=positive_int, default=None, metavar="N",
                   help="sim engine: every switch port's queue in bytes (default: the fabric's queue in "
                   "packets of full-size frames, as the emulator sizes it)")
    p.add_argument("--ecn", type=number_arg(float, "a share of the queue", 0, 1), default=None, metavar="F",
                   help="sim engine: switch ports mark ECN CE from F of their queue (e.g. 0.2; default off)")
    p.add_argument("--cc", type=_ccs, default=None, metavar="NAME[,NAME...]|all",
                   help="congestion control of every transport arm (default: each arm's own); uec-validation "
                   f"takes several, or all, and prints a column each. Controllers: {CONTROLLERS.help()}")


class RichReporter(Reporter):
    """A rich progress bar on stderr: one task for the whole run, advanced per arm and within it."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(stderr=True)
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                                 TimeElapsedColumn(), console=self.console, transient=False)
        self.task: Any = None
        self.index = 0
        self.name = ""

    def run_started(self, exp: Experiment, total_arms: int) -> None:
        self.progress.start()
        self.task = self.progress.add_task(exp.name, total=total_arms)

    def arm_started(self, index: int, arm: Arm, expected_s: float) -> None:
        self.index, self.name = index, arm.name
        self.progress.update(self.task, completed=index, description=f"{arm.name}: bringing the fabric up")

    def arm_progress(self, fraction: float, note: str = "") -> None:
        self.progress.update(self.task, completed=self.index + fraction,
                             description=f"{self.name}: {note or 'traffic'}")

    def arm_finished(self, index: int, arm: Arm, result: RawArm) -> None:
        self.progress.update(self.task, completed=index + 1, description=f"{arm.name}: done")
        if result.get("error"):
            self.console.print(f"[red]{arm.name} failed:[/red] {result['error']}")

    def close(self) -> None:
        self.progress.stop()


def _run(args: argparse.Namespace) -> int:
    from experiments import catalogue, driver, report

    if getattr(args, "engine", "live") == "sim":
        from topologies.validate import simulated_sizes

        simulated_sizes()  # a fabric only simulated may be the field's size
    if args.name == "uec-validation":
        return _run_uec(args)
    if args.name not in catalogue.CATALOGUE:
        raise ExperimentNotFound(f"no experiment '{args.name}'; choose one of {', '.join(catalogue.CATALOGUE)} "
                                 "(see `fabriclab list`)")
    exp, topo = driver.prepare(args.name, args.topo, args.duration, args.seed, args.repetitions,
                               getattr(args, "arms", None))
    if getattr(args, "reaction_delay", None) is not None:
        exp.extra["controller_reaction_s"] = args.reaction_delay
    if getattr(args, "cc", None):
        exp = _with_cc(exp, args.cc)
    if getattr(args, "traffic", None) is not None:
        from experiments import traffic

        matrix = traffic.load(args.traffic, hosts=len(topo.hosts))
        exp = traffic.apply(exp, topo, matrix, keep_duration=args.duration is not None)
    if getattr(args, "path_policy", None):
        from experiments.policy_arm import with_policy_arm

        exp = with_policy_arm(exp, args.path_policy)
    driver.check_fits(exp, topo)
    engine = getattr(args, "engine", "live")
    if engine == "sim":
        exp = _for_sim(exp, args)
    else:
        if getattr(args, "queue_bytes", None) is not None or getattr(args, "ecn", None) is not None:
            raise UsageError("--queue-bytes and --ecn set the simulated fabric's queues; add --engine sim")
        from emulator.system import capabilities, require_ready

        require_ready(capabilities())  # one line with the fix now, not one traceback per arm later
    signal.signal(signal.SIGTERM, raise_terminated)
    terminate_on_hangup()
    reporter = None if args.no_progress else RichReporter()
    try:
        rendered = driver.execute(exp, topo, args.out, reporter, engine=engine)
    finally:
        if isinstance(reporter, RichReporter):
            reporter.close()
    doc = rendered.doc
    if args.json:
        print(json.dumps(doc, indent=1, default=str))
        return 0 if doc["complete"] else 130
    print(f"\n{doc['experiment']} on {topo.name} ({exp.topology}), seed {doc['seed']}:\n")
    print(report.text_table(doc))
    print()
    for s in rendered.sentences:
        print(s)
    for s in report.fidelity_sentences(doc):
        print(s.replace("**", ""))
    print(f"\nresults: {rendered.out_dir / 'results.json'}\nsummary: {rendered.summary}")
    for p in rendered.plots:
        print(f"plot:    {rendered.out_dir / p}")
    if not doc["complete"]:
        print("run interrupted: finished arms kept, marked incomplete", file=sys.stderr)
        return 130
    return 0


def _with_cc(exp: Experiment, ccs: tuple[str, ...]) -> Experiment:
    """Every transport arm with congestion control `ccs[0]` (one name: several are for uec-validation)."""
    from dataclasses import replace

    if len(ccs) != 1:
        raise UsageError(f"--cc {','.join(ccs)}: {exp.name} takes one congestion control; several (or all) are for "
                         "uec-validation")
    return replace(exp, arms=[replace(a, sender=replace(a.sender, cc=ccs[0])) if a.kind == "srd" else a
                              for a in exp.arms])


def _run_uec(args: argparse.Namespace) -> int:
    """`run uec-validation`: the scenarios (or those --arms names) with each --cc, on the simulated engine."""
    from experiments import records
    from experiments import uec_validation as uec
    from transport.core.config import TransportConfig

    if getattr(args, "engine", "live") != "sim":
        raise UsageError("uec-validation runs at 100 Gb/s on fabrics of up to 1,024 hosts: the simulated engine's "
                         "scale, not the emulator's; add --engine sim")
    for option in ("topo", "traffic", "duration", "servers", "repetitions", "path_policy", "queue_bytes", "ecn"):
        if getattr(args, option, None):
            raise UsageError(f"--{option.replace('_', '-')} does not apply to uec-validation: its scenarios fix "
                             "their fabrics, traffic and queues (see `fabriclab list`)")
    names = tuple(args.arms) if getattr(args, "arms", None) else uec.NAMES
    unknown = [n for n in names if n not in uec.NAMES]
    if unknown:
        raise ArmNotFound(f"uec-validation has no scenario {unknown[0]!r}; its scenarios are {', '.join(uec.NAMES)}")
    ccs = tuple(args.cc) if getattr(args, "cc", None) else (TransportConfig.cc,)
    seed = args.seed if args.seed is not None else 1
    terminate_on_hangup()
    progress = None if args.no_progress else (lambda s: print(f"  {s} ...", file=sys.stderr, flush=True))
    doc = uec.run(ccs=ccs, names=names, seed=seed, progress=progress)
    out_dir = records.new_run_dir(args.out, "uec-validation")
    text = uec.text_report(doc)
    records.atomic_write_json(out_dir / records.RESULTS_FILE, doc)
    (out_dir / "summary.md").write_text(f"# uec-validation\n\n```\n{text}\n```\n")
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    print(text)
    print(f"\nresults: {out_dir / records.RESULTS_FILE}\nsummary: {out_dir / 'summary.md'}")
    return 0


def _for_sim(exp: Experiment, args: argparse.Namespace) -> Experiment:
    """The experiment as the simulated engine runs it: its own arms only (those it leaves out are named,
    or an error when the user asked for them), and the simulated queues' settings."""
    from dataclasses import replace

    from experiments import engines

    if getattr(args, "servers", None):
        raise UsageError("--servers splits a live fabric across machines; the simulated engine runs on this one "
                         "(drop --servers or --engine sim)")
    keep, left = engines.runnable_arms(exp, "sim")
    if left and getattr(args, "arms", None):
        from experiments.sim_arm import check_arm

        check_arm(left[0], left[0].workload or exp.workload)  # the user named it: its reason, one line
    if not keep:
        raise UsageError(f"{exp.name} has no arm the simulated engine runs ({', '.join(a.name for a in left)}: "
                         "programs it does not model); run it on the live engine")
    if left:
        print(f"sim engine: leaving out {', '.join(f'{a.name} ({a.kind})' for a in left)}: it runs the "
              "transport's own arms", file=sys.stderr)
    extra = dict(exp.extra)
    if getattr(args, "queue_bytes", None) is not None:
        extra["sim_queue_bytes"] = args.queue_bytes
    if getattr(args, "ecn", None) is not None:
        extra["sim_ecn_fraction"] = args.ecn
    return replace(exp, arms=keep, extra=extra)


def cmd_bench_fidelity(args: argparse.Namespace) -> int:
    from experiments import fidelity_bench

    cases = ([(f"topo{i + 1}", spec) for i, spec in enumerate(args.topo)] if args.topo
             else list(fidelity_bench.DEFAULT_CASES))
    from topologies import parse_spec

    for _, spec in cases:  # every fabric is checked before the first is brought up
        if spec:
            parse_spec(spec)
    signal.signal(signal.SIGTERM, raise_terminated)
    terminate_on_hangup()
    result = fidelity_bench.run_fidelity_bench(
        cases, args.duration, args.out, progress=lambda s: print(f"  {s} ...", file=sys.stderr, flush=True))
    print(json.dumps(result, indent=1) if args.json else fidelity_bench.text_report(result))
    return 0


def cmd_bench_capacity(args: argparse.Namespace) -> int:
    from experiments import capacity_bench

    names = args.cases or (capacity_bench.QUICK if args.quick else tuple(c.name for c in capacity_bench.CASES))
    cases = [c for c in capacity_bench.CASES if c.name in names]
    isolations = {"both": list(capacity_bench.ISOLATIONS), "all": [*capacity_bench.ISOLATIONS, "per-switch"]}.get(
        args.switch_daemons, [args.switch_daemons])
    signal.signal(signal.SIGTERM, raise_terminated)
    terminate_on_hangup()
    result = capacity_bench.run_capacity_bench(
        cases, isolations, args.out, start=args.start, steps=1 if args.quick else args.steps,
        duration=args.duration, progress=lambda s: print(f"  {s}", file=sys.stderr, flush=True))
    print(json.dumps(result, indent=1) if args.json else capacity_bench.text_report(result))
    return 0


def cmd_bench_endpoints(args: argparse.Namespace) -> int:
    from experiments import endpoint_bench as eb

    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    result = eb.run_endpoint_bench(
        mtus=args.mtu or eb.DEFAULT_MTUS, rate_mbps=args.rate or eb.DEFAULT_RATE_MBPS, seconds=args.seconds,
        delay_s=eb.DEFAULT_DELAY_S if args.delay is None else args.delay, repeat=args.repeat, profile=args.profile,
        progress=lambda s: print(f"  {s} ...", file=sys.stderr, flush=True))
    print(json.dumps(result, indent=1) if args.json else eb.text_report(result))
    return 0


def _ccs(text: str) -> tuple[str, ...]:
    names = CONTROLLERS.names() if text == "all" else tuple(x for x in text.split(",") if x)
    unknown = [n for n in names if n not in CONTROLLERS.names()]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: give controllers from {', '.join(CONTROLLERS.names())}, or all")
    return names


def _k_list(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give even numbers, e.g. 4,8,16") from None
    if not ks or any(k < 2 or k % 2 for k in ks):
        raise argparse.ArgumentTypeError(f"{text!r}: every k must be even and at least 2, e.g. 4,8,16")
    return ks


def cmd_bench_sim(args: argparse.Namespace) -> int:
    from experiments import sim_bench
    from topologies.validate import simulated_sizes

    simulated_sizes()
    unknown = [a for a in args.arms if a not in ("spray", "ecmp")]
    if unknown:
        raise UsageError(f"unknown arm {unknown[0]!r}; give spray, ecmp or both")
    result = sim_bench.run(ks=args.k or sim_bench.DEFAULT_KS, size=args.size, rate_mbps=args.rate,
                           modes=tuple(args.arms), progress=lambda s: print(f"  {s} ...", file=sys.stderr, flush=True))
    print(json.dumps(result, indent=1) if args.json else sim_bench.text_report(result))
    return 0


def cmd_validate_engines(args: argparse.Namespace) -> int:
    from experiments import catalogue
    from experiments import validate_engines as ve

    names = tuple(args.experiments) if args.experiments else ve.DEFAULT_NAMES
    unknown = [n for n in names if n not in catalogue.CATALOGUE]
    if unknown:
        raise ExperimentNotFound(f"no experiment '{unknown[0]}'; choose from {', '.join(catalogue.CATALOGUE)}")
    from emulator.system import capabilities, require_ready

    require_ready(capabilities())  # the live engine's half needs root and Open vSwitch
    signal.signal(signal.SIGTERM, raise_terminated)
    terminate_on_hangup()
    doc = ve.run(names, args.duration, args.out, progress=lambda s: print(f"  {s} ...", file=sys.stderr, flush=True))
    print(json.dumps(doc, indent=1) if args.json else ve.text_report(doc))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    return _run(args)


def cmd_demo(args: argparse.Namespace) -> int:
    return _run(args)


def cmd_list(args: argparse.Namespace) -> int:
    from experiments import catalogue

    rows = []
    for name, entry in catalogue.CATALOGUE.items():
        exp = entry.build()
        rows.append({"name": name, "summary": entry.summary, "topology": exp.topology,
                     "duration_s": exp.duration_s, "arms": [a.name for a in exp.arms]})
    from experiments import uec_validation as uec

    rows.append({"name": "uec-validation", "summary": "the Ultra Ethernet simulator's validation scenarios, tail FCT "
                 "against its targets (--engine sim only)", "topology": "per scenario (fat-tree k=4 and k=16, "
                 "oversubscribed leaf-spines)", "duration_s": None, "arms": list(uec.NAMES)})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        print(f"{r['name']:<14} {r['summary']}")
        per_arm = f", {r['duration_s']:g} s per arm" if r["duration_s"] else ""
        print(f"{'':<14} fabric {r['topology']}{per_arm}; arms: {', '.join(r['arms'])}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from experiments import driver, report

    rendered = driver.rerender(Path(args.dir))
    if args.json:
        print(json.dumps(rendered.doc, indent=1, default=str))
        return 0
    print(report.text_table(rendered.doc))
    print()
    for s in rendered.sentences:
        print(s)
    for s in report.fidelity_sentences(rendered.doc):
        print(s.replace("**", ""))
    print(f"\nsummary: {rendered.summary}")
    for p in rendered.plots:
        print(f"plot:    {rendered.out_dir / p}")
    return 0
