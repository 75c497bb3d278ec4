"""The Vagrant VM: the Vagrantfile is valid and keeps its promises, and (as root) the README's Vagrant
commands, run as written by `make vagrant-test` on libvirt with a local stand-in box, print the demo's
table, find the kernel datapath, netem and RED inside, bring the results to the host and leave nothing."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_vagrantfile_validates():
    vagrant = shutil.which("vagrant")
    assert vagrant, "vagrant is not installed: 'make setup' installs it (apt-get install vagrant)"
    # --ignore-provider: validating the file must not depend on a hypervisor being installed.
    out = subprocess.run(
        [vagrant, "validate", "--ignore-provider"], cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "validated successfully" in out.stdout


def test_vagrantfile_keeps_the_promises():
    text = (ROOT / "Vagrantfile").read_text()
    # What users boot is what `make vm-test` checks: the same Debian release as the image's.
    suite = re.search(r"^SUITE=\$\{FABRICLAB_VM_SUITE:-(\w+)\}", (ROOT / "scripts/vm/build.sh").read_text(), re.M)
    assert suite, "scripts/vm/build.sh names no Debian suite"
    assert f'config.vm.box = "debian/{suite[1]}64"' in text
    assert 'host_ip: "127.0.0.1"' in text and "guest: 8080" in text
    assert "scripts/setup.sh" in text and "memory = 4096" in text
    # A share that needs no NFS server, which keeps the guest's venv and results out of rsync's reach.
    assert re.search(r'synced_folder "\.", "/vagrant", type: "rsync"', text)
    for kept in (".venv/", "results/"):
        assert f'"{kept}"' in text
    # The venv and the test-tools choice are remembered for the documented commands, which need make.
    packages = re.search(r"^APT_PACKAGES=\((.*?)\)", (ROOT / "scripts/setup.sh").read_text(), re.M | re.S)
    assert packages and "make" in packages[1].split(), "provisioning (setup.sh) must install make"
    assert "VENV=/opt/fabriclab-venv" in text and "FABRICLAB_DEV_TOOLS=0" in text


def test_setup_reads_the_remembered_choices(tmp_path):
    """What provisioning writes to /etc/fabriclab/setup.conf is what `make` and setup.sh then use."""
    conf = tmp_path / "setup.conf"
    conf.write_text("VENV=/opt/fabriclab-venv\nFABRICLAB_DEV_TOOLS=0\n")
    script = (ROOT / "scripts/setup.sh").read_text()
    # Run the part of setup.sh before its first action, with the conf given.
    head = script.split("APT_PACKAGES=", 1)[0].replace('cd "$(dirname "$0")/.."', "")
    env = {"PATH": "/usr/bin:/bin", "FABRICLAB_SETUP_CONF": str(conf)}
    out = subprocess.run(["bash", "-c", head + '\necho "$VENV ${FABRICLAB_DEV_TOOLS:-1}"'], env=env,
                         capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["/opt/fabriclab-venv", "0"]
    out = subprocess.run(["bash", "-c", head + '\necho "$VENV ${FABRICLAB_DEV_TOOLS:-1}"'],
                         env={**env, "VENV": "/tmp/v"}, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["/tmp/v", "0"], "the environment must win over the remembered choice"
    make = subprocess.run(["make", "-s", "-n", "demo", f"FABRICLAB_SETUP_CONF={conf}", "ARGS=--arms spray"],
                          cwd=ROOT, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert "/opt/fabriclab-venv/bin/fabriclab demo --arms spray" in make.stdout, make.stdout + make.stderr
    make = subprocess.run(["make", "-s", "-n", "demo", f"FABRICLAB_SETUP_CONF={tmp_path / 'none'}"], cwd=ROOT,
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert ".venv/bin/fabriclab demo" in make.stdout, make.stdout + make.stderr


def readme_vagrant_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- vagrant-test[^>]*-->\s*```sh\n(.*?)```", text, re.S)
    assert m, "README.md has no ```sh block after a <!-- vagrant-test --> marker"
    return [re.sub(r"\s+#.*$", "", line).strip() for line in m[1].splitlines() if line.strip()]


def test_readme_vagrant_block_is_the_whole_path():
    cmds = readme_vagrant_commands()
    assert cmds[0] == "vagrant up" and cmds[-1] == "vagrant destroy -f"
    assert any("sudo make demo" in c for c in cmds) and "make vagrant-results" in cmds
    assert any("fabriclab doctor" in c for c in cmds)


def vm_processes() -> list[str]:
    """The daemons and VMs a Vagrant run on libvirt starts: libvirt's, its DHCP server, qemu, and the
    ssh tunnels of forwarded ports."""
    out = subprocess.run(["pgrep", "-a", "-f", r"libvirtd|virtlogd|dnsmasq|qemu-system|ssh .*vagrant"],
                         capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if "pgrep" not in line]


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_readme_vagrant_commands_as_typed(tmp_path):
    before = vm_processes()
    out = tmp_path / "out"
    proc = subprocess.run(["make", "vagrant-test"], cwd=ROOT, env={**os.environ, "FABRICLAB_VAGRANT_OUT": str(out)},
                          capture_output=True, text=True, timeout=2300, stdin=subprocess.DEVNULL)
    tail = (proc.stdout + proc.stderr)[-5000:]
    summary = out / "summary.json"
    assert summary.exists(), f"make vagrant-test wrote no summary (exit {proc.returncode}):\n{tail}"
    result = json.loads(summary.read_text())
    failed = [f"{c['name']}: {c['detail']}" for c in result["checks"] if not c["ok"]]
    names = {c["name"] for c in result["checks"]}
    assert {"the demo's table printed", "doctor: kernel datapath", "doctor: netem", "doctor: red/ecn",
            "results on the host", "every README command ran"} <= names
    left = (out / "left.txt").read_text() if (out / "left.txt").exists() else ""
    assert not failed and not left.strip() and proc.returncode == 0, (
        f"failed {failed}; left behind {left!r}; exit {proc.returncode}\n{tail}")
    started = sorted(set(vm_processes()) - set(before))
    assert not started, f"processes left running: {started}"
    ran = [s["step"] for s in result["steps"]]
    for cmd in readme_vagrant_commands():
        assert cmd in ran, f"README command not run: {cmd}"
