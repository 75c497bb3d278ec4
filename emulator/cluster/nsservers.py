"""Servers made of namespaces: stand-ins for real machines, so a cluster fabric can be built and tested
on one machine.

A namespace server is a network namespace joined to the others by a private underlay (a bridge in the
root namespace, 10.99.0.0/24 by default: this machine .1, server N .N+1) plus a mount namespace of its
own, in which

- a tmpfs over /run gives it its own /run/sshd and /run/openvswitch (the latter a bind mount of
  `<dir>/ovs`, so its pidfiles and sockets stay visible from this machine);
- its sshd runs with a host key and an authorised key made for the run, listening on its underlay
  address only, with `PermitTunnel yes` for Mininet's ssh-tunnel links;
- its own ovsdb-server and ovs-vswitchd run, started over ssh with the same commands a per-switch
  instance uses (emulator.ovs_daemons.start_commands), at the default socket paths, so Mininet's
  `RemoteOVSSwitch` drives it with plain `ovs-vsctl` as it would a real server's.

Nothing listens outside the underlay: sshd binds its underlay address; the underlay bridge has no
uplink. Everything made is named in the run's record before it is made (emulator.state), and removed
by name and by pid, never by program name.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from emulator.errors import EmulatorError
from emulator.ovs_daemons import daemon_pids, start_commands

log = logging.getLogger(__name__)

UNDERLAY_NET = ipaddress.ip_network("10.99.0.0/24")
UNDERLAY_BRIDGE = "flc-ul"
MAX_SERVERS = 32
SSH_USER = "root"
# The default paths plain ovs-vsctl and ovs-ofctl use on a server.
OVS_RUNDIR = "/run/openvswitch"


@dataclass
class NamespaceServer:
    index: int  # 1-based
    netns: str
    address: str
    veth: str  # root-namespace end of its underlay link
    dir: Path
    sshd_pid: int | None = None

    @property
    def ovs_dir(self) -> Path:
        return self.dir / "ovs"

    def mgmt_socket(self, bridge: str) -> str:
        """What ovs-ofctl on this machine takes to reach a bridge of this server's Open vSwitch."""
        return f"unix:{self.ovs_dir / bridge}.mgmt"


@dataclass
class SshIdentity:
    """The keys and the ssh client configuration made for one run."""

    dir: Path

    @property
    def config(self) -> Path:
        return self.dir / "config"

    @property
    def key(self) -> Path:
        return self.dir / "id"

    @property
    def host_key(self) -> Path:
        return self.dir / "host"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def authorized_keys(self) -> Path:
        return self.dir / "authorized_keys"

    def make(self, addresses: list[str]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o700)
        for key in (self.key, self.host_key):
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fabriclab-run", "-f", str(key)],
                 what="making an ssh key for the run")
        self.authorized_keys.write_text(Path(f"{self.key}.pub").read_text())
        host_pub = " ".join(Path(f"{self.host_key}.pub").read_text().split()[:2])
        self.known_hosts.write_text("".join(f"{a} {host_pub}\n" for a in addresses))
        patterns = " ".join(addresses)
        self.config.write_text(
            f"Host {patterns}\n"
            f"  User {SSH_USER}\n"
            f"  IdentityFile {self.key}\n"
            "  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {self.known_hosts}\n"
            "  StrictHostKeyChecking yes\n"
            "  BatchMode yes\n"
            "  LogLevel ERROR\n"
            "  ConnectTimeout 5\n"
        )


def server_plan(n: int, workdir: Path, run_tag: str) -> list[NamespaceServer]:
    """Names and addresses of n namespace servers (nothing is made)."""
    if not 1 <= n <= MAX_SERVERS:
        raise EmulatorError(f"ns:{n}: make between 1 and {MAX_SERVERS} namespace servers")
    hosts = list(UNDERLAY_NET.hosts())
    return [NamespaceServer(index=i, netns=f"flc-{run_tag}-s{i}", address=str(hosts[i]), veth=f"flc-ul{i}",
                            dir=workdir / "servers" / f"s{i}") for i in range(1, n + 1)]


def underlay_gateway() -> str:
    return str(next(UNDERLAY_NET.hosts()))


def check_underlay_free() -> None:
    """The underlay's subnet and names must not be in use on this machine."""
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            addr = ipaddress.ip_interface(parts[parts.index("inet") + 1])
            if addr.network.overlaps(UNDERLAY_NET):
                raise EmulatorError(
                    f"{UNDERLAY_NET} (the namespace servers' underlay) is in use on {parts[1]}; if an earlier "
                    "run left it, run 'fabriclab clean'")
    if Path(f"/sys/class/net/{UNDERLAY_BRIDGE}").exists():
        raise EmulatorError(f"interface {UNDERLAY_BRIDGE} already exists; if an earlier run left it, run "
                            "'fabriclab clean'")


def make_underlay(servers: list[NamespaceServer]) -> None:
    gateway = f"{underlay_gateway()}/{UNDERLAY_NET.prefixlen}"
    _ip("link", "add", UNDERLAY_BRIDGE, "type", "bridge")
    _ip("addr", "add", gateway, "dev", UNDERLAY_BRIDGE)
    _ip("link", "set", UNDERLAY_BRIDGE, "up")
    for s in servers:
        _run(["ip", "netns", "add", s.netns], what=f"making namespace {s.netns}")
        _ip("link", "add", s.veth, "type", "veth", "peer", "name", "underlay", "netns", s.netns)
        _ip("link", "set", s.veth, "master", UNDERLAY_BRIDGE, "up")
        # IPv6 off, as on every emulated node: its chatter would cross the fabric's switches.
        _run(["ip", "netns", "exec", s.netns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
              "net.ipv6.conf.default.disable_ipv6=1"], what=f"configuring {s.netns}")
        for args in (["link", "set", "lo", "up"], ["link", "set", "underlay", "up"],
                     ["addr", "add", f"{s.address}/{UNDERLAY_NET.prefixlen}", "dev", "underlay"]):
            _run(["ip", "-n", s.netns, *args], what=f"configuring {s.netns}")


def sshd_config(s: NamespaceServer, ident: SshIdentity) -> str:
    return "\n".join([
        f"ListenAddress {s.address}",
        f"HostKey {ident.host_key}",
        f"AuthorizedKeysFile {ident.authorized_keys}",
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "PermitTunnel yes",
        "AllowTcpForwarding yes",
        "StrictModes no",
        "UseDNS no",
        # Mininet opens a session per remote node and per command; the defaults (10 unauthenticated
        # connections) would drop some of them while a fabric comes up.
        "MaxStartups 200",
        "MaxSessions 200",
        f"PidFile {s.dir / 'sshd.pid'}",
        "",
    ])


def start_sshd(s: NamespaceServer, ident: SshIdentity) -> int:
    """Start the server's sshd inside its namespaces; returns its pid once it answers."""
    s.ovs_dir.mkdir(parents=True, exist_ok=True)
    config = s.dir / "sshd_config"
    config.write_text(sshd_config(s, ident))
    inside = " && ".join([
        "mount -t tmpfs -o mode=755 fabriclab-run /run",
        f"mkdir -p /run/sshd {OVS_RUNDIR}",
        f"mount --bind {shlex.quote(str(s.ovs_dir))} {OVS_RUNDIR}",
        f"exec /usr/sbin/sshd -D -e -f {shlex.quote(str(config))}",
    ])
    log_file = open(s.dir / "sshd.log", "ab")  # noqa: SIM115 - the daemon keeps it
    # ip netns exec and unshare exec in turn, so the pid is sshd's.
    proc = subprocess.Popen(["ip", "netns", "exec", s.netns, "unshare", "--mount", "--propagation", "private",
                             "sh", "-c", inside], stdout=log_file, stderr=log_file, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    log_file.close()
    s.sshd_pid = proc.pid
    return proc.pid


def wait_sshd(s: NamespaceServer, ident: SshIdentity, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        r = subprocess.run(["ssh", "-F", str(ident.config), s.address, "true"], capture_output=True, text=True,
                           timeout=timeout)
        if r.returncode == 0:
            return
        last = r.stderr.strip()
        time.sleep(0.1)
    tail = (s.dir / "sshd.log").read_text(errors="replace").strip()[-300:]
    raise EmulatorError(f"namespace server {s.address}: sshd did not answer in {timeout:.0f} s "
                        f"({last or tail or 'no output'})")


def start_ovs(s: NamespaceServer, ident: SshIdentity) -> list[int]:
    """Start the server's own Open vSwitch over ssh, as a user would on a real server; returns its pids."""
    d = str(s.ovs_dir)
    script = " && ".join(start_commands(d, db_socket=f"{OVS_RUNDIR}/db.sock"))
    r = subprocess.run(["ssh", "-F", str(ident.config), s.address, script], capture_output=True, text=True,
                       timeout=60)
    pids = list(daemon_pids(d).values())
    if r.returncode != 0:
        raise EmulatorError(f"namespace server {s.address}: Open vSwitch did not start: "
                            f"{(r.stderr or r.stdout).strip()[-300:]}")
    return pids


def _netns_inode(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def kill_members(netns: list[str], shell_pids: list[int], servers_too: bool = True) -> list[str]:
    """SIGKILL every process of the run's namespace servers: those in a server's own network namespace
    (ip netns pids) and those sharing a node shell's (what the runs started in emulated hosts). A
    process started over ssh does not die with its ssh client, and a namespace outlives its deletion while
    a process holds it, so they are found by namespace, which only the run's own processes share.
    Without `servers_too`, only what runs beside the node shells, not the shells themselves nor the
    servers' sshd and Open vSwitch (a fabric still being torn down needs them)."""
    inodes = {i for pid in shell_pids if (i := _netns_inode(pid)) is not None}
    # A switch's shell on a server is in the server's own namespace: that one is never a host's.
    server_inodes = set()
    for name in netns:
        try:
            server_inodes.add(os.stat(f"/run/netns/{name}").st_ino)
        except OSError:
            pass
    if not servers_too:
        inodes -= server_inodes
    targets: set[int] = set()
    for name in netns if servers_too else []:
        out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout
        targets.update(int(p) for p in out.split() if p.isdigit())
    if inodes:
        for d in Path("/proc").iterdir():
            if d.name.isdigit() and _netns_inode(int(d.name)) in inodes:
                targets.add(int(d.name))
    targets.discard(os.getpid())
    if not servers_too:
        targets -= set(shell_pids)
    killed = []
    for pid in sorted(targets):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(f"process {pid} in a namespace server")
        except ProcessLookupError:
            pass
    return killed


def remove_namespaces(names: list[str]) -> list[str]:
    removed = []
    existing = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    for name in names:
        if name in existing:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            removed.append(f"namespace {name}")
    return removed


def _ip(*args: str) -> None:
    _run(["ip", *args], what="building the namespace servers' underlay")


def _run(cmd: list[str], what: str) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise EmulatorError(f"{what} failed: {' '.join(cmd)}: {r.stderr.strip()[-300:]}")
