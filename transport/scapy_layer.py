"""scapy layers for the transport's DATA and ACK headers, for pcaps, dissection and crafting packets.

The header fields are generated from `wire.DATA_FIELDS` / `wire.ACK_FIELDS`, so the layers cannot drift
from the wire format. Both packet types share the transport's UDP port; `SRDData.dispatch_hook` looks
at the type byte and picks `SRDAck` for ACKs. Left as None, `payload_len`, `msg_len` and `crc` are
filled in when a packet is built, so a crafted packet decodes with `wire.decode`.

This module imports scapy (slow to import, slow per packet): use it in tools and tests, never in the
endpoint's hot path.

    >>> from transport.scapy_layer import SRDData, bind_port
    >>> pkt = IP(dst="10.0.0.2") / UDP(sport=40003) / SRDData(conn_id=7, psn=1, ev=3) / b"hello"
"""

from __future__ import annotations

import zlib
from typing import Any

from scapy.fields import (
    ByteEnumField,
    ByteField,
    Field,
    FlagsField,
    IntField,
    LongField,
    ShortField,
    XIntField,
    XShortField,
)
from scapy.layers.inet import UDP
from scapy.packet import Packet, Raw, bind_bottom_up, bind_layers, bind_top_down

from transport.core import wire
from transport.core.contract import DEFAULT_PORT

PACKET_TYPES = {wire.TYPE_DATA: "DATA", wire.TYPE_ACK: "ACK"}

# Fields computed at build time when left as None.
_AUTO = {"payload_len", "msg_len", "crc"}
_HEX = {"magic", "conn_id", "crc"}
_BY_CODE = {"B": ByteField, "H": ShortField, "I": IntField, "Q": LongField}


def _fields(table: list[tuple[str, str, str]], ptype: int) -> list[Field]:
    """scapy fields for a wire field table, with defaults that make a valid packet."""
    out: list[Field] = []
    for name, code, _desc in table:
        if name == "magic":
            out.append(XShortField(name, wire.MAGIC))
        elif name == "version":
            out.append(ByteField(name, wire.VERSION))
        elif name == "type":
            out.append(ByteEnumField(name, ptype, PACKET_TYPES))
        elif name == "flags":
            names = ["RETRANSMIT"] if ptype == wire.TYPE_DATA else ["NAK", "CREDIT"]
            out.append(FlagsField(name, 0, 16, names))
        elif name == "frag_count":
            out.append(ShortField(name, 1))
        elif code == "I" and name in _HEX:
            out.append(XIntField(name, None if name in _AUTO else 0))
        else:
            if code not in _BY_CODE:
                raise TypeError(f"no scapy field for struct code {code!r} of {name}")
            out.append(_BY_CODE[code](name, None if name in _AUTO else 0))
    return out


def _dispatch(_pkt: bytes | None) -> type[Packet] | None:
    if _pkt and len(_pkt) >= 4 and _pkt[3] == wire.TYPE_ACK:
        return SRDAck
    if _pkt and len(_pkt) >= 4 and _pkt[3] == wire.TYPE_DATA:
        return SRDData
    return None


class SRDData(Packet):
    """DATA header; the message fragment follows as the payload (Raw)."""

    name = "SRD DATA"
    fields_desc = _fields(wire.DATA_FIELDS, wire.TYPE_DATA)

    @classmethod
    def dispatch_hook(cls, _pkt: bytes | None = None, *args: Any, **kargs: Any) -> type[Packet]:
        return _dispatch(_pkt) or cls

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        hdr = wire.DATA_HEADER_LEN
        head = bytearray(pkt[:hdr])
        offsets = _offsets(wire.DATA_FIELDS)
        if self.payload_len is None:
            off = offsets["payload_len"]
            head[off : off + 2] = len(pay).to_bytes(2, "big")
        if self.msg_len is None:
            off = offsets["msg_len"]
            head[off : off + 4] = len(pay).to_bytes(4, "big")
        if self.crc is None:
            crc = zlib.crc32(pay, zlib.crc32(bytes(head[: hdr - 4])))
            head[hdr - 4 : hdr] = crc.to_bytes(4, "big")
        return bytes(head) + pkt[hdr:] + pay

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        return Raw

    def mysummary(self) -> str:
        return self.sprintf("SRD DATA conn=%conn_id% psn=%psn% msg=%msg_id% frag=%frag_index%/%frag_count% ev=%ev%")


class SRDAck(Packet):
    """ACK: cumulative PSN, SACK bitmap, echoed timestamp and EV, receive window."""

    name = "SRD ACK"
    fields_desc = _fields(wire.ACK_FIELDS, wire.TYPE_ACK)

    @classmethod
    def dispatch_hook(cls, _pkt: bytes | None = None, *args: Any, **kargs: Any) -> type[Packet]:
        return _dispatch(_pkt) or cls

    def post_build(self, pkt: bytes, pay: bytes) -> bytes:
        if self.crc is None:
            n = wire.ACK_LEN
            pkt = pkt[: n - 4] + zlib.crc32(pkt[: n - 4]).to_bytes(4, "big") + pkt[n:]
        return pkt + pay

    def mysummary(self) -> str:
        return self.sprintf("SRD ACK conn=%conn_id% cum=%cum_psn% ack=%ack_psn% ev=%ev%")


def _offsets(table: list[tuple[str, str, str]]) -> dict[str, int]:
    import struct

    offsets, off = {}, 0
    for name, code, _ in table:
        offsets[name] = off
        off += struct.calcsize("!" + code)
    return offsets


def bind_port(port: int) -> None:
    """Dissect UDP traffic to or from `port` as the transport (DATA to it, ACKs from it)."""
    # DATA is built towards the receiver's port; ACKs are built from it. Dissection works both ways;
    # dispatch_hook then picks DATA or ACK from the type byte.
    bind_layers(UDP, SRDData, dport=port)
    bind_bottom_up(UDP, SRDData, sport=port)
    bind_top_down(UDP, SRDAck, sport=port)


bind_port(DEFAULT_PORT)


def dissect(datagram: bytes) -> Packet:
    """A UDP payload of the transport as SRDData or SRDAck (no IP/UDP headers needed)."""
    return SRDData(datagram)


def udp_datagrams(packets: Any) -> list[bytes]:
    """The transport datagrams (UDP payloads) in a list of scapy packets, e.g. `rdpcap(...)`."""
    out = []
    for p in packets:
        layer = p.getlayer(SRDData) or p.getlayer(SRDAck)
        if layer is not None:
            out.append(bytes(layer))
    return out
