# Shell helpers shared by scripts/setup.sh, scripts/vm/ and scripts/vagrant/ (sourced, not run).

# The named Debian packages that are not installed, one a line.
missing_packages() {
    local p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
    done
}

# apt-get install the named packages quietly, without starting any daemon they bring: a package's
# service (an sshd on port 22, libvirtd) would be a server the user did not ask for, so policy-rc.d
# answers "not now" for the time of the install. Returns apt-get's status.
apt_install() {
    local own_policy= rc=0
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || return
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && own_policy=1
    fi
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null || rc=$?
    [ -z "$own_policy" ] || rm -f /usr/sbin/policy-rc.d
    return "$rc"
}

# Remove a build's scratch folder: first unmount anything still mounted under it (mmdebstrap unmounts
# what it mounted, but an interrupted build may not have), then delete it without crossing into
# another file system.
remove_scratch() {
    local m
    for m in $(awk -v w="$1" 'index($2, w) == 1 { print $2 }' /proc/mounts | sort -r); do umount -l "$m" || true; done
    rm -rf --one-file-system "$1"
}
