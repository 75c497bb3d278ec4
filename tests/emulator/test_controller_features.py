"""The controller takes a switch's datapath id from its features reply, not from os-ken's Datapath.

os-ken's own handler fills Datapath.id from the same reply, but on its own event loop: on a slow machine
(the VM under TCG) the controller's handler ran first, found the id None, ignored a switch of the
topology and the fabric never became ready. A fake datapath stands in for the switch: no root, no OVS."""

from __future__ import annotations

from typing import Any

import pytest

from emulator.controller import compat
from emulator.controller.app import ControllerConfig, FabricController
from topologies.builders import leaf_spine


class FakeDatapath:
    """What the handler uses of os-ken's Datapath; sent messages are kept, not sent."""

    def __init__(self) -> None:
        from os_ken.ofproto import ofproto_v1_3, ofproto_v1_3_parser

        self.id: int | None = None  # as os-ken leaves it until its own handler has run
        self.address = ("127.0.0.1", 50000)
        self.ofproto = ofproto_v1_3
        self.ofproto_parser = ofproto_v1_3_parser
        self.sent: list[Any] = []
        self.xid = 0

    def set_xid(self, msg: Any) -> int:
        self.xid += 1
        msg.set_xid(self.xid)
        return self.xid

    def send_msg(self, msg: Any) -> None:
        if msg.xid is None:
            self.set_xid(msg)
        self.sent.append(msg)


class FeaturesEvent:
    def __init__(self, dp: FakeDatapath, dpid: int) -> None:
        self.msg = type("Features", (), {"datapath": dp, "datapath_id": dpid})()


@pytest.fixture
def controller() -> Any:
    if compat.FRAMEWORK != "os-ken":
        pytest.skip("the fake datapath speaks os-ken's OpenFlow 1.3 classes")
    FabricController.config = ControllerConfig(topology=leaf_spine(spines=2, leaves=2, hosts_per_leaf=1))
    try:
        yield FabricController()
    finally:
        FabricController.config = None


def test_a_switch_is_taken_even_before_os_ken_has_named_its_datapath(controller):
    leaf = next(n for n in controller.topo.switches if n.name == "leaf1")
    dp = FakeDatapath()
    controller._on_features(FeaturesEvent(dp, leaf.dpid))
    assert dp.id == leaf.dpid
    assert controller.datapaths == {leaf.dpid: dp}
    kinds = [type(m).__name__ for m in dp.sent]
    assert kinds[0] == "OFPFlowMod" and "OFPBarrierRequest" in kinds
    assert controller._events[-1]["switch"] == "leaf1"


def test_a_switch_outside_the_topology_is_ignored_by_its_id(controller, caplog):
    dp = FakeDatapath()
    controller._on_features(FeaturesEvent(dp, 0xBEEF))
    assert controller.datapaths == {}
    assert dp.sent == []
    assert "switch 0xbeef at" in caplog.text and "not in topology" in caplog.text
