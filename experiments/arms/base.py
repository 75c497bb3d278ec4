"""What every kind of arm shares: the context its traffic runs in, the flows it carries, the `ArmKind`
interface (start, parse, describe, and what the results may expect of it) with the registry its
subclasses join, and the helpers that start endpoints inside the fabric's hosts.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from emulator.errors import EmulatorError
from experiments.analysis.framing import Framing
from experiments.model import Arm, Experiment, Workload
from topologies import Topology

log = logging.getLogger(__name__)

SERIES_BIN = 0.1  # seconds per goodput-series bin
# Seconds per bin of the finer series (`fine_series_bps`) each flow of an arm with faults also carries:
# recovering from a fault takes a few RTOs, tens of milliseconds, which 0.1 s bins cannot resolve.
FINE_BIN = 0.02
# How long endpoints may take to start (interpreter, imports, sockets) before the arm gives up.
READY_TIMEOUT_S = 60.0
# The transport's endpoints of an arm run in one process per role (`srd group`, transport/io/group.py):
# a process per host was woken for every packet of its flow, tens of ms apart, and paid for cold caches
# each time. FABRICLAB_ENDPOINT_GROUPS=0 runs a process per endpoint instead (to compare the two).
GROUPS_ENV = "FABRICLAB_ENDPOINT_GROUPS"

Procs = tuple[list[subprocess.Popen], list[subprocess.Popen]]  # (receivers, senders)


@dataclass
class Flow:
    src: str
    dst: str
    index: int  # position among the flows leaving `src` (source ports and iperf3 ports differ)
    size: int = 0  # this flow's bytes (a traffic matrix gives each its own); 0 = the arm's bytes_per_flow
    start_s: float = 0.0  # when it starts, in seconds after the traffic starts (a traffic matrix's start)


@dataclass
class ArmContext:
    """What one arm's traffic needs: the fabric, its flows, sizes and where to put files."""

    fab: Any
    exp: Experiment
    arm: Arm
    topo: Topology
    flows: list[Flow]
    duration: float
    seed: int
    bytes_per_flow: int
    raw_dir: Path
    workload: Workload = field(default_factory=Workload)
    procs: list[subprocess.Popen] = field(default_factory=list)
    t0: float = 0.0  # time.monotonic() when the traffic started
    fault_log: list[dict[str, Any]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)  # the arm is ending: no more starts


# --------------------------------------------------------------------------------------------------
# The kinds


_KINDS: dict[str, ArmKind] = {}


class ArmKind:
    """How one kind of arm carries its traffic and what its endpoints report.

    A subclass that sets `name` registers itself; a module in this package holding it is all that
    adding a kind takes (the package imports every module in it).
    """

    name: ClassVar[str]
    # How the arm carries its traffic, in a few words, with the Arm's fields in braces ("{mode}").
    description: ClassVar[str]
    # Its flows are src->dst transfers whose best rate and completion time the fabric defines: the arm
    # gets the fabric's ideal, sized flows a slowdown and the wire's efficiency, and a traffic matrix may
    # drive it. `framing` says how its endpoints cut bytes into packets.
    point_to_point: ClassVar[bool] = False
    # It runs the transport, whose receivers count out-of-order packets and reassembly.
    reports_reordering: ClassVar[bool] = False
    # Its endpoints always write flows, so an arm without any failed.
    flows_required: ClassVar[bool] = True
    # The least time the runner gives its senders before stopping them, whatever the duration.
    min_wait_s: ClassVar[float] = 0.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            _KINDS[cls.name] = cls()

    def describe(self, arm: Arm) -> str:
        """How the arm carries its traffic (results.json's `description`, without the faults)."""
        return self.description.format_map(vars(arm))

    def start(self, ctx: ArmContext) -> Procs:
        """Start the arm's endpoints in the fabric's hosts and set ctx.t0 when the traffic starts."""
        raise NotImplementedError

    def parse(self, raw: dict[str, Any], t0: float, n_bins: int) -> list[dict[str, Any]]:
        """The arm's flows from its endpoints' output (raw["endpoints"]), goodput series on the
        SERIES_BIN grid of `n_bins` bins from `t0`."""
        raise NotImplementedError

    def framing(self, flow: dict[str, Any]) -> Framing:
        """How this flow's endpoint cut its bytes into packets (point-to-point kinds)."""
        raise NotImplementedError

    def traffic_starts(self, raw: dict[str, Any], t0: float) -> float:
        """When (on the runner's clock, as t0) the arm's traffic really began: t0 for kinds that
        release their endpoints once all are ready; later for kinds that set up by themselves first."""
        return t0


def get(name: str) -> ArmKind:
    try:
        return _KINDS[name]
    except KeyError:
        raise KeyError(f"unknown arm kind {name!r}; known kinds: {', '.join(names())}") from None


def names() -> tuple[str, ...]:
    return tuple(_KINDS)


def describe(arm: Arm) -> str:
    """What an arm runs, in a few words (its kind's description), and its faults."""
    how = get(arm.kind).describe(arm)
    if arm.faults:
        how += "; " + ", ".join(f.describe() for f in arm.faults)
    return how


# --------------------------------------------------------------------------------------------------
# Starting endpoints in hosts


def popen(ctx: ArmContext, host: str, cmd: list[str], out_file: Path | None = None) -> subprocess.Popen:
    stdout = open(out_file, "wb") if out_file else subprocess.DEVNULL  # noqa: SIM115 - closed on reap
    try:
        p = ctx.fab.host(host).popen(cmd, stdout=stdout, stderr=subprocess.PIPE)
    finally:
        if out_file:
            stdout.close()
    ctx.procs.append(p)
    return p


def grouped(ctx: ArmContext) -> bool:
    """Whether this arm's endpoints share a process per role: when every host of its flows is on this
    machine (a namespace we can enter), unless GROUPS_ENV says not to."""
    if os.environ.get(GROUPS_ENV, "1") == "0":
        return False
    return all(ctx.fab.host_namespace(h) for f in ctx.flows for h in (f.src, f.dst))


def start_group(ctx: ArmContext, name: str, entries: list[tuple[str, list[str], float]],
                hold: bool) -> subprocess.Popen:
    """One `srd group` process for `entries` (host, its endpoint's command after `-m cli.endpoint`, i.e.
    `srd recv ...` or `srd send ...`, and its start offset after the release), each endpoint's sockets
    opened in its host's network namespace; started in the first host."""
    if any(argv[:1] != ["srd"] for _, argv, _ in entries):
        raise ValueError("a group holds `srd recv` and `srd send` endpoints only")
    spec = {"hold": hold, "endpoints": [
        {"argv": argv[1:], "netns": ctx.fab.host_namespace(host), "start_s": start}
        for host, argv, start in entries]}
    d = ctx.raw_dir / "groups"
    d.mkdir(exist_ok=True)
    path = d / f"{name}.json"
    path.write_text(json.dumps(spec, indent=1))
    from experiments.endpoints import command_line

    # Its last line (endpoints, CPU seconds, wake-ups) is kept beside the spec.
    return popen(ctx, entries[0][0], command_line("srd", "group", str(path)), out_file=d / f"{name}.out")


def release_group(ctx: ArmContext, ready: list[Path], group: subprocess.Popen) -> None:
    """`release_when_ready` for a held group: one SIGUSR1 once every endpoint is ready (t0); the group
    starts each sender at its own offset."""
    pids = wait_ready(ready, [group])
    ctx.t0 = time.monotonic()
    os.kill(pids[0], signal.SIGUSR1)


def ready_file(ctx: ArmContext, name: str) -> Path:
    d = ctx.raw_dir / "ready"
    d.mkdir(exist_ok=True)
    return d / name


def wait_ready(files: list[Path], procs: list[subprocess.Popen], timeout: float = READY_TIMEOUT_S) -> list[int]:
    """Wait until every endpoint has announced that its sockets are open; returns their pids (as the
    endpoints wrote them). An endpoint that exits first, or a timeout, is an error naming why."""
    deadline = time.monotonic() + timeout
    while True:
        if all(f.exists() for f in files):
            return [json.loads(f.read_text())["pid"] for f in files]
        for p in procs:
            if p.poll() is not None:
                err = p.stderr.read().decode(errors="replace").strip() if p.stderr else ""
                last = err.splitlines()[-1] if err else f"exit status {p.returncode}"
                raise EmulatorError(f"an endpoint exited before it was ready: {last}")
        if time.monotonic() > deadline:
            missing = sum(not f.exists() for f in files)
            raise EmulatorError(f"{missing} of {len(files)} endpoints were not ready after {timeout:.0f} s; "
                                "the machine may be overloaded")
        time.sleep(0.02)


def release_when_ready(ctx: ArmContext, ready: list[Path], senders: list[subprocess.Popen]) -> None:
    """Senders started with --hold wait with their sockets open; once all are ready the traffic starts
    (ctx.t0) and each is released (SIGUSR1) at its flow's start."""
    pids = wait_ready(ready, senders)
    ctx.t0 = time.monotonic()
    _start_on_schedule(ctx, [(f.start_s, partial(os.kill, pid, signal.SIGUSR1))
                             for f, pid in zip(ctx.flows, pids, strict=True)])


def _start_on_schedule(ctx: ArmContext, starts: list[tuple[float, Callable[[], None]]]) -> None:
    """Run each start at ctx.t0 + its offset: those due now at once, later ones from a thread that the
    arm's stop event ends (held senders that never get their signal exit on SIGTERM, sending nothing)."""
    starts = sorted(starts, key=lambda s: s[0])
    while starts and starts[0][0] <= 0:
        starts.pop(0)[1]()
    if not starts:
        return

    def run() -> None:
        for at, start in starts:
            if ctx.stop.wait(max(0.0, ctx.t0 + at - time.monotonic())):
                return
            try:
                start()
            except OSError as exc:  # the endpoint already ended: its own error is reported
                log.debug("late start failed: %s", exc)

    threading.Thread(target=run, daemon=True, name="fabriclab-starts").start()


# --------------------------------------------------------------------------------------------------
# Reading endpoints' output


def rebin(start: float | None, width: float, values: list[float], t0: float, n_bins: int,
          bin_s: float = SERIES_BIN) -> np.ndarray:
    """A rate series (bit/s per bin of `width` from `start`) on the grid of `n_bins` bins of `bin_s`
    (SERIES_BIN unless told) from t0; zeros when the series never started."""
    out = np.zeros(n_bins)
    if start is None:
        return out
    for i, v in enumerate(values):
        if not v:
            continue
        b0 = start + i * width - t0
        idx = int(b0 // bin_s)
        if 0 <= idx < n_bins:
            # bytes in this source bin land in the target bin that holds its start
            out[idx] += v * width / bin_s
    return out


def rounded_series(series: np.ndarray) -> list[float]:
    return [round(float(x), 1) for x in series]


def endpoint_files(raw: dict[str, Any], prefix: str) -> list[tuple[str, Any]]:
    """(name, output) of the arm's endpoint files named "<prefix><flow index>-...", by flow index."""
    endpoints = raw.get("endpoints", {})

    def index(name: str) -> tuple[int, str]:
        head = name[len(prefix):].split("-", 1)[0]
        return (int(head), name) if head.isdigit() else (1 << 30, name)

    return [(n, endpoints[n]) for n in sorted((n for n in endpoints if n.startswith(prefix)), key=index)]
