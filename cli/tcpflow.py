"""`python -m cli.endpoint tcpflow recv|send`: sized TCP flows timed until the receiver holds every byte.

The experiment runner's TCP baseline for sized flows (transport/io/tcpflow.py says why not iperf3 -n).
It is a command of the transport's entry point only, not of `fabriclab`: people compare against TCP
through `fabriclab run`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from cli.args import destination_arg, port_or_any, positive_float, positive_size, show_help
from transport.io import tcpflow


def register(commands: argparse._SubParsersAction, bench: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("tcpflow", help="sized TCP flows timed until the receiver holds every byte",
                                 description=tcpflow.__doc__.split("\n")[0])
    parser.set_defaults(func=show_help(parser))
    sub = parser.add_subparsers(dest="tcpflow_command", metavar="{recv,send}")
    recv = sub.add_parser("recv", help="accept one connection, read to EOF, close")
    recv.add_argument("--bind", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    recv.add_argument("--port", type=port_or_any, required=True, help="TCP port (0: any)")
    recv.add_argument("--timeout", type=positive_float, default=60.0, help="give up after S s (default 60)")
    recv.add_argument("--timed", action="store_true",
                      help="the sender runs for --seconds and then resets the connection: take that as the end")
    recv.set_defaults(func=_run(tcpflow.receive))
    send = sub.add_parser("send", help="send N bytes (done when the receiver has closed) or for S seconds")
    send.add_argument("--to", type=destination_arg(None), required=True, metavar="HOST:PORT")
    size = send.add_mutually_exclusive_group(required=True)
    size.add_argument("--bytes", type=positive_size, metavar="N", help="e.g. 300000, 64K, 2M")
    size.add_argument("--seconds", type=positive_float, metavar="S",
                      help="send for S seconds, count what the receiver acknowledged by then, and reset the "
                      "connection (the receiver needs --timed)")
    send.add_argument("--cport", type=port_or_any, default=0, help="local port, for a fixed ECMP hash (0: any)")
    send.add_argument("--bind", default=None, help="local address (default: any)")
    send.add_argument("--hold", action="store_true", help="connect, announce readiness, send on SIGUSR1")
    send.add_argument("--timeout", type=positive_float, default=120.0,
                      help="connecting and the transfer each get at most S s (default 120)")
    send.set_defaults(func=_run(tcpflow.send))
    for p in (recv, send):
        p.add_argument("--json-out", metavar="FILE", help="write JSON metrics here")
        p.add_argument("--ready-file", metavar="FILE", help="create once the socket is open (connected)")


def _run(flow: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        try:
            return flow(args)
        except tcpflow.FlowError as exc:  # a failed flow, not bad input: exit status 1
            print(f"tcpflow {args.tcpflow_command}: {exc}", file=sys.stderr)
            return 1

    return handler
