"""FCT slowdown (completion time over the ideal) from real transport metrics: transfers run by the
in-memory simulated network, read the way the runner reads the endpoints' JSON (no root)."""

from __future__ import annotations

import pytest

from experiments import report, results
from experiments.analysis.framing import first_packet_bytes, srd_framing, tcp_framing, wire_bytes
from experiments.model import Arm
from tests.experiments.simulated_endpoints import MESSAGE, sender_record, transfer
from topologies import parse_spec
from transport.core.headers import ACK_FRAME, DATA_WIRE_OVERHEAD
from transport.core.wire import DATA_HEADER_LEN
from transport.sim.simnet import PathSpec


def _topo(rate_mbps: float):
    # h1 and h2 on two leaves under one spine: every link of the path at `rate_mbps`.
    return parse_spec(f"leaf-spine:spines=1,leaves=2,hosts=1,rate={rate_mbps:g}")


def _sender_json(size: int, path: PathSpec, seed: int = 1) -> dict:
    """What `fabriclab srd send --bytes SIZE` writes around a simulated transfer's own metrics."""
    return dict(sender_record(transfer(size, path, seed), size))


def _arm(endpoints: dict, topo, kind: str = "srd") -> dict:
    raw = {"t0": 0.0, "traffic_s": 1.0, "samples": [{"t": 0.0, "links": []}, {"t": 1.0, "links": []}],
           "cpu": [], "endpoints": endpoints}
    return results.arm_result(Arm("a", kind=kind), raw, topo, ideal=0.0, sized=True)


def _slowdown(size: int, path: PathSpec, topo_rate_mbps: float) -> float:
    entry = _arm({"send-0-h1-h2": _sender_json(size, path)}, _topo(topo_rate_mbps))
    assert entry["slowdown_flows"] == 1
    return entry["slowdown_mean"]


def test_framing_is_the_transports_wire_overhead():
    f = srd_framing()
    assert f.overhead == DATA_WIRE_OVERHEAD == DATA_HEADER_LEN + 8 + 20 + 14
    assert f.payload == 1400 - DATA_HEADER_LEN
    # One 64 KiB message: 49 datagrams (48 would need 1366 bytes each), sharing its bytes equally
    # (1338 or 1337 bytes), 84 bytes of headers each.
    assert wire_bytes(MESSAGE, f) == MESSAGE + 49 * 84
    assert wire_bytes(2 * MESSAGE + 10, f) == 2 * MESSAGE + 10 + (2 * 49 + 1) * 84
    assert first_packet_bytes(10, f) == 94 and first_packet_bytes(MESSAGE, f) == 1338 + 84
    assert first_packet_bytes(5000, f) == 1250 + 84  # 4 fragments of 1250
    tcp = tcp_framing()
    assert wire_bytes(1448 * 3, tcp) == 1514 * 3


@pytest.mark.parametrize("size", [5_000, 100_000, 1_000_000])
@pytest.mark.parametrize("rate_mbps", [10, 40, 100])
def test_slowdown_is_at_least_one_and_one_when_the_bottleneck_stays_busy(size, rate_mbps):
    s = _slowdown(size, PathSpec(rate_bps=rate_mbps * 1e6, delay=0.0005), rate_mbps)
    assert s >= 1 - 1e-9
    # The transport's window ramp leaves a 40 Mb/s link idle for a moment in a 100 kB flow (1.11 here).
    assert s < 1.2
    if rate_mbps == 10:
        assert s == pytest.approx(1.0, abs=0.01)


def test_slowdown_scales_with_the_share_of_the_bottleneck_a_flow_gets():
    # The fabric could carry 20 Mb/s; the flow's path only carries 10: a large flow takes twice as long.
    path = PathSpec(rate_bps=10e6, delay=0.0005)
    full = _slowdown(2_000_000, path, 10)
    half = _slowdown(2_000_000, path, 20)
    assert half / full == pytest.approx(2.0, rel=0.01)
    # Small flows are dominated by the base RTT, which does not shrink with a faster fabric.
    small = _slowdown(5_000, path, 20) / _slowdown(5_000, path, 10)
    assert 1.0 < small < 1.5


def test_loss_makes_flows_slower_than_ideal():
    # Packets lost on the wire: they took the link's time, then failed their CRC (simnet's `loss` drops
    # before the queue, which costs a flow whose window covers it nothing but a chance timeout).
    lossless = _slowdown(1_000_000, PathSpec(rate_bps=10e6, delay=0.0005), 10)
    lossy = _slowdown(1_000_000, PathSpec(rate_bps=10e6, delay=0.0005, corrupt=0.05), 10)
    assert lossy > lossless / 0.96


def test_arm_mean_and_max_over_flows_and_incomplete_flows_left_out():
    topo = _topo(10)
    fast = _sender_json(500_000, PathSpec(rate_bps=10e6, delay=0.0005))
    slow = _sender_json(500_000, PathSpec(rate_bps=5e6, delay=0.0005))
    stuck = {**_sender_json(100_000, PathSpec(rate_bps=10e6)), "completed": False, "stop_reason": "duration"}
    entry = _arm({"send-0-h1-h2": fast, "send-1-h2-h1": slow, "send-2-h1-h2": stuck}, topo)
    per_flow = [f["slowdown"] for f in entry["flows"]]
    assert per_flow[2] is None and entry["slowdown_flows"] == 2 and entry["slowdown_incomplete"] == 1
    assert entry["slowdown_max"] == pytest.approx(max(per_flow[:2])) and per_flow[1] == pytest.approx(2.0, rel=0.02)
    assert entry["slowdown_mean"] == pytest.approx(sum(per_flow[:2]) / 2)
    f = entry["flows"][0]
    assert f["base_rtt_source"] == "measured" and f["bottleneck_bps"] == pytest.approx(10e6)
    assert f["ideal_fct_s"] == pytest.approx(f["duration_s"] / f["slowdown"])


def test_base_rtt_falls_back_to_the_topology():
    topo = parse_spec("leaf-spine:spines=1,leaves=2,hosts=1,rate=10,delay=1")
    m = _sender_json(200_000, PathSpec(rate_bps=10e6, delay=0.002))
    m["connection"]["state"]["min_rtt"] = None
    f = _arm({"send-0-h1-h2": m}, topo)["flows"][0]
    # Four links: 1 ms each way, and one packet of a 64 KiB message (1338 + 84 bytes) out and one ACK
    # frame back at 10 Mb/s per hop.
    assert f["base_rtt_source"] == "topology"
    assert f["base_rtt_s"] == pytest.approx(4 * (0.002 + 8 * (1338 + 84 + ACK_FRAME) / 10e6))


def test_tcp_flows_use_tcp_framing_and_iperfs_min_rtt():
    topo = _topo(10)
    size = 1448 * 1000
    wire = 1514 * 1000
    fct = 8 * wire / 10e6 * 1.25  # a quarter slower than the link allows
    client = {"start": {"tcp_mss_default": 1448},
              "intervals": [{"streams": [{"pmtu": 1500, "rtt": 3000}], "sum": {"start": 0, "seconds": 0.1}}],
              "end": {"streams": [{"sender": {"min_rtt": 2000}}], "sum_received": {"bytes": size, "seconds": fct,
                                                                               "bits_per_second": 8 * size / fct},
                      "sum_sent": {"seconds": fct, "retransmits": 0}}}
    entry = _arm({"iperf-client-0-h1-h2": client}, topo, kind="tcp")
    f = entry["flows"][0]
    assert f["min_rtt_s"] == pytest.approx(0.002) and f["wire_bytes"] == wire
    assert f["ideal_fct_s"] == pytest.approx(0.002 + 8 * (wire - 1514) / 10e6)
    assert entry["slowdown_mean"] == pytest.approx(fct / f["ideal_fct_s"])


def test_timed_flows_have_no_slowdown_and_the_table_shows_it():
    m = _sender_json(200_000, PathSpec(rate_bps=10e6))
    raw = {"t0": 0.0, "traffic_s": 1.0, "samples": [{"t": 0.0, "links": []}], "cpu": [],
           "endpoints": {"send-0-h1-h2": m}}
    timed = results.arm_result(Arm("timed"), raw, _topo(10), ideal=10e6, sized=False)
    sized = _arm({"send-0-h1-h2": m}, _topo(10))
    assert timed["slowdown_mean"] is None and timed["slowdown_max"] is None
    doc = {"arms": [sized, timed]}
    head, *_ = report.text_table(doc).splitlines()
    assert "slowdown mean" in head and "slowdown max" in head
    rows = report.table_rows(doc)
    col = [c for c, _ in report.COLUMNS].index("slowdown max")
    assert rows[0][col] == f"{sized['slowdown_max']:.2f}" and rows[1][col] == "-"
