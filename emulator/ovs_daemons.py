"""The private Open vSwitch daemons of per-switch fabrics: where each instance keeps its files, which
processes are its, and how to stop them by the pids they recorded (never by program name).

An instance's directory is `<run workdir>/ovs/<switch>/`: database, sockets, pidfiles and logs.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from emulator.procs import pid_alive
from transport.core.headers import ETHERNET_HEADER

DAEMONS = ("ovs-vswitchd", "ovsdb-server")
# Switches look for a restarted controller every second at most (OVS backs off to 8 s by default).
RECONNECT_MS = 1000
OVS_SCHEMA = Path("/usr/share/openvswitch/vswitch.ovsschema")
# A fabric holds many daemons, most idle at any moment: their periodic work adds up (fat-tree k=4,
# 20 daemons: 0.021 cores idle by default, 0.006 with these). Rule changes still revalidate the
# datapath's flows at once; only the periodic sweep (idle expiry, flow statistics) and the database's
# interface statistics, which nothing here reads, come less often.
IDLE_TUNING = "other_config:max-revalidator=10000 other_config:stats-update-interval=60000"
# Each time the userspace datapath polls a port it allocates a burst of 32 receive buffers of the
# port's MTU (9 kB each in jumbo frames) and frees those the read did not fill. In a daemon's small
# heap that burst sits at the top, so glibc's default trim threshold (128 kB) hands it back to the
# kernel on every free and the next poll faults it in again: page faults were most of a traversal's
# cost (4x4x4 leaf-spine: 740 µs per traversal by default, 216 µs with the heap kept). Kept heap: the
# daemon's peak, a few MB.
HEAP_ENV = "MALLOC_TRIM_THRESHOLD_=268435456"
# ... and glibc's malloc itself costs: those buffers (1.5 or 9 kB) are above its per-thread cache, and
# malloc and free were 12 % of a leaf daemon's CPU. tcmalloc keeps them in per-size free lists: a
# traversal cost 10-17 % less, turn about with glibc on this machine (demo fabric 154-168 against 189-203
# µs, 4x4x4 jumbo 234 against 264; jemalloc was no better than glibc). `make setup` installs it; the path
# is resolved by the shell that starts the daemon, so where the library is missing (a remote server
# without it) the daemon runs on glibc, with the kept heap above.
TCMALLOC = "/usr/lib/*/libtcmalloc_minimal.so.4"
# pollskip (emulator/native/pollskip.c, built by `make setup` into the venv) answers the reads a wake-up
# makes on descriptors its poll() found empty: ~15 of a leaf's ~23 system calls per wake-up (demo
# fabric: 147-162 against 180-185 µs per traversal, turn about). FABRICLAB_POLLSKIP=0 leaves it out.
POLLSKIP = Path(sys.prefix) / "lib" / "fabriclab-pollskip.so"
POLLSKIP_ENV = "FABRICLAB_POLLSKIP"
# pollskip also answers the daemon's main-loop poll() from an epoll set kept in step with what it asks
# about: poll() re-armed a wait-queue entry on each of a leaf's ~20 descriptors at every wake-up, ~12 %
# of its CPU. FABRICLAB_POLLSKIP_EPOLL=0 (passed on to the daemons) leaves poll() to the kernel.
POLLSKIP_EPOLL_ENV = "FABRICLAB_POLLSKIP_EPOLL"
# Wake-up moderation: a switch's traffic arrives paced, one packet per wake-up, and each wake-up runs the
# whole of the daemon's loop. So while packets come densely, a daemon's wait first sleeps a little
# (pollskip's linger) and then forwards in one turn what came meanwhile: at most LINGER_FRACTION of a full
# frame's time on its fastest link, so that the delay it adds per hop (half the linger on average) stays a
# small part of what the link's own serialisation adds, as the endpoint groups' does (transport/io/group.py).
# Measured on the 4x4x4 leaf-spine at 1500 bytes and 1.41 Mb/s, turn about, lingering after each wake-up
# for an eighth of a frame time: OVS 289-311 µs per delivered packet without, 213-220 with, goodput and
# slowdowns unchanged. Sleeping a quarter of a frame before the wait instead (pollskip.c says why), at
# 2.83 Mb/s: OVS 169-177 -> 160-165 µs per delivered packet. A packet now waits an eighth of a frame on
# average (as long as the packet that woke a lingering daemon did) and a quarter at most (an eighth before).
# FABRICLAB_POLLSKIP_LINGER_US in the runner's environment overrides the figure for every switch (0: off).
# LINGER_MAX_US was 4 ms: at 1 Mb/s in jumbo frames (72 ms) that is an eighteenth of a frame, and the k=8
# fat-tree's daemons still woke for nearly every packet. With the quarter (18 ms), the endpoint groups'
# linger raised alike and ACKs held a quarter of the base RTT, its sprayed permutation at 1 Mb/s went
# from 1.8-2.0 % to 51-52 % CPU idle at its worst sample, at the same goodput (0.934-0.935 of ideal).
POLLSKIP_LINGER_ENV = "FABRICLAB_POLLSKIP_LINGER_US"
LINGER_FRACTION = 1 / 4
LINGER_MAX_US = 20000
LINGER_MIN_US = 100


def linger_us(rates_mbps: Iterable[float], mtu: int) -> int:
    """How long (µs) a switch's daemon sleeps before each wait while packets come densely, given its
    links' rates: LINGER_FRACTION of a full frame's time on the fastest, at most LINGER_MAX_US; 0 when
    a link is unshaped (rate 0) or the figure is under LINGER_MIN_US."""
    rates = list(rates_mbps)
    if not rates or min(rates) <= 0:
        return 0
    frame_us = (mtu + ETHERNET_HEADER) * 8 / max(rates)  # Mb/s is bits per µs
    us = min(LINGER_MAX_US, int(frame_us * LINGER_FRACTION))
    return us if us >= LINGER_MIN_US else 0


def pollskip_path() -> Path | None:
    """The built pollskip library, or None when it is not built or FABRICLAB_POLLSKIP=0."""
    if os.environ.get(POLLSKIP_ENV, "1") == "0" or not POLLSKIP.is_file():
        return None
    return POLLSKIP


def daemon_env(linger: int = 0) -> str:
    """The environment ovs-vswitchd starts with: the kept heap, tcmalloc (where installed: resolved by the
    shell that starts it) and pollskip (where built), lingering `linger` µs (see linger_us) unless the
    runner's environment says otherwise."""
    preload = f"$(ls {TCMALLOC} 2>/dev/null | head -n 1)"
    skip = pollskip_path()
    env = HEAP_ENV
    if skip is not None and not set(str(skip)) & set('"$`\\: '):  # it goes inside double quotes
        preload += f":{skip}"
        if os.environ.get(POLLSKIP_EPOLL_ENV, "1") == "0":
            env += f" {POLLSKIP_EPOLL_ENV}=0"
        override = os.environ.get(POLLSKIP_LINGER_ENV, "")
        if override.isdigit():
            linger = int(override)
        if linger > 0:
            env += f" {POLLSKIP_LINGER_ENV}={linger}"
    return f'{env} LD_PRELOAD="{preload}"'


def start_commands(directory: str, db_socket: str, linger: int = 0) -> list[str]:
    """Shell steps (to join with &&) that start one private instance: a fresh database, ovsdb-server
    serving it on `db_socket`, and ovs-vswitchd, with pidfiles, control sockets and logs in
    `directory`. Every daemon's command line names `directory`, which is how stop_daemons knows it.
    Used by per-switch instances and by namespace servers (emulator.cluster.nsservers)."""
    d = shlex.quote(directory)
    db = shlex.quote(db_socket)
    common = "--detach --no-chdir"
    return [
        f"mkdir -p {d}",
        f"ovsdb-tool create {d}/conf.db {shlex.quote(str(OVS_SCHEMA))}",
        f"ovsdb-server {d}/conf.db --remote=punix:{db} --pidfile={d}/ovsdb-server.pid "
        f"--unixctl={d}/ovsdb-server.ctl --log-file={d}/ovsdb-server.log {common}",
        f"ovs-vsctl --db=unix:{db} --no-wait init -- set Open_vSwitch . {IDLE_TUNING}",
        f"{daemon_env(linger)} ovs-vswitchd unix:{db} --pidfile={d}/ovs-vswitchd.pid --unixctl={d}/ovs-vswitchd.ctl "
        f"--log-file={d}/ovs-vswitchd.log {common}",
    ]


def instance_dir(workdir: Path | str, switch: str) -> Path:
    return Path(workdir) / "ovs" / switch


def daemon_pids(directory: Path | str) -> dict[str, int]:
    """The daemons' pids from their pidfiles in one instance directory (those that wrote one)."""
    pids = {}
    for name in DAEMONS:
        try:
            pids[name] = int((Path(directory) / f"{name}.pid").read_text().strip())
        except (OSError, ValueError):
            continue
    return pids


def all_daemon_pids(workdir: Path | str) -> list[int]:
    """Every private daemon's pid recorded under a run's work directory."""
    root = Path(workdir) / "ovs"
    if not root.is_dir():
        return []
    return [pid for d in sorted(root.iterdir()) for pid in daemon_pids(d).values()]


def vswitchd_pids(workdir: Path | str) -> list[int]:
    root = Path(workdir) / "ovs"
    if not root.is_dir():
        return []
    return [p for d in sorted(root.iterdir()) if (p := daemon_pids(d).get("ovs-vswitchd"))]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def stop_daemons(pids: Iterable[int], must_contain: str, timeout: float = 5.0) -> list[int]:
    """SIGTERM every listed daemon whose command line still names `must_contain` (its own instance
    directory, so a recycled pid is never hit), wait for all together, SIGKILL what is left.
    Returns the pids that were ours and running."""
    ours = [pid for pid in pids if must_contain in _cmdline(pid)]
    for pid in ours:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    left = list(ours)
    while left and time.monotonic() < deadline:
        # Detached daemons are init's to reap: pid_alive takes a zombie for gone.
        left = [pid for pid in left if pid_alive(pid)]
        if left:
            time.sleep(0.02)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return ours
