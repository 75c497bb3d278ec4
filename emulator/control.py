"""Starting the controller as its own process and talking to its JSON API on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from emulator.errors import EmulatorError
from emulator.state import kill_pid
from emulator.system import slowdown

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


# Listening ports are picked below the kernel's ephemeral range where it leaves room: a port the kernel
# handed out for binding to port 0 is free only until an outgoing connection (the runner's own API polls)
# takes it, and the controller binds it a moment later.
LISTEN_PORTS_FROM = 20000
PORT_TRIES = 64


def ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def free_port(avoid: frozenset[int] | set[int] = frozenset()) -> int:
    """A TCP port on 127.0.0.1 that nothing holds now (nor is in `avoid`), outside the ephemeral range
    when it can be."""
    low = ephemeral_low()
    if low > LISTEN_PORTS_FROM:
        rng = random.Random()
        for _ in range(PORT_TRIES):
            port = rng.randrange(LISTEN_PORTS_FROM, low)
            if port in avoid:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((LOOPBACK, port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


class ControllerClient:
    """A small client for the controller's HTTP API."""

    def __init__(self, port: int, host: str = LOOPBACK, timeout: float = 10.0) -> None:
        self.base = f"http://{host}:{port}"
        self.timeout = timeout

    def _request(self, method: str, path: str, body: dict | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read()).get("error", "")
            except (ValueError, AttributeError):
                detail = ""
            raise EmulatorError(f"controller {method} {path}: HTTP {exc.code} {detail}".strip()) from None

    def get(self, path: str) -> Any:
        return self._request("GET", path)

    def put(self, path: str, body: dict) -> Any:
        return self._request("PUT", path, body)

    def health(self) -> dict:
        return self.get("/health")

    def links(self) -> dict:
        return self.get("/links")

    def events(self) -> list[dict]:
        return self.get("/events")

    def mode(self) -> str:
        return self.get("/mode")["mode"]

    def set_reaction_delay(self, seconds: float) -> dict:
        """Reroute `seconds` after a link's state changes, as a real fabric's routing would."""
        return self.put("/reaction_delay", {"seconds": seconds})

    def set_mode(self, mode: str) -> dict:
        return self.put("/mode", {"mode": mode})


class ControllerProcess:
    """The OpenFlow controller app, run by os-ken in a child process of ours."""

    def __init__(self, topology_file: Path, mode: str, workdir: Path, poll_interval: float = 0.5,
                 of_socket: Path | None = None) -> None:
        self.topology_file = topology_file
        self.of_socket = of_socket
        self.mode = mode
        self.poll_interval = poll_interval
        self.log_file = workdir / "controller.log"
        self.of_port = free_port()
        self.api_port = free_port(avoid={self.of_port})
        self.proc: subprocess.Popen | None = None
        self.client = ControllerClient(self.api_port, timeout=10.0 * slowdown())

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def exit_code(self) -> int | None:
        """None while the controller runs; its exit status once it has ended (or was never started)."""
        if self.proc is None:
            return -1
        return self.proc.poll()

    def start(self) -> None:
        cmd = [
            sys.executable, "-m", "emulator.controller",
            "--topology", str(self.topology_file),
            "--of-port", str(self.of_port),
            "--api-port", str(self.api_port),
            "--mode", self.mode,
            "--poll-interval", str(self.poll_interval),
            "--log-file", str(self.log_file),
        ]
        if self.of_socket is not None:
            cmd += ["--of-socket", str(self.of_socket)]
        log.info("starting controller: of-port %d, api-port %d", self.of_port, self.api_port)
        # Own session: a Ctrl-C in the terminal reaches us, and we stop the controller in order.
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(self.log_file, "ab") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env=env,
            )

    def log_tail(self, lines: int = 8) -> str:
        """The end of the controller's log; when it holds a traceback, the first one's start too: the
        framework's shutdown can raise again and end the log with an error that only follows the cause."""
        try:
            text = self.log_file.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        first = next((i for i, line in enumerate(text) if line.startswith("Traceback")), None)
        if first is None or first >= len(text) - lines:
            return "\n".join(text[-lines:])
        start, end = max(0, first - 1), first + 2 * lines  # from the record that reported it
        if end >= len(text) - lines:
            return "\n".join(text[start:])
        return "\n".join([*text[start:end], "  ...", *text[-lines:]])

    def wait_listening(self, timeout: float = 20.0) -> None:
        """Wait until the OpenFlow port (and unix socket, if asked for) and the API answer."""
        timeout *= slowdown()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc and self.proc.poll() is not None:
                raise EmulatorError(
                    f"the controller exited with code {self.proc.returncode}; its log ends:\n{self.log_tail()}"
                )
            try:
                self.client.health()
                with socket.create_connection((LOOPBACK, self.of_port), timeout=0.5):
                    pass
            except (OSError, EmulatorError):
                time.sleep(0.05)
                continue
            # The unix socket is bound when the app starts, just after the API.
            if self.of_socket is None or self.of_socket.exists():
                return
            time.sleep(0.05)
        raise EmulatorError(f"the controller did not start listening within {timeout:.0f} s; log:\n{self.log_tail()}")

    def wait_ready(self, timeout: float) -> dict:
        """Wait until every switch is connected and every rule is installed (barrier-confirmed)."""
        deadline = time.monotonic() + timeout
        health: dict = {}
        while time.monotonic() < deadline:
            if self.proc and self.proc.poll() is not None:
                raise EmulatorError(
                    f"the controller exited with code {self.proc.returncode}; its log ends:\n{self.log_tail()}"
                )
            try:
                health = self.client.health()
            except (OSError, EmulatorError):
                health = {}
            if health.get("ready"):
                return health
            time.sleep(0.05)
        connected = len(health.get("switches_connected", []))
        raise EmulatorError(
            f"the fabric was not ready within {timeout:.0f} s ({connected} of "
            f"{health.get('switches_expected', '?')} switches connected); controller log:\n{self.log_tail()}"
        )

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            kill_pid(self.proc.pid, "emulator.controller")
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.proc = None
