"""The provided VM: its image's cache key, and (as root) a real boot under qemu running the in-VM checks.

The boot test is what `make vm-test` does: it builds the image when the cache has none (Debian's packages
only), boots it (KVM where it works, TCG otherwise) and reads back the results the guest wrote.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from scripts.vm import guest_checks
from topologies import parse_spec

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "scripts" / "vm" / "build.sh"
KEY_INPUTS = ("scripts/vm/build.sh", "scripts/vm/init", "scripts/setup.sh", "scripts/lib.sh", "pyproject.toml")

# Every check the guest must report, by name; a missing one fails like a failed one.
GUEST_CHECKS = (
    "doctor kernel datapath",
    "doctor netem",
    "doctor red/ecn",
    "fabric up on the kernel datapath",
    "spray splits evenly",
    "ecmp pins one spine",
    "delay shows in ping's RTT",
    "red marks ecn",
    "loss goes through netem",
    "teardown leaves nothing",
)


def image_key(tree: Path) -> str:
    out = subprocess.run(["bash", str(tree / "scripts/vm/build.sh"), "--key"], capture_output=True, text=True,
                         timeout=30, check=True)
    return out.stdout.strip()


def copy_key_inputs(dst: Path) -> None:
    for rel in KEY_INPUTS:
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dst / rel)


def test_image_key_follows_what_goes_into_the_image(tmp_path):
    copy_key_inputs(tmp_path)
    key = image_key(tmp_path)
    assert key == image_key(ROOT) and len(key) == 16
    # The project's code is shared at boot, not baked in: changing it keeps the cached image.
    (tmp_path / "emulator").mkdir()
    (tmp_path / "emulator" / "network.py").write_text("# changed\n")
    assert image_key(tmp_path) == key
    for rel in KEY_INPUTS:
        path = tmp_path / rel
        original = path.read_text()
        path.write_text(original + "\n# changed\n")
        assert image_key(tmp_path) != key, f"{rel} changed but the image key did not"
        path.write_text(original)
    assert image_key(tmp_path) == key


def test_configured_rtt_counts_every_link_both_ways():
    topo = parse_spec("leaf-spine:spines=2,leaves=2,hosts=1,delay=2")
    # h1 - leaf1 - spine - leaf2 - h2: four links, each way.
    assert guest_checks.path_delay_ms(topo, "h1", "h2") == 16.0
    assert guest_checks.path_delay_ms(parse_spec("leaf-spine:spines=1,leaves=1,hosts=2,delay=3"), "h1", "h2") == 12.0


def test_parse_ping():
    text = ("--- 10.0.0.2 ping statistics ---\n30 packets transmitted, 29 received, 3.33% packet loss, time 5800ms\n"
            "rtt min/avg/max/mdev = 16.123/17.456/21.789/0.900 ms\n")
    assert guest_checks.parse_ping(text) == {"sent": 30, "received": 29, "min_ms": 16.123, "avg_ms": 17.456,
                                             "max_ms": 21.789}
    assert guest_checks.parse_ping("connect: Network is unreachable\n") == {}


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_vm_boots_and_passes_its_checks(tmp_path):
    qemu = shutil.which("qemu-system-x86_64")
    out = tmp_path / "out"
    env = {**os.environ, "FABRICLAB_VM_OUT": str(out)}
    proc = subprocess.run(["bash", str(ROOT / "scripts/vm/run.sh"), "test"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1700, stdin=subprocess.DEVNULL)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert shutil.which("qemu-system-x86_64") or qemu, f"qemu-system-x86_64 is missing and was not installed:\n{tail}"
    results_file = out / "results.json"
    assert results_file.exists(), f"the VM wrote no results (exit {proc.returncode}):\n{tail}"
    results = json.loads(results_file.read_text())
    by_name = {c["name"]: c for c in results["checks"]}
    missing = [name for name in GUEST_CHECKS if name not in by_name]
    failed = [f"{c['name']}: {c['detail']}" for c in results["checks"] if not c["ok"]]
    assert not missing and not failed and proc.returncode == 0, (
        f"missing checks {missing}; failed {failed}; exit {proc.returncode}\n{tail}")
    assert by_name["doctor kernel datapath"]["figures"]["datapath"] == "kernel"
    assert by_name["loss goes through netem"]["figures"]["method"] == "netem"
    assert results["vm"]["accel"] in ("kvm", "tcg")


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_vm_shell_runs_doctor_as_typed():
    """`make vm-shell`, driven through a terminal as a person would: its greeting's advice, `fabriclab
    doctor`, works at the prompt (the kernel datapath, netem and RED), and `exit` powers the VM off."""
    import pexpect

    child = pexpect.spawn("make", ["vm-shell"], cwd=str(ROOT), encoding="utf-8", timeout=900,
                          dimensions=(40, 200), env={**os.environ, "TERM": "xterm"})
    try:
        child.expect(r"Try: fabriclab doctor\.", timeout=1500)  # may build the image first
        child.expect(r"root@fabriclab:[^\r\n]*# ")
        child.sendline("fabriclab doctor")
        child.expect(r"all required parts are present|missing: [^\r\n]*")
        report = child.before + child.after
        assert "command not found" not in report, report
        assert child.after.startswith("all required"), report
        lines = {line.split("]", 1)[1].split()[0]: line for line in report.splitlines() if line.strip().startswith("[")}
        assert "kernel" in lines["datapath"], report
        assert "[ok" in lines["netem"] and "[ok" in lines["red"], report
        child.expect(r"root@fabriclab:[^\r\n]*# ")
        child.sendline("exit")
        child.expect(pexpect.EOF, timeout=120)
    finally:
        if child.isalive():
            child.terminate(force=True)  # run.sh's trap stops the qemu it started, by its pid
    child.close()
    assert child.exitstatus == 0, f"make vm-shell exited with {child.exitstatus} (signal {child.signalstatus})"
