"""Experiments as plain data: a topology, the arms to compare, the workload, faults, duration and seed.

An `Experiment` says what to run; the runner (experiments.runner) brings a fresh fabric up for each
`Arm`, runs the workload with the arm's routing mode and transport settings, injects the faults at
their times and collects metrics. Nothing here touches the network, so the catalogue, the CLI and the
tests can build and inspect experiments without root.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from transport.core.config import CC_ALGORITHMS

# What each fault kind does to a fabric, the same call on either engine's (emulator.network's Fabric,
# emulator.sim.fabric's SimFabric): fault kind -> action(fabric, a, b, value).
FAULT_ACTIONS: dict[str, Any] = {
    "link_down": lambda fab, a, b, value: fab.set_link_up(a, b, False),
    "link_up": lambda fab, a, b, value: fab.set_link_up(a, b, True),
    "loss": lambda fab, a, b, value: fab.set_loss(a, b, value),
    "rate": lambda fab, a, b, value: fab.set_rate(a, b, value),
}
FAULT_KINDS = tuple(FAULT_ACTIONS)


def act(fab: Any, kind: str, a: str, b: str, value: float) -> None:
    """Do fault `kind` to the link a-b of `fab` (either engine's fabric)."""
    action = FAULT_ACTIONS.get(kind)
    if action is None:
        raise ValueError(f"unknown fault kind {kind!r}; known kinds: {', '.join(FAULT_KINDS)}")
    action(fab, a, b, value)


class DoesNotFit(ValueError):
    """The experiment names hosts or links that the fabric it is to run on lacks."""


@dataclass(frozen=True)
class Fault:
    """Something done to the fabric `at_s` seconds after the traffic starts.

    kind: link_down / link_up (a-b cut or restored), loss (value = percent, random loss on a-b),
    rate (value = Mb/s, the link's new rate in both directions).
    """

    at_s: float
    kind: str
    a: str
    b: str
    value: float = 0.0

    def describe(self) -> str:
        what = {
            "link_down": "cut",
            "link_up": "restored",
            "loss": f"{self.value:g} % loss",
            "rate": f"rate {self.value:g} Mb/s",
        }[self.kind]
        return f"{self.a}-{self.b} {what} at {self.at_s:g} s"


@dataclass(frozen=True)
class SizedFlow:
    """One flow of a traffic matrix: `size` bytes from host `src` to host `dst`, starting `start_s`
    seconds after the traffic starts. `flow_id` is the matrix's own id (0 when it gave none)."""

    src: str
    dst: str
    size: int
    start_s: float = 0.0
    flow_id: int = 0


@dataclass(frozen=True)
class Workload:
    """What the hosts send.

    pattern "permutation": every host sends one flow to a host on another leaf (or server), a random
    derangement drawn from the seed; "pairs": the flows listed in `pairs`; "incast": every host of the
    fabric run on sends one flow to `receiver`; "ring": every host takes
    part in a ring (all-reduce); "matrix": the flows listed in `flows`, each with its own size and
    start (a traffic matrix, experiments.traffic). `bytes_per_flow` 0 means "as much as the duration
    allows" (the runner sizes flows from the host rate). `message_size` is the transport's message size.
    """

    pattern: str = "permutation"
    pairs: tuple[tuple[str, str], ...] = ()
    receiver: str = ""  # pattern "incast"
    bytes_per_flow: int = 0
    message_size: int = 65536
    # Size flows to this fraction of what the host link carries in `duration` (0 = send for the duration).
    fill: float = 0.0
    # Request/response: messages of `message_size` answered with the same size (latency workloads).
    request_response: bool = False
    # For all-reduce: float32 elements per rank and iterations.
    elements: int = 0
    iterations: int = 0
    # pattern "matrix": the flows, each with its own size and start.
    flows: tuple[SizedFlow, ...] = ()
    # For kind "allreduce": the collective (`fabriclab allreduce --collective`) and, for the
    # hierarchical all-reduce, the ranks per group (consecutive ranks: a server's GPUs).
    collective: str = "ring"
    group: int = 1


@dataclass(frozen=True)
class SenderSettings:
    """How an arm's transport senders run beyond its policy, recovery and delivery: the congestion
    controller, its fixed window (`fixed` only) and the number of entropy values (EVs; the field's
    simulators spray over up to 128). None leaves the sender's own default."""

    cc: str | None = None
    window: int | None = None
    evs: int | None = None

    def __post_init__(self) -> None:
        if self.cc is not None and self.cc not in CC_ALGORITHMS:
            raise ValueError(f"unknown congestion control {self.cc!r}; use one of {', '.join(CC_ALGORITHMS)}")
        if self.window is not None and self.window <= 0:
            raise ValueError(f"window {self.window} is not a positive number of packets")
        if self.evs is not None and not 1 <= self.evs <= 4096:
            raise ValueError(f"{self.evs} EVs: give 1 to 4096")

    def args(self) -> list[str]:
        """The `srd send` options that say so."""
        out = ["--cc", self.cc] if self.cc else []
        out += ["--evs", str(self.evs)] if self.evs is not None else []
        return out + (["--window", str(self.window)] if self.window is not None else [])


@dataclass(frozen=True)
class Arm:
    """One side of a comparison: how traffic is carried, and what is done to the fabric meanwhile.

    `kind` names how the traffic is carried (experiments.arms): "srd" runs the transport (`policy`,
    `recovery`, `delivery`); "tcp" runs TCP; "allreduce" runs the ring all-reduce worker over the
    transport; "ping" measures latency with ping.
    `mode` is the controller's routing mode. `faults` apply to this arm only; `labels` are free-form
    values the analysis groups by (e.g. {"loss_pct": 1.0}).
    """

    name: str
    kind: str = "srd"
    mode: str = "ecmp"
    policy: str = "spray"
    recovery: str = "selective"
    delivery: str = "unordered"
    faults: tuple[Fault, ...] = ()
    labels: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    # The transport senders' settings beyond policy, recovery and delivery.
    sender: SenderSettings = field(default_factory=SenderSettings)
    # This arm's own workload, when it differs from the experiment's (e.g. ping vs all-reduce).
    workload: Workload | None = None



@dataclass
class Experiment:
    """A named comparison. `extra` carries experiment-specific settings the analysis reads."""

    name: str
    title: str
    description: str
    topology: str
    arms: list[Arm]
    workload: Workload = field(default_factory=Workload)
    duration_s: float = 8.0
    seed: int = 1
    repetitions: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["arms"] = [asdict(a) for a in self.arms]
        return d


# --------------------------------------------------------------------------------------------------
# Back from plain data (Experiment.to_dict(), dataclasses.asdict(arm)): a run's records on disk


def workload_from_dict(d: dict[str, Any]) -> Workload:
    return Workload(**{**d, "pairs": tuple(tuple(p) for p in d.get("pairs", ())),
                       "flows": tuple(SizedFlow(**f) for f in d.get("flows", ()))})


def arm_from_dict(d: dict[str, Any]) -> Arm:
    return Arm(**{**d, "faults": tuple(Fault(**f) for f in d.get("faults", ())),
                  "labels": dict(d.get("labels", {})), "sender": SenderSettings(**d.get("sender", {})),
                  "workload": None if d.get("workload") is None else workload_from_dict(d["workload"])})


def experiment_from_dict(d: dict[str, Any]) -> Experiment:
    return Experiment(**{**d, "arms": [arm_from_dict(a) for a in d["arms"]],
                         "workload": workload_from_dict(d["workload"]), "extra": dict(d.get("extra", {}))})
