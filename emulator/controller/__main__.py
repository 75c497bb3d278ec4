"""Run the fabric controller as its own process.

    python -m emulator.controller --topology FILE.json --of-port P --api-port Q --mode MODE \
        [--poll-interval 0.5] [--log-file F] [--verbose]

FILE.json is `Topology.to_dict()` as JSON. OpenFlow 1.3 listens on 127.0.0.1:P, the JSON API on
127.0.0.1:Q. SIGTERM or SIGINT stops the process with exit status 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from types import FrameType

from emulator.controller.rules import MODES
from topologies.model import Topology

log = logging.getLogger("emulator.controller")

LOG_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s"
LOG_DATEFMT = "%Y-%m-%dT%H:%M:%S"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m emulator.controller", description=__doc__.splitlines()[0])
    p.add_argument("--topology", required=True, type=Path, help="topology JSON (Topology.to_dict())")
    p.add_argument("--of-port", required=True, type=int, help="OpenFlow listen port on 127.0.0.1")
    p.add_argument("--api-port", required=True, type=int, help="HTTP API port on 127.0.0.1")
    p.add_argument("--mode", default="ecmp", choices=MODES, help="routing mode (default: ecmp)")
    p.add_argument("--poll-interval", type=float, default=0.5, help="port counter poll interval, s")
    p.add_argument("--listen", default="127.0.0.1", help="address for both listeners")
    p.add_argument("--of-socket", type=Path,
                   help="also accept OpenFlow on this unix socket (for switches in their own namespaces)")
    p.add_argument("--log-file", type=Path, help="log to this file instead of stderr")
    p.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    args = p.parse_args(argv)
    if args.poll_interval <= 0:
        p.error("--poll-interval must be positive")
    return args


def setup_logging(log_file: Path | None, verbose: bool) -> None:
    # With a log file, log only there: callers often send stderr to the same file, and every line
    # would appear twice. Stderr then only carries what escapes logging (a crash at start-up).
    handler: logging.Handler = logging.StreamHandler(sys.stderr)
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(log_file)
    handlers = [handler]
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=LOG_FORMAT,
        datefmt=LOG_DATEFMT,
        handlers=handlers,
        force=True,
    )
    # The framework logs every connection at INFO; keep its chatter at warnings unless debugging.
    for name in ("os_ken", "ryu"):
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.WARNING)


def port_in_use(host: str, port: int) -> str | None:
    """Why host:port cannot be listened on, or None. Binds the way both listeners do (SO_REUSEADDR),
    so a port left in TIME_WAIT by a previous run counts as free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e.strerror or str(e)
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.log_file, args.verbose)
    try:
        topo = Topology.from_dict(json.loads(args.topology.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.error("cannot read topology %s: %s", args.topology, e)
        return 2

    for what, port in (("OpenFlow", args.of_port), ("API", args.api_port)):
        if (why := port_in_use(args.listen, port)) is not None:
            log.error("%s port %s:%d: %s", what, args.listen, port, why)
            return 2

    # Imported late: importing the framework registers its options and logs, and is slow.
    from emulator.controller import app, compat

    app.FabricController.config = app.ControllerConfig(
        topology=topo,
        mode=args.mode,
        api_host=args.listen,
        api_port=args.api_port,
        poll_interval=args.poll_interval,
        of_socket=str(args.of_socket) if args.of_socket else None,
    )

    def stop(signum: int, _frame: FrameType | None) -> None:
        log.info("%s received, stopping", signal.Signals(signum).name)
        for inst in app_instances():
            inst.shutdown()
        logging.shutdown()
        # The framework's threads cannot be stopped from outside and are not daemons; every socket
        # and flow-table entry is owned by the switches or the kernel, so exiting here is clean.
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info(
        "pid %d: topology %s, mode %s, OpenFlow %s:%d, API %s:%d",
        os.getpid(),
        topo.name,
        args.mode,
        args.listen,
        args.of_port,
        args.listen,
        args.api_port,
    )
    try:
        compat.run_apps(["emulator.controller.app"], args.listen, args.of_port)
        # run_apps only returns when the OpenFlow listener died (e.g. the port was taken).
        log.error("OpenFlow listener on %s:%d stopped; exiting", args.listen, args.of_port)
    except Exception:
        log.exception("controller failed")
    logging.shutdown()
    os._exit(1)


def app_instances() -> list:
    """Running FabricController instances (normally one)."""
    from emulator.controller import app, compat

    mgr = compat.app_manager.AppManager.get_instance()
    return [a for a in mgr.applications.values() if isinstance(a, app.FabricController)]


if __name__ == "__main__":
    sys.exit(main())
