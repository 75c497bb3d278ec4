"""Lab 3 checker: loss recovery, go-back-N against selective repeat.

On a folder of code (the lab's starter/ or solution/, or your copy): recovery.py's models against the
transport itself. `transmissions` against the DATA packets a real sender (`transport.core.connection`)
puts on the wire in fabriclab's simulated network (`transport.sim.simnet`) when the first transmissions
of given PSNs are dropped, with a fixed window and a long round trip: exactly, on sixteen fixed
transfers and six drawn from the seed the checker prints; `efficiency` against that sender's share of
useful transmissions under random loss; `stall_probability` against a Monte Carlo of the loss process.

On a results directory of `fabriclab run loss-recovery`: the measured run, judged with margins (never
exact figures): go-back-N retransmits many times what selective repeat does, selective repeat keeps its
goodput at 5 % loss while go-back-N loses it, and go-back-N's slowest messages wait longest.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np

from experiments.scenarios.loss_recovery import arm_name
from labs import grading
from transport.core import wire
from transport.core.config import TransportConfig
from transport.core.connection import Connection, MessageAcked
from transport.sim.simnet import PathSpec, SimNetwork, drive

MODULE = "recovery.py"
EXPERIMENT = "loss-recovery"

# Thresholds for a measured run, with margin over what the default run gives (at 1 % loss go-back-N
# resent 6x as many packets per packet delivered as selective repeat, at 5 % 6x; at 5 % selective repeat
# kept 99 % of its lossless goodput and carried 1.3-1.5x go-back-N's, whose median message took 1.33x as
# long). The median, not the p99: a 5 s run completes a few hundred messages, so its p99 rests on a handful
# of them and ranged from 1.15x to 2.2x between runs.
RETX_RATIO = 2.0
SELECTIVE_KEEPS = 0.8
SELECTIVE_OVER_GOBACKN = 1.2
MEDIAN_RATIO = 1.1


def check(target: Path) -> list[grading.Check]:
    if grading.is_code_dir(target):
        return check_code(target)
    return check_results(grading.load_results(target, EXPERIMENT))


# ---- the transport in the simulated network ------------------------------------------------------


_FLAGS = [name for name, _, _ in wire.DATA_FIELDS].index("flags")
_PSN = [name for name, _, _ in wire.DATA_FIELDS].index("psn")


class _Dropping(SimNetwork):
    """The simulated network, dropping DATA from the sender: the first transmission of the PSNs in
    `first`, and any transmission with probability `loss` (ACKs always get through)."""

    def __init__(self, paths: list[PathSpec], seed: int, first: set[int], loss: float) -> None:
        super().__init__(paths, seed)
        self.first = set(first)
        self.loss = loss
        self.loss_rng = random.Random(seed + 1)

    def send(self, src: int, data: bytes, ev: int, now: float) -> None:
        if src == 0 and data[wire.TYPE_OFFSET] == wire.TYPE_DATA:
            # The header's fields without the CRC check a full decode would make: the sender wrote them.
            fields = wire.DATA_STRUCT.unpack_from(data)
            flags, psn = fields[_FLAGS], fields[_PSN]
            first = psn in self.first and not flags & wire.FLAG_RETRANSMIT
            if first or (self.loss and self.loss_rng.random() < self.loss):
                self.first.discard(psn)
                return
        super().send(src, data, ev, now)


def transport_sent(packets: int, lost: set[int], recovery: str, window: int, loss: float = 0.0,
                   seed: int = 0) -> int:
    """DATA packets the transport's sender transmits to deliver `packets` one-packet messages over one
    path of 100 Mb/s and 10 ms round trip, with a fixed window and no pacing: the window, not the link,
    limits it, as the models assume."""
    cfg = TransportConfig(mtu=200, recovery=recovery, path_policy="single", num_evs=1, cc="fixed",
                          window=window, pacing=False)
    net = _Dropping([PathSpec(rate_bps=100e6, delay=0.005, queue_packets=10_000)], seed, lost, loss)
    sender, receiver = Connection(cfg, 1, seed=seed), Connection(cfg, 1, seed=seed + 1)
    for _ in range(packets):
        sender.send_message(bytes(cfg.max_payload), now=0.0)
    acked: list[int] = []

    def on_event(side: int, event: object, now: float) -> None:
        if side == 0 and isinstance(event, MessageAcked):
            acked.append(event.msg_id)

    drive((sender, receiver), [(net, 0, 1)], done=lambda: len(acked) >= packets, time_limit=600.0, on_event=on_event)
    return sender.metrics()["sender"]["packets_sent"]


def transport_efficiency(loss: float, recovery: str, window: int) -> float:
    packets = 3000
    return packets / transport_sent(packets, set(), recovery, window, loss=loss)


def monte_carlo_stall(loss: float, packets: int, flows: int, trials: int = 200_000) -> float:
    lost = np.random.default_rng(11).binomial(packets * flows, loss, size=trials)
    return float(np.mean(lost > 0))


# ---- the student's code ---------------------------------------------------------------------------


def _random_sent_cases(count: int = 6) -> dict[str, tuple[int, set[int], str, int]]:
    """Transfers drawn from this run's seed: any window, any size, up to five losses anywhere."""
    rng = grading.case_rng("lab3 transmissions")
    cases = {}
    for i in range(count):
        recovery = ("selective", "gobackn")[i % 2]
        packets, window = rng.randint(20, 300), rng.choice((2, 3, 4, 8, 12, 16, 32))
        lost = set(rng.sample(range(packets), rng.randint(1, 5)))
        cases[f"{recovery}, window {window}, {packets} packets, lost {sorted(lost)} (drawn)"] = (
            packets, lost, recovery, window)
    return cases


def check_code(folder: Path) -> list[grading.Check]:
    mod = grading.load_module(folder, MODULE)
    if isinstance(mod, grading.Check):
        return [mod]
    sent_cases = {}
    for recovery in ("selective", "gobackn"):
        for window, lost in ((8, set()), (8, {10}), (8, {0}), (16, {10, 14}), (16, {10, 40, 41, 200}),
                             (4, {296, 299}), (16, {299}), (8, {5, 13, 21, 150})):
            sent_cases[f"{recovery}, window {window}, 300 packets, lost {sorted(lost) or 'none'}"] = (
                300, lost, recovery, window)
    sent_cases.update(_random_sent_cases())
    eff_cases = {f"{recovery}, loss {loss:.0%}, window {window}": (loss, recovery, window)
                 for loss, recovery, window in ((0.2, "selective", 8), (0.01, "gobackn", 16), (0.05, "gobackn", 8),
                                                (0.05, "gobackn", 16), (0.1, "gobackn", 4))}
    stall_rng = grading.case_rng("lab3 stall")
    drawn = [(round(stall_rng.uniform(0.0005, 0.02), 4), stall_rng.randint(5, 200), stall_rng.randint(1, 32))
             for _ in range(2)]
    stall_cases = {f"loss {loss:g}, {packets} packets x {flows} flows": (loss, packets, flows)
                   for loss, packets, flows in ((0.001, 46, 8), (0.01, 46, 1), (0.01, 46, 8), (0.0001, 46, 64),
                                                (0.05, 10, 2), (0.0005, 1000, 1), *drawn)}
    return [
        # A count of packets, and the model matches the sender packet for packet: compared exactly (a
        # tolerance let a go-back-N that resends one packet too few per loss pass).
        grading.agrees("transmissions", mod, "transmissions", sent_cases, transport_sent,
                       what="the transport's sender in transport.sim.simnet"),
        grading.agrees("efficiency", mod, "efficiency", eff_cases, transport_efficiency, rel=0.1,
                       what="the transport's sender under random loss in transport.sim.simnet (3000 packets)"),
        grading.agrees("stall probability", mod, "stall_probability", stall_cases, monte_carlo_stall, rel=0.03,
                       what="a Monte Carlo of 200 000 steps"),
    ]


# ---- a measured run -------------------------------------------------------------------------------


def _per_packet(arm: dict[str, Any]) -> float | None:
    data = sum(f.get("data_packets") or 0 for f in arm["flows"])
    return (arm.get("retransmissions") or 0) / data if data else None


def check_results(doc: dict[str, Any]) -> list[grading.Check]:
    arms = {name: grading.arm(doc, name) for name in
            (arm_name("selective", 0), arm_name("selective", 1), arm_name("gobackn", 1), arm_name("selective", 5),
             arm_name("gobackn", 5))}
    checks = []
    for loss in (1, 5):
        sel, gbn = _per_packet(arms[arm_name("selective", loss)]), _per_packet(arms[arm_name("gobackn", loss)])
        checks.append(grading.at_least(
            f"go-back-N resends more at {loss} % loss", gbn, RETX_RATIO * (sel or 0),
            f"go-back-N's retransmissions per packet delivered (selective repeat's: {sel or 0:.3g}; bound 2x it)"))
    sel0, sel5, gbn5 = (arms[arm_name(rec, loss)]["goodput_bps"] / 1e6
                        for rec, loss in (("selective", 0), ("selective", 5), ("gobackn", 5)))
    checks += [
        grading.at_least("selective repeat holds its goodput", sel5, SELECTIVE_KEEPS * sel0,
                         f"selective repeat's goodput at 5 % loss in Mb/s (lossless: {sel0:.3g}; bound 0.8x it)"),
        grading.at_least("selective repeat beats go-back-N", sel5, SELECTIVE_OVER_GOBACKN * gbn5,
                         f"selective repeat's goodput at 5 % loss in Mb/s (go-back-N's: {gbn5:.3g}; bound 1.2x it)"),
    ]
    sel_med = arms[arm_name("selective", 5)]["completion_p50_s"]
    gbn_med = arms[arm_name("gobackn", 5)]["completion_p50_s"]
    checks.append(grading.at_least(
        "go-back-N's messages wait longer", gbn_med, MEDIAN_RATIO * (sel_med or 0),
        f"go-back-N's median message completion at 5 % loss in s (selective repeat's: "
        f"{sel_med if sel_med is not None else float('nan'):.3g}; bound 1.1x it)"))
    return checks
