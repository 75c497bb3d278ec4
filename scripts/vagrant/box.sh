#!/usr/bin/env bash
# Build a local stand-in for Vagrant's `debian/bookworm64` libvirt box, as root, from Debian's packages
# only (Vagrant's box catalogue cannot be reached from the machines this project is tested on): what
# `make vagrant-test` boots with the project's own Vagrantfile.
#
# It holds what Debian's own box holds and nothing of fabriclab's: Debian 12 with systemd, its kernel,
# openssh-server, sudo, rsync, ifupdown with DHCP on eth0, and a `vagrant` user with passwordless sudo
# and Vagrant's insecure public key (shipped in Debian's vagrant package). Everything fabriclab needs
# must come from the Vagrantfile's provisioning, as it must on the real box. The root file system is an
# ext4 disk without a partition table, booted directly from the box's kernel and initrd (the box's own
# Vagrantfile tells vagrant-libvirt where they are), so no boot loader is installed.
#
# Cached in $FABRICLAB_VM_CACHE/../vagrant/KEY (default /var/cache/fabriclab/vagrant/KEY), KEY being a
# hash of this script, the suite and the host's apt sources. Prints the .box file on its last line;
# `box.sh --key` prints only the key.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib.sh

SUITE=${FABRICLAB_VM_SUITE:-bookworm}
CACHE=${FABRICLAB_VAGRANT_CACHE:-/var/cache/fabriclab/vagrant}
PACKAGES=systemd,systemd-sysv,linux-image-amd64,initramfs-tools,openssh-server,sudo,rsync,ifupdown
PACKAGES=$PACKAGES,isc-dhcp-client,ca-certificates,iproute2,procps,kmod,less,bash-completion
# Debian's package holds the same key Vagrant ships everywhere: it is public, and only ever for boxes.
INSECURE_KEY=$(ls /usr/share/rubygems-integration/all/gems/vagrant-*/keys/vagrant.pub 2>/dev/null | tail -1 || true)

log() { printf '[vagrant-box] %s\n' "$*" >&2; }
die() { printf 'vagrant-box: %s\n' "$*" >&2; exit 1; }

key=$( {
    echo "$SUITE $PACKAGES"
    cat scripts/vagrant/box.sh
    cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null || true
} | sha256sum | cut -c1-16)
if [ "${1:-}" = --key ]; then
    echo "$key"
    exit 0
fi
[ "$(id -u)" -eq 0 ] || die "must run as root (mmdebstrap needs it)"
[ -n "$INSECURE_KEY" ] || die "Vagrant's insecure public key is missing: apt-get install vagrant"
for tool in mmdebstrap qemu-img mkfs.ext4; do
    command -v "$tool" >/dev/null || die "$tool is missing: apt-get install mmdebstrap qemu-utils e2fsprogs"
done

dir=$CACHE/$key
box=$dir/$SUITE.box
if [ -f "$box" ]; then
    log "box up to date: $box"
    echo "$box"
    exit 0
fi
mkdir -p "$CACHE"
work=$(mktemp -d "$CACHE/.build-XXXXXX")
trap 'remove_scratch "$work"' EXIT
t0=$(date +%s)

log "mmdebstrap $SUITE with systemd, a kernel, openssh-server, sudo, rsync and the vagrant user"
mmdebstrap --mode=root --variant=apt --include="$PACKAGES" \
    --customize-hook='chroot "$1" useradd --create-home --shell /bin/bash vagrant' \
    --customize-hook='echo vagrant:vagrant | chroot "$1" chpasswd' \
    --customize-hook='echo "vagrant ALL=(ALL) NOPASSWD:ALL" >"$1/etc/sudoers.d/vagrant"; chmod 440 "$1/etc/sudoers.d/vagrant"' \
    --customize-hook="mkdir -p \"\$1/home/vagrant/.ssh\"; cp '$INSECURE_KEY' \"\$1/home/vagrant/.ssh/authorized_keys\"" \
    --customize-hook='chmod 700 "$1/home/vagrant/.ssh"; chmod 600 "$1/home/vagrant/.ssh/authorized_keys"; chroot "$1" chown -R vagrant:vagrant /home/vagrant/.ssh' \
    --customize-hook='printf "auto lo\niface lo inet loopback\n\nallow-hotplug eth0\niface eth0 inet dhcp\n" >"$1/etc/network/interfaces"' \
    --customize-hook='printf "/dev/vda / ext4 errors=remount-ro 0 1\n" >"$1/etc/fstab"; echo bookworm >"$1/etc/hostname"' \
    --customize-hook='chroot "$1" systemctl enable ssh.service networking.service' \
    --customize-hook='rm -f "$1"/etc/ssh/ssh_host_*; chroot "$1" ssh-keygen -A' \
    --customize-hook='chroot "$1" apt-get clean' \
    "$SUITE" "$work/rootfs" >&2 || die "mmdebstrap failed (see above)"

mkdir -p "$work/box"
cp "$(ls "$work"/rootfs/boot/vmlinuz-* | sort -V | tail -1)" "$work/box/vmlinuz"
cp "$(ls "$work"/rootfs/boot/initrd.img-* | sort -V | tail -1)" "$work/box/initrd.img"
used_mb=$(du -sm "$work/rootfs" | cut -f1)
size_gb=20  # Debian's box is 20 GB; the qcow2 holds only what is written
log "packing $used_mb MB into a ${size_gb} GB qcow2"
mkfs.ext4 -q -F -L root -d "$work/rootfs" "$work/root.ext4" "$((used_mb + 512))M" >&2
resize2fs -f "$work/root.ext4" "${size_gb}G" >/dev/null 2>&1
qemu-img convert -O qcow2 "$work/root.ext4" "$work/box/box.img"
rm -f "$work/root.ext4"
printf '{"provider": "libvirt", "format": "qcow2", "virtual_size": %d}\n' "$size_gb" >"$work/box/metadata.json"
# The box's own Vagrantfile: boot its kernel directly (the disk has no boot loader). A project's
# Vagrantfile can still override anything here.
cat >"$work/box/Vagrantfile" <<'VF'
Vagrant.configure("2") do |config|
  config.vm.provider :libvirt do |lv|
    lv.kernel = File.join(__dir__, "vmlinuz")
    lv.initrd = File.join(__dir__, "initrd.img")
    lv.cmd_line = "root=/dev/vda rw console=ttyS0 net.ifnames=0 quiet"
  end
end
VF
tar -C "$work/box" -cf "$work/$SUITE.box" metadata.json Vagrantfile box.img vmlinuz initrd.img
for old in "$CACHE"/*/; do
    [ "${old%/}" = "$dir" ] || [ ! -f "$old/$SUITE.box" ] || rm -rf --one-file-system "$old"
done
mkdir -p "$dir"
mv "$work/$SUITE.box" "$box"
log "built $box in $(( $(date +%s) - t0 )) s ($used_mb MB used)"
echo "$box"
