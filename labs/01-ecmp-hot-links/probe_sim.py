"""Lab 1, step 1 without root: where the probe's packets would go, from the controller's own entries.

`fabriclab probe --mode all` needs root: it brings a fabric up and reads the switches' counters. This
script asks the simulated engine's forwarding (emulator/sim: the very flow entries the controller
installs, with Open vSwitch's multipath hash reproduced bit for bit) where each of the probe's packets
goes: from the first host to the last, with one fixed UDP source port or one of 256 in turn, as the
probe sends them. It counts packets per spine; it does not measure anything (no queues, no loss):

    python labs/01-ecmp-hot-links/probe_sim.py --packets 2000
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

from emulator.probe import BASE_PORT, PROBE_PORT, ROTATE_SOURCES
from emulator.sim.fabric import SimFabric
from emulator.sim.flowtable import IPPROTO_UDP
from topologies import parse_spec

DEFAULT_TOPO = "leaf-spine:spines=4,leaves=4,hosts=2,rate=20"  # the probe's own default
MODES = ("ecmp", "spray", "single")


def spread(topo_spec: str, mode: str, entropy: str, packets: int) -> Counter[str]:
    """Packets per spine for `packets` datagrams from the first host to the last."""
    topo = parse_spec(topo_spec)
    src, dst = topo.hosts[0], topo.hosts[-1]
    fabric = SimFabric(topo, mode)
    sources = ROTATE_SOURCES if entropy == "rotate" else 1
    counts: Counter[str] = Counter({s.name: 0 for s in topo.switches if s.name.startswith("spine")})
    for i in range(packets):
        key = (src.address, dst.address, IPPROTO_UDP, BASE_PORT + i % sources, PROBE_PORT)
        for node in fabric.route_names(key):
            if node in counts:
                counts[node] += 1
    return counts


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--packets", type=int, default=2000)
    parser.add_argument("--topo", default=DEFAULT_TOPO)
    args = parser.parse_args(argv)
    topo = parse_spec(args.topo)
    print(f"{topo.hosts[0].name} -> {topo.hosts[-1].name}, {args.packets} packets (computed, not measured)")
    for mode in MODES:
        for entropy in ("fixed", "rotate"):
            counts = spread(args.topo, mode, entropy, args.packets)
            row = "  ".join(f"{name} {n:>5}" for name, n in sorted(counts.items()))
            print(f"{mode:<7}{entropy:<8}{row}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
