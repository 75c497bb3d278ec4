"""The endpoint metrics other packages read, as one schema: what `fabriclab srd send` / `srd recv`
write with --json-out (`SenderMetrics`, `ReceiverMetrics`) and what the all-reduce worker writes
(`AllreduceMetrics`; `CollectiveMetrics` for the other collectives). Each holds the transport's own
counters of its connections (`ConnectionMetrics`, from `Connection.metrics()`).

The experiments read these files after a run; the types say which keys they may count on.
`problems()` checks a record against its type (every key present, no other key, each value of its
type), so the tests hold the endpoints to the schema. `base_rto_s()` is the retransmission timeout
the sender reports as `rto_s`, computed by the transport's own rule rather than re-derived by readers.
"""

from __future__ import annotations

import types
import typing
from typing import Any, TypedDict, is_typeddict

from transport.core.config import rtt_guess
from transport.core.rtt import RttEstimator, rto

# --------------------------------------------------------------------------------------------------
# A connection's own counters (Connection.metrics(), transport.core.metrics.Stats.summary())


class Percentiles(TypedDict):
    """transport.core.metrics.percentiles: all but count are None without samples."""

    count: int
    mean: float | None
    p50: float | None
    p99: float | None
    p999: float | None
    max: float | None


class EvCounters(TypedDict):
    packets_sent: int
    bytes_sent: int
    retransmissions: int
    acked: int
    losses: int
    timeouts: int
    rtt: Percentiles


class SenderCounters(TypedDict):
    messages_sent: int
    messages_acked: int
    bytes_acked: int
    packets_sent: int
    bytes_sent: int
    retransmissions: int
    spurious_retransmissions: int
    spurious_retx_fraction: float
    retx_fraction: float
    losses_detected: int
    timeouts: int
    gobackn_rewinds: int
    acks_received: int
    ecn_ce_echoed: int
    rtt: Percentiles
    message_completion: Percentiles
    loss_recovery: Percentiles
    per_ev: dict[str, EvCounters]


class GoodputSeries(TypedDict):
    """Bytes delivered per bin as bit/s, from `start` (None before the first delivery)."""

    start: float | None
    bin: float
    bps: list[float]


class ReceiverCounters(TypedDict):
    data_packets: int
    duplicates: int
    out_of_order: int
    out_of_order_fraction: float
    reorder_distance: dict[str, int]
    messages_delivered: int
    bytes_delivered: int
    acks_sent: int
    quick_acks: int  # of acks_sent, sent at once because a hole had grown old
    ecn_ce_received: int
    credits_sent: int
    requests_received: int
    reassembly_bytes: int
    peak_reassembly_bytes: int
    peak_reassembly_messages: int
    dropped: dict[str, int]
    dropped_total: int
    datagrams_seen: int
    goodput: GoodputSeries
    arrivals: GoodputSeries  # new payload bytes as packets are accepted, in the same form


class ConnectionState(TypedDict):
    cwnd: float
    srtt: float | None
    rttvar: float
    min_rtt: float | None
    inflight: int
    unacked: int
    queued_messages: int
    cc: dict[str, Any]  # the congestion controller's own state: its keys depend on the algorithm
    path_policy: dict[str, Any]  # likewise the path policy's


class ConnectionMetrics(TypedDict):
    sender: SenderCounters
    receiver: ReceiverCounters
    connection_id: int
    config: dict[str, Any]  # TransportConfig.to_dict()
    state: ConnectionState
    path_policy_fault: str | None  # a plug-in policy's first fault (transport.core.policy_plugin), else None


# --------------------------------------------------------------------------------------------------
# The srd endpoints


class _CompletionStats(TypedDict, total=False):
    # total=False, not NotRequired[...]: with postponed annotations Python 3.11 would count those keys
    # as required.
    mean: float
    min: float
    p50: float
    p90: float
    p99: float
    max: float


class CompletionTimes(_CompletionStats):
    """Seconds from submitting a message to its completion (its ACK, or its response); only `count`
    when there were none."""

    count: int


class SenderWorkload(TypedDict):
    total_bytes: int
    messages: int
    size: int
    rate: float
    outstanding: int
    request_response: bool


class EndpointCpu(TypedDict):
    """An endpoint process's CPU seconds (EventLoop.cpu_metrics): while its loop ran, and in all."""

    cpu_run_s: float
    cpu_run_kernel_s: float  # of which in the kernel
    cpu_total_s: float


class SenderMetrics(EndpointCpu):
    """`fabriclab srd send --json-out`: one connection to one receiver."""

    role: str
    destination: str
    connection_id: int
    completed: bool
    stop_reason: str
    duration: float
    bytes: int  # acknowledged
    bytes_submitted: int
    goodput_bps: float
    messages: int
    messages_submitted: int
    responses: int
    response_bytes: int
    completion_times: CompletionTimes
    datagrams_sent: int
    datagrams_received: int
    pps_sent: float
    ev_datagrams_sent: list[int]
    ev_datagrams_received: list[int]
    base_port: int
    source_ports: list[int]
    send_errors: int
    refused: int
    socket_drops: int | None  # None where /proc/net/udp is not readable
    workload: SenderWorkload
    config: dict[str, Any]
    rto_s: float  # base_rto_s(connection)
    connection: ConnectionMetrics


class ReceiverConnection(TypedDict):
    """One flow as its receiver saw it; `connection_id` matches the sender's."""

    connection_id: int
    peer: str
    bytes: int
    messages: int
    datagrams: int
    duration: float
    goodput_bps: float
    source_port_datagrams: dict[str, int]
    corrupt_messages: int | None  # None unless the receiver verified payloads
    duplicate_messages: int | None
    transport: ConnectionMetrics


class ReceiverMetrics(EndpointCpu):
    """`fabriclab srd recv --json-out`: every connection that reached one listening port."""

    role: str
    listen: str
    stop_reason: str
    duration: float
    wall_time: float
    bytes: int
    goodput_bps: float
    messages: int
    datagrams_received: int
    datagrams_sent: int
    pps_received: float
    invalid_datagrams: int
    send_errors: int
    socket_drops: int | None
    expect_bytes: int
    config: dict[str, Any]
    connections_refused: int  # new (source, connection id) pairs turned away: max_connections[_per_source]
    connections_expired: int  # connections forgotten after idle_timeout (their records stay in connections)
    connections: list[ReceiverConnection]


# --------------------------------------------------------------------------------------------------
# The all-reduce worker


class SendSide(ConnectionMetrics):
    """The connection that sends to the right-hand neighbour."""

    to: str


# "from" is a keyword, so the receiving side's own key is declared the functional way.
_FromPeer = TypedDict("_FromPeer", {"from": str})


class RecvSide(_FromPeer, ConnectionMetrics):
    """The connection that receives from the left-hand neighbour."""


class SocketCounters(TypedDict):
    """A collective worker's sockets (transport.io.allreduce.RankLoop.socket_fields)."""

    datagrams_sent: int
    datagrams_received: int
    send_errors: int
    refused: int
    foreign_datagrams: int
    protocol_errors: int
    socket_drops: int | None
    config: dict[str, Any]


class AllreduceTransport(SocketCounters):
    send: SendSide
    recv: RecvSide


class CollectiveTransport(SocketCounters):
    """A plan collective's connections: one to each peer it sends to, one from each it receives from."""

    sends: list[SendSide]
    recvs: list[RecvSide]


class RankRunMetrics(EndpointCpu):
    """What every collective worker reports of one rank's run."""

    rank: int
    peers: list[str]
    size: int  # float32 elements
    bytes: int  # nccl-tests' size
    iterations: int
    iterations_done: int
    iteration_times_s: list[float]
    mean_s: float | None
    min_s: float | None
    max_s: float | None
    bound_s: float | None
    link_rate_mbps: float | None
    ratio_to_bound: float | None
    algbw_gbps: float | None
    busbw_gbps: float | None
    correct: bool
    mismatch: dict[str, Any] | None
    error: str | None
    stop_reason: str
    phase: str
    barrier_s: float | None
    started_unix: float | None
    seed: int
    base_port: int
    piece_bytes: int


class AllreduceMetrics(RankRunMetrics):
    """`transport.io.allreduce --json-out`: one rank of the ring."""

    ring_stats: dict[str, int]
    transport: AllreduceTransport


class CollectiveMetrics(RankRunMetrics):
    """`fabriclab allreduce --collective NAME --json-out` for any NAME but ring: one rank, reported as
    nccl-tests does (size in bytes, count, type, redop, algbw, busbw) against the bound."""

    collective: str
    group: int
    count: int
    type: str
    redop: str
    bound_levels_s: dict[str, float]
    local_rate_mbps: float | None
    collective_stats: dict[str, int]
    transport: CollectiveTransport


# --------------------------------------------------------------------------------------------------
# Derived values and the check


def base_rto_s(conn: ConnectionMetrics) -> float:
    """The retransmission timeout the connection's rule (transport.core.recovery.rto) gives for its final
    RTT estimate and configuration, before any backoff: what one timeout costs a flow."""
    state, config = conn["state"], conn["config"]
    estimate = RttEstimator(srtt=state["srtt"], rttvar=state["rttvar"])
    guess = rtt_guess(config["initial_rtt"], config.get("base_rtt") or 0.0)
    return rto(estimate, guess, config["rto_min"], config["rto_max"], 0)


def problems(value: Any, schema: Any, where: str = "") -> list[str]:
    """What keeps `value` from being a `schema` (a TypedDict or a type such as `int | None`,
    `list[float]`, `dict[str, int]`): missing or unknown keys, values of another type. Empty when it
    conforms. An int passes for a float (the numeric tower: a fixed window is an int), a bool for neither."""
    where = where or _name(schema)
    if schema is Any:
        return []
    if is_typeddict(schema):
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__}, not an object"]
        hints = typing.get_type_hints(schema)
        out = [f"{where}: no key '{k}'" for k in sorted(schema.__required_keys__) if k not in value]
        out += [f"{where}: unknown key '{k}'" for k in sorted(value) if k not in hints]
        for key, hint in hints.items():
            if key in value:
                out += problems(value[key], hint, f"{where}.{key}")
        return out
    origin, args = typing.get_origin(schema), typing.get_args(schema)
    if origin in (types.UnionType, typing.Union):
        if any(not problems(value, arg, where) for arg in args):
            return []
        return [f"{where}: {type(value).__name__} is not {_name(schema)}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: {type(value).__name__}, not a list"]
        return [p for i, item in enumerate(value) for p in problems(item, args[0], f"{where}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__}, not an object"]
        return [p for k, item in value.items()
                for p in problems(k, args[0], f"{where} key") + problems(item, args[1], f"{where}[{k!r}]")]
    if schema is type(None):
        ok = value is None
    elif schema is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif schema is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, schema)
    return [] if ok else [f"{where}: {type(value).__name__} is not {_name(schema)}"]


def _name(schema: Any) -> str:
    # "int", "ConnectionMetrics"; generic aliases and unions print as written ("list[int]", "int | None").
    return schema.__name__ if isinstance(schema, type) else str(schema)
