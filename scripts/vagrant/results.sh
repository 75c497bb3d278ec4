#!/usr/bin/env bash
# `make vagrant-results`: copy the Vagrant VM's /vagrant/results/ into this folder's results/. The
# Vagrantfile shares the project one way (rsync, which needs no NFS server), so results made in the VM
# come back with this step; the files already here are kept.
set -euo pipefail
cd "$(dirname "$0")/../.."
die() { printf 'vagrant-results: %s\n' "$*" >&2; exit 1; }
command -v vagrant >/dev/null || die "vagrant is not installed"
command -v rsync >/dev/null || die "rsync is missing on this machine: apt-get install rsync"
cfg=$(mktemp)
trap 'rm -f "$cfg"' EXIT
vagrant ssh-config >"$cfg" 2>/dev/null || die "no running Vagrant VM here: run 'vagrant up' first"
host=$(awk '/^Host /{ print $2; exit }' "$cfg")
mkdir -p results
# The VM writes its results as root, some of them readable by root alone: read them with sudo there.
rsync -rlt --rsync-path="sudo rsync" -e "ssh -F $cfg" "$host:/vagrant/results/" results/ \
    || die "could not copy the VM's /vagrant/results (above); if the demo has not run yet: vagrant ssh -c 'cd /vagrant && sudo make demo'"
echo "vagrant-results: the VM's results are in $(pwd)/results/"
