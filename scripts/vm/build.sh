#!/usr/bin/env bash
# Build the fabriclab VM image (what `make vm` runs), as root, from Debian's packages only:
# mmdebstrap makes a Debian 12 root file system with its kernel, the project's own scripts/setup.sh
# provisions it in a chroot (apt packages, the venv; nothing started), and mkfs.ext4 packs it into a raw
# disk image beside the image's kernel and initrd.
#
# The image is cached outside the clone, in $FABRICLAB_VM_CACHE (default /var/cache/fabriclab/vm)/KEY,
# KEY being a hash of everything that goes into it (this script, the guest's init, setup.sh,
# pyproject.toml, the Debian suite and the host's apt sources); it is rebuilt only when one of them
# changes. The project's code is not part of the key: each boot mounts the working tree over the copy
# made here (scripts/vm/run.sh), so the VM always runs the code in front of you.
#
# Python packages are downloaded on the host (the host's pip, its index and certificates) into a
# wheelhouse and installed offline in the chroot. Prints the image's directory on its last line;
# `build.sh --key` prints only the cache key (no root needed).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
source scripts/lib.sh

SUITE=${FABRICLAB_VM_SUITE:-bookworm}
CACHE=${FABRICLAB_VM_CACHE:-/var/cache/fabriclab/vm}
HOST_PACKAGES=(qemu-system-x86 mmdebstrap e2fsprogs)
# What the image needs besides what setup.sh installs: a kernel (with the openvswitch, netem, RED and
# 9p modules), and what the guest's init uses.
IMAGE_PACKAGES=linux-image-amd64,initramfs-tools,kmod,iproute2,procps,ca-certificates,python3,mount,mawk

log() { printf '[vm-build] %s\n' "$*" >&2; }
die() { printf 'vm-build: %s\n' "$*" >&2; exit 1; }

key=$( {
    echo "$SUITE $IMAGE_PACKAGES"
    cat scripts/vm/build.sh scripts/vm/init scripts/setup.sh scripts/lib.sh pyproject.toml
    cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null || true
} | sha256sum | cut -c1-16)
if [ "${1:-}" = --key ]; then
    echo "$key"
    exit 0
fi

[ "$(id -u)" -eq 0 ] || die "must run as root (mmdebstrap and the chroot need it); try: sudo make vm"

mapfile -t missing < <(missing_packages "${HOST_PACKAGES[@]}")
if [ ${#missing[@]} -gt 0 ]; then
    log "installing host packages: ${missing[*]}"
    apt_install "${missing[@]}" || die "could not install ${missing[*]} from Debian's packages"
fi

dir=$CACHE/$key
if [ -f "$dir/manifest.json" ]; then
    log "image up to date: $dir"
    echo "$dir"
    exit 0
fi

mkdir -p "$CACHE"
work=$(mktemp -d "$CACHE/.build-XXXXXX")
trap 'remove_scratch "$work"' EXIT
t0=$(date +%s)

log "staging the project and downloading its Python packages on the host"
mkdir -p "$work/src" "$work/wheels"
tar -C "$ROOT" --exclude=./.git --exclude=./.venv --exclude=./results --exclude=__pycache__ \
    --exclude='*.egg-info' --exclude=./.pytest_cache --exclude=./.ruff_cache -cf - . | tar -C "$work/src" -xf -
if ! /usr/bin/python3 -m pip wheel -q --disable-pip-version-check --wheel-dir "$work/wheels" \
        "setuptools>=64" wheel "$work/src" >"$work/pip.log" 2>&1; then
    tail -20 "$work/pip.log" >&2
    die "pip could not fetch fabriclab's Python packages (above)"
fi

log "mmdebstrap $SUITE ($IMAGE_PACKAGES), then scripts/setup.sh in the chroot"
# The chroot starts clean (env -i): the host's pip settings must not leak in; pip installs from the
# wheelhouse only.
mmdebstrap --mode=root --variant=apt --include="$IMAGE_PACKAGES" \
    --customize-hook="mkdir -p \"\$1/opt/fabriclab\" \"\$1/tmp/wheels\"" \
    --customize-hook="sync-in '$work/src' /opt/fabriclab" \
    --customize-hook="sync-in '$work/wheels' /tmp/wheels" \
    --customize-hook="copy-in '$ROOT/scripts/vm/init' /usr/local/sbin" \
    --customize-hook="mv \"\$1/usr/local/sbin/init\" \"\$1/usr/local/sbin/fabriclab-init\"; chmod 755 \"\$1/usr/local/sbin/fabriclab-init\"" \
    --customize-hook="chroot \"\$1\" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
        VENV=/opt/fabriclab-venv FABRICLAB_DEV_TOOLS=0 FABRICLAB_IMAGE_BUILD=1 \
        PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/wheels bash /opt/fabriclab/scripts/setup.sh" \
    --customize-hook="rm -rf \"\$1/tmp/wheels\"; echo fabriclab >\"\$1/etc/hostname\"" \
    --customize-hook="chroot \"\$1\" apt-get clean" \
    "$SUITE" "$work/rootfs" >&2 || die "mmdebstrap failed (see above)"

kernel=$(ls "$work"/rootfs/boot/vmlinuz-* | sort -V | tail -1)
initrd=$(ls "$work"/rootfs/boot/initrd.img-* | sort -V | tail -1)
[ -f "$kernel" ] && [ -f "$initrd" ] || die "the image has no kernel or initrd in /boot"
mkdir -p "$work/out"
cp "$kernel" "$work/out/vmlinuz"
cp "$initrd" "$work/out/initrd.img"
used_mb=$(du -sm "$work/rootfs" | cut -f1)
size_mb=$((used_mb + 1536))  # room for what runs inside (each boot writes to a throw-away overlay)
log "packing $used_mb MB into a $size_mb MB ext4 image"
mkfs.ext4 -q -F -L fabriclab -d "$work/rootfs" "$work/out/rootfs.ext4" "${size_mb}M" >&2
secs=$(( $(date +%s) - t0 ))
cat >"$work/out/manifest.json" <<EOF
{"key": "$key", "suite": "$SUITE", "kernel": "$(basename "$kernel" | sed 's/^vmlinuz-//')",
 "ovs": "$(chroot "$work/rootfs" dpkg-query -W -f='${Version}' openvswitch-switch)",
 "rootfs_used_mb": $used_mb, "image_mb": $size_mb, "build_s": $secs, "built": "$(date -u +%FT%TZ)"}
EOF

# Older images are of no further use: keep only this one.
for old in "$CACHE"/*/; do
    [ "${old%/}" = "$dir" ] || [ ! -f "$old/manifest.json" ] || rm -rf --one-file-system "$old"
done
rm -rf "$dir"
mv "$work/out" "$dir"
log "built $dir in $secs s ($used_mb MB used, kernel $(basename "$kernel"))"
echo "$dir"
