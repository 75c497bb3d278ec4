#!/usr/bin/env bash
# Idempotent set-up for fabriclab on Debian/Ubuntu, as root:
# apt packages, a venv from the system Python (Mininet's module comes from apt), and a running Open vSwitch.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
APT_PACKAGES=(mininet openvswitch-switch nftables iperf3 iputils-ping ethtool iproute2 procps
              python3-venv python3-pip tcpdump chromium chromium-driver)
# Vagrant is only used to validate the Vagrantfile; it is optional (not in every Ubuntu release).
OPTIONAL_PACKAGES=(vagrant)

log() { printf '[setup] %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
    echo "setup: must run as root (Mininet and Open vSwitch need it); try: sudo make setup" >&2
    exit 1
fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing apt packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
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
stamp="$VENV/.fabriclab-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    log "installing fabriclab into $VENV (pip install -e .[test])"
    "$VENV/bin/pip" install -q --disable-pip-version-check -e '.[test]'
    touch "$stamp"
fi

# Open vSwitch: start it unless ovs-vswitchd already answers.
if ! ovs-vsctl --timeout=3 show >/dev/null 2>&1; then
    log "starting Open vSwitch"
    /usr/share/openvswitch/scripts/ovs-ctl start --system-id=random --no-monitor >/dev/null 2>&1 || true
    ovs-vsctl --timeout=10 show >/dev/null || { echo "setup: Open vSwitch did not start; see /var/log/openvswitch/" >&2; exit 1; }
fi
log "ready: $($VENV/bin/fabriclab --version 2>/dev/null || echo fabriclab), $(ovs-vsctl --version | head -1)"
