"""The UDP endpoints over real loopback sockets: delivery, workloads, EV source ports, shutdown."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from transport.core.config import TransportConfig
from transport.io.endpoint import (
    EndpointError,
    Receiver,
    Sender,
    Workload,
    check_payload,
    make_payload,
    payload_seq,
)

ROOT = Path(__file__).resolve().parents[2]
FABRICLAB = [sys.executable, "-m", "cli"]


class ReceiverThread:
    """A Receiver on 127.0.0.1:<ephemeral> running in a thread, collecting what it delivers."""

    def __init__(self, config: TransportConfig, **kwargs: Any) -> None:
        self.messages: list[tuple[int, int, bytes]] = []
        self.receiver = Receiver(config, bind="127.0.0.1", port=0,
                                 on_message=lambda c, m, d: self.messages.append((c, m, d)), **kwargs)
        self.receiver.open()
        self.port = self.receiver.address[1]
        self.metrics: dict[str, Any] = {}
        self.thread = threading.Thread(target=lambda: self.metrics.update(self.receiver.run()), daemon=True)

    def __enter__(self) -> ReceiverThread:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.receiver.stop("test done")
        self.thread.join(10)
        assert not self.thread.is_alive()


def test_payload_helpers() -> None:
    for seq, size in [(0, 1), (5, 8), (7, 9), (300, 4000), (2**40, 65536)]:
        data = make_payload(seq, size)
        assert len(data) == size
        if size >= 8:
            assert payload_seq(data) == seq
            assert check_payload(data)
    assert not check_payload(make_payload(3, 100)[:-1] + b"\x00")


@pytest.mark.parametrize("delivery", ["unordered", "ordered"])
def test_loopback_2mb_exactly_once(delivery: str, tmp_path: Path) -> None:
    config = TransportConfig(delivery=delivery)
    total, size = 2 << 20, 50_000
    with ReceiverThread(config, expect_bytes=total, verify=True, linger=0.2) as rt:
        sender = Sender(config, "127.0.0.1", rt.port, Workload(total_bytes=total, size=size),
                        bind="127.0.0.1", base_port=0, duration=30)
        metrics = sender.run()
        rt.thread.join(10)
    assert metrics["completed"], metrics["stop_reason"]
    assert metrics["bytes"] == total
    n = -(-total // size)
    assert metrics["messages"] == n
    seqs = sorted(payload_seq(d) for _, _, d in rt.messages)
    assert seqs == list(range(n)), "every message exactly once"
    for _, _, data in rt.messages:
        expected_size = size if payload_seq(data) < n - 1 else total - size * (n - 1)
        assert data == make_payload(payload_seq(data), expected_size)
    if delivery == "ordered":
        assert [payload_seq(d) for _, _, d in rt.messages] == list(range(n))
    rm = rt.metrics
    assert rm["bytes"] == total and rm["messages"] == n
    assert rm["connections"][0]["corrupt_messages"] == 0
    assert rm["connections"][0]["duplicate_messages"] == 0
    assert rm["stop_reason"] == "expected bytes received"
    # Metrics are JSON: written, read back, the connection's own metrics included.
    from transport.io.endpoint import write_json

    out = tmp_path / "m.json"
    write_json(metrics, str(out))
    back = json.loads(out.read_text())
    assert back["role"] == "sender" and back["connection"]["sender"]["packets_sent"] > 0
    assert back["completion_times"]["count"] == n
    assert sum(back["ev_datagrams_sent"]) == back["datagrams_sent"]
    json.dumps(rm)


def test_ev_is_the_source_port() -> None:
    """With a base port that is a multiple of 16, source port & 0xF is the EV of each datagram."""
    config = TransportConfig(num_evs=16, path_policy="spray")
    rng = random.Random(os.getpid())
    for _ in range(20):
        base = rng.randrange(20000, 60000) & ~0xF
        try:
            with ReceiverThread(config, expect_bytes=1 << 20, linger=0.1) as rt:
                sender = Sender(config, "127.0.0.1", rt.port, Workload(total_bytes=1 << 20),
                                bind="127.0.0.1", base_port=base, duration=20)
                metrics = sender.run()
                rt.thread.join(10)
            break
        except EndpointError as exc:
            if "in use" not in str(exc):
                raise
    else:
        pytest.skip("no free block of 16 ports")
    assert metrics["completed"]
    ports = metrics["source_ports"]
    assert ports == [base + ev for ev in range(16)]
    assert all(p % 16 == ev for ev, p in enumerate(ports))
    seen = {int(p): n for p, n in rt.metrics["connections"][0]["source_port_datagrams"].items()}
    assert set(seen) <= set(ports)
    # The receiver saw, per source port, exactly what the sender sent on that EV.
    for ev, port in enumerate(ports):
        assert seen.get(port, 0) == metrics["ev_datagrams_sent"][ev]
    # Spraying used many EVs, and ACKs came back to the sockets the data left from.
    assert sum(1 for n in metrics["ev_datagrams_sent"] if n) >= 8
    assert sum(metrics["ev_datagrams_received"]) == metrics["datagrams_received"]
    assert sum(1 for n in metrics["ev_datagrams_received"] if n) >= 8


def test_request_response_echo_and_sized() -> None:
    config = TransportConfig()
    for kwargs, resp_len in [({"echo": True}, 3000), ({"response_size": 100}, 100)]:
        responses: list[bytes] = []
        with ReceiverThread(config, **kwargs) as rt:
            sender = Sender(config, "127.0.0.1", rt.port,
                            Workload(messages=20, size=3000, request_response=True, outstanding=4),
                            bind="127.0.0.1", base_port=0, duration=20,
                            on_response=lambda _m, d, out=responses: out.append(d))
            metrics = sender.run()
        assert metrics["completed"]
        assert metrics["responses"] == 20
        assert metrics["completion_times"]["count"] == 20
        assert sorted(payload_seq(r) for r in responses) == list(range(20))
        assert all(len(r) == resp_len for r in responses)


def test_open_loop_rate() -> None:
    config = TransportConfig()
    with ReceiverThread(config) as rt:
        t0 = time.monotonic()
        sender = Sender(config, "127.0.0.1", rt.port, Workload(messages=20, size=1000, rate=200),
                        bind="127.0.0.1", base_port=0, duration=20)
        metrics = sender.run()
        elapsed = time.monotonic() - t0
    assert metrics["completed"] and metrics["messages"] == 20
    assert elapsed >= 19 / 200 * 0.9  # paced by the rate, not by the window
    assert metrics["workload"]["rate"] == 200


def test_duration_bounded_stream_and_stop() -> None:
    config = TransportConfig()
    with ReceiverThread(config) as rt:
        sender = Sender(config, "127.0.0.1", rt.port, Workload(size=4096), bind="127.0.0.1",
                        base_port=0, duration=0.3)
        metrics = sender.run()
    assert metrics["stop_reason"] == "duration"
    assert metrics["messages"] > 0 and metrics["goodput_bps"] > 0


@pytest.mark.parametrize("cc", ["delay", "credit"])
def test_two_senders_one_receiver(cc: str) -> None:
    # Under credit both connections draw on the receiver's one scheduler, fired by its loop.
    config = TransportConfig(cc=cc, link_rate_bps=200e6, base_rtt=0.001)
    with ReceiverThread(config) as rt:
        results: list[dict[str, Any]] = []

        def send(seed: int) -> None:
            s = Sender(config, "127.0.0.1", rt.port, Workload(total_bytes=300_000, size=10_000),
                       bind="127.0.0.1", base_port=0, duration=20, seed=seed)
            results.append(s.run())

        threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        time.sleep(0.05)
    assert len(results) == 2 and all(r["completed"] for r in results)
    ids = {c["connection_id"] for c in rt.metrics["connections"]}
    assert ids == {r["connection_id"] for r in results}
    assert rt.metrics["bytes"] == 600_000
    if cc == "credit":
        states = [c["transport"]["state"]["cc"]["credit"] for c in rt.metrics["connections"]]
        assert all(st["granted"] > config.initial_window for st in states)
        assert states[0]["scheduler"]["grants"] == states[1]["scheduler"]["grants"] > 0  # one scheduler


def test_receiver_ignores_garbage() -> None:
    config = TransportConfig()
    with ReceiverThread(config) as rt:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for junk in [b"", b"x", b"\xfa\xb1" + b"\x00" * 40, os.urandom(200)]:
            s.sendto(junk, ("127.0.0.1", rt.port))
        s.close()
        deadline = time.monotonic() + 10
        while rt.receiver.invalid < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert rt.metrics["connections"] == []
    assert rt.metrics["invalid_datagrams"] == 4


def test_no_receiver_is_an_endpoint_error() -> None:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now: the kernel answers port-unreachable
    sender = Sender(TransportConfig(), "127.0.0.1", port, Workload(total_bytes=10_000),
                    bind="127.0.0.1", base_port=0, connect_timeout=0.3)
    with pytest.raises(EndpointError, match="no receiver"):
        sender.run()


def test_bad_workloads() -> None:
    for w in [Workload(total_bytes=-1), Workload(size=0), Workload(rate=-1), Workload(size=4, request_response=True)]:
        with pytest.raises(EndpointError):
            w.validate()


def test_sigterm_flushes_receiver_metrics(tmp_path: Path) -> None:
    """`fabriclab srd recv` stopped by SIGTERM still writes its metrics JSON and exits 0."""
    out = tmp_path / "recv.json"
    proc = subprocess.Popen(
        [*FABRICLAB, "srd", "recv", "--bind", "127.0.0.1", "--port", "0", "--progress", "--json-out", str(out)],
        cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        line = proc.stderr.readline()  # type: ignore[union-attr]
        assert "listening on" in line, line
        port = int(line.rsplit(":", 1)[1])
        sender = Sender(TransportConfig(), "127.0.0.1", port, Workload(total_bytes=500_000),
                        bind="127.0.0.1", base_port=0, duration=20)
        assert sender.run()["completed"]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    metrics = json.loads(out.read_text())
    assert metrics["stop_reason"] == "signal SIGTERM"
    assert metrics["bytes"] == 500_000
    assert metrics["connections"][0]["transport"]["receiver"]["messages_delivered"] > 0


def test_the_receiver_reads_the_ce_codepoint_of_each_datagram() -> None:
    import socket

    from transport.io.receiver import _recv_with_ce

    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.bind(("127.0.0.1", 0))
        rx.settimeout(2.0)
        recv = _recv_with_ce(rx)
        for tos, marked in ((0x03, True), (0x02, False), (0x00, False)):  # CE, ECT(0), not ECN-capable
            tx.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
            tx.sendto(b"x", rx.getsockname())
            data, addr, *ce = recv(64)
            assert data == b"x" and addr[1] == tx.getsockname()[1]
            assert bool(ce) is marked, tos
    finally:
        rx.close()
        tx.close()
