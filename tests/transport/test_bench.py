"""`fabriclab bench transport --quick --json` runs and reports every figure as a positive number."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

RATES = ("core_pps", "loopback_pps", "raw_sendto_pps", "loopback_coalesced_pps")
RATIOS = ("selective_vs_lossless", "gobackn_vs_lossless")


def test_bench_quick_json() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "bench", "transport", "--quick", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # exactly one JSON object on stdout
    for key in (*RATES, *RATIOS):
        assert isinstance(result[key], float) and result[key] > 0, key
    assert isinstance(result["spurious_retx_fraction"], float) and 0 <= result["spurious_retx_fraction"] <= 1
    # The raw figures behind the ratios and the parameters are reported too.
    for mode in ("selective", "gobackn"):
        assert result[f"{mode}_lossless_goodput_bps"] > 0 and result[f"{mode}_lossy_goodput_bps"] > 0
    assert result["spurious_packets_sent"] > 0
    assert result["parameters"]["quick"] is True
    assert result["simnet_parameters"]["paths"] == 8
    assert result["loopback_datagrams_received"] > 0


def test_bench_cc_reports_every_figure_for_a_controller() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "bench", "cc", "--quick", "--json", "--cc", "credit"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    row = json.loads(proc.stdout)["controllers"]["credit"]
    assert 0 < row["permutation"]["goodput_vs_ideal_mean"] <= 1.0
    for n in (8, 15):
        incast = row[f"incast_{n}"]
        assert incast["completed"] and incast["completion_vs_ideal"] >= 1.0 and 0 <= incast["fct_spread"] < 1
        assert incast["drops"] >= 0 and incast["retransmitted_percent"] >= 0 and incast["peak_queue"] > 0
    assert row["core_us_per_packet"] > 0
