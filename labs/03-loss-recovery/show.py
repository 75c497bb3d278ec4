"""Lab 3: what `python lab3/recovery.py [RESULTS_DIR]` prints: the student's models in numbers (transmissions
for a few losses, efficiency under random loss, the chance that a collective step waits for a loss) and,
from a measured run of `fabriclab run loss-recovery`, the retransmissions and go-back-N's window per loss
event next to the student's efficiency for that window."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from experiments.scenarios.loss_recovery import arm_name
from labs.catalogue import LabError
from labs.grading import load_results
from labs.script import attempt

LOSSES = (0.001, 0.01, 0.05)
WINDOWS = (8, 16, 32)
STEP_PACKETS = 46  # one 64 KiB chunk of 1430-byte packets per flow and step


def _f(value: float | None, fmt: str) -> str:
    return "TODO" if value is None else format(value, fmt)


def show_models(student: ModuleType) -> None:
    lost = {100, 400, 405}
    print("Transmissions to deliver 1000 packets, first transmissions of PSNs 100, 400 and 405 lost:")
    for window in WINDOWS:
        sel = attempt(student.transmissions, 1000, set(lost), "selective", window)
        gbn = attempt(student.transmissions, 1000, set(lost), "gobackn", window)
        print(f"  window {window:>2}: selective repeat {_f(sel, 'd'):>5}   go-back-N {_f(gbn, 'd'):>5}")
    print("\nEfficiency (share of transmissions that deliver a new packet) under random loss:")
    print("  loss    selective  " + "  ".join(f"go-back-N W={w:<3}" for w in WINDOWS))
    for loss in LOSSES:
        cells = "  ".join(f"{_f(attempt(student.efficiency, loss, 'gobackn', w), '.3f'):>15}" for w in WINDOWS)
        print(f"  {loss:>5.1%}  {_f(attempt(student.efficiency, loss, 'selective', 8), '.3f'):>9}  {cells}")
    print(f"\nChance that a collective step waits for a loss ({STEP_PACKETS} packets per flow per step):")
    print("  loss     " + "  ".join(f"{n:>4} flows" for n in (8, 64, 512)))
    for loss in (0.0001, 0.001, 0.01):
        cells = "  ".join(f"{_f(attempt(student.stall_probability, loss, STEP_PACKETS, n), '.1%'):>10}"
                          for n in (8, 64, 512))
        print(f"  {loss:>6.2%}  {cells}")


def _per_packet(arm: dict[str, Any]) -> float | None:
    data = sum(f.get("data_packets") or 0 for f in arm["flows"])
    return (arm.get("retransmissions") or 0) / data if data else None


def show_measured(student: ModuleType, target: Path) -> None:
    doc = load_results(target, "loss-recovery")
    arms = {a["name"]: a for a in doc["arms"] if not a.get("error")}
    print(f"\nMeasured on the emulated fabric ({target}): retransmissions per packet delivered, and go-back-N's")
    print("window as the packets it resent per loss event, against your efficiency for that window:")
    print("  loss   selective  go-back-N  resent/event W  go-back-N of lossless  your efficiency(p, W)")
    base = arms.get(arm_name("gobackn", 0), {}).get("goodput_bps")
    for loss in (0.1, 1.0, 5.0):
        sel, gbn = arms.get(arm_name("selective", loss)), arms.get(arm_name("gobackn", loss))
        if not sel or not gbn:
            print(f"  {loss:>4g} %  (arm missing or failed)")
            continue
        rewinds = sum(f.get("gobackn_rewinds") or 0 for f in gbn["flows"])
        window = (gbn.get("retransmissions") or 0) / rewinds if rewinds else None
        model = attempt(student.efficiency, loss / 100, "gobackn", round(window)) if window else None
        measured = gbn["goodput_bps"] / base if base else None
        print(f"  {loss:>4g} %  {_f(_per_packet(sel), '.4f'):>9}  {_f(_per_packet(gbn), '.4f'):>9}  "
              f"{_f(window, '.1f'):>14}  {_f(measured, '.2f'):>21}  {_f(model, '.2f'):>21}")


def main(student: ModuleType, argv: list[str]) -> int:
    if len(argv) > 1:
        raise LabError("give at most one results directory, of `fabriclab run loss-recovery --out DIR`")
    show_models(student)
    if argv:
        show_measured(student, Path(argv[0]))
    return 0
