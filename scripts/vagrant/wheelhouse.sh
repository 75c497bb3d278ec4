#!/usr/bin/env bash
# Download fabriclab's Python packages (with its test tools) as wheels into DIR, with the system
# Python's pip (the one the venv is built from, so the wheels fit it): `make wheelhouse` fills
# ./wheelhouse, after which scripts/setup.sh installs from it alone. A VM whose pip cannot verify the
# package index's certificate is provisioned this way.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:?usage: wheelhouse.sh DIR}
/usr/bin/python3 -m pip --version >/dev/null 2>&1 \
    || { echo "wheelhouse: the system Python has no pip: apt-get install python3-pip" >&2; exit 1; }
mkdir -p "$dir"
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
# Build from a copy: pip would leave build/ and *.egg-info in the project.
cp -r pyproject.toml README.md topologies emulator transport experiments live labs cli "$src"/
/usr/bin/python3 -m pip wheel -q --disable-pip-version-check --wheel-dir "$dir" "setuptools>=64" wheel "$src[test]"
rm -f "$dir"/fabriclab-*.whl  # setup.sh installs the project itself from its folder (pip install -e)
echo "wheelhouse: $(ls "$dir"/*.whl | wc -l) wheels in $dir"
