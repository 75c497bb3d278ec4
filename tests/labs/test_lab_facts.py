"""What the labs' READMEs state as fact agrees with the code: the hash the controller installs (lab 1),
what the receiver's reorder distance is and is not (lab 2), why loss barely bends lab 3's curves, and
what `--duration` does to an all-reduce (lab 5). No root."""

from __future__ import annotations

import pytest

from emulator.controller.rules import Multipath, compute_rules
from experiments import catalogue, overrides
from labs.catalogue import all_labs, load_checker
from topologies import parse_spec
from transport.core.headers import datagram_size_for_mtu

LABS = {lab.number: lab for lab in all_labs()}


def readme(number: int) -> str:
    return " ".join((LABS[number].path / "README.md").read_text(encoding="utf-8").split())


def test_lab1_names_the_hash_the_controller_installs():
    text = readme(1)
    installed = str(Multipath(2, 7))
    assert installed.startswith("multipath(symmetric_l3l4+udp,7,hrw,2,")
    assert "multipath(symmetric_l3l4+udp, basis, hrw, n, 0, reg0)" in text and "rendezvous" in text
    assert "Here the controller installs exactly that" not in text
    # Every ECMP switch of the lab's fabric hashes with HRW, none with a modulo.
    topo = parse_spec("leaf-spine:spines=2,leaves=2,hosts=2")
    actions = {str(a) for flows in compute_rules(topo, "ecmp", set()).values() for f in flows for a in f.actions}
    hashes = {a for a in actions if a.startswith("multipath(")}
    assert hashes and all(",hrw," in a for a in hashes)


def rfc4737_extents(arrivals: list[int]) -> list[int]:
    """RFC 4737 section 4.2.2: a reordered packet's extent is its arrival position minus the position
    of the earliest packet that arrived before it with a higher sequence number."""
    out = []
    for i, psn in enumerate(arrivals):
        earlier = [j for j in range(i) if arrivals[j] > psn]
        if earlier:
            out.append(i - min(earlier))
    return out


@pytest.mark.parametrize(("arrivals", "distance", "extent"), [
    ([0, 1, 3, 4, 2, 5], [2], [2]),
    ([0, 5, 1], [4], [1]),
])
def test_lab2_reorder_distance_is_a_psn_gap_not_rfc4737s_extent(arrivals, distance, extent):
    receiver = load_checker(LABS[2]).receiver_distances
    assert receiver(arrivals) == distance and rfc4737_extents(arrivals) == extent
    text = readme(2)
    assert "RFC 4737 calls it the reordering extent" not in text
    assert "0, 5, 1 packet 1 has a reorder distance of 4" in text and "an extent of 1" in text


def test_lab3_says_its_path_holds_a_few_packets():
    exp = catalogue.get("loss-recovery").build()
    topo = parse_spec(exp.topology)
    rates = {lk.rate_mbps for lk in topo.links}
    assert rates == {10.0} and all(lk.delay_ms == 0 for lk in topo.links)
    packet = datagram_size_for_mtu(topo.mtu)
    bdp_packets = 10e6 * 2e-3 / 8 / packet  # the README's 2 ms round trip, an upper bound without delay
    assert bdp_packets < 2
    assert "bandwidth-delay product is a few packets" in readme(3)


def test_lab5_duration_scales_the_allreduce():
    exp = catalogue.get("allreduce").build()
    assert exp.duration_s == 10.0 and exp.workload.elements * 4 == 4 << 20
    half = overrides.with_overrides(exp, duration=5.0)
    assert half.workload.elements == exp.workload.elements // 2
    tiny = overrides.with_overrides(exp, duration=0.01)
    assert tiny.workload.elements * 4 == 64 << 10
    text = readme(5)
    assert "does not shorten" not in text and "a shorter `--duration` does shorten the run" in text


def test_lab5_in_server_facts_match_the_experiment():
    exp = catalogue.get("in-server").build()
    params = parse_spec(exp.topology).params
    assert (params["gpu_rate"], params["nic_rate"]) == (25.0, 5.0)
    (elements,) = {a.workload.elements for a in exp.arms if a.workload}
    assert elements * 4 == 256 << 10
    text = readme(5)
    assert "at 25 and 5 Mb/s in 9,000-byte frames" in text and "(256 KiB per rank" in text
    assert "GPU link rate (25 Mb/s)" in text and "same 5 Mb/s NIC" in text


def test_generated_sample_outputs_and_answer_figures_agree_with_the_shipped_files():
    """Lab 1's sample output and the answer keys' figures are made by labs/references.py from the
    reference runs and the checkers' simulated jobs; a block that differs was edited by hand or left
    behind when a reference was remade."""
    from labs import references

    docs = {p.name for p in references.documents()}
    assert "01-ecmp-hot-links.md" in docs and "README.md" in docs
    blocks = {m.group(2) + " " + m.group(3) for p in references.documents()
              for m in references.BLOCK.finditer(p.read_text(encoding="utf-8"))}
    assert {"check 1", "table 1", "table 2", "distances 2", "table 3", "retx 3", "table 4", "reroute 4",
            "model 7", "bench 7", "sentences 7"} <= blocks
    assert references.stale() == []


def test_a_generated_block_edited_by_hand_is_found():
    from labs import references

    text = "a\n<!-- generated: retx 3 -->\n| made up |\n<!-- end generated -->\nb\n"
    fresh = references.regenerate(text)
    assert "| made up |" not in fresh and "| 5 % |" in fresh and fresh.startswith("a\n") and fresh.endswith("b\n")


def test_lab4_reference_summary_says_when_the_controller_rerouted():
    import json

    ref = next((LABS[4].path / "reference").glob("failover/*/results.json"))
    delay = json.loads(ref.read_text())["extra"]["controller_reaction_s"]
    summary = (ref.parent / "summary.md").read_text(encoding="utf-8")
    assert delay == 0.0
    assert "which it does 1 s after the cut" not in summary and "`--reaction-delay 0`" in summary


def test_lab4_states_the_bins_the_recovery_is_read_from():
    from experiments.arms.base import FINE_BIN
    from experiments.scenarios.failover import FINE_SMOOTH

    text = readme(4)
    assert (FINE_BIN, FINE_SMOOTH) == (0.02, 3)
    assert "in 0.02 s bins, smoothed over three of them (a 60 ms window)" in text
    assert "0.1 s bins (smoothed over two bins)" not in text


def test_lab6_points_at_files_that_exist():
    import re
    from pathlib import Path

    repo = Path(LABS[6].path).parents[1]
    named = set(re.findall(r"`((?:transport|experiments|labs)/[\w/]+\.py)`", readme(6)))
    assert "transport/core/paths.py" in named
    assert all((repo / n).is_file() for n in named), [n for n in named if not (repo / n).is_file()]


def test_lab3_says_the_check_compares_medians():
    text = readme(3)
    assert "go-back-N's slowest messages wait longest" not in text
    assert "go-back-N's median message waits longer" in text


def test_lab1_probe_without_root_computes_the_probe_table():
    import importlib.util

    path = LABS[1].path / "probe_sim.py"
    spec = importlib.util.spec_from_file_location("lab1_probe_sim", path)
    assert spec and spec.loader
    probe_sim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe_sim)
    topo = probe_sim.DEFAULT_TOPO
    # One source port: one path, whatever the routing; 256 in turn: spray splits them evenly, ECMP by
    # its hash, single keeps one spine.
    for mode in probe_sim.MODES:
        fixed = probe_sim.spread(topo, mode, "fixed", 400)
        assert sorted(fixed.values()) == [0, 0, 0, 400], (mode, fixed)
    assert set(probe_sim.spread(topo, "spray", "rotate", 400).values()) == {100}
    ecmp = probe_sim.spread(topo, "ecmp", "rotate", 400)
    assert sum(ecmp.values()) == 400 and min(ecmp.values()) > 50
    assert sorted(probe_sim.spread(topo, "single", "rotate", 400).values()) == [0, 0, 0, 400]
    assert "probe_sim.py --packets" in readme(1)
