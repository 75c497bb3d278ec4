"""`fabriclab live`: help, one-line errors with exit code 2, and a fake run that Ctrl-C ends cleanly."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from cli.main import main


def test_help_explains_the_switches(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["live", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for words in ("--workload", "permutation", "allreduce", "--tui", "--fake", "127.0.0.1", "Ctrl-C", "spray"):
        assert words in out


@pytest.mark.parametrize("argv", [
    ["live", "--port", "70000"],
    ["live", "--port", "http"],
    ["live", "--workload", "incast"],
    ["live", "--mode", "via-tor"],
    ["live", "--policy", "random"],
    ["live", "--interval", "5"],
    ["live", "--frobnicate"],
])
def test_bad_arguments_are_one_line_and_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(("fabriclab live: error:", "fabriclab: error:"))


@pytest.mark.parametrize(("argv", "words"), [
    (["live", "--fake", "--topo", "bogus"], "unknown topology"),
    (["live", "--fake", "--topo", "leaf-spine:spines=1,leaves=1,hosts=1"], "at least two"),
    (["live", "--fake", "--host", "256.1.1.1", "--port", "0"], "cannot listen on 256.1.1.1"),
])
def test_bad_input_after_parsing_is_one_line_and_exit_2(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and words in err


def test_a_busy_port_is_one_line(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["live", "--fake", "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"cannot listen on 127.0.0.1:{port}" in err and "--port" in err


@pytest.mark.timeout(60)
def test_fake_run_serves_and_ctrl_c_ends_it():
    proc = subprocess.Popen([sys.executable, "-m", "cli", "live", "--fake", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("live view on http://127.0.0.1:"), line
        url = line.split()[3]
        for _ in range(100):
            with urllib.request.urlopen(url + "api/state", timeout=5) as resp:
                if b'"phase": "running"' in resp.read():
                    break
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.timeout(60)
def test_duration_ends_a_run_on_its_own():
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "cli", "live", "--fake", "--port", "0", "--duration", "2"],
                         capture_output=True, text=True, timeout=40)
    assert out.returncode == 0, out.stderr
    assert "for 2 s;" in out.stdout
    assert 2.0 <= time.monotonic() - t0 < 30


def test_duration_must_be_positive(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["live", "--duration", "0"])
    assert exc.value.code == 2 and "--duration" in capsys.readouterr().err
