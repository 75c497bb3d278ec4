"""Helpers for integration tests: what a fabric leaves on the machine, checked before and after."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

from emulator.state import STATE_DIR, marked_bridges, our_nft_tables

# Node names the builders generate; other Mininet networks on the machine are not ours to report.
OUR_NODE = re.compile(r"^(spine|leaf|h|nv|tor|s\d+g)\d+$")


def mininet_shells() -> list[str]:
    out = subprocess.run(["pgrep", "-af", "mininet:"], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines()
            if "pgrep" not in line and OUR_NODE.match(line.rsplit("mininet:", 1)[-1].strip())]


def controller_processes() -> list[str]:
    """Controller processes started by a Fabric (their topology file lives in its work directory)."""
    out = subprocess.run(["pgrep", "-af", "emulator.controller"], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if "pgrep" not in line and "fabriclab-" in line]


def private_ovs_daemons() -> list[str]:
    """Per-switch Open vSwitch daemons (their files live in a fabric's work directory)."""
    out = subprocess.run(["pgrep", "-af", "ovs-vswitchd|ovsdb-server"], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if "pgrep" not in line and "/fabriclab-" in line]


def work_directories() -> list[str]:
    # `make vm-test` and `make vagrant-test` keep their results in /tmp/fabriclab-vm-* and
    # /tmp/fabriclab-vagrant-out-*, on purpose: results folders, not leftovers.
    return sorted(str(p) for p in Path(tempfile.gettempdir()).glob("fabriclab-*")
                  if p.is_dir() and not p.name.startswith(("fabriclab-vm-", "fabriclab-vagrant-out-")))


def fabric_interfaces() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True)
    names = [line.split(":")[1].strip().split("@")[0] for line in out.stdout.splitlines()]
    return [n for n in names if "-eth" in n and OUR_NODE.match(n.split("-eth")[0])]


def cluster_namespaces() -> list[str]:
    """Namespace servers' network namespaces (emulator.cluster.nsservers names them flc-<run>-s<N>)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return sorted(n for n in out.stdout.split() if n.startswith("flc-"))


def cluster_ssh_processes() -> list[str]:
    """sshd, tunnels and forwards of cluster runs: every one names the run's work directory."""
    out = subprocess.run(["pgrep", "-af", "ssh"], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if "pgrep" not in line and "/fabriclab-" in line]


def endpoint_processes() -> list[str]:
    """The transport's endpoints the runs start in emulated hosts (`python -m cli.endpoint ...`)."""
    out = subprocess.run(["pgrep", "-af", "cli.endpoint"], capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if "pgrep" not in line]


def underlay_interfaces() -> list[str]:
    return sorted(p.name for p in Path("/sys/class/net").glob("flc-ul*"))


def leftovers() -> dict[str, list]:
    """Everything an emulated fabric could leave behind; all lists empty when clean."""
    return {
        "bridges": sorted(marked_bridges()),
        "interfaces": fabric_interfaces(),
        "mininet_shells": mininet_shells(),
        "controllers": controller_processes(),
        "ovs_daemons": private_ovs_daemons(),
        "work_directories": work_directories(),
        "nft_tables": our_nft_tables(),
        "namespaces": cluster_namespaces(),
        "ssh_processes": cluster_ssh_processes(),
        "underlay": underlay_interfaces(),
        "endpoints": endpoint_processes(),
        "run_records": sorted(p.name for p in STATE_DIR.glob("*.json")) if STATE_DIR.is_dir() else [],
    }


# What was on the machine before the tests touched it (another user's Mininet, say) is not ours to report.
_BASELINE: dict[str, set] | None = None


def baseline() -> dict[str, set]:
    global _BASELINE
    if _BASELINE is None:
        _BASELINE = {k: set(v) for k, v in leftovers().items()}
    return _BASELINE


def new_leftovers() -> dict[str, list]:
    base = baseline()
    return {k: [x for x in v if x not in base.get(k, set())] for k, v in leftovers().items()}


def assert_no_leftovers() -> None:
    left = {k: v for k, v in new_leftovers().items() if v}
    assert not left, f"fabric left behind: {left}"
