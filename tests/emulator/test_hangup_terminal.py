"""Every command that brings fabrics up, hung up under it (a closed window, a dropped ssh session):
the probe and `bench fabric` through a terminal that is closed mid-run, each ending by itself with
nothing left on the machine; the cluster selftest's entry (a minute long to run whole) checked for the
handler it installs; and the exit a hangup or SIGTERM outside a fabric turns into."""

from __future__ import annotations

import signal
import time

import pytest

from cli import cluster
from cli.main import main
from emulator import network
from tests.emulator_helpers import assert_no_leftovers, new_leftovers
from tests.terminal import FABRICLAB, Terminal, terminal

SMALL = "leaf-spine:spines=2,leaves=2,hosts=2,rate=10"


@pytest.fixture
def handlers():
    """The SIGTERM and SIGHUP dispositions as they were, put back afterwards."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    yield saved
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def hang_up_with_a_fabric_up(term: Terminal) -> int | None:
    deadline = time.monotonic() + 30
    while not new_leftovers()["ovs_daemons"]:
        assert time.monotonic() < deadline, f"no fabric came up; the terminal showed:\n{term.tail()}"
        term.read(0.5)
    return term.hang_up(90)


@pytest.mark.root
@pytest.mark.timeout(150)
def test_closing_the_terminal_tears_the_probe_down(tmp_path):
    # --mode all announces each case as it starts; at 2000 packets/s the first takes 100 s.
    argv = [FABRICLAB, "probe", "--topo", SMALL, "--mode", "all", "--packets", "200000", "--rate", "2000"]
    with terminal(argv, cwd=tmp_path) as term:
        term.wait_for(r"ecmp / fixed \.\.\.", 90)
        assert hang_up_with_a_fabric_up(term) == 130  # as on Ctrl-C or SIGTERM, not killed by the signal
    assert_no_leftovers()


@pytest.mark.root
@pytest.mark.timeout(150)
def test_closing_the_terminal_tears_the_fabric_bench_down(tmp_path):
    with terminal([FABRICLAB, "bench", "fabric", "--quick"], cwd=tmp_path) as term:
        term.wait_for(r"forwarding ceiling", 90)  # the flood runs over a fabric of its own
        assert hang_up_with_a_fabric_up(term) == 130
    assert_no_leftovers()


@pytest.fixture
def selftest_entry(handlers, monkeypatch, capsys):
    """`cluster selftest`'s entry with the selftest itself stubbed: call it; the SIGTERM and SIGHUP
    dispositions the selftest ran under, one pair per call."""
    import argparse

    from emulator.cluster import selftest

    seen = []

    def run_selftest(*args, **kwargs):
        seen.append((signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)))
        return selftest.SelftestReport(servers=2)

    monkeypatch.setattr(selftest, "run_selftest", run_selftest)
    monkeypatch.setattr("emulator.system.require_ready", lambda caps: caps)
    monkeypatch.setattr("emulator.system.capabilities", lambda: None)

    def call():
        cluster.cmd_selftest(argparse.Namespace(servers=2, duration=1.0, no_experiment=True, json=True))
        return seen[-1]
    return call


def test_the_cluster_selftest_is_torn_down_on_hangup(selftest_entry):
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    assert selftest_entry() == (network.raise_terminated, network.raise_hung_up)


def test_the_cluster_selftest_stays_deaf_to_hangups_under_nohup(selftest_entry):
    for ignored in (signal.SIG_IGN, network.ignore_hangup):  # nohup's, and the cluster's stand-in for it
        signal.signal(signal.SIGHUP, ignored)
        assert selftest_entry()[1] is ignored


def test_a_hangup_outside_a_fabric_ends_the_command_as_terminated(handlers, monkeypatch, capsys):
    def bench(args):
        network.terminate_on_hangup()
        signal.raise_signal(signal.SIGHUP)

    monkeypatch.setattr("cli.main.build_parser", lambda *a: _parser(bench))
    monkeypatch.setattr(network, "detach_from_terminal", lambda: None)  # the test runner's own terminal
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    assert main(["bench"]) == 143
    assert capsys.readouterr().err.endswith("terminated (SIGHUP)\n")


def _parser(func):
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("command")
    p.set_defaults(func=func, verbose=0)
    return p
