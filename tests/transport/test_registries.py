"""The congestion-control and path-policy registries: a new controller is one module plus one line.

The toy controller below stands for that new module; the one `register_congestion_control` line is the
registry line. Nothing else is touched, yet the configuration accepts it, the command lines offer it,
and a simulated transfer runs on it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cli.main import build_parser
from transport.core.config import CC_ALGORITHMS, PATH_POLICIES, ConfigError, TransportConfig
from transport.core.congestion import CONTROLLERS, CcConfig, FixedWindow, make_cc, register_congestion_control
from transport.core.paths import POLICIES
from transport.core.rtt import RttEstimator
from transport.sim.simnet import PathSpec, run_transfer


class HalvingWindow(FixedWindow):
    """A toy controller: a window that grows by one packet per RTT and halves on every loss or timeout."""

    name = "halving"

    def __init__(self, window: float, rtt: RttEstimator | None) -> None:
        super().__init__(window, rtt=rtt)
        self.acks = 0
        self.halvings = 0

    def on_ack(self, rtt: float, acked: int, now: float) -> None:
        super().on_ack(rtt, acked, now)
        self.acks += acked
        self._window += acked / self._window

    def on_loss(self, now: float, share: float = 1.0) -> None:
        self._window = max(1.0, self._window / 2)
        self.halvings += 1

    def on_timeout(self, now: float) -> None:
        self.on_loss(now)

    def state(self) -> dict:
        return {"window": self._window, "acks": self.acks, "halvings": self.halvings}


def halving_factory(config: CcConfig, rtt: RttEstimator | None) -> HalvingWindow:
    return HalvingWindow(config.window, rtt)


@pytest.fixture
def halving() -> Iterator[str]:
    register_congestion_control("halving", halving_factory, "a toy: halve on loss")  # the one registry line
    try:
        yield "halving"
    finally:
        CONTROLLERS.unregister("halving")


def test_a_registered_controller_runs_a_simulated_transfer(halving: str) -> None:
    cfg = TransportConfig(cc=halving, window=8)
    cfg.validate()
    paths = [PathSpec(rate_bps=50e6, queue_packets=32), PathSpec(rate_bps=50e6, queue_packets=32, loss=0.01)]
    r = run_transfer(cfg, cfg, paths, total_bytes=1 << 20, seed=4)
    assert r.completed
    assert sum(len(d) for _, d in r.delivered) == 1 << 20
    state = r.sender_metrics["state"]["cc"]
    assert set(state) == {"window", "acks", "halvings"}  # the toy's own state(): it, not a built-in, ran
    assert state["acks"] >= r.sender_metrics["sender"]["packets_sent"] - r.sender_metrics["sender"]["retransmissions"]
    assert state["halvings"] >= 1  # the lossy path made it decrease


@pytest.mark.parametrize("command", [["srd", "send", "--to", "127.0.0.1:7471"],
                                     ["allreduce", "--rank", "0", "--peers", "127.0.0.1:7000", "--size", "4"]])
def test_a_registered_controller_is_a_choice_of_every_command(halving: str, command: list[str],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert build_parser().parse_args([*command, "--cc", halving]).cc == halving
    with pytest.raises(SystemExit):
        build_parser().parse_args([command[0], *command[1:2 if command[0] == "srd" else 1], "--help"])
    assert "halve on loss" in " ".join(capsys.readouterr().out.split())


def test_unregistered_names_are_refused_with_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match="cc='halving': use one of delay, fixed, credit, nscc"):
        TransportConfig(cc="halving").validate()
    with pytest.raises(ValueError, match="unknown congestion control 'halving': use delay, fixed, credit or nscc"):
        make_cc("halving", TransportConfig())
    with pytest.raises(ConfigError, match=r"path_policy=.ecmp.: use one of single, spray, adaptive, or FILE\.py"):
        TransportConfig(path_policy="ecmp").validate()


def test_the_choices_lists_are_the_registries() -> None:
    assert CC_ALGORITHMS == CONTROLLERS.names() == ("delay", "fixed", "credit", "nscc")
    assert PATH_POLICIES == POLICIES.names() == ("single", "spray", "adaptive")


def test_a_name_registers_once() -> None:
    with pytest.raises(ValueError, match="registered already"):
        register_congestion_control("delay", halving_factory, "again")


@pytest.mark.parametrize("command", [["srd", "send", "--to", "127.0.0.1:7471"], ["srd", "recv"],
                                     ["allreduce", "--rank", "0", "--peers", "127.0.0.1:7000", "--size", "4"],
                                     ["bench", "cc"]])
def test_every_built_in_controller_reaches_every_command(command: list[str]) -> None:
    assert {"delay", "fixed", "credit", "nscc"} <= set(CONTROLLERS.names())
    for name in CONTROLLERS.names():
        args = build_parser().parse_args([*command, "--cc", name])
        assert (args.cc == [name]) if command[0] == "bench" else (args.cc == name)
