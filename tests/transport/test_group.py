"""Several endpoints in one process (transport/io/group.py): delivery, staggered starts, stopping,
the CPU shared out, namespaces, and the `srd group` command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from transport.core.config import TransportConfig
from transport.io.endpoint import EndpointError, Receiver, Sender, Workload
from transport.io.eventloop import SPIN_BELOW
from transport.io.group import LINGER_ENV, LINGER_MAX, LoopGroup, group_linger, netns

ROOT = Path(__file__).resolve().parents[2]
CONFIG = TransportConfig(link_rate_bps=200e6, base_rtt=0.001)


def _receiver(**kwargs) -> Receiver:
    r = Receiver(CONFIG, bind="127.0.0.1", port=0, **kwargs)
    r.open()
    return r


def _sender(port: int, total: int, seed: int, **kwargs) -> Sender:
    s = Sender(CONFIG, "127.0.0.1", port, Workload(total_bytes=total, size=10_000), bind="127.0.0.1",
               base_port=0, seed=seed, **kwargs)
    s.open()
    return s


def _run(loops: list, starts: list[float] | None = None, on_end=None, linger: float = 0.0) -> LoopGroup:
    return _run_group(LoopGroup(loops, starts, linger=linger), on_end)


def _run_group(group: LoopGroup, on_end=None) -> LoopGroup:
    try:
        group.run(on_end)
    finally:
        group.close()
        for loop in group.loops:
            loop.close()
    return group


def test_receivers_and_senders_in_one_group_deliver_everything_and_share_the_cpu() -> None:
    receivers = [_receiver(expect_bytes=400_000), _receiver(expect_bytes=200_000)]
    senders = [_sender(receivers[0].address[1], 200_000, 1, duration=20),
               _sender(receivers[0].address[1], 200_000, 2, duration=20),
               _sender(receivers[1].address[1], 200_000, 3, duration=20)]
    loops = [*receivers, *senders]
    ended = []
    group = _run(loops, on_end=lambda loop: ended.append((loop, loop.results())))
    assert {id(loop) for loop, _ in ended} == {id(loop) for loop in loops}
    metrics = {id(loop): m for loop, m in ended}
    assert all(metrics[id(s)]["completed"] for s in senders)
    assert metrics[id(receivers[0])]["bytes"] == 400_000 and metrics[id(receivers[1])]["bytes"] == 200_000
    assert metrics[id(receivers[0])]["stop_reason"] == "expected bytes received"
    shares = [loop.cpu_metrics()["cpu_run_s"] for loop in loops]
    assert all(s >= 0 for s in shares)
    assert sum(shares) == pytest.approx(group.cpu_run_s, abs=0.001 * len(loops))


def test_a_sender_starts_at_its_offset() -> None:
    r = _receiver(expect_bytes=200_000)
    early, late = _sender(r.address[1], 100_000, 1, duration=20), _sender(r.address[1], 100_000, 2, duration=20)
    t0 = time.monotonic()
    _run([r, early, late], starts=[0.0, 0.0, 0.3])
    assert early.started - t0 < 0.1
    assert late.started - t0 >= 0.3
    assert early.completed and late.completed and r.bytes == 200_000


def test_stop_ends_every_loop_with_its_reason() -> None:
    r = _receiver()  # no expected bytes, no duration: runs until stopped
    s = _sender(r.address[1], 0, 1, duration=30)  # an unbounded stream
    s.workload = Workload(total_bytes=0, size=10_000)
    group = LoopGroup([r, s])
    threading.Timer(0.4, group.stop, args=("test over",)).start()
    t0 = time.monotonic()
    _run_group(group)
    assert time.monotonic() - t0 < 5
    assert r.stop_reason == s.stop_reason == "test over"
    assert r.bytes > 0


def test_a_duration_ends_a_loop_alone() -> None:
    r = _receiver(duration=0.3)
    other = _receiver(duration=1.0)
    _run([r, other])
    assert r.stop_reason == other.stop_reason == "duration"
    assert 0.25 <= r.finished - r.started < 0.6
    assert other.finished - other.started >= 0.95


def test_staying_in_our_own_namespace_and_a_missing_one() -> None:
    with netns(None):
        pass
    with pytest.raises(EndpointError, match="network namespace /nonexistent/ns/net"), netns("/nonexistent/ns/net"):
        pass


@pytest.mark.skipif(os.geteuid() != 0, reason="entering a network namespace needs root")
def test_sockets_opened_in_another_namespace_stay_there(tmp_path: Path) -> None:
    name = f"fabriclab-test-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        with netns(f"/run/netns/{name}"):
            r = _receiver(expect_bytes=100_000)
            s = _sender(r.address[1], 100_000, 1, duration=10)
        # Back in our own namespace, nothing listens on that port: the pair talks inside the other.
        _run([r, s])
        assert s.completed and r.bytes == 100_000
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def _spec(tmp_path: Path, endpoints: list[dict], hold: bool = False) -> Path:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"hold": hold, "endpoints": endpoints}))
    return path


def test_srd_group_command_runs_a_held_group_and_writes_each_endpoints_results(tmp_path: Path) -> None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    common = ["--mtu", "1400", "--link-rate", "200", "--base-rtt", "0.001"]
    recv = ["recv", "--bind", "127.0.0.1", "--port", str(port), "--expect-bytes", "300000",
            "--ready-file", str(tmp_path / "r.ready"), "--json-out", str(tmp_path / "recv.json"), *common]
    sends = [["send", "--to", f"127.0.0.1:{port}", "--bytes", "150000", "--base-port", "0", "--bind", "127.0.0.1",
              "--seed", str(i), "--ready-file", str(tmp_path / f"s{i}.ready"),
              "--json-out", str(tmp_path / f"send-{i}.json"), "--duration", "20", *common] for i in range(2)]
    cmd = [sys.executable, "-m", "cli.endpoint", "srd", "group"]
    rp = subprocess.Popen([*cmd, str(_spec(tmp_path, [{"argv": recv}]))], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    spec = tmp_path / "senders.json"
    spec.write_text(json.dumps({"hold": True, "endpoints": [{"argv": a, "start_s": 0.1 * i}
                                                            for i, a in enumerate(sends)]}))
    sp = subprocess.Popen([*cmd, str(spec)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not all((tmp_path / f).exists() for f in ("r.ready", "s0.ready", "s1.ready")):
            assert time.monotonic() < deadline, (rp.poll(), sp.poll())
            time.sleep(0.05)
        pids = {json.loads((tmp_path / f"s{i}.ready").read_text())["pid"] for i in range(2)}
        assert pids == {sp.pid}  # one process holds both senders
        time.sleep(0.3)
        assert not (tmp_path / "send-0.json").exists()  # held until the signal
        os.kill(sp.pid, signal.SIGUSR1)
        assert sp.wait(30) == 0, sp.stderr.read()
        assert rp.wait(30) == 0, rp.stderr.read()
    finally:
        for p in (rp, sp):
            if p.poll() is None:
                p.kill()
                p.wait()
    sent = [json.loads((tmp_path / f"send-{i}.json").read_text()) for i in range(2)]
    got = json.loads((tmp_path / "recv.json").read_text())
    assert all(m["completed"] and m["bytes"] == 150_000 for m in sent)
    assert got["bytes"] == 300_000 and len(got["connections"]) == 2
    assert sum(m["cpu_run_s"] for m in sent) > 0


def test_srd_group_command_rejects_a_bad_spec_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for spec in (bad, tmp_path / "missing.json", _spec(tmp_path, [])):
        r = subprocess.run([sys.executable, "-m", "cli.endpoint", "srd", "group", str(spec)], cwd=ROOT,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 2, r
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "group spec" in lines[0] and "Traceback" not in r.stderr, r.stderr


def test_a_receiver_that_defers_its_reads_in_a_group_still_gets_everything(monkeypatch) -> None:
    # Coalesced ACKs: the receiver asks to sleep through the packets its held ACK will answer; in a
    # group its socket leaves the poller until then and is read in full afterwards.
    config = TransportConfig(link_rate_bps=50e6, base_rtt=0.001, ack_delay=0.01, ack_batch=8, ack_on_message=True)
    r = Receiver(config, bind="127.0.0.1", port=0, expect_bytes=300_000)
    r.open()
    s = Sender(config, "127.0.0.1", r.address[1], Workload(total_bytes=300_000, size=30_000), bind="127.0.0.1",
               base_port=0, seed=1, duration=20)
    s.open()
    deferrals = []
    turn = r._turn

    def counting_turn(now: float):
        wake = turn(now)
        deferrals.append(r.defer_reads)
        return wake

    monkeypatch.setattr(r, "_turn", counting_turn)
    _run([r, s])
    assert s.completed and r.bytes == 300_000
    assert any(deferrals), "the receiver never asked to defer"
    assert r.sent.datagrams_sent < r.datagrams_received  # ACKs coalesced


def _paced_pair(rate: float, messages: int, request_response: bool = False,
                link_rate_bps: float = 200e6) -> tuple[Receiver, Sender]:
    # Small messages at an open-loop rate: one datagram each, paced as a shaped link paces a flow.
    config = TransportConfig(link_rate_bps=link_rate_bps, base_rtt=0.001)
    r = Receiver(config, bind="127.0.0.1", port=0, echo=request_response, expect_bytes=messages * 200, duration=20)
    r.open()
    s = Sender(config, "127.0.0.1", r.address[1],
               Workload(messages=messages, size=200, rate=rate, request_response=request_response),
               bind="127.0.0.1", base_port=0, seed=1, duration=20)
    s.open()
    return r, s


def test_a_lingering_group_takes_dense_traffic_in_fewer_wake_ups() -> None:
    # 1000 datagrams/s each way on a 4 Mb/s link (half its rate), with the linger the group would
    # choose (a quarter of a 3 ms frame): alone, the group wakes for nearly each datagram. Lingering,
    # once the traffic is seen to be dense each wake-up first sleeps out the rest of a linger since the
    # one before, so those come at most once per linger, and the messages still go on schedule. Counts
    # are checked, not a time budget: a loaded machine stretches the run, not the rule.
    runs = {}
    moderated = 0
    linger = 0.0
    for lingering in (False, True):
        r, s = _paced_pair(1000, 1000, link_rate_bps=4e6)
        linger = group_linger([r, s]) if lingering else 0.0
        group = LoopGroup([r, s], linger=linger)
        quiet = group._quiet.poll

        def counting_quiet(timeout: float, quiet=quiet) -> list:
            nonlocal moderated
            moderated += 1
            return quiet(timeout)

        group._quiet.poll = counting_quiet
        t0 = time.monotonic()
        _run_group(group)
        assert s.completed and r.messages == 1000 and r.bytes == 1000 * 200
        runs[lingering] = (group.wakeups, time.monotonic() - t0)
        if not lingering:
            assert moderated == 0  # no linger, no moderating sleep
    assert 0.0005 < linger < 0.001, linger
    (plain, _), (lingered, lingered_s) = runs[False], runs[True]
    assert moderated <= lingered_s / (linger - SPIN_BELOW) + 1, (moderated, lingered_s)
    assert moderated >= lingered / 2, (moderated, lingered)  # seen to be dense from its start
    # Both runs carry the same messages, so their counts compare (their durations differ by the tail):
    # alone ~3 wake-ups a message (data, ACK, pacing timer), lingering ~1.1.
    assert lingered < plain / 2, runs
    times = sorted(s.completion_times)
    assert times[len(times) // 2] < 20 * linger, times[len(times) // 2]  # a few lingers, not a backlog


def test_a_lingering_group_answers_sparse_requests_at_once() -> None:
    # Ten requests a second never make the traffic dense (two datagrams or turns per linger): each is
    # answered without waiting a linger.
    r, s = _paced_pair(10, 10, request_response=True)
    group = _run([r, s], linger=0.01)
    assert s.completed and len(s.completion_times) == 10
    times = sorted(s.completion_times)
    assert times[len(times) // 2] < 0.005, times  # lingering would add 10-20 ms to each
    assert group.wakeups < 200


def test_the_linger_is_a_fraction_of_a_frame_time_and_can_be_set(monkeypatch) -> None:
    monkeypatch.delenv(LINGER_ENV, raising=False)

    def loops(rate_bps: float, mtu: int = 1472) -> list:
        return [Receiver(TransportConfig(link_rate_bps=rate_bps, mtu=mtu), bind="127.0.0.1", port=0)]

    # A 1514-byte frame at 2 Mb/s takes 6.056 ms; a quarter of it.
    assert group_linger(loops(2e6)) == pytest.approx(0.001514)
    assert group_linger(loops(2e6, mtu=8972)) == pytest.approx(0.009014)  # 36 ms jumbo frames
    assert group_linger(loops(0.5e6, mtu=8972)) == LINGER_MAX  # 144 ms frames: capped
    assert group_linger(loops(200e6)) == 0.0  # 15 µs: not worth a wait
    assert group_linger(loops(0.0)) == 0.0  # no link rate given: never
    monkeypatch.setenv(LINGER_ENV, "500")
    assert group_linger(loops(0.0)) == pytest.approx(0.0005)
    monkeypatch.setenv(LINGER_ENV, "0")
    assert group_linger(loops(2e6)) == 0.0
    monkeypatch.setenv(LINGER_ENV, "soon")
    with pytest.raises(EndpointError, match=LINGER_ENV):
        group_linger(loops(2e6))
