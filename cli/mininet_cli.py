"""The Mininet CLI of `fabriclab up --cli`: Mininet's own, made to show its results and to end only
what it started.

Mininet's CLI writes every result (pingall, nodes, a host's command) at Mininet's "output" level, which
the fabric keeps below its "error" level so that bring-up and teardown stay quiet; `run_cli` lowers it
to "output" for the CLI's lifetime only.

Its `iperf` and `iperfudp` are replaced. Mininet's (Mininet.iperf) first runs `killall -9 iperf`,
which ends every iperf on the machine, not only the fabric's, and with iperf 2.0.14 or later (Debian 12
has 2.1.8) it waits forever for a second report the server no longer prints (mininet/mininet#1060).
Here the server is iperf3 with --one-off in the server host, ended by its pid if it is still there, and
the client's JSON gives both rates, printed as Mininet prints them: [server, client].
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

from mininet.cli import CLI
from mininet.log import LEVELS, error, lg, output

IPERF_PORT = 5201
IPERF_SECONDS = 5  # Mininet's default
CONNECT_WITHIN_S = 5.0  # the one-off server's start-up, retried by the client


def run_cli(net: Any) -> None:
    """Mininet's CLI on this terminal, showing Mininet's output; log levels restored when it exits."""
    saved = (lg.level, lg.ch.level, lg.propagate)
    level = min(saved[0], LEVELS["output"])  # under -vv Mininet is at "info" and keeps its chatter
    lg.setLevel(level)
    lg.ch.setLevel(level)
    # Mininet's records also reach the root handler, which would print each line a second time.
    lg.propagate = False
    try:
        FabricCLI(net)
    finally:
        lg.setLevel(saved[0])
        lg.ch.setLevel(saved[1])
        lg.propagate = saved[2]


def rate_text(bits_per_second: float) -> str:
    for unit, scale in (("Gbits/sec", 1e9), ("Mbits/sec", 1e6), ("Kbits/sec", 1e3)):
        if bits_per_second >= scale:
            return f"{bits_per_second / scale:.2f} {unit}"
    return f"{bits_per_second:.0f} bits/sec"


def iperf3_rates(client: Any, server: Any, *, udp_bw: str | None = None, seconds: int = IPERF_SECONDS,
                 port: int = IPERF_PORT) -> tuple[float, float]:
    """One iperf3 test from host `client` to host `server` (UDP at `udp_bw` if given, else TCP):
    (bits/s the server received, bits/s the client sent). Raises RuntimeError with iperf3's reason."""
    srv = server.popen(["iperf3", "--server", "--one-off", "--port", str(port)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    argv = ["iperf3", "--client", server.IP(), "--port", str(port), "--time", str(seconds), "--json"]
    if udp_bw is not None:
        argv += ["--udp", "--bitrate", udp_bw]
    deadline = time.monotonic() + CONNECT_WITHIN_S
    try:
        while True:
            cli = client.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                out, _ = cli.communicate(timeout=seconds + 30)
            finally:
                if cli.poll() is None:
                    cli.kill()
                    cli.wait()
            doc = json.loads(out or b"{}")
            problem = doc.get("error")
            if problem is None and "end" in doc:
                end = doc["end"]
                return end["sum_received"]["bits_per_second"], end["sum_sent"]["bits_per_second"]
            if srv.poll() is not None:
                reason = srv.stderr.read().decode().strip() if srv.stderr else ""
                raise RuntimeError(f"the iperf3 server on {server.name} exited: {reason or problem}")
            if "connect" not in str(problem) or time.monotonic() > deadline:
                raise RuntimeError(problem or "iperf3 printed no result")
            time.sleep(0.1)
    finally:
        if srv.poll() is None:
            srv.terminate()
            try:
                srv.wait(timeout=5)
            except subprocess.TimeoutExpired:
                srv.kill()
                srv.wait()


class FabricCLI(CLI):
    """Mininet's CLI with an iperf that touches only the two hosts it tests."""

    def _hosts(self, names: list[str]) -> list[Any] | None:
        if not names:
            return [self.mn.hosts[0], self.mn.hosts[-1]]
        missing = [n for n in names if n not in self.mn]
        for name in missing:
            error(f"node '{name}' not in network\n")
        return None if missing else [self.mn[n] for n in names]

    def _iperf(self, hosts: list[Any], udp_bw: str | None) -> None:
        client, server = hosts
        output(f"*** Iperf: testing {'UDP' if udp_bw else 'TCP'} bandwidth between {client} and {server} \n")
        try:
            received, sent = iperf3_rates(client, server, udp_bw=udp_bw)
        except (RuntimeError, OSError, ValueError) as exc:
            error(f"iperf3 failed: {exc}\n")
            return
        result = [rate_text(received), rate_text(sent)]
        output(f"*** Results: {[udp_bw, *result] if udp_bw else result}\n")

    def do_iperf(self, line: str) -> None:
        """TCP rate test (iperf3) between two hosts, the first and last if none are given.
           Usage: iperf node1 node2"""
        args = line.split()
        if len(args) not in (0, 2):
            error("invalid number of args: iperf src dst\n")
        elif hosts := self._hosts(args):
            self._iperf(hosts, None)

    def do_iperfudp(self, line: str) -> None:
        """UDP rate test (iperf3) at a given rate between two hosts, the first and last if none are given.
           Usage: iperfudp bw node1 node2 (bw as iperf3 takes it, e.g. 10M)"""
        args = line.split()
        if len(args) not in (0, 3):
            error("invalid number of args: iperfudp bw src dst\nbw examples: 10M\n")
        elif hosts := self._hosts(args[1:]):
            self._iperf(hosts, args[0] if args else "10M")
