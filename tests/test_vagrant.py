"""The VM definition is valid: `vagrant validate` needs no VM, only the Vagrantfile."""

from __future__ import annotations

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
    # --ignore-provider: a CI machine has neither VirtualBox nor libvirt, and validating the file must not
    # depend on a hypervisor being installed.
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
    assert "scripts/setup.sh" in text
    assert "cpus = 2" in text and "memory = 4096" in text
