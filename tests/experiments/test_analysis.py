"""Pure parts of the experiments: balls in bins, fair shares, ideal goodput, fidelity verdicts."""

from __future__ import annotations

import pytest

from experiments.analysis.fidelity import fidelity_verdict
from experiments.analysis.hashing import balls_in_bins, ecmp_expectation
from experiments.analysis.links import path_share, summarise_links
from experiments.analysis.placement import derangement_across, host_rate_mbps, ideal_bps, max_min_rates
from experiments.analysis.recovery_time import flow_recovery, time_to_recover
from experiments.scenarios import ecmp_vs_spray
from topologies import parse_spec


def test_balls_in_bins_exact_collision_probability():
    assert balls_in_bins(3, 2)["prob_collision"] == pytest.approx(1.0)
    assert balls_in_bins(2, 4)["prob_collision"] == pytest.approx(0.25)
    b = balls_in_bins(4, 4, trials=20000, seed=3)
    assert b["prob_collision"] == pytest.approx(1 - 24 / 256)
    # E[max load] of 4 balls in 4 bins is 2.125 (exact); the Monte Carlo lands close.
    assert b["expected_max_load"] == pytest.approx(2.125, abs=0.03)
    assert b["expected_colliding"] == pytest.approx(4 - 4 * (3 / 4) ** 3)


def test_max_min_shares_a_link_fairly():
    caps = {("l", "a"): 10.0, ("m", "a"): 4.0}
    rates = max_min_rates([{("l", "a"): 1.0}, {("l", "a"): 1.0, ("m", "a"): 1.0}], caps)
    assert rates == pytest.approx([6.0, 4.0])


def test_ideal_of_permutation_on_non_blocking_fabric_is_hosts_times_rate():
    topo = parse_spec("leaf-spine:spines=2,leaves=2,hosts=2,rate=10")
    pairs = derangement_across(topo, seed=5)
    assert ideal_bps(topo, pairs) == pytest.approx(4 * 10e6)


def test_derangement_crosses_leaves_and_is_a_permutation():
    topo = parse_spec("leaf-spine:spines=2,leaves=3,hosts=2")
    for seed in range(5):
        pairs = derangement_across(topo, seed)
        leaf = {h.name: h.labels["leaf"] for h in topo.hosts}
        assert sorted(s for s, _ in pairs) == sorted(d for _, d in pairs) == sorted(leaf)
        assert all(leaf[s] != leaf[d] for s, d in pairs)
    assert derangement_across(topo, 1) == derangement_across(topo, 1)


def test_ecmp_expectation_pigeonhole_topology_is_below_ideal():
    topo = parse_spec("leaf-spine:spines=2,leaves=2,hosts=3,host_rate=6,fabric_rate=9")
    pairs = derangement_across(topo, 1)
    exp = ecmp_expectation(topo, pairs, trials=300, seed=0)
    assert exp.ideal_bps == pytest.approx(36e6)
    assert exp.prob_any_collision == 1.0
    assert 0.5 < exp.expected_fraction < 0.95
    assert exp.goodput_p10_bps <= exp.expected_goodput_bps <= exp.goodput_p90_bps



def test_the_textbook_count_takes_uplinks_and_flows_per_source_switch():
    """A 4-spine fabric whose first flow stays on its leaf (host 7 -> 5 of a 16-host matrix) once
    printed "4 flows hashed onto 1 uplinks collide with probability 100%": the uplinks came from that
    first pair's next hops. Only flows that leave a switch meet its uplinks."""
    topo = parse_spec("leaf-spine:spines=4,leaves=4,hosts=4,rate=4")
    leaf = {h.name: h.labels["leaf"] for h in topo.hosts}
    assert leaf["h8"] == leaf["h6"]
    pairs = [("h8", "h6")] + [(f"h{i}", f"h{(i + 3) % 16 + 1}") for i in range(1, 17) if i != 8]
    leaving: dict[str, int] = {}
    for s, d in pairs:
        if leaf[s] != leaf[d]:
            leaving[leaf[s]] = leaving.get(leaf[s], 0) + 1
    busiest = max(leaving, key=lambda sw: leaving[sw])
    exp = ecmp_expectation(topo, pairs, trials=50, seed=0)
    bib = exp.balls_in_bins
    assert (bib["balls"], bib["bins"]) == (leaving[busiest], 4) and exp.busiest_switch == busiest
    assert bib["prob_collision"] == pytest.approx(balls_in_bins(leaving[busiest], 4)["prob_collision"])
    assert bib["prob_collision"] < 1.0
    words = ecmp_vs_spray.sentences({"arms": [], "analysis": {"ecmp_expectation": exp.to_dict()}})[0]
    assert f"{leaving[busiest]} flows leaving {busiest} hashed onto 4 uplinks" in words
    # No flow leaves its leaf: nothing is hashed onto an uplink, and no textbook line claims otherwise.
    local = ecmp_expectation(topo, [("h1", "h2"), ("h2", "h1")], trials=10, seed=0)
    assert local.balls_in_bins["balls"] == 0 and local.busiest_switch is None
    words = ecmp_vs_spray.sentences({"arms": [], "analysis": {"ecmp_expectation": local.to_dict()}})
    assert len(words) == 1 and "Balls in bins" not in words[0] and "Over the whole fabric" in words[0]

def test_fidelity_verdicts():
    ok = fidelity_verdict([0.6, 0.5], 10_000, 0, 100_000)
    assert ok.trusted and not ok.reasons
    busy = fidelity_verdict([0.6, 0.1], 10_000, 0, 100_000)
    assert not busy.trusted and "CPU idle" in busy.reasons[0]
    ceiling = fidelity_verdict([0.6], 85_000, 0, 100_000)
    assert not ceiling.trusted and "ceiling" in ceiling.reasons[0]
    drops = fidelity_verdict([0.6], 1_000, 500, 100_000)
    assert not drops.trusted and "outside the shaped queues" in drops.reasons[0]


def test_a_cpu_shortage_says_how_much_the_hypervisor_took_and_the_verdict_stands():
    # Stolen time counts as busy (the emulator lost it); the reason names it for the worst sample.
    stolen = fidelity_verdict([0.6, 0.2, 0.5], 10_000, 0, 100_000, steal=[0.0, 0.3, 0.02])
    assert not stolen.trusted and stolen.cpu_steal_max == 0.3
    assert "gave 30% of this machine's CPU to other guests" in stolen.reasons[0]
    # A shortage with no steal to speak of says nothing of the host; a trusted run still records it.
    ours = fidelity_verdict([0.6, 0.2], 10_000, 0, 100_000, steal=[0.3, 0.01])
    assert not ours.trusted and "guests" not in ours.reasons[0] and ours.cpu_steal_max == 0.3
    assert fidelity_verdict([0.6], 10_000, 0, 100_000, steal=[0.1]).trusted
    assert fidelity_verdict([0.6], 10_000, 0, 100_000).cpu_steal_max is None


def test_time_to_recover():
    times = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    rates = [10, 10, 0, 2, 9.5, 10]
    assert time_to_recover(times, rates, 0.15, 10) == pytest.approx(0.25)
    assert time_to_recover(times, [10, 10, 0, 0, 0, 0], 0.15, 10) is None


def test_failover_reads_recovery_from_the_fine_series_when_a_flow_has_one():
    # The coarse series (0.1 s bins) says 0.3 s; the fine one (20 ms bins, from packet arrivals)
    # says 60 ms, and that is what the analysis reports. A flow with only a coarse series keeps it.
    from experiments.scenarios import failover

    coarse = [10e6] * 30 + [0.0] * 3 + [10e6] * 30
    fine = [10e6] * 150 + [0.0] * 3 + [10e6] * 150
    fault = [{"kind": "link_down", "a": "leaf1", "b": "spine1", "at_s": 3.0}]

    def arm(name, flow):
        return {"name": name, "faults": fault, "goodput_series": {"bin_s": 0.1, "bps": coarse},
                "flows": [flow]}

    doc = {"arms": [arm("fine", {"series_bps": coarse, "fine_series_bps": fine, "rto_s": 0.05}),
                    arm("coarse", {"series_bps": coarse})]}
    an = failover.analyse(doc, None)  # type: ignore[arg-type]
    assert an["recovery_s"]["fine"] == pytest.approx(0.06, abs=0.021)
    assert an["recovery_s"]["coarse"] == pytest.approx(0.3, abs=0.11)
    assert an["recovery_rtos"]["fine"] == pytest.approx(1.2, abs=0.45)


def test_failover_pairs_the_speedup_within_each_repetition_and_reports_the_median():
    # Two repetitions: adaptive out for 3 and 9 fine bins (60, 180 ms), the rerouted ECMP arm for 60
    # and 90 (1.2 s, 1.8 s). The speed-up is taken within a repetition (20x and 10x), not across.
    from experiments.scenarios import failover

    fault = [{"kind": "link_down", "a": "leaf1", "b": "spine1", "at_s": 3.0}]

    def arm(name, rep, out_bins):
        fine = [10e6] * 150 + [0.0] * out_bins + [10e6] * 300
        return {"name": name, "repetition": rep, "faults": fault,
                "goodput_series": {"bin_s": 0.1, "bps": [10e6] * 90},
                "flows": [{"series_bps": [], "fine_series_bps": fine, "rto_s": 0.06}]}

    doc = {"arms": [arm(failover.ADAPTIVE, 0, 3), arm(failover.ECMP_REROUTE, 0, 60),
                    arm(failover.ADAPTIVE, 1, 9), arm(failover.ECMP_REROUTE, 1, 90)], "extra": {}}
    an = failover.analyse(doc, None)  # type: ignore[arg-type]
    adaptive = an["recovery_s_by_repetition"][failover.ADAPTIVE]
    reroute = an["recovery_s_by_repetition"][failover.ECMP_REROUTE]
    assert adaptive == [pytest.approx(0.06, abs=0.021), pytest.approx(0.18, abs=0.021)]
    assert reroute == [pytest.approx(1.2, abs=0.021), pytest.approx(1.8, abs=0.021)]
    speed = an["adaptive_speedup"]
    assert speed["by_repetition"] == [pytest.approx(r / a, rel=0.01) for a, r in zip(adaptive, reroute, strict=True)]
    assert speed["min"] == min(speed["by_repetition"]) and speed["min"] < speed["median"]
    assert an["recovery_s"][failover.ADAPTIVE] == pytest.approx(sum(adaptive) / 2)
    doc["analysis"] = an
    said = " ".join(failover.sentences(doc))
    assert "the median of 2 repetitions" in said and "repetition 1" in said


def test_flow_recovery_from_a_goodput_series():
    # 10 Mb/s for 3 s, nothing for 0.5 s after a fault at 3 s, then 10 Mb/s again (0.1 s bins).
    series = [10e6] * 30 + [0.0] * 5 + [10e6] * 30
    r = flow_recovery(series, 0.1, 3.0)
    assert r["hit"] and r["baseline_bps"] == pytest.approx(10e6)
    assert r["recovery_s"] == pytest.approx(0.5, abs=0.11)  # smoothing over two bins blurs one bin
    untouched = flow_recovery([10e6] * 65, 0.1, 3.0)
    assert untouched == {"hit": False, "recovery_s": 0.0, "baseline_bps": pytest.approx(10e6)}
    assert flow_recovery([], 0.1, 3.0) == {"hit": False, "recovery_s": None, "baseline_bps": None}
    never = flow_recovery([10e6] * 30 + [0.0] * 35, 0.1, 3.0)
    assert never["hit"] and never["recovery_s"] is None


def test_path_share_of_a_leafs_uplinks():
    arm = {"link_series": {"t": [0.0, 0.5, 1.0], "util": {
        "leaf1->spine1": [0.2, 0.3, 0.0], "leaf1->spine2": [0.6, 0.1, 0.0], "spine1->leaf2": [0.9, 0.9, 0.9]}}}
    ps = path_share(arm, "leaf1")
    assert ps["t"] == [0.0, 0.5, 1.0]
    assert ps["share"] == {"leaf1->spine1": [0.25, 0.75, 0.0], "leaf1->spine2": [0.75, 0.25, 0.0]}
    assert path_share(arm, "leaf2") == {} and path_share({}, "leaf1") == {}


def test_host_rate_is_the_slowest_host_link():
    assert host_rate_mbps(parse_spec("leaf-spine:host_rate=4,fabric_rate=6")) == 4
    assert host_rate_mbps(parse_spec("in-server:servers=1,gpus=2,gpu_rate=100,nic_rate=20")) == 100


def test_link_summary_imbalance_and_hot_links():
    topo = parse_spec("leaf-spine:spines=2,leaves=2,hosts=1,rate=10")

    def sample(t, up1):
        links = []
        for lk in topo.links:
            tx = up1 if lk.name == "leaf1-spine1" else 0
            links.append({"name": lk.name, "a": lk.a, "b": lk.b, "tx_bytes": tx, "rx_bytes": 0,
                          "tx_packets": tx // 1000, "rx_packets": 0})
        return {"t": t, "links": links}

    s = summarise_links(topo, [sample(0.0, 0), sample(1.0, int(10e6 / 8))])
    assert s.utilisation["leaf1->spine1"] == pytest.approx(1.0)
    assert s.link_imbalance == pytest.approx(8.0)  # one of eight fabric directions carries everything
    assert s.hot_links == ["leaf1->spine1"]


def test_heatmap_rows_are_grouped_by_the_tiers_they_join():
    from experiments.plots import tier_order

    topo = parse_spec("fat-tree:k=4")
    roles = {n.name: n.role for n in topo.nodes}
    labels = ["c1->p1a1", "p1a1->p1e1", "p1e1->p1a1", "p1a1->c1", "p2e1->p2a2"]
    ordered, groups = tier_order(labels, roles)
    assert ordered == ["p1e1->p1a1", "p2e1->p2a2", "p1a1->c1", "c1->p1a1", "p1a1->p1e1"]
    assert groups == [(0, "edge->agg"), (2, "agg->core"), (3, "core->agg"), (4, "agg->edge")]


@pytest.mark.parametrize(("ratio", "said"), [
    (1.5, "1.5x sooner than ECMP"),  # was rounded to "1x sooner"
    (17.6, "17.6x sooner than ECMP"),
    (1.04, "about as soon as ECMP"),
    (0.69, "took 1.4x as long to steer around the dead path"),  # adaptive the slower: not "sooner"
])
def test_the_speedup_sentence_says_what_the_ratio_says(ratio, said):
    from experiments.scenarios import failover

    assert said in failover.speedup_sentence(ratio)
    assert "median of 3 repetitions" in failover.speedup_sentence(ratio, 3, ratio)


def test_in_server_reads_ping_latency_at_its_floor_and_median():
    from experiments.scenarios import in_server

    def ping(mode: str, lo: float, p50: float, avg: float) -> dict:
        return {"name": f"ping-{mode}", "kind": "ping", "mode": mode, "error": None,
                "flows": [{"rtt_min_s": lo, "rtt_p50_s": p50, "rtt_avg_s": avg}]}

    # The failing run's figures: the means inverted, the floors did not.
    doc = {"arms": [ping("local", 68e-6, 410e-6, 540e-6), ping("via-tor", 111e-6, 450e-6, 507e-6)]}
    doc["analysis"] = an = in_server.analyse(doc, parse_spec("in-server"))
    assert an["latency"]["local"] == {"rtt_min_s": 68e-6, "rtt_p50_s": 410e-6, "rtt_avg_s": 540e-6}
    assert doc["arms"][0]["completion_p50_s"] == 410e-6
    assert in_server.sentences(doc)[0] == (
        "Ping between two GPUs of one server, median (minimum): 410 µs (68 µs) through the local switch, "
        "450 µs (111 µs) via the ToR hairpin (1.63x at the minimum).")
    # Results written before the median was kept still read.
    old = {"arms": [], "analysis": {"latency": {"local": {"rtt_avg_s": 3e-4}, "via-tor": {"rtt_avg_s": 5e-4}},
                                    "allreduce": {}}}
    assert in_server.sentences(old) == [
        "Ping between two GPUs of one server: 0.3 ms through the local switch, 0.5 ms via the ToR hairpin (1.67x)."]
