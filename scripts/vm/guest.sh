#!/usr/bin/env bash
# Runs inside the fabriclab VM, started by its init (scripts/vm/init) with the mode from the kernel
# command line: `test` runs the in-VM checks (scripts/vm/guest_checks.py) and leaves their results and
# exit code in the results share (/mnt/out); `run` runs the command the host left in /mnt/out/cmd and
# leaves its exit code there; `shell` gives a root shell on the console.
# Both first run the same scripts/setup.sh as the host: here it finds everything installed and starts
# Open vSwitch on the kernel datapath.
set -uo pipefail
mode=${1:-shell}
cd /opt/fabriclab
export FABRICLAB_DEV_TOOLS=0 VENV=/opt/fabriclab-venv HOME=/root LANG=C.UTF-8 TERM=${TERM:-linux}
export PATH=$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# The project is mounted read-only: keep Python's bytecode on the (throw-away) root disk instead.
export PYTHONPYCACHEPREFIX=/var/cache/fabriclab-pycache
# Python runs about 8x slower under qemu's TCG (run.sh says which accelerator on the kernel command
# line): the emulator's waits for processes to start scale by FABRICLAB_SLOWDOWN.
accel=$(grep -o 'fabriclab\.accel=[a-z]*' /proc/cmdline | cut -d= -f2)
if [ "$accel" = tcg ]; then export FABRICLAB_SLOWDOWN=8; fi

t0=$(cut -d' ' -f1 /proc/uptime)
bash scripts/setup.sh
echo "guest: setup.sh took $(awk -v a="$t0" '{ printf "%.1f", $1 - a }' /proc/uptime) s"

case "$mode" in
    test)
        "$VENV/bin/python" scripts/vm/guest_checks.py --out /mnt/out
        rc=$?
        echo "$rc" >/mnt/out/rc
        exit "$rc"
        ;;
    run)
        bash /mnt/out/cmd
        rc=$?
        echo "$rc" >/mnt/out/rc
        exit "$rc"
        ;;
    shell)
        echo "fabriclab VM: the project is in /opt/fabriclab (your working tree, read-only), results go to"
        echo "/mnt/out (shared with the host). Try: fabriclab doctor. Leave with 'exit' (powers the VM off)."
        setsid -c bash -l </dev/ttyS0 >/dev/ttyS0 2>&1
        ;;
    *)
        echo "guest: unknown mode '$mode' (test or shell)" >&2
        exit 2
        ;;
esac
