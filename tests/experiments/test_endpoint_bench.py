"""`fabriclab bench endpoints`: the shaped link between the two endpoint processes, one real run on
127.0.0.1, and the report."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from experiments import endpoint_bench as eb


def test_a_direction_paces_at_its_rate_and_drops_beyond_its_queue() -> None:
    d = eb.Direction(rate_bps=8e6, delay_s=0.001, queue_packets=3)
    for _ in range(5):
        d.offer(bytes(958), None, 0.0)  # 1000 bytes on the wire each: 1 ms at 8 Mb/s
    assert d.dropped == 2
    assert [round(t, 6) for t, _, _ in d.waiting] == [0.002, 0.003, 0.004]


def test_one_run_over_loopback_counts_packets_and_cpu() -> None:
    r = eb.run_case(1500, rate_mbps=20.0, seconds=1.0, delay_s=0.0002)
    assert r.completed and r.link_drops == 0
    assert r.data_delivered > 1000 and 0 < r.acks_delivered < r.data_delivered
    # The link serializes every DATA datagram at 20 Mb/s, framing counted, and the transfer ends with the
    # last one's ACK: goodput (application bytes, fewer than the datagrams') cannot exceed the link's
    # payload rate (19.4 Mb/s; ~18.8 measured, the transport's headers). Below it only by stalls of the
    # endpoints or of the relay in this process: a ~0.9 s transfer, so the floor allows ~2 s of them.
    wire_payload_mbps = 20.0 * 1472 / (1472 + eb.FRAME_OVERHEAD)
    assert 0.3 * wire_payload_mbps <= r.goodput_mbps <= 1.01 * wire_payload_mbps, r
    for side in (r.sender, r.receiver):
        assert side.cpu_run_s is not None and side.cpu_run_s > 0
        assert side.us_per_packet == pytest.approx(side.cpu_run_s / (r.data_delivered + r.acks_delivered) * 1e6,
                                                   rel=0.01)
        assert side.cpu_process_s is not None and side.cpu_process_s >= side.cpu_run_s
        assert side.kernel_share is not None and 0.0 <= side.kernel_share <= 1.0
    assert r.endpoints_us_per_packet == pytest.approx(r.sender.us_per_packet + r.receiver.us_per_packet, abs=0.2)
    # The bare loops ran after it at its pace, answering as often as its receiver did.
    f = r.floor
    assert f is not None and f.ack_every == max(1, round(r.data_delivered / r.acks_delivered))
    assert f.gap_s == pytest.approx(r.seconds / r.data_delivered, rel=0.01)
    assert f.data_delivered > 0 and f.us_per_packet is not None and f.us_per_packet > 0
    text = eb.text_report({"target_us_per_packet": eb.TARGET_US_PER_PACKET, "cases": [eb.asdict(r)]})
    assert f"| {r.sender.us_per_packet:.1f} | {r.receiver.us_per_packet:.1f} |" in text
    assert f"| {f.us_per_packet:.1f} | {r.endpoints_us_per_packet / f.us_per_packet:.1f}x |" in text
    assert "bare loops at the endpoints' pace" in text
    core = r.core_receive_us
    assert core is not None and core["back_to_back"] > 0 and core["after_gap"] > 0
    assert f"costs {core['back_to_back']:.1f} µs back to back and {core['after_gap']:.1f} after" in text


def test_the_bare_loops_send_count_datagrams_and_answer_every_kth() -> None:
    f = eb.run_floor(1472, rate_mbps=20.0, delay_s=0.0002, gap_s=0.002, ack_every=3, seconds=0.5)
    assert f.data_delivered == 250  # every one across the link, the end markers not counted
    assert f.acks_delivered == 84  # every third, and one for the last two
    assert f.sender_us_per_packet and f.receiver_us_per_packet
    assert f.us_per_packet == pytest.approx(f.sender_us_per_packet + f.receiver_us_per_packet, abs=0.2)


def test_a_case_without_acks_reports_no_floor() -> None:
    row = {"mtu": 1500, "rate_mbps": 4.0, "goodput_mbps": 0.0, "data_delivered": 0, "acks_delivered": 0,
           "sender": {"us_per_packet": None, "process_us_per_packet": None},
           "receiver": {"us_per_packet": None, "process_us_per_packet": None},
           "endpoints_us_per_packet": None, "endpoints_us_per_data_packet": None, "floor": None}
    text = eb.text_report({"target_us_per_packet": eb.TARGET_US_PER_PACKET, "cases": [row]})
    assert text.splitlines()[-1].endswith("| - | - |") and "bare loops at" not in text


def test_the_median_run_is_reported() -> None:
    runs = [{"endpoints_us_per_packet": v} for v in (50.0, None, 20.0, 30.0)]
    assert eb.median_run(runs)["endpoints_us_per_packet"] == 30.0
    assert eb.median_run(runs[:1]) is runs[0]


def test_bench_endpoints_rejects_bad_options_in_one_line() -> None:
    out = subprocess.run([sys.executable, "-m", "cli", "bench", "endpoints", "--mtu", "1500,70000"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "--mtu" in out.stderr and "Traceback" not in out.stderr


def test_the_link_relays_both_ways_and_keeps_the_senders_ports_apart() -> None:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    link = eb.ShapedLink(rx.getsockname(), rate_bps=100e6, delay_s=0.0)
    senders = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
    try:
        for i, s in enumerate(senders):
            s.bind(("127.0.0.1", 0))
            s.sendto(b"data%d" % i, link.address)
        seen: dict[bytes, tuple] = {}
        deadline = time.monotonic() + 2.0

        def until() -> bool:
            rx.setblocking(False)
            try:
                data, addr = rx.recvfrom(100)
                seen[data] = addr
                rx.sendto(b"ack-" + data, addr)
            except BlockingIOError:
                pass
            return (len(seen) == 2 and link.reverse.delivered == 2) or time.monotonic() > deadline

        link.run(until)
        assert set(seen) == {b"data0", b"data1"}
        assert seen[b"data0"] != seen[b"data1"]  # one port toward the receiver per sender port
        for i, s in enumerate(senders):
            s.settimeout(1.0)
            assert s.recv(100) == b"ack-data%d" % i
    finally:
        link.close()
        rx.close()
        for s in senders:
            s.close()


def test_the_core_receive_path_is_timed_on_real_data_packets() -> None:
    from experiments import idle_penalty
    from transport.core import wire

    datagrams = idle_penalty.data_datagrams(1472, 30)
    assert len(datagrams) == 30 and all(len(d) <= 1472 for d in datagrams)
    assert {wire.decode(d).psn for d in datagrams} == set(range(30))  # first transmissions, in order
    # Every one is taken and acknowledged (it raises otherwise): the figure is of the path that ran.
    assert idle_penalty.receive_path_us(datagrams, 0.0) > 0
    assert idle_penalty.receive_path_us(datagrams[:12], 0.001) > 0
    with pytest.raises(RuntimeError, match="not received"):
        idle_penalty.receive_path_us([*datagrams[:12], b"garbage"], 0.0)


def test_a_probe_at_a_slow_pace_sleeps_a_bounded_time(monkeypatch) -> None:
    from experiments import idle_penalty

    slept: list[float] = []
    monkeypatch.setattr(idle_penalty.time, "sleep", slept.append)
    core = idle_penalty.probe(1472, gap_s=0.5)  # 100 packets would sleep 50 s
    assert core["gap_s"] == 0.5 and core["back_to_back"] > 0 and core["after_gap"] > 0
    assert slept == [0.5] * idle_penalty.MIN_PACKETS  # the warm-up's datagrams come back to back
    slept.clear()
    idle_penalty.probe(1472, gap_s=0.02)
    assert slept == [0.02] * idle_penalty.PACKETS  # 2 s: within MAX_SLEEP_S
