"""Wire format: round trips, CRC, malformed input and serial-number arithmetic."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transport.core import wire
from transport.core.wire import (
    ACK_FIELDS,
    ACK_LEN,
    DATA_FIELDS,
    DATA_HEADER_LEN,
    MAGIC,
    VERSION,
    AckPacket,
    DataPacket,
    WireError,
    decode,
    encode,
    psn_add,
    psn_diff,
    psn_ge,
    psn_gt,
    psn_le,
    psn_lt,
)

u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, 2**64 - 1)


@st.composite
def data_packets(draw) -> DataPacket:
    payload = draw(st.binary(max_size=300))
    count = draw(st.integers(1, 0xFFFF))
    return DataPacket(
        conn_id=draw(u32), psn=draw(u32), msg_id=draw(u32), frag_index=draw(st.integers(0, count - 1)),
        frag_count=count, msg_len=draw(st.integers(len(payload), 0xFFFFFFFF)), timestamp=draw(u64),
        ev=draw(u16), payload=payload, flags=draw(u16),
    )


@st.composite
def ack_packets(draw) -> AckPacket:
    return AckPacket(
        conn_id=draw(u32), cum_psn=draw(u32), sack_base=draw(u32), sack_bitmap=draw(u64), ack_psn=draw(u32),
        echo_ts=draw(u64), ev=draw(u16), rwnd=draw(u32), ack_delay=draw(u32), flags=draw(u16),
        credit=draw(u32), ecn_ce=draw(u16), owd=draw(u32),
    )


@st.composite
def ctrl_packets(draw) -> wire.CtrlPacket:
    return wire.CtrlPacket(ptype=draw(st.sampled_from(wire.CTRL_TYPES)), conn_id=draw(u32), limit=draw(u32),
                           ev=draw(u16), flags=draw(u16))


def test_header_sizes_match_field_tables() -> None:
    assert DATA_HEADER_LEN == struct.calcsize("!" + "".join(c for _, c, _ in DATA_FIELDS)) == 42
    assert ACK_LEN == struct.calcsize("!" + "".join(c for _, c, _ in ACK_FIELDS)) == 62
    assert wire.CTRL_LEN == struct.calcsize("!" + "".join(c for _, c, _ in wire.CTRL_FIELDS)) == 20
    for fields in (DATA_FIELDS, ACK_FIELDS, wire.CTRL_FIELDS):
        names = [n for n, _, _ in fields]
        assert len(names) == len(set(names))
        assert names[0] == "magic" and names[-1] == "crc"
        assert all(desc for _, _, desc in fields)


@given(data_packets())
def test_data_roundtrip(pkt: DataPacket) -> None:
    raw = encode(pkt)
    assert len(raw) == DATA_HEADER_LEN + len(pkt.payload)
    assert raw[:2] == MAGIC.to_bytes(2, "big") and raw[2] == VERSION and raw[3] == wire.TYPE_DATA
    assert decode(raw) == pkt


@given(ack_packets())
def test_ack_roundtrip(pkt: AckPacket) -> None:
    raw = encode(pkt)
    assert len(raw) == ACK_LEN
    assert decode(raw) == pkt


@given(ctrl_packets())
def test_credit_and_request_roundtrip(pkt: wire.CtrlPacket) -> None:
    raw = encode(pkt)
    assert len(raw) == wire.CTRL_LEN and raw[3] == pkt.ptype
    assert decode(raw) == pkt


def test_ctrl_of_unknown_type_or_wrong_length_is_rejected() -> None:
    with pytest.raises(WireError, match="TYPE_CREDIT"):
        encode(wire.CtrlPacket(ptype=wire.TYPE_ACK, conn_id=1, limit=2))
    raw = encode(wire.CtrlPacket(ptype=wire.TYPE_CREDIT, conn_id=1, limit=2))
    with pytest.raises(WireError, match="CREDIT of 21 bytes"):
        decode(raw + b"\0")
    with pytest.raises(WireError, match="version"):
        decode(raw[:2] + bytes([1]) + raw[3:])  # version 1 had no CREDIT


@settings(max_examples=50)
@given(st.one_of(data_packets(), ack_packets(), ctrl_packets()), st.data())
def test_any_single_bit_flip_is_detected(pkt: DataPacket | AckPacket, data: st.DataObject) -> None:
    raw = bytearray(encode(pkt))
    bit = data.draw(st.integers(0, len(raw) * 8 - 1))
    raw[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(WireError):
        decode(bytes(raw))


@settings(max_examples=50)
@given(st.one_of(data_packets(), ack_packets(), ctrl_packets()), st.data())
def test_truncation_is_detected(pkt: DataPacket | AckPacket | wire.CtrlPacket, data: st.DataObject) -> None:
    raw = encode(pkt)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(WireError):
        decode(raw[:cut])


@given(st.binary(max_size=200))
def test_random_bytes_raise_only_wire_error(raw: bytes) -> None:
    try:
        decode(raw)
    except WireError:
        pass


def _resealed_data(**fields) -> bytes:
    """A DATA packet with arbitrary header values and a correct CRC."""
    values = {"magic": MAGIC, "version": VERSION, "type": wire.TYPE_DATA, "flags": 0, "ev": 0, "conn_id": 1,
              "psn": 0, "msg_id": 0, "frag_index": 0, "frag_count": 1, "msg_len": 3, "timestamp": 0,
              "payload_len": 3}
    values.update(fields)
    payload = fields.pop("payload", b"abc")
    head = struct.pack("!" + "".join(c for n, c, _ in DATA_FIELDS if n != "crc"),
                       *(values[n] for n, _, _ in DATA_FIELDS if n != "crc"))
    import zlib

    return head + zlib.crc32(payload, zlib.crc32(head)).to_bytes(4, "big") + payload


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"magic": 0x1234}, "magic"),
        ({"version": 9}, "version"),
        ({"type": 7}, "type"),
        ({"frag_index": 1, "frag_count": 1}, "fragment"),
        ({"frag_count": 0}, "fragment"),
        ({"payload_len": 2}, "payload_len"),
        ({"msg_len": 2}, "message of 2"),
    ],
)
def test_valid_crc_with_bad_fields_is_rejected(fields: dict, message: str) -> None:
    assert isinstance(decode(_resealed_data()), DataPacket)
    with pytest.raises(WireError, match=message):
        decode(_resealed_data(**fields))


def test_ack_of_wrong_length_is_rejected() -> None:
    raw = encode(AckPacket(1, 2, 3, 4, 5, 6, 7, 8))
    with pytest.raises(WireError):
        decode(raw + b"\0")


def test_encode_rejects_out_of_range_fields() -> None:
    with pytest.raises(WireError):
        encode(DataPacket(2**32, 0, 0, 0, 1, 0, 0, 0))
    with pytest.raises(WireError):
        encode(AckPacket(0, 0, 0, 2**64, 0, 0, 0, 0))


def test_wire_error_is_a_value_error() -> None:
    assert issubclass(WireError, ValueError)


def test_sacked_lists_bits_with_wraparound() -> None:
    ack = AckPacket(0, 0, 2**32 - 2, 0b1011, 0, 0, 0, 0)
    assert ack.sacked() == [2**32 - 2, 2**32 - 1, 1]


def test_serial_number_arithmetic_wraps() -> None:
    top = 2**32 - 1
    assert psn_add(top, 1) == 0
    assert psn_diff(0, top) == 1
    assert psn_diff(top, 0) == -1
    assert psn_lt(top, 0) and psn_le(top, 0) and psn_gt(0, top) and psn_ge(0, top)
    assert psn_le(5, 5) and psn_ge(5, 5) and not psn_lt(5, 5)
    assert psn_diff(2**31 - 1, 0) == 2**31 - 1
    assert psn_diff(2**31, 0) == -(2**31)


@given(u32, st.integers(-(2**31), 2**31 - 1))
def test_psn_diff_inverts_psn_add(a: int, n: int) -> None:
    assert psn_diff(psn_add(a, n), a) == n


def test_docs_tables_match_the_field_tables() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "transport.md").read_text()
    for fields in (DATA_FIELDS, ACK_FIELDS, wire.CTRL_FIELDS):
        for name, code, desc in fields:
            assert f"| `{name}` | {struct.calcsize('!' + code) * 8} | {desc} |" in doc


def test_fixed_offsets_read_what_decode_reads() -> None:
    data = wire.encode(wire.DataPacket(conn_id=0xDEADBEEF, psn=7, msg_id=1, frag_index=0, frag_count=1,
                                       msg_len=3, timestamp=5, ev=513, payload=b"abc"))
    assert wire.read_conn_id(data) == wire.decode(data).conn_id == 0xDEADBEEF
    assert wire.read_ev(data) == 513
    assert data[wire.TYPE_OFFSET] == wire.TYPE_DATA
