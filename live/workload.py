"""The continuous traffic of the live view, run inside the Mininet hosts and ended by process id.

permutation: every host runs `srd recv` and sends one long `srd send` (`python -m cli.endpoint`) to a host
on another leaf (experiments.analysis.derangement_across), each sender from its own base port as
the experiment runner does, so ECMP hashes flows apart by their ports as well as their addresses.
allreduce: the transport's ring all-reduce worker on every host for a great many iterations, ranks
alternating between leaves so every ring edge crosses the fabric.

Changing the path policy restarts the senders (or all workers) with the new --policy; receivers keep
running. A process that exits by itself is reported, not restarted: the page says so.
"""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.analysis.placement import derangement_across, host_rate_mbps
from experiments.endpoints import command_line, sender_args
from topologies import Topology
from topologies.model import natural_key
from transport.io.addressing import DEFAULT_BASE_PORT, DEFAULT_PORT

log = logging.getLogger(__name__)

WORKLOADS = ("permutation", "allreduce")
FOREVER_S = 7 * 24 * 3600  # senders run until stopped; this only bounds a forgotten one
MESSAGE_SIZE = 65536
ALLREDUCE_ELEMENTS = 262_144  # 1 MiB of float32 per rank and iteration
ALLREDUCE_ITERATIONS = 1_000_000


@dataclass
class Proc:
    host: str
    role: str  # receiver, sender, worker
    popen: subprocess.Popen
    log_file: Path
    reported: bool = False  # its exit has been reported

    def describe_exit(self) -> str:
        code = self.popen.returncode
        tail = ""
        try:
            lines = [ln for ln in self.log_file.read_text(errors="replace").splitlines() if ln.strip()]
            tail = f": {lines[-1][:200]}" if lines else ""
        except OSError:
            pass
        return f"{self.role} on {self.host} exited with code {code}{tail}"


def plan_pairs(topo: Topology, workload: str, seed: int) -> list[tuple[str, str]]:
    """The flows (src, dst) of a workload: who sends to whom."""
    if workload == "permutation":
        return derangement_across(topo, seed)
    if workload == "allreduce":
        ranks = ring_order(topo)
        return [(h, ranks[(i + 1) % len(ranks)]) for i, h in enumerate(ranks)]
    raise ValueError(f"unknown workload {workload!r}; choose one of {', '.join(WORKLOADS)}")


def ring_order(topo: Topology) -> list[str]:
    """Hosts in ring order, taking one host from each edge switch in turn: neighbours sit on
    different switches wherever there is more than one, so the ring's traffic crosses the fabric."""
    groups: dict[str, list[str]] = {}
    for h in topo.hosts:
        groups.setdefault(topo.host_switch(h.name)[0], []).append(h.name)
    queues = [sorted(v, key=natural_key) for _, v in sorted(groups.items(), key=lambda kv: natural_key(kv[0]))]
    order: list[str] = []
    while any(queues):
        for q in queues:
            if q:
                order.append(q.pop(0))
    return order


def stop_processes(procs: list[Proc], grace: float = 3.0) -> None:
    """SIGTERM each (the endpoints flush on it), then SIGKILL what is left; by process id only."""
    for p in procs:
        if p.popen.poll() is None:
            try:
                p.popen.send_signal(signal.SIGTERM)
            except OSError:
                pass
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.popen.wait(timeout=max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.popen.kill()
            p.popen.wait(timeout=5)


class Workload:
    """Processes of one workload in a running Fabric. Thread-safe: status() may run beside a restart."""

    def __init__(self, fab: Any, kind: str, policy: str, seed: int = 1, cc: str | None = None) -> None:
        if kind not in WORKLOADS:
            raise ValueError(f"unknown workload {kind!r}; choose one of {', '.join(WORKLOADS)}")
        self.fab = fab
        self.kind = kind
        self.policy = policy
        self.seed = seed
        # The congestion controller, for senders and receivers alike (credit needs both); None: the default.
        self.cc_args = ["--cc", cc] if cc else []
        self.pairs = plan_pairs(fab.topology, kind, seed)
        self.receivers: list[Proc] = []
        self.senders: list[Proc] = []
        self.restarts = 0
        self._lock = threading.Lock()
        # In the fabric's work directory where it has one: a killed run's logs go with its other leftovers.
        workdir = getattr(fab, "workdir", None)
        self.logdir = Path(tempfile.mkdtemp(prefix="live-" if workdir else "fabriclab-live-", dir=workdir))

    def _popen(self, host: str, role: str, cmd: list[str]) -> Proc:
        log_file = self.logdir / f"{role}-{host}-{self.restarts}.log"
        with open(log_file, "wb") as out:
            p = self.fab.host(host).popen(cmd, stdout=subprocess.DEVNULL, stderr=out, stdin=subprocess.DEVNULL)
        return Proc(host, role, p, log_file)

    def start(self) -> None:
        if self.kind == "permutation":
            for dst in sorted({d for _, d in self.pairs}, key=natural_key):
                cmd = command_line("srd", "recv", "--bind", self.fab.ip(dst), "--port", str(DEFAULT_PORT),
                                   *self.cc_args)
                self.receivers.append(self._popen(dst, "receiver", cmd))
            time.sleep(0.5)  # the receivers bind their sockets first (avoids ICMP unreachable noise)
        self._start_senders()

    def _start_senders(self) -> None:
        procs = []
        if self.kind == "permutation":
            for i, (src, dst) in enumerate(self.pairs):
                cmd = command_line("srd", "send", "--to", f"{self.fab.ip(dst)}:{DEFAULT_PORT}",
                                   *sender_args(self.policy),
                                   "--seed", str(self.seed * 1000 + i), "--base-port", str(DEFAULT_BASE_PORT + 16 * i),
                                   "--size", str(MESSAGE_SIZE), "--duration", str(FOREVER_S), *self.cc_args)
                procs.append(self._popen(src, "sender", cmd))
        else:
            ranks = [s for s, _ in self.pairs]
            peers = ",".join(f"{self.fab.ip(h)}:{DEFAULT_PORT}" for h in ranks)
            host_rate = host_rate_mbps(self.fab.topology)
            for r, h in enumerate(ranks):
                cmd = command_line("allreduce", "--rank", str(r), "--peers", peers,
                                   "--size", str(ALLREDUCE_ELEMENTS), "--iterations", str(ALLREDUCE_ITERATIONS),
                                   *sender_args(self.policy), "--seed", str(self.seed), "--timeout", "60",
                                   "--link-rate-mbps", f"{host_rate:g}", *self.cc_args)
                procs.append(self._popen(h, "worker", cmd))
        with self._lock:
            self.senders = procs

    def set_policy(self, policy: str) -> None:
        """Restart the senders (all workers for all-reduce) with the new --policy."""
        with self._lock:
            old = list(self.senders)
            self.senders = []
        stop_processes(old)
        self.policy = policy
        self.restarts += 1
        self._start_senders()

    def status(self) -> dict[str, Any]:
        with self._lock:
            procs = self.receivers + self.senders
        alive = sum(1 for p in procs if p.popen.poll() is None)
        exited = [p for p in procs if p.popen.returncode is not None]
        new = [p for p in exited if not p.reported]
        for p in new:
            p.reported = True
        return {
            "kind": self.kind, "policy": self.policy, "processes": len(procs), "alive": alive,
            "exited": [p.describe_exit() for p in exited][:20],
            "new_exits": [p.describe_exit() for p in new],
        }

    def stop(self) -> None:
        with self._lock:
            procs = self.senders + self.receivers
            self.senders, self.receivers = [], []
        stop_processes(procs)
        shutil.rmtree(self.logdir, ignore_errors=True)
