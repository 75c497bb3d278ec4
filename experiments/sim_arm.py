"""One arm on the simulated engine: the same flows, transport and forwarding as on the live fabric, on a
virtual clock, written as the same raw record (experiments.schema.RawArm) the live runner writes.

Each flow is a pair of the transport's `Connection`s, configured as the live `srd send` and `srd
recv` configure theirs (the fabric's host rate and base RTT, the endpoints' ACK hold, the arm's
policy, recovery, delivery and congestion control) and seeded as they are. Their header is the live
one: the sender's EV e of the i-th flow leaving a host is source port base + 16 i + e, the receiver
listens on the contract's port and answers each EV's port, so ECMP hashes, and spray reads, the very
fields it does on the live fabric. The connections of one receiving host share one credit scheduler,
as the receiving endpoint's do.

What the endpoints would have written (transport.core.schema's SenderMetrics and ReceiverMetrics) is
built from the same connections' metrics, and the controller's link counters are sampled on the
virtual clock, so experiments.results reads a simulated arm exactly as a live one. Where the live
arm reports CPU fidelity, a simulated one reports its own counters (`sim`): events, packet-hops,
wall time, events/s and peak memory.
"""

from __future__ import annotations

import logging
import random
import resource
import time
from dataclasses import dataclass, field, replace
from typing import Any

from emulator.sim.fabric import SimFabric, SimSettings
from experiments.analysis.framing import srd_framing, topology_base_rtt
from experiments.analysis.links import fabric_hops, window_bytes
from experiments.analysis.placement import host_rate_mbps
from experiments.arms import Flow
from experiments.arms.srd import arm_evs, port_stride
from experiments.model import Arm, Experiment, Fault, Workload, act
from experiments.schema import RawArm
from topologies import Topology
from transport.core.config import TransportConfig, path_ack_delay
from transport.core.connection import Connection
from transport.core.contract import DEFAULT_BASE_PORT, DEFAULT_PORT, NUM_EVS
from transport.core.credit import CreditScheduler
from transport.core.events import Event, MessageAcked, MessageReceived
from transport.core.headers import datagram_size_for_mtu
from transport.core.schema import base_rto_s
from transport.io.defaults import ENDPOINT_ACK_BATCH, ENDPOINT_ACK_DELAY, ENDPOINT_PACING_PACKETS
from transport.io.receiver import AMPLIFICATION
from transport.io.sender import summarize
from transport.io.workload import make_payload, payload_seq
from transport.sim.netsim import IPPROTO_UDP, CreditHost, Endpoint, Waker

log = logging.getLogger(__name__)

# Link samples per arm (the live sampler takes one every 0.5 s; a simulated arm lasts microseconds to
# seconds, so it samples a fixed number of times over the time its flows should take).
SAMPLES = 40
# The answer to each request of a request/response workload (experiments.arms.srd: `--response-size 64`).
RESPONSE_SIZE = 64
CLOSED_LOOP = 8  # requests outstanding (`--closed-loop 8`)
# Arm kinds the simulated engine runs (the transport's own); the others need programs it cannot run.
KINDS = ("srd",)


class SimUnsupported(ValueError):
    """What an arm asks for that the simulated engine does not model (yet): one line saying so."""


def check_arm(arm: Arm, workload: Workload) -> None:
    if arm.kind not in KINDS:
        raise SimUnsupported(f"arm {arm.name} runs {arm.kind}, which the simulated engine does not model "
                             f"(it runs the transport's own arms: {', '.join(KINDS)}); choose other arms with "
                             "--arms, or run it on the live engine")


# Below this base RTT a fabric runs at the field's scale (microseconds: 100 Gb/s, 1 µs hops), which the
# live emulator never reaches (its RTTs are milliseconds); there the endpoints' clocks, tuned for
# milliseconds, are scaled to the fabric (field_scale).
FIELD_RTT_S = 0.001


def field_scale(base_rtt: float) -> dict[str, float]:
    """The endpoint's clocks for a microsecond fabric, in base RTTs: the first RTT guess is the base RTT
    (not 5 ms), the RTO floor 20 base RTTs (not 5 ms), the delay controller's queueing target one base
    RTT (its floor of 16 packets still applies), an ACK held at most a quarter of a base RTT (not 10 ms)
    and believed held that long, and a pacer's wake-up covers a quarter of a base RTT (not 1 ms, which at
    100 Gb/s is 3,000 packets)."""
    quarter = base_rtt / 4
    return {"initial_rtt": base_rtt, "rto_min": 20 * base_rtt, "target_delay": base_rtt,
            "ack_delay": quarter, "max_ack_delay": quarter, "pacing_quantum": quarter}


def endpoint_config(arm: Arm, mtu: int, link_rate_mbps: float, base_rtt: float) -> TransportConfig:
    """The TransportConfig `srd send` / `srd recv` build from the options the live arm gives them
    (cli/srd.py's _config with experiments.arms.srd's options); on a microsecond fabric, with the
    clocks of field_scale."""
    fields: dict[str, Any] = {
        "delivery": arm.delivery, "recovery": arm.recovery,
        "ack_delay": path_ack_delay(ENDPOINT_ACK_DELAY, base_rtt), "ack_batch": ENDPOINT_ACK_BATCH,
        "pacing_packets": ENDPOINT_PACING_PACKETS, "ack_on_message": True,
        "link_rate_bps": link_rate_mbps * 1e6, "base_rtt": base_rtt, "mtu": mtu, "path_policy": arm.policy,
    }
    if 0 < base_rtt < FIELD_RTT_S:
        fields.update(field_scale(base_rtt))
    if arm.sender.cc:
        fields["cc"] = arm.sender.cc
    if arm.sender.evs is not None:
        fields["num_evs"] = arm.sender.evs
    if arm.sender.window is not None:
        fields["window"] = arm.sender.window
        fields["max_window"] = max(TransportConfig.max_window, arm.sender.window)
    config = TransportConfig(**fields)
    config.validate()
    return config


_ZEROS: dict[int, bytes] = {}


def zeros(n: int) -> bytes:
    """A message's payload: one shared buffer per size. The connection keeps a queued message whole
    and cuts its fragments as they leave, so 1,024 flows of 2 MB queued at once hold a few buffers, not
    2 GB (the live sender's verifiable payloads matter to no one here: nothing corrupts a datagram)."""
    buf = _ZEROS.get(n)
    if buf is None:
        buf = _ZEROS[n] = bytes(n)
    return buf


@dataclass
class SimFlow:
    """One flow's sending side as `srd send` runs it: a sized transfer or one for the duration."""

    index: int
    flow: Flow
    size: int  # bytes; 0 = until the duration ends
    message_size: int
    deadline: float  # when a flow for the duration stops submitting
    tx: Endpoint | None = None
    rx: Endpoint | None = None
    started: float | None = None
    submitted: int = 0
    seq: int = 0
    acked: int = 0
    messages_acked: int = 0
    limit: int = 8
    # Request/response (`srd send --request-response --closed-loop 8`, `srd recv --response-size 64`):
    # each message is answered, and its completion is the answer's arrival.
    request_response: bool = False
    response_size: int = RESPONSE_SIZE
    pending: dict[int, float] = field(default_factory=dict)  # request seq -> submitted at
    responses: int = 0
    response_bytes: int = 0
    await_ack: dict[int, tuple[int, float]] = field(default_factory=dict)  # msg id -> (bytes, submitted at)
    completion_times: list[float] = field(default_factory=list)
    completed_at: float | None = None
    stop_reason: str | None = None

    def more(self, now: float) -> bool:
        if self.size:
            return self.submitted < self.size
        return now < self.deadline

    def submit(self, now: float) -> None:
        conn = self.tx.conn  # type: ignore[union-attr]
        waiting = self.pending if self.request_response else self.await_ack
        while self.more(now) and len(waiting) < self.limit:
            n = self.message_size if not self.size else min(self.message_size, self.size - self.submitted)
            if self.request_response:
                msg = conn.send_message(make_payload(self.seq, n), now)
                self.pending[self.seq] = now
            else:
                msg = conn.send_message(zeros(n), now)
            self.await_ack[msg] = (n, now)
            self.submitted += n
            self.seq += 1

    def on_event(self, endpoint: Endpoint, event: Event, now: float) -> None:
        if isinstance(event, MessageAcked):
            got = self.await_ack.pop(event.msg_id, None)
            if got is not None:
                self.acked += got[0]
                self.messages_acked += 1
                if not self.request_response:
                    self.completion_times.append(now - got[1])
        elif isinstance(event, MessageReceived) and self.request_response:
            self.responses += 1
            self.response_bytes += len(event.data)
            t0 = self.pending.pop(payload_seq(event.data), None)
            if t0 is not None:
                self.completion_times.append(now - t0)
        else:
            return
        self.submit(now)
        if not self.await_ack and not self.pending and not self.more(now) and self.completed_at is None:
            self.completed_at = now
            self.stop_reason = "completed" if self.size else "duration"

    def answer(self, endpoint: Endpoint, event: Event, now: float) -> None:
        """The receiving side: every request is answered with `response_size` bytes naming it."""
        if isinstance(event, MessageReceived):
            endpoint.conn.send_message(make_payload(payload_seq(event.data), self.response_size), now)

    def start(self, now: float) -> None:
        self.started = now
        self.submit(now)
        self.tx.turn(now)  # type: ignore[union-attr]

    @property
    def done(self) -> bool:
        return self.completed_at is not None


def _keys(src_ip: str, dst_ip: str, base: int, evs: int) -> tuple[list, list]:
    data = [(src_ip, dst_ip, IPPROTO_UDP, base + ev, DEFAULT_PORT) for ev in range(evs)]
    acks = [(dst_ip, src_ip, IPPROTO_UDP, DEFAULT_PORT, base + ev) for ev in range(evs)]
    return data, acks


def settings_for(exp: Experiment) -> SimSettings:
    return SimSettings(reaction_s=float(exp.extra.get("controller_reaction_s") or 0.0),
                       queue_bytes=exp.extra.get("sim_queue_bytes"),
                       ecn_fraction=float(exp.extra.get("sim_ecn_fraction") or 0.0))


def expected_s(topo: Topology, flows: list[Flow], bytes_per_flow: int, duration: float) -> float:
    """How long the traffic should take: the duration, or for sized flows the busiest host link's bytes
    at its rate (twice, for headroom), after the last start."""
    if not bytes_per_flow:
        return duration
    load: dict[str, int] = {}
    for f in flows:
        for h in (f.src, f.dst):
            load[h] = load.get(h, 0) + (f.size or bytes_per_flow)
    rate = host_rate_mbps(topo) * 1e6
    last = max((f.start_s for f in flows), default=0.0)
    return last + 2 * max(load.values(), default=0) * 8 / rate + 1e-4


def add_flows(fab: SimFabric, arm: Arm, w: Workload, flows: list[Flow], seed: int, bytes_per_flow: int,
              duration: float, first_index: int = 0) -> tuple[list[SimFlow], int]:
    """Each flow's two connections on `fab`, configured, seeded and addressed as the live arm's, each
    started at its start time; (the flows, the source ports per flow leaving a host)."""
    topo, net = fab.topo, fab.net
    datagram = datagram_size_for_mtu(topo.mtu)
    rate = host_rate_mbps(topo)
    framing = srd_framing(datagram, w.message_size)
    rtt = [topology_base_rtt(topo, f.src, f.dst, framing) for f in flows]
    rx_rtt: dict[str, float] = {}
    for f, r in zip(flows, rtt, strict=True):
        rx_rtt[f.dst] = max(rx_rtt.get(f.dst, 0.0), r)
    rng = random.Random(seed + first_index)
    ip = {h.name: h.address for h in topo.hosts}
    credit: dict[str, CreditHost] = {}
    sims: list[SimFlow] = []
    evs = arm_evs(arm, topo)
    if arm.sender.evs is None and evs != NUM_EVS:
        arm = replace(arm, sender=replace(arm.sender, evs=evs))
    stride = port_stride(evs)
    for j, f in enumerate(flows):
        i = first_index + j
        tx_cfg = endpoint_config(arm, datagram, rate, rtt[j])
        rx_cfg = endpoint_config(arm, datagram, rate, rx_rtt[f.dst])
        cid = rng.getrandbits(32) or 1
        size = (f.size or bytes_per_flow) if bytes_per_flow else 0
        sf = SimFlow(i, f, size, w.message_size, deadline=f.start_s + duration)
        sf.limit = max(4, -(-2 * tx_cfg.max_window * tx_cfg.mtu // w.message_size)) if size else 8
        sf.request_response = w.request_response
        if w.request_response:
            sf.limit = CLOSED_LOOP
        data_keys, ack_keys = _keys(ip[f.src], ip[f.dst], DEFAULT_BASE_PORT + stride * f.index, tx_cfg.num_evs)
        tx = Endpoint(net, Connection(tx_cfg, cid, seed=seed * 1000 + i), fab.ids[f.src], data_keys, sf.on_event)
        rx = Endpoint(net, Connection(rx_cfg, cid, seed=cid), fab.ids[f.dst], ack_keys,
                      sf.answer if w.request_response else None)
        if w.request_response:
            rx.conn.limit_amplification(AMPLIFICATION)  # as `srd recv --response-size` does
        tx.peer, rx.peer = rx, tx
        if rx.conn.credit_receiver is not None:
            host = credit.get(f.dst)
            if host is None:
                host = credit[f.dst] = CreditHost(net, CreditScheduler.from_config(rx_cfg))
            host.attach(rx)
        sf.tx, sf.rx = tx, rx
        sims.append(sf)
        net.at(net.now + f.start_s, Waker(sf.start))
    return sims, stride


def run_arm_sim(exp: Experiment, arm: Arm, topo: Topology, flows: list[Flow], duration: float, seed: int,
                bytes_per_flow: int, reporter: Any = None) -> RawArm:
    """Run one arm on the simulated fabric; the raw record the live runner would have written."""
    wall0 = time.monotonic()
    cpu0 = time.process_time()
    w = arm.workload or exp.workload
    check_arm(arm, w)
    fab = SimFabric(topo, arm.mode, settings_for(exp), seed=seed)
    net = fab.net
    sims, stride = add_flows(fab, arm, w, flows, seed, bytes_per_flow, duration)
    ip = {h.name: h.address for h in topo.hosts}
    expected = expected_s(topo, flows, bytes_per_flow, duration)
    samples: list[dict[str, Any]] = []
    sample_every = expected / SAMPLES

    def sample(now: float) -> None:
        report = fab.links_report(now, samples[-1] if samples else None)
        samples.append({"t": now, "time": now, "links": report["links"]})
        if not all_done():
            net.at(now + sample_every, Waker(sample))

    fault_log: list[dict[str, Any]] = []
    fault_errors: list[str] = []

    def apply(fault: Fault, now: float) -> None:
        a, b = fault.a, fault.b
        if a == "auto":
            a, b = _busiest_fabric_link(topo, samples)
        try:
            act(fab, fault.kind, a, b, fault.value)
        except ValueError as exc:
            fault_errors.append(f"fault {fault.describe()}: {exc}")
            return
        fault_log.append({"kind": fault.kind, "a": a, "b": b, "value": fault.value, "planned_s": fault.at_s,
                          "at_s": round(now, 9)})

    for fault in sorted(arm.faults, key=lambda f: f.at_s):
        if fault.at_s <= 0:
            apply(fault, 0.0)
        else:
            net.at(fault.at_s, Waker(lambda now, fault=fault: apply(fault, now)))

    def all_done() -> bool:
        return all(sf.done for sf in sims)

    last_report = [time.monotonic()]

    def done() -> bool:
        if reporter is not None and time.monotonic() - last_report[0] > 0.2:
            last_report[0] = time.monotonic()
            reporter.arm_progress(min(0.99, net.now / max(expected, 1e-12)),
                                  f"virtual {_seconds(net.now)} of ~{_seconds(expected)}")
        return all_done()

    sample(0.0)
    last_start = max((f.start_s for f in flows), default=0.0)
    # As the live sender's own cap: a sized flow gives up after 3x the duration plus 5 s.
    limit = last_start + (3 * duration + 5 if bytes_per_flow else duration + 1.0)
    end = net.run(until=limit, done=done)
    for sf in sims:
        if sf.completed_at is None:
            sf.stop_reason = "duration" if not sf.size else "time limit"
    traffic_s = max([sf.completed_at for sf in sims if sf.completed_at is not None] or [end])
    samples.append({"t": traffic_s, "time": traffic_s,
                    "links": fab.links_report(traffic_s, samples[-1] if samples else None)["links"]})
    wall = time.monotonic() - wall0
    net.count_hops()
    c = net.counters
    raw: RawArm = {
        "engine": "sim",
        "samples": samples, "cpu": [], "t0": 0.0, "t0_unix": time.time(), "traffic_s": round(traffic_s, 9),
        "last_start_s": last_start, "faults": fault_log, "fault_times": [f["at_s"] for f in fault_log],
        "fault_errors": fault_errors, "endpoint_errors": [], "events": {"rule_changes": fab.rule_changes},
        "endpoints": _endpoints(sims, ip, stride), "datapath": "simulated",
        "loss_method": "simulated" if fault_log or any(lk.loss_pct for lk in topo.links) else None,
        "qdisc_before": {}, "qdisc_after": _port_drops(fab),
        "bring_up_s": 0.0, "teardown_s": 0.0, "wall_s": round(wall, 3),
        "sim": {"events": c.events, "packet_hops": c.packet_hops, "delivered": c.delivered,
                "undeliverable": c.undeliverable, "virtual_s": round(traffic_s, 9), "wall_s": round(wall, 3),
                "cpu_s": round(time.process_time() - cpu0, 3),
                "events_per_s": round(c.events / wall) if wall > 0 else None,
                "peak_memory_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)},
    }
    return raw


def _seconds(t: float) -> str:
    return f"{t * 1e6:.0f} µs" if t < 1e-3 else f"{t * 1e3:.1f} ms" if t < 1 else f"{t:.2f} s"


def _busiest_fabric_link(topo: Topology, samples: list[dict[str, Any]]) -> tuple[str, str]:
    """The switch-to-switch link direction that carried most bytes in the last samples."""
    fabric = fabric_hops(topo)
    _, nbytes, _ = window_bytes(samples[-3:])
    best = max(((b, name, src) for (name, src), b in nbytes.items() if name in fabric), default=None)
    if best is None:
        lk = next(lk for lk in topo.links if lk.name in fabric)
        return lk.a, lk.b
    _, name, src = best
    lk = next(lk for lk in topo.links if lk.name == name)
    return src, lk.peer(src)


def _port_drops(fab: SimFabric) -> dict[str, dict[str, int]]:
    """Per sending interface, as `tc -s qdisc` reports it: packets sent and queue drops."""
    out = {}
    for lk, ports in fab.link_ports.items():
        for end, port in zip((lk.a, lk.b), ports, strict=True):
            out[lk.intf(end)] = {"sent_packets": port.stats.packets, "dropped": port.stats.queue_drops}
    return out


def _endpoints(sims: list[SimFlow], ip: dict[str, str | None], stride: int) -> dict[str, Any]:
    """What each live endpoint would have written: a sender's file per flow, a receiver's per host."""
    out: dict[str, Any] = {}
    receivers: dict[str, list[dict[str, Any]]] = {}
    for sf in sims:
        tx, rx = sf.tx, sf.rx
        assert tx is not None and rx is not None
        f = sf.flow
        started = sf.started if sf.started is not None else f.start_s
        end = sf.completed_at if sf.completed_at is not None else (
            min(sf.deadline, tx.net.now) if not sf.size else tx.net.now)
        dur = max(1e-12, end - started)
        metrics = tx.conn.metrics()
        base = DEFAULT_BASE_PORT + stride * f.index
        out[f"send-{sf.index}-{f.src}-{f.dst}"] = {
            "role": "sender", "destination": f"{ip[f.dst]}:{DEFAULT_PORT}", "connection_id": tx.conn.connection_id,
            "completed": sf.completed_at is not None and bool(sf.size), "stop_reason": sf.stop_reason,
            "duration": dur, "bytes": sf.acked, "bytes_submitted": sf.submitted, "goodput_bps": 8 * sf.acked / dur,
            "messages": sf.messages_acked, "messages_submitted": sf.seq,
            "responses": sf.responses, "response_bytes": sf.response_bytes,
            "completion_times": summarize(sf.completion_times), "datagrams_sent": tx.sent,
            "datagrams_received": tx.datagrams_received, "pps_sent": tx.sent / dur,
            "ev_datagrams_sent": list(tx.ev_sent), "ev_datagrams_received": list(tx.ev_received),
            "base_port": base, "source_ports": [base + ev for ev in range(len(tx.keys))], "send_errors": 0,
            "refused": 0, "socket_drops": 0,
            "workload": {"total_bytes": sf.size, "messages": 0, "size": sf.message_size, "rate": 0.0,
                         "outstanding": sf.limit, "request_response": sf.request_response},
            "config": tx.conn.config.to_dict(), "rto_s": base_rto_s(metrics), "connection": metrics,
        }
        receivers.setdefault(f.dst, []).append({"connection_id": rx.conn.connection_id,
                                                "source": f"{ip[f.src]}", "transport": rx.conn.metrics()})
    for dst, conns in receivers.items():
        out[f"recv-{dst}"] = {"role": "receiver", "connections": conns, "socket_drops": 0}
    return out
