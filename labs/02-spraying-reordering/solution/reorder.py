"""Lab 2, packet spraying and reordering: SOLUTION (the answer key; students start from starter/).

Two functions over the order in which a receiver saw a flow's packets (their PSNs, 0, 1, 2, ...): how
far each late packet arrived behind (the reorder distance), and how many packets a receiver must hold
at once when it hands data over in whole messages, in order or not. Run this file to see them applied to
a sprayed transfer in fabriclab's simulated network, and, given a results directory of `fabriclab run
reordering`, next to what the emulated fabric measured:

    python lab2/reorder.py results/lab2
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def reorder_distances(arrivals: list[int]) -> list[int]:
    """For every packet that arrives after a packet with a higher PSN: the highest PSN seen before it
    minus its own PSN, in arrival order. A PSN seen before is a duplicate: it is skipped."""
    seen: set[int] = set()
    highest = -1
    out = []
    for psn in arrivals:
        if psn in seen:
            continue
        seen.add(psn)
        if psn < highest:
            out.append(highest - psn)
        else:
            highest = psn
    return out


def buffer_peak(arrivals: list[int], packets_per_message: int, ordered: bool) -> int:
    """The most packets the receiver holds at once: right after each arrival, before it hands anything
    over, count the packets in memory (the one just arrived included). Message m is PSNs
    m*k .. m*k+k-1 (k = packets_per_message). A complete message is handed over at once when
    unordered, and only once every earlier message has been handed over when ordered. Duplicates
    are dropped."""
    k = packets_per_message
    seen: set[int] = set()
    held: dict[int, int] = {}  # message -> packets of it in memory
    in_memory = 0
    next_msg = 0  # ordered: the next message to hand over
    peak = 0
    for psn in arrivals:
        if psn in seen:
            continue
        seen.add(psn)
        msg = psn // k
        held[msg] = held.get(msg, 0) + 1
        in_memory += 1
        peak = max(peak, in_memory)
        if ordered:
            while held.get(next_msg) == k:
                in_memory -= held.pop(next_msg)
                next_msg += 1
        elif held[msg] == k:
            in_memory -= held.pop(msg)
    return peak


# ---- You do not need to change anything below: it applies your functions to sprayed transfers. ----

# The reordering experiment's paths: one at 10 Mb/s, the other slowed to 3 Mb/s.
PATH_RATES_BPS = (10e6, 3e6)
MTU = 1472  # the emulated fabric's datagrams: a 1500-byte MTU less IP and UDP headers
PACKETS_PER_MESSAGE = 46  # 64 KiB messages of 1430-byte payloads (the last one full here)
MESSAGES = 40
BINS = ((1, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 63), (64, 127), (128, 255), (256, 511),
        (512, 1023), (1024, None))


def histogram(distances: list[int]) -> dict[str, int]:
    """Distances in the bins the transport reports them in: 1, 2-3, 4-7, ... 1024+."""
    out = {}
    for lo, hi in BINS:
        label = str(lo) if lo == hi else (f"{lo}+" if hi is None else f"{lo}-{hi}")
        out[label] = sum(1 for d in distances if d >= lo and (hi is None or d <= hi))
    return out


def simulate(ordered: bool, loss: float, seed: int = 1) -> tuple[list[int], dict[str, Any], int]:
    """Spray MESSAGES messages over two paths in transport.simnet: the PSNs in the order the receiver
    got them, the receiver's own metrics, and the payload bytes per packet."""
    from transport import wire
    from transport.config import TransportConfig
    from transport.connection import Connection, MessageAcked
    from transport.simnet import PathSpec, SimNetwork, drive

    class Tap(SimNetwork):
        """The simulated network, noting the PSN of every DATA packet it hands to the receiver."""

        arrivals: list[int]

        def pop_due(self, now: float) -> list[tuple[int, bytes]]:
            out = super().pop_due(now)
            for dst, data in out:
                try:
                    pkt = wire.decode(data)
                except wire.WireError:
                    continue
                if dst == 1 and isinstance(pkt, wire.DataPacket):
                    self.arrivals.append(pkt.psn)
            return out

    cfg = TransportConfig(mtu=MTU, path_policy="spray", delivery="ordered" if ordered else "unordered",
                          ack_delay=0.010, ack_batch=8)
    paths = [PathSpec(rate_bps=rate, delay=0.0002, queue_packets=100, loss=loss if rate == min(PATH_RATES_BPS)
                      else 0.0) for rate in PATH_RATES_BPS]
    net = Tap(paths, seed=seed)
    net.arrivals = []
    sender, receiver = Connection(cfg, 1, seed=seed), Connection(cfg, 1, seed=seed + 1)
    for _ in range(MESSAGES):
        sender.send_message(bytes(PACKETS_PER_MESSAGE * cfg.max_payload), now=0.0)
    acked: list[int] = []

    def on_event(side: int, event: object, now: float) -> None:
        if side == 0 and isinstance(event, MessageAcked):
            acked.append(event.msg_id)

    drive((sender, receiver), [(net, 0, 1)], done=lambda: len(acked) >= MESSAGES, time_limit=60.0, on_event=on_event)
    return net.arrivals, receiver.metrics()["receiver"], cfg.max_payload


def _try(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except NotImplementedError:
        return None


def _hist_line(hist: dict[str, int]) -> str:
    labels = list(histogram([]))  # smallest distance first, whatever order `hist` came in
    return "  ".join(f"{k}:{hist[k]}" for k in labels if hist.get(k)) or "none"


def show_simulation(loss: float) -> None:
    print(f"Simulated (transport.simnet): {MESSAGES} messages of {PACKETS_PER_MESSAGE} packets sprayed over "
          f"paths of {PATH_RATES_BPS[0] / 1e6:g} and {PATH_RATES_BPS[1] / 1e6:g} Mb/s"
          + (f", {loss:.0%} loss on the slow one" if loss else ", no loss"))
    runs = {ordered: simulate(ordered, loss) for ordered in (False, True)}
    arrivals, rcv, _ = runs[False]
    dist = _try(reorder_distances, arrivals)
    print(f"  {len(arrivals)} packets arrived; out of order: yours "
          + ("TODO" if dist is None else f"{len(dist)} ({len(dist) / len(arrivals):.0%})")
          + f", the transport's receiver {rcv['out_of_order']}")
    print(f"  reorder distance, yours:      {'TODO' if dist is None else _hist_line(histogram(dist))}")
    print(f"  reorder distance, receiver's: {_hist_line(rcv['reorder_distance'])}")
    print("  packets the receiver holds at most:")
    for label, k, ordered in (("whole messages, unordered (SRD)", PACKETS_PER_MESSAGE, False),
                              ("whole messages, ordered", PACKETS_PER_MESSAGE, True),
                              ("every packet in order (a byte stream)", 1, True),
                              ("every packet placed on arrival (RDMA)", 1, False)):
        run_arrivals, run_rcv, payload = runs[ordered]
        mine = _try(buffer_peak, run_arrivals, k, ordered)
        theirs = (f"   the transport's: {run_rcv['peak_reassembly_bytes'] // payload}"
                  if k == PACKETS_PER_MESSAGE else "")
        print(f"    {label:<40} yours: {'TODO' if mine is None else mine}{theirs}")


def show_measured(target: Path) -> int:
    from labs.catalogue import LabError
    from labs.grading import load_results

    try:
        doc = load_results(target, "reordering")
    except LabError as exc:
        print(f"reorder.py: {exc}", file=sys.stderr)
        return 2
    print(f"Measured on the emulated fabric ({target}):")
    for arm in doc["arms"]:
        r = arm.get("reorder") or {}
        if arm.get("error") or not r:
            print(f"  {arm['name']}: no reordering data ({arm.get('error') or 'empty'})")
            continue
        size = next((f.get("message_size") for f in arm["flows"] if f.get("message_size")), 0) or 65536
        print(f"  {arm['name']}: {r['out_of_order_fraction']:.0%} out of order, distances "
              f"{_hist_line(r['distance_histogram'])}; reassembly peaked at "
              f"{r['peak_reassembly_bytes'] / size:.2f} messages")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print("usage: python reorder.py [RESULTS_DIR]   (from `fabriclab run reordering --out RESULTS_DIR`)",
              file=sys.stderr)
        return 2
    show_simulation(loss=0.0)
    print()
    show_simulation(loss=0.01)
    if argv:
        print()
        return show_measured(Path(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
