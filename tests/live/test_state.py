"""The live view's pure numbers: utilisation from samples, imbalance and hot links as the experiments
define them, the inferred hash placement, tiers, and the time series."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.analysis.links import fabric_hops, hop_label, summarise_links
from experiments.analysis.placement import derangement_across
from live import state
from live.layout import layout, tiers
from topologies import parse_spec

TOPO = parse_spec("leaf-spine:spines=2,leaves=4,hosts=2,rate=10")
SMALL = parse_spec("leaf-spine:spines=2,leaves=2,hosts=2,rate=10")


def sample(topo, t, util=None, nbytes=None, down=(), with_util=True):
    """A `GET /links` body: util maps (link, from) -> fraction; nbytes (link, from) -> cumulative bytes."""
    util, nbytes = util or {}, nbytes or {}
    links = []
    for lk in topo.links:
        entry = {"name": lk.name, "a": lk.a, "b": lk.b, "rate_mbps": lk.rate_mbps, "up": lk.name not in down,
                 "tx_bytes": nbytes.get((lk.name, lk.a), 0), "rx_bytes": nbytes.get((lk.name, lk.b), 0),
                 "tx_packets": 0, "rx_packets": 0}
        if with_util:
            entry["util_ab"] = util.get((lk.name, lk.a), 0.0)
            entry["util_ba"] = util.get((lk.name, lk.b), 0.0)
        links.append(entry)
    return {"time": t, "links": links}


def place(topo, flows, spine_of):
    """Utilisation of every hop when each flow (src, dst) runs at half rate on the path via spine_of[i]."""
    util: dict = {}
    for (src, dst), spine in zip(flows, spine_of, strict=True):
        path = next(p for p in __import__("topologies").equal_cost_paths(topo, src, dst) if spine in p)
        for hop in state.path_hops(topo, path):
            util[hop] = util.get(hop, 0.0) + 0.5
    return util


# -- utilisation -------------------------------------------------------------------------------------


def test_controller_rates_are_used_when_present():
    s = sample(SMALL, 10.0, util={("leaf1-spine1", "leaf1"): 0.7})
    u = state.directed_util(s)
    assert u[("leaf1-spine1", "leaf1")] == pytest.approx(0.7)
    assert u[("leaf1-spine1", "spine1")] == 0.0


def test_byte_deltas_are_the_fallback_and_never_negative():
    hop = ("leaf1-spine1", "leaf1")
    s0 = sample(SMALL, 0.0, nbytes={hop: 1000}, with_util=False)
    s1 = sample(SMALL, 2.0, nbytes={hop: 1000 + 2_500_000}, with_util=False)
    assert state.directed_util(s1, s0)[hop] == pytest.approx(2_500_000 * 8 / 2 / 10e6)
    reset = sample(SMALL, 4.0, nbytes={hop: 10}, with_util=False)  # counters restarted (port re-created)
    assert state.directed_util(reset, s1)[hop] == 0.0
    assert state.directed_util(s0)[hop] == 0.0  # nothing to difference against


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=5_000_000), min_size=16, max_size=16))
def test_imbalance_and_hot_links_match_the_experiments_definition(byte_counts):
    """On byte counters over a window, the live numbers equal experiments.analysis.links.summarise_links."""
    fabric = sorted(fabric_hops(TOPO))
    hops = [(name, end) for name in fabric for end in name.split("-")]
    nbytes = dict(zip(hops, byte_counts, strict=True))
    s0, s1 = sample(TOPO, 0.0, with_util=False), sample(TOPO, 1.0, nbytes=nbytes, with_util=False)
    m = state.fabric_metrics(TOPO, state.directed_util(s1, s0))
    # The runner's samples carry "t"; the controller's bodies carry "time".
    ref = summarise_links(TOPO, [s0 | {"t": 0.0}, s1 | {"t": 1.0}])
    assert m.imbalance == pytest.approx(ref.link_imbalance, abs=1e-3)
    assert sorted(hop_label(h) for h in m.hot) == sorted(ref.hot_links)


def test_a_cut_link_is_left_out_of_the_mean():
    util = {("leaf1-spine2", "leaf1"): 0.5, ("leaf2-spine2", "spine2"): 0.5}
    up = state.fabric_metrics(SMALL, util)
    cut = state.fabric_metrics(SMALL, util, down={"leaf1-spine1", "leaf2-spine1"})
    assert up.mean_util == pytest.approx(1.0 / 8)
    assert cut.mean_util == pytest.approx(1.0 / 4)
    assert cut.imbalance < up.imbalance


def test_hot_needs_both_fullness_and_excess_over_the_mean():
    fabric = sorted(fabric_hops(SMALL))
    all_full = {(name, end): 0.9 for name in fabric for end in name.split("-")}
    assert state.fabric_metrics(SMALL, all_full).hot == []  # full but even: nothing stands out
    one = {("leaf1-spine1", "leaf1"): 0.9}
    assert state.fabric_metrics(SMALL, one).hot == [("leaf1-spine1", "leaf1")]
    assert state.fabric_metrics(SMALL, {("leaf1-spine1", "leaf1"): 0.5}).hot == []


def test_goodput_counts_what_reaches_the_hosts():
    util = {("h1-leaf1", "leaf1"): 0.5, ("h1-leaf1", "h1"): 0.9, ("leaf1-spine1", "leaf1"): 0.9}
    m = state.fabric_metrics(SMALL, util)
    assert m.goodput_bps == pytest.approx(0.5 * 10e6)


# -- placement ---------------------------------------------------------------------------------------


def test_one_flow_per_leaf_is_placed_with_certainty():
    flows = [("h1", "h3")]
    util = place(SMALL, flows, ["spine2"])
    (p,) = state.infer_placement(SMALL, flows, util)
    assert p.certain and p.carrying == ["spine2"] and p.uplinks == ["leaf1->spine2"]
    assert p.paths == ["spine1", "spine2"]


def test_sprayed_flows_are_on_every_path_and_not_certain():
    flows = [("h1", "h3")]
    util = {hop: 0.25 for p in ("spine1", "spine2") for hop in state.path_hops(
        SMALL, next(x for x in __import__("topologies").equal_cost_paths(SMALL, "h1", "h3") if p in x))}
    (p,) = state.infer_placement(SMALL, flows, util)
    assert not p.certain and sorted(p.carrying) == ["spine1", "spine2"]


def test_one_path_per_flow_resolves_what_only_one_flow_can_explain():
    # h1->h3 and h2->h7 both leave leaf1; the counters show both uplinks busy. h2->h7 can only be on
    # spine2 (spine1->leaf4 is idle), so with one path per flow leaf1->spine1 must be h1->h3's.
    flows = [("h1", "h3"), ("h2", "h7"), ("h3", "h5")]
    util = place(TOPO, flows, ["spine1", "spine2", "spine2"])
    loose = state.infer_placement(TOPO, flows, util)
    tight = state.infer_placement(TOPO, flows, util, one_path_per_flow=True)
    assert tight[0].carrying == ["spine1"] and tight[0].certain
    assert tight[1].carrying == ["spine2"]
    assert len(loose[0].carrying) >= len(tight[0].carrying)


@settings(max_examples=80, deadline=None)
@given(st.integers(min_value=0, max_value=10_000), st.booleans())
def test_inference_never_rules_out_the_true_path(seed, one_path):
    rng = random.Random(seed)
    flows = derangement_across(TOPO, seed)
    truth = [rng.choice(["spine1", "spine2"]) for _ in flows]
    util = place(TOPO, flows, truth)
    for p, spine in zip(state.infer_placement(TOPO, flows, util, one_path_per_flow=one_path), truth, strict=True):
        assert spine in p.carrying
        assert p.certain == (p.carrying == [spine])


def test_down_links_are_not_candidates():
    flows = [("h1", "h3")]
    (p,) = state.infer_placement(SMALL, flows, {}, down={"leaf1-spine1"})
    assert p.paths == ["spine2"] and p.carrying == []


def test_uplink_table_lists_the_flows_per_uplink():
    flows = [("h1", "h3")]
    util = place(SMALL, flows, ["spine1"])
    rows = state.uplink_table(SMALL, state.infer_placement(SMALL, flows, util), util, {("leaf1-spine1", "leaf1"): 7})
    by = {r["label"]: r for r in rows}
    assert set(by) == {"leaf1->spine1", "leaf1->spine2", "leaf2->spine1", "leaf2->spine2"}
    assert by["leaf1->spine1"]["flows"] == ["h1->h3"] and by["leaf1->spine1"]["bytes"] == 7
    assert by["leaf1->spine2"]["flows"] == []


# -- over time ---------------------------------------------------------------------------------------


def test_live_state_keeps_series_events_and_window_bytes():
    ls = state.LiveState(SMALL, [("h1", "h3")], history=5)
    hop = ("leaf1-spine1", "leaf1")
    for i in range(8):
        ls.update(sample(SMALL, float(i), util={hop: 0.5}, nbytes={hop: 1000 * i}), now=100.0 + i)
    assert len(ls.series) == 5 and ls.series[-1]["t"] == 107.0
    assert ls.window_bytes()[hop] == 7000  # 8 s of samples, inside the 10 s window
    ev = ls.add_event("mode", "routing mode ecmp -> spray", 108.0)
    assert ls.events_after(ev.id - 1) == [ev.to_dict()] and ls.events_after(ev.id) == []
    ls.set_loss("leaf1-spine1", 2.0)
    view = ls.view()
    link = next(lk for lk in view["links"] if lk["name"] == "leaf1-spine1")
    assert link["loss_pct"] == 2.0 and link["util_ab"] == 0.5
    assert view["metrics"]["hot_count"] == 0  # 0.5 is not "full"
    ls.set_loss("leaf1-spine1", 0)
    assert "leaf1-spine1" not in ls.loss
    snap = ls.snapshot()
    assert len(snap["series"]) == 5 and snap["events"][-1]["kind"] == "mode"


def test_window_bytes_forget_old_samples():
    ls = state.LiveState(SMALL)
    hop = ("leaf1-spine1", "leaf1")
    for i in range(30):
        ls.update(sample(SMALL, float(i), nbytes={hop: 100 * i}), now=float(i))
    assert ls.window_bytes()[hop] == pytest.approx(100 * state.BYTES_WINDOW_S, abs=100)


# -- tiers -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "names"), [
    ("leaf-spine:spines=2,leaves=2,hosts=2", ["host", "leaf", "spine"]),
    ("in-server:servers=2,gpus=4", ["gpu", "local", "tor"]),
    ("fat-tree:k=4", ["host", "edge", "agg", "core"]),
])
def test_tiers_come_from_the_wiring(spec, names):
    topo = parse_spec(spec)
    ts = tiers(topo)
    assert [t.name for t in ts] == names
    assert sorted(n for t in ts for n in t.nodes) == sorted(n.name for n in topo.nodes)
    drawn = layout(topo)
    assert [t["name"] for t in drawn["tiers"]] == names[::-1]  # drawn top tier first
    assert len(drawn["links"]) == len(topo.links)


def test_hosts_sit_under_their_switch():
    ts = tiers(parse_spec("leaf-spine:spines=2,leaves=3,hosts=2"))
    assert ts[0].nodes == ("h1", "h2", "h3", "h4", "h5", "h6")
    assert ts[1].nodes == ("leaf1", "leaf2", "leaf3")
