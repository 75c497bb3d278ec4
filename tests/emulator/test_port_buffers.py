"""The switch port buffer rules (emulator/port_buffers.py) without a fabric: sizes, the priming frame,
reading a process's packet sockets."""

from __future__ import annotations

import os

from emulator import port_buffers as pb


def test_a_buffer_holds_every_port_queue_full_of_frames():
    one = pb.buffer_bytes(1000, 9000, 1)
    assert one >= 1000 * 9000
    assert pb.buffer_bytes(1000, 9000, 4) == 4 * one
    assert pb.buffer_bytes(1, 1500) == 1 << 20  # never below the floor
    assert pb.buffer_bytes(10**6, 9000, 64) == 1 << 30  # nor above the ceiling


def test_the_priming_frame_is_a_minimal_lldp_frame_sent_out_of_one_port():
    frame = bytes.fromhex(pb.PRIMING_FRAME)
    assert len(frame) == 60 and frame[:6] == bytes.fromhex("0180c200000e") and frame[12:14] == b"\x88\xcc"
    cmd = pb.priming_command("unix:/run/x/leaf1.mgmt", 3)
    assert cmd[:3] == ["ovs-ofctl", "-O", "OpenFlow13"] and cmd[-2] == "unix:/run/x/leaf1.mgmt"
    assert cmd[-1].endswith("actions=output:3")


def test_a_process_without_packet_sockets_has_none_to_enlarge():
    assert pb.packet_sockets(os.getpid()) == []
    assert pb.enlarge([os.getpid()], 1 << 20) == 0
    assert pb.packet_sockets(2**22 + 7) == []  # no such process
