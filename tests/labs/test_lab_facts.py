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
