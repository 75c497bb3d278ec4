"""What this machine can do for the emulator: root, Open vSwitch, datapath, netem, RED, nftables, tools.

Every probe is side-effect free for the rest of the machine: kernel features are tried inside a
throw-away network namespace of our own, which is deleted again.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import uuid
from dataclasses import asdict, dataclass

log = logging.getLogger(__name__)

OVS_CTL = "/usr/share/openvswitch/scripts/ovs-ctl"


def slowdown() -> float:
    """How many times slower than usual this machine runs (FABRICLAB_SLOWDOWN, default 1): the emulator's
    waits for processes to start scale by it. The VM sets it under qemu's TCG, where Python runs ~8x slower."""
    try:
        return max(1.0, float(os.environ.get("FABRICLAB_SLOWDOWN", "1")))
    except ValueError:
        return 1.0


@dataclass(frozen=True)
class Capabilities:
    root: bool
    ovs_version: str | None
    ovs_running: bool
    kernel_datapath: bool
    netem: bool
    htb: bool
    red_ecn: bool
    nftables: bool
    nft_egress: bool
    mininet: str | None
    controller_framework: str | None
    iperf3: str | None
    ethtool: bool

    @property
    def datapath(self) -> str:
        return "kernel" if self.kernel_datapath else "user"

    @property
    def loss_method(self) -> str | None:
        if self.netem:
            return "netem"
        if self.nft_egress:
            return "nftables"
        return None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["datapath"] = self.datapath
        d["loss_method"] = self.loss_method
        return d


def run(cmd: list[str], *, check: bool = False, timeout: float = 30.0) -> subprocess.CompletedProcess:
    """Run a command without a shell, capturing text output."""
    log.debug("run: %s", " ".join(cmd))
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=timeout)


def _first_line(cmd: list[str]) -> str | None:
    if not shutil.which(cmd[0]):
        return None
    try:
        out = run(cmd, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0] if text else None


def ovs_version() -> str | None:
    line = _first_line(["ovs-vsctl", "--version"])
    return line.split()[-1] if line else None


def ovs_running() -> bool:
    if not shutil.which("ovs-vsctl"):
        return False
    try:
        return run(["ovs-vsctl", "--timeout=3", "show"], timeout=10).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def kernel_datapath_available() -> bool:
    """True when the openvswitch kernel module is loaded or loadable."""
    if os.path.isdir("/sys/module/openvswitch"):
        return True
    if shutil.which("modprobe"):
        try:
            return run(["modprobe", "openvswitch"], timeout=20).returncode == 0
        except subprocess.TimeoutExpired:
            return False
    return False


def _in_scratch_netns(commands: list[list[str]]) -> bool:
    """Run commands in a temporary namespace of our own; True when all succeed."""
    if not shutil.which("ip"):
        return False
    ns = f"flprobe{uuid.uuid4().hex[:8]}"
    if run(["ip", "netns", "add", ns]).returncode != 0:
        return False
    try:
        run(["ip", "-n", ns, "link", "set", "lo", "up"])
        return all(run(["ip", "netns", "exec", ns, *cmd]).returncode == 0 for cmd in commands)
    finally:
        run(["ip", "netns", "del", ns])


def netem_available() -> bool:
    return _in_scratch_netns([["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"]])


def red_ecn_available() -> bool:
    """Whether the kernel has RED (sch_red) and lets it mark ECN instead of dropping."""
    return _in_scratch_netns([["tc", "qdisc", "add", "dev", "lo", "root", "red", "limit", "400000", "min", "30000",
                               "max", "90000", "avpkt", "1000", "burst", "55", "bandwidth", "10mbit",
                               "probability", "0.1", "ecn"]])


def htb_available() -> bool:
    return _in_scratch_netns([["tc", "qdisc", "add", "dev", "lo", "root", "handle", "5:", "htb"]])


def nft_egress_available() -> bool:
    """Whether nftables' netdev egress hook (our loss method without netem) works in this kernel."""
    if not shutil.which("nft"):
        return False
    ruleset = (
        'table netdev flprobe { chain c { type filter hook egress device "pa" priority 0; '
        "meta protocol ip numgen random mod 100 lt 1 drop ; } ; }"
    )
    return _in_scratch_netns([["ip", "link", "add", "pa", "type", "veth", "peer", "name", "pb"], ["nft", ruleset]])


def controller_framework() -> str | None:
    """'os-ken X' or 'ryu X' (the framework the controller app will run on), or None."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("os-ken", "ryu"):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return None


def mininet_version() -> str | None:
    try:
        from mininet.net import VERSION
    except ImportError:
        return None
    return VERSION


@functools.cache
def capabilities() -> Capabilities:
    """Probe the machine once per process."""
    root = os.geteuid() == 0
    iperf = _first_line(["iperf3", "--version"])
    return Capabilities(
        root=root,
        ovs_version=ovs_version(),
        ovs_running=ovs_running(),
        kernel_datapath=root and kernel_datapath_available(),
        netem=root and netem_available(),
        htb=root and htb_available(),
        red_ecn=root and red_ecn_available(),
        nftables=shutil.which("nft") is not None,
        nft_egress=root and nft_egress_available(),
        mininet=mininet_version(),
        controller_framework=controller_framework(),
        iperf3=iperf.split()[1] if iperf else None,
        ethtool=shutil.which("ethtool") is not None,
    )


def require_ready(caps: Capabilities | None = None) -> Capabilities:
    """Raise EmulatorError with the fix when something the emulator needs is missing."""
    from emulator.errors import EmulatorError

    caps = caps or capabilities()
    if not caps.root:
        raise EmulatorError("the emulator needs root (namespaces, Open vSwitch); run it with sudo")
    if caps.mininet is None:
        raise EmulatorError(
            "Mininet is not importable: install it with 'apt-get install mininet' and use the venv made "
            "by 'make setup' (built from /usr/bin/python3 with --system-site-packages)"
        )
    if caps.ovs_version is None:
        raise EmulatorError("Open vSwitch is not installed: run 'make setup' (apt-get install openvswitch-switch)")
    if not caps.ovs_running:
        raise EmulatorError(
            f"Open vSwitch is not running: start it with '{OVS_CTL} start --system-id=random --no-monitor' "
            "(or 'make setup')"
        )
    if caps.controller_framework is None:
        raise EmulatorError("no OpenFlow controller framework: pip install os-ken (or run 'make setup')")
    if not caps.htb:
        raise EmulatorError("this kernel has no HTB qdisc (sch_htb): link rates cannot be shaped")
    return caps
