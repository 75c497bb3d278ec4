#!/usr/bin/env bash
# Idempotent set-up for fabriclab on Debian/Ubuntu, as root:
# apt packages, a venv from the system Python (Mininet's module comes from apt), and a running Open vSwitch
# (on the kernel datapath where the kernel has the openvswitch module, as in the VM; userspace otherwise).
# The same script provisions the VM image (scripts/vm/build.sh runs it in the image's chroot, where nothing
# is started) and runs again at each boot of that VM.
#   VENV=DIR               where the venv goes (default .venv)
#   FABRICLAB_DEV_TOOLS=0  leave out Chromium and Vagrant, which only the test suite uses (the live view's
#                          browser test, the Vagrantfile's validation); the VM image does
#   FABRICLAB_IMAGE_BUILD=1  install only, start nothing (building an image in a chroot)
# /etc/fabriclab/setup.conf (FABRICLAB_SETUP_CONF), when present, gives the defaults of VENV and
# FABRICLAB_DEV_TOOLS as VAR=value lines: the Vagrantfile's provisioning writes it, so a later `make demo`
# in the VM keeps its venv in /opt and its test tools left out. The environment still wins.
# A wheelhouse/ folder in the project, when present, makes pip install from it alone (no index): that is
# how a VM whose pip cannot reach the index is provisioned (`make wheelhouse` fills it).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

CONF=${FABRICLAB_SETUP_CONF:-/etc/fabriclab/setup.conf}
if [ -f "$CONF" ]; then
    conf_value() { sed -n "s/^$1=//p" "$CONF" | tail -1; }
    VENV=${VENV:-$(conf_value VENV)}
    FABRICLAB_DEV_TOOLS=${FABRICLAB_DEV_TOOLS:-$(conf_value FABRICLAB_DEV_TOOLS)}
fi
VENV=${VENV:-.venv}
APT_PACKAGES=(mininet openvswitch-switch nftables iperf3 iputils-ping ethtool iproute2 procps kmod
              python3-venv python3-pip tcpdump openssh-client openssh-server sudo libtcmalloc-minimal4 make)
# make: the documented commands (`make demo` in the Vagrant VM) use it, and Debian's minimal systems and
# its Vagrant box lack it.
# openssh-server provides the sshd binary that `fabriclab cluster` starts inside its namespace servers
# (listening on their private underlay only); the system's own sshd service is not started or enabled.
# Vagrant is only used to validate the Vagrantfile; it is optional (not in every Ubuntu release).
OPTIONAL_PACKAGES=(vagrant)
# A C compiler builds pollskip (below) for the userspace datapath's per-switch daemons. Where the kernel
# has the openvswitch module (the VM: its image has no compiler and its boot no network) it is not
# needed, and neither is it while an image is built.
if [ -z "${FABRICLAB_IMAGE_BUILD:-}" ] && [ ! -d /sys/module/openvswitch ] \
   && ! modprobe -q -n openvswitch 2>/dev/null; then
    APT_PACKAGES+=(gcc libc6-dev)
fi
if [ "${FABRICLAB_DEV_TOOLS:-1}" != 0 ]; then
    APT_PACKAGES+=(chromium chromium-driver)
else
    OPTIONAL_PACKAGES=()
fi

log() { printf '[setup] %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
    echo "setup: must run as root (Mininet and Open vSwitch need it); try: sudo make setup" >&2
    exit 1
fi

mapfile -t missing < <(missing_packages "${APT_PACKAGES[@]}")
if [ ${#missing[@]} -gt 0 ]; then
    log "installing apt packages: ${missing[*]}"
    apt_install "${missing[@]}"
    if [[ " ${missing[*]} " == *" openssh-server "* ]] && command -v systemctl >/dev/null \
       && [ -d /run/systemd/system ]; then
        systemctl disable --now ssh.service ssh.socket >/dev/null 2>&1 || true
    fi
fi
for p in "${OPTIONAL_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        log "installing optional package $p"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$p" >/dev/null 2>&1 \
            || log "optional package $p is not available here; skipping"
    fi
done

# The venv must come from the system Python: Mininet's module is installed for /usr/bin/python3 only.
if [ ! -x "$VENV/bin/python" ]; then
    log "creating venv $VENV from /usr/bin/python3 (--system-site-packages)"
    /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
# Reinstall when pyproject.toml's content changes, not its date: a fresh clone (or the VM, which sees the
# project through a share) has new dates on old content.
# Without the dev tools (the VMs) the Python test tools are left out too: under qemu's TCG, pip spends
# minutes on them (selenium and its dependencies, hypothesis) for nothing the VM runs.
# Nor are the installed modules compiled to bytecode there: pip's compiling of every module of numpy,
# matplotlib and scapy is much of its time under TCG, and Python compiles what a command imports when
# it first imports it.
target='.[test]'
compile=()
if [ "${FABRICLAB_DEV_TOOLS:-1}" = 0 ]; then target=.; compile=(--no-compile); fi
stamp="$VENV/.fabriclab-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $target"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    offline=()
    if compgen -G 'wheelhouse/*.whl' >/dev/null; then offline=(--no-index --find-links wheelhouse); fi
    log "installing fabriclab into $VENV (pip install -e $target${offline:+, offline from wheelhouse/})"
    "$VENV/bin/pip" install -q --disable-pip-version-check "${offline[@]}" "${compile[@]}" -e "$target"
    echo "$want" >"$stamp"
fi

# A venv outside the project (the VM's /opt/fabriclab-venv) puts its command on every PATH, sudo's
# included: `vagrant ssh -c 'sudo fabriclab doctor'` works as typed.
case "$VENV" in
    /*) mkdir -p /usr/local/bin && ln -sfn "$VENV/bin/fabriclab" /usr/local/bin/fabriclab ;;
esac

# pollskip (emulator/native/pollskip.c): preloaded into the per-switch Open vSwitch daemons, it saves
# the ~15 reads per wake-up that their poll() already found empty. Rebuilt when its source changes;
# without a C compiler the daemons run without it (setup says so here).
shim_src=emulator/native/pollskip.c
shim="$VENV/lib/fabriclab-pollskip.so"
shim_want=$(sha256sum "$shim_src" | cut -d' ' -f1)
if [ "$(cat "$shim.sha256" 2>/dev/null)" != "$shim_want" ] || [ ! -f "$shim" ]; then
    if command -v gcc >/dev/null 2>&1; then
        log "building $shim"
        gcc -O2 -Wall -shared -fPIC -o "$shim.tmp" "$shim_src" -ldl && mv "$shim.tmp" "$shim" \
            && echo "$shim_want" >"$shim.sha256"
    elif [ ! -d /sys/module/openvswitch ] && ! modprobe -q -n openvswitch 2>/dev/null; then
        log "no C compiler: the switch daemons run without $shim (apt-get install gcc libc6-dev)"
    fi
fi

# In a chroot (the VM image being built: scripts/vm/build.sh sets FABRICLAB_IMAGE_BUILD) nothing is
# started: its kernel is the host's, and so would be the Open vSwitch it started.
if [ -n "${FABRICLAB_IMAGE_BUILD:-}" ] \
   || [ "$(stat -c %d:%i /)" != "$(stat -c %d:%i /proc/1/root/. 2>/dev/null || stat -c %d:%i /)" ]; then
    log "in a chroot: installed only, nothing started"
    exit 0
fi

# The kernel datapath needs the openvswitch module (the VM's kernel has it); without it OVS runs its
# userspace datapath, and fabriclab picks 'user' (fabriclab doctor says which).
if [ -d /sys/module/openvswitch ] || modprobe openvswitch 2>/dev/null; then
    datapath="kernel datapath (openvswitch module loaded)"
else
    datapath="userspace datapath (this kernel has no openvswitch module)"
fi

# Open vSwitch: start it unless ovs-vswitchd already answers.
if ! ovs-vsctl --timeout=3 show >/dev/null 2>&1; then
    log "starting Open vSwitch"
    # The kept heap and tcmalloc: see daemon_env() in emulator/ovs_daemons.py (each port
    # poll's receive buffers would otherwise be returned to the kernel and faulted in again on every
    # wake-up, and glibc's malloc of them is slow).
    MALLOC_TRIM_THRESHOLD_=268435456 LD_PRELOAD="$(ls /usr/lib/*/libtcmalloc_minimal.so.4 2>/dev/null | head -n 1)" \
        /usr/share/openvswitch/scripts/ovs-ctl start --system-id=random --no-monitor >/dev/null 2>&1 || true
    ovs-vsctl --timeout=10 show >/dev/null || { echo "setup: Open vSwitch did not start; see /var/log/openvswitch/" >&2; exit 1; }
fi
log "ready: $($VENV/bin/fabriclab --version 2>/dev/null || echo fabriclab), $(ovs-vsctl --version | head -1), $datapath"
