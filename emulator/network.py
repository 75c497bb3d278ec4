"""A running fabric: a topology brought up in Mininet with Open vSwitch and our controller.

    with Fabric(parse_spec("leaf-spine:spines=2,leaves=2,hosts=2"), mode="spray") as fab:
        fab.host("h1").cmd("ping -c1", fab.ip("h3"))

The fabric is always torn down: on leaving the block, on exceptions, on SIGINT, SIGTERM and SIGHUP
(the terminal closing). What it creates is recorded first (see emulator.state), so `fabriclab clean` can
remove the leftovers of a run that was killed outright. It never calls Mininet's cleanup(), which kills
processes by name.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from emulator.control import ControllerClient, ControllerProcess
from emulator.errors import EmulatorError
from emulator.ovs_daemons import RECONNECT_MS, linger_us
from emulator.shaping import Impairment, InterfaceShaper, initial_shape_commands, rate_change_commands, tc_batch
from emulator.state import BRIDGE_MARK, RUN_ENV, RunState, active_runs, interface_exists
from emulator.system import Capabilities, capabilities, require_ready, slowdown
from topologies.model import KERNEL_MTU, Link, Topology
from transport.core.contract import ROUTING_MODES

log = logging.getLogger(__name__)

MODES = ROUTING_MODES
# How switches map onto Open vSwitch daemons: one private daemon per switch in the switch's own
# namespace (see emulator.ovs_switch: a traversal then costs the same in any fabric); one private daemon
# for each group of switches (below), the group in a namespace of its own, with the same preloads
# (pollskip's epoll answers a wake-up at the cost of what is ready, and a few warm processes beat many
# cold ones: on the 4x4x4 leaf-spine at 1500 bytes and 4.76 Mb/s, OVS 76-83 µs per delivered packet
# with the 8 switches in one daemon against 101-106 with a daemon each);
# or every bridge in the system's one daemon (right for the kernel datapath, whose forwarding is not
# done by polling).
ISOLATIONS = ("per-switch", "private", "shared")
PRIVATE_DAEMONS = ("per-switch", "private")
# How many switches, in the topology's order, share one private daemon at most. A daemon's turn still
# costs something per port it holds (the datapath tries each), so sparse traffic (a packet a wake-up) on
# a very large fabric paid for all of them: a lone paced flow cost 431-1,215 µs per traversal on the
# k=8 fat-tree with its 80 switches in one daemon, 289 with 8 a daemon, against 50 on the demo. And a
# daemon forwards on one thread, so a fabric gets at least as many daemons as the machine has CPUs.
# Sprayed permutations, OVS CPU per delivered packet: k=8 at 1 Mb/s 247-256 µs with 8 a daemon, 285-292
# with 4, 279 with all 80; 4x4x4 leaf-spine at 5.66 Mb/s 64-65 with 4 a daemon (two daemons), 82-85
# with all 8 in one.
SWITCHES_PER_DAEMON = 8
SWITCHES_PER_DAEMON_ENV = "FABRICLAB_SWITCHES_PER_DAEMON"
# Overrides the default for every fabric a process brings up (benchmarks compare the two this way).
ISOLATION_ENV = "FABRICLAB_SWITCH_DAEMONS"


@dataclass
class FabricTimings:
    bring_up_s: float = 0.0
    ready_s: float = 0.0  # part of bring_up_s spent waiting for the controller's rules
    teardown_s: float = 0.0


ROOT_NAMESPACE = ""  # key of the root namespace among per-node command batches


def switches_per_daemon(switches: int = 0) -> int:
    """How many of a fabric's `switches` share a private daemon: what FABRICLAB_SWITCHES_PER_DAEMON says
    (a positive whole number), else SWITCHES_PER_DAEMON or fewer, so that there are at least as many
    daemons as CPUs."""
    raw = os.environ.get(SWITCHES_PER_DAEMON_ENV, "").strip()
    if not raw:
        return max(1, min(SWITCHES_PER_DAEMON, math.ceil(switches / (os.cpu_count() or 1))))
    if not raw.isdigit() or int(raw) < 1:
        raise EmulatorError(f"{SWITCHES_PER_DAEMON_ENV}={raw}: give a whole number of switches, 1 or more")
    return int(raw)


def _root_runner(cmd: list[str]) -> tuple[int, str]:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    return out.returncode, out.stdout + out.stderr


def _host_runner(node: Any, cmd: list[str]) -> tuple[int, str]:
    out, err, code = node.pexec(cmd)
    return code, out + err


class Terminated(BaseException):
    """Raised from the SIGTERM (or SIGHUP) handler so that teardown runs as for Ctrl-C; its argument
    names the signal."""


def raise_terminated(signum: int, frame: object) -> None:
    """A SIGTERM handler: `signal.signal(signal.SIGTERM, raise_terminated)`, then catch Terminated."""
    raise Terminated(signal.Signals(signum).name)


def raise_hung_up(signum: int, frame: object) -> None:
    """The SIGHUP handler: the terminal is gone, so what teardown prints goes to /dev/null instead of
    failing on it, then Terminated is raised as on SIGTERM."""
    detach_from_terminal()
    raise_terminated(signum, frame)


def detach_from_terminal() -> None:
    """Point stdout and stderr, where they were a terminal, at /dev/null: a hung-up terminal answers
    every write with EIO, which would turn a clean teardown's last message (or a full-screen view's
    last frame) into a failure. Output redirected to a file or a pipe is left alone."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            with contextlib.suppress(OSError):
                if stat.S_ISCHR(os.fstat(fd).st_mode):  # a hung-up terminal no longer passes isatty()
                    os.dup2(null, fd)
    finally:
        os.close(null)


def ignore_hangup(signum: int, frame: object) -> None:
    """SIGHUP where this process was started to ignore it (under nohup): nothing to do. Installed instead
    of SIG_IGN where the programs it starts must begin with the default again (emulator.cluster)."""


def hangup_ignored() -> bool:
    return signal.getsignal(signal.SIGHUP) in (signal.SIG_IGN, ignore_hangup)


def terminate_on_hangup() -> None:
    """SIGHUP (the terminal went away: a closed window, an ssh session that dropped) raises Terminated
    too, so the fabric is torn down as on SIGTERM instead of left running. Where SIGHUP is ignored
    (under nohup) it stays ignored. Call it from the main thread. Every Fabric installs it for its
    lifetime; a command that brings fabrics up calls it first, so that a hangup between them (or
    before the first) ends the command the same way."""
    if not hangup_ignored():
        signal.signal(signal.SIGHUP, raise_hung_up)


# The controller reads every switch's port counters once per poll interval: half a second, or longer on a
# large fabric so that it reads at most SWITCH_POLLS_PER_S switches a second. Each read costs the
# controller (a request and a reply parsed in Python) and a wake-up of the switch's daemon: on the k=8
# fat-tree (80 switches) at 1 Mb/s per host, polling every 0.5 s took 0.59 CPU seconds in 6.8 s of
# traffic in the controller and 7.12 in OVS, every 2 s 0.2 and 6.55.
POLL_INTERVAL = 0.5
SWITCH_POLLS_PER_S = 40


def poll_interval_for(switches: int) -> float:
    """Seconds between the controller's reads of the counters of a fabric of `switches` switches."""
    return max(POLL_INTERVAL, switches / SWITCH_POLLS_PER_S)


@dataclass
class Fabric:
    """Context manager for one emulated fabric. Attributes are valid between start() and stop()."""

    topology: Topology
    mode: str = "ecmp"
    datapath: str | None = None  # "kernel" | "user"; None picks kernel where the module exists
    isolation: str | None = None  # one of ISOLATIONS; None: private on the userspace datapath
    poll_interval: float | None = None  # None: poll_interval_for the fabric's switches
    ready_timeout: float | None = None
    caps: Capabilities | None = None
    timings: FabricTimings = field(default_factory=FabricTimings)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise EmulatorError(f"unknown mode '{self.mode}'; choose one of {', '.join(MODES)}")
        if self.isolation is not None and self.isolation not in ISOLATIONS:
            raise EmulatorError(f"unknown switch isolation '{self.isolation}'; choose one of {', '.join(ISOLATIONS)}")
        if self.poll_interval is None:
            self.poll_interval = poll_interval_for(len(self.topology.switches))
        self.net: Any = None
        self.controller: ControllerProcess | None = None
        self.state: RunState | None = None
        self._outer_run_env: str | None = None
        self.workdir: Path | None = None
        self.shaper: InterfaceShaper | None = None
        self._ecn: set[str] = set()  # interfaces whose egress marks ECN (set_ecn)
        self._loss: dict[str, float] = {}  # interfaces whose loss was changed at runtime (set_loss)
        self._rate: dict[str, float] = {}  # interfaces whose rate was changed at runtime (set_rate)
        self._old_handlers: dict[int, Any] = {}
        self._started = False

    # -- context manager -----------------------------------------------------------------------
    def __enter__(self) -> Fabric:
        self._install_signal_handlers()
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _install_signal_handlers(self) -> None:
        try:
            self._old_handlers[signal.SIGTERM] = signal.signal(signal.SIGTERM, raise_terminated)
            if not hangup_ignored():
                self._old_handlers[signal.SIGHUP] = signal.signal(signal.SIGHUP, raise_hung_up)
        except ValueError:  # not the main thread: the caller handles signals
            pass

    def _restore_signal_handlers(self) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers.clear()

    # -- bring-up ------------------------------------------------------------------------------
    def start(self) -> None:
        t0 = time.monotonic()
        caps = self.caps = self.caps or require_ready(capabilities())
        datapath = self.datapath or caps.datapath
        if datapath == "kernel" and not caps.kernel_datapath:
            raise EmulatorError(
                "the OVS kernel datapath needs the openvswitch kernel module, which this kernel lacks; "
                "use datapath 'user'"
            )
        self.datapath = datapath
        isolation = self.isolation or os.environ.get(ISOLATION_ENV) or (
            "private" if datapath == "user" else "shared")
        if isolation not in ISOLATIONS:
            raise EmulatorError(f"{ISOLATION_ENV}={isolation}: choose one of {', '.join(ISOLATIONS)}")
        if isolation in PRIVATE_DAEMONS and datapath != "user":
            raise EmulatorError(
                f"{isolation} Open vSwitch instances run the userspace datapath; with the kernel datapath "
                "use isolation 'shared'"
            )
        self.isolation = isolation
        if isolation == "private":
            switches_per_daemon()  # a bad figure fails here, before anything is built
        self.shaper = InterfaceShaper(netem=caps.netem, nft_egress=caps.nft_egress, red_ecn=caps.red_ecn)
        self._check_impairments_supported()
        self._check_no_clash()

        run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        self.workdir = Path(tempfile.mkdtemp(prefix=f"fabriclab-{run_id}-"))
        self.state = RunState(run_id=run_id, topology=self.topology.name, workdir=str(self.workdir))
        # Inherited by everything the fabric starts from here on: how `clean` finds what a killed run
        # left running in its hosts (emulator.state.RUN_ENV).
        self._outer_run_env = os.environ.get(RUN_ENV)
        os.environ[RUN_ENV] = run_id
        # Per-switch daemons are found through their pidfiles in the work directory; their bridges
        # and ports live and die with the switches' namespaces.
        self.state.bridges = [] if self.isolated else [s.name for s in self.topology.switches]
        self.state.interfaces = self._root_interfaces()
        self.state.save()
        self._before_build()

        topo_file = self.workdir / "topology.json"
        topo_file.write_text(json.dumps(self.topology.to_dict(), indent=1))
        of_socket = self.workdir / "of.sock" if self.isolated else None
        self.controller = ControllerProcess(topo_file, self.mode, self.workdir, self.poll_interval,
                                            of_socket=of_socket)
        self.controller.start()
        self.state.controller_pid = self.controller.pid
        self.state.save()
        self.controller.wait_listening()

        for phase in (self._build_mininet, self._configure_hosts, self._start_switches,
                      # After the switches: adding a port to OVS resets the interface's qdisc.
                      self._shape_links, self._size_port_buffers):
            t_phase = time.monotonic()
            phase()
            log.debug("%s took %.2f s", phase.__name__, time.monotonic() - t_phase)

        t_ready = time.monotonic()
        n = len(self.topology.switches)
        self.controller.wait_ready(self.ready_timeout or (30.0 + 1.0 * n) * slowdown())
        now = time.monotonic()
        self.timings.ready_s = now - t_ready
        self.timings.bring_up_s = now - t0
        self._started = True
        log.info("fabric %s up in %.1f s (%s datapath, %s switch daemons, mode %s)", self.topology.name,
                 self.timings.bring_up_s, self.datapath, self.isolation, self.mode)

    def _before_build(self) -> None:
        """What a fabric needs before its controller and nodes (cluster fabrics: their servers)."""

    @property
    def isolated(self) -> bool:
        """The switches run private daemons in namespaces of their own (not the system's daemon)."""
        return self.isolation in PRIVATE_DAEMONS

    def daemon_groups(self) -> list[list[str]]:
        """The switches that share each private daemon, in the topology's order (empty with the
        system's daemon): one each per switch, else SWITCHES_PER_DAEMON at a time (or what
        FABRICLAB_SWITCHES_PER_DAEMON says)."""
        names = [s.name for s in self.topology.switches]
        if not self.isolated:
            return []
        per = 1 if self.isolation == "per-switch" else switches_per_daemon(len(names))
        return [names[i:i + per] for i in range(0, len(names), per)]

    def _check_impairments_supported(self) -> None:
        assert self.caps is not None
        for lk in self.topology.links:
            if lk.delay_ms > 0 and not self.caps.netem:
                raise EmulatorError(
                    f"link {lk.name} asks for delay_ms={lk.delay_ms}, but this kernel has no netem "
                    "(sch_netem): remove the delay, or run it in the VM, whose kernel has netem (make vm-shell)"
                )
            if lk.loss_pct > 0 and self.caps.loss_method is None:
                raise EmulatorError(
                    f"link {lk.name} asks for loss_pct={lk.loss_pct}, but this kernel has neither netem "
                    "nor nftables' netdev egress hook"
                )

    def _root_interfaces(self) -> list[str]:
        """Interfaces this fabric creates in the root namespace (the switch ends of links, unless the
        switches have namespaces of their own)."""
        if self.isolated:
            return []
        names = []
        for lk in self.topology.links:
            for end in (lk.a, lk.b):
                if self.topology.node(end).is_switch:
                    names.append(lk.intf(end))
        return names

    def _check_no_clash(self) -> None:
        others = [r for r in active_runs() if r.pid != os.getpid()]
        if others:
            r = others[0]
            raise EmulatorError(
                f"another fabric ({r.topology}, run {r.run_id}) is running as pid {r.pid}; stop it first "
                "(one fabric at a time: they share interface names)"
            )
        for name in [s.name for s in self.topology.switches] + self._root_interfaces():
            if interface_exists(name):
                raise EmulatorError(
                    f"interface '{name}' already exists; if an earlier run left it, run 'fabriclab clean'"
                )

    def _build_mininet(self) -> None:
        from mininet.link import Link as MnLink
        from mininet.log import setLogLevel
        from mininet.net import Mininet
        from mininet.node import OVSSwitch

        setLogLevel("error" if log.getEffectiveLevel() > logging.DEBUG else "info")
        assert self.state is not None and self.controller is not None
        switch_cls: Any
        if self.isolated:
            from emulator.ovs_switch import IsolatedOVSSwitch

            mtu = self.topology.mtu if self.topology.mtu != KERNEL_MTU else None
            switch_cls = partial(IsolatedOVSSwitch, workdir=str(self.workdir),
                                 controller=str(self.controller.of_socket),
                                 mark=(BRIDGE_MARK, self.state.run_id), mtu=mtu)
        else:
            switch_cls = partial(OVSSwitch, datapath=self.datapath, protocols="OpenFlow13", failMode="secure",
                                 inband=False, batch=True)
        net = self.net = Mininet(topo=None, build=False, controller=None, autoSetMacs=False,
                                 autoStaticArp=False, switch=switch_cls, link=MnLink, waitConnected=False)
        group = {name: g for g in self.daemon_groups() for name in g}
        for node in self.topology.nodes:
            if node.is_switch:
                extra: dict[str, Any] = {}
                if self.isolated:
                    # A daemon lingers for the fastest link it serves.
                    members = group[node.name]
                    rates = [lk.rate_mbps for m in members for lk in self.topology.links_of(m)]
                    extra = {"linger": linger_us(rates, self.topology.mtu)}
                    if members[0] != node.name:
                        extra["leader"] = net[members[0]]
                net.addSwitch(node.name, dpid=f"{node.dpid:016x}", **extra)
            else:
                net.addHost(node.name, ip=node.ip, mac=node.mac)
            self.state.host_pids.append(net[node.name].pid)
            self.state.save()
        for lk in self.topology.links:
            net.addLink(lk.a, lk.b, port1=lk.a_port, port2=lk.b_port)
        net.build()

    def _configure_hosts(self) -> None:
        """IPv6 off (its chatter would cross the fabric), static ARP, and offloads off for userspace OVS."""
        assert self.workdir is not None
        hosts = self.topology.hosts
        for h in hosts:
            node = self.net[h.name]
            intf = node.defaultIntf().name
            arp_file = self.workdir / f"arp-{h.name}"
            arp_file.write_text("".join(
                f"neigh replace {o.address} lladdr {o.mac} dev {intf} nud permanent\n"
                for o in hosts if o.name != h.name
            ))
            cmds = [
                "sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1",
                f"ip -batch {arp_file}",
            ]
            if self.datapath == "user":
                cmds += [f"ethtool -K {i.name} tx off rx off >/dev/null 2>&1" for i in node.intfList()
                         if i.name != "lo"]
            if self.topology.mtu != KERNEL_MTU:
                cmds += [f"ip link set dev {i.name} mtu {self.topology.mtu}" for i in node.intfList()
                         if i.name != "lo"]
            node.cmd(" ; ".join(cmds))
        for intf in self._root_interfaces():
            path = Path(f"/proc/sys/net/ipv6/conf/{intf}/disable_ipv6")
            if path.exists():
                path.write_text("1")

    def _shape_links(self) -> None:
        """Every link end's qdiscs, as one `tc -batch` per namespace, all namespaces at once (one
        command per interface would cost a process each: ~2,500 on a k=8 fat-tree), then random loss
        where a link has it (nftables, or netem inside the batch)."""
        assert self.shaper is not None and self.state is not None and self.workdir is not None
        per_node: dict[str, list[list[str]]] = {}
        lossy: list[tuple[Link, str, Impairment]] = []
        for lk in self.topology.links:
            for end in (lk.a, lk.b):
                imp = self._impairment(lk, end)
                cmds = initial_shape_commands(lk.intf(end), imp, netem=self.shaper.netem)
                key = ROOT_NAMESPACE if self._in_root_namespace(end) else end
                per_node.setdefault(key, []).extend(cmds)
                if imp.loss_pct > 0 and not self.shaper.netem:
                    lossy.append((lk, end, imp))
        self._run_tc_batches(per_node)
        for lk, end, imp in lossy:
            tables = self.shaper.set_loss(lk.intf(end), imp.loss_pct, self._runner_for(end), imp)
            if self._in_root_namespace(end):
                self.state.nft_tables += tables
        self.state.save()

    def _run_tc_batches(self, per_node: dict[str, list[list[str]]]) -> None:
        assert self.workdir is not None
        started = []
        for key, cmds in per_node.items():
            if not cmds:
                continue
            path = self.workdir / f"tc-{key}.batch"
            path.write_text(tc_batch(cmds))
            if key == ROOT_NAMESPACE:
                code, out = _root_runner(["tc", "-batch", str(path)])
                if code != 0:
                    raise EmulatorError(f"shaping the root namespace's interfaces failed: {out.strip()[-300:]}")
                continue
            node = self.net[key]
            node.sendCmd(f"tc -batch {path}; echo tc-exit=$?")
            started.append(node)
        failed = []
        for node in started:
            out = node.waitOutput()
            if "tc-exit=0" not in out:
                failed.append(f"{node.name}: {out.strip()[-300:]}")
        if failed:
            raise EmulatorError("shaping links failed: " + "; ".join(failed))

    def _impairment(self, lk: Link, end: str, loss_pct: float | None = None) -> Impairment:
        """What lk's egress at `end` is configured with now (the topology's values plus runtime changes)."""
        if loss_pct is None:
            loss_pct = self._loss.get(lk.intf(end), lk.loss_pct)
        rate = self._rate.get(lk.intf(end), lk.rate_mbps)
        return Impairment(rate, lk.delay_ms, loss_pct, lk.queue_packets, ecn=lk.intf(end) in self._ecn)

    def _runner_for(self, node_name: str):
        if self.topology.node(node_name).is_switch and not self.isolated:
            return _root_runner
        return partial(_host_runner, self.net[node_name])

    def _in_root_namespace(self, node_name: str) -> bool:
        return self.topology.node(node_name).is_switch and not self.isolated

    def _start_switches(self) -> None:
        assert self.controller is not None and self.state is not None
        self.net.start()
        if self.isolated:
            # Each switch's own script made its bridge, ports, MTU and controller; record its daemons.
            self.state.daemon_pids = self.ovs_pids(all_daemons=True)
            self.state.save()
            return
        target = f"tcp:127.0.0.1:{self.controller.of_port}"
        cmd = ["ovs-vsctl", "--timeout=30"]
        for s in self.topology.switches:
            cmd += ["--", "set-controller", s.name, target,
                    "--", "set", "controller", s.name, f"max_backoff={RECONNECT_MS}",
                    "--", "set", "bridge", s.name, f"external_ids:{BRIDGE_MARK}={self.state.run_id}"]
        code, out = _root_runner(cmd)
        if code != 0:
            raise EmulatorError(f"ovs-vsctl could not attach the switches to the controller: {out.strip()}")
        if self.topology.mtu != KERNEL_MTU:
            self._set_switch_mtu(self.topology.mtu)

    def _size_port_buffers(self) -> None:
        """Each private switch daemon's sockets get buffers that hold all its ports' shaped queues full:
        the kernel's default holds ~200 kB of frames, and beyond it packets vanish uncounted
        (emulator/port_buffers.py). The system's shared daemon is left as it is: its sockets outlive
        the run and serve other bridges; the kernel datapath sends through no socket."""
        if self.datapath != "user" or not self.isolated:
            return
        from emulator import port_buffers

        deepest = max((lk.queue_packets or port_buffers.DEFAULT_QUEUE_PACKETS for lk in self.topology.links),
                      default=port_buffers.DEFAULT_QUEUE_PACKETS)
        # A daemon sends for every switch of its group through one socket.
        ports = max((sum(len(self.topology.links_of(m)) for m in g) for g in self.daemon_groups()), default=1)
        size = port_buffers.buffer_bytes(deepest, self.topology.mtu, ports)
        # A daemon makes its send socket at its first send: one frame out of each switch first.
        script = []
        for s in self.topology.switches:
            lk = self.topology.links_of(s.name)[0]
            port = lk.a_port if lk.a == s.name else lk.b_port
            script.append(" ".join(shlex.quote(c) for c in
                                   port_buffers.priming_command(self.ofctl_target(s.name), port)))
        code, out = _root_runner(["sh", "-c", " ; ".join(script)])
        if code != 0:
            log.debug("priming the switches' send sockets: %s", out.strip()[-300:])
        changed = port_buffers.enlarge(self.ovs_pids(), size)
        log.debug("%d switch sockets hold %d bytes each", changed, size)

    def _set_switch_mtu(self, mtu: int) -> None:
        """Jumbo frames on the switch ends: the veth itself, and OVS's port (mtu_request), whose
        userspace datapath sizes its receive buffers from it and would truncate larger frames."""
        cmd = ["ovs-vsctl", "--timeout=30"]
        for intf in self._root_interfaces():
            code, out = _root_runner(["ip", "link", "set", "dev", intf, "mtu", str(mtu)])
            if code != 0:
                raise EmulatorError(f"cannot set MTU {mtu} on {intf}: {out.strip()}; use a smaller mtu")
            cmd += ["--", "set", "Interface", intf, f"mtu_request={mtu}"]
        code, out = _root_runner(cmd)
        if code != 0:
            raise EmulatorError(f"ovs-vsctl could not set MTU {mtu} on the switch ports: {out.strip()}")

    # -- use -----------------------------------------------------------------------------------
    @property
    def api(self) -> ControllerClient:
        if self.controller is None:
            raise EmulatorError("the fabric is not running")
        return self.controller.client

    def host(self, name: str) -> Any:
        return self.net[name]

    def host_namespace(self, name: str) -> str | None:
        """The file of a host's network namespace, for a process here to open sockets in it (None
        where the host is not on this machine)."""
        return f"/proc/{self.net[name].pid}/ns/net"

    def namespaced_nodes(self) -> list[Any]:
        """Mininet nodes with a network namespace of their own, one node per namespace: the hosts, and
        the switches when they run private daemons (the first switch of each daemon's group)."""
        names = [n.name for n in self.topology.nodes if not self._in_root_namespace(n.name)]
        return [node for node in (self.net[name] for name in names) if getattr(node, "leader", None) is None]

    def ofctl_target(self, switch: str) -> str:
        """What `ovs-ofctl` takes to reach a switch: its bridge name, or its private management socket."""
        if self.isolated:
            return self.net[switch].ofctl_target
        return switch

    def ovs_pids(self, all_daemons: bool = False) -> list[int]:
        """The ovs-vswitchd processes forwarding this fabric's packets (with all_daemons, their database
        servers too): one per group of switches (daemon_groups), or the system's one daemon."""
        if self.isolated:
            from emulator.ovs_daemons import all_daemon_pids, vswitchd_pids

            assert self.workdir is not None
            return all_daemon_pids(self.workdir) if all_daemons else vswitchd_pids(self.workdir)
        from emulator.cpu import ovs_pid

        pid = ovs_pid()
        return [pid] if pid else []

    def ip(self, name: str) -> str:
        addr = self.topology.node(name).address
        if addr is None:
            raise EmulatorError(f"{name} is not a host")
        return addr

    def controller_exit(self) -> int | None:
        """None while the controller runs, else its exit status: the switches keep forwarding with the
        rules they hold, but nothing reroutes around a failure and no counters are read."""
        if self.controller is None:
            raise EmulatorError("the fabric is not running")
        return self.controller.exit_code()

    def restart_controller(self) -> float:
        """Start the controller again, on the same ports and socket, in the current mode; the switches
        reconnect by themselves (within RECONNECT_MS) and get their rules again. Returns seconds to ready."""
        if self.controller is None or self.state is None:
            raise EmulatorError("the fabric is not running")
        t0 = time.monotonic()
        self.controller.stop()
        self.controller.mode = self.mode
        self.controller.start()
        self.state.controller_pid = self.controller.pid
        self.state.save()
        self.controller.wait_listening()
        self.controller.wait_ready(self.ready_timeout or (30.0 + 1.0 * len(self.topology.switches)) * slowdown())
        return time.monotonic() - t0

    def set_mode(self, mode: str) -> dict:
        if mode not in MODES:
            raise EmulatorError(f"unknown mode '{mode}'; choose one of {', '.join(MODES)}")
        result = self.api.set_mode(mode)
        self.mode = mode
        return result

    def _link(self, a: str, b: str) -> Link:
        found = self.topology.links_between(a, b)
        if not found:
            raise EmulatorError(f"there is no link between {a} and {b}")
        return found[0]

    def set_link_up(self, a: str, b: str, up: bool) -> float:
        """Cut or restore the link a-b (both interfaces down/up); returns the time it was done."""
        lk = self._link(a, b)
        state = "up" if up else "down"
        for end in (lk.a, lk.b):
            code, out = self._runner_for(end)(["ip", "link", "set", lk.intf(end), state])
            if code != 0:
                raise EmulatorError(f"could not set {lk.intf(end)} {state}: {out.strip()}")
        log.info("link %s %s", lk.name, state)
        return time.time()

    def set_loss(self, a: str, b: str, loss_pct: float, direction: str = "both") -> str:
        """Random loss on the link a-b at runtime; returns the method used (netem or nftables)."""
        assert self.shaper is not None and self.state is not None
        lk = self._link(a, b)
        ends = {"both": (lk.a, lk.b), "a": (lk.a,), "b": (lk.b,)}[direction]
        for end in ends:
            imp = self._impairment(lk, end, loss_pct)
            tables = self.shaper.set_loss(lk.intf(end), loss_pct, self._runner_for(end), imp)
            self._loss[lk.intf(end)] = loss_pct
            if self._in_root_namespace(end):
                self.state.nft_tables = sorted(set(self.state.nft_tables) | set(tables))
        self.state.save()
        return self.shaper.loss_method or "none"

    def set_ecn(self, a: str, b: str, on: bool = True, direction: str = "both") -> list[str]:
        """RED with ECN marking on the link a-b's egress queues (on=False restores the plain queue); the
        link keeps its rate, delay and loss. Returns the interfaces changed. Needs sch_red (the VM)."""
        assert self.shaper is not None and self.state is not None
        lk = self._link(a, b)
        ends = {"both": (lk.a, lk.b), "a": (lk.a,), "b": (lk.b,)}[direction]
        changed = []
        for end in ends:
            intf = lk.intf(end)
            before = set(self._ecn)
            (self._ecn.add if on else self._ecn.discard)(intf)
            try:
                tables = self.shaper.apply(intf, self._impairment(lk, end), self._runner_for(end))
            except EmulatorError:
                self._ecn = before
                raise
            if self._in_root_namespace(end):
                self.state.nft_tables = sorted(set(self.state.nft_tables) | set(tables))
            changed.append(intf)
        self.state.save()
        log.info("link %s: ECN marking %s on %s", lk.name, "on" if on else "off", ", ".join(changed))
        return changed

    def set_rate(self, a: str, b: str, rate_mbps: float) -> None:
        """Change the rate of link a-b in both directions at runtime. The new rate is remembered, so a later
        set_loss or set_ecn on the link keeps it (and RED is sized to it)."""
        assert self.shaper is not None and self.state is not None
        lk = self._link(a, b)
        if rate_mbps <= 0:
            raise EmulatorError(f"rate {rate_mbps} Mb/s: give a positive rate")
        for end in (lk.a, lk.b):
            intf = lk.intf(end)
            had_rate = self._impairment(lk, end).rate_mbps
            self._rate[intf] = rate_mbps
            if had_rate and intf not in self._ecn:
                # Changing the HTB class in place keeps the queue and the packets in it.
                for cmd in rate_change_commands(intf, rate_mbps):
                    code, out = self._runner_for(end)(cmd)
                    if code != 0:
                        raise EmulatorError(f"could not change the rate of {intf}: {out.strip()}")
                continue
            # No HTB to change (the link was unshaped) or RED sized to the old rate: shape it afresh.
            tables = self.shaper.apply(intf, self._impairment(lk, end), self._runner_for(end))
            if self._in_root_namespace(end):
                self.state.nft_tables = sorted(set(self.state.nft_tables) | set(tables))
        self.state.save()
        log.info("link %s: rate %s Mb/s", lk.name, rate_mbps)

    # -- teardown ------------------------------------------------------------------------------
    def stop(self) -> None:
        """Tear everything down; safe to call more than once and after a partial start."""
        if self.state is None and self.net is None and self.controller is None:
            self._restore_signal_handlers()
            return
        t0 = time.monotonic()
        # Ignore a second Ctrl-C/SIGTERM while tearing down: a half-torn-down fabric is worse.
        old_int = _swap_handler(signal.SIGINT, signal.SIG_IGN)
        old_term = _swap_handler(signal.SIGTERM, signal.SIG_IGN)
        old_hup = None if hangup_ignored() else _swap_handler(signal.SIGHUP, detach_on_hangup)
        try:
            if self.controller is not None:
                self.controller.stop()
            if self.net is not None:
                try:
                    self.net.stop()
                except Exception as exc:  # keep going: the record-based sweep below finishes the job
                    log.warning("mininet stop: %s", exc)
            if self.state is not None:
                from emulator.state import remove_run

                leftovers = remove_run(self.state)
                if leftovers:
                    log.debug("removed after mininet stop: %s", ", ".join(leftovers))
            if self.workdir is not None:
                shutil.rmtree(self.workdir, ignore_errors=True)
        finally:
            self.net = None
            self.controller = None
            if self.state is not None:
                if self._outer_run_env is None:
                    os.environ.pop(RUN_ENV, None)
                else:
                    os.environ[RUN_ENV] = self._outer_run_env
            self.state = None
            self.timings.teardown_s = time.monotonic() - t0
            _swap_handler(signal.SIGINT, old_int)
            _swap_handler(signal.SIGTERM, old_term)
            if old_hup is not None:
                _swap_handler(signal.SIGHUP, old_hup)
            self._restore_signal_handlers()
            self._started = False


def detach_on_hangup(signum: int, frame: object) -> None:
    """SIGHUP during teardown: finish it, only without the terminal."""
    detach_from_terminal()


def _swap_handler(sig: int, handler: Any) -> Any:
    try:
        return signal.signal(sig, handler)
    except (ValueError, TypeError):
        return None
