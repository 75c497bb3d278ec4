"""The live view on the simulated engine: the Backend promises kept without root, on a clock the test
turns (the backend paces the simulation to whatever clock it is given)."""

from __future__ import annotations

import time

import pytest

from live.simulated import SimBackend
from topologies import parse_spec

SPEC = "leaf-spine:spines=2,leaves=4,hosts=2,rate=4"


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _advance(backend: SimBackend, clock: Clock, seconds: float) -> dict:
    clock.t += seconds
    deadline = time.monotonic() + 60
    while backend.fab.net.now < clock.t - 1e-9:  # the thread catches up with the clock
        assert time.monotonic() < deadline, "the simulation did not keep up"
        time.sleep(0.01)
    return backend.links()


def _fabric_util(report: dict) -> dict[str, float]:
    return {f"{lk['a']}-{lk['b']}": max(lk["util_ab"], lk["util_ba"]) for lk in report["links"]
            if lk["a"].startswith(("leaf", "spine")) and lk["b"].startswith(("leaf", "spine"))}


def test_the_simulated_backend_runs_the_controls_the_view_has():
    topo = parse_spec(SPEC)
    clock = Clock()
    b = SimBackend(topo, mode="ecmp", policy="single", clock=clock)
    b.start()
    try:
        b.links()
        ecmp = _fabric_util(_advance(b, clock, 3.0))
        assert max(ecmp.values()) > 0.9  # hashed flows pile onto some uplinks...
        assert min(ecmp.values()) < 0.6  # ...and leave others short
        b.set_mode("spray")
        b.set_policy("spray")
        _advance(b, clock, 2.0)
        spray = _fabric_util(_advance(b, clock, 2.0))
        assert min(spray.values()) > min(ecmp.values()) + 0.2  # every uplink carries its share
        cut = next(lk for lk in topo.links if lk.a.startswith("leaf") and lk.b.startswith("spine"))
        b.set_link_up(cut.a, cut.b, False)
        _advance(b, clock, 1.0)
        after = _fabric_util(_advance(b, clock, 1.0))
        assert after[f"{cut.a}-{cut.b}"] == 0.0
        b.set_loss(cut.a, cut.b, 5.0)
        status = b.workload_status()
        assert status["alive"] == status["processes"] == len(b.flows()) and not status["exited"]
    finally:
        b.stop()


def test_the_simulated_backend_names_what_it_does_not_run():
    with pytest.raises(ValueError, match="permutation workload, not allreduce"):
        SimBackend(parse_spec(SPEC), workload="allreduce")
