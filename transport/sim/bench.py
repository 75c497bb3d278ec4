"""`fabriclab bench transport`: packet rates of the transport and its loss-recovery figures, in one run.

Rates (DATA datagrams per second of wall-clock time, all measured in the same run):

* `core_pps` — a sender and a receiver `Connection` in this process, datagrams handed from one to the
  other directly (no sockets, no copies): the cost of the protocol core alone.
* `loopback_pps` — the UDP endpoints over 127.0.0.1: the receiver runs in a child process (forked, so
  the two sides use two CPUs and do not share an interpreter lock), the sender in this one; the
  figure is the DATA datagrams the receiver took in per second while data flowed.
* `raw_sendto_pps` — a bare Python `sendto` loop of the same datagram size to an unread 127.0.0.1
  socket: the ceiling for any Python endpoint on this machine.

Recovery (on the deterministic simulated network, `transport.sim.simnet`): goodput with 1% random loss on
one of 8 equal paths relative to the same setup without loss, for selective repeat and go-back-N;
and the fraction of packets retransmitted spuriously when spraying over paths whose one-way delays
differ by 2x.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from transport.core.config import TransportConfig
from transport.core.connection import Connection
from transport.core.events import MessageAcked, MessageReceived
from transport.io.endpoint import Receiver, Sender, Workload, make_payload

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------
# Packet rates


def bench_core(config: TransportConfig, total_bytes: int, message_size: int) -> dict[str, Any]:
    """DATA packets per second through a sender and a receiver Connection, no I/O."""
    sender = Connection(config, 1, seed=1)
    receiver = Connection(config, 1, seed=2)
    mono = time.monotonic
    n_messages = -(-total_bytes // message_size)
    payload = make_payload(0, message_size)
    # Keep enough messages queued that the window, not the application, is the limit.
    limit = max(4, -(-2 * config.max_window * config.mtu // message_size))
    submitted = acked = delivered = 0
    data_pkts = ack_pkts = 0
    s_send, s_recv, s_out = sender.send_message, sender.receive_datagram, sender.datagrams_to_send
    r_recv, r_out = receiver.receive_datagram, receiver.datagrams_to_send
    t0 = mono()
    deadline = t0 + 60.0
    while delivered < n_messages:
        now = mono()
        if now > deadline:
            break
        while submitted < n_messages and submitted - acked < limit:
            s_send(payload)
            submitted += 1
        out = s_out(now)
        for dgram, _ev in out:
            r_recv(dgram, now)
        data_pkts += len(out)
        acks = r_out(now)
        for dgram, _ev in acks:
            s_recv(dgram, now)
        ack_pkts += len(acks)
        while (ev := receiver.next_event()) is not None:
            if isinstance(ev, MessageReceived):
                delivered += 1
        while (ev := sender.next_event()) is not None:
            if isinstance(ev, MessageAcked):
                acked += 1
        if not out and not acks:
            # Nothing moved: a pacing or retransmission timer is due (or soon due).
            for conn in (sender, receiver):
                timer = conn.get_timer()
                if timer is not None and timer <= mono():
                    conn.handle_timer(mono())
    elapsed = mono() - t0
    return {
        "core_pps": data_pkts / elapsed,
        "core_datagrams_per_s": (data_pkts + ack_pkts) / elapsed,
        "core_goodput_bps": 8 * delivered * message_size / elapsed,
        "core_data_packets": data_pkts,
        "core_ack_packets": ack_pkts,
        "core_seconds": elapsed,
        "core_messages_delivered": delivered,
    }


def bench_raw_sendto(size: int, seconds: float) -> dict[str, Any]:
    """A bare sendto loop to an unread loopback socket (the kernel drops what overflows)."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    addr = rx.getsockname()
    buf = b"\x00" * size
    sendto = tx.sendto
    n = 0
    t0 = time.perf_counter()
    end = t0 + seconds
    try:
        while True:
            for _ in range(1000):
                sendto(buf, addr)
            n += 1000
            if time.perf_counter() >= end:
                break
    finally:
        elapsed = time.perf_counter() - t0
        tx.close()
        rx.close()
    return {"raw_sendto_pps": n / elapsed, "raw_sendto_datagram_bytes": size}


def _receiver_child(config: TransportConfig, conn: Any) -> None:
    # Runs in the forked child: serve until the parent sends SIGTERM, then hand back the metrics.
    receiver = Receiver(config, bind="127.0.0.1", port=0)
    receiver.open()
    signal.signal(signal.SIGTERM, lambda *_: receiver.stop("signal"))
    conn.send(receiver.address[1])
    metrics = receiver.run()
    metrics.pop("config", None)
    conn.send(metrics)
    conn.close()


def bench_loopback(config: TransportConfig, seconds: float, message_size: int) -> dict[str, Any]:
    """The UDP endpoints over 127.0.0.1; the receiver in a forked child process."""
    ctx = mp.get_context("fork")
    parent_end, child_end = ctx.Pipe()
    child = ctx.Process(target=_receiver_child, args=(config, child_end), daemon=True)
    child.start()
    try:
        if not parent_end.poll(10):
            raise RuntimeError("loopback receiver did not start")
        port = parent_end.recv()
        sender = Sender(config, "127.0.0.1", port, Workload(size=message_size), bind="127.0.0.1",
                        base_port=0, duration=seconds, connect_timeout=5.0)
        smetrics = sender.run()
        os.kill(child.pid, signal.SIGTERM)  # type: ignore[arg-type]
        rmetrics = parent_end.recv() if parent_end.poll(10) else {}
    finally:
        child.join(5)
        if child.is_alive():
            child.kill()
            child.join()
    r_dgrams = rmetrics.get("datagrams_received", 0)
    r_time = rmetrics.get("duration") or smetrics["duration"]
    return {
        "loopback_pps": r_dgrams / r_time if r_time > 0 else 0.0,
        "loopback_sender_pps": smetrics["pps_sent"],
        "loopback_goodput_bps": rmetrics.get("goodput_bps", 0.0),
        "loopback_seconds": r_time,
        "loopback_datagrams_sent": smetrics["datagrams_sent"],
        "loopback_datagrams_received": r_dgrams,
        "loopback_acks_received": smetrics["datagrams_received"],
        "loopback_send_errors": smetrics["send_errors"],
        "loopback_socket_drops": rmetrics.get("socket_drops"),
        "loopback_retransmissions": _retransmissions(smetrics.get("connection", {})),
    }


def _sender_stat(m: dict[str, Any], key: str) -> int:
    """A sender counter from a connection's metrics() (nested under "sender")."""
    value = m.get("sender", m).get(key)
    return value if isinstance(value, int) else 0


def _retransmissions(m: dict[str, Any]) -> int:
    return _sender_stat(m, "retransmissions")


# --------------------------------------------------------------------------------------------------
# Simulated network


def bench_simnet(total_bytes: int, seeds: list[int]) -> dict[str, Any]:
    from transport.sim.simnet import PathSpec, run_transfer

    rate, delay, queue = 100e6, 0.0005, 256
    base = TransportConfig()

    def paths(loss_on_first: float = 0.0, delays: list[float] | None = None) -> list[PathSpec]:
        out = []
        for i in range(8):
            d = delays[i] if delays else delay
            out.append(PathSpec(rate_bps=rate, delay=d, queue_packets=queue,
                                loss=loss_on_first if i == 0 else 0.0))
        return out

    def goodput(cfg: TransportConfig, p: list[PathSpec]) -> tuple[float, bool, list[dict[str, Any]]]:
        values, done, metrics = [], True, []
        for seed in seeds:
            r = run_transfer(cfg, cfg, p, total_bytes=total_bytes, seed=seed, time_limit=60.0)
            values.append(r.goodput_bps)
            done = done and r.completed
            metrics.append(r.sender_metrics)
        return sum(values) / len(values), done, metrics

    out: dict[str, Any] = {}
    # "Lossless" is the reference the fabric allows: the default (selective) transport on the same
    # paths without loss. Go-back-N is also divided by its own lossless run, which shows that spraying
    # alone (reordering, no loss) already costs it most of its goodput.
    reference = 0.0
    for mode in ("selective", "gobackn"):
        cfg = replace(base, recovery=mode)
        clean, c_done, _ = goodput(cfg, paths())
        lossy, l_done, lossy_metrics = goodput(cfg, paths(0.01))
        reference = reference or clean
        out[f"{mode}_lossless_goodput_bps"] = clean
        out[f"{mode}_lossy_goodput_bps"] = lossy
        out[f"{mode}_vs_lossless"] = lossy / reference if reference else 0.0
        out[f"{mode}_vs_own_lossless"] = lossy / clean if clean else 0.0
        out[f"{mode}_completed"] = c_done and l_done
        out[f"{mode}_lossy_retransmissions"] = sum(_retransmissions(m) for m in lossy_metrics)

    # Spraying over paths whose delays differ 2x: reordering a RACK-style detector should tolerate.
    delays = [delay if i % 2 == 0 else 2 * delay for i in range(8)]
    spurious = sent = 0
    for seed in seeds:
        r = run_transfer(base, base, paths(delays=delays), total_bytes=total_bytes, seed=seed, time_limit=60.0)
        spurious += _sender_stat(r.sender_metrics, "spurious_retransmissions")
        sent += _sender_stat(r.sender_metrics, "packets_sent")
    out["spurious_retx_fraction"] = spurious / sent if sent else 0.0
    out["spurious_retransmissions"] = spurious
    out["spurious_packets_sent"] = sent
    out["simnet_parameters"] = {
        "paths": 8,
        "path_rate_bps": rate,
        "path_delay_s": delay,
        "queue_packets": queue,
        "loss_on_path_0": 0.01,
        "skewed_delays_s": delays,
        "total_bytes": total_bytes,
        "seeds": seeds,
    }
    return out


# --------------------------------------------------------------------------------------------------


def run_bench(quick: bool = False, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every measurement once and return one JSON-serialisable dict."""
    config = TransportConfig()
    datagram = config.mtu  # full-size DATA datagrams: header + max payload = mtu
    message_size = 64 * 1024
    p = {
        "quick": quick,
        "core_bytes": (16 if quick else 64) << 20,
        "loopback_seconds": 2.0 if quick else 5.0,
        "loopback_coalesced_seconds": 1.0 if quick else 3.0,
        "loopback_coalesced_ack_delay": 0.0002,
        "raw_seconds": 0.5 if quick else 1.0,
        "simnet_bytes": (4 if quick else 16) << 20,
        "simnet_seeds": [1] if quick else [1, 2, 3],
        "message_size": message_size,
        "datagram_bytes": datagram,
        "cpus": os.cpu_count(),
        "loopback_layout": "receiver in a forked child process, sender in the bench process",
        "config": config.to_dict() if hasattr(config, "to_dict") else vars(config),
    }
    say = progress or (lambda _msg: None)
    t0 = time.monotonic()
    result: dict[str, Any] = {}
    say("raw sendto")
    result.update(bench_raw_sendto(datagram, p["raw_seconds"]))
    say("core")
    result.update(bench_core(config, p["core_bytes"], message_size))
    say("loopback")
    result.update(bench_loopback(config, p["loopback_seconds"], message_size))
    result["loopback_vs_raw"] = result["loopback_pps"] / result["raw_sendto_pps"]
    # The same with ACK coalescing: one ACK per several DATA packets halves the syscalls and the
    # wake-ups per packet, which on loopback cost more than the protocol work itself.
    coalesced = replace(config, ack_delay=p["loopback_coalesced_ack_delay"])
    lo = bench_loopback(coalesced, p["loopback_coalesced_seconds"], message_size)
    result["loopback_coalesced_pps"] = lo["loopback_pps"]
    result["loopback_coalesced_acks_received"] = lo["loopback_acks_received"]
    result["loopback_coalesced_vs_raw"] = lo["loopback_pps"] / result["raw_sendto_pps"]
    say("simnet")
    result.update(bench_simnet(p["simnet_bytes"], p["simnet_seeds"]))
    result["parameters"] = p
    result["bench_seconds"] = time.monotonic() - t0
    return result
