"""`fabriclab allreduce`: one rank of a ring all-reduce over the transport (transport/io/allreduce.py), or
with ``--collective`` of a reduce-scatter, all-gather, all-to-all or hierarchical all-reduce
(transport/io/collective.py), reported as nccl-tests does.

Every rank runs as its own process, started on its host as `python -m cli.endpoint allreduce ...` by the
experiment runner and the live view. Exit status: 0 correct, 1 mismatch, 2 bad input, a timeout or
a peer's piece that cannot be right (wrong size, not whole float32 elements, or other values under the
identity of one already received), 143 stopped by SIGTERM/SIGINT; once the options are valid the JSON is
written in every case.
"""

from __future__ import annotations

import argparse
import json
import sys

from cli.args import (
    add_path_policy_argument,
    count_arg,
    nonneg_float,
    nonneg_int,
    parse_peers,
    positive_float,
    positive_int,
)
from cli.worker_run import run_to_end
from transport.collective.report import Row, format_rows
from transport.collective.ring import DEFAULT_PIECE_BYTES, DTYPE
from transport.core.config import DELIVERY_MODES, RECOVERY_MODES, TransportConfig
from transport.core.congestion import CONTROLLERS
from transport.core.paths import POLICIES
from transport.io.allreduce import (
    BASE_PORT_STRIDE,
    DEFAULT_BASE_PORT,
    DEFAULT_TIMEOUT,
    EXIT_MISMATCH,
    EXIT_OK,
    EXIT_USAGE,
    AllReduceError,
    UdpRingWorker,
    WorkerOptions,
)
from transport.io.collective import UdpCollectiveWorker
from transport.io.endpoint import EndpointError

COLLECTIVE_CHOICES = ("ring", "reduce-scatter", "all-gather", "all-to-all", "hierarchical")
# `allreduce --collective` also takes the plan's all-reduce (reduce-scatter + all-gather, checked bit for
# bit like the others), for a flat ring run and reported the same way as the others.
WORKER_CHOICES = ("ring", "all-reduce", *COLLECTIVE_CHOICES[1:])


def register(commands: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "allreduce", help="one rank of a ring all-reduce of float32 arrays over the transport",
        description="One rank of a ring all-reduce over the fabriclab transport. Start one per rank, each "
        "with the same --peers: rank r listens on the port of peers[r] for its left neighbour's data and "
        "sends to peers[r+1]. Every iteration's result is checked bit for bit against the sum in the "
        "ring's own order of additions. Exit status: 0 correct, 1 mismatch, 2 bad input, a timeout "
        "or a peer's malformed or conflicting piece (named on stderr), 143 stopped by SIGTERM/SIGINT (the "
        "JSON is written in every case once the options are valid).")
    p.add_argument("--rank", type=int, required=True, help="this worker's index in --peers")
    p.add_argument("--collective", choices=WORKER_CHOICES, default="ring",
                   help="ring (the default): the ring all-reduce, checked in the ring's order of additions; the "
                   "others run over a connection to every peer they talk to, are checked bit for bit against "
                   "numpy (integer-valued inputs) and print nccl-tests' table (size, count, type, time, algbw, "
                   "busbw) with the bound")
    p.add_argument("--group", type=int, default=1,
                   help="hierarchical: ranks per group (a server's GPUs, consecutive in --peers)")
    p.add_argument("--peers", type=parse_peers, required=True,
                   help="IP:PORT of every rank in ring order; rank r listens on its own port")
    p.add_argument("--size", type=count_arg, required=True, help="float32 elements (suffix K/M/G allowed)")
    p.add_argument("--iterations", type=int, default=1)
    p.add_argument("--policy", choices=POLICIES.names(), default=TransportConfig.path_policy,
                   help=f"path (EV) policy: {POLICIES.help()}")
    add_path_policy_argument(p)
    p.add_argument("--evs", type=int, default=16, help="entropy values = source ports per rank")
    p.add_argument("--base-port", type=int, default=None,
                   help=f"first source port (EV 0); default {DEFAULT_BASE_PORT} + {BASE_PORT_STRIDE} * rank")
    p.add_argument("--recovery", choices=RECOVERY_MODES, default="selective")
    p.add_argument("--delivery", choices=DELIVERY_MODES, default="unordered")
    p.add_argument("--cc", choices=CONTROLLERS.names(), default=TransportConfig.cc,
                   help=f"congestion control: {CONTROLLERS.help()}")
    p.add_argument("--window", type=int, default=TransportConfig.window,
                   help="packets: the fixed window, or the initial window of --cc delay")
    p.add_argument("--rto-min", type=float, default=TransportConfig.rto_min, help="seconds: floor of the RTO")
    p.add_argument("--ack-delay", type=float, default=TransportConfig.ack_delay,
                   help="seconds an ACK may be held to coalesce it with others (0 = ACK every packet)")
    p.add_argument("--mtu", type=int, default=TransportConfig.mtu, help="UDP payload bytes per datagram")
    p.add_argument("--piece-bytes", type=count_arg, default=DEFAULT_PIECE_BYTES,
                   help="bytes of a chunk per transport message (pieces pipeline round the ring)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="inputs are drawn from (seed, rank)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds without progress before giving up")
    p.add_argument("--start-at", type=float, default=None, help="UNIX time to start iteration 1 (after the barrier)")
    p.add_argument("--link-rate-mbps", type=float, default=None,
                   help="link rate for the bandwidth bound (hierarchical: the fabric's)")
    p.add_argument("--local-rate-mbps", type=float, default=None,
                   help="hierarchical: the group's local link rate for its bound (default --link-rate-mbps)")
    p.add_argument("--bind", default=None, help="local address to bind (default: all)")
    p.add_argument("--json-out", default=None, metavar="FILE", help="write the results as JSON (also on SIGTERM)")
    # Also after the command, as the worker always took it; it adds to fabriclab's own -v.
    p.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help="log progress")
    p.set_defaults(func=_cmd_allreduce)

    b = bench.add_parser(
        "collectives", help="every collective in the simulated network: bit for bit against numpy, busbw "
        "and time against the bound, by size (like nccl-tests)",
        description="Runs a collective over the in-memory simulated fabric (a non-blocking switch with a port "
        "per rank; with --group, a local switch per group too) for each size, checks every rank's result bit "
        "for bit against numpy and prints nccl-tests' table, or JSON with --json. Exit status 1 on a mismatch.")
    b.add_argument("--collective", choices=(*COLLECTIVE_CHOICES, "all"), default="all")
    b.add_argument("--ranks", type=positive_int, default=4)
    b.add_argument("--group", type=positive_int, default=None,
                   help="hierarchical: ranks per group (default: 2 when the ranks split so, else 1)")
    b.add_argument("--sizes", type=_byte_sizes, default=_byte_sizes("256K,1M,4M"),
                   help="bytes per rank's buffer, comma-separated (suffix K/M allowed)")
    b.add_argument("--rate-mbps", type=positive_float, default=1000.0, help="every rank's fabric port")
    b.add_argument("--local-rate-mbps", type=positive_float, default=4000.0,
                   help="hierarchical: every rank's port on its group's switch")
    b.add_argument("--loss", type=nonneg_float, default=0.0, help="random loss on every uplink (0..1)")
    b.add_argument("--iterations", type=positive_int, default=1)
    b.add_argument("--piece-bytes", type=count_arg, default=DEFAULT_PIECE_BYTES)
    b.add_argument("--seed", type=nonneg_int, default=0)
    b.add_argument("--json", action="store_true", help="print the rows as JSON")
    b.set_defaults(func=_cmd_bench_collectives)


def _options(args: argparse.Namespace) -> WorkerOptions:
    config = TransportConfig(
        path_policy=args.path_policy or args.policy,
        num_evs=args.evs, recovery=args.recovery, delivery=args.delivery, mtu=args.mtu,
        cc=args.cc, window=args.window, ack_delay=args.ack_delay, rto_min=args.rto_min,
        rto_max=max(TransportConfig.rto_max, args.rto_min),
    )
    return WorkerOptions(
        rank=args.rank, peers=args.peers, size=args.size, iterations=args.iterations, config=config,
        base_port=args.base_port, seed=args.seed, timeout=args.timeout, start_at=args.start_at,
        link_rate_mbps=args.link_rate_mbps, piece_bytes=args.piece_bytes, bind=args.bind,
        collective=args.collective, group=args.group, local_rate_mbps=args.local_rate_mbps,
    )


def _cmd_allreduce(args: argparse.Namespace) -> int:
    try:
        opts = _options(args)
        worker: UdpRingWorker | UdpCollectiveWorker = (
            UdpRingWorker(opts) if opts.collective == "ring" else UdpCollectiveWorker(opts))
        worker.open()
    except (AllReduceError, EndpointError) as exc:
        print(f"{args.prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    code, results = run_to_end(worker, args, (AllReduceError, EndpointError), lambda: not worker.correct)
    if worker.error:  # already said on stderr
        return code
    if isinstance(worker, UdpCollectiveWorker):
        print(collective_report(worker.rank, worker.row(), results))
    else:
        bound = results["bound_s"]
        extra = f", bound {bound:.4f} s (x{results['ratio_to_bound']:.2f})" if bound else ""
        verdict = "correct" if results["correct"] else f"MISMATCH {results['mismatch']}"
        print(f"rank {worker.rank}: {len(worker.iteration_times)} iterations of {results['bytes']} bytes, "
              f"mean {results['mean_s']:.4f} s{extra}; {verdict}")
    return code


def collective_report(rank: int, row: Row, results: dict) -> str:
    """nccl-tests' table for one rank's collective, then one line: what ran and whether it was right."""
    verdict = ("correct" if results["correct"] else
               f"MISMATCH {results['mismatch']}" if results["mismatch"] else "not finished")
    group = f" in groups of {results['group']}" if row.collective == "hierarchical" else ""
    return (f"{format_rows([row])}\nrank {rank}: {results['iterations_done']} iterations of {row.collective} of "
            f"{row.size} bytes over {row.n_ranks} ranks{group}; {verdict}")


def _byte_sizes(text: str) -> list[int]:
    sizes = [count_arg(part) for part in text.split(",") if part.strip()]
    if not sizes or any(n < DTYPE.itemsize for n in sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: give sizes of at least {DTYPE.itemsize} bytes, e.g. 64K,1M")
    return sizes


def _cmd_bench_collectives(args: argparse.Namespace) -> int:
    from transport.collective.plan import canonical
    from transport.sim.collsim import collective_simulated
    from transport.sim.fabric import SwitchSpec
    from transport.sim.simnet import PathSpec

    names = list(COLLECTIVE_CHOICES) if args.collective == "all" else [args.collective]
    p = args.ranks
    group = args.group or (2 if p % 2 == 0 and p > 2 else 1)
    if "hierarchical" in names and p % group:
        print(f"{args.prog}: error: --group {group}: the {p} ranks do not split into groups of {group}",
              file=sys.stderr)
        return EXIT_USAGE
    if not 0 <= args.loss < 1:
        print(f"{args.prog}: error: --loss {args.loss}: use 0 <= loss < 1", file=sys.stderr)
        return EXIT_USAGE
    rows, records, bad = [], [], 0
    for name in names:
        hier = name == "hierarchical"
        fabric = SwitchSpec(PathSpec(rate_bps=args.rate_mbps * 1e6, loss=args.loss),
                            PathSpec(rate_bps=args.local_rate_mbps * 1e6, loss=args.loss) if hier else None,
                            group if hier else 1)
        for nbytes in args.sizes:
            res = collective_simulated(canonical(name), p, -(-nbytes // DTYPE.itemsize), args.seed,
                                       group=group if hier else 1, fabric=fabric, iterations=args.iterations,
                                       piece_bytes=args.piece_bytes)
            bad += not res.correct
            rows.append(res.row)
            records.append({**res.row.to_dict(), "correct": res.correct, "mismatch": res.mismatch,
                            "group": group if hier else 1, "retransmissions": res.retransmissions})
    if args.json:
        print(json.dumps({"ranks": p, "rate_mbps": args.rate_mbps, "local_rate_mbps": args.local_rate_mbps,
                          "loss": args.loss, "rows": records}, indent=2))
    else:
        print(f"# {p} ranks, simulated: fabric ports {args.rate_mbps:g} Mb/s"
              + (f", groups of {group} on {args.local_rate_mbps:g} Mb/s local ports" if "hierarchical" in names
                 else "") + (f", loss {args.loss:g}" if args.loss else ""))
        for name in names:
            mine = [i for i, r in enumerate(records) if r["collective"] == canonical(name)]
            verdict = "correct" if all(records[i]["correct"] for i in mine) else "MISMATCH"
            print(f"# {name}: {verdict}, bit for bit against numpy")
            print(format_rows([rows[i] for i in mine]))
    return EXIT_MISMATCH if bad else EXIT_OK
