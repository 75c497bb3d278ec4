"""Endpoint metrics files from transfers on the in-memory simulated network: the transport's own
connection metrics, wrapped the way `fabriclab srd send` / `srd recv` wrap them (transport.core.schema's
SenderMetrics / ReceiverMetrics, every key), so the experiments' readers get what real endpoints write."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transport.core.config import TransportConfig
from transport.core.schema import ReceiverConnection, ReceiverMetrics, SenderMetrics, base_rto_s
from transport.io.endpoint import write_json
from transport.sim.simnet import PathSpec, TransferResult, run_transfer

MESSAGE = 65536


def transfer(size: int, path: PathSpec, seed: int = 1, connection_id: int = 1,
             config: TransportConfig | None = None) -> TransferResult:
    """`size` bytes in MESSAGE-byte messages over `path`, every message submitted at time 0."""
    cfg = config or TransportConfig()
    return run_transfer(cfg, cfg, [path], total_bytes=size, message_size=MESSAGE, seed=seed,
                        connection_id=connection_id)


def sender_record(r: TransferResult, size: int) -> SenderMetrics:
    """What `fabriclab srd send --bytes SIZE` writes around the transfer's sender: every message is
    submitted at time 0, so the last message's completion is the flow's completion time."""
    conn = r.sender_metrics
    snd = conn["sender"]
    fct = snd["message_completion"]["max"] or r.duration
    acked = snd["bytes_acked"]
    evs = conn["config"]["num_evs"]
    return {
        "cpu_run_s": 0.0, "cpu_run_kernel_s": 0.0, "cpu_total_s": 0.0, "role": "sender", "destination": "10.0.0.2:7471",
        "connection_id": conn["connection_id"], "completed": r.completed and acked == size,
        "stop_reason": "completed" if r.completed else "duration", "duration": fct, "bytes": acked,
        "bytes_submitted": size, "goodput_bps": 8 * acked / fct, "messages": snd["messages_acked"],
        "messages_submitted": snd["messages_sent"], "responses": 0, "response_bytes": 0,
        "completion_times": {"count": 0}, "datagrams_sent": snd["packets_sent"],
        "datagrams_received": snd["acks_received"], "pps_sent": snd["packets_sent"] / fct,
        "ev_datagrams_sent": [conn["sender"]["per_ev"].get(str(ev), {}).get("packets_sent", 0) for ev in range(evs)],
        "ev_datagrams_received": [0] * evs, "base_port": 40000, "source_ports": list(range(40000, 40000 + evs)),
        "send_errors": 0, "refused": 0, "socket_drops": 0,
        "workload": {"total_bytes": size, "messages": 0, "size": MESSAGE, "rate": 0.0, "outstanding": 0,
                     "request_response": False},
        "config": conn["config"], "rto_s": base_rto_s(conn), "connection": conn,
    }


def receiver_record(results: list[TransferResult]) -> ReceiverMetrics:
    """What `fabriclab srd recv` writes after serving these transfers' receiving ends."""
    conns: list[ReceiverConnection] = []
    for r in results:
        rcv = r.receiver_metrics["receiver"]
        conns.append({
            "connection_id": r.receiver_metrics["connection_id"], "peer": "10.0.0.1",
            "bytes": rcv["bytes_delivered"], "messages": rcv["messages_delivered"], "datagrams": rcv["datagrams_seen"],
            "duration": r.duration, "goodput_bps": r.goodput_bps, "source_port_datagrams": {},
            "corrupt_messages": None, "duplicate_messages": None, "transport": r.receiver_metrics,
        })
    nbytes = sum(c["bytes"] for c in conns)
    duration = max((r.duration for r in results), default=0.0)
    return {
        "cpu_run_s": 0.0, "cpu_run_kernel_s": 0.0, "cpu_total_s": 0.0, "role": "receiver", "listen": "10.0.0.2:7471",
        "stop_reason": "expected bytes", "duration": duration, "wall_time": duration, "bytes": nbytes,
        "goodput_bps": 8 * nbytes / duration if duration else 0.0, "messages": sum(c["messages"] for c in conns),
        "datagrams_received": sum(c["datagrams"] for c in conns), "datagrams_sent": 0, "pps_received": 0.0,
        "invalid_datagrams": 0, "send_errors": 0, "socket_drops": 0, "expect_bytes": nbytes,
        "config": results[0].receiver_metrics["config"], "connections_refused": 0, "connections_expired": 0,
        "connections": conns,
    }


def write(raw_dir: Path, name: str, record: Any) -> None:
    """One endpoint's --json-out file, written by the endpoints' own writer."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    write_json(record, str(raw_dir / f"{name}.json"))
