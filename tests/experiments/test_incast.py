"""The incast experiment: its arms and flows, and its analysis on synthetic results (the completion of
the last byte against the ideal, the flows' spread, the receiver queue's peak and drops)."""

from __future__ import annotations

import pytest

from emulator.errors import EmulatorError
from emulator.sampling import parse_root_backlog
from experiments.runner import plan_flows
from experiments.scenarios import incast
from topologies import parse_spec


@pytest.mark.parametrize("spec,fan_in", [(None, 8), ("leaf-spine:spines=2,leaves=4,hosts=4,mtu=9000", 15)])
def test_every_other_host_of_the_fabric_run_on_sends_to_the_receiver(spec, fan_in):
    exp = incast.build()
    topo = parse_spec(spec or exp.topology)
    flows = plan_flows(exp.workload, topo, exp.seed)
    assert [(f.src, f.dst) for f in flows] == [(h.name, "h1") for h in topo.hosts[1:]]
    assert len(flows) == fan_in
    assert exp.extra["watch_queue"] == ["leaf1", "h1"]
    assert {a.labels["cc"] for a in exp.arms} >= {"delay", "tcp"}


def test_an_incast_into_a_host_the_fabric_lacks_is_refused():
    exp = incast.build()
    topo = parse_spec("in-server:servers=2,gpus=2")  # its hosts are s1g1 ... s2g2
    with pytest.raises(EmulatorError, match="receiver h1 is not a host"):
        plan_flows(exp.workload, topo, exp.seed)


def _doc(durations, drops=0):
    flows = [{"src": f"h{i + 2}", "dst": "h1", "bytes": 524288, "completed": True, "duration_s": d,
              "data_packets": 360, "retransmissions": 3} for i, d in enumerate(durations)]
    arm = {"name": "delay-spray", "flows": flows, "queue_max_packets": 40,
           "queue_drops": {"leaf1-eth1": drops} if drops else {}}
    return {"arms": [arm], "extra": {"receiver": "h1"}}


SLOW_RECEIVER = "leaf-spine:spines=2,leaves=3,hosts=3,host_rate=8,fabric_rate=16"


def test_completion_ratio_spread_and_drops():
    topo = parse_spec(SLOW_RECEIVER)  # the receiver's link at 8 Mb/s: the ideal below
    doc = _doc([4.2, 4.3, 4.4, 4.0, 4.1, 4.2, 4.3, 4.4], drops=5)
    an = incast.analyse(doc, topo)
    arm = doc["arms"][0]
    ideal = 8 * 8 * 524288 / 8e6
    assert arm["incast_ideal_s"] == pytest.approx(ideal)
    assert arm["incast_completion_ratio"] == pytest.approx(4.4 / ideal)
    assert arm["completion_spread"] == pytest.approx(0.4 / 4.4)
    assert arm["receiver_queue_drops"] == 5 and an["fan_in"] == 8
    assert arm["retransmit_share"] == pytest.approx(24 / 2880)
    text = " ".join(incast.sentences({"analysis": an, "arms": doc["arms"]}))
    assert "8:1 incast into h1" in text and "5 dropped there" in text


def test_an_unfinished_flow_leaves_no_ratio():
    topo = parse_spec(incast.TOPOLOGY)
    doc = _doc([4.0] * 8)
    doc["arms"][0]["flows"][3]["completed"] = False
    incast.analyse(doc, topo)
    assert doc["arms"][0]["incast_completion_ratio"] is None


def test_backlog_is_read_from_the_root_qdisc():
    text = ("qdisc htb 1: root refcnt 2 r2q 10 default 0x10 direct_packets_stat 0 direct_qlen 1000\n"
            " Sent 1230 bytes 12 pkt (dropped 0, overlimits 3 requeues 0)\n backlog 4542b 3p requeues 0\n"
            "qdisc pfifo 10: parent 1:10 limit 100p\n Sent 1230 bytes 12 pkt (dropped 0, overlimits 0 requeues 0)\n"
            " backlog 4542b 3p requeues 0\n")
    assert parse_root_backlog(text) == (4542, 3)


@pytest.mark.parametrize(("spec", "switch"), [(None, "leaf1"), ("fat-tree:k=4", "p1e1"),
                                               ("clos:pods=2,leaves=2,spines=2,superspines=2,hosts=2", "p1l1")])
def test_the_receiver_queue_is_watched_on_whatever_switch_it_hangs_off(spec, switch):
    # The experiment names its own fabric's leaf1: on a fat-tree, looking for leaf1-h1 failed every arm.
    from experiments.runner import watched_link

    exp = incast.build()
    topo = parse_spec(spec or exp.topology)
    found, link = watched_link(topo, exp.extra["watch_queue"])
    assert found == switch and {link.a, link.b} == {switch, "h1"}
