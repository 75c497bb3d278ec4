"""The probe's counting, without root: which switches it reads, tier by tier, and what it would report.

The packets are walked through the controller's computed rules by the interpreter of
test_controller_rules, standing in for the switches' port counters.
"""

from __future__ import annotations

from collections import Counter

import pytest

from emulator.controller.rules import compute_rules
from emulator.errors import EmulatorError
from emulator.probe import BASE_PORT, ROTATE_SOURCES, ProbeResult, balance, counted_tiers, tier_counts
from tests.emulator.test_controller_rules import walk
from topologies import Link, Node, Topology, clos, fat_tree, in_server, leaf_spine


def test_counted_tiers_of_every_builder():
    assert counted_tiers(leaf_spine(4, 2, 1)) == {"spine": ["spine1", "spine2", "spine3", "spine4"]}
    assert counted_tiers(in_server(2, 2)) == {"tor": ["tor1"]}
    tiers = counted_tiers(fat_tree(4))
    assert list(tiers) == ["core", "agg"]
    assert tiers["core"] == ["c1", "c2", "c3", "c4"] and len(tiers["agg"]) == 8
    tiers = counted_tiers(clos(pods=2, leaves=2, spines=2, superspines=4))
    assert list(tiers) == ["superspine", "spine"] and tiers["spine"] == ["p1s1", "p1s2", "p2s1", "p2s2"]


def test_a_fabric_with_hosts_on_every_switch_has_nothing_to_count():
    nodes = (
        Node("s1", "switch", dpid=1),
        Node("h1", "host", ip="10.0.0.1/16", mac="02:00:00:00:00:01"),
    )
    with pytest.raises(EmulatorError, match="no upper tier to count paths over"):
        counted_tiers(Topology("one", nodes, (Link("h1", 0, "s1", 1, 10.0),)))


def test_tier_counts_and_balance():
    tiers = {"core": ["c1", "c2"], "agg": ["a1", "a2", "a3"]}
    before = {"c1": 5, "c2": 0, "a1": 1, "a2": 1, "a3": 1}
    after = {"c1": 105, "c2": 50, "a1": 101, "a2": 51, "a3": 1}
    counts = tier_counts(tiers, before, after)
    assert counts == {"core": {"c1": 100, "c2": 50}, "agg": {"a1": 100, "a2": 50, "a3": 0}}
    assert balance(counts["core"]) == 2.0 and balance(counts["agg"]) == 2.0
    assert balance({"c1": 0}) is None


def probe_by_interpreter(topo: Topology, mode: str, src: str, dst: str, packets: int) -> ProbeResult:
    """What run_probe would report if the switches forwarded exactly as the computed rules say."""
    rules = compute_rules(topo, mode)
    tiers = counted_tiers(topo)
    seen: Counter = Counter()
    for i in range(packets):
        seen.update(walk(topo, rules, src, dst, sport=BASE_PORT + i % ROTATE_SOURCES)[1:-1])
    per_tier = tier_counts(tiers, Counter(), seen)
    return ProbeResult(
        mode, "rotate", src, dst, packets, packets, next(iter(per_tier.values())), 1.0, 0.0, per_tier=per_tier
    )


def test_probe_report_on_a_k4_fat_tree_sprays_every_core_and_aggregation_switch():
    r = probe_by_interpreter(fat_tree(4), "spray", "h1", "h16", packets=1024)
    assert r.per_spine == {"c1": 256, "c2": 256, "c3": 256, "c4": 256}
    # Both pods' aggregation switches are crossed: the sender's on the way up, the receiver's down.
    assert r.per_tier["agg"] == {
        "p1a1": 512,
        "p1a2": 512,
        "p2a1": 0,
        "p2a2": 0,
        "p3a1": 0,
        "p3a2": 0,
        "p4a1": 512,
        "p4a2": 512,
    }
    assert r.balance == 1.0 and r.tier_balance == {"core": 1.0, "agg": 1.0}
    assert r.to_dict()["per_tier"] == r.per_tier


def test_probe_report_on_a_leaf_spine_keeps_per_spine():
    r = probe_by_interpreter(leaf_spine(4, 4, 2), "spray", "h1", "h8", packets=1600)
    assert r.per_spine == r.per_tier["spine"] == {"spine1": 400, "spine2": 400, "spine3": 400, "spine4": 400}


def test_the_traversal_probe_stays_within_its_source_link():
    from emulator.traversal import farthest_pair, paced_rate

    topo = fat_tree(8, host_rate=0.5)
    src, _ = farthest_pair(topo)
    # 0.9 of 0.5 Mb/s in 1,042-byte frames: 54 a second, not the 1700 that queued for two minutes.
    assert paced_rate(topo, src, 1700.0, 1000) == pytest.approx(0.9 * 0.5e6 / (8 * 1042))
    assert paced_rate(fat_tree(4, host_rate=100.0), "h1", 1700.0, 1000) == 1700.0


def test_a_probe_sender_that_cannot_finish_is_a_one_line_error(tmp_path, monkeypatch):
    import subprocess
    import sys

    from emulator import probe

    class Host:
        def __init__(self, role: str) -> None:
            self.role = role

        def popen(self, cmd: list[str], **kw) -> subprocess.Popen:
            if self.role == "recv":  # ready at once, then waits to be killed
                ready = cmd[cmd.index("--ready") + 1]
                code = f"import pathlib, time; pathlib.Path({ready!r}).touch(); time.sleep(60)"
            else:  # a sender stuck in its sends
                code = "import time; time.sleep(60)"
            return subprocess.Popen([sys.executable, "-c", code], **kw)

    class Fab:
        topology = leaf_spine(2, 2, 1)
        workdir = tmp_path

        def host(self, name: str) -> Host:
            return Host("recv" if name == "h2" else "send")

        def ofctl_target(self, switch: str) -> str:
            return switch

        def ip(self, name: str) -> str:
            return "10.0.0.2"

    monkeypatch.setattr(probe, "switch_rx_packets", lambda target: 0)
    monkeypatch.setattr(probe, "slowdown", lambda: 0.01)  # the sender's grace: 0.6 s
    with pytest.raises(EmulatorError, match=r"^probe sender still sending 10 datagrams at 100/s after 1 s: "
                                            r"h1's link is too slow for that rate; lower --rate or --packets$"):
        probe.run_probe(Fab(), "h1", "h2", packets=10, rate_pps=100.0)  # type: ignore[arg-type]
