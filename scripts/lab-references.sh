#!/usr/bin/env bash
# Remakes labs/*/reference/: each lab's measured run, made with the commands of the lab's README, so
# that its show script, its results checker and its questions work without root. As root, on an idle
# machine (a loaded one makes runs that flag themselves untrusted):  sudo bash scripts/lab-references.sh [N...]
# Kept per run: results.json, summary.md and the plots; left out: raw/ and arms/ (the endpoints' own
# output and per-arm records, which only `fabriclab report` reads).
set -euo pipefail
cd "$(dirname "$0")/.."
FL=${FABRICLAB:-.venv/bin/fabriclab}
[ "$(id -u)" -eq 0 ] || { echo "lab-references: must run as root (the runs bring fabrics up)" >&2; exit 1; }

keep() {  # keep LAB_DIR TMP_ROOT: copy TMP_ROOT/<experiment>/<run>/ without raw/ and arms/
    local lab=$1 tmp=$2 run
    for run in "$tmp"/*/*/; do
        local dest="$lab/reference/$(basename "$(dirname "$run")")/$(basename "$run")"
        mkdir -p "$dest"
        cp "$run"/results.json "$run"/summary.md "$dest"/
        cp "$run"/*.png "$dest"/ 2>/dev/null || true
    done
}

make_ref() {  # make_ref LAB_DIR -- fabriclab run arguments; -- ... for each further run
    local lab=$1; shift
    local tmp
    tmp=$(mktemp -d)
    rm -rf "$lab/reference"
    local args=()
    for a in "$@" --; do
        if [ "$a" = "--" ]; then
            [ ${#args[@]} -gt 0 ] && "$FL" run "${args[@]}" --out "$tmp" --no-progress
            args=()
        else
            args+=("$a")
        fi
    done
    keep "$lab" "$tmp"
    rm -rf "$tmp"
    echo "lab-references: $lab/reference"
}

want() { [ $# -eq 0 ] || [[ " $* " == *" $N "* ]]; }
N=1; want "$@" && make_ref labs/01-ecmp-hot-links -- ecmp-vs-spray --duration 10
N=2; want "$@" && make_ref labs/02-spraying-reordering -- reordering --duration 5
N=3; want "$@" && make_ref labs/03-loss-recovery -- loss-recovery --duration 5
N=4; want "$@" && make_ref labs/04-failover-path-aware -- failover --duration 8 --reaction-delay 0
N=5; want "$@" && make_ref labs/05-in-server-allreduce -- in-server --duration 3 -- allreduce --duration 10
N=6; want "$@" && make_ref labs/06-your-path-policy -- hot-link \
    --path-policy labs/06-your-path-policy/solution/my_policy.py:MyPolicy --duration 8
N=7; want "$@" && make_ref labs/07-network-is-the-computer -- training \
    --arms ecmp,spray,spray-far-sync,spray-far-async --duration 15
exit 0
