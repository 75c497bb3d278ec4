"""`python -m cli.endpoint tcpflow`: sized TCP flows over loopback, timed until the receiver holds every byte,
and timed ones that count what was acknowledged in their time and reset."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from experiments.endpoints import command_line
from transport.io.tcpflow import BIN_S, add_to_bins, tcp_info

CMD = command_line("tcpflow")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([*CMD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path.name} did not appear"
        time.sleep(0.02)
    return json.loads(path.read_text())


def receiver(tmp_path: Path, port: int) -> subprocess.Popen:
    proc = start("recv", "--port", str(port), "--timeout", "8", "--json-out", str(tmp_path / "recv.json"),
                 "--ready-file", str(tmp_path / "recv.ready"))
    ready = wait_for(tmp_path / "recv.ready", proc)
    assert ready["pid"] == proc.pid and ready["t"] > 0
    return proc


def test_sized_flow_completes_when_the_receiver_has_every_byte(tmp_path: Path) -> None:
    port, n = free_port(), 2_000_000
    recv = receiver(tmp_path, port)
    send = subprocess.run([*CMD, "send", "--to", f"127.0.0.1:{port}", "--bytes", str(n), "--cport",
                           str(free_port()), "--json-out", str(tmp_path / "send.json"),
                           "--ready-file", str(tmp_path / "send.ready")],
                          capture_output=True, text=True, timeout=10)
    assert send.returncode == 0, send.stderr
    assert recv.wait(timeout=5) == 0
    r = json.loads((tmp_path / "recv.json").read_text())
    s = json.loads((tmp_path / "send.json").read_text())
    assert (tmp_path / "send.ready").exists()
    assert r["role"] == "receiver" and r["bytes"] == n and r["completed"]
    assert 0 <= r["first_byte_s"] <= r["last_byte_s"]
    assert r["bin_s"] == BIN_S and sum(r["series_bps"]) * BIN_S / 8 == pytest.approx(n)
    assert s["role"] == "sender" and s["completed"] and s["stop_reason"] == "completed"
    assert s["bytes"] == n and s["destination"] == f"127.0.0.1:{port}"
    assert s["duration_s"] > 0 and s["goodput_bps"] == pytest.approx(8 * n / s["duration_s"])
    # Loopback loses nothing, so this is 0 on an idle host; a busy one can delay ACKs past the tail
    # loss probe timer, and each probe counts. Bounded here; the field itself is checked in
    # test_tcp_info_reads_loopback_fields.
    assert isinstance(s["retransmissions"], int) and 0 <= s["retransmissions"] <= n // s["mss"] // 4
    assert s["min_rtt_s"] is not None and 0 < s["min_rtt_s"] < 1
    assert s["mss"] > 0 and s["pmtu"] > 0
    # bytes_acked counts the SYN and FIN as well; the series carries only the payload.
    assert sum(s["series_bps"]) * BIN_S / 8 == pytest.approx(n)
    assert s["cpu_run_s"] >= 0 and s["cpu_total_s"] >= s["cpu_run_s"]


def test_timed_flow_counts_what_was_acknowledged_in_its_time_and_resets(tmp_path: Path) -> None:
    port = free_port()
    recv = start("recv", "--port", str(port), "--timed", "--timeout", "8", "--json-out", str(tmp_path / "recv.json"),
                 "--ready-file", str(tmp_path / "recv.ready"))
    wait_for(tmp_path / "recv.ready", recv)
    t0 = time.monotonic()
    send = subprocess.run([*CMD, "send", "--to", f"127.0.0.1:{port}", "--seconds", "0.5",
                           "--json-out", str(tmp_path / "send.json")], capture_output=True, text=True, timeout=10)
    took = time.monotonic() - t0
    assert send.returncode == 0, send.stderr
    assert recv.wait(timeout=5) == 0, recv.communicate()
    s = json.loads((tmp_path / "send.json").read_text())
    r = json.loads((tmp_path / "recv.json").read_text())
    assert s["completed"] and s["stop_reason"] == "duration" and s["seconds"] == 0.5
    assert 0.5 <= s["duration_s"] < 0.5 + 2 * BIN_S and took < 5
    # What the receiver acknowledged by then: no more than it read, the rest died with the reset.
    assert 0 < s["bytes"] <= r["bytes"] and s["goodput_bps"] == pytest.approx(8 * s["bytes"] / s["duration_s"])
    assert r["completed"]
    assert sum(s["series_bps"]) * BIN_S / 8 == pytest.approx(s["bytes"])


def test_a_reset_is_an_error_for_a_receiver_not_told_the_flow_is_timed(tmp_path: Path) -> None:
    port = free_port()
    recv = receiver(tmp_path, port)
    send = subprocess.run([*CMD, "send", "--to", f"127.0.0.1:{port}", "--seconds", "0.3"],
                          capture_output=True, text=True, timeout=10)
    assert send.returncode == 0, send.stderr
    assert recv.wait(timeout=5) == 1
    assert not json.loads((tmp_path / "recv.json").read_text())["completed"]


def test_held_sender_starts_on_sigusr1(tmp_path: Path) -> None:
    port = free_port()
    recv = receiver(tmp_path, port)
    send = start("send", "--to", f"127.0.0.1:{port}", "--bytes", "1M", "--hold",
                 "--ready-file", str(tmp_path / "send.ready"), "--json-out", str(tmp_path / "send.json"))
    ready = wait_for(tmp_path / "send.ready", send)
    assert ready["pid"] == send.pid
    time.sleep(0.2)
    assert send.poll() is None and not (tmp_path / "send.json").exists()  # held: nothing sent yet
    t_go = time.monotonic()
    send.send_signal(signal.SIGUSR1)
    assert send.wait(timeout=5) == 0, send.communicate()
    assert recv.wait(timeout=5) == 0
    s = json.loads((tmp_path / "send.json").read_text())
    assert s["completed"] and s["t_start"] >= t_go  # timing starts at the signal, not at connect
    assert json.loads((tmp_path / "recv.json").read_text())["bytes"] == 1 << 20


def test_held_sender_exits_on_sigterm_without_sending(tmp_path: Path) -> None:
    port = free_port()
    recv = receiver(tmp_path, port)
    send = start("send", "--to", f"127.0.0.1:{port}", "--bytes", "1M", "--hold",
                 "--ready-file", str(tmp_path / "send.ready"), "--json-out", str(tmp_path / "send.json"))
    wait_for(tmp_path / "send.ready", send)
    send.send_signal(signal.SIGTERM)
    _, err = send.communicate(timeout=5)
    assert send.returncode == 0
    assert "nothing sent" in err
    assert not (tmp_path / "send.json").exists()
    assert recv.wait(timeout=5) == 0
    assert json.loads((tmp_path / "recv.json").read_text())["bytes"] == 0


@pytest.mark.parametrize(("args", "option"), [
    (["send", "--to", "127.0.0.1", "--bytes", "1"], "--to"),
    (["send", "--to", "127.0.0.1:70000", "--bytes", "1"], "--to"),
    (["send", "--to", "127.0.0.1:5000", "--bytes", "-5"], "--bytes"),
    (["send", "--to", "127.0.0.1:5000", "--bytes", "lots"], "--bytes"),
    (["send", "--to", "127.0.0.1:5000", "--bytes", "1", "--timeout", "0"], "--timeout"),
    (["send", "--bytes", "1"], "--to"),
    (["send", "--to", "127.0.0.1:5000"], "--bytes"),
    (["send", "--to", "127.0.0.1:5000", "--bytes", "1", "--seconds", "2"], "--seconds"),
    (["send", "--to", "127.0.0.1:5000", "--seconds", "0"], "--seconds"),
    (["recv"], "--port"),
    (["recv", "--port", "x"], "--port"),
])
def test_bad_arguments_give_one_line_and_exit_2(args: list[str], option: str) -> None:
    res = subprocess.run([*CMD, *args], capture_output=True, text=True, timeout=10)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and option in lines[0] and "Traceback" not in res.stderr


def test_no_receiver_is_one_line_and_exit_1(tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = subprocess.run([*CMD, "send", "--to", f"127.0.0.1:{free_port()}", "--bytes", "1000",
                          "--json-out", str(tmp_path / "send.json"), "--ready-file", str(tmp_path / "ready")],
                         capture_output=True, text=True, timeout=15)
    elapsed = time.monotonic() - t0
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "refused" in lines[0]
    assert 4.5 < elapsed < 7.5  # retried for the 5 s a starting receiver may need, then gave up
    s = json.loads((tmp_path / "send.json").read_text())
    assert not s["completed"] and "refused" in s["stop_reason"]
    assert not (tmp_path / "ready").exists()


def test_receiver_that_never_reads_times_the_sender_out(tmp_path: Path) -> None:
    # The kernel completes the handshake for a listening socket nobody accepts from, so the sender
    # connects, fills the buffers and then waits: the deadline must still end it.
    with socket.create_server(("127.0.0.1", 0)) as lsock:
        port = lsock.getsockname()[1]
        res = subprocess.run([*CMD, "send", "--to", f"127.0.0.1:{port}", "--bytes", "256M", "--timeout", "1",
                              "--json-out", str(tmp_path / "send.json")], capture_output=True, text=True, timeout=10)
    assert res.returncode == 1
    assert "not complete within 1 s" in res.stderr
    s = json.loads((tmp_path / "send.json").read_text())
    assert not s["completed"] and s["duration_s"] is None


def test_sigterm_during_the_transfer_still_writes_metrics(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as lsock:
        port = lsock.getsockname()[1]
        send = start("send", "--to", f"127.0.0.1:{port}", "--bytes", "256M",
                     "--ready-file", str(tmp_path / "ready"), "--json-out", str(tmp_path / "send.json"))
        wait_for(tmp_path / "ready", send)
        time.sleep(0.3)
        send.send_signal(signal.SIGTERM)
        _, err = send.communicate(timeout=5)
    assert send.returncode == 1 and "stopped by SIGTERM" in err
    s = json.loads((tmp_path / "send.json").read_text())
    assert not s["completed"] and s["stop_reason"] == "stopped by SIGTERM"


def test_receiver_without_a_sender_times_out(tmp_path: Path) -> None:
    res = subprocess.run([*CMD, "recv", "--port", "0", "--timeout", "0.3", "--json-out", str(tmp_path / "r.json")],
                         capture_output=True, text=True, timeout=10)
    assert res.returncode == 1
    assert "no connection within 0.3 s" in res.stderr
    r = json.loads((tmp_path / "r.json").read_text())
    assert not r["completed"] and r["bytes"] == 0


def test_tcp_info_reads_loopback_fields() -> None:
    with socket.create_server(("127.0.0.1", 0)) as lsock, socket.create_connection(lsock.getsockname()) as c:
        conn, _ = lsock.accept()
        with conn:
            c.sendall(b"x" * 1000)
            assert len(conn.recv(4096)) > 0
            deadline = time.monotonic() + 2
            while (info := tcp_info(c))["bytes_acked"] != 1001 and time.monotonic() < deadline:
                time.sleep(0.01)
    assert info["bytes_acked"] == 1001  # the payload plus the SYN: offset 120 is really bytes_acked
    assert info["snd_mss"] and info["pmtu"] and info["snd_mss"] < info["pmtu"]
    assert info["total_retrans"] == 0 and info["min_rtt"] is not None


def test_samples_spread_over_bins_by_overlap() -> None:
    bins: list[float] = []
    add_to_bins(bins, 0.05, 0.25, 400.0)
    assert bins == pytest.approx([100.0, 200.0, 100.0])
    add_to_bins(bins, 0.31, 0.31, 10.0)
    assert bins == pytest.approx([100.0, 200.0, 100.0, 10.0])
