"""`fabriclab cluster selftest`: build a cluster out of namespace servers on this machine and check it
the way a user would check real servers.

Checks, each one line: the servers answer ssh and run their own Open vSwitch; a leaf-spine split across
them comes up with the controller; every host reaches every other; the path-spread probe, sent between
hosts on different servers, is spread evenly over the spines when sprayed; a short ecmp-vs-spray gives
the one-machine verdicts (spray even, ECMP uneven); and after teardown nothing is left. Measured on the
way: the extra round-trip time of a server-crossing path (against the same fabric on this machine
alone), the CPU the ssh tunnels spend per packet they carry, and each server's CPU headroom.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from emulator.cluster import SERVERS_ENV
from emulator.cluster.fabric import ClusterFabric, ServersSpec, idle_between
from emulator.errors import EmulatorError
from topologies import parse_spec

log = logging.getLogger(__name__)

SPRAY_EVEN = 1.25  # max/min packets over the spines
PING_COUNT = 20


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class SelftestReport:
    servers: int
    checks: list[Check] = field(default_factory=list)
    measured: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "servers": self.servers, "checks": [asdict(c) for c in self.checks],
                "measured": self.measured}


def selftest_spec(n: int) -> str:
    return f"leaf-spine:spines=2,leaves={max(2, n)},hosts=2,rate=20,mtu=1500"


def _rtt_ms(host, address: str, count: int = PING_COUNT) -> float | None:
    out = host.cmd(f"ping -q -c {count} -i 0.05 -W 1 {address}")
    m = re.search(r"= [\d.]+/([\d.]+)/", out)
    return float(m.group(1)) if m else None


def _descendants(roots: list[int]) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _cpu_s(pids: list[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
    return total


def run_selftest(n: int, duration: float = 4.0, progress: Callable[[Check], None] | None = None,
                 experiment: bool = True) -> SelftestReport:
    from emulator.network import Fabric
    from emulator.probe import run_probe

    report = SelftestReport(servers=n)

    def check(name: str, ok: bool, detail: str) -> None:
        c = Check(name, ok, detail)
        report.checks.append(c)
        if progress:
            progress(c)

    topo = parse_spec(selftest_spec(n))
    t0 = time.monotonic()
    fab = ClusterFabric(topo, mode="spray", servers=ServersSpec(namespace_servers=n))
    made: dict = {}
    try:
        with fab:
            up_s = time.monotonic() - t0
            made = {"netns": list(fab.state.netns), "workdir": str(fab.workdir),
                    "run_record": str(fab.state.path)} if fab.state else {}
            versions = [fab.ssh(s, "ovs-vsctl --version | head -1").stdout.strip() for s in fab.server_names]
            check("servers", all(versions), f"{n} namespace servers, each its own sshd and Open vSwitch "
                  f"({versions[0] if versions else '?'})")
            crossing = [lk.name for lk in topo.links if fab.placement[lk.a] != fab.placement[lk.b]]
            check("bring-up", True, f"{topo.name} up in {up_s:.1f} s: {len(topo.switches)} switches, "
                  f"{len(topo.hosts)} hosts; {len(crossing)} links cross servers (ssh tunnels)")
            hosts = [h.name for h in topo.hosts]
            lost, sent = 0, 0
            for a in hosts:
                targets = " ".join(fab.ip(b) for b in hosts if b != a)
                loop = f"for t in {targets}; do ping -c1 -W2 $t >/dev/null && echo ok || echo lost; done"
                out = fab.host(a).cmd(loop)
                sent += len(hosts) - 1
                lost += out.split().count("lost")
            check("ping all", lost == 0, f"{sent - lost}/{sent} pings answered")

            src = hosts[0]
            dst = next(h for h in hosts if fab.placement[h] != fab.placement[src])
            tunnels = fab.tunnel_pids() + [s.sshd_pid for s in fab.ns_servers if s.sshd_pid]
            hosts_shells = {fab.host(h).pid for h in hosts} | {fab.net[s.name].pid for s in topo.switches}
            ssh_pids = [p for p in _descendants(tunnels) if p not in hosts_shells]
            idle0, cpu0 = fab.server_cpu_jiffies(), _cpu_s(ssh_pids)
            probe = run_probe(fab, src, dst, packets=2000, rate_pps=1000.0, size=512)
            cpu1, idle1 = _cpu_s(ssh_pids), fab.server_cpu_jiffies()
            bal = probe.balance
            check("spray across servers", probe.packets_received == probe.packets_sent and bal is not None
                  and bal <= SPRAY_EVEN,
                  f"{src}@{fab.placement[src]} -> {dst}@{fab.placement[dst]}: {probe.packets_received}/"
                  f"{probe.packets_sent} received, spines {probe.per_spine} (max/min "
                  f"{bal if bal is None else round(bal, 2)}, even if <= {SPRAY_EVEN})")
            idle = {s: round(100 * v, 1) for s, v in idle_between(idle0, idle1).items()}
            report.measured["server_cpu_idle_pct"] = idle
            # Each probe packet crosses servers once on its way (src and dst are on different servers).
            per_packet = 1e6 * (cpu1 - cpu0) / max(1, probe.packets_received)
            report.measured["tunnel_cpu_us_per_packet"] = round(per_packet, 1)
            rtt_cross = _rtt_ms(fab.host(src), fab.ip(dst))
            report.measured["rtt_cross_server_ms"] = rtt_cross
        made_left = _leftovers(made)
        check("teardown", not made_left, "nothing left" if not made_left else "left: " + ", ".join(made_left))
        with Fabric(topo, mode="spray") as local:
            rtt_local = _rtt_ms(local.host(src), local.ip(dst))
        report.measured["rtt_one_machine_ms"] = rtt_local
        if rtt_cross is not None and rtt_local is not None:
            report.measured["rtt_extra_ms"] = round(rtt_cross - rtt_local, 3)
        check("overhead", True, f"round trip {src}->{dst}: {rtt_cross} ms across servers, {rtt_local} ms on "
              f"one machine; ssh tunnels {report.measured['tunnel_cpu_us_per_packet']} us CPU per packet "
              f"crossing; server CPU idle during the probe {idle} %")
        if experiment:
            _experiment_check(n, duration, check, report)
    except EmulatorError as exc:
        check("error", False, str(exc))
    return report


def _experiment_check(n: int, duration: float, check: Callable[[str, bool, str], None],
                      report: SelftestReport) -> None:
    from experiments import driver

    old = os.environ.get(SERVERS_ENV)
    os.environ[SERVERS_ENV] = f"ns:{n}"
    try:
        exp, topo = driver.prepare("ecmp-vs-spray", None, duration, None, None, ["ecmp-single", "spray"])
        with tempfile.TemporaryDirectory(prefix="fabriclab-selftest-") as out:
            rendered = driver.execute(exp, topo, Path(out))
    finally:
        if old is None:
            os.environ.pop(SERVERS_ENV, None)
        else:
            os.environ[SERVERS_ENV] = old
    arms = {a["name"]: a for a in rendered.doc["arms"]}
    ecmp, spray = arms.get("ecmp-single", {}), arms.get("spray", {})
    ei, si = ecmp.get("link_imbalance"), spray.get("link_imbalance")
    trusted = {name: (a.get("fidelity") or {}).get("trusted") for name, a in arms.items()}
    report.measured["ecmp_vs_spray"] = {name: {"link_imbalance": a.get("link_imbalance"),
                                               "goodput_fraction": a.get("goodput_fraction"),
                                               "trusted": trusted[name],
                                               "server_cpu_idle": a.get("server_cpu_idle"),
                                               "cross_server_links": a.get("cross_server_links")}
                                        for name, a in arms.items()}
    ok = si is not None and ei is not None and si <= SPRAY_EVEN and ei > si
    check("ecmp-vs-spray", ok, f"{duration:g} s per arm across servers: link imbalance spray {si}, ECMP {ei} "
          f"(spray even, ECMP uneven, as on one machine); goodput/ideal spray "
          f"{_r(spray.get('goodput_fraction'))}, ECMP {_r(ecmp.get('goodput_fraction'))}; trusted {trusted}")


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def _leftovers(made: dict) -> list[str]:
    left = []
    existing = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    left += [f"namespace {ns}" for ns in made.get("netns", []) if ns in existing]
    if made.get("workdir") and Path(made["workdir"]).exists():
        left.append(f"directory {made['workdir']}")
    if Path("/sys/class/net/flc-ul").exists():
        left.append("interface flc-ul")
    pids = subprocess.run(["pgrep", "-f", made.get("workdir") or "//none//"], capture_output=True,
                          text=True).stdout.split()
    left += [f"process {p}" for p in pids]
    # Only this run's record: a machine may hold records of other users' runs, or of runs from before
    # a reboot of a /run that is not a tmpfs (containers); those are `fabriclab clean`'s to judge.
    if made.get("run_record") and Path(made["run_record"]).exists():
        left.append("its run record " + made["run_record"])
    return left
