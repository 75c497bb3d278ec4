#!/usr/bin/env bash
# `make vagrant-test`, as root: the README's Vagrant commands, run as written, on vagrant-libvirt with a
# local stand-in for `debian/bookworm64` (scripts/vagrant/box.sh), then checks that the demo's table
# printed, that doctor inside reports the kernel datapath, netem and RED, and that the results reached
# the host; `vagrant destroy -f` at the end, and nothing left behind.
#
# Leave no trace: the box is added to a throw-away VAGRANT_HOME; libvirtd and virtlogd are started here
# only when they are not running (this machine has no systemd), and then stopped by the pids they
# wrote; every libvirt domain, network, storage pool and volume that was not there before is removed,
# and any that is left is reported and fails the run. The project is copied (the working tree as it
# is, tracked and untracked files, without what .gitignore names) into a temporary folder: vagrant
# writes .vagrant/ and the demo results/ there.
#
# Python packages come from a wheelhouse the host's pip filled (cached in $CACHE/wheels-KEY), because
# pip in a guest here cannot verify the package index's certificate; apt in the guest uses Debian's
# mirror through libvirt's NAT. Writes a JSON summary (timings per step, checks) to $FABRICLAB_VAGRANT_OUT
# (default: a fresh folder, printed at the end) and exits non-zero when a check failed.
#
# libvirt driver: FABRICLAB_VAGRANT_DRIVER (kvm or qemu), else KVM only where `make vm-test` found it
# working on this host (a nested KVM guest hangs on this project's machines), else qemu (TCG).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
source scripts/lib.sh
CACHE=${FABRICLAB_VAGRANT_CACHE:-/var/cache/fabriclab/vagrant}
VM_CACHE=${FABRICLAB_VM_CACHE:-/var/cache/fabriclab/vm}
STEP_TIMEOUT=${FABRICLAB_VAGRANT_STEP_TIMEOUT:-1200}
HOST_PACKAGES=(vagrant vagrant-libvirt libvirt-daemon-system libvirt-clients qemu-system-x86 qemu-utils
               mmdebstrap e2fsprogs dnsmasq-base iptables rsync openssh-client python3-pip)

log() { printf '[vagrant-test] %s\n' "$*" >&2; }
die() { printf 'vagrant-test: %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "must run as root (libvirt and the box build need it); try: sudo make vagrant-test"

mapfile -t missing < <(missing_packages "${HOST_PACKAGES[@]}")
if [ ${#missing[@]} -gt 0 ]; then
    # Installing libvirt's daemons does not start them (apt_install): this script starts what it needs.
    log "installing host packages: ${missing[*]}"
    apt_install "${missing[@]}" || die "could not install ${missing[*]} from Debian's packages"
fi

out=${FABRICLAB_VAGRANT_OUT:-$(mktemp -d /tmp/fabriclab-vagrant-out-XXXXXX)}
mkdir -p "$out"
rm -f "$out/summary.json" "$out"/*.log
work=$(mktemp -d /tmp/fabriclab-vagrant-XXXXXX)
chmod 755 "$work"  # libvirt's qemu runs as libvirt-qemu and reads the box's kernel from VAGRANT_HOME
project=$work/project
export VAGRANT_HOME=$work/vagrant.d VAGRANT_DEFAULT_PROVIDER=libvirt VAGRANT_CHECKPOINT_DISABLE=1
export LIBVIRT_DEFAULT_URI=qemu:///system
steps=()   # "name seconds rc" per step, for the summary

stamp() { local start=$SECONDS line; while IFS= read -r line; do printf '%4ds %s\n' $((SECONDS - start)) "$line"; done; }
timed() {  # timed NAME LOGFILE CMD...: run CMD (its output to LOGFILE and to stderr), note the time
    local name=$1 logf=$2 t0 rc
    shift 2
    log "$name"
    t0=$(date +%s.%N)
    set +e
    # Vagrant redraws its upload progress in place: keep those out of the logs. Each line gets the
    # seconds since the step began.
    timeout --kill-after=30 "$STEP_TIMEOUT" "$@" 2>&1 | sed -u 's/\r/\n/g' | grep --line-buffered -v 'Progress: [0-9]*%' \
        | stamp | tee -a "$logf" >&2
    rc=${PIPESTATUS[0]}
    set -e
    steps+=("$name|$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')|$rc")
    return "$rc"
}

# What libvirt held before: anything else at the end is ours to remove.
started_daemons=()
virsh_names() { virsh "$@" 2>/dev/null | sed '/^$/d' | sort || true; }
snapshot() {  # $1: file
    {
        virsh_names list --all --name | sed 's/^/domain /'
        virsh_names net-list --all --name | sed 's/^/network /'
        virsh_names pool-list --all --name | sed 's/^/pool /'
        for pool in $(virsh_names pool-list --name); do
            virsh vol-list "$pool" 2>/dev/null | awk 'NR > 2 && $1 != "" { print $1 }' | sed "s|^|volume $pool/|"
        done
    } | sort >"$1"
}

start_daemon() {  # start_daemon NAME: start it unless it runs; remember its pid file if we did
    local name=$1 pidfile=/run/$1.pid
    if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then return; fi
    if pgrep -x "$name" >/dev/null; then return; fi  # someone else's (systemd's): leave it be
    "/usr/sbin/$name" -d -p "$pidfile"
    for _ in $(seq 50); do [ -s "$pidfile" ] && break; sleep 0.1; done
    [ -s "$pidfile" ] || die "$name did not start"
    started_daemons+=("$pidfile")
    log "started $name (pid $(cat "$pidfile"))"
}

cleanup() {
    local rc=$?
    set +e
    if [ -d "$project/.vagrant" ]; then
        log "vagrant destroy -f (cleanup)"
        (cd "$project" && timeout 300 vagrant destroy -f >>"$out/cleanup.log" 2>&1)
    fi
    # What vagrant-libvirt leaves by design: the box's image in the storage pool, the pool it created,
    # its management network. Remove everything that was not there before.
    if [ -f "$work/before" ]; then
        snapshot "$work/after"
        comm -13 "$work/before" "$work/after" >"$work/ours"
        while read -r kind name; do
            case "$kind" in
                domain) virsh destroy "$name"; virsh undefine "$name" --remove-all-storage ;;
                volume) virsh vol-delete --pool "${name%%/*}" "${name#*/}" ;;
            esac
        done <"$work/ours" >>"$out/cleanup.log" 2>&1
        while read -r kind name; do
            case "$kind" in
                network) virsh net-destroy "$name"; virsh net-undefine "$name" ;;
                pool) virsh pool-destroy "$name"; virsh pool-undefine "$name" ;;
            esac
        done <"$work/ours" >>"$out/cleanup.log" 2>&1
        snapshot "$work/final"
        comm -13 "$work/before" "$work/final" >"$out/left.txt"
        # Networks that were defined but inactive before and that this run started: stop them again.
        for net in $(cat "$work/inactive-nets" 2>/dev/null); do
            virsh net-info "$net" 2>/dev/null | grep -q '^Active:.*yes' && virsh net-destroy "$net" >>"$out/cleanup.log" 2>&1
        done
    fi
    for pidfile in "${started_daemons[@]}"; do
        local pid
        pid=$(cat "$pidfile" 2>/dev/null)
        [ -n "$pid" ] || continue
        kill "$pid" 2>/dev/null
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null
        rm -f "$pidfile"
    done
    # The pool vagrant-libvirt made keeps its folder; an empty one we did not find is ours.
    if [ -n "${made_images_dir:-}" ]; then rmdir /var/lib/libvirt/images 2>/dev/null; fi
    rm -rf --one-file-system "$work"
    if [ -s "$out/left.txt" ]; then
        log "left behind (removal failed; see $out/cleanup.log):"
        sed 's/^/  /' "$out/left.txt" >&2
        [ "$rc" -ne 0 ] || rc=1
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

t_all=$(date +%s.%N)
box=$(bash scripts/vagrant/box.sh | tail -1)
[ -f "$box" ] || die "no box was built (see above)"

# The wheels the guest installs, fetched by the host's pip; cached by what decides them.
wkey=$( { cat pyproject.toml; /usr/bin/python3 --version; } | sha256sum | cut -c1-16)
wheels=$CACHE/wheels-$wkey
if ! ls "$wheels"/*.whl >/dev/null 2>&1; then
    timed "download the Python packages on the host" "$out/wheels.log" \
        bash scripts/vagrant/wheelhouse.sh "$wheels.tmp" || die "pip could not fetch the packages (see $out/wheels.log)"
    rm -rf "$wheels"
    mv "$wheels.tmp" "$wheels"
    for old in "$CACHE"/wheels-*/; do [ "${old%/}" = "$wheels" ] || rm -rf --one-file-system "$old"; done
fi

log "copying the project into $project"
mkdir -p "$project"
if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git -C "$ROOT" ls-files -z --cached --others --exclude-standard \
        | (cd "$ROOT" && xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh) \
        | tar -C "$ROOT" --null -T - -cf - | tar -C "$project" -xf -
else
    tar -C "$ROOT" --exclude=./.venv --exclude=./results --exclude=./.vagrant --exclude=__pycache__ -cf - . \
        | tar -C "$project" -xf -
fi
cp -r "$wheels" "$project/wheelhouse"

[ -d /var/lib/libvirt/images ] || made_images_dir=1
start_daemon virtlogd
start_daemon libvirtd
virsh_names net-list --inactive --name >"$work/inactive-nets"
snapshot "$work/before"

driver=${FABRICLAB_VAGRANT_DRIVER:-}
if [ -z "$driver" ]; then
    verdict=$(cat "$VM_CACHE/kvm-$(uname -r)-$(qemu-system-x86_64 --version | head -1 | awk '{print $4}')" 2>/dev/null || true)
    if [ "$verdict" = kvm ] && [ -w /dev/kvm ]; then driver=kvm; else driver=qemu; fi
fi
export FABRICLAB_VAGRANT_DRIVER=$driver
log "libvirt driver: $driver"

cd "$project"
timed "vagrant box add (the stand-in debian/bookworm64)" "$out/box.log" \
    vagrant box add --name debian/bookworm64 "$box" || die "vagrant box add failed (see $out/box.log)"

# The README's commands, as written: the fenced block after its <!-- vagrant-test --> marker.
python3 - "$ROOT/README.md" >"$work/commands" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"<!-- vagrant-test[^>]*-->\s*```sh\n(.*?)```", text, re.S)
if not m:
    sys.exit("README.md has no ```sh block after a <!-- vagrant-test --> marker")
for line in m.group(1).splitlines():
    cmd = re.sub(r"\s+#.*$", "", line).strip()
    if cmd:
        print(cmd)
EOF
[ -s "$work/commands" ] || die "no Vagrant commands found in README.md"
n=0
failed=""
while IFS= read -r cmd; do
    n=$((n + 1))
    if ! timed "$cmd" "$out/step$n.log" bash -c "$cmd" </dev/null; then
        failed="$cmd"
        break
    fi
done <"$work/commands"

# Checks on what the commands printed and left on the host.
all=$(sed -E "s/^ *[0-9]+s //" "$out"/step*.log 2>/dev/null || true)
checks=()
check() {  # check NAME OK DETAIL
    checks+=("$1|$2|$3")
    if [ "$2" = 1 ]; then log "ok    $1: $3"; else log "FAIL  $1: $3"; fi
}
check "every README command ran" "$([ -z "$failed" ] && echo 1 || echo 0)" "${failed:-all $n ran}"
table=$(grep -E '^(arm|spray|ecmp-single|tcp-ecmp) ' <<<"$all" | head -4 || true)
check "the demo's table printed" "$(grep -q '^arm .*goodput' <<<"$all" && grep -qE '^(spray|ecmp-single|tcp-ecmp) ' <<<"$all" && echo 1 || echo 0)" \
    "$(tr '\n' ';' <<<"$table" | tr -s ' ')"
dp=$(grep -E '\] datapath ' <<<"$all" | head -1 || true)
check "doctor: kernel datapath" "$(grep -q 'kernel' <<<"$dp" && echo 1 || echo 0)" "$(tr -s ' ' <<<"$dp")"
nl=$(grep -E '\] netem ' <<<"$all" | head -1 || true)
check "doctor: netem" "$(grep -q '\[ok' <<<"$nl" && echo 1 || echo 0)" "$(tr -s ' ' <<<"$nl")"
rl=$(grep -E '\] red ' <<<"$all" | head -1 || true)
check "doctor: red/ecn" "$(grep -q '\[ok' <<<"$rl" && echo 1 || echo 0)" "$(tr -s ' ' <<<"$rl")"
res=$(find "$project/results" -name results.json 2>/dev/null | head -1 || true)
check "results on the host" "$([ -n "$res" ] && echo 1 || echo 0)" "${res#"$project"/}"

# Nothing of the VM may remain after the README's own `vagrant destroy -f`.
cd "$ROOT"
python3 - "$out/summary.json" "$driver" "$(awk -v a="$t_all" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')" \
    "${steps[@]/#/step:}" "${checks[@]/#/check:}" <<'EOF'
import json, sys
path, driver, total, *items = sys.argv[1:]
steps, checks = [], []
for item in items:
    kind, rest = item.split(":", 1)
    a, b, c = rest.rsplit("|", 2) if kind == "step" else rest.split("|", 2)
    if kind == "step":
        steps.append({"step": a, "seconds": float(b), "exit": int(c)})
    else:
        checks.append({"name": a, "ok": b == "1", "detail": c})
json.dump({"driver": driver, "total_s": float(total), "steps": steps, "checks": checks}, open(path, "w"), indent=1)
EOF
log "summary in $out/summary.json"
for c in "${checks[@]}"; do [ "$(cut -d'|' -f2 <<<"$c")" = 1 ] || exit 1; done
exit 0
