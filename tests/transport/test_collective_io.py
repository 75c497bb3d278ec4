"""`fabriclab allreduce --collective ...`: the plan collectives as real worker processes on 127.0.0.1,
their JSON against the schema, the report they print, and their bad input (one line, exit 2)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from cli.allreduce import collective_report
from cli.main import main
from transport.collective.api import expected_from_seed
from transport.collective.plan import build_plan, make_int_input
from transport.collective.report import bound
from transport.core.schema import CollectiveMetrics, problems
from transport.io.allreduce import WorkerOptions
from transport.io.collective import UdpCollectiveWorker

from .test_allreduce import ROOT, _cmd, _free_base, _free_udp_port, _launch_ring, _one_line_error


@pytest.mark.parametrize(("n", "extra"), [
    (3, ["--collective", "reduce-scatter"]),
    (3, ["--collective", "all-gather"]),
    (4, ["--collective", "all-to-all", "--policy", "adaptive"]),
    (4, ["--collective", "hierarchical", "--group", "2", "--local-rate-mbps", "4000"]),
], ids=["reduce-scatter", "all-gather", "all-to-all", "hierarchical"])
def test_real_sockets_collectives(tmp_path: Path, n: int, extra: list[str]) -> None:
    size = 20_001  # not a multiple of the rank count
    outs = _launch_ring(tmp_path, n, size, 2, ["--piece-bytes", "8K", *extra])
    name = extra[1]
    for r, (rc, out, err) in enumerate(outs):
        assert rc == 0, f"rank {r}: rc={rc} stdout={out!r} stderr={err!r}"
        assert out.splitlines()[0].split()[:4] == ["#", "size", "count", "type"]
        assert out.strip().endswith("correct") and name in out.splitlines()[-1]
    group = 2 if name == "hierarchical" else 1
    b = bound(name, n, 4 * size, 1000, group=group, local_rate_mbps=4000 if group > 1 else None)
    for r in range(n):
        res = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert problems(res, CollectiveMetrics) == []
        assert res["rank"] == r and res["collective"] == name and res["group"] == group
        assert res["correct"] is True and res["mismatch"] is None and res["error"] is None
        assert res["bytes"] == 4 * size and res["count"] == size and res["type"] == "float"
        assert len(res["iteration_times_s"]) == 2 and res["bound_s"] == pytest.approx(b.total_s)
        assert res["busbw_gbps"] == pytest.approx(res["algbw_gbps"] * (n - 1) / n * (2 if group > 1 else 1))
        t = res["transport"]
        assert all(s["sender"]["messages_acked"] == s["sender"]["messages_sent"] > 0 for s in t["sends"])
        assert t["protocol_errors"] == 0


def test_a_single_rank_collective_writes_the_schema() -> None:
    opts = WorkerOptions(rank=0, peers=[("127.0.0.1", 7471)], size=100, iterations=2, collective="all-gather")
    worker = UdpCollectiveWorker(opts)
    worker.run()
    res = worker.results()
    worker.close()
    assert res["correct"] and res["iterations_done"] == 2 and res["busbw_gbps"] is None
    assert problems(json.loads(json.dumps(res)), CollectiveMetrics) == []
    plan = build_plan("all-gather", 1, 100)
    assert np.array_equal(worker.worker.result, expected_from_seed(plan, 0, 0))
    assert np.array_equal(worker.worker.result, make_int_input(0, 0, 100))


def test_worker_counts_messages_that_are_not_its_own() -> None:
    opts = WorkerOptions(rank=1, peers=[("127.0.0.1", 7000), ("127.0.0.1", 7001)], size=8, collective="all-to-all")
    worker = UdpCollectiveWorker(opts)
    try:
        worker._on_message(b"\x01", 0.0)
        assert worker.counters["protocol_errors"] == 1 and worker.phase == "setup"
        assert sorted(worker.sends) == [0] and sorted(worker.recvs) == [0]
    finally:
        worker.close()


def test_the_report_is_nccl_tests_table_and_a_verdict() -> None:
    opts = WorkerOptions(rank=0, peers=[("127.0.0.1", 7000 + r) for r in range(4)], size=1000,
                         collective="hierarchical", group=2, link_rate_mbps=1000, local_rate_mbps=2000)
    worker = UdpCollectiveWorker(opts)
    try:
        before = collective_report(0, worker.row(), worker.results())
        worker.coll.iteration_times.extend([0.001, 0.003])
        text = collective_report(0, worker.row(), worker.results())
    finally:
        worker.close()
    assert before.splitlines()[2].split()[4:] == ["n/a", "n/a", "n/a", "32.0", "n/a"]
    assert before.splitlines()[-1].endswith("; not finished")
    lines = text.splitlines()
    # 4000 B in 2 ms: 0.016 Gb/s; bound: local 2*1/2 * 32 kbit / 2000 Mb/s = 16 us,
    # fabric 2*1/2 * 16 kbit / 1000 Mb/s = 16 us.
    assert lines[2].split() == ["4000", "1000", "float", "sum", "2000.0", "0.016", "0.024", "32.0", "62.50"]
    assert "local 16.0 us, fabric 16.0 us" in lines[3]
    assert lines[4].startswith("rank 0: 2 iterations of hierarchical of 4000 bytes over 4 ranks in groups of 2;")


@pytest.mark.parametrize(("args", "needle"), [
    (["--collective", "ring", "--group", "2"], "apply to --collective hierarchical only"),
    (["--collective", "all-to-all", "--local-rate-mbps", "100"], "apply to --collective hierarchical only"),
    (["--collective", "hierarchical", "--group", "3"], "do not split into groups of 3"),
    (["--collective", "hierarchical", "--group", "0"], "--group 0"),
    (["--collective", "broadcast"], "--collective"),
    (["--collective", "hierarchical", "--group", "x"], "--group"),
], ids=["group-on-ring", "local-rate-on-all-to-all", "uneven-groups", "zero-group", "unknown", "not-a-number"])
def test_collective_bad_input_is_one_line_exit_2(args: list[str], needle: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--rank", "0", "--peers", "127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003", "--size", "8"]
    try:
        code = main(["allreduce", *base, *args])
    except SystemExit as exc:  # argparse's errors
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("fabriclab allreduce: error:") and needle in err, err


def test_a_missing_peer_times_out_in_the_barrier(tmp_path: Path) -> None:
    ports = [_free_udp_port() for _ in range(3)]
    out = tmp_path / "r0.json"
    proc = subprocess.run(
        _cmd("--rank", "0", "--peers", ",".join(f"127.0.0.1:{p}" for p in ports), "--size", "64", "--evs", "2",
             "--collective", "all-to-all", "--base-port", str(_free_base(2, set(ports))), "--timeout", "0.5",
             "--json-out", str(out)),
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )
    assert "barrier not complete" in _one_line_error(proc)
    res = json.loads(out.read_text())
    assert res["correct"] is False and res["phase"] == "barrier" and problems(res, CollectiveMetrics) == []


# --------------------------------------------------------------------------------------------------
# fabriclab bench collectives: the simulated sweep


def test_bench_collectives_checks_every_collective_and_reports_the_bound(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "collectives", "--ranks", "4", "--sizes", "4K,20001", "--loss", "0.01", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    rows = out["rows"]
    assert [r["collective"] for r in rows] == [c for c in ("all-reduce", "reduce-scatter", "all-gather",
                                                            "all-to-all", "hierarchical") for _ in range(2)]
    for r in rows:
        assert r["correct"] is True and r["mismatch"] is None
        assert r["size"] == 4 * r["count"] and r["type"] == "float"
        want = bound(r["collective"], 4, r["size"], 1000, group=r["group"], local_rate_mbps=4000)
        assert r["bound_s"] == pytest.approx(want.total_s)
        assert r["time_s"] >= (want.overlap_s if want.overlap_s is not None else want.total_s)
        assert r["ratio_to_bound"] == pytest.approx(r["time_s"] / r["bound_s"])
    assert {r["size"] for r in rows} == {4096, 20004}  # 20001 bytes round up to whole float32 elements
    hier = [r for r in rows if r["collective"] == "hierarchical"]
    assert all(r["group"] == 2 and set(r["bound_levels_s"]) == {"local", "fabric"} for r in hier)


def test_bench_collectives_prints_nccl_tests_tables(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "collectives", "--collective", "all-to-all", "--ranks", "3", "--sizes", "12K"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "# all-to-all: correct, bit for bit against numpy"
    assert lines[2].split()[1:5] == ["size", "count", "type", "redop"]
    assert lines[4].split()[:4] == ["12288", "3072", "float", "none"]


@pytest.mark.parametrize(("args", "needle"), [
    (["--sizes", "2"], "--sizes"),
    (["--ranks", "0"], "--ranks"),
    (["--collective", "hierarchical", "--ranks", "6", "--group", "4"], "groups of 4"),
    (["--loss", "1.5"], "--loss"),
])
def test_bench_collectives_bad_input_is_one_line_exit_2(args: list[str], needle: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(["bench", "collectives", *args])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "error" in err and needle in err, err
