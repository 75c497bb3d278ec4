"""Flow completion time against the ideal, the slowdown htsim and ns-3 report: how each transport
cuts a flow into packets (its framing), the bytes on the wire, the flow's bottleneck and base RTT,
the ideal FCT and the slowdown."""

from __future__ import annotations

import math
from dataclasses import dataclass

from experiments.analysis.placement import ideal_bps
from topologies import Link, Topology, next_hops
from transport.core.headers import ACK_FRAME, DATA_WIRE_OVERHEAD, ETHERNET_HEADER, IPV4_HEADER
from transport.core.wire import DATA_HEADER_LEN

#
# ideal FCT = bytes on the wire / bottleneck rate + base RTT; slowdown = FCT / ideal FCT. The bytes on
# the wire are the flow's payload plus every packet's headers as a shaped link counts them (HTB counts
# the Ethernet header, not the preamble, FCS or inter-frame gap).

# Linux's TCP over a 1500-byte MTU: 1448 payload bytes per segment (timestamps on), 66 bytes of headers.
TCP_PMTU = 1500
TCP_MSS = 1448
TCP_ACK_FRAME = IPV4_HEADER + 32 + ETHERNET_HEADER


@dataclass(frozen=True)
class Framing:
    """How a transport cuts a flow into packets: at most `payload` bytes per packet, `overhead` bytes of
    headers on the link per packet, a new packet at every `message` bytes (0 = one byte stream), and
    `ack` bytes per ACK frame on the way back."""

    payload: int
    overhead: int
    message: int = 0
    ack: int = 0
    equal: bool = False  # a message's packets share its bytes equally (the transport's), not full + rest

    def fragment(self, nbytes: int) -> int:
        """Payload of the first packet of a message of `nbytes` bytes (of all but its last, when equal)."""
        if not self.equal or nbytes <= 0:
            return min(nbytes, self.payload)
        return -(-nbytes // -(-nbytes // self.payload))


def srd_framing(mtu: int = 1400, message_size: int = 65536) -> Framing:
    """The transport's DATA datagrams: `mtu` bytes of UDP payload including its own 42-byte header, cut
    per message, plus UDP, IPv4 and Ethernet: 84 bytes of overhead per packet
    (transport.core.headers.DATA_WIRE_OVERHEAD)."""
    return Framing(payload=mtu - DATA_HEADER_LEN, overhead=DATA_WIRE_OVERHEAD, message=message_size, ack=ACK_FRAME,
                   equal=True)


def tcp_framing(mss: int = TCP_MSS, pmtu: int = TCP_PMTU) -> Framing:
    """TCP segments of `mss` payload bytes in IP packets of `pmtu` bytes, plus Ethernet."""
    return Framing(payload=mss, overhead=pmtu - mss + ETHERNET_HEADER, message=0, ack=TCP_ACK_FRAME)


def wire_bytes(size: int, framing: Framing) -> int:
    """Bytes a flow of `size` payload bytes puts on each link of its path (its packets' headers included)."""
    if size <= 0:
        return 0
    per_message = framing.message if framing.message > 0 else size
    full, rest = divmod(size, per_message)
    packets = full * math.ceil(per_message / framing.payload) + math.ceil(rest / framing.payload)
    return size + packets * framing.overhead


def path_links(topo: Topology, src: str, dst: str) -> list[Link]:
    """The links of one shortest src->dst path (the first next hop at every step; equal-cost paths have
    as many hops)."""
    links: list[Link] = []
    node = src
    while node != dst:
        hops = next_hops(topo, node, dst)
        if not hops or len(links) > 64:
            raise ValueError(f"{dst} is unreachable from {node}")
        links.append(hops[0])
        node = hops[0].peer(node)
    return links


def bottleneck_bps(topo: Topology, src: str, dst: str) -> float:
    """The rate a src->dst flow gets alone in the fabric, spread over every equal-cost path: the lowest
    link rate along its path, unless parallel fabric links slower than the host links add up to less."""
    return ideal_bps(topo, [(src, dst)])


def topology_base_rtt(topo: Topology, src: str, dst: str, framing: Framing) -> float:
    """Base RTT from the fabric's description when the endpoint measured none: propagation both ways
    plus, at every hop, storing and forwarding one full packet out and one ACK back."""
    packet = framing.fragment(framing.message or framing.payload) + framing.overhead
    rtt = 0.0
    for lk in path_links(topo, src, dst):
        rtt += 2 * lk.delay_ms / 1e3 + 8 * (packet + framing.ack) / (lk.rate_mbps * 1e6)
    return rtt


def wire_efficiency(framing: Framing, size: int = 64 << 20) -> float:
    """Payload bytes per byte on the wire for a long transfer cut this way (ACKs, which travel the
    other way, are not counted)."""
    return size / wire_bytes(size, framing)


def first_packet_bytes(size: int, framing: Framing) -> int:
    """Bytes on the wire of a flow's first packet."""
    if size <= 0:
        return 0
    per_message = framing.message if framing.message > 0 else size
    return framing.fragment(min(size, per_message)) + framing.overhead


def ideal_fct(size: int, framing: Framing, bottleneck: float, base_rtt: float) -> float:
    """Seconds a flow of `size` bytes takes alone on an idle fabric: one base RTT (the first packet out,
    its ACK back), and the rest of its bytes on the wire behind it at the bottleneck rate.

    The first packet's own serialisation is part of the base RTT, so it is not counted twice: a
    transfer that keeps the bottleneck busy from its first byte has a slowdown of exactly 1.
    """
    return base_rtt + 8 * (wire_bytes(size, framing) - first_packet_bytes(size, framing)) / bottleneck


def slowdown(fct: float, ideal: float) -> float | None:
    """FCT / ideal FCT (1.0 = as fast as the fabric allows); None without both."""
    if fct is None or ideal is None or ideal <= 0:
        return None
    return fct / ideal
