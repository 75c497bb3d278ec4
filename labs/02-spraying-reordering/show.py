"""Lab 2: what `python lab2/reorder.py [RESULTS_DIR]` prints: the student's functions on sprays in
fabriclab's simulated network (the reordering experiment's two paths, without and with loss), next to
what the transport's own receiver counted, and the measured run of `fabriclab run reordering`."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from experiments.plots import distance_bins
from labs.catalogue import LabError
from labs.grading import load_results
from labs.script import attempt
from transport.core import wire
from transport.core.config import TransportConfig
from transport.core.connection import Connection, MessageAcked
from transport.core.metrics import Stats
from transport.sim.simnet import PathSpec, SimNetwork, drive

# The reordering experiment's paths: one at 10 Mb/s, the other slowed to 3 Mb/s.
PATH_RATES_BPS = (10e6, 3e6)
MTU = 1472  # the emulated fabric's datagrams: a 1500-byte MTU less IP and UDP headers
PACKETS_PER_MESSAGE = 46  # 64 KiB messages of 1430-byte payloads (the last one full here)
MESSAGES = 40


class _Tap(SimNetwork):
    """The simulated network, noting the PSN of every DATA packet it hands to the receiver."""

    def __init__(self, paths: list[PathSpec], seed: int) -> None:
        super().__init__(paths, seed)
        self.arrivals: list[int] = []

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


def simulate(ordered: bool, loss: float, seed: int = 1) -> tuple[list[int], dict[str, Any], int]:
    """Spray MESSAGES messages over the two paths (`loss` on the slow one): the PSNs in the order the
    receiver got them, the receiver's own metrics, and the payload bytes per packet."""
    cfg = TransportConfig(mtu=MTU, path_policy="spray", delivery="ordered" if ordered else "unordered",
                          ack_delay=0.010, ack_batch=8)
    slow = min(PATH_RATES_BPS)
    net = _Tap([PathSpec(rate_bps=rate, delay=0.0002, queue_packets=100, loss=loss if rate == slow else 0.0)
                for rate in PATH_RATES_BPS], seed=seed)
    sender, receiver = Connection(cfg, 1, seed=seed), Connection(cfg, 1, seed=seed + 1)
    for _ in range(MESSAGES):
        sender.send_message(bytes(PACKETS_PER_MESSAGE * cfg.max_payload), now=0.0)
    acked: list[int] = []

    def on_event(side: int, event: object, now: float) -> None:
        if side == 0 and isinstance(event, MessageAcked):
            acked.append(event.msg_id)

    drive((sender, receiver), [(net, 0, 1)], done=lambda: len(acked) >= MESSAGES, time_limit=60.0,
          on_event=on_event)
    return net.arrivals, receiver.metrics()["receiver"], cfg.max_payload


def histogram(distances: list[int]) -> dict[str, int]:
    """Distances in the bins the transport reports them in (1, 2-3, 4-7, ... 1024+), by its own code."""
    stats = Stats()
    stats.reorder_distance.extend(distances)
    return stats.reorder_histogram()


def _hist_line(hist: dict[str, int]) -> str:
    return "  ".join(f"{k}:{hist[k]}" for k in distance_bins(hist) if hist[k]) or "none"


def show_simulation(student: ModuleType, loss: float) -> None:
    print(f"Simulated (transport.sim.simnet): {MESSAGES} messages of {PACKETS_PER_MESSAGE} packets sprayed over "
          f"paths of {PATH_RATES_BPS[0] / 1e6:g} and {PATH_RATES_BPS[1] / 1e6:g} Mb/s"
          + (f", {loss:.0%} loss on the slow one" if loss else ", no loss"))
    runs = {ordered: simulate(ordered, loss) for ordered in (False, True)}
    arrivals, rcv, _ = runs[False]
    dist = attempt(student.reorder_distances, arrivals)
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
        mine = attempt(student.buffer_peak, run_arrivals, k, ordered)
        theirs = (f"   the transport's: {run_rcv['peak_reassembly_bytes'] // payload}"
                  if k == PACKETS_PER_MESSAGE else "")
        print(f"    {label:<40} yours: {'TODO' if mine is None else mine}{theirs}")


def show_measured(target: Path) -> None:
    doc = load_results(target, "reordering")
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


def main(student: ModuleType, argv: list[str]) -> int:
    if len(argv) > 1:
        raise LabError("give at most one results directory, of `fabriclab run reordering --out DIR`")
    show_simulation(student, loss=0.0)
    print()
    show_simulation(student, loss=0.01)
    if argv:
        print()
        show_measured(Path(argv[0]))
    return 0
