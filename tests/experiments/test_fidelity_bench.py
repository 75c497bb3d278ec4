"""`fabriclab bench fidelity`'s CPU table from synthetic samples: what the endpoints report becomes
microseconds of CPU per packet delivered to the hosts, shown against the endpoints' target."""

from __future__ import annotations

import pytest

from experiments import fidelity_bench, results
from topologies import parse_spec

SPEC = "leaf-spine:spines=2,leaves=2,hosts=2,rate=4"


def _delivered(topo, per_host_link: int) -> dict:
    """Packets counted on every link: `per_host_link` toward each host, as many again the other way."""
    hosts = {h.name for h in topo.hosts}
    npkts = {}
    for lk in topo.links:
        for src in (lk.a, lk.b):
            npkts[(lk.name, src)] = per_host_link if lk.peer(src) in hosts else 3 * per_host_link
    return npkts


def _arm(topo, sender_cpu: float, receiver_cpu: float, per_host_link: int) -> dict:
    raw = {
        "traffic_s": 10.0,
        "cpu_window": {"ovs": 2.0, "controller": 0.01, "runner": 0.02, "other": 0.5, "total": 3.0},
        "endpoints": {"send-0-h1-h3": {"cpu_run_s": sender_cpu}, "recv-h3": {"cpu_run_s": receiver_cpu}},
    }
    budget = results.cpu_budget(raw, topo, _delivered(topo, per_host_link))
    return {"name": "spray", "fidelity": {"trusted": True, "cpu_idle_min": 0.5, "cpu_idle_mean": 0.7},
            "cpu_budget": budget, "goodput_bps": 3.5e6, "goodput_fraction": 0.85, "goodput_of_wire": 0.9}


@pytest.mark.parametrize(("sender", "receiver", "over"), [(0.04, 0.06, False), (0.3, 0.4, True)])
def test_cpu_table_reports_endpoint_us_per_delivered_packet(sender, receiver, over):
    topo = parse_spec(SPEC)
    arm = _arm(topo, sender, receiver, per_host_link=1000)
    delivered = 1000 * len(topo.hosts)  # only the packets toward hosts count
    assert arm["cpu_budget"]["packets_delivered"] == delivered
    summary = fidelity_bench.arm_summary(arm)
    expected = (sender + receiver) / delivered * 1e6
    assert summary["endpoint_us_per_packet"] == pytest.approx(expected, abs=0.01)
    text = fidelity_bench.text_report({"cases": [{"case": "demo", "topology": SPEC, "mtu": 1500, "trusted": True,
                                                   "arms": [summary]}], "trusted": True})
    line = next(ln for ln in text.splitlines() if "endpoints (sender + receiver)" in ln)
    assert f"{summary['endpoint_us_per_packet']:g} µs per delivered packet" in line
    assert ("over" in line) is over and ("within" in line) is not over
    assert f"endpoints {summary['endpoint_us_per_packet']:g}" in text  # and in the per-component line


def test_cpu_table_without_endpoint_reports_leaves_the_figure_out():
    topo = parse_spec(SPEC)
    arm = _arm(topo, 0.0, 0.0, per_host_link=0)  # no packets: no figure per packet
    summary = fidelity_bench.arm_summary(arm)
    assert summary["endpoint_us_per_packet"] is None
    text = fidelity_bench.text_report({"cases": [{"case": "demo", "topology": SPEC, "mtu": 1500, "trusted": True,
                                                   "arms": [summary]}], "trusted": True})
    assert "endpoints (sender + receiver)" not in text


def test_the_core_probe_takes_the_median_flow_s_pace_and_is_shown_beside_the_endpoints():
    flows = [{"mtu": 1472, "duration_s": 5.0, "data_packets": n} for n in (1000, 2000, 4000)]
    assert fidelity_bench.flow_pace({"flows": flows}) == (1472, 5.0 / 2000)
    assert fidelity_bench.flow_pace({"flows": [{"mtu": None, "duration_s": 5.0, "data_packets": 0}]}) is None
    assert fidelity_bench.flow_pace({"flows": []}) is None  # TCP's arm: no transport flows

    topo = parse_spec(SPEC)
    summary = {**fidelity_bench.arm_summary(_arm(topo, 0.3, 0.4, per_host_link=1000)),
               "core_receive_us": {"back_to_back": 4.6, "after_gap": 60.1, "gap_s": 0.0025}}
    text = fidelity_bench.text_report({"cases": [{"case": "demo", "topology": SPEC, "mtu": 1500, "trusted": True,
                                                   "arms": [summary]}], "trusted": True})
    assert "receive path (a DATA datagram in, its ACK out): 4.6 µs back to back, 60.1 after sleeping 2.5 ms" in text
