"""Metrics: statistics helpers and the JSON-serialisable summary a connection reports."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from transport.core.config import TransportConfig
from transport.core.metrics import GoodputSeries, Stats, percentile, percentiles, quantiles
from transport.io.sender import summarize
from transport.sim.simnet import PathSpec, run_transfer


def test_percentiles() -> None:
    assert percentiles([])["p50"] is None
    p = percentiles([float(i) for i in range(1, 1001)])
    assert p["count"] == 1000 and p["max"] == 1000.0
    assert p["p50"] == pytest.approx(500.5) and p["p99"] == pytest.approx(990.01)
    assert p["p50"] <= p["p99"] <= p["p999"] <= p["max"]


def test_goodput_series_bins_and_merges() -> None:
    g = GoodputSeries(bin_width=0.001, max_bins=4)
    g.add(0.0, 100)
    g.add(0.0025, 50)
    assert g.bins == [100, 0, 50]
    g.add(0.0045, 10)  # past 4 bins: bins double in width
    assert g.bin_width == 0.002 and g.bins == [100, 50, 10]
    s = g.summary()
    assert s["bps"][0] == pytest.approx(100 * 8 / 0.002)


def test_reorder_histogram_labels() -> None:
    st = Stats()
    st.reorder_distance.extend([1, 2, 3, 5, 2000])
    h = st.reorder_histogram()
    assert h["1"] == 1 and h["2-3"] == 2 and h["4-7"] == 1 and h["1024+"] == 1


def test_connection_metrics_are_json_and_complete() -> None:
    cfg = TransportConfig()
    paths = [PathSpec(loss=0.02), PathSpec(delay=0.001, reorder=0.2)]
    r = run_transfer(cfg, cfg, paths, total_bytes=500_000, message_size=20_000, seed=3)
    assert r.completed
    for m in (r.sender_metrics, r.receiver_metrics):
        json.loads(json.dumps(m))
    s = r.sender_metrics["sender"]
    assert s["messages_acked"] == 25 and s["bytes_acked"] == 500_000
    assert s["retransmissions"] > 0 and s["losses_detected"] > 0
    assert s["message_completion"]["count"] == 25 and s["message_completion"]["p999"] is not None
    assert s["loss_recovery"]["count"] > 0
    assert s["rtt"]["p50"] > 0.001
    assert sum(e["packets_sent"] for e in s["per_ev"].values()) == s["packets_sent"]
    assert set(s["per_ev"]["0"]) >= {"packets_sent", "bytes_sent", "retransmissions", "timeouts", "rtt"}
    rv = r.receiver_metrics["receiver"]
    assert rv["bytes_delivered"] == 500_000 and rv["messages_delivered"] == 25
    assert 0 < rv["out_of_order_fraction"] < 1 and sum(rv["reorder_distance"].values()) == rv["out_of_order"]
    assert rv["peak_reassembly_bytes"] > 0 and rv["reassembly_bytes"] == 0
    assert sum(rv["goodput"]["bps"]) * rv["goodput"]["bin"] / 8 == pytest.approx(500_000)
    assert r.receiver_metrics["state"]["cwnd"] > 0 and "config" in r.sender_metrics


@given(st.lists(st.one_of(st.none(), st.floats(-1e6, 1e6)), max_size=40), st.floats(0, 100))
def test_interpolated_percentile_is_numpys_and_leaves_out_none(values: list[float | None], q: float) -> None:
    present = [v for v in values if v is not None]
    got = percentile(values, q)
    if not present:
        assert got is None
    else:
        assert got == float(np.percentile(np.asarray(present), q))


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=40), st.sampled_from([0, 50, 90, 99, 99.9, 100]))
def test_rank_percentile_is_the_value_at_rank_floor_q_n(values: list[float], q: float) -> None:
    ordered = sorted(values)
    got = percentile(values, q, interpolate=False)
    assert got == ordered[min(len(values) - 1, int(q / 100 * len(values)))]
    assert got in values


def test_quantiles_and_the_endpoints_completion_summary() -> None:
    assert quantiles([], (50,)) is None and quantiles([None], (50,), interpolate=False) is None
    assert quantiles([4.0, 1.0, 3.0, 2.0], (0, 50, 100)) == [1.0, 2.5, 4.0]
    assert quantiles([4.0, 1.0, 3.0, 2.0], (0, 50, 100), interpolate=False) == [1.0, 3.0, 4.0]
    # The endpoint's completion times take the value at the rank, not an interpolation.
    s = summarize([0.4, 0.1, 0.3, 0.2])
    assert (s["min"], s["p50"], s["p90"], s["p99"], s["max"]) == (0.1, 0.3, 0.4, 0.4, 0.4)
    assert summarize([]) == {"count": 0}
