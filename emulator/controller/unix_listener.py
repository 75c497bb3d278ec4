"""OpenFlow over a unix socket, for switches whose daemons run in namespaces of their own.

A switch in its own network namespace cannot reach 127.0.0.1 of the root namespace, but a unix socket
is a file: every namespace that shares the filesystem reaches it, and nothing outside the machine can.
os-ken listens on TCP only in practice (its Datapath sets TCP_NODELAY, which a unix socket refuses), so
this listener hands each accepted connection to the framework's own connection handler through a thin
wrapper that ignores TCP-level options.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class UnixConnection:
    """An accepted unix-socket connection that behaves as the framework expects of a TCP one."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def setsockopt(self, level: int, option: int, value: Any) -> None:
        if level == socket.IPPROTO_TCP:
            return  # no Nagle on a unix socket: nothing to turn off
        self._sock.setsockopt(level, option, value)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def listen_unix(path: Path) -> socket.socket:
    """A listening unix socket at `path`, readable and writable by root only."""
    path.unlink(missing_ok=True)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        srv.bind(str(path))
    finally:
        os.umask(old)
    srv.listen(128)
    return srv


def serve_unix(srv: socket.socket, handle: Callable[[Any, Any], Any],
               spawn: Callable[..., Any], stopping: Callable[[], bool]) -> None:
    """Accept connections until `stopping()`; each is handled as `handle(conn, address)` in its own task."""
    n = 0
    while not stopping():
        try:
            conn, _ = srv.accept()
        except OSError as exc:
            if stopping():
                return
            log.warning("OpenFlow unix socket: %s", exc)
            continue
        n += 1
        spawn(handle, UnixConnection(conn), ("unix", n))
