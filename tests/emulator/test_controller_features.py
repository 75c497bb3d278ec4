"""A switch connects however os-ken's threads interleave with the controller's.

os-ken's own handler fills Datapath.id from the features reply on the connection's receive thread,
after it has queued the reply for the controller; its port request's reply is what moves the switch
from CONFIG to MAIN. On a slow machine (the VM under TCG) the controller's handler ran first: it found
the id None and ignored a switch of the topology, and the replies to what it sends could have arrived
while the switch was still in CONFIG. Either way the fabric never became ready. Here real os-ken
messages reach the controller through os-ken's own choice of handlers for a state, from a fake datapath
that keeps what is sent to it: no root, no OVS."""

from __future__ import annotations

from typing import Any

import pytest

from emulator.controller import compat
from emulator.controller.app import ControllerConfig, FabricController
from topologies.builders import leaf_spine

if compat.FRAMEWORK != "os-ken":  # pragma: no cover - Ryu's classes differ only in their package
    pytest.skip("these fakes build os-ken's OpenFlow 1.3 messages", allow_module_level=True)

from os_ken.controller import handler
from os_ken.ofproto import ofproto_v1_3
from os_ken.ofproto import ofproto_v1_3_parser as parser

CONFIG, MAIN = compat.CONFIG_DISPATCHER, compat.MAIN_DISPATCHER


class FakeDatapath:
    """What the controller uses of os-ken's Datapath; what it sends is kept, not sent."""

    def __init__(self) -> None:
        self.id: int | None = None  # as os-ken leaves it until its own handler has run
        self.address = ("127.0.0.1", 50000)
        self.ofproto = ofproto_v1_3
        self.ofproto_parser = parser
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

    def sent_of(self, kind: type) -> list[Any]:
        return [m for m in self.sent if isinstance(m, kind)]


def deliver(app: FabricController, msg: Any, state: str) -> int:
    """Hand `msg` to the handlers os-ken would choose for it in `state`; return how many there were."""
    ev = compat.ofp_event.ofp_msg_to_ev(msg)
    handlers = list(app.get_handlers(ev, state))
    for handle in handlers:
        handle(ev)
    return len(handlers)


def port_down(port_no: int) -> Any:
    return parser.OFPPort(port_no, "00:00:00:00:00:01", f"eth{port_no}", 0, ofproto_v1_3.OFPPS_LINK_DOWN,
                          0, 0, 0, 0, 0, 0)


@pytest.fixture
def controller() -> Any:
    FabricController.config = ControllerConfig(topology=leaf_spine(spines=2, leaves=2, hosts_per_leaf=1))
    try:
        app = FabricController()
        handler.register_instance(app)  # what os-ken's app manager does when it loads the app
        yield app
    finally:
        FabricController.config = None


def test_a_switch_is_taken_and_programmed_before_os_ken_has_named_it(controller):
    leaf = next(n for n in controller.topo.switches if n.name == "leaf1")
    dp = FakeDatapath()
    assert deliver(controller, parser.OFPSwitchFeatures(dp, datapath_id=leaf.dpid), CONFIG) == 1
    assert dp.id == leaf.dpid
    assert controller.datapaths == {leaf.dpid: dp}
    assert isinstance(dp.sent[0], parser.OFPFlowMod)  # an empty switch to start from
    [port_request] = dp.sent_of(parser.OFPPortDescStatsRequest)
    assert dp.sent_of(parser.OFPBarrierRequest) and controller.barriers

    # os-ken's port request has not been answered yet: the switch is still in CONFIG.
    ports = parser.OFPPortDescStatsReply(dp, body=[port_down(1)], flags=0)
    ports.xid = port_request.xid
    assert deliver(controller, ports, CONFIG) == 1
    assert (leaf.dpid, 1) in controller.ports_down  # and a reroute, with a barrier of its own
    for barrier in dp.sent_of(parser.OFPBarrierRequest):
        reply = parser.OFPBarrierReply(dp)
        reply.xid = barrier.xid
        assert deliver(controller, reply, CONFIG) == 1
    assert leaf.dpid in controller.synced and not controller.barriers
    [event] = [e for e in controller._events if e["kind"] == "switch_connected"]
    assert event["switch"] == "leaf1" and event["flow_mods"] > 0


def test_a_switch_outside_the_topology_is_ignored_by_its_id(controller, caplog):
    dp = FakeDatapath()
    deliver(controller, parser.OFPSwitchFeatures(dp, datapath_id=0xBEEF), CONFIG)
    assert controller.datapaths == {}
    assert dp.sent == []
    assert "switch 0xbeef at" in caplog.text and "not in topology" in caplog.text
    # Its ports' replies change nothing either.
    deliver(controller, parser.OFPPortDescStatsReply(dp, body=[port_down(1)], flags=0), MAIN)
    assert not controller.ports_down
