"""`fabriclab srd ...`, `fabriclab bench transport` and `fabriclab bench cc`: run the transport over real UDP,
benchmark it, compare its congestion controllers.

`srd recv` listens for transport connections; `srd send` opens one and runs a workload (bulk bytes,
a stream of messages open- or closed-loop, or request/response). Both print a summary, or JSON metrics
with `--json` / `--json-out`, and flush those metrics on SIGINT/SIGTERM. Bad options produce one line
naming the option and the fix, and exit status 2.

The endpoints in emulated hosts start as `python -m cli.endpoint srd ...`, which loads this module alone:
it imports the transport's endpoint and nothing of the emulator or the experiments.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from cli.args import (
    OneLineParser,
    add_path_policy_argument,
    destination_arg,
    mtu_arg,
    nonneg_float,
    nonneg_int,
    port_or_any,
    positive_float,
    positive_int,
    positive_size,
    show_help,
    size_arg,
)
from transport.core.config import DELIVERY_MODES, RECOVERY_MODES, ConfigError, TransportConfig, path_ack_delay
from transport.core.congestion import CONTROLLERS
from transport.core.paths import POLICIES
from transport.io.defaults import ENDPOINT_ACK_BATCH, ENDPOINT_ACK_DELAY, ENDPOINT_PACING_PACKETS
from transport.io.endpoint import (
    DEFAULT_BASE_PORT,
    DEFAULT_PORT,
    EndpointError,
    Receiver,
    Sender,
    Workload,
    announce_ready,
    local_datagram_size,
    path_datagram_size,
    resolve,
    write_json,
)

USER_ERRORS: tuple[type[BaseException], ...] = (EndpointError, ConfigError)


parse_destination = destination_arg(DEFAULT_PORT)


def register(commands: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    srd = commands.add_parser(
        "srd",
        help="run the SRD-like transport over real UDP (receiver and sender)",
        description="Run the SRD-like multipath transport between two hosts over UDP. Start `srd recv` on "
        "one host, then `srd send --to HOST` on another. The sender uses one UDP source port per entropy "
        f"value (EV): base port + EV (default {DEFAULT_BASE_PORT}), so the fabric can spray by source "
        "port.",
    )
    srd.set_defaults(func=show_help(srd))
    sub = srd.add_subparsers(dest="srd_command", metavar="{recv,send,group}")
    _register_recv(sub)
    _register_send(sub)
    _register_group(sub)

    p = bench.add_parser(
        "transport",
        help="measure the transport: packet rates (core, loopback UDP, raw sendto) and loss recovery",
        description="Measure, in one run: core_pps (sender + receiver connections in one process, no "
        "I/O), loopback_pps (UDP endpoints over 127.0.0.1, receiver in a child process), raw_sendto_pps "
        "(a bare sendto loop of the same datagram size: the ceiling), and, on the simulated network, "
        "goodput with 1%% loss on one of 8 paths relative to no loss for selective repeat and go-back-N, "
        "and the spurious retransmission fraction when spraying over paths whose delays differ 2x. "
        "Prints one JSON object.",
    )
    p.add_argument("--json", action="store_true", help="print JSON only (the default output is JSON too)")
    p.add_argument("--quick", action="store_true", help="smaller runs: under ~15 s instead of ~60 s")
    p.set_defaults(func=_cmd_bench)

    p = bench.add_parser(
        "cc",
        help="every registered congestion controller on a simulated fabric: permutation, incast 8:1 and 15:1",
        description="On the simulated two-leaf fabric (16 hosts, 8 spines, 100 Mb/s links, virtual clock, "
        "spraying), run for each registered congestion controller ("
        + CONTROLLERS.choices_text() + ") a permutation and incasts of 8 and 15 senders with sized flows, "
        "and print goodput / ideal, the incast's last byte / ideal, the spread of flow completion times, the "
        "receiver's peak queue, drops, retransmissions as %% of packets sent, and the core's CPU per packet.",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--quick", action="store_true", help="smaller flows: about a minute instead of several")
    p.add_argument("--cc", action="append", choices=CONTROLLERS.names(), metavar="NAME",
                   help="only this controller (repeatable; default every registered one)")
    p.add_argument("--seed", type=nonneg_int, default=1, metavar="N", help="simulation seed (default 1)")
    p.set_defaults(func=_cmd_bench_cc)


def _add_common(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group("transport")
    t.add_argument("--delivery", choices=DELIVERY_MODES, default="unordered",
                   help="hand messages to the application as they complete (unordered, default) or in "
                   "sending order (ordered: head-of-line blocking)")
    t.add_argument("--recovery", choices=RECOVERY_MODES, default="selective",
                   help="loss recovery: selective repeat (default) or go-back-N")
    t.add_argument("--mtu", type=mtu_arg, default=None, metavar="BYTES|auto",
                   help="largest datagram the transport sends, header included (default from the "
                   "transport config: 1400); `auto` sizes it to the path MTU less the IP and UDP headers "
                   "(1472 on a 1500-byte path, 8972 with 9000-byte jumbo frames; send: the route toward --to, "
                   "recv: the interface of --bind); the receiver must allow at least the sender's size")
    t.add_argument("--ack-delay", type=nonneg_float, default=None, metavar="S",
                   help="hold ACKs up to S seconds to acknowledge several packets at once (default "
                   f"{ENDPOINT_ACK_DELAY:g}, or a quarter of --base-rtt where that is longer; 0 = one ACK "
                   "per packet)")
    t.add_argument("--ack-batch", type=positive_int, default=ENDPOINT_ACK_BATCH, metavar="N",
                   help=f"with --ack-delay, acknowledge at once when N packets wait (default {ENDPOINT_ACK_BATCH})")
    t.add_argument("--pacing-packets", type=positive_int, default=ENDPOINT_PACING_PACKETS, metavar="N",
                   help="each wake-up sends what pacing allows within N packet intervals (default "
                   f"{ENDPOINT_PACING_PACKETS}; 1 = the next packet only)")
    t.add_argument("--link-rate", type=nonneg_float, default=0.0, metavar="MBPS",
                   help="this host's link rate in Mb/s (default 0 = unknown); with --base-rtt the initial window "
                   "is one bandwidth-delay product, and under --cc credit the receiver grants at this rate")
    t.add_argument("--base-rtt", type=nonneg_float, default=0.0, metavar="S",
                   help="the fabric's unloaded RTT in seconds for a full-size packet (default 0 = unknown)")
    p.add_argument("--ready-file", metavar="FILE",
                   help="create FILE once the sockets are open (lets a runner start traffic only when "
                   "every endpoint is up)")
    o = p.add_argument_group("output")
    out = o.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the metrics as JSON on stdout")
    out.add_argument("--json-out", metavar="FILE",
                     help="write the metrics as JSON to FILE (also on SIGINT/SIGTERM)")
    o.add_argument("--progress", action="store_true",
                   help="print progress to stderr even when it is not a terminal")


def _register_recv(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "recv",
        help="listen for transport connections",
        description="Listen on one UDP port for transport connections (any number of senders),\n"
        "deliver their messages, and acknowledge each datagram to the address it came from.\n"
        "Stops after --expect-bytes, after --duration, or on Ctrl-C / SIGTERM; the metrics\n"
        "are printed or written in every case.",
        epilog="examples:\n  fabriclab srd recv --port 7471 --json-out recv.json\n"
        "  fabriclab srd recv --echo            # serve `srd send --request-response`",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--bind", default="127.0.0.1", metavar="ADDR",
                   help="local address to listen on (default 127.0.0.1, loopback only; inside an emulated "
                   "host give its address, e.g. 10.0.0.8, or 0.0.0.0 for all; :: for IPv6)")
    p.add_argument("--port", type=port_or_any, default=DEFAULT_PORT,
                   help=f"UDP port to listen on (default {DEFAULT_PORT})")
    stop = p.add_mutually_exclusive_group()
    stop.add_argument("--expect-bytes", type=size_arg, default=0, metavar="N",
                      help="stop once N message bytes have arrived (e.g. 100M) and the sender is quiet")
    stop.add_argument("--duration", type=positive_float, default=None, metavar="S",
                      help="stop after S seconds")
    resp = p.add_mutually_exclusive_group()
    resp.add_argument("--echo", action="store_true",
                      help="send every message back to its sender (for --request-response)")
    resp.add_argument("--response-size", type=positive_size, default=0, metavar="N",
                      help="answer every message with an N-byte response (for --request-response)")
    p.add_argument("--verify", action="store_true",
                   help="check that messages from `srd send` arrive intact and once (costs CPU)")
    p.add_argument("--cc", choices=CONTROLLERS.names(), default=TransportConfig.cc,
                   help="congestion control of what this end sends back (responses); with credit it also "
                   f"grants credit to its senders, who must use --cc credit too. {CONTROLLERS.help()}")
    _add_common(p)
    p.set_defaults(func=_cmd_recv)


def _register_send(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "send",
        help="open a connection to a receiver and run a workload",
        description="Open a transport connection to `srd recv` and run one workload:\n"
        "  bulk        --bytes N: N bytes in --size messages, as fast as the window allows\n"
        "  messages    --messages K --size S, open loop at --rate R messages/s, or closed loop with\n"
        "              --closed-loop C messages outstanding (default 8)\n"
        "  req/resp    add --request-response: a message completes when the receiver's response\n"
        "              arrives (run the receiver with --echo or --response-size)\n"
        "With --duration and no --bytes/--messages, sends until the time is up. Each entropy value\n"
        "(EV) gets its own UDP source port, base port + EV, so the fabric can spray by source port.",
        epilog="examples:\n  fabriclab srd send --to 10.0.0.2 --bytes 100M --policy spray\n"
        "  fabriclab srd send --to 10.0.0.2:7471 --messages 1000 --size 4K --rate 500\n"
        "  fabriclab srd send --to 10.0.0.2 --messages 200 --size 1K --request-response --closed-loop 4",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--to", required=True, type=parse_destination, metavar="HOST[:PORT]",
                   help=f"the receiver (port default {DEFAULT_PORT}; IPv6 as [ADDR]:PORT)")
    w = p.add_argument_group("workload")
    amount = w.add_mutually_exclusive_group()
    amount.add_argument("--bytes", type=positive_size, default=None, metavar="N",
                        help="bulk transfer of N bytes (e.g. 2M; the default is 10M unless --messages or "
                        "--duration is given)")
    amount.add_argument("--messages", type=positive_int, default=None, metavar="K",
                        help="send K messages of --size bytes")
    w.add_argument("--size", type=positive_size, default=65536, metavar="S",
                   help="message size in bytes (default 64K)")
    pace = w.add_mutually_exclusive_group()
    pace.add_argument("--rate", type=positive_float, default=0.0, metavar="R",
                      help="open loop: start R messages per second regardless of completions")
    pace.add_argument("--closed-loop", type=positive_int, default=0, metavar="C",
                      help="closed loop: keep C messages outstanding (default 8 for --messages; bulk "
                      "keeps enough to fill the window)")
    w.add_argument("--request-response", action="store_true",
                   help="each message waits for the receiver's response; completion time = round trip")
    w.add_argument("--duration", type=positive_float, default=None, metavar="S",
                   help="stop after S seconds (with no --bytes/--messages: send for S seconds)")
    t = p.add_argument_group("paths and congestion control")
    t.add_argument("--policy", choices=POLICIES.names(), default=TransportConfig.path_policy,
                   help=f"path (EV) choice, default {TransportConfig.path_policy}: {POLICIES.help()}")
    add_path_policy_argument(t)
    t.add_argument("--evs", type=positive_int, default=16, metavar="N",
                   help="number of entropy values = source ports used (default 16)")
    t.add_argument("--base-port", type=port_or_any, default=DEFAULT_BASE_PORT, metavar="P",
                   help=f"source port of EV 0; EV i uses P+i (default {DEFAULT_BASE_PORT}, a multiple of 16 "
                   "so the low 4 bits are the EV; 0 = any free ports)")
    t.add_argument("--bind", default=None, metavar="ADDR",
                   help="local address for the source sockets (default all addresses)")
    t.add_argument("--cc", choices=CONTROLLERS.names(), default=TransportConfig.cc,
                   help=f"congestion control, default {TransportConfig.cc}: {CONTROLLERS.help()}")
    t.add_argument("--window", type=positive_int, default=None, metavar="W",
                   help="(initial) congestion window in packets (default 64)")
    t.add_argument("--seed", type=nonneg_int, default=0, metavar="N",
                   help="seed for the path policy's random choices (default 0)")
    t.add_argument("--hold", action="store_true",
                   help="open the sockets (and write --ready-file), then wait for SIGUSR1 before sending, "
                   "so that many senders start together; SIGTERM/SIGINT while waiting exit without sending")
    t.add_argument("--connect-timeout", type=positive_float, default=5.0, metavar="S",
                   help="give up if the receiver has not answered after S seconds (default 5)")
    _add_common(p)
    p.set_defaults(func=_cmd_send)


# --------------------------------------------------------------------------------------------------
# Handlers


# TransportConfig field -> the option that sets it, so config errors name what the user typed.
_OPTION_OF = {
    "mtu": "--mtu", "delivery": "--delivery", "recovery": "--recovery", "path_policy": "--policy",
    "num_evs": "--evs", "cc": "--cc", "window": "--window", "max_window": "--window",
    "ack_delay": "--ack-delay", "ack_batch": "--ack-batch", "pacing_packets": "--pacing-packets",
    "link_rate_bps": "--link-rate", "base_rtt": "--base-rtt",
}


def _ack_delay(args: argparse.Namespace) -> float:
    """--ack-delay as given, else the endpoints' hold sized to the path (config.path_ack_delay)."""
    if args.ack_delay is not None:
        return float(args.ack_delay)
    return path_ack_delay(ENDPOINT_ACK_DELAY, args.base_rtt)


def _config(args: argparse.Namespace, **extra: Any) -> TransportConfig:
    fields: dict[str, Any] = {
        "delivery": args.delivery, "recovery": args.recovery, "ack_delay": _ack_delay(args),
        "ack_batch": args.ack_batch, "pacing_packets": args.pacing_packets, "ack_on_message": True,
        "link_rate_bps": args.link_rate * 1e6, "base_rtt": args.base_rtt, "cc": args.cc,
    }
    if isinstance(args.mtu, int):
        fields["mtu"] = args.mtu
    fields.update({k: v for k, v in extra.items() if v is not None})
    if fields.get("window") is not None:
        # A window above the default ceiling is a request for a larger ceiling, not an error.
        fields["max_window"] = max(TransportConfig.max_window, fields["window"])
    config = TransportConfig(**fields)
    try:
        config.validate()
    except ConfigError as exc:
        field, _, rest = str(exc).partition("=")
        value, _, fix = rest.partition(": ")
        option = _OPTION_OF.get(field)
        if option is None or not fix:
            raise
        raise ConfigError(f"{option} {value.strip(chr(39))}: {fix}") from None
    return config


@contextmanager
def _signals_stop(loop: Sender | Receiver) -> Iterator[None]:
    """SIGINT/SIGTERM end the run cleanly (metrics still written) instead of killing the process."""
    previous = {}

    def handler(signum: int, _frame: Any) -> None:
        loop.stop(f"signal {signal.Signals(signum).name}")

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread: leave signals alone
            pass
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _open_and_hold(sender: Sender, args: argparse.Namespace) -> bool:
    """Open the sockets and announce readiness; with --hold, wait for SIGUSR1. False: told to stop."""
    if not args.hold:
        sender.open()
        announce_ready(args.ready_file)
        return True
    # Blocked before announcing, so a start signal sent the moment the file appears cannot be lost
    # (SIGUSR1's default action would end the process).
    waited = {signal.SIGUSR1, signal.SIGTERM, signal.SIGINT}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    try:
        sender.open()
        announce_ready(args.ready_file)
        got = signal.sigwait(waited)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    if got != signal.SIGUSR1:
        sender.close()
        return False
    return True


def _progress(args: argparse.Namespace) -> Callable[[dict[str, Any]], None] | None:
    if not (args.progress or sys.stderr.isatty()):
        return None

    def show(snap: dict[str, Any]) -> None:
        mb = snap["bytes"] / 1e6
        rate = snap["goodput_bps"] / 1e6
        extra = f" acked {snap['messages_acked']}" if "messages_acked" in snap else f" msgs {snap['messages']}"
        print(f"{snap['role']}: {snap['elapsed']:6.1f} s {mb:10.2f} MB {rate:9.2f} Mb/s{extra}",
              file=sys.stderr, flush=True)

    return show


def _emit(args: argparse.Namespace, metrics: dict[str, Any], summary: str) -> None:
    if args.json_out:
        write_json(metrics, args.json_out)
    if args.json:
        print(json.dumps(metrics, indent=2, sort_keys=True))
    else:
        print(summary)


def _cmd_recv(args: argparse.Namespace) -> int:
    receiver = _build_receiver(args)
    receiver.open()
    announce_ready(args.ready_file)
    host, port = receiver.address
    if args.progress or sys.stderr.isatty():
        print(f"srd recv: listening on {host}:{port}", file=sys.stderr, flush=True)
    with _signals_stop(receiver):
        metrics = receiver.run()
    summary = (
        f"received {metrics['bytes']} bytes in {metrics['messages']} messages from "
        f"{len(metrics['connections'])} connection(s) in {metrics['duration']:.3f} s: "
        f"{metrics['goodput_bps'] / 1e6:.2f} Mb/s ({metrics['stop_reason'] or 'stopped'})"
    )
    _emit(args, metrics, summary)
    return 0


def _build_sender(args: argparse.Namespace) -> Sender:
    host, port = args.to
    total = args.bytes or 0
    if args.bytes is None and args.messages is None and args.duration is None:
        total = 10 << 20
    workload = Workload(
        total_bytes=total,
        messages=args.messages or 0,
        size=args.size,
        rate=args.rate,
        outstanding=args.closed_loop,
        request_response=args.request_response,
    )
    if args.request_response and args.size < 8:
        raise EndpointError("--size must be at least 8 bytes with --request-response (responses are "
                            "matched by an 8-byte sequence number)")
    if args.base_port and args.base_port + args.evs - 1 > 65535:
        raise EndpointError(f"--base-port {args.base_port} + --evs {args.evs} exceeds port 65535; "
                            "lower --base-port or --evs")
    try:
        resolve(host, port)
    except EndpointError as exc:
        raise EndpointError(f"--to {host}: {exc}") from None
    extra: dict[str, Any] = {}
    if args.mtu == "auto":
        extra["mtu"] = path_datagram_size(host, port)
    config = _config(args, path_policy=args.path_policy or args.policy,
                     num_evs=args.evs, cc=args.cc, window=args.window, **extra)
    return Sender(
        config,
        host,
        port,
        workload,
        bind=args.bind,
        base_port=args.base_port,
        duration=args.duration,
        seed=args.seed,
        connect_timeout=args.connect_timeout,
        progress=_progress(args),
    )


def _cmd_send(args: argparse.Namespace) -> int:
    sender = _build_sender(args)
    host, port = args.to
    workload = sender.workload
    if not _open_and_hold(sender, args):
        print(f"{args.prog} send: stopped before the start signal; nothing sent", file=sys.stderr)
        return 0
    with _signals_stop(sender):
        metrics = sender.run()
    ct = metrics["completion_times"]
    timing = (f", completion p50 {ct['p50'] * 1e3:.2f} ms p99 {ct['p99'] * 1e3:.2f} ms"
              if ct.get("count") else "")
    summary = (
        f"sent {metrics['bytes']} bytes in {metrics['messages']} messages to {host}:{port} in "
        f"{metrics['duration']:.3f} s: {metrics['goodput_bps'] / 1e6:.2f} Mb/s{timing} "
        f"({metrics['stop_reason'] or 'stopped'})"
    )
    _emit(args, metrics, summary)
    bounded = not workload.unbounded
    if bounded and not metrics["completed"]:
        print(f"{args.prog} send: stopped before the workload completed ({metrics['stop_reason']})",
              file=sys.stderr)
        return 1
    return 0


def _register_group(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "group",
        help="run several `srd recv` / `srd send` endpoints in one process (how the experiments run them)",
        description="Run the endpoints that SPEC lists in one process: one event loop over all their sockets "
        "(transport/io/group.py), each opened in its own network namespace. SPEC is a JSON file: "
        '{"hold": BOOL, "endpoints": [{"argv": ["send", "--to", ...], "netns": "/proc/PID/ns/net", '
        '"start_s": 0.0}, ...]}; argv is what `srd recv` or `srd send` would be given (each its own '
        "--ready-file and --json-out), netns (optional) the namespace to open its sockets in, start_s "
        "(senders) when it starts after the release. With hold, every endpoint opens, writes its ready "
        "file, and the group waits for one SIGUSR1. SIGINT/SIGTERM end every endpoint with its metrics written. "
        "While traffic comes densely the group wakes at most once per linger (a quarter of a full frame's time "
        "at the endpoints' --link-rate, at most 2 ms) and takes what came meanwhile together; "
        "FABRICLAB_GROUP_LINGER_US sets it (0: off). Its last line gives its CPU seconds and wake-ups.",
    )
    p.add_argument("spec", metavar="SPEC", help="the JSON file listing the endpoints")
    p.set_defaults(func=_cmd_group)


def _endpoint_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="srd group: endpoint")
    sub = parser.add_subparsers(dest="srd_command", required=True)
    _register_recv(sub)
    _register_send(sub)
    return parser


def _build_receiver(args: argparse.Namespace) -> Receiver:
    config = _config(args, **({"mtu": local_datagram_size(args.bind)} if args.mtu == "auto" else {}))
    return Receiver(config, bind=args.bind, port=args.port, expect_bytes=args.expect_bytes,
                    duration=args.duration, echo=args.echo, response_size=args.response_size,
                    verify=args.verify, progress=_progress(args))


def _cmd_group(args: argparse.Namespace) -> int:
    from transport.io.group import LoopGroup, group_linger, netns, raise_open_files_limit

    try:
        with open(args.spec) as fh:
            spec = json.load(fh)
        entries = list(spec["endpoints"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EndpointError(f"group spec {args.spec}: {exc}; see `srd group --help` for its format") from None
    if not entries:
        raise EndpointError(f"group spec {args.spec} lists no endpoints")
    raise_open_files_limit()
    parser = _endpoint_parser()
    hold = bool(spec.get("hold"))
    loops: list[Sender | Receiver] = []
    parsed: list[argparse.Namespace] = []
    failed: list[str] = []

    def finish(loop: Sender | Receiver) -> None:
        i = loops.index(loop)
        with netns(entries[i].get("netns")):
            metrics = loop.results()
        loop.close()
        ep = parsed[i]
        write_json(metrics, ep.json_out)
        if isinstance(loop, Sender) and not loop.workload.unbounded and not metrics["completed"]:
            failed.append(f"{ep.to[0]}: {metrics['stop_reason']}")

    waited = {signal.SIGUSR1, signal.SIGTERM, signal.SIGINT}
    # Blocked from the start: a signal that comes while the endpoints open is taken by sigwait
    # (held) or once the loops run (stop), never by the default action that would lose the metrics.
    old = signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    previous: dict[int, Any] = {}
    group = None
    try:
        for entry in entries:
            ep = parser.parse_args([str(a) for a in entry["argv"]])
            with netns(entry.get("netns")):
                loop = _build_receiver(ep) if ep.srd_command == "recv" else _build_sender(ep)
                loop.open()
            loops.append(loop)
            parsed.append(ep)
        group = LoopGroup(loops, [float(e.get("start_s", 0.0)) for e in entries], linger=group_linger(loops))
        stop_group = group.stop
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda signum, _f: stop_group(f"signal {signal.Signals(signum).name}"))
        for ep in parsed:
            announce_ready(ep.ready_file)
        if hold and signal.sigwait(waited) != signal.SIGUSR1:
            print(f"{args.prog} group: stopped before the start signal; nothing sent", file=sys.stderr)
            return 0
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        group.run(finish)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if group is not None:
            group.close()
        for loop in loops:
            loop.close()
    print(f"srd group: {len(loops)} endpoints in one process, {group.cpu_run_s:.3f} CPU s while they ran, "
          f"{group.wakeups} wake-ups, {group.turns} loop turns, {group.page_faults} page faults, "
          f"linger {group.linger * 1e6:.0f} µs")
    if failed:
        print(f"{args.prog} group: {len(failed)} sender(s) stopped before their workload completed "
              f"({'; '.join(failed[:3])})", file=sys.stderr)
        return 1
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from transport.sim.bench import run_bench

    result = run_bench(quick=args.quick)
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0


def _cmd_bench_cc(args: argparse.Namespace) -> int:
    from transport.sim.cc_bench import run_cc_bench, text_report

    result = run_cc_bench(quick=args.quick, controllers=args.cc, seed=args.seed,
                          progress=lambda msg: print(f"bench cc: {msg}", file=sys.stderr))
    print(json.dumps(result, indent=2, sort_keys=True) if args.json else text_report(result))
    return 0
