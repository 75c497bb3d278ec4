"""Lab 2 checker: packet spraying and reordering.

On a folder of code (the lab's starter/ or solution/, or your copy): reorder.py's functions against the
transport's own receiver (`transport.core.connection.Connection`), fed the same packets in the same order:
the reorder distances it records, and the most payload it held at once (its `peak_reassembly_bytes`,
in packets), with unordered and ordered delivery. The arrival orders are hand-made cases and sprays
over two paths of different speed, two of them drawn from the seed the checker prints. The student's
module runs with fabriclab's packages out of reach: an answer that asks the transport's receiver fails.

On a results directory of `fabriclab run reordering`: the measured run, judged with margins (never
exact figures): spraying over the two paths reorders a large share of the packets and a single path
does not; the transport does not mistake that reordering for loss; its reassembly memory stays around
a message; and oblivious spraying, sending half its packets over the slow path, is held to twice that
path's rate.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from experiments.scenarios import reordering
from labs import grading
from transport.core import wire
from transport.core.config import TransportConfig
from transport.core.connection import Connection

MODULE = "reorder.py"
EXPERIMENT = "reordering"
MTU = 100  # small datagrams: the receiver's bookkeeping is the same, the checker faster

# Thresholds for a measured run, with margin over what the default run gives (spray: 48 % of packets
# out of order, 4 spurious retransmissions for 972 late packets, reassembly peak 1.26 messages, 5.6 Mb/s
# over paths of 10 and 3 Mb/s; single path: none out of order).
SPRAY_MIN_OOO = 0.15
SINGLE_MAX_OOO = 0.05
MAX_SPURIOUS_PER_LATE = 0.05
MAX_REASSEMBLY_MESSAGES = 4.0
SLOW_PATH_SLACK = 1.1


def check(target: Path) -> list[grading.Check]:
    if grading.is_code_dir(target):
        return check_code(target)
    return check_results(grading.load_results(target, EXPERIMENT))


# ---- the student's code ---------------------------------------------------------------------------


def two_paths(packets: int, slow_factor: float, seed: int, lost: tuple[int, ...] = ()) -> list[int]:
    """PSNs in arrival order when packets alternate between a fast path and one `slow_factor` times
    slower, each a FIFO queue; the `lost` PSNs arrive again (retransmitted) after the rest."""
    rng = random.Random(seed)
    busy = [0.0, 0.0]
    times = []
    for psn in range(packets):
        path = psn % 2
        service = 1.0 if path == 0 else slow_factor
        busy[path] = max(busy[path], psn * 0.5) + service
        times.append((busy[path] + rng.random() * 0.1, psn))
    order = [psn for _, psn in sorted(times) if psn not in lost]
    return order + list(lost)


def _cases() -> dict[str, list[int]]:
    shuffled = list(range(120))
    rng = random.Random(7)
    for i in range(0, 120, 6):
        j = min(119, i + rng.randrange(1, 9))
        shuffled[i], shuffled[j] = shuffled[j], shuffled[i]
    return {
        "in order": list(range(24)),
        "one late packet": [0, 1, 3, 4, 5, 2, 6, 7],
        "duplicates": [0, 2, 1, 2, 3, 1, 5, 4, 4, 6, 7],
        "a packet lost and resent last": [p for p in range(16) if p != 3] + [3],
        "seeded swaps": shuffled,
        "two paths, one 3x slower": two_paths(240, 3.0, seed=1),
        "two paths, one 1.5x slower, two losses, duplicates": [*two_paths(240, 1.5, seed=2, lost=(41, 130)), 41, 77],
        **_random_cases(),
    }


def _random_cases(count: int = 2) -> dict[str, list[int]]:
    """Sprays drawn from this run's seed: any slow path, a few losses, a few duplicates."""
    rng = grading.case_rng("lab2 arrivals")
    cases = {}
    for _ in range(count):
        packets, slow = rng.randint(40, 200), round(rng.uniform(1.1, 5.0), 2)
        lost = tuple(sorted(rng.sample(range(packets), rng.randint(0, 3))))
        arrivals = two_paths(packets, slow, seed=rng.randrange(1 << 30), lost=lost)
        arrivals += rng.sample(range(packets), rng.randint(0, 3))
        cases[f"drawn: two paths, one {slow}x slower, {packets} packets, lost {list(lost)}"] = arrivals
    return cases


def _receive(arrivals: list[int], per_message: int, ordered: bool) -> tuple[Connection, int]:
    """The transport's receiver after these DATA packets (message m = PSNs m*k .. m*k+k-1, every
    fragment a full payload); and its payload bytes per packet."""
    cfg = TransportConfig(mtu=MTU, delivery="ordered" if ordered else "unordered")
    conn = Connection(cfg, 1)
    size = cfg.max_payload
    for n, psn in enumerate(arrivals):
        msg, index = divmod(psn, per_message)
        pkt = wire.DataPacket(conn_id=1, psn=psn, msg_id=msg, frag_index=index, frag_count=per_message,
                              msg_len=per_message * size, timestamp=n, ev=0, payload=bytes(size))
        conn.receive_datagram(wire.encode(pkt), now=n * 1e-4)
    return conn, size


def receiver_distances(arrivals: list[int]) -> list[int]:
    conn, _ = _receive(arrivals, 1, ordered=False)
    return list(conn.stats.reorder_distance)


def receiver_peak(arrivals: list[int], per_message: int, ordered: bool) -> int:
    conn, size = _receive(arrivals, per_message, ordered)
    return conn.stats.peak_reassembly_bytes // size


def check_code(folder: Path) -> list[grading.Check]:
    mod = grading.load_module(folder, MODULE)
    if isinstance(mod, grading.Check):
        return [mod]
    cases = _cases()
    distance_cases = {name: (arrivals,) for name, arrivals in cases.items()}
    checks = [grading.agrees("reorder distances", mod, "reorder_distances", distance_cases, receiver_distances,
                             what="the transport's receiver")]
    for ordered in (False, True):
        peak_cases = {f"{name}, {k} packet(s) per message": (arrivals, k, ordered)
                      for name, arrivals in cases.items() for k in (1, 4)}
        kind = "ordered" if ordered else "unordered"
        checks.append(grading.agrees(f"buffer, {kind} delivery", mod, "buffer_peak", peak_cases, receiver_peak,
                                     what=f"the transport's receiver ({kind}, peak_reassembly_bytes in packets)"))
    return checks


# ---- a measured run -------------------------------------------------------------------------------


def check_results(doc: dict[str, Any]) -> list[grading.Check]:
    spray, single = grading.arm(doc, reordering.SPRAY_UNORDERED), grading.arm(doc, reordering.SINGLE_ORDERED)
    sr, gr = spray.get("reorder") or {}, single.get("reorder") or {}
    late = sr.get("out_of_order") or 0
    size = next((f["message_size"] for f in spray["flows"] if f.get("message_size")), None) or 65536
    slow = min((f["value"] for f in spray.get("faults") or [] if f.get("kind") == "rate"), default=None)
    checks = [
        grading.at_least("spraying reorders", sr.get("out_of_order_fraction"), SPRAY_MIN_OOO,
                         "spray-unordered's share of packets out of order"),
        grading.at_most("one path keeps order", gr.get("out_of_order_fraction"), SINGLE_MAX_OOO,
                        "single-ordered's share of packets out of order"),
        grading.at_most("reordering is not taken for loss", sr.get("spurious_retransmissions"),
                        MAX_SPURIOUS_PER_LATE * late,
                        f"spray-unordered's spurious retransmissions (for {late} late packets; bound 5 % of them)"),
        grading.at_most("reassembly memory stays small", (sr.get("peak_reassembly_bytes") or 0) / size,
                        MAX_REASSEMBLY_MESSAGES, f"spray-unordered's peak reassembly in {size}-byte messages"),
    ]
    if slow is None:
        checks.append(grading.failed("spraying is held to the slow path",
                                     "the run has no slowed link (a `rate` fault): run the reordering experiment"))
    else:
        checks.append(grading.at_most(
            "spraying is held to the slow path", spray["goodput_bps"] / 1e6, SLOW_PATH_SLACK * 2 * slow,
            f"spray-unordered's goodput in Mb/s (half its packets cross the {slow:g} Mb/s link; bound 1.1 x 2 x it)"))
    return checks
