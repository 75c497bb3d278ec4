"""The capacity bench's search and report, driven by a stand-in for real runs: a fabric that stays
trusted up to a threshold rate."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.capacity_bench import CASES, Probe, bracket, not_cpu, search, summarise, text_report
from topologies import parse_spec


def _fabric_trusted_below(threshold: float):
    calls: list[float] = []

    def run(rate: float) -> Probe:
        calls.append(rate)
        ok = rate <= threshold
        return Probe(rate, ok, 0.5 if ok else 0.1, rate * 10, 0.9, 1000, {"ovs": 70.0, "endpoints": 30.0})

    return run, calls


@settings(max_examples=60, deadline=None)
@given(st.floats(min_value=0.3, max_value=200.0), st.sampled_from([0.5, 1.0, 4.0, 16.0]), st.integers(0, 5))
def test_search_brackets_the_threshold(threshold, start, steps):
    run, calls = _fabric_trusted_below(threshold)
    probes = search(run, start, lo=0.25, hi=256.0, steps=steps)
    low, high = bracket(probes)
    assert low is not None and low <= threshold
    if high is not None:
        assert high > threshold
        # expansion leaves a factor of 2; every bisection step halves the bracket's width in log terms
        assert high / low <= 2 ** (1 / 2**steps) * (1 + 1e-9)
    assert len(calls) == len(set(calls)), "a rate was run twice"


def test_search_reports_none_when_even_the_lowest_rate_is_untrusted():
    run, _ = _fabric_trusted_below(0.01)
    probes = search(run, 4.0, lo=0.25, hi=256.0, steps=3)
    assert bracket(probes) == (None, min(p.rate_mbps for p in probes))
    row = summarise("demo", "shared", {"us_per_traversal": 70.0}, probes)
    assert row.capacity_mbps is None and row.at_capacity is None
    assert "none" in text_report({"cases": [row.to_dict()]})


def test_summary_and_report_carry_the_trusted_rate_and_its_cpu():
    run, _ = _fabric_trusted_below(10.0)
    row = summarise("4x4x4-1500", "per-switch", {"us_per_traversal": 71.5}, search(run, 4.0, 0.25, 256.0, 2))
    assert row.capacity_mbps is not None and 8.0 <= row.capacity_mbps <= 10.0
    assert row.at_capacity is not None and row.at_capacity.trusted
    text = text_report({"cases": [row.to_dict()]})
    assert "4x4x4-1500" in text and "71.5" in text and "70" in text
    assert "hypervisor" not in text


def test_the_report_names_probes_the_hypervisor_stole_from():
    run, _ = _fabric_trusted_below(10.0)
    probes = search(run, 4.0, 0.25, 256.0, 1)
    probes[0].cpu_steal_max = 0.3
    text = text_report({"cases": [summarise("demo", "per-switch", {"us_per_traversal": 70.0}, probes).to_dict()]})
    assert "The hypervisor stole CPU during demo at 4 Mb/s (30%)" in text


def test_every_case_is_a_valid_fabric_at_any_rate():
    for case in CASES:
        for rate in (0.5, 4.0, 37.3):
            topo = parse_spec(case.spec(rate))
            assert topo.hosts and topo.switches


DROPS = ("spray: 133 packets were lost outside the shaped queues (socket buffers, OVS itself, or sent and never "
         "received with no queue dropping them): the hosts or switches could not keep up; lower the rates")
CPU = ("spray: CPU idle fell to 18% (under 35%): the emulator, not the fabric, may be the bottleneck; lower the "
       "link rates or the number of flows")


def test_a_verdict_the_cpu_did_not_give_is_named_in_a_clause():
    assert not_cpu(Probe(4.0, False, 0.1, 1.0, 0.9, 100, reasons=[CPU])) is None
    assert not_cpu(Probe(4.0, True, 0.5, 1.0, 0.9, 100)) is None
    assert not_cpu(Probe(4.0, False, 0.83, 1.0, 0.8, 100, reasons=[DROPS])) == (
        "133 packets were lost outside the shaped queues")
    assert not_cpu(Probe(4.0, False, 0.2, 1.0, 0.8, 100, reasons=[CPU, DROPS])) == (
        "133 packets were lost outside the shaped queues")
    failed = Probe(1.0, False, None, None, None, None, error="no metrics from the senders: no reply\ntrace")
    assert not_cpu(failed) == "no metrics from the senders: no reply"


def test_the_report_says_when_a_case_was_untrusted_for_another_reason_than_the_cpu():
    probes = [Probe(r, False, 0.8, 1.0, 0.8, 100, reasons=[DROPS]) for r in (4.0, 2.0, 1.0)]
    text = text_report({"cases": [summarise("4x4x4-9000", "shared", {"us_per_traversal": 90.0}, probes).to_dict()]})
    assert "none" in text
    assert ("4x4x4-9000 (shared) at 4 Mb/s was untrusted for another reason than the CPU: 133 packets were lost "
            "outside the shaped queues.") in text
    run, _ = _fabric_trusted_below(10.0)
    row = summarise("demo", "per-switch", {"us_per_traversal": 70.0}, search(run, 4.0, 0.25, 256.0, 1))
    assert "another reason" not in text_report({"cases": [row.to_dict()]})
