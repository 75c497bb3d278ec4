"""The fabric contract (transport.core.contract) is the one the emulator, the controller and the transport use.

The controller's spray rules read the EV from the low bits of the UDP source port; the transport's
senders put it there from an aligned base port. These tests hold both sides to the same constants, and
check on the rules the controller computes that every EV a sender uses reaches its own next hop.
"""

from __future__ import annotations

import pytest

from emulator import network, probe
from emulator.controller import rules
from topologies import parse_spec
from transport.core import contract
from transport.core.config import TransportConfig
from transport.io import addressing, allreduce
from transport.io.sender import Sender


def test_every_side_names_the_same_routing_modes() -> None:
    assert network.MODES == rules.MODES == contract.ROUTING_MODES
    for mode in contract.ROUTING_MODES:
        assert rules.mode_error(mode) is None
    assert rules.mode_error("hash") is not None


def test_ev_bits_ports_and_alignment_agree() -> None:
    assert rules.SPRAY_BITS == contract.EV_BITS and 1 << rules.SPRAY_BITS == contract.NUM_EVS
    assert TransportConfig().num_evs == contract.NUM_EVS
    assert addressing.DEFAULT_BASE_PORT == contract.DEFAULT_BASE_PORT == probe.BASE_PORT
    assert addressing.DEFAULT_PORT == contract.DEFAULT_PORT
    assert contract.is_aligned(contract.DEFAULT_BASE_PORT)
    assert contract.is_aligned(allreduce.WorkerOptions(rank=3, peers=[("h", 1)] * 4, size=1).source_base)
    for ev in range(contract.NUM_EVS):
        assert contract.ev_of_port(contract.source_port(contract.DEFAULT_BASE_PORT, ev)) == ev


def test_a_base_port_that_does_not_fit_is_refused_by_one_rule() -> None:
    assert contract.base_port_problem(65520, 16) is None
    problem = contract.base_port_problem(65521, 16)
    assert problem is not None and "use a base port <= 65520" in problem
    with pytest.raises(Exception, match="use a base port <= 65520"):
        Sender(TransportConfig(), "127.0.0.1", base_port=65521)


@pytest.mark.parametrize("spec", ["leaf-spine:spines=4,leaves=2,hosts=1", "leaf-spine:spines=2,leaves=2,hosts=1"])
def test_spray_rules_map_each_sender_ev_to_the_next_hop_it_names(spec: str) -> None:
    topo = parse_spec(spec)
    leaf = next(s for s in topo.switches if s.role == "leaf")
    entries = rules.compute_rules(topo, "spray")[leaf.name]
    # The next-hop table's spray entries match (udp_src value, mask): the mask is the contract's EV bits.
    # (Replies from the receivers' DEFAULT_PORT match it exactly and read their EV from udp_dst.)
    spray = [dict(e.match)["udp_src"] for e in entries if isinstance(dict(e.match).get("udp_src"), tuple)]
    replies = [dict(e.match)["udp_dst"] for e in entries if dict(e.match).get("udp_src") == contract.DEFAULT_PORT]
    assert {mask for _, mask in replies} == {contract.NUM_EVS - 1} and len(replies) == len(spray)
    assert spray, "spray mode installs entries keyed on the UDP source port"
    assert {mask for _, mask in spray} == {contract.NUM_EVS - 1}
    for ev in range(contract.NUM_EVS):
        port = contract.source_port(contract.DEFAULT_BASE_PORT, ev)
        assert {value for value, mask in spray if port & mask == value} == {ev}, f"EV {ev} (port {port})"
