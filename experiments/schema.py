"""results.json as types: the document (`ResultsDocument`), each arm's entry (`ArmResult`) and their
parts, and the runner's raw record of an arm (`RawArm`) that an entry is computed from.

The runner fills a `RawArm`, experiments.results turns it into an `ArmResult`, the driver gathers the
`ResultsDocument`, and the experiments' analyses, the report, the plots, the policy arm and the labs
read those. `validate()` checks a document with the transport's own checker (transport.core.schema's
`problems`: every required key present, no unknown key, each value of its type), the one mechanism
both the endpoints' files and the results are held to.

A key an older results.json may lack, or that only some arms have, is optional (`total=False`); the
keys an experiment's analysis adds to its arms (e.g. `expected_goodput_bps`) are declared here too.
An arm's `flows` keep their kind's own keys (experiments.arms: each kind reads its endpoints' files,
which transport.core.schema types).
"""

from __future__ import annotations

import typing
from typing import Any, TypedDict

from experiments.analysis.fidelity import Fidelity as FidelityVerdict
from transport.core.schema import problems

SCHEMA_VERSION = 2  # 2: arms carry slowdown_mean / slowdown_max, sized flows ideal_fct_s / slowdown

# --------------------------------------------------------------------------------------------------
# An arm's parts


# An arm's fidelity is analysis.fidelity.Fidelity as plain data, and a run's the worst over its arms
# (results.worst_fidelity), which has no packet count: both typed from the dataclass's own fields.
_FIDELITY = typing.get_type_hints(FidelityVerdict)
Fidelity = TypedDict("Fidelity", _FIDELITY)  # type: ignore[misc]
RunFidelity = TypedDict("RunFidelity", {k: v for k, v in _FIDELITY.items() if k != "packets_forwarded"})  # type: ignore[misc]


class Reorder(TypedDict):
    out_of_order: int
    out_of_order_fraction: float
    distance_histogram: dict[str, int]
    spurious_retransmissions: int
    peak_reassembly_bytes: int


class LinkSeries(TypedDict):
    """Utilisation per link direction ("leaf1->spine1") at each sample time, and which are fabric links."""

    t: list[float]
    util: dict[str, list[float]]
    fabric: list[str]


class GoodputSeries(TypedDict):
    bin_s: float
    bps: list[float]


class CpuBudget(TypedDict):
    window_s: float | None
    packets_delivered: int
    cpu_s: dict[str, float | None]
    cpu_s_per_mpkt: dict[str, float | None]


class AppliedFault(TypedDict):
    """A fault as the runner applied it ("auto" ends resolved), `at_s` after the traffic started."""

    kind: str
    a: str
    b: str
    value: float
    planned_s: float
    at_s: float


class _ArmRequired(TypedDict):
    name: str
    kind: str
    mode: str
    description: str
    error: str | None
    goodput_bps: float
    ideal_bps: float
    goodput_fraction: float
    link_imbalance: float
    hot_links: list[str]
    completion_p50_s: float | None
    completion_p99_s: float | None
    slowdown_mean: float | None
    slowdown_max: float | None
    retransmissions: int | None
    reorder: Reorder | None
    flows: list[dict[str, Any]]
    fidelity: Fidelity


class ArmResult(_ArmRequired, total=False):
    """One arm of results.json (README "Experiments" says what each key means). An arm that failed
    keeps the keys every arm gets, with zeros and its `error`."""

    policy: str
    recovery: str
    delivery: str
    labels: dict[str, Any]
    repetition: int
    # In a repeated run, how text names the arm: "spray (rep 2)"; see arm_label.
    label: str
    slowdown_flows: int
    slowdown_incomplete: int
    wire_efficiency: float
    goodput_of_wire: float
    completion_kind: str
    link_utilisation: dict[str, float]
    link_series: LinkSeries
    goodput_series: GoodputSeries
    cpu_budget: CpuBudget | None
    queue_drops: dict[str, int]
    # Data packets sent and never seen by the receiver beyond what the queues dropped (results.py's
    # vanished_packets); None where it cannot be judged (loss on purpose, unfinished flows).
    vanished_packets: int | None
    # "sim" on the simulated engine, with its own counters in `sim` (experiments.sim_arm).
    engine: str
    sim: dict[str, Any]
    cpu_idle: list[float]
    faults: list[AppliedFault]
    events: Any  # the controller's own event log (GET /events), None when it could not be read
    fault_errors: list[str]
    endpoint_errors: list[str]
    timings: dict[str, float | None]
    datapath: str | None
    loss_method: str | None
    queue_series: dict[str, Any]  # extra["watch_queue"]: {"interface", "t", "packets", "bytes"} from t0
    queue_max_packets: int
    # incast: the last byte against the ideal (payload bytes, or the frames' bytes, over the receiver's
    # link), the flows' completion spread, the receiver queue's drops, retransmitted share of packets.
    incast_completion_s: float | None
    incast_ideal_s: float | None
    incast_completion_ratio: float | None
    incast_wire_ratio: float | None
    completion_spread: float | None
    receiver_queue_drops: int | None
    retransmit_share: float | None
    server_cpu_idle: dict[str, float]  # across servers only: each server's CPU idle over the traffic
    cross_server_links: int  # across servers only: links carried by ssh tunnels
    # What the experiments' analyses add (experiments/scenarios).
    expected_goodput_bps: float
    vs_expectation: float | None
    placement: dict[str, str]  # ECMP arms: flow -> the switches its hashed path crossed
    placement_residual: float  # how much of the counted load that placement leaves unexplained (0: none)
    placement_fair_bps: float  # the max-min fair total of that placement
    vs_placement: float | None  # goodput / placement_fair_bps
    path_share: dict[str, Any]
    goodput_before_fault_bps: float | None
    goodput_after_fault_bps: float | None
    hit_flows: int
    recovery_s: float
    rto_s: float | None
    iteration_s: float | None
    bound_s: float | None
    ratio_to_bound: float | None
    correct: bool
    step_time_p50_s: float | None
    step_time_p99_s: float | None
    compute_share: float | None
    checkpoint_stall_s: float
    steps_lost: int
    goodput_steps_per_s: float | None
    rollbacks: int
    checkpoint_time_s: float | None
    breakdown_s: dict[str, float]
    job_wall_s: float | None


# --------------------------------------------------------------------------------------------------
# The document



def arm_label(arm: ArmResult | dict[str, Any]) -> str:
    """How tables and sentences name an arm: its name, with its repetition in a repeated run."""
    return arm.get("label") or arm["name"]


class FlowPair(TypedDict):
    src: str
    dst: str


class _DocumentRequired(TypedDict):
    schema: int
    experiment: str
    title: str
    topology: dict[str, Any]  # spec, name, params and the fabric as plain data (Topology.to_dict)
    seed: int
    duration_s: float
    fidelity: RunFidelity
    arms: list[ArmResult]
    analysis: dict[str, Any]  # what the experiment's analysis adds; {"error": ...} when it broke
    complete: bool


class ResultsDocument(_DocumentRequired, total=False):
    description: str
    repetitions: int
    bytes_per_flow: int
    flows: list[FlowPair]
    extra: dict[str, Any]
    started: str
    finished: str
    experiment_definition: dict[str, Any]  # Experiment.to_dict()
    # "live" (the emulator) or "sim" (the simulated engine); a document without it is live.
    engine: str


# --------------------------------------------------------------------------------------------------
# The runner's raw record of an arm


class RawArm(TypedDict, total=False):
    """What experiments.runner.run_arm gathers (an arm that failed has only `error` and a few more):
    the fabric's timings, link and CPU samples, queue counters, faults and every endpoint's output."""

    error: str
    repetition: int
    seed: int
    bring_up_s: float
    teardown_s: float
    wall_s: float
    datapath: str
    loss_method: str | None
    t0: float
    t0_unix: float  # t0 on the wall clock, which endpoints stamp their own times with
    last_start_s: float  # the latest flow's start after t0 (a traffic matrix's later starts)
    traffic_s: float
    samples: list[dict[str, Any]]  # GET /links, with the sample time `t`
    cpu: list[dict[str, float]]  # idle fraction over the `dt` seconds before `t`
    cpu_window: dict[str, float | None]
    # Fabrics split across servers (emulator.cluster): each server's CPU idle over the traffic, and
    # which server each node ran on.
    server_cpu_idle: dict[str, float]
    servers: dict[str, str]
    # extra["watch_queue"]: one interface's egress backlog over time ({"interface", "samples": [{"t",
    # "bytes", "packets"}]}).
    queue_series: dict[str, Any]
    qdisc_before: dict[str, dict[str, int]]
    qdisc_after: dict[str, dict[str, int]]
    faults: list[AppliedFault]
    fault_times: list[float]
    fault_errors: list[str]
    endpoint_errors: list[str]
    events: Any
    endpoints: dict[str, Any]  # file stem -> the endpoint's JSON (transport.core.schema) or ping's text
    # The simulated engine's arms (experiments.sim_arm): "sim", and its counters (events, packet-hops,
    # virtual and wall time, events/s, peak memory).
    engine: str
    sim: dict[str, Any]


def validate(doc: Any) -> list[str]:
    """Problems with a results document (empty when it conforms)."""
    out = problems(doc, ResultsDocument, "results")
    arms = doc.get("arms") if isinstance(doc, dict) else None
    for i, arm in enumerate(arms if isinstance(arms, list) else []):
        gp = arm.get("goodput_bps") if isinstance(arm, dict) else None
        if isinstance(gp, int | float) and gp < 0:
            out.append(f"results.arms[{i}] ({arm.get('name')}): negative goodput")
    return out
