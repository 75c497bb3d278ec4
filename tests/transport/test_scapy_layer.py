"""The scapy layers: dissecting wire.encode output, crafting packets wire.decode accepts, rejections."""

from __future__ import annotations

import pytest

pytest.importorskip("scapy")

from scapy.layers.inet import IP, UDP
from scapy.packet import Raw
from scapy.utils import rdpcap, wrpcap

from transport.core import wire
from transport.io.endpoint import DEFAULT_PORT
from transport.scapy_layer import SRDAck, SRDData, dissect, udp_datagrams

DATA = wire.DataPacket(conn_id=0xDEADBEEF, psn=41, msg_id=7, frag_index=2, frag_count=5, msg_len=6000,
                       timestamp=123456789, ev=13, payload=b"fragment bytes", flags=wire.FLAG_RETRANSMIT)
ACK = wire.AckPacket(conn_id=0xDEADBEEF, cum_psn=40, sack_base=42, sack_bitmap=0b1011, ack_psn=41,
                     echo_ts=123456789, ev=13, rwnd=900, ack_delay=17, flags=0)


def test_fields_follow_the_wire_tables() -> None:
    assert [f.name for f in SRDData.fields_desc] == [n for n, _, _ in wire.DATA_FIELDS]
    assert [f.name for f in SRDAck.fields_desc] == [n for n, _, _ in wire.ACK_FIELDS]
    assert len(SRDData()) == wire.DATA_HEADER_LEN
    assert len(SRDAck()) == wire.ACK_LEN


def test_encoded_data_dissects() -> None:
    p = dissect(wire.encode(DATA))
    assert isinstance(p, SRDData)
    assert p.magic == wire.MAGIC and p.version == wire.VERSION and p.type == wire.TYPE_DATA
    for name in ("conn_id", "psn", "msg_id", "frag_index", "frag_count", "msg_len", "timestamp", "ev", "flags"):
        assert int(getattr(p, name)) == getattr(DATA, name), name
    assert p.payload_len == len(DATA.payload)
    assert p[Raw].load == DATA.payload


def test_encoded_ack_dissects_as_ack() -> None:
    p = dissect(wire.encode(ACK))
    assert isinstance(p, SRDAck)
    for name in ("conn_id", "cum_psn", "sack_base", "sack_bitmap", "ack_psn", "echo_ts", "ev", "rwnd",
                 "ack_delay"):
        assert int(getattr(p, name)) == getattr(ACK, name), name


def test_udp_port_binding_dissects_both_directions() -> None:
    data = IP(bytes(IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=40013, dport=DEFAULT_PORT)
                    / Raw(wire.encode(DATA))))
    assert data.haslayer(SRDData) and data[SRDData].psn == 41
    ack = IP(bytes(IP(src="10.0.0.2", dst="10.0.0.1") / UDP(sport=DEFAULT_PORT, dport=40013)
                   / Raw(wire.encode(ACK))))
    assert ack.haslayer(SRDAck) and ack[SRDAck].cum_psn == 40
    assert "SRD ACK" in ack.summary()


def test_crafted_packets_decode() -> None:
    pkt = IP(dst="10.0.0.2") / UDP(sport=40003) / SRDData(conn_id=9, psn=5, msg_id=1, ev=3) / b"hello"
    assert pkt[UDP].dport == DEFAULT_PORT  # the binding fills in the transport's port
    decoded = wire.decode(bytes(pkt[SRDData]))
    assert isinstance(decoded, wire.DataPacket)
    assert (decoded.conn_id, decoded.psn, decoded.msg_id, decoded.ev, decoded.payload) == (9, 5, 1, 3, b"hello")
    assert decoded.msg_len == 5 and decoded.frag_count == 1
    ack = UDP(dport=40003) / SRDAck(conn_id=9, cum_psn=6, ack_psn=5, rwnd=64)
    assert ack.sport == DEFAULT_PORT
    a = wire.decode(bytes(ack[SRDAck]))
    assert isinstance(a, wire.AckPacket) and (a.cum_psn, a.ack_psn, a.rwnd) == (6, 5, 64)
    # Round trip: encode -> scapy -> bytes is the identity.
    assert bytes(dissect(wire.encode(DATA))) == wire.encode(DATA)
    assert bytes(dissect(wire.encode(ACK))) == wire.encode(ACK)


@pytest.mark.parametrize(
    "mutate",
    [
        {"magic": 0xBEEF},
        {"version": wire.VERSION - 1},
        {"type": 9},
        {"crc": 0x12345678},
        {"payload_len": 4},
        {"frag_index": 3, "frag_count": 2},
        {"frag_count": 0},
        {"msg_len": 2},
    ],
    ids=lambda m: ",".join(m),
)
def test_mutated_data_is_rejected(mutate: dict[str, int]) -> None:
    # The CRC is recomputed (left None) unless the mutation is the CRC itself, so each case tests
    # the check for that field rather than the checksum.
    pkt = SRDData(conn_id=9, psn=5, **mutate) / b"hello"
    with pytest.raises(wire.WireError):
        wire.decode(bytes(pkt))


def test_mutated_ack_and_truncation_rejected() -> None:
    for pkt in (SRDAck(conn_id=1, crc=1), SRDAck(conn_id=1, magic=0), SRDAck(conn_id=1, version=0)):
        with pytest.raises(wire.WireError):
            wire.decode(bytes(pkt))
    raw = bytes(SRDData(conn_id=1) / b"abc")
    for cut in (1, 5, wire.DATA_HEADER_LEN - 1, len(raw) - 1):
        with pytest.raises(wire.WireError):
            wire.decode(raw[:cut])
    flipped = bytearray(raw)
    flipped[-1] ^= 0x01  # payload bit flip: CRC mismatch
    with pytest.raises(wire.WireError, match="CRC"):
        wire.decode(bytes(flipped))


def test_pcap_round_trip(tmp_path) -> None:
    pkts = [
        IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=40000 + i, dport=DEFAULT_PORT) / Raw(wire.encode(DATA))
        for i in range(3)
    ] + [IP(src="10.0.0.2", dst="10.0.0.1") / UDP(sport=DEFAULT_PORT, dport=40001) / Raw(wire.encode(ACK))]
    path = tmp_path / "srd.pcap"
    wrpcap(str(path), pkts)
    back = rdpcap(str(path))
    grams = udp_datagrams(back)
    assert len(grams) == 4
    assert [type(wire.decode(g)).__name__ for g in grams] == ["DataPacket"] * 3 + ["AckPacket"]
