"""`fabriclab train-node`: one node of a training job over the transport (transport/io/training.py).

Every rank and storage host of the job runs as its own process, started on its host as
`python -m cli.endpoint train-node ...` by the experiment runner (experiments/arms/training.py). Exit
status: 0 done, 1 a collective differed from the reference, 2 bad input or a timeout, 143 stopped by
SIGTERM/SIGINT; once the options are valid the JSON is written in every case.
"""

from __future__ import annotations

import argparse
import sys

from cli.args import (
    add_path_policy_argument,
    count_arg,
    destination_arg,
    nonneg_float,
    nonneg_int,
    port_arg,
    positive_int,
    positive_seconds,
)
from cli.worker_run import run_to_end
from transport.core.config import RECOVERY_MODES, TransportConfig
from transport.core.paths import POLICIES
from transport.io.endpoint import EndpointError
from transport.io.training import (
    DEFAULT_PORT,
    DEFAULT_TIMEOUT,
    EXIT_OK,
    EXIT_USAGE,
    NodeOptions,
    TrainingNodeError,
    UdpTrainingNode,
)
from transport.training.collective import COLLECTIVES, CollectiveSpec
from transport.training.spec import CHECKPOINT_MODES, JobSpec, RankHosts

_ADDRESS = destination_arg(DEFAULT_PORT)


def parse_nodes(text: str) -> dict[str, tuple[str, int]]:
    """NAME=IP[:PORT],NAME=IP[:PORT],... -> {name: (ip, port)}."""
    out: dict[str, tuple[str, int]] = {}
    for item in text.split(","):
        name, sep, addr = item.strip().partition("=")
        if not sep or not name or not addr:
            raise argparse.ArgumentTypeError(f"{item!r} is not NAME=IP[:PORT]; use e.g. rank0=10.0.0.1,near0=10.0.0.3")
        if name in out:
            raise argparse.ArgumentTypeError(f"node {name} is named twice")
        out[name] = _ADDRESS(addr)
    return out


def add_job_arguments(p: argparse.ArgumentParser) -> None:
    """The job's settings, the same for every node (experiments/arms/training.py passes them on)."""
    d = JobSpec()
    p.add_argument("--steps", type=positive_int, default=d.steps)
    p.add_argument("--compute-s", type=nonneg_float, default=d.compute_s, help="modelled GPU seconds per step")
    p.add_argument("--collective", choices=tuple(COLLECTIVES), default=d.collective.name)
    p.add_argument("--collective-bytes", type=count_arg, default=d.collective.nbytes,
                   help="bytes per rank of each step's collective (suffix K/M allowed)")
    p.add_argument("--data-bytes", type=count_arg, default=d.data_bytes, help="input bytes per rank per step")
    p.add_argument("--prefetch", action=argparse.BooleanOptionalAction, default=d.prefetch,
                   help="read the next step's input while this step computes")
    p.add_argument("--checkpoint-every", type=nonneg_int, default=d.checkpoint_every, help="steps; 0 = never")
    p.add_argument("--checkpoint-bytes", type=count_arg, default=d.checkpoint_bytes, help="bytes per rank")
    p.add_argument("--checkpoint-mode", choices=CHECKPOINT_MODES, default=d.checkpoint_mode)
    p.add_argument("--collective-timeout", type=positive_seconds, default=d.collective_timeout_s,
                   help="seconds a collective may take before the step fails and the job rolls back")


def job_spec(args: argparse.Namespace) -> JobSpec:
    return JobSpec(steps=args.steps, compute_s=args.compute_s,
                   collective=CollectiveSpec(name=args.collective, nbytes=args.collective_bytes, seed=args.seed),
                   data_bytes=args.data_bytes, prefetch=args.prefetch, checkpoint_every=args.checkpoint_every,
                   checkpoint_bytes=args.checkpoint_bytes, checkpoint_mode=args.checkpoint_mode,
                   collective_timeout_s=args.collective_timeout)


def register(commands: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "train-node", help="one rank or storage host of a training job over the transport",
        description="One node of a training job over the fabriclab transport: a rank (named rankN) that "
        "steps through data ingest, compute, a collective checked bit for bit and checkpoints, or a storage "
        "host that takes checkpoints, serves input data and (the --coordinator) restarts the job from its "
        "last checkpoint when a collective times out. Start one per node, each with the same --nodes. Exit "
        "status: 0 done, 1 a collective differed from the reference, 2 bad input or a timeout, 143 stopped.")
    p.add_argument("--name", required=True, help="this node's name in --nodes")
    p.add_argument("--nodes", type=parse_nodes, required=True,
                   help=f"NAME=IP[:PORT] of every node (ranks rank0..rankN-1; default port {DEFAULT_PORT})")
    p.add_argument("--data-host", default="near0", help="the storage host a rank reads its input from")
    p.add_argument("--checkpoint-host", default="near0", help="the storage host a rank checkpoints to")
    p.add_argument("--coordinator", default="near0", help="the storage host that runs the job's coordinator")
    add_job_arguments(p)
    p.add_argument("--policy", choices=POLICIES.names(), default=TransportConfig.path_policy,
                   help=f"path (EV) policy: {POLICIES.help()}")
    add_path_policy_argument(p)
    p.add_argument("--recovery", choices=RECOVERY_MODES, default="selective")
    p.add_argument("--evs", type=positive_int, default=16, help="entropy values = source ports per node")
    p.add_argument("--base-port", type=port_arg, default=40000, help="source port of EV 0")
    p.add_argument("--mtu", type=int, default=TransportConfig.mtu, help="UDP payload bytes per datagram")
    p.add_argument("--seed", type=nonneg_int, default=0)
    p.add_argument("--timeout", type=positive_seconds, default=DEFAULT_TIMEOUT,
                   help="seconds without hearing anything before giving up")
    p.add_argument("--json-out", default=None, metavar="FILE", help="write the results as JSON (also on SIGTERM)")
    p.set_defaults(func=_cmd_train_node)
    b = bench.add_parser(
        "training", help="the training experiment's arms on the simulated fabric (virtual clock, no root)",
        description="Run every arm of `fabriclab run training` on the simulated leaf-spine (the same job, "
        "rates, storage and faults, on a virtual clock: no CPU limit, no root) and print each arm's step "
        "times, compute share, checkpoint stall, steps lost and goodput, and the summary's sentences, as JSON.")
    b.add_argument("--seed", type=nonneg_int, default=None, help="the simulation's seed (default: the experiment's)")
    b.add_argument("--arms", default=None, help="comma-separated arm names (default: all)")
    b.set_defaults(func=_cmd_bench_training)


def node_options(args: argparse.Namespace) -> NodeOptions:
    config = TransportConfig(path_policy=args.path_policy or args.policy, recovery=args.recovery, num_evs=args.evs,
                             mtu=args.mtu)
    return NodeOptions(
        name=args.name, nodes=args.nodes, spec=job_spec(args),
        hosts=RankHosts(data=args.data_host, checkpoint=args.checkpoint_host, coordinator=args.coordinator),
        coordinator=args.coordinator, config=config, base_port=args.base_port, seed=args.seed,
        timeout=args.timeout,
    )


def _cmd_bench_training(args: argparse.Namespace) -> int:
    import json

    from experiments.scenarios import training  # the experiments only here: train-node stays light

    arms = tuple(a.strip() for a in args.arms.split(",")) if args.arms else training.ARMS
    if unknown := [a for a in arms if a not in training.ARMS]:
        print(f"{args.prog}: error: unknown arm {unknown[0]}; use some of {', '.join(training.ARMS)}", file=sys.stderr)
        return EXIT_USAGE
    doc = training.simulate(args.seed, arms)
    doc["arms"] = [{"name": a} for a in doc["analysis"]["training"]]
    out = {name: {k: v for k, v in s.items() if k != "timeline"} for name, s in doc["analysis"]["training"].items()}
    print(json.dumps({"arms": out, "sentences": training.sentences(doc)}, indent=2))
    return EXIT_OK


def _cmd_train_node(args: argparse.Namespace) -> int:
    try:
        node = UdpTrainingNode(node_options(args))
        node.open()
    except (TrainingNodeError, EndpointError) as exc:
        print(f"{args.prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    # A storage host may run until it is stopped: the signal is then its normal end, not an error.
    code, _ = run_to_end(node, args, (TrainingNodeError, EndpointError),
                         lambda: node.rank is not None and bool(node.rank.mismatches),
                         note_signal=node.rank is not None)
    if not node.error and node.rank is not None:
        r = node.rank
        print(f"{node.name}: {r.completed_step} steps, {len(r.rollbacks)} rollbacks, "
              f"{'correct' if not r.mismatches else f'{r.mismatches} MISMATCHES'}")
    return code
