"""What the live view needs from a fabric, behind one small interface, with a real and a fake side.

`Backend` is the whole contract: bring up, read link counters (the controller's `GET /links` body),
switch routing mode and path policy, cut/restore a link, set loss, report the workload, tear down.
Every call may block; the session runs them in worker threads.

`FabricBackend` is the real thing: emulator.network.Fabric (Mininet, Open vSwitch, the controller)
plus the workload processes of live.workload. `FakeBackend` keeps the same promises in
memory, from the same topology description: flows follow what the routing mode and the transport's
policy would do with their source ports (ECMP hashes each port, spray maps the port's low bits to a
path, single pins one path per destination), share links max-min fairly, lose rate on lossy paths,
avoid cut links, and count bytes on a clock — so under `spray` the imbalance falls and a cut link
carries nothing. It also lets tests kill the controller or the workload.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from experiments.analysis.placement import Hop, capacities, max_min_rates
from live.controls import MODES, POLICIES
from live.state import path_hops
from live.workload import WORKLOADS, Workload, plan_pairs
from topologies import Topology, equal_cost_paths
from transport.core.paths import is_plugin
from transport.io.addressing import DEFAULT_BASE_PORT

log = logging.getLogger(__name__)

EVS = 16  # the transport's entropy values per flow (its default --evs)
SPRAY_BITS = 4  # the controller's spray mode reads the low 4 bits of the UDP source port
LINKS_TIMEOUT_S = 2.0


class ControllerLost(ConnectionError):
    """The controller does not answer (or its process has exited)."""


class Backend(Protocol):
    topology: Topology
    mode: str
    policy: str
    workload: str

    def start(self) -> None: ...  # bring the fabric up and start the workload
    def flows(self) -> list[tuple[str, str]]: ...  # (src, dst) of the workload's flows
    def links(self) -> dict[str, Any]: ...  # GET /links; ControllerLost when it cannot be had
    def set_mode(self, mode: str) -> None: ...
    def set_policy(self, policy: str) -> None: ...
    def set_link_up(self, a: str, b: str, up: bool) -> None: ...
    def set_loss(self, a: str, b: str, loss_pct: float) -> None: ...
    def workload_status(self) -> dict[str, Any]: ...  # kind, policy, processes, alive, exited, new_exits
    def stop(self) -> None: ...  # tear everything down; safe after a partial start


# --------------------------------------------------------------------------------------------------
# The real fabric


class FabricBackend:
    """A Fabric with its controller and the workload processes. Mininet calls stay on one thread:
    the session runs start, controls and stop on a single worker; links() only talks HTTP."""

    def __init__(self, topology: Topology, mode: str = "ecmp", policy: str = "single",
                 workload: str = "permutation", seed: int = 1, cc: str | None = None,
                 poll_interval: float | None = None) -> None:
        self.topology = topology
        # The controller's counters are read at the view's own interval (on a large fabric the
        # emulator's default is longer: emulator.network.poll_interval_for).
        self.poll_interval = poll_interval
        self.mode = mode
        self.policy = policy
        self.cc = cc
        self.workload = workload
        self.seed = seed
        self.fab: Any = None
        self.traffic: Workload | None = None
        self._client: Any = None
        self._pairs = plan_pairs(topology, workload, seed)

    def start(self) -> None:
        from emulator.cluster import new_fabric

        fab = new_fabric(self.topology, mode=self.mode, poll_interval=self.poll_interval)
        self.fab = fab
        fab.__enter__()
        self.traffic = Workload(fab, self.workload, self.policy, self.seed, cc=self.cc)
        self.traffic.start()

    def flows(self) -> list[tuple[str, str]]:
        return list(self._pairs)

    def links(self) -> dict[str, Any]:
        fab = self.fab
        ctl = getattr(fab, "controller", None) if fab is not None else None
        if ctl is None:
            raise ControllerLost("the fabric is not running")
        if ctl.proc is not None and ctl.proc.poll() is not None:
            raise ControllerLost(f"the controller exited with code {ctl.proc.returncode}")
        if self._client is None:
            from emulator.control import ControllerClient

            # A short timeout: a hung controller must show as lost within a few updates, not stall them.
            self._client = ControllerClient(ctl.api_port, timeout=LINKS_TIMEOUT_S)
        try:
            return self._client.links()
        except Exception as exc:  # connection refused, timeout, HTTP error: all mean "no numbers now"
            raise ControllerLost(f"the controller does not answer: {exc}") from None

    def set_mode(self, mode: str) -> None:
        self.fab.set_mode(mode)
        self.mode = mode

    def set_policy(self, policy: str) -> None:
        assert self.traffic is not None
        self.traffic.set_policy(policy)
        self.policy = policy

    def set_link_up(self, a: str, b: str, up: bool) -> None:
        self.fab.set_link_up(a, b, up)

    def set_loss(self, a: str, b: str, loss_pct: float) -> None:
        self.fab.set_loss(a, b, loss_pct)

    def workload_status(self) -> dict[str, Any]:
        if self.traffic is None:
            return {"kind": self.workload, "policy": self.policy, "processes": 0, "alive": 0, "exited": [],
                    "new_exits": []}
        return self.traffic.status()

    def stop(self) -> None:
        try:
            if self.traffic is not None:
                self.traffic.stop()
        finally:
            self.traffic = None
            if self.fab is not None:
                self.fab.__exit__(None, None, None)


# --------------------------------------------------------------------------------------------------
# The fake


def _hash(*parts: object) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "big")


class FakeBackend:
    """Synthetic counters from a topology, in memory, on a clock. See the module docstring."""

    def __init__(self, topology: Topology, mode: str = "ecmp", policy: str = "single",
                 workload: str = "permutation", seed: int = 1, startup_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 noise: float = 0.02) -> None:
        if mode not in MODES or (policy not in POLICIES and not is_plugin(policy)) or workload not in WORKLOADS:
            raise ValueError(f"bad mode/policy/workload: {mode}/{policy}/{workload}")
        self.topology = topology
        self.mode = mode
        self.policy = policy
        self.workload = workload
        self.seed = seed
        self.startup_s = startup_s
        self.clock = clock
        self.wall = wall
        self.noise = noise
        self.controller_alive = True
        self.dead_hosts: dict[str, str] = {}  # host -> why its workload process exited
        self._reported: set[str] = set()
        self._pairs = plan_pairs(topology, workload, seed)
        self._down: set[str] = set()
        self._loss: dict[str, float] = {}
        self._bytes: dict[Hop, float] = {}
        self._packets: dict[Hop, float] = {}
        self._rates: dict[Hop, float] = {}
        self._last: float | None = None
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.calls: list[tuple[str, tuple]] = []  # every control applied, for tests

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        if self.startup_s > 0:
            time.sleep(self.startup_s)
        with self._lock:
            self._last = self.clock()
            self._rates = self._compute_rates()

    def stop(self) -> None:
        with self._lock:
            self._last = None

    def flows(self) -> list[tuple[str, str]]:
        return list(self._pairs)

    # -- fault injection (tests and demos) ---------------------------------------------------------
    def kill_controller(self) -> None:
        self.controller_alive = False

    def revive_controller(self) -> None:
        self.controller_alive = True

    def kill_workload(self, host: str | None = None, why: str = "killed") -> None:
        with self._lock:
            self._advance()
            for src, _ in self._pairs:
                if host is None or src == host:
                    self.dead_hosts[src] = why
            self._rates = self._compute_rates()

    # -- the Backend interface ---------------------------------------------------------------------
    def links(self) -> dict[str, Any]:
        if not self.controller_alive:
            raise ControllerLost("the controller does not answer (fake: killed)")
        with self._lock:
            if self._last is None:
                raise ControllerLost("the fabric is not running")
            self._advance()
            out = []
            for lk in self.topology.links:
                ab, ba = (lk.name, lk.a), (lk.name, lk.b)
                # Measured rates wobble a little around the model's (what a real chart looks like).
                cap = lk.rate_mbps * 1e6 * (1.0 + self.noise * self._rng.uniform(-1, 1))
                out.append({
                    "name": lk.name, "a": lk.a, "b": lk.b, "a_port": lk.a_port, "b_port": lk.b_port,
                    "rate_mbps": lk.rate_mbps, "up": lk.name not in self._down,
                    "tx_bytes": int(self._bytes.get(ab, 0)), "rx_bytes": int(self._bytes.get(ba, 0)),
                    "tx_packets": int(self._packets.get(ab, 0)), "rx_packets": int(self._packets.get(ba, 0)),
                    "drops": 0,
                    "util_ab": round(self._rates.get(ab, 0.0) / cap, 6),
                    "util_ba": round(self._rates.get(ba, 0.0) / cap, 6),
                    "utilisation": round(max(self._rates.get(ab, 0.0), self._rates.get(ba, 0.0)) / cap, 6),
                    "counted_at": None,
                })
            return {"time": self.wall(), "links": out}

    def set_mode(self, mode: str) -> None:
        self._change("set_mode", (mode,), lambda: setattr(self, "mode", mode))

    def set_policy(self, policy: str) -> None:
        def apply() -> None:
            self.policy = policy
            self.dead_hosts.clear()  # the real backend restarts the senders too
            self._reported.clear()

        self._change("set_policy", (policy,), apply)

    def set_link_up(self, a: str, b: str, up: bool) -> None:
        name = self.topology.links_between(a, b)[0].name
        self._change("set_link_up", (a, b, up), lambda: self._down.discard(name) if up else self._down.add(name))

    def set_loss(self, a: str, b: str, loss_pct: float) -> None:
        name = self.topology.links_between(a, b)[0].name

        def apply() -> None:
            if loss_pct > 0:
                self._loss[name] = loss_pct
            else:
                self._loss.pop(name, None)

        self._change("set_loss", (a, b, loss_pct), apply)

    def workload_status(self) -> dict[str, Any]:
        with self._lock:
            n = len(self._pairs) + (len({d for _, d in self._pairs}) if self.workload == "permutation" else 0)
            exited = [f"sender on {h} exited: {why}" for h, why in sorted(self.dead_hosts.items())]
            new = [f"sender on {h} exited: {why}" for h, why in sorted(self.dead_hosts.items())
                   if h not in self._reported]
            self._reported |= set(self.dead_hosts)
            return {"kind": self.workload, "policy": self.policy, "processes": n,
                    "alive": n - len(self.dead_hosts), "exited": exited, "new_exits": new}

    # -- the model ---------------------------------------------------------------------------------
    def _change(self, name: str, args: tuple, apply: Callable[[], None]) -> None:
        with self._lock:
            self._advance()  # bytes so far were counted at the old rates
            apply()
            self.calls.append((name, args))
            if self._last is not None:
                self._rates = self._compute_rates()

    def _advance(self) -> None:
        if self._last is None:
            return
        now = self.clock()
        dt = max(0.0, now - self._last)
        self._last = now
        for hop, bps in self._rates.items():
            self._bytes[hop] = self._bytes.get(hop, 0.0) + bps * dt / 8
            self._packets[hop] = self._packets.get(hop, 0.0) + bps * dt / 8 / 1400

    def _evs(self, flow: int, paths: list[list[str]], src: str, dst: str) -> list[int]:
        """Path index of each entropy value the flow sends on. A user's own policy (--path-policy) is
        drawn as spray: the fake cannot run it against the counters it makes up."""
        evs = [0] if self.policy == "single" else list(range(EVS))
        n = len(paths)
        picks = []
        for ev in evs:
            port = DEFAULT_BASE_PORT + 16 * flow + ev
            if self.mode == "ecmp":
                picks.append(_hash(self.seed, src, dst, port) % n)
            elif self.mode == "spray":
                picks.append((port & ((1 << SPRAY_BITS) - 1)) % n)
            else:  # single: one path per destination, whatever the port
                picks.append([h.name for h in self.topology.hosts].index(dst) % n)
        if self.policy == "adaptive":
            # Adaptive spraying backs off the entropy values whose path loses packets.
            def lossy(i: int) -> bool:
                return any(self._loss.get(h[0], 0) > 0 for h in path_hops(self.topology, paths[i]))

            clean = [i for i in picks if not lossy(i)]
            picks = clean or picks
        return picks

    def _compute_rates(self) -> dict[Hop, float]:
        topo = self.topology
        down = [lk for lk in topo.links if lk.name in self._down]
        weights: list[dict[Hop, float]] = []
        penalty: list[float] = []
        for i, (src, dst) in enumerate(self._pairs):
            paths = equal_cost_paths(topo, src, dst, down)
            if not paths or src in self.dead_hosts:
                continue
            picks = self._evs(i, paths, src, dst)
            w: dict[Hop, float] = {}
            lossy = 0.0
            for idx in picks:
                hops = path_hops(topo, paths[idx])
                for hop in hops:
                    w[hop] = w.get(hop, 0.0) + 1 / len(picks)
                lossy += sum(self._loss.get(h[0], 0.0) for h in hops) / len(picks)
            weights.append(w)
            # Congestion control backs off on loss: a crude, monotone stand-in for the real transport.
            penalty.append(max(0.05, 1.0 - 0.08 * lossy))
        caps = {h: c for h, c in capacities(topo).items() if h[0] not in self._down}
        for w in weights:
            for hop in w:
                caps.setdefault(hop, 0.0)
        rates = max_min_rates(weights, caps) if weights else []
        out: dict[Hop, float] = {}
        for w, r, p in zip(weights, rates, penalty, strict=True):
            r *= p
            for hop, share in w.items():
                out[hop] = out.get(hop, 0.0) + r * share
        return out
