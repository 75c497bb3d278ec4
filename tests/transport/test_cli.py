"""`fabriclab srd` and `fabriclab bench transport` command lines: help, errors, a real transfer."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cli.args import size_arg
from cli.main import main
from cli.srd import parse_destination
from experiments.endpoints import command_line

ROOT = Path(__file__).resolve().parents[2]
FABRICLAB = [sys.executable, "-m", "cli"]


def _closed_port() -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse errors and --help
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


# (argv, a fragment the one-line error must contain)
BAD_INPUT = [
    (["srd", "send", "--to", "127.0.0.1:70000"], "out of range"),
    (["srd", "send", "--to", "127.0.0.1:http"], "not a port"),
    (["srd", "send", "--to", ""], "--to"),
    (["srd", "send", "--to", "999.1.1.1"], "--to 999.1.1.1: cannot resolve"),
    (["srd", "send", "--to", "[::1"], "IPv6"),
    (["srd", "send"], "--to"),
    (["srd", "send", "--to", "127.0.0.1", "--bytes", "-5"], "--bytes"),
    (["srd", "send", "--to", "127.0.0.1", "--bytes", "lots"], "--bytes"),
    (["srd", "send", "--to", "127.0.0.1", "--size", "0"], "--size"),
    (["srd", "send", "--to", "127.0.0.1", "--messages", "-3"], "--messages"),
    (["srd", "send", "--to", "127.0.0.1", "--policy", "random"], "--policy"),
    (["srd", "send", "--to", "127.0.0.1", "--cc", "cubic"], "--cc"),
    (["srd", "send", "--to", "127.0.0.1", "--recovery", "sack"], "--recovery"),
    (["srd", "send", "--to", "127.0.0.1", "--evs", "0"], "--evs"),
    (["srd", "send", "--to", "127.0.0.1", "--rate", "0"], "--rate"),
    (["srd", "send", "--to", "127.0.0.1", "--window", "0"], "--window"),
    (["srd", "send", "--to", "127.0.0.1", "--rate", "5", "--closed-loop", "2"], "not allowed"),
    (["srd", "send", "--to", "127.0.0.1", "--bytes", "1M", "--messages", "3"], "not allowed"),
    (["srd", "send", "--to", "127.0.0.1", "--base-port", "65530"], "--base-port"),
    (["srd", "send", "--to", "127.0.0.1", "--base-port", "99999"], "--base-port"),
    (["srd", "send", "--to", "127.0.0.1", "--mtu", "20"], "--mtu"),
    (["srd", "send", "--to", "127.0.0.1", "--window", "2000000"], "--window"),
    (["srd", "send", "--to", "127.0.0.1", "--evs", "70000"], "--evs"),
    (["srd", "send", "--to", "127.0.0.1", "--size", "4", "--request-response"], "--size"),
    (["srd", "send", "--to", "127.0.0.1", "--bind", "192.0.2.77", "--base-port", "0"], "--bind"),
    (["srd", "recv", "--port", "70000"], "--port"),
    (["srd", "recv", "--port", "-1"], "--port"),
    (["srd", "recv", "--expect-bytes", "-1"], "--expect-bytes"),
    (["srd", "recv", "--duration", "0"], "--duration"),
    (["srd", "recv", "--delivery", "fifo"], "--delivery"),
    (["srd", "recv", "--bind", "192.0.2.77", "--port", "0"], "--bind"),
    (["srd", "recv", "--echo", "--response-size", "10"], "not allowed"),
]


@pytest.mark.parametrize("argv,fragment", BAD_INPUT, ids=[" ".join(a[1:]) or a[0] for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_exit_2(argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert fragment in lines[0], lines[0]


def test_no_receiver_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["srd", "send", "--to", f"127.0.0.1:{_closed_port()}", "--bytes", "10K",
                        "--base-port", "0", "--connect-timeout", "0.3"], capsys)
    assert code == 2
    assert err.count("\n") == 1 and "no receiver" in err and "srd recv" in err


def test_bad_input_subprocess_has_no_traceback() -> None:
    proc = subprocess.run([*FABRICLAB, "srd", "send", "--to", "127.0.0.1:0"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_transport_entry_point_is_one_line_on_bad_input() -> None:
    proc = subprocess.run([*command_line("srd", "send", "--to", "127.0.0.1:0")], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m cli.endpoint srd send: error: argument --to"), lines


def test_transport_entry_point_starts_an_endpoint_with_the_transport_alone() -> None:
    """`python -m cli.endpoint srd` loads the transport and its argument parsing, nothing of the emulator, the
    experiments or the other commands: every endpoint in an emulated host pays for its start."""
    show_modules = ("import json, runpy, sys\n"
                    "try:\n    runpy.run_module('cli.endpoint', run_name='__main__', alter_sys=True)\n"
                    "except SystemExit:\n    pass\n"
                    "print(json.dumps(sorted(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", show_modules, "srd", "send", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--request-response" in proc.stdout, proc.stderr
    loaded = set(json.loads(proc.stdout.splitlines()[-1]))
    ours = {m for m in loaded if m.split(".")[0] in ("cli", "transport", "emulator", "experiments", "topologies")}
    assert "transport.io.endpoint" in ours
    assert {m.split(".")[0] for m in ours} == {"cli", "transport"}, ours
    assert {m for m in ours if m.startswith("cli")} == {"cli", "cli.main", "cli.args", "cli.srd"}, ours
    assert "numpy" not in loaded


def test_transport_entry_point_lists_its_commands() -> None:
    proc = subprocess.run(command_line("--help"), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    for cmd in ("srd", "allreduce", "tcpflow", "train-node"):
        assert cmd in proc.stdout


@pytest.mark.parametrize("cmd,words", [
    (["srd", "send", "--help"], ["--request-response", "--closed-loop", "--policy", "base port + EV", "examples"]),
    (["srd", "recv", "--help"], ["--expect-bytes", "--echo", "--json-out", "SIGTERM"]),
    (["bench", "transport", "--help"], ["core_pps", "loopback_pps", "raw_sendto_pps", "--quick"]),
    (["srd", "--help"], ["recv", "send"]),
])
def test_help(cmd: list[str], words: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(cmd, capsys)
    assert code == 0
    text = " ".join(out.split())
    for w in words:
        assert w in text, w


def test_argument_parsers() -> None:
    assert size_arg("64K") == 65536 and size_arg("2M") == 2 << 20 and size_arg("1400") == 1400
    assert size_arg("1.5k") == 1536 and size_arg("3MiB") == 3 << 20
    assert parse_destination("10.0.0.2") == ("10.0.0.2", 7471)
    assert parse_destination("10.0.0.2:9000") == ("10.0.0.2", 9000)
    assert parse_destination("[::1]:9000") == ("::1", 9000)
    assert parse_destination("fe80::1") == ("fe80::1", 7471)


def test_send_recv_subprocesses_json(tmp_path: Path) -> None:
    """Both commands as real processes: the transfer completes and both write parseable metrics."""
    rjson, sjson = tmp_path / "recv.json", tmp_path / "send.json"
    recv = subprocess.Popen(
        [*FABRICLAB, "srd", "recv", "--bind", "127.0.0.1", "--port", "0", "--expect-bytes", "2M", "--progress",
         "--verify", "--json-out", str(rjson)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = recv.stderr.readline()  # type: ignore[union-attr]
        port = int(line.rsplit(":", 1)[1])
        send = subprocess.run(
            [*FABRICLAB, "srd", "send", "--to", f"127.0.0.1:{port}", "--bytes", "2M", "--size", "100K",
             "--base-port", "0", "--bind", "127.0.0.1", "--json-out", str(sjson)],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )
        rout, rerr = recv.communicate(timeout=30)
    finally:
        if recv.poll() is None:
            recv.kill()
    assert send.returncode == 0, send.stderr
    assert "Mb/s" in send.stdout and "Traceback" not in send.stderr
    assert recv.returncode == 0, rerr
    s, r = json.loads(sjson.read_text()), json.loads(rjson.read_text())
    assert s["completed"] and s["bytes"] == 2 << 20 and r["bytes"] == 2 << 20
    assert r["connections"][0]["corrupt_messages"] == 0 and r["connections"][0]["duplicate_messages"] == 0
    for key in ("role", "duration", "bytes", "goodput_bps", "messages", "completion_times", "ev_datagrams_sent",
                "socket_drops", "connection"):
        assert key in s, key
    assert "received 2097152 bytes" in rout


def test_send_json_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    import threading

    from transport.core.config import TransportConfig
    from transport.io.endpoint import Receiver

    rcv = Receiver(TransportConfig(), bind="127.0.0.1", port=0, echo=True)
    rcv.open()
    t = threading.Thread(target=rcv.run, daemon=True)
    t.start()
    try:
        code, out, err = run(["srd", "send", "--to", f"127.0.0.1:{rcv.address[1]}", "--messages", "10", "--size",
                              "1K", "--request-response", "--closed-loop", "2", "--base-port", "0", "--json"], capsys)
    finally:
        rcv.stop()
        t.join(5)
    assert code == 0, err
    m = json.loads(out)
    assert m["responses"] == 10 and m["completion_times"]["count"] == 10


def test_the_endpoints_ack_hold_follows_the_base_rtt_unless_given() -> None:
    from cli.main import build_parser
    from cli.srd import ENDPOINT_ACK_DELAY, _config

    parser = build_parser()

    def hold(*argv: str) -> float:
        return _config(parser.parse_args(["srd", "recv", *argv])).ack_delay

    assert hold() == ENDPOINT_ACK_DELAY
    assert hold("--base-rtt", "0.02") == ENDPOINT_ACK_DELAY
    assert hold("--base-rtt", "0.44") == pytest.approx(0.11)
    assert hold("--base-rtt", "0.44", "--ack-delay", "0.005") == 0.005  # as given
    assert hold("--base-rtt", "0.44", "--ack-delay", "0") == 0.0
