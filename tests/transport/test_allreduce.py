"""Ring all-reduce: the reference order of float32 additions, the pure ring state machine, the ring over
the simulated network (with loss), and real worker processes on 127.0.0.1."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from cli.args import parse_peers
from cli.main import main
from experiments.endpoints import command_line
from transport.collective.ring import (
    RingProtocolError,
    RingWorker,
    chunk_bounds,
    decode_header,
    encode_barrier,
    make_input,
    reference_from_seed,
    ring_reference,
)
from transport.core.config import TransportConfig
from transport.io.allreduce import UdpRingWorker, WorkerOptions, bandwidth_bound
from transport.sim.ringsim import ring_allreduce_simulated
from transport.sim.simnet import PathSpec

ROOT = Path(__file__).resolve().parents[2]
F32 = np.float32


# --------------------------------------------------------------------------------------------------
# Reference order


def test_reference_order_hand_checked() -> None:
    # Chunk c of 3 is summed x_c + x_{c+1} + x_{c+2} (mod 3). In float32 1e8 + 1 == 1e8 and
    # 1 - 1e8 == -1e8 (the spacing at 1e8 is 8), so only chunk 2, (-1e8 + 1e8) + 1, keeps the 1.
    inputs = [np.full(3, v, dtype=F32) for v in (1e8, 1.0, -1e8)]
    assert F32(1e8) + F32(1.0) == F32(1e8)
    ref = ring_reference(inputs)
    assert ref.dtype == F32
    assert ref.tolist() == [0.0, 0.0, 1.0]
    # The naive rank-order sum differs: this is why the check reproduces the ring's order.
    naive = (inputs[0] + inputs[1]) + inputs[2]
    assert naive.tolist() == [0.0, 0.0, 0.0]


def test_reference_from_seed_matches_ring_reference() -> None:
    for n, size in [(1, 5), (2, 7), (3, 10), (4, 1001), (5, 3)]:
        inputs = [make_input(9, r, size) for r in range(n)]
        assert np.array_equal(reference_from_seed(n, size, 9), ring_reference(inputs))


def test_inputs_are_deterministic_per_seed_and_rank() -> None:
    assert np.array_equal(make_input(1, 2, 100), make_input(1, 2, 100))
    assert not np.array_equal(make_input(1, 2, 100), make_input(1, 3, 100))
    assert not np.array_equal(make_input(1, 2, 100), make_input(2, 2, 100))
    assert make_input(0, 0, 10).dtype == F32


def test_chunk_bounds_like_array_split() -> None:
    for size, n in [(10, 3), (3, 5), (1024, 4), (1, 1)]:
        expected = [len(a) for a in np.array_split(np.zeros(size), n)]
        assert [hi - lo for lo, hi in chunk_bounds(size, n)] == expected


def test_bandwidth_bound() -> None:
    # 4 ranks, 4 MB at 1000 Mb/s: 1.5 * 32 Mbit / 1000 Mb/s = 48 ms.
    assert bandwidth_bound(4, 4_000_000, 1000) == pytest.approx(0.048)
    assert bandwidth_bound(4, 4_000_000, None) is None
    assert bandwidth_bound(1, 4_000_000, 1000) is None


# --------------------------------------------------------------------------------------------------
# Pure ring state machine, messages shuffled between ranks


def _run_shuffled(n: int, size: int, iterations: int, seed: int, piece_elems: int, dup: float = 0.0):
    """Deliver every message to the right neighbour in a random order, early iterations included."""
    rng = random.Random(seed)
    inputs = [make_input(seed, r, size) for r in range(n)]
    workers = [RingWorker(r, n, inputs[r], iterations, piece_elems) for r in range(n)]
    inflight: list[tuple[int, bytes]] = []  # (destination, message)
    results: list[list[np.ndarray]] = [[] for _ in range(n)]

    def post(r: int, msgs: list[bytes]) -> None:
        inflight.extend(((r + 1) % n, m) for m in msgs)

    def settle(r: int) -> None:
        w = workers[r]
        while w.iteration_done and len(results[r]) <= w.iteration:
            results[r].append(w.buf.copy())
            if w.iteration + 1 < iterations:
                post(r, w.start_iteration())

    # Ranks start at different moments: rank 0 alone first, the others after some traffic.
    post(0, workers[0].start_iteration())
    started = {0}
    steps = 0
    while inflight or len(started) < n:
        steps += 1
        if len(started) < n and (not inflight or rng.random() < 0.05):
            r = min(set(range(n)) - started)
            started.add(r)
            post(r, workers[r].start_iteration())
            settle(r)
            continue
        dst, msg = inflight.pop(rng.randrange(len(inflight)))
        if rng.random() < dup:
            inflight.append((dst, msg))  # delivered again later: must be ignored
        post(dst, workers[dst].receive(msg))
        settle(dst)
        assert steps < 1_000_000
    return inputs, workers, results


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_ring_worker_shuffled_delivery(n: int) -> None:
    inputs, workers, results = _run_shuffled(n, 257, 3, seed=n, piece_elems=7, dup=0.05)
    ref = ring_reference(inputs)
    for r in range(n):
        assert len(results[r]) == 3
        for got in results[r]:
            assert np.array_equal(got, ref)
    assert sum(w.duplicates + w.stale for w in workers) > 0


def test_ring_worker_rejects_foreign_messages() -> None:
    w = RingWorker(1, 3, make_input(0, 1, 30), 1, 4)
    peer = RingWorker(0, 3, make_input(0, 0, 30), 1, 4)
    w.start_iteration()
    first = peer.start_iteration()[0]
    kind, step, it, chunk, off = decode_header(first)
    assert (kind, step, it, chunk, off) == (1, 0, 0, 0, 0)
    w.receive(first)  # fine: rank 1 receives chunk 0 at step 0
    bad_chunk = first[:8] + (2).to_bytes(4, "big") + first[12:]
    with pytest.raises(RingProtocolError):
        w.receive(bad_chunk)
    with pytest.raises(RingProtocolError):
        w.receive(b"\x01\x01")
    with pytest.raises(ValueError):
        RingWorker(3, 3, np.zeros(3, dtype=F32))


# --------------------------------------------------------------------------------------------------
# Ring over the simulated network


def test_simulated_ring_hand_case() -> None:
    inputs = [np.full(3, v, dtype=F32) for v in (1e8, 1.0, -1e8)]
    res = ring_allreduce_simulated(3, 3, inputs=inputs)
    assert res.completed and res.correct
    for got in res.results:
        assert got.tolist() == [0.0, 0.0, 1.0]


def test_simulated_ring_four_ranks() -> None:
    res = ring_allreduce_simulated(4, 20_000, seed=5, iterations=2, paths=[PathSpec(rate_bps=1e9)] * 4)
    assert res.completed and res.correct, res.mismatch
    ref = reference_from_seed(4, 20_000, 5)
    for got in res.results:
        assert np.array_equal(got, ref)
    assert all(len(t) == 2 and all(x > 0 for x in t) for t in res.iteration_times)
    assert len(res.edges) == 4


def test_simulated_ring_with_loss_and_reordering() -> None:
    paths = [PathSpec(rate_bps=1e9, loss=0.03, reorder=0.2, reorder_delay=0.002, duplicate=0.01)] * 4
    res = ring_allreduce_simulated(4, 20_000, seed=6, iterations=2, paths=paths, piece_bytes=8192)
    assert res.completed and res.correct, res.mismatch
    assert np.array_equal(res.results[2], reference_from_seed(4, 20_000, 6))
    retx = sum(e["sender"]["sender"]["retransmissions"] for e in res.edges)
    lost = sum(p["a_to_b"]["lost"] + p["b_to_a"]["lost"] for e in res.edges for p in e["network"])
    assert lost > 0 and retx > 0


@pytest.mark.parametrize(
    "config",
    [TransportConfig(recovery="gobackn"), TransportConfig(delivery="ordered", path_policy="single")],
    ids=["gobackn", "ordered-single"],
)
def test_simulated_ring_other_transport_modes(config: TransportConfig) -> None:
    res = ring_allreduce_simulated(3, 9_999, seed=2, config=config, paths=[PathSpec(loss=0.02)] * 2,
                                   piece_bytes=4000)
    assert res.completed and res.correct, res.mismatch


def test_simulated_ring_more_ranks_than_elements() -> None:
    res = ring_allreduce_simulated(5, 3, seed=1)
    assert res.correct
    res = ring_allreduce_simulated(1, 4, seed=1, iterations=2)
    assert res.correct and np.array_equal(res.results[0], make_input(1, 0, 4))


def test_simulated_ring_dead_link_is_not_correct() -> None:
    paths = [[PathSpec()], [PathSpec(down=[(0.0, 1e9)])], [PathSpec()]]
    res = ring_allreduce_simulated(3, 300, seed=1, paths=paths, time_limit=2.0)
    assert not res.completed and not res.correct
    assert res.mismatch is not None


# --------------------------------------------------------------------------------------------------
# Real worker processes on 127.0.0.1


def test_worker_counts_a_message_its_phase_refuses_and_goes_on() -> None:
    worker = UdpRingWorker(WorkerOptions(rank=1, peers=[("127.0.0.1", 7000), ("127.0.0.1", 7001)], size=8))
    try:
        worker._on_message(encode_barrier(2), 0.0)  # before the worker has started: refused
        worker._on_message(b"\x01", 0.0)  # not a ring message at all
        assert worker.counters["protocol_errors"] == 2 and worker.phase == "setup"
    finally:
        worker.close()


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _free_base(evs: int, taken: set[int]) -> int:
    """A base port, multiple of 16, with ``evs`` free consecutive ports none of which is in ``taken``."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        base = rng.randrange(20000 // 16, 32000 // 16) * 16
        ports = range(base, base + evs)
        if taken.intersection(ports):
            continue
        socks = []
        try:
            for p in ports:
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                socks.append(s)
                s.bind(("0.0.0.0", p))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        taken.update(ports)
        return base
    raise RuntimeError("no free port range")


def _cmd(*args: str) -> list[str]:
    return command_line("allreduce", *args)


def _launch_ring(tmp_path: Path, n: int, size: int, iterations: int, extra: list[str] | None = None):
    evs = 4
    taken: set[int] = set()
    ports = []
    while len(ports) < n:
        p = _free_udp_port()
        if p not in ports:
            ports.append(p)
    taken.update(ports)
    peers = ",".join(f"127.0.0.1:{p}" for p in ports)
    procs = []
    for r in range(n):
        base = _free_base(evs, taken)
        args = [
            "--rank", str(r), "--peers", peers, "--size", str(size), "--iterations", str(iterations),
            "--evs", str(evs), "--base-port", str(base), "--seed", "11", "--timeout", "20",
            "--link-rate-mbps", "1000", "--json-out", str(tmp_path / f"rank{r}.json"), *(extra or []),
        ]
        procs.append(subprocess.Popen(_cmd(*args), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=60)
            outs.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


@pytest.mark.parametrize(("n", "extra"), [(3, []), (4, ["--policy", "adaptive", "--piece-bytes", "16K"])],
                         ids=["3-ranks", "4-ranks-adaptive"])
def test_real_sockets_ring(tmp_path: Path, n: int, extra: list[str]) -> None:
    size = 30_000
    outs = _launch_ring(tmp_path, n, size, 2, extra)
    for r, (rc, out, err) in enumerate(outs):
        assert rc == 0, f"rank {r}: rc={rc} stdout={out!r} stderr={err!r}"
        assert "correct" in out
    ref = reference_from_seed(n, size, 11)
    assert ref.size == size
    for r in range(n):
        res = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert res["rank"] == r
        assert res["correct"] is True and res["mismatch"] is None and res["error"] is None
        assert res["size"] == size and res["bytes"] == 4 * size and res["iterations"] == 2
        assert len(res["iteration_times_s"]) == 2 and all(t > 0 for t in res["iteration_times_s"])
        assert res["mean_s"] == pytest.approx(sum(res["iteration_times_s"]) / 2)
        assert res["bound_s"] == pytest.approx(bandwidth_bound(n, 4 * size, 1000))
        assert res["ratio_to_bound"] == pytest.approx(res["mean_s"] / res["bound_s"])
        # The rank's CPU while its loop ran, which an arm's budget counts as the endpoints'.
        assert 0 < res["cpu_run_s"] <= res["cpu_total_s"] and res["cpu_run_kernel_s"] >= 0
        t = res["transport"]
        assert t["send"]["sender"]["messages_acked"] == t["send"]["sender"]["messages_sent"] > 0
        assert t["recv"]["receiver"]["messages_delivered"] > 0


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--rank", "3", "--peers", "127.0.0.1:7000,127.0.0.1:7001", "--size", "8"], "--rank 3 is out of range"),
        (["--rank", "0", "--peers", "127.0.0.1:7000,nonsense", "--size", "8"], "not IP:PORT"),
        (["--rank", "0", "--peers", "127.0.0.1:99999", "--size", "8"], "out of range"),
        (["--rank", "0", "--peers", "127.0.0.1:7000,127.0.0.1:7000", "--size", "8"], "duplicates"),
        (["--rank", "0", "--peers", "127.0.0.1:7000", "--size", "lots"], "not a count"),
        (["--rank", "0", "--peers", "127.0.0.1:7000", "--size", "8", "--evs", "0"], "num_evs"),
    ],
)
def test_bad_input_one_line_exit_2(args: list[str], needle: str) -> None:
    proc = subprocess.run(_cmd(*args), cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert needle in _one_line_error(proc)


def test_fabriclab_allreduce_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["allreduce", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for words in ("--rank", "--peers", "--size", "--piece-bytes", "--json-out", "143"):
        assert words in out, words


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--rank", "0", "--peers", "127.0.0.1:7000", "--size", "8", "--policy", "random"], "--policy"),
        (["--rank", "0", "--peers", "127.0.0.1", "--size", "8"], "not IP:PORT"),
        (["--peers", "127.0.0.1:7000", "--size", "8"], "--rank"),
        (["--rank", "2", "--peers", "127.0.0.1:7000,127.0.0.1:7001", "--size", "8"], "--rank 2"),
    ],
    ids=["bad-policy", "peer-without-port", "no-rank", "rank-out-of-range"],
)
def test_fabriclab_allreduce_bad_input_is_one_line_exit_2(args: list[str], needle: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(["allreduce", *args])
    except SystemExit as exc:  # argparse's errors
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("fabriclab allreduce: error:") and needle in err, err


def test_parse_peers_ipv6() -> None:
    assert parse_peers("[::1]:7000,10.0.0.2:7001") == [("::1", 7000), ("10.0.0.2", 7001)]


def test_missing_neighbour_times_out(tmp_path: Path) -> None:
    port, other = _free_udp_port(), _free_udp_port()
    out = tmp_path / "r0.json"
    proc = subprocess.run(
        _cmd("--rank", "0", "--peers", f"127.0.0.1:{port},127.0.0.1:{other}", "--size", "64", "--evs", "2",
             "--base-port", str(_free_base(2, {port, other})), "--timeout", "0.5", "--json-out", str(out)),
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )
    assert "barrier not complete" in _one_line_error(proc)
    res = json.loads(out.read_text())
    assert res["correct"] is False and res["phase"] == "barrier" and "barrier" in res["error"]


def test_sigterm_flushes_json(tmp_path: Path) -> None:
    port, other = _free_udp_port(), _free_udp_port()
    out = tmp_path / "r0.json"
    proc = subprocess.Popen(
        _cmd("--rank", "0", "--peers", f"127.0.0.1:{port},127.0.0.1:{other}", "--size", "64", "--evs", "2",
             "--base-port", str(_free_base(2, {port, other})), "--timeout", "30", "--json-out", str(out)),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        time.sleep(1.5)  # past the imports and into the barrier
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    res = json.loads(out.read_text())
    assert res["error"] == "stopped by SIGTERM" and res["correct"] is False
