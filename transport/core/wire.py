"""Wire format of the fabriclab transport: fixed headers packed with ``struct`` in network byte order.

Four packet types share a 12-byte common prefix (magic, version, type, flags, EV, connection id):

* DATA carries one fragment of a message, identified by its packet sequence number (PSN).
* ACK carries a cumulative PSN, a 64-bit SACK bitmap, the echoed timestamp and EV of the packet
  that triggered it, the receive window, the receiver's credit (receiver-driven congestion control,
  transport.core.credit), how many of the DATA packets it answers arrived CE-marked (ECN) and the
  echoed packet's one-way delay as the receiver saw it (its own clock at arrival less the packet's
  timestamp: the delay plus the two clocks' offset, which the sender cancels by comparing samples).
* CREDIT (receiver to sender) and REQUEST (sender to receiver) carry one cumulative PSN limit: "you
  may send PSNs below this" and "I have PSNs below this to send" (transport.core.credit).

Version 2 added the ACK's credit and CE fields and the CREDIT and REQUEST packets, version 3 the ACK's
one-way delay; a packet of another version is rejected as any unknown version is.

Every packet ends its header with a CRC32 (``zlib.crc32``) over the rest of the header and the
payload, so corruption in flight is detected and the packet dropped. The CRC is no MAC: anyone on
the fabric can compute it, and the transport trusts the fabric (docs/transport.md, "Trust model").
The field tables (``DATA_FIELDS``, ``ACK_FIELDS``, ``CTRL_FIELDS``) are the single source from which the structs,
the scapy layer and docs/transport.md are derived.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

MAGIC = 0xFAB1
VERSION = 3

TYPE_DATA = 1
TYPE_ACK = 2
TYPE_CREDIT = 3
TYPE_REQUEST = 4

# DATA flags
FLAG_RETRANSMIT = 0x0001  # this transmission is a retransmission of the PSN
# ACK flags
FLAG_NAK = 0x0001  # go-back-N: the receiver saw a PSN beyond the expected one and discarded it
FLAG_CREDIT = 0x0002  # the credit field is valid: the receiving side grants credit (cc "credit")

PSN_BITS = 32
PSN_MASK = (1 << PSN_BITS) - 1
_PSN_HALF = 1 << (PSN_BITS - 1)
MSG_ID_MASK = 0xFFFFFFFF
TIMESTAMP_MASK = (1 << 64) - 1
SACK_BITS = 64

# (name, struct code, description). The order is the order on the wire; "crc" is always last.
COMMON_FIELDS: list[tuple[str, str, str]] = [
    ("magic", "H", "0xFAB1: identifies a fabriclab transport packet"),
    ("version", "B", "wire format version (3)"),
    ("type", "B", "packet type: 1 = DATA, 2 = ACK, 3 = CREDIT, 4 = REQUEST"),
    ("flags", "H", "DATA: bit 0 = retransmission; ACK: bit 0 = NAK (go-back-N sequence error), "
                   "bit 1 = the credit field is valid"),
    ("ev", "H", "entropy value: DATA = the EV it was sent on; ACK = the EV of the packet that triggered it"),
    ("conn_id", "I", "connection id, chosen by the application, the same at both ends"),
]

DATA_FIELDS: list[tuple[str, str, str]] = [
    *COMMON_FIELDS,
    ("psn", "I", "packet sequence number (serial-number arithmetic, wraps at 2^32)"),
    ("msg_id", "I", "message id, per direction, increasing from 0"),
    ("frag_index", "H", "index of this fragment within its message"),
    ("frag_count", "H", "number of fragments of the message (>= 1)"),
    ("msg_len", "I", "length of the whole message in bytes"),
    ("timestamp", "Q", "sender's clock when this transmission left, in microseconds"),
    ("payload_len", "H", "bytes of payload after the header"),
    ("crc", "I", "CRC32 of the header (without this field) and the payload"),
]

ACK_FIELDS: list[tuple[str, str, str]] = [
    *COMMON_FIELDS,
    ("cum_psn", "I", "cumulative PSN: every PSN before this one has been received"),
    ("sack_base", "I", "PSN of bit 0 of the SACK bitmap"),
    ("sack_bitmap", "Q", "bit i set = PSN sack_base + i has been received"),
    ("ack_psn", "I", "PSN of the DATA packet that triggered this ACK"),
    ("echo_ts", "Q", "timestamp field of the triggering DATA packet, echoed"),
    ("ack_delay", "I", "microseconds the receiver held the ACK before sending it"),
    ("rwnd", "I", "receive window: PSNs beyond cum_psn the sender may have outstanding"),
    ("credit", "I", "with flag bit 1: the receiver's credit, the PSN below which the sender may send new data"),
    ("ecn_ce", "H", "DATA packets this ACK answers that arrived with the ECN CE codepoint"),
    ("owd", "I", "receiver's clock when the echoed DATA packet arrived, less its timestamp, in microseconds "
                 "modulo 2^32: its one-way delay plus the clocks' offset"),
    ("crc", "I", "CRC32 of the ACK (without this field)"),
]

CTRL_FIELDS: list[tuple[str, str, str]] = [
    *COMMON_FIELDS,
    ("limit", "I", "CREDIT: PSN below which the sender may send new data; REQUEST: PSN below which the "
                   "sender has data to send (both cumulative, serial-number arithmetic)"),
    ("crc", "I", "CRC32 of the packet (without this field)"),
]

_COMMON = struct.Struct("!" + "".join(code for _, code, _ in COMMON_FIELDS))


def _common_offset(name: str) -> int:
    off = 0
    for fname, code, _ in COMMON_FIELDS:
        if fname == name:
            return off
        off += struct.calcsize("!" + code)
    raise KeyError(name)


# Fixed offsets in the header every packet starts with: receive loops read the type, EV and connection
# id of each datagram without a full decode (the connection parses the header once more anyway).
TYPE_OFFSET = _common_offset("type")
EV_OFFSET = _common_offset("ev")
CONN_ID_OFFSET = _common_offset("conn_id")
_CONN_ID = struct.Struct("!I")


def read_conn_id(data: bytes) -> int:
    """The connection id of a datagram; raises struct.error if it is too short to hold one."""
    return _CONN_ID.unpack_from(data, CONN_ID_OFFSET)[0]


def read_ev(data: bytes) -> int:
    return data[EV_OFFSET] << 8 | data[EV_OFFSET + 1]


# Every field of each header, CRC included, in table order: for tools that read header fields as
# they are, without the checks parse_data() / parse_ack() make.
DATA_STRUCT = struct.Struct("!" + "".join(code for _, code, _ in DATA_FIELDS))
ACK_STRUCT = struct.Struct("!" + "".join(code for _, code, _ in ACK_FIELDS))
CTRL_STRUCT = struct.Struct("!" + "".join(code for _, code, _ in CTRL_FIELDS))
# Everything but the trailing CRC, which is appended after being computed over these bytes.
_pack_data_head = struct.Struct(DATA_STRUCT.format[:-1]).pack
_pack_ack_head = struct.Struct(ACK_STRUCT.format[:-1]).pack
_pack_ctrl_head = struct.Struct(CTRL_STRUCT.format[:-1]).pack
_pack_crc = struct.Struct("!I").pack
_unpack_data = DATA_STRUCT.unpack_from
_unpack_ack = ACK_STRUCT.unpack_from
_unpack_ctrl = CTRL_STRUCT.unpack_from
_crc32 = zlib.crc32

COMMON_LEN = _COMMON.size
DATA_HEADER_LEN = DATA_STRUCT.size
ACK_LEN = ACK_STRUCT.size
CTRL_LEN = CTRL_STRUCT.size
MAX_PAYLOAD = 0xFFFF
_DATA_CRC_AT = DATA_HEADER_LEN - 4
_ACK_CRC_AT = ACK_LEN - 4
_CTRL_CRC_AT = CTRL_LEN - 4
CTRL_TYPES = (TYPE_CREDIT, TYPE_REQUEST)
# What a receiving side sends, which travels in the control traffic class (contract.CONTROL_DSCP).
CONTROL_CLASS_TYPES = (TYPE_ACK, TYPE_CREDIT)


class WireError(ValueError):
    """A datagram is not a well-formed packet of this protocol."""


def psn_add(psn: int, n: int) -> int:
    """PSN ``n`` steps after ``psn`` (modulo 2^32)."""
    return (psn + n) & PSN_MASK


def psn_diff(a: int, b: int) -> int:
    """Signed distance ``a - b`` in serial-number arithmetic (RFC 1982), in [-2^31, 2^31)."""
    return ((a - b + _PSN_HALF) & PSN_MASK) - _PSN_HALF


def psn_lt(a: int, b: int) -> bool:
    return psn_diff(a, b) < 0


def psn_le(a: int, b: int) -> bool:
    return psn_diff(a, b) <= 0


def psn_gt(a: int, b: int) -> bool:
    return psn_diff(a, b) > 0


def psn_ge(a: int, b: int) -> bool:
    return psn_diff(a, b) >= 0


def to_timestamp(now: float) -> int:
    """Seconds to the on-wire microsecond timestamp."""
    return round(now * 1e6) & TIMESTAMP_MASK


@dataclass(slots=True)
class DataPacket:
    conn_id: int
    psn: int
    msg_id: int
    frag_index: int
    frag_count: int
    msg_len: int
    timestamp: int
    ev: int
    payload: bytes = b""
    flags: int = 0


@dataclass(slots=True)
class AckPacket:
    conn_id: int
    cum_psn: int
    sack_base: int
    sack_bitmap: int
    ack_psn: int
    echo_ts: int
    ev: int
    rwnd: int
    ack_delay: int = 0
    flags: int = 0
    credit: int = 0
    ecn_ce: int = 0
    owd: int = 0

    def sacked(self) -> list[int]:
        """PSNs marked received in the bitmap."""
        out = []
        bits = self.sack_bitmap
        i = 0
        while bits:
            if bits & 1:
                out.append((self.sack_base + i) & PSN_MASK)
            bits >>= 1
            i += 1
        return out


@dataclass(slots=True)
class CtrlPacket:
    """CREDIT or REQUEST: one cumulative PSN limit (see CTRL_FIELDS)."""

    ptype: int
    conn_id: int
    limit: int
    ev: int = 0
    flags: int = 0


# The connection's hot path packs and parses with the four functions below, which build no packet
# objects; encode() and decode() wrap them for everyone else, so there is one packer and one parser.


def pack_data(
    flags: int, ev: int, conn_id: int, psn: int, msg_id: int, frag_index: int, frag_count: int, msg_len: int,
    timestamp: int, payload: bytes,
) -> bytes:
    """A DATA datagram; raises struct.error if a field does not fit its width."""
    head = _pack_data_head(
        MAGIC, VERSION, TYPE_DATA, flags, ev, conn_id, psn, msg_id, frag_index, frag_count, msg_len, timestamp,
        len(payload),
    )
    return head + _pack_crc(_crc32(payload, _crc32(head))) + payload


def pack_ack(
    flags: int, ev: int, conn_id: int, cum_psn: int, sack_base: int, sack_bitmap: int, ack_psn: int, echo_ts: int,
    ack_delay: int, rwnd: int, credit: int = 0, ecn_ce: int = 0, owd: int = 0,
) -> bytes:
    """An ACK datagram; raises struct.error if a field does not fit its width."""
    head = _pack_ack_head(
        MAGIC, VERSION, TYPE_ACK, flags, ev, conn_id, cum_psn, sack_base, sack_bitmap, ack_psn, echo_ts, ack_delay,
        rwnd, credit, ecn_ce, owd,
    )
    return head + _pack_crc(_crc32(head))


def pack_ctrl(ptype: int, flags: int, ev: int, conn_id: int, limit: int) -> bytes:
    """A CREDIT or REQUEST datagram; raises struct.error if a field does not fit its width."""
    head = _pack_ctrl_head(MAGIC, VERSION, ptype, flags, ev, conn_id, limit)
    return head + _pack_crc(_crc32(head))


def parse_data(data: bytes) -> tuple[int, int, int, int, int, int, int, int, bytes, int]:
    """The fields of a DATA datagram in DataPacket's order (conn_id, psn, msg_id, frag_index,
    frag_count, msg_len, timestamp, ev, payload, flags), validated; raises WireError naming the problem."""
    n = len(data)
    if n >= DATA_HEADER_LEN:
        (magic, version, ptype, flags, ev, cid, psn, msg_id, idx, count, msg_len, ts, plen,
         crc) = _unpack_data(data)
        payload = bytes(data[DATA_HEADER_LEN:])
        if (
            magic == MAGIC
            and version == VERSION
            and ptype == TYPE_DATA
            and plen == n - DATA_HEADER_LEN
            and _crc32(payload, _crc32(data[:_DATA_CRC_AT])) == crc
            and idx < count
            and plen <= msg_len
        ):
            return cid, psn, msg_id, idx, count, msg_len, ts, ev, payload, flags
    raise WireError(why_malformed(data))


def parse_ack(data: bytes) -> tuple[int, int, int, int, int, int, int, int, int, int, int, int, int]:
    """The fields of an ACK datagram in AckPacket's order (conn_id, cum_psn, sack_base, sack_bitmap,
    ack_psn, echo_ts, ev, rwnd, ack_delay, flags, credit, ecn_ce, owd), validated; raises WireError
    naming the problem."""
    if len(data) == ACK_LEN:
        (magic, version, ptype, flags, ev, cid, cum, base, bitmap, ack_psn, echo, delay, rwnd, credit, ce, owd,
         crc) = _unpack_ack(data)
        if magic == MAGIC and version == VERSION and ptype == TYPE_ACK and _crc32(data[:_ACK_CRC_AT]) == crc:
            return cid, cum, base, bitmap, ack_psn, echo, ev, rwnd, delay, flags, credit, ce, owd
    raise WireError(why_malformed(data))


def parse_ctrl(data: bytes) -> tuple[int, int, int, int, int]:
    """The fields of a CREDIT or REQUEST datagram in CtrlPacket's order (ptype, conn_id, limit, ev,
    flags), validated; raises WireError naming the problem."""
    if len(data) == CTRL_LEN:
        magic, version, ptype, flags, ev, cid, limit, crc = _unpack_ctrl(data)
        if (magic == MAGIC and version == VERSION and (ptype in (TYPE_CREDIT, TYPE_REQUEST))
                and _crc32(data[:_CTRL_CRC_AT]) == crc):
            return ptype, cid, limit, ev, flags
    raise WireError(why_malformed(data))


def why_malformed(data: bytes) -> str:
    """What is wrong with a datagram the parsers rejected: the first failed check, in wire order."""
    if len(data) < COMMON_LEN:
        return f"datagram of {len(data)} bytes is shorter than the {COMMON_LEN}-byte prefix"
    magic, version, ptype, _flags, _ev, _cid = _COMMON.unpack_from(data)
    if magic != MAGIC:
        return f"bad magic 0x{magic:04x}"
    if version != VERSION:
        return f"unsupported version {version}"
    if ptype == TYPE_DATA:
        if len(data) < DATA_HEADER_LEN:
            return f"DATA of {len(data)} bytes is shorter than its {DATA_HEADER_LEN}-byte header"
        *_, frag_index, frag_count, msg_len, _ts, plen, crc = _unpack_data(data)
        payload = data[DATA_HEADER_LEN:]
        if plen != len(payload):
            return f"payload_len {plen} but {len(payload)} bytes follow the header"
        if _crc32(payload, _crc32(data[:_DATA_CRC_AT])) != crc:
            return "CRC mismatch"
        if frag_count == 0 or frag_index >= frag_count:
            return f"fragment {frag_index} of {frag_count}"
        return f"payload of {plen} bytes in a message of {msg_len} bytes"
    if ptype == TYPE_ACK:
        if len(data) != ACK_LEN:
            return f"ACK of {len(data)} bytes, expected {ACK_LEN}"
        return "CRC mismatch"
    if ptype in CTRL_TYPES:
        if len(data) != CTRL_LEN:
            return f"{'CREDIT' if ptype == TYPE_CREDIT else 'REQUEST'} of {len(data)} bytes, expected {CTRL_LEN}"
        return "CRC mismatch"
    return f"unknown packet type {ptype}"


def encode(pkt: DataPacket | AckPacket | CtrlPacket) -> bytes:
    """Serialise a packet; raises WireError if a field does not fit its width."""
    try:
        if isinstance(pkt, DataPacket):
            return pack_data(
                pkt.flags, pkt.ev, pkt.conn_id, pkt.psn, pkt.msg_id, pkt.frag_index, pkt.frag_count, pkt.msg_len,
                pkt.timestamp, pkt.payload,
            )
        if isinstance(pkt, AckPacket):
            return pack_ack(
                pkt.flags, pkt.ev, pkt.conn_id, pkt.cum_psn, pkt.sack_base, pkt.sack_bitmap, pkt.ack_psn,
                pkt.echo_ts, pkt.ack_delay, pkt.rwnd, pkt.credit, pkt.ecn_ce, pkt.owd,
            )
        if isinstance(pkt, CtrlPacket):
            if pkt.ptype not in CTRL_TYPES:
                raise WireError(f"CtrlPacket of type {pkt.ptype}: use TYPE_CREDIT or TYPE_REQUEST")
            return pack_ctrl(pkt.ptype, pkt.flags, pkt.ev, pkt.conn_id, pkt.limit)
    except struct.error as exc:
        raise WireError(f"field out of range: {exc}") from exc
    raise WireError(f"cannot encode {type(pkt).__name__}")


def decode(data: bytes) -> DataPacket | AckPacket | CtrlPacket:
    """Parse and validate one datagram; raises WireError on anything malformed or corrupted."""
    ptype = data[TYPE_OFFSET] if len(data) > TYPE_OFFSET else 0
    if ptype == TYPE_DATA:
        return DataPacket(*parse_data(data))
    if ptype == TYPE_ACK:
        return AckPacket(*parse_ack(data))
    if ptype in CTRL_TYPES:
        return CtrlPacket(*parse_ctrl(data))
    raise WireError(why_malformed(data))
