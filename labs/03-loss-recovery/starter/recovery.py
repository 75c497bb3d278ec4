"""Lab 3, loss recovery: your code. Write the three functions marked TODO.

Three small models: how many packets a sender puts on the wire to deliver a transfer when some
packets are lost, with selective repeat and with go-back-N; the share of transmissions that deliver
something new under random loss (efficiency); and how likely a collective is to wait for a loss at
all. Run this file to see them in numbers and, given a results directory of `fabriclab run
loss-recovery`, next to what the emulated fabric measured; grade them with `fabriclab lab check 3 lab3`:

    python lab3/recovery.py results/lab3
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def transmissions(packets: int, lost: set[int], recovery: str, window: int) -> int:
    """Packets put on the wire to deliver PSNs 0 .. packets-1 when the first transmission of every PSN
    in `lost` is dropped (a retransmission always gets through), with `window` packets in flight.

    selective: only the lost packets are sent again. gobackn: the receiver throws away everything after
    a gap, so when PSN p is lost the sender has already sent the window p .. p+window-1 (or up to the
    last packet), all of it wasted, and sends it all again."""
    # TODO: selective repeat is one line. For go-back-N, walk the PSNs: an unlost packet costs one
    # transmission; a lost one costs the whole burst it starts, after which every packet in that burst
    # has had its first transmission (a later loss inside the burst costs nothing more). Examples with
    # 10 packets and window 4: lost {3} -> 14; lost {3, 5} -> 14; lost {3, 8} -> 16; lost {9} -> 11.
    raise NotImplementedError("TODO: count the transmissions")


def efficiency(loss: float, recovery: str, window: int) -> float:
    """Expected share of transmissions that deliver a new packet when every transmission is lost with
    probability `loss` (1.0 = nothing wasted)."""
    # TODO: selective repeat: how many tries does a packet take on average? Go-back-N: each try of the
    # next packet either gets through (probability 1-loss, one transmission) or is lost and wastes the
    # whole window; write the expected transmissions per delivered packet E as an equation in E, solve
    # it, and return 1/E.
    raise NotImplementedError("TODO: the expected efficiency")


def stall_probability(loss: float, packets: int, flows: int) -> float:
    """Probability that at least one of `flows` flows, each sending `packets` packets, loses at least
    one of them when every packet is lost with probability `loss`: the chance that a collective step,
    which ends only when all its flows are done, waits for a loss recovery."""
    # TODO: 1 minus the probability that no packet at all is lost.
    raise NotImplementedError("TODO: the chance that some flow of the step loses a packet")


# ---- You do not need to change anything below: it applies your models and compares the fabric. ----

LOSSES = (0.001, 0.01, 0.05)
WINDOWS = (8, 16, 32)
STEP_PACKETS = 46  # one 64 KiB chunk of 1430-byte packets per flow and step


def _try(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except NotImplementedError:
        return None


def _f(value: float | None, fmt: str) -> str:
    return "TODO" if value is None else format(value, fmt)


def show_models() -> None:
    print("Transmissions to deliver 1000 packets, first transmissions of PSNs 100, 400 and 405 lost:")
    for window in WINDOWS:
        sel = _try(transmissions, 1000, {100, 400, 405}, "selective", window)
        gbn = _try(transmissions, 1000, {100, 400, 405}, "gobackn", window)
        print(f"  window {window:>2}: selective repeat {_f(sel, 'd'):>5}   go-back-N {_f(gbn, 'd'):>5}")
    print("\nEfficiency (share of transmissions that deliver a new packet) under random loss:")
    print("  loss    selective  " + "  ".join(f"go-back-N W={w:<3}" for w in WINDOWS))
    for loss in LOSSES:
        cells = "  ".join(f"{_f(_try(efficiency, loss, 'gobackn', w), '.3f'):>15}" for w in WINDOWS)
        print(f"  {loss:>5.1%}  {_f(_try(efficiency, loss, 'selective', 8), '.3f'):>9}  {cells}")
    print(f"\nChance that a collective step waits for a loss ({STEP_PACKETS} packets per flow per step):")
    print("  loss     " + "  ".join(f"{n:>4} flows" for n in (8, 64, 512)))
    for loss in (0.0001, 0.001, 0.01):
        cells = "  ".join(f"{_f(_try(stall_probability, loss, STEP_PACKETS, n), '.1%'):>10}" for n in (8, 64, 512))
        print(f"  {loss:>6.2%}  {cells}")


def show_measured(target: Path) -> int:
    from labs.catalogue import LabError
    from labs.grading import load_results

    try:
        doc = load_results(target, "loss-recovery")
    except LabError as exc:
        print(f"recovery.py: {exc}", file=sys.stderr)
        return 2
    arms = {a["name"]: a for a in doc["arms"] if not a.get("error")}

    def per_packet(arm: dict[str, Any]) -> float | None:
        data = sum(f.get("data_packets") or 0 for f in arm["flows"])
        return (arm.get("retransmissions") or 0) / data if data else None

    print(f"\nMeasured on the emulated fabric ({target}): retransmissions per packet delivered, and go-back-N's")
    print("window as the packets it resent per loss event, against your efficiency for that window:")
    print("  loss   selective  go-back-N  resent/event W  go-back-N of lossless  your efficiency(p, W)")
    base = arms.get("gobackn@0%", {}).get("goodput_bps")
    for loss in (0.1, 1.0, 5.0):
        sel, gbn = arms.get(f"selective@{loss:g}%"), arms.get(f"gobackn@{loss:g}%")
        if not sel or not gbn:
            print(f"  {loss:>4g} %  (arm missing or failed)")
            continue
        rewinds = sum(f.get("gobackn_rewinds") or 0 for f in gbn["flows"])
        window = (gbn.get("retransmissions") or 0) / rewinds if rewinds else None
        model = _try(efficiency, loss / 100, "gobackn", round(window)) if window else None
        measured = gbn["goodput_bps"] / base if base else None
        print(f"  {loss:>4g} %  {_f(per_packet(sel), '.4f'):>9}  {_f(per_packet(gbn), '.4f'):>9}  "
              f"{_f(window, '.1f'):>14}  {_f(measured, '.2f'):>21}  {_f(model, '.2f'):>21}")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print("usage: python recovery.py [RESULTS_DIR]   (from `fabriclab run loss-recovery --out RESULTS_DIR`)",
              file=sys.stderr)
        return 2
    show_models()
    return show_measured(Path(argv[0])) if argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
