"""The headers around a transport datagram on an Ethernet / IP network, and what they leave of an MTU.

A datagram of `mtu - IPv4 - UDP` bytes fills an IP packet of the interface's MTU; on a link each
packet also carries its Ethernet header (shaped links count it, not the preamble, FCS or gap). The
runner sizes datagrams and flows from these, and the results count wire bytes with them.
"""

from __future__ import annotations

from transport.core.wire import ACK_LEN, DATA_HEADER_LEN

ETHERNET_HEADER = 14
IPV4_HEADER = 20
IPV6_HEADER = 40
UDP_HEADER = 8
# What an IPv4 MTU holds besides one datagram.
IP_UDP_HEADERS = IPV4_HEADER + UDP_HEADER
# What a link carries besides one UDP datagram: its UDP, IPv4 and Ethernet headers.
UDP_FRAME_OVERHEAD = IP_UDP_HEADERS + ETHERNET_HEADER
# Header bytes on the link per DATA packet and per ACK frame: the transport's own, UDP, IPv4, Ethernet.
DATA_WIRE_OVERHEAD = DATA_HEADER_LEN + UDP_FRAME_OVERHEAD
ACK_FRAME = ACK_LEN + UDP_FRAME_OVERHEAD


def datagram_size_for_mtu(mtu: int, ipv6: bool = False) -> int:
    """The largest transport datagram (UDP payload, the transport's header included) that an IP MTU
    of `mtu` bytes carries unfragmented."""
    return mtu - (IPV6_HEADER if ipv6 else IPV4_HEADER) - UDP_HEADER
