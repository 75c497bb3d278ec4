"""A fabric split across servers with Mininet's cluster engine (mininet/examples/cluster.py).

    with ClusterFabric(topo, servers=parse_servers("ns:2"), mode="spray") as fab: ...

`servers` is either real machines (`host1,host2`: reached with the user's own ssh configuration, each
running Open vSwitch already, passwordless sudo, the same fabriclab and Mininet versions: checked
before anything is built) or `ns:N`, N servers made of namespaces on this machine
(emulator.cluster.nsservers), each with its own sshd and Open vSwitch, which is how the cluster is
tested on one machine.

Placement (emulator.cluster.placement) keeps a leaf or edge switch on one server with its hosts, so only
fabric links cross servers; those are Mininet's ssh-tunnel links (`ssh -w`, tap devices at both ends:
this kernel has no GRE). A tunnel carries Ethernet frames inside ssh over TCP, 14 bytes of Ethernet
header plus ssh's framing, so the fabric's MTU stays whatever the tap carries (tap devices take
jumbo frames; TCP segments them on the underlay).

The controller runs on this machine, bound to 127.0.0.1 as always; every remote server reaches it
through an ssh reverse forward (`-R 127.0.0.1:P:127.0.0.1:P`), so the control channel is the cluster's
own ssh connections and nothing listens on a network.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from emulator.cluster import nsservers
from emulator.cluster.placement import crossing_links, place
from emulator.errors import EmulatorError
from emulator.network import PRIVATE_DAEMONS, Fabric, ignore_hangup
from emulator.ovs_daemons import RECONNECT_MS, daemon_pids
from emulator.state import BRIDGE_MARK, active_runs
from topologies.model import KERNEL_MTU

log = logging.getLogger(__name__)

LOCAL = "localhost"


@dataclass(frozen=True)
class ServersSpec:
    """What --servers asked for: N namespace servers, or named machines."""

    namespace_servers: int = 0
    hosts: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return f"ns:{self.namespace_servers}" if self.namespace_servers else ",".join(self.hosts)


def parse_servers(text: str) -> ServersSpec:
    """'ns:N' or 'host[,host...]' ('localhost' places nodes on this machine too)."""
    text = text.strip()
    if text.startswith("ns:"):
        try:
            n = int(text[3:])
        except ValueError:
            raise EmulatorError(f"--servers {text}: after 'ns:' give a number of namespace servers, "
                                "e.g. ns:2") from None
        if not 1 <= n <= nsservers.MAX_SERVERS:
            raise EmulatorError(f"--servers {text}: make between 1 and {nsservers.MAX_SERVERS} namespace servers")
        return ServersSpec(namespace_servers=n)
    hosts = tuple(h.strip() for h in text.split(",") if h.strip())
    if not hosts:
        raise EmulatorError("--servers: give 'ns:N' or a comma-separated list of hosts")
    for h in hosts:
        if not all(c.isalnum() or c in ".-_:@" for c in h):
            raise EmulatorError(f"--servers: '{h}' is not a host name or address")
    if len(set(hosts)) != len(hosts):
        raise EmulatorError("--servers: a host is listed twice")
    return ServersSpec(hosts=hosts)


@dataclass
class ClusterFabric(Fabric):
    """A Fabric whose nodes run on several servers; the same interface as Fabric."""

    servers: ServersSpec = field(default_factory=lambda: ServersSpec(namespace_servers=2))
    ns_servers: list[nsservers.NamespaceServer] = field(default_factory=list)
    placement: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.isolation in PRIVATE_DAEMONS:
            raise EmulatorError("a cluster fabric runs one Open vSwitch per server; drop --switch-daemons")
        self.isolation = "shared"
        self.ssh_config: str | None = None
        self._forwards: dict[str, subprocess.Popen] = {}
        self._made_dirs: list[Path] = []

    # -- servers -------------------------------------------------------------------------------
    @property
    def server_names(self) -> list[str]:
        if self.servers.namespace_servers:
            return [s.address for s in self.ns_servers]
        return list(self.servers.hosts)

    def _ns_server(self, name: str) -> nsservers.NamespaceServer | None:
        return next((s for s in self.ns_servers if s.address == name), None)

    def server_of(self, node: str) -> str:
        return self.placement[node]

    def _remote(self, node: str) -> bool:
        return self.placement.get(node, LOCAL) != LOCAL

    def host_namespace(self, name: str) -> str | None:
        return None if self._remote(name) else super().host_namespace(name)

    def _before_build(self) -> None:
        assert self.state is not None and self.workdir is not None
        if self.servers.namespace_servers:
            self._make_namespace_servers()
        else:
            for host in self.servers.hosts:
                if host != LOCAL:
                    check_server(host)
        self.placement = place(self.topology, self.server_names)
        underlay = [nsservers.UNDERLAY_BRIDGE, *(s.veth for s in self.ns_servers)] if self.ns_servers else []
        self.state.interfaces = self._root_interfaces() + underlay
        self.state.servers = self.server_names
        self.state.save()
        log.info("placement over %d servers; %d links cross servers", len(self.server_names),
                 len(crossing_links(self.topology, self.placement)))

    def _make_namespace_servers(self) -> None:
        assert self.state is not None and self.workdir is not None
        nsservers.check_underlay_free()
        servers = nsservers.server_plan(self.servers.namespace_servers, self.workdir, self.state.run_id[-6:])
        ident = nsservers.SshIdentity(self.workdir / "ssh")
        ident.make([s.address for s in servers])
        self.ssh_config = str(ident.config)
        self.state.netns = [s.netns for s in servers]
        self.state.interfaces += [s.veth for s in servers] + [nsservers.UNDERLAY_BRIDGE]
        self.state.save()
        nsservers.make_underlay(servers)
        for s in servers:
            pid = nsservers.start_sshd(s, ident)
            self.state.ssh_pids.append(pid)
        self.state.save()
        for s in servers:
            nsservers.wait_sshd(s, ident)
            self.state.daemon_pids += nsservers.start_ovs(s, ident)
            self.state.save()
        self.ns_servers = servers

    def ssh(self, server: str, command: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        """Run a shell command on a server (its root namespace)."""
        return subprocess.run([*ssh_command(server, self.ssh_config), command], capture_output=True, text=True,
                              timeout=timeout)

    # -- bring-up hooks ------------------------------------------------------------------------
    def _root_interfaces(self) -> list[str]:
        names = []
        for lk in self.topology.links:
            for end in (lk.a, lk.b):
                if self.topology.node(end).is_switch and not self._remote(end):
                    names.append(lk.intf(end))
        return names

    def _in_root_namespace(self, node_name: str) -> bool:
        return self.topology.node(node_name).is_switch and not self._remote(node_name)

    def _runner_for(self, node_name: str):
        if self._in_root_namespace(node_name):
            return super()._runner_for(node_name)
        from emulator.network import _host_runner

        return partial(_host_runner, self.net[node_name])

    def _check_no_clash(self) -> None:
        others = [r for r in active_runs() if r.pid != os.getpid()]
        if others:
            r = others[0]
            raise EmulatorError(f"another fabric ({r.topology}, run {r.run_id}) is running as pid {r.pid}; "
                                "stop it first")

    def _build_mininet(self) -> None:
        from mininet.examples.cluster import MininetCluster
        from mininet.log import setLogLevel

        from emulator.cluster.nodes import ClusterHost, ClusterLink, ClusterOVSSwitch

        setLogLevel("error" if log.getEffectiveLevel() > logging.DEBUG else "info")
        assert self.state is not None
        _hangups_reach_node_shells()
        ssh_dir = Path(os.environ.get("HOME", "/root")) / ".ssh"
        # MininetCluster makes ~/.ssh/mn (for ssh control sockets, unused here): remove what it made.
        self._made_dirs = [d for d in (ssh_dir / "mn", ssh_dir) if not d.exists()]
        user = "root" if self.servers.namespace_servers else None
        extra = {"ssh_config": self.ssh_config}
        switch_cls = partial(ClusterOVSSwitch, datapath=self.datapath, protocols="OpenFlow13",
                             failMode="secure", inband=False, **extra)
        host_cls = partial(ClusterHost, **extra)
        params: dict[str, Any] = dict(topo=None, build=False, controller=None, autoSetMacs=False,
                                      autoStaticArp=False, switch=switch_cls, host=host_cls, link=ClusterLink,
                                      waitConnected=False, servers=[LOCAL, *self.server_names],
                                      precheck=False)
        if user:
            params["user"] = user
        net = self.net = MininetCluster(**params)
        for node in self.topology.nodes:
            server = self.placement[node.name]
            if node.is_switch:
                net.addSwitch(node.name, dpid=f"{node.dpid:016x}", server=server, user=user)
            else:
                net.addHost(node.name, ip=node.ip, mac=node.mac, server=server, user=user)
            self.state.host_pids.append(net[node.name].pid)
            self.state.save()
        for lk in self.topology.links:
            net.addLink(lk.a, lk.b, port1=lk.a_port, port2=lk.b_port)
            link = net.links[-1]
            pid = link.tunnel_pid()
            if pid:
                self.state.ssh_pids.append(pid)
                self.state.save()
        net.build()

    def _start_switches(self) -> None:
        assert self.controller is not None and self.state is not None
        self.net.start()
        port = self.controller.of_port
        for server in self.server_names:
            if server == LOCAL:
                continue
            self._forward_controller(server, port)
        by_server: dict[str, list[str]] = {}
        for s in self.topology.switches:
            by_server.setdefault(self.placement[s.name], []).append(s.name)
        for server, names in by_server.items():
            cmd = ["ovs-vsctl", "--timeout=30"]
            for name in names:
                cmd += ["--", "set-controller", name, f"tcp:127.0.0.1:{port}",
                        "--", "set", "controller", name, f"max_backoff={RECONNECT_MS}",
                        "--", "set", "bridge", name, f"external_ids:{BRIDGE_MARK}={self.state.run_id}"]
            if self.topology.mtu != KERNEL_MTU:
                for lk in self.topology.links:
                    for end in (lk.a, lk.b):
                        if end in names:
                            cmd += ["--", "set", "Interface", lk.intf(end), f"mtu_request={self.topology.mtu}"]
            out = self.net[names[0]].cmd(" ".join(shlex.quote(c) for c in cmd) + " ; echo vsctl-exit=$?")
            if "vsctl-exit=0" not in out:
                raise EmulatorError(f"server {server}: ovs-vsctl could not attach the switches: {out.strip()[-300:]}")
            if self.topology.mtu != KERNEL_MTU:
                links = [lk.intf(end) for lk in self.topology.links for end in (lk.a, lk.b) if end in names]
                self.net[names[0]].cmd(" ; ".join(f"ip link set dev {i} mtu {self.topology.mtu}" for i in links))

    def _forward_controller(self, server: str, port: int) -> None:
        """The server's 127.0.0.1:port leads to the controller's 127.0.0.1:port over ssh."""
        assert self.state is not None
        forward = f"127.0.0.1:{port}:127.0.0.1:{port}"
        cmd = ssh_command(server, self.ssh_config, "-N", "-o", "ExitOnForwardFailure=yes", "-R", forward)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        self.state.ssh_pids.append(proc.pid)
        self.state.save()
        self._forwards[server] = proc
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
                raise EmulatorError(f"server {server}: the controller's channel (ssh -R {port}) failed: "
                                    f"{err or 'exit ' + str(proc.returncode)}")
            r = self.ssh(server, f"exec 3<>/dev/tcp/127.0.0.1/{port}", timeout=10)
            if r.returncode == 0:
                return
            time.sleep(0.1)
        raise EmulatorError(f"server {server}: the controller's channel (ssh -R {port}) did not open in 10 s")

    def _shape_links(self) -> None:
        super()._shape_links()
        for d in self._made_dirs:
            try:
                d.rmdir()
            except OSError:
                pass

    # -- use -----------------------------------------------------------------------------------
    def ofctl_target(self, switch: str) -> str:
        server = self.placement[switch]
        if server == LOCAL:
            return switch
        ns = self._ns_server(server)
        if ns is None:
            raise EmulatorError(f"switch {switch} is on {server}: read its counters through the controller "
                                "(fabriclab stats), ovs-ofctl only reaches this machine's switches")
        return ns.mgmt_socket(switch)

    def ovs_pids(self, all_daemons: bool = False) -> list[int]:
        pids = []
        if any(v == LOCAL for k, v in self.placement.items() if self.topology.node(k).is_switch):
            pids += super().ovs_pids(all_daemons)
        for s in self.ns_servers:
            found = daemon_pids(s.ovs_dir)
            pids += list(found.values()) if all_daemons else [p for n, p in found.items() if n == "ovs-vswitchd"]
        return pids

    def server_cpu_jiffies(self) -> dict[str, tuple[int, int]]:
        """Each server's (total, idle) CPU jiffies from its /proc/stat, read over ssh as on real servers
        (namespace servers share this machine's CPU, so theirs are this machine's)."""
        out = {}
        for server in self.server_names:
            r = self.ssh(server, "head -1 /proc/stat", timeout=10)
            v = [int(x) for x in r.stdout.split()[1:]]
            if len(v) >= 4:
                out[server] = (sum(v), v[3] + (v[4] if len(v) > 4 else 0))
        return out

    def tunnel_pids(self) -> list[int]:
        return [p for lk in (self.net.links if self.net else []) if (p := lk.tunnel_pid())]

    def stop(self) -> None:
        for proc in self._forwards.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self._forwards.values():
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                proc.kill()
        self._forwards.clear()
        if self.state is not None and self.state.netns:
            from emulator.cluster.nsservers import kill_members

            # Processes started in remote hosts outlive their ssh clients: end them while the node
            # shells still show their namespaces.
            hosts = [self.net[h.name].pid for h in self.topology.hosts] if self.net is not None else []
            kill_members(self.state.netns, hosts, servers_too=False)
        super().stop()
        self.ns_servers = []


def _hangups_reach_node_shells() -> None:
    """Mininet ends each node's shell with SIGHUP, and a remote node's shell is an ssh client (under
    sudo, which hands its command the dispositions it started with). Under nohup every child inherits
    SIGHUP ignored, the ssh clients outlive the hangup, and teardown waits on them for ever (seen: a
    cluster selftest stuck in Mininet's Node.cleanup). A handler that does nothing keeps this process
    as deaf to hangups as nohup made it, while the programs it starts begin with the default again."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        signal.signal(signal.SIGHUP, ignore_hangup)


def idle_between(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> dict[str, float]:
    """Idle fraction of each server's CPU between two readings of server_cpu_jiffies."""
    return {s: round((after[s][1] - before[s][1]) / max(1, after[s][0] - before[s][0]), 4)
            for s in before if s in after}


def ssh_command(server: str, config: str | None, *options: str) -> list[str]:
    """ssh to `server` (the remote command goes after it); `config` is a namespace cluster's own."""
    base = ["ssh"]
    if config:
        base += ["-F", config]
    return [*base, "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", *options, server]


def check_server(server: str, config: str | None = None) -> None:
    """A real server must answer ssh without a password, run sudo without one, have Open vSwitch
    running, and the same fabriclab and Mininet as this machine: one line saying which is not so."""
    from importlib.metadata import version

    def run(cmd: str) -> subprocess.CompletedProcess:
        try:
            return subprocess.run([*ssh_command(server, config), cmd], capture_output=True, text=True, timeout=20)
        except subprocess.TimeoutExpired:
            raise EmulatorError(f"server {server}: ssh did not answer in 20 s") from None

    r = run("true")
    if r.returncode != 0:
        err = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"
        if "Permission denied" in err:
            raise EmulatorError(f"server {server}: ssh refused the key ({err}); add your public key to its "
                                "authorized_keys, or load it in ssh-agent")
        raise EmulatorError(f"server {server}: unreachable over ssh ({err})")
    if run("sudo -n true").returncode != 0:
        raise EmulatorError(f"server {server}: sudo asks for a password; allow passwordless sudo for this user")
    if run("sudo -n ovs-vsctl --timeout=3 show").returncode != 0:
        raise EmulatorError(f"server {server}: Open vSwitch is not running (start it there: sudo make setup)")
    ours = {"fabriclab": version("fabriclab"), "mininet": _mininet_version()}
    r = run("python3 -c 'import mininet.net as m; print(m.VERSION)'; "
            "python3 -c 'from importlib.metadata import version; print(version(\"fabriclab\"))' 2>/dev/null "
            "|| echo missing")
    theirs = r.stdout.split()
    if len(theirs) < 2 or theirs[0] != ours["mininet"]:
        raise EmulatorError(f"server {server}: Mininet {theirs[0] if theirs else 'missing'} there, "
                            f"{ours['mininet']} here; install the same version on every server")
    if theirs[1] != ours["fabriclab"]:
        raise EmulatorError(f"server {server}: fabriclab {theirs[1]} there, {ours['fabriclab']} here; "
                            "check out the same commit on every server")


def _mininet_version() -> str:
    from mininet.net import VERSION

    return VERSION
