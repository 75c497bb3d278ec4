"""One private Open vSwitch per emulated switch, each in the switch's own network namespace.

Why: the userspace datapath polls every port of every bridge of its daemon on each wake-up, and paced
traffic wakes it once per packet, so with one daemon for the whole fabric a switch traversal costs more
the bigger the fabric (measured on these machines: 66 µs of vswitchd CPU per packet with 2 ports, 297 µs
with 60 on the bridge, 477 µs with them spread over 15 bridges). A daemon that holds only its own
switch's ports costs the same whatever the fabric holds (69-75 µs).

Each switch is a Mininet node with its own network namespace (its links' switch ends live there, not in
the root namespace) running its own ovsdb-server and ovs-vswitchd, with database, sockets, pidfiles and
logs in a directory of the run's work directory (`OVS_RUNDIR`/`OVS_DBDIR`/`OVS_LOGDIR` point there, or
the bridges' management sockets would land in the main instance's run directory). The daemons reach the
controller over a unix socket in the run's directory: nothing outside the machine can reach it, and it
needs no address in the namespace. Nothing is shared with the system's own Open vSwitch, which may be
absent or stopped. The kernel datapath keeps one daemon (its forwarding is not done by polling).

A group of switches can share one such daemon and one namespace instead (`leader`): the first switch
of the group is made as above and runs the daemon with every member's bridge; the others' shells join
its namespace (`mnexec -a`), so their links' ends, their shaping and their faults land there by the
same commands, and their bridges' management sockets are in the leader's directory. With pollskip's
epoll and wake-up moderation (emulator/native/pollskip.c) a wake-up no longer pays for every port it
holds, and one warm process forwards for the whole fabric at less CPU per packet than a cold daemon
per switch (emulator/network.py, ISOLATIONS).
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Sequence
from typing import Any

from mininet.node import Switch

from emulator.errors import EmulatorError
from emulator.ovs_daemons import RECONNECT_MS, daemon_pids, instance_dir, start_commands, stop_daemons

log = logging.getLogger(__name__)

_OK = "fabriclab-switch-started"
# A unix socket path must fit in sun_path (108 bytes with its NUL).
_MAX_SOCKET_PATH = 107


class IsolatedOVSSwitch(Switch):
    """A Mininet switch node running its own Open vSwitch (userspace datapath) in its own namespace.

    `workdir` is the run's directory; `controller` the controller's unix socket; `mark` a
    (key, value) pair set in the bridge's external_ids; `mtu` the MTU of the switch's ports; `linger`
    the daemon's wake-up moderation in µs (emulator.ovs_daemons.linger_us).
    """

    def __init__(self, name: str, workdir: str, controller: str, mark: tuple[str, str] = ("", ""),
                 mtu: int | None = None, protocols: str = "OpenFlow13", linger: int = 0,
                 leader: IsolatedOVSSwitch | None = None, **params: Any) -> None:
        params["inNamespace"] = True
        self.leader = leader  # startShell, called by Node's constructor, reads it
        super().__init__(name, **params)
        self.dir = instance_dir(workdir, leader.name if leader else name)
        self.controller_socket = controller
        self.mark = mark
        self.mtu = mtu
        self.protocols = protocols
        self.linger = linger
        for path in (self.db_socket, self.mgmt_socket, str(self.dir / "controller.sock")):
            if len(path) > _MAX_SOCKET_PATH:
                raise EmulatorError(f"socket path {path} is too long for a unix socket; set TMPDIR shorter")

    def startShell(self, mnopts: str | None = None) -> None:
        """A group member's shell joins its leader's network namespace instead of making one."""
        if self.leader is None:
            super().startShell(mnopts)
            return
        self.inNamespace = False  # or Node.startShell asks mnexec for a new namespace as well
        try:
            super().startShell(f"-cda{self.leader.pid}")
        finally:
            self.inNamespace = True

    # -- names -------------------------------------------------------------------------------------
    @property
    def db_socket(self) -> str:
        return str(self.dir / "db.sock")

    @property
    def mgmt_socket(self) -> str:
        """What `ovs-ofctl` takes to reach this switch's bridge."""
        return str(self.dir / f"{self.name}.mgmt")

    @property
    def ofctl_target(self) -> str:
        return f"unix:{self.mgmt_socket}"

    def pids(self) -> dict[str, int]:
        return daemon_pids(self.dir)

    # -- start -------------------------------------------------------------------------------------
    def bridge_args(self) -> list[str]:
        """ovs-vsctl arguments that make this switch's bridge, its ports and its controller."""
        bridge = [
            "--", "add-br", self.name,
            "--", "set", "bridge", self.name, "datapath_type=netdev", "fail_mode=secure",
            f"protocols={self.protocols}", f"other_config:datapath-id={self.dpid}",
            "other-config:disable-in-band=true",
        ]
        if self.mark[0]:
            bridge.append(f"external_ids:{self.mark[0]}={self.mark[1]}")
        for intf in self.intfList():
            port = self.ports.get(intf)
            if not port or intf.name == "lo":
                continue
            bridge += ["--", "add-port", self.name, intf.name,
                       "--", "set", "Interface", intf.name, f"ofport_request={port}"]
            if self.mtu:
                bridge.append(f"mtu_request={self.mtu}")
        # OVS connects to a unix socket only inside its own run directory; a link there reaches the
        # controller's socket.
        return [*bridge, "--", "set-controller", self.name, f"unix:{self.dir / 'controller.sock'}",
                "--", "set", "controller", self.name, f"max_backoff={RECONNECT_MS}"]

    def link_setup(self) -> list[str]:
        """Quiet links: IPv6 would chatter across the fabric; jumbo frames need the veth ends too."""
        pre = ["sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1"]
        if self.mtu:
            pre += [f"ip link set dev {shlex.quote(i.name)} mtu {self.mtu}" for i in self.intfList()
                    if i.name != "lo"]
        return pre

    def start_script(self, members: Sequence[IsolatedOVSSwitch] = ()) -> str:
        """The shell steps that start this switch's daemons with its bridge and those of `members`
        (the other switches of its group, whose shells share its namespace)."""
        d = shlex.quote(str(self.dir))
        env = f"export OVS_RUNDIR={d} OVS_DBDIR={d} OVS_LOGDIR={d} OVS_SYSCONFDIR={d}"
        bridges = [a for sw in (self, *members) for a in sw.bridge_args()]
        link = self.dir / "controller.sock"
        steps = [
            f"mkdir -p {d}",
            f"ln -sfn {shlex.quote(self.controller_socket)} {shlex.quote(str(link))}",
            env,
            *start_commands(str(self.dir), db_socket=f"{self.dir}/db.sock", linger=self.linger),
            f"ovs-vsctl --db=unix:{d}/db.sock --timeout=30 " + " ".join(shlex.quote(a) for a in bridges),
        ]
        pre = [c for sw in (self, *members) for c in sw.link_setup()]
        return " ; ".join(pre) + " ; " + " && ".join(steps) + f" && echo {_OK}"

    def start(self, controllers: Sequence[Any]) -> None:
        """Nothing here: Mininet.start() calls this for each switch, then batchStartup() for the class,
        which starts them all at once."""

    @classmethod
    def batchStartup(cls, switches: Sequence[IsolatedOVSSwitch], run: Any = None) -> list[IsolatedOVSSwitch]:
        """Start every group's daemons at once: each leader's shell runs its own script, in parallel."""
        leaders = [sw for sw in switches if sw.leader is None]
        members: dict[str, list[IsolatedOVSSwitch]] = {sw.name: [] for sw in leaders}
        for sw in switches:
            if sw.leader is not None:
                members[sw.leader.name].append(sw)
        for sw in leaders:
            # Run from a file: a node's shell reads its commands through a terminal, whose line
            # discipline cuts a line at 4,095 bytes, and a switch with a few dozen ports needs more.
            sw.dir.mkdir(parents=True, exist_ok=True)
            script = sw.dir / "start.sh"
            script.write_text(sw.start_script(members[sw.name]) + "\n")
            sw.sendCmd(f"bash {shlex.quote(str(script))}")
        failed = []
        for sw in leaders:
            out = sw.waitOutput()
            if _OK not in out:
                failed.append(f"{sw.name}: {out.strip()[-300:] or 'no output'}")
        if failed:
            raise EmulatorError("Open vSwitch did not start for " + "; ".join(failed))
        return list(switches)

    # -- stop --------------------------------------------------------------------------------------
    def stop(self, deleteIntfs: bool = True) -> None:
        self.batchShutdown([self])

    @classmethod
    def batchShutdown(cls, switches: Sequence[IsolatedOVSSwitch], run: Any = None) -> list[IsolatedOVSSwitch]:
        for sw in switches:
            if sw.leader is None:
                stop_daemons(sw.pids().values(), str(sw.dir))
        for sw in switches:
            # The links' switch ends go with the namespace; deleting them one by one would cost a
            # command each.
            Switch.stop(sw, deleteIntfs=False)
        return list(switches)

    def connected(self) -> bool:
        return True  # the controller reports readiness itself (barrier-confirmed rules)
