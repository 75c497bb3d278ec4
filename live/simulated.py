"""The live view on the simulated engine (`fabriclab live --engine sim`): no root, the same controls.

`SimBackend` keeps the `live.backend.Backend` promises with the simulated fabric of
emulator.sim.fabric and the transport's own connections (experiments.sim_arm), paced to the wall
clock: a thread advances the virtual clock to the seconds elapsed since the start, a slice at a time,
so the counters the view reads move as a live fabric's would. Every flow of the workload sends for as
long as the view runs. The controls act on the simulated fabric as on the live one: a mode switch
installs the controller's rules for the new mode at once, a cut link loses what is on it and the
controller reroutes, loss is drawn per packet, and a new path policy restarts the senders with it.

When the machine cannot keep the simulation up with the wall clock (a fabric too large, rates too
high), the view falls behind: `workload_status` says by how much.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from emulator.sim.fabric import SimFabric
from experiments.arms import Flow
from experiments.model import Arm, SenderSettings
from experiments.model import Workload as ExperimentWorkload
from experiments.sim_arm import SimFlow, add_flows
from live.workload import plan_pairs
from topologies import Topology

log = logging.getLogger(__name__)

SLICE_S = 0.02  # virtual seconds simulated per hold of the lock, so controls and reads get in between
BEHIND_WARN_S = 1.0


class SimBackend:
    """The Backend interface over the simulated engine (see the module docstring)."""

    def __init__(self, topology: Topology, mode: str = "ecmp", policy: str = "single",
                 workload: str = "permutation", seed: int = 1, cc: str | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        if workload != "permutation":
            raise ValueError(f"the simulated engine runs the permutation workload, not {workload}; "
                             "use --workload permutation or the live engine")
        self.topology = topology
        self.mode = mode
        self.policy = policy
        self.cc = cc
        self.workload = workload
        self.seed = seed
        self.clock = clock
        self.wall = wall
        self._pairs = plan_pairs(topology, workload, seed)
        self.fab: SimFabric | None = None
        self._flows: list[SimFlow] = []
        self._generation = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._previous: dict[str, Any] | None = None
        self.behind_s = 0.0

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        self.fab = SimFabric(self.topology, self.mode, seed=self.seed)
        self._start_flows()
        self._t0 = self.clock()
        self._thread = threading.Thread(target=self._run, name="fabriclab-sim", daemon=True)
        self._thread.start()

    def _start_flows(self) -> None:
        assert self.fab is not None
        arm = Arm(self.policy, mode=self.mode, policy=self.policy, sender=SenderSettings(cc=self.cc))
        seen: dict[str, int] = {}
        flows = []
        for src, dst in self._pairs:
            flows.append(Flow(src, dst, seen.get(src, 0)))
            seen[src] = seen.get(src, 0) + 1
        first = self._generation * len(flows)
        self._flows, _ = add_flows(self.fab, arm, ExperimentWorkload(), flows, self.seed, 0, float("inf"), first)

    def _run(self) -> None:
        fab = self.fab
        assert fab is not None
        while not self._stop.is_set():
            target = self.clock() - self._t0
            with self._lock:
                now = fab.net.now
                if now < target:
                    fab.net.run(until=min(target, now + SLICE_S))
                self.behind_s = max(0.0, target - fab.net.now)
            if fab.net.now >= target:
                self._stop.wait(0.01)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._thread = None

    def flows(self) -> list[tuple[str, str]]:
        return list(self._pairs)

    # -- reading -----------------------------------------------------------------------------------
    def links(self) -> dict[str, Any]:
        from live.backend import ControllerLost

        if self.fab is None or self._thread is None:
            raise ControllerLost("the simulated fabric is not running")
        with self._lock:
            report = self.fab.links_report(self.fab.net.now, self._previous)
            self._previous = report
        return {"time": self.wall(), "links": report["links"]}

    def workload_status(self) -> dict[str, Any]:
        n = len(self._flows)
        exited = []
        if self.behind_s > BEHIND_WARN_S:
            exited = [f"the simulation runs {self.behind_s:.1f} s behind the clock: this machine cannot simulate "
                      "the fabric in real time; choose a smaller --topo or lower rates"]
        return {"kind": self.workload, "policy": self.policy, "processes": n, "alive": n, "exited": exited,
                "new_exits": []}

    # -- controls ----------------------------------------------------------------------------------
    def set_mode(self, mode: str) -> None:
        with self._lock:
            assert self.fab is not None
            self.fab.set_mode(mode)
            self.mode = mode

    def set_policy(self, policy: str) -> None:
        with self._lock:
            now = self.fab.net.now if self.fab is not None else 0.0
            for sf in self._flows:
                sf.deadline = now  # they stop submitting; what they have in flight still completes
            self.policy = policy
            self._generation += 1
            self._start_flows()

    def set_link_up(self, a: str, b: str, up: bool) -> None:
        with self._lock:
            assert self.fab is not None
            self.fab.set_link_up(a, b, up)

    def set_loss(self, a: str, b: str, loss_pct: float) -> None:
        with self._lock:
            assert self.fab is not None
            self.fab.set_loss(a, b, loss_pct)
