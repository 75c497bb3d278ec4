"""The tc commands that shape one interface: HTB rate, netem delay and loss, RED with ECN marking (no root)."""

from __future__ import annotations

import pytest

from emulator.errors import EmulatorError
from emulator.shaping import (
    MIN_BURST_BYTES,
    Impairment,
    InterfaceShaper,
    burst_bytes,
    nft_loss_ruleset,
    rate_change_commands,
    red_ecn_args,
    shape_commands,
)
from transport.core.contract import CONTROL_DSCP


def qdisc_adds(cmds: list[list[str]]) -> list[list[str]]:
    return [c for c in cmds if c[:3] == ["tc", "qdisc", "add"]]


def test_rate_delay_and_loss_stack_netem_under_htb():
    adds = qdisc_adds(shape_commands("s1-eth1", Impairment(20.0, 2.0, 1.0, None), netem=True))
    assert [c[5:8] for c in adds] == [["root", "handle", "5:"], ["parent", "5:2", "handle"],
                                      ["parent", "5:3", "handle"]]
    # Data and control both meet the link's delay and loss.
    for leaf in adds[1:]:
        assert leaf[leaf.index("netem"):] == ["netem", "delay", "2.0ms", "loss", "1.0%", "limit", "1000"]


def _classes(cmds: list[list[str]]) -> dict[str, dict[str, str]]:
    """classid -> the HTB class's options (parent, rate, ceil, prio, ...)."""
    out = {}
    for c in cmds:
        if c[:3] == ["tc", "class", "add"]:
            words = [w for w in c[5:] if w != "htb"]
            opts = dict(zip(words[::2], words[1::2], strict=True))
            out[opts.pop("classid")] = opts
    return out


@pytest.mark.parametrize("rate", [1.0, 4.0, 6.0, 100.0])
def test_control_is_served_first_within_the_link_rate(rate):
    cmds = shape_commands("h1-eth0", Impairment(rate_mbps=rate, queue_packets=50), netem=False)
    classes = _classes(cmds)
    link, control, data = classes["5:1"], classes["5:3"], classes["5:2"]
    assert link["parent"] == "5:" and control["parent"] == data["parent"] == "5:1"
    # Each class may take the whole link; together they are guaranteed exactly its rate.
    assert link["rate"] == link["ceil"] == control["ceil"] == data["ceil"] == f"{rate:g}mbit"
    assert float(control["rate"][:-4]) + float(data["rate"][:-4]) == pytest.approx(rate)
    assert (control["prio"], data["prio"]) == ("0", "1")
    # Unmarked traffic is data (the HTB default); the transport's control DSCP goes to control.
    root = next(c for c in cmds if c[:3] == ["tc", "qdisc", "add"] and "root" in c)
    assert root[root.index("default") + 1] == "2"
    filt = next(c for c in cmds if c[:2] == ["tc", "filter"])
    tos, mask = filt[filt.index("tos") + 1:filt.index("tos") + 3]
    assert int(tos, 16) == CONTROL_DSCP << 2 and int(mask, 16) == 0xFC and filt[-1] == "5:3"
    # Each class has a queue of the link's length.
    assert [c[5:] for c in qdisc_adds(cmds)[1:]] == [["parent", "5:2", "handle", "10:", "pfifo", "limit", "50"],
                                                      ["parent", "5:3", "handle", "30:", "pfifo", "limit", "50"]]


def test_a_rate_change_changes_every_class():
    cmds = rate_change_commands("h1-eth0", 8.0)
    assert {c[c.index("classid") + 1] for c in cmds} == {"5:1", "5:2", "5:3"}
    assert all(c[2] == "change" and c[c.index("ceil") + 1] == "8mbit" for c in cmds)


@pytest.mark.parametrize("rate", [1.0, 6.0, 24.0, 100.0, 1000.0])
def test_the_token_bucket_holds_a_millisecond_and_at_least_two_frames(rate):
    # A deep bucket sends what it holds at the veth's speed after an idle spell: a paced flow at
    # 6 Mb/s left in bursts of 10 frames. One millisecond's worth, never under two standard frames.
    b = burst_bytes(rate)
    assert b == max(MIN_BURST_BYTES, round(rate * 1e6 / 8 / 1000))
    assert b >= 2 * 1500
    htb = next(c for c in shape_commands("x", Impairment(rate_mbps=rate), netem=False) if "class" in c)
    assert htb[htb.index("burst") + 1] == htb[htb.index("cburst") + 1] == str(b)


def test_ecn_puts_red_under_htb_and_the_leaf_under_red():
    adds = qdisc_adds(shape_commands("s1-eth1", Impairment(20.0, 2.0, 0.0, 50, ecn=True), netem=True))
    assert len(adds) == 4
    red, leaf, control = adds[1], adds[2], adds[3]
    assert red[5:9] == ["parent", "5:2", "handle", "10:"] and red[9] == "red" and red[-1] == "ecn"
    assert leaf[5:9] == ["parent", "10:1", "handle", "20:"]
    assert leaf[9:] == ["netem", "delay", "2.0ms", "limit", "50"]
    # Control is not ECN-capable: it gets the delay, without RED.
    assert control[5:] == ["parent", "5:3", "handle", "30:", "netem", "delay", "2.0ms", "limit", "50"]
    # Without delay or a queue length, RED's own queue is the leaf.
    adds = qdisc_adds(shape_commands("h1-eth0", Impairment(20.0, ecn=True), netem=False))
    assert len(adds) == 2 and adds[1][9] == "red"
    # Without a rate, RED is the root qdisc.
    adds = qdisc_adds(shape_commands("h1-eth0", Impairment(ecn=True), netem=True))
    assert adds[0][5:8] == ["root", "handle", "10:"]


@pytest.mark.parametrize("rate", [1.0, 20.0, 1000.0, None])
def test_red_thresholds_follow_the_rate(rate):
    args = red_ecn_args(rate)
    value = {k: int(args[args.index(k) + 1]) for k in ("limit", "min", "max", "avpkt", "burst")}
    per_ms = (rate or 1000.0) * 125
    assert value["min"] >= 15000 and value["min"] >= 5 * per_ms - 1
    assert value["max"] == 3 * value["min"] and value["limit"] > value["max"]
    # tc requires burst >= (2 min + max) / (3 avpkt)
    assert value["burst"] >= (2 * value["min"] + value["max"]) / (3 * value["avpkt"])
    assert args[-1] == "ecn"


def test_ecn_without_red_is_one_clear_error():
    shaper = InterfaceShaper(netem=True, nft_egress=True, red_ecn=False)
    ran: list[list[str]] = []
    with pytest.raises(EmulatorError, match=r"needs RED \(sch_red\).*make vm-shell"):
        shaper.apply("s1-eth1", Impairment(20.0, ecn=True), lambda cmd: (ran.append(cmd), (0, ""))[1])
    assert ran == []


def test_delay_without_netem_stops_before_anything_is_created(tmp_path, monkeypatch):
    from emulator.network import Fabric
    from emulator.system import Capabilities
    from topologies import parse_spec

    # A kernel like this project's CI machines': no netem, no RED, no openvswitch module.
    caps = Capabilities(root=True, ovs_version="3.1.0", ovs_running=True, kernel_datapath=False, netem=False,
                        htb=True, red_ecn=False, nftables=True, nft_egress=True, mininet="2.3.0",
                        controller_framework="os-ken 4.0", iperf3="3.12", ethtool=True)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    fab = Fabric(parse_spec("leaf-spine:spines=2,leaves=2,hosts=1,delay=2"), caps=caps)
    with pytest.raises(EmulatorError) as err:
        fab.start()
    message = str(err.value)
    assert "\n" not in message and "delay_ms=2.0" in message and "make vm-shell" in message
    assert fab.state is None and list(tmp_path.iterdir()) == []


class _RecordedState:
    nft_tables: list[str] = []

    def save(self) -> None:
        pass


def _recording_fabric(monkeypatch):
    """A Fabric that was never started, whose tc commands are recorded instead of run."""
    from emulator.network import Fabric
    from topologies import parse_spec

    fab = Fabric(parse_spec("leaf-spine:spines=1,leaves=2,hosts=1,rate=20,delay=1"))
    fab.shaper = InterfaceShaper(netem=True, nft_egress=True, red_ecn=True)
    fab.state = _RecordedState()
    ran: list[list[str]] = []
    monkeypatch.setattr(fab, "_runner_for", lambda node: lambda cmd: (ran.append(cmd), (0, ""))[1])
    return fab, ran


def _rates(cmds: list[list[str]]) -> set[str]:
    """The link rates the commands set: every HTB class's ceiling (its classes share the link's rate)."""
    return {c[c.index("ceil") + 1] for c in cmds if c[:2] == ["tc", "class"]}


def test_a_runtime_rate_is_kept_when_loss_or_ecn_reshape_the_link(monkeypatch):
    # Loss through netem and ECN both shape the interface afresh from its recorded impairment; a rate
    # set at runtime must be in that record, or they silently put the topology's rate back.
    fab, ran = _recording_fabric(monkeypatch)
    sw, _ = fab.topology.host_switch("h1")
    fab.set_rate("h1", sw, 2)
    assert _rates(ran) == {"2mbit"}
    ran.clear()
    fab.set_loss("h1", sw, 1.0)
    assert _rates(ran) == {"2mbit"}
    ran.clear()
    fab.set_ecn("h1", sw)
    assert _rates(ran) == {"2mbit"}
    red = next(c for c in ran if "red" in c)
    assert red[red.index("bandwidth") + 1] == "2mbit"
    ran.clear()
    # With RED on, a rate change shapes afresh so RED's thresholds follow the new rate.
    fab.set_rate("h1", sw, 8)
    red = next(c for c in ran if "red" in c)
    assert red[red.index("bandwidth") + 1] == "8mbit"


@pytest.mark.parametrize("netem", [True, False])
def test_runtime_loss_goes_up_to_a_link_that_drops_everything(netem):
    # 100 % is the silent failure of lab 4: the ports stay up and nothing crosses. nft refuses a numgen
    # bound above its range, so at 100 % the rule drops without drawing a number.
    shaper = InterfaceShaper(netem=netem, nft_egress=True)
    ran: list[list[str]] = []
    shaper.set_loss("s1-eth1", 100.0, lambda cmd: (ran.append(cmd), (0, ""))[1])
    if netem:
        cmd = next(c for c in ran if "netem" in c)
        assert cmd[cmd.index("loss") + 1] == "100.0%"
    else:
        rule = ran[-1][1]
        assert "counter drop" in rule and "numgen" not in rule
    assert "lt 2000 counter drop" in nft_loss_ruleset("s1-eth1", 20.0)
    with pytest.raises(EmulatorError, match="out of range"):
        shaper.set_loss("s1-eth1", 100.5, lambda cmd: (0, ""))
