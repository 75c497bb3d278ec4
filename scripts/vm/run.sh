#!/usr/bin/env bash
# Boot the fabriclab VM with qemu, as root: `run.sh test` (what `make vm-test` runs) runs the in-VM checks
# and exits non-zero if any failed; `run.sh shell` (`make vm-shell`) gives a root shell on the console;
# `run.sh run CMD...` (`make vm-run CMD='...'`) runs one command inside (in the project, as root, with the
# venv on PATH), shows its output and exits with its status.
# Builds the image first when the cache has none (scripts/vm/build.sh).
#
# The working tree is shared read-only with 9p and mounted over the image's copy, so the VM runs the
# code in front of you; a second share (FABRICLAB_VM_OUT, default a fresh directory) brings the results
# back. The root disk is opened with snapshot=on: nothing a boot does reaches the cached image.
#
# Acceleration: KVM where it works, TCG otherwise, and it says which. A nested KVM guest can hang right
# after the kernel's decompressor, so KVM is tried once per machine (a boot must reach the guest's init
# within FABRICLAB_VM_KVM_WAIT seconds) and the verdict is cached; FABRICLAB_VM_ACCEL=kvm|tcg decides.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
mode=${1:-test}
case "$mode" in
    test | shell) ;;
    run) shift; [ $# -gt 0 ] || { echo "usage: $0 run CMD..." >&2; exit 2; } ;;
    *) echo "usage: $0 test|shell|run CMD..." >&2; exit 2 ;;
esac

CACHE=${FABRICLAB_VM_CACHE:-/var/cache/fabriclab/vm}
MEM=${FABRICLAB_VM_MEM:-2048}
CPUS=${FABRICLAB_VM_CPUS:-$(nproc)}
TIMEOUT=${FABRICLAB_VM_TIMEOUT:-900}
KVM_WAIT=${FABRICLAB_VM_KVM_WAIT:-40}

die() { printf 'vm: %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "must run as root (the image cache and build need it); try: sudo make vm-$mode"

# FABRICLAB_VM_IMAGE=DIR boots a given image directory as it is (to try an image without rebuilding).
dir=${FABRICLAB_VM_IMAGE:-$(bash scripts/vm/build.sh | tail -1)}
[ -f "$dir/manifest.json" ] || die "no image was built (see above)"
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 is missing: apt-get install qemu-system-x86"

out=${FABRICLAB_VM_OUT:-$(mktemp -d /tmp/fabriclab-vm-XXXXXX)}
mkdir -p "$out"
rm -f "$out/rc" "$out/results.json" "$out/console.log" "$out/cmd"
if [ "$mode" = run ]; then printf '%s\n' "$*" >"$out/cmd"; fi
pidfile=$out/qemu.pid

qemu_pid=""
stop_qemu() {
    # End only the qemu this script started, by the pid it recorded.
    local pid=${qemu_pid:-$(cat "$pidfile" 2>/dev/null || true)}
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
    fi
    qemu_pid=""
    rm -f "$pidfile"
}
trap stop_qemu EXIT
trap 'exit 130' INT TERM

qemu_args() {  # $1: kvm or tcg
    local accel
    if [ "$1" = kvm ]; then accel=(-accel kvm -cpu host); else accel=(-accel tcg,thread=multi -cpu max); fi
    printf '%s\n' "${accel[@]}" -m "$MEM" -smp "$CPUS" -nodefaults -no-user-config -no-reboot \
        -kernel "$dir/vmlinuz" -initrd "$dir/initrd.img" \
        -append "root=/dev/vda rw console=ttyS0 quiet panic=-1 init=/usr/local/sbin/fabriclab-init fabriclab.mode=$mode fabriclab.accel=$1" \
        -drive "file=$dir/rootfs.ext4,format=raw,if=virtio,snapshot=on" \
        -netdev user,id=n0 -device virtio-net-pci,netdev=n0 \
        -virtfs "local,path=$ROOT,mount_tag=project,security_model=none,readonly=on" \
        -virtfs "local,path=$out,mount_tag=out,security_model=none" \
        -pidfile "$pidfile"
}

# Which accelerator: FABRICLAB_VM_ACCEL, else the cached verdict on KVM for this host kernel and qemu.
qemu_version=$(qemu-system-x86_64 --version | head -1 | awk '{print $4}')
verdict_file=$CACHE/kvm-$(uname -r)-$qemu_version
accel=${FABRICLAB_VM_ACCEL:-}
probing_kvm=0
if [ -z "$accel" ]; then
    if [ ! -w /dev/kvm ]; then
        accel=tcg; why="no usable /dev/kvm"
    elif [ -f "$verdict_file" ]; then
        accel=$(cat "$verdict_file"); why="cached verdict for this host ($verdict_file)"
    else
        accel=kvm; probing_kvm=1; why="trying KVM: the guest must reach its init within $KVM_WAIT s"
    fi
else
    why="FABRICLAB_VM_ACCEL"
fi

boot_started=0
boot() {  # $1: accel; background boot for test mode; returns qemu's exit status
    mapfile -t args < <(qemu_args "$1")
    echo "vm: booting $(python3 -c 'import json, sys; print("Debian {suite}, kernel {kernel}, OVS {ovs}".format(**json.load(open(sys.argv[1]))))' "$dir/manifest.json") under ${1^^} ($why)"
    boot_started=$(date +%s.%N)
    if [ "$mode" = shell ]; then
        qemu-system-x86_64 "${args[@]}" -nographic -serial mon:stdio
        return
    fi
    qemu-system-x86_64 "${args[@]}" -display none -serial "file:$out/console.log" &
    qemu_pid=$!
}

elapsed() { awk -v a="$boot_started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

if [ "$mode" = shell ]; then
    if [ "$probing_kvm" = 1 ]; then accel=tcg; why="KVM untested here; FABRICLAB_VM_ACCEL=kvm to try it"; fi
    boot "$accel"
    exit
fi

boot "$accel"
if [ "$probing_kvm" = 1 ]; then
    for _ in $(seq $((KVM_WAIT * 2))); do
        grep -q 'fabriclab-init: up' "$out/console.log" 2>/dev/null && break
        kill -0 "$qemu_pid" 2>/dev/null || break
        sleep 0.5
    done
    if grep -q 'fabriclab-init: up' "$out/console.log" 2>/dev/null; then
        echo kvm >"$verdict_file"
    else
        echo "vm: KVM did not reach the guest's init in $KVM_WAIT s (nested KVM hangs here); using TCG"
        stop_qemu
        echo tcg >"$verdict_file"
        accel=tcg; why="KVM hung on this host"
        rm -f "$out/console.log"
        boot tcg
    fi
fi

# Follow the console until qemu exits (the guest powers itself off) or the time is up.
touch "$out/console.log"
tail -n +1 -F --pid="$qemu_pid" "$out/console.log" 2>/dev/null &
tail_pid=$!
deadline=$(( $(date +%s) + TIMEOUT ))
booted=""
while kill -0 "$qemu_pid" 2>/dev/null; do
    if [ -z "$booted" ] && grep -q 'fabriclab-init: up' "$out/console.log"; then booted=$(elapsed); fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
        echo "vm: the guest did not finish in $TIMEOUT s; stopping it"
        stop_qemu
        break
    fi
    # A guest CPU stuck in its kernel for minutes (the watchdog's soft lockup) does not come back:
    # stop now rather than at the deadline.
    if grep -qE 'soft lockup - CPU#[0-9]+ stuck for ([2-9][0-9]{2}|[0-9]{4,})s' "$out/console.log"; then
        echo "vm: the guest's kernel locked up (watchdog: a CPU stuck for minutes; see $out/console.log); stopping it"
        stop_qemu
        break
    fi
    sleep 1
done
wait "$qemu_pid" 2>/dev/null || true
qemu_pid=""
wait "$tail_pid" 2>/dev/null || true
total=$(elapsed)

[ -f "$out/rc" ] || die "the guest left no result in $out (see $out/console.log): it did not finish"
rc=$(cat "$out/rc")
if [ -f "$out/results.json" ]; then
    python3 - "$out/results.json" "${booted:-?}" "$total" "$accel" <<'EOF'
import json, sys
path, booted, total, accel = sys.argv[1:]
r = json.load(open(path))
r["vm"] = {"accel": accel, "boot_to_init_s": None if booted == "?" else float(booted), "total_s": float(total)}
json.dump(r, open(path, "w"), indent=1)
EOF
fi
echo "vm: ${accel^^}, init reached ${booted:-?} s after qemu started, boot to power-off ${total} s; results in $out"
exit "$rc"
