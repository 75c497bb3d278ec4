"""Records of what a running fabric created, so `fabriclab clean` can remove exactly that and nothing else.

Each fabric writes /run/fabriclab/<run-id>.json as it builds (before each resource is created, the record
names it), and deletes the file after a clean teardown. A record whose owning process is gone marks
leftovers of a run that crashed or was killed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from emulator.procs import pid_alive, process_start

log = logging.getLogger(__name__)

STATE_DIR = Path(os.environ.get("FABRICLAB_STATE_DIR", "/run/fabriclab"))
# OVS bridges we create carry this key in external_ids; nftables tables in the root namespace this prefix.
BRIDGE_MARK = "fabriclab-run"
NFT_PREFIX = "fabriclab_"
# Every process a fabric starts (node shells, daemons, endpoints, the controller) inherits this variable,
# set to the run's id while the fabric is up: a process started in an emulated host is not a child of the
# host's shell and outlives it, and once the run's process is killed nothing else leads to it.
RUN_ENV = "FABRICLAB_RUN_ID"


@dataclass
class RunState:
    run_id: str
    pid: int = field(default_factory=os.getpid)
    # When that process started (clock ticks since boot, /proc/PID/stat): a pid the kernel has given to
    # another process since is told from the run's own, which a record left by a killed run would
    # otherwise keep "active" for good. None in records written before it was kept.
    pid_start: int | None = field(default_factory=lambda: process_start(os.getpid()))
    started: float = field(default_factory=time.time)
    topology: str = ""
    bridges: list[str] = field(default_factory=list)
    interfaces: list[str] = field(default_factory=list)  # root-namespace interfaces (switch side of links)
    host_pids: list[int] = field(default_factory=list)
    controller_pid: int | None = None
    nft_tables: list[str] = field(default_factory=list)  # root-namespace netdev tables
    workdir: str | None = None
    # Per-switch Open vSwitch daemons (their pidfiles in workdir/ovs/ name them too, from the moment
    # each starts, so a run killed mid-start leaves nothing unfound).
    daemon_pids: list[int] = field(default_factory=list)
    # Cluster fabrics (emulator.cluster): the servers used; namespace servers' namespaces; ssh
    # processes (namespace servers' sshd, the controller's forwards, Mininet's tunnels).
    servers: list[str] = field(default_factory=list)
    netns: list[str] = field(default_factory=list)
    ssh_pids: list[int] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return STATE_DIR / f"{self.run_id}.json"

    def save(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(self.path)

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)

    @classmethod
    def load(cls, path: Path) -> RunState:
        return cls(**json.loads(path.read_text()))

    def runner_alive(self) -> bool:
        """Whether the process that wrote this record still runs (and is that process, not a later one
        that was given its pid)."""
        return pid_alive(self.pid, self.pid_start)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def kill_pid(pid: int, must_contain: str, timeout: float = 3.0) -> bool:
    """End a process we started, identified by pid, if its command line still shows it is ours."""
    if not pid_alive(pid) or must_contain not in _cmdline(pid):
        return False
    try:
        os.kill(pid, 15)
        deadline = time.monotonic() + timeout
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
            _reap(pid)
        if pid_alive(pid):
            os.kill(pid, 9)
            _reap(pid)
    except ProcessLookupError:
        pass
    return True


def tagged_pids(run_id: str) -> list[int]:
    """Processes started with RUN_ENV=run_id in their environment (the run's own), other than this one.
    The environment read is the one a process was started with: the runner's own, changed after its
    start, never matches."""
    entry = f"{RUN_ENV}={run_id}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            environ = (d / "environ").read_bytes()
        except OSError:
            continue
        if entry in environ.split(b"\0"):
            found.append(int(d.name))
    return found


def kill_tagged(run_id: str, spare: set[int] | frozenset[int] = frozenset()) -> list[str]:
    """SIGKILL every process the run started that is still there, but those in `spare`; returns what was
    killed."""
    killed = []
    for pid in tagged_pids(run_id):
        if pid in spare:
            continue
        what = _cmdline(pid)[:60].strip()
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            continue
        _reap(pid)
        killed.append(f"process {pid} ({what})" if what else f"process {pid}")
    return killed


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30)


def marked_bridges() -> dict[str, str]:
    """OVS bridges carrying our mark: name -> run id."""
    if not shutil.which("ovs-vsctl"):
        return {}
    out = _run(["ovs-vsctl", "--timeout=5", "--format=json", "--columns=name,external_ids", "list", "Bridge"])
    if out.returncode != 0:
        return {}
    found = {}
    for name, ext in json.loads(out.stdout).get("data", []):
        ids = dict(ext[1]) if isinstance(ext, list) and ext and ext[0] == "map" else {}
        if BRIDGE_MARK in ids:
            found[name] = ids[BRIDGE_MARK]
    return found


def our_nft_tables() -> list[str]:
    if not shutil.which("nft"):
        return []
    out = _run(["nft", "list", "tables", "netdev"])
    names = []
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "table" and parts[2].startswith(NFT_PREFIX):
            names.append(parts[2])
    return names


def interface_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def remove_run(state: RunState) -> list[str]:
    """Remove everything a run record names; returns what was removed."""
    removed: list[str] = []
    if state.controller_pid and kill_pid(state.controller_pid, "emulator.controller"):
        removed.append(f"controller process {state.controller_pid}")
    if state.netns:
        from emulator.cluster.nsservers import kill_members

        # Before the node shells go: their namespaces are how the run's processes are found.
        removed += kill_members(state.netns, state.host_pids)
    # With namespace servers every ssh process of the run names its work directory (-F, -f).
    ssh_mark = state.workdir if state.netns and state.workdir else "ssh"
    for pid in state.ssh_pids:
        if kill_pid(pid, ssh_mark, timeout=2.0):
            removed.append(f"ssh process {pid}")
    if state.workdir:
        from emulator.ovs_daemons import all_daemon_pids, stop_daemons

        pids = sorted(set(state.daemon_pids) | set(all_daemon_pids(state.workdir)))
        for pid in stop_daemons(pids, must_contain=state.workdir):
            removed.append(f"Open vSwitch daemon {pid}")
    # Whatever else the run started and is still running (endpoints, iperf3, the user's own commands in
    # a host): it keeps a host's namespace, and its sockets, open.
    removed += kill_tagged(state.run_id, spare=set(state.host_pids))
    for pid in state.host_pids:
        if kill_pid(pid, "mininet:", timeout=1.0):
            removed.append(f"host shell {pid}")
    for br in state.bridges:
        if _run(["ovs-vsctl", "--timeout=5", "br-exists", br]).returncode == 0:
            _run(["ovs-vsctl", "--timeout=5", "--if-exists", "del-br", br])
            removed.append(f"bridge {br}")
        if interface_exists(br):
            _run(["ip", "link", "del", br])
    if state.netns:
        from emulator.cluster.nsservers import remove_namespaces

        removed += remove_namespaces(state.netns)
    for table in state.nft_tables:
        if _run(["nft", "delete", "table", "netdev", table]).returncode == 0:
            removed.append(f"nftables table {table}")
    for intf in state.interfaces:
        if interface_exists(intf):
            _run(["ip", "link", "del", intf])
            removed.append(f"interface {intf}")
    if state.workdir and Path(state.workdir).is_dir():
        shutil.rmtree(state.workdir, ignore_errors=True)
    state.discard()
    return removed


def clean(force: bool = False) -> tuple[list[str], list[str]]:
    """Remove leftovers of runs whose process is gone (all runs with force).

    Returns (removed items, runs skipped because they are still active).
    """
    removed: list[str] = []
    skipped: list[str] = []
    active: set[str] = set()
    if STATE_DIR.is_dir():
        for path in sorted(STATE_DIR.glob("*.json")):
            try:
                state = RunState.load(path)
            except (OSError, ValueError, TypeError):
                path.unlink(missing_ok=True)
                continue
            if state.runner_alive() and state.pid != os.getpid() and not force:
                skipped.append(f"run {state.run_id} (pid {state.pid}) is still active")
                active.add(state.run_id)
                continue
            removed += remove_run(state)
    # Bridges and tables whose record was lost: found by our own mark and prefix.
    for br, run_id in marked_bridges().items():
        if run_id in active:
            continue
        _run(["ovs-vsctl", "--timeout=5", "--if-exists", "del-br", br])
        if interface_exists(br):
            _run(["ip", "link", "del", br])
        removed.append(f"bridge {br}")
    if not active:
        for table in our_nft_tables():
            _run(["nft", "delete", "table", "netdev", table])
            removed.append(f"nftables table {table}")
    return removed, skipped


def active_runs() -> list[RunState]:
    runs = []
    if STATE_DIR.is_dir():
        for path in sorted(STATE_DIR.glob("*.json")):
            try:
                state = RunState.load(path)
            except (OSError, ValueError, TypeError):
                continue
            if state.runner_alive():
                runs.append(state)
    return runs
