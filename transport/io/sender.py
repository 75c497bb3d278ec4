"""The srd sender: one connection to a receiver, a `Workload`, and one UDP socket per entropy value.

Each socket is bound to `base_port + ev`, so the low bits of the UDP source port carry the EV the
connection chose for each packet. The fabric's spray mode maps those low bits to an uplink (ECMP
hashes them), so choosing an EV chooses a path. With a base port that is a multiple of 16 the low
four bits of the source port equal the EV. The sockets are connected, so `send` needs no address.
"""

from __future__ import annotations

import errno
import logging
import socket
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from transport.core.config import TransportConfig
from transport.core.connection import Connection
from transport.core.contract import DEFAULT_BASE_PORT, DEFAULT_PORT, PORT_ALIGNMENT, base_port_problem, is_aligned
from transport.core.events import Event, MessageAcked, MessageReceived
from transport.core.metrics import quantiles
from transport.core.pump import Pump, earliest
from transport.core.schema import SenderMetrics, base_rto_s
from transport.io.addressing import resolve
from transport.io.eventloop import EndpointError, EventLoop, SendCounters, SocketSender, socket_drops
from transport.io.incarnation import fresh_connection_id
from transport.io.workload import Workload, make_payload, payload_seq

log = logging.getLogger(__name__)


def summarize(values: list[float]) -> dict[str, float | int]:
    """count/mean/p50/p90/p99/max of a list of durations, without numpy (not on the hot path)."""
    if not values:
        return {"count": 0}
    ordered = sorted(values)
    n = len(ordered)
    p50, p90, p99 = quantiles(ordered, (50, 90, 99), interpolate=False) or ()
    return {
        "count": n,
        "mean": sum(ordered) / n,
        "min": ordered[0],
        "p50": p50,
        "p90": p90,
        "p99": p99,
        "max": ordered[-1],
    }


class Sender(EventLoop):
    """Drives one connection to a receiver, sending a `Workload` over one socket per EV."""

    role = "sender"

    def __init__(
        self,
        config: TransportConfig,
        host: str,
        port: int = DEFAULT_PORT,
        workload: Workload | None = None,
        *,
        bind: str | None = None,
        base_port: int = DEFAULT_BASE_PORT,
        duration: float | None = None,
        seed: int = 0,
        connection_id: int | None = None,
        connect_timeout: float = 5.0,
        progress: Callable[[dict[str, Any]], None] | None = None,
        on_response: Callable[[int, bytes], None] | None = None,
    ) -> None:
        super().__init__(config, duration=duration, progress=progress)
        self.workload = workload or Workload(total_bytes=1 << 20)
        self.workload.validate()
        if base_port and (problem := base_port_problem(base_port, config.num_evs)):
            raise EndpointError(problem)
        if base_port and not is_aligned(base_port):
            log.warning("base port %d is not a multiple of %d: source port low bits != EV", base_port, PORT_ALIGNMENT)
        self.family, self.dest = resolve(host, port)
        self.host, self.port = host, port
        self.bind = bind if bind is not None else ("::" if self.family == socket.AF_INET6 else "0.0.0.0")
        self.base_port = base_port
        self.seed = seed
        self.connect_timeout = connect_timeout
        self.on_response = on_response
        if connection_id is None:
            connection_id = fresh_connection_id()  # a restart is never matched to old receiver state
        self.connection_id = connection_id
        self.conn = Connection(config, connection_id, seed=seed)
        self.socks: list[socket.socket] = []
        # Workload state
        self._seq = 0
        self._bytes_submitted = 0
        self._submit_time: dict[int, float] = {}  # msg_id -> time (one-way) / seq -> time (rr)
        self._await_ack: dict[int, int] = {}  # msg_id -> size
        self._next_at = 0.0
        limit = self.workload.outstanding
        if not limit:
            if self.workload.rate:
                limit = 1 << 30  # open loop: no cap
            elif self.workload.total_bytes:
                # Enough queued to keep the largest window full with room to spare.
                limit = max(4, -(-2 * config.max_window * config.mtu // self.workload.size))
            else:
                limit = 8
        self._limit = limit
        # Counters
        self.completion_times: list[float] = []
        self.messages_acked = 0
        self.bytes_acked = 0
        self.responses = 0
        self.response_bytes = 0
        self.datagrams_received = 0
        self.ev_sent = [0] * config.num_evs
        self.ev_received = [0] * config.num_evs
        self.sent = SendCounters()
        self.pump: Pump | None = None  # once the sockets are open
        self.first_reply: float | None = None
        self.completed = False
        self.completed_at: float | None = None

    # -- setup ---------------------------------------------------------------------------------------

    def open(self) -> None:
        for ev in range(self.config.num_evs):
            s = socket.socket(self.family, socket.SOCK_DGRAM)
            port = self.base_port + ev if self.base_port else 0
            try:
                s.bind((self.bind, port))
            except OSError as exc:
                s.close()
                self._close_socks()
                if exc.errno == errno.EADDRINUSE:
                    raise EndpointError(
                        f"source port {port} (base port {self.base_port} + EV {ev}) is in use; "
                        f"choose another --base-port (a multiple of {PORT_ALIGNMENT})"
                    ) from exc
                raise EndpointError(f"cannot bind {self.bind}:{port}: {exc.strerror}; check --bind") from exc
            try:
                s.connect(self.dest)
            except OSError as exc:
                s.close()
                self._close_socks()
                raise EndpointError(f"cannot reach {self.host}:{self.port}: {exc.strerror}") from exc
            self._register(s, partial(self._drain, s.recv, ev))
            self.socks.append(s)
        sends = [s.send for s in self.socks]
        self.pump = Pump(self.conn, SocketSender(lambda dgram, ev: sends[ev](dgram), self.sent, self.ev_sent),
                         self._on_event)

    def _close_socks(self) -> None:
        for s in self.socks:
            s.close()
        self.socks = []

    # -- workload ------------------------------------------------------------------------------------

    def _more(self) -> bool:
        w = self.workload
        if w.total_bytes:
            return self._bytes_submitted < w.total_bytes
        if w.messages:
            return self._seq < w.messages
        return True  # unbounded: until the duration ends or stop()

    def _submit(self, now: float) -> None:
        w = self.workload
        size = w.size
        if w.total_bytes:
            size = min(size, w.total_bytes - self._bytes_submitted)
        seq = self._seq
        self._seq += 1
        self._bytes_submitted += size
        msg_id = self.conn.send_message(make_payload(seq, size), now)
        self._await_ack[msg_id] = size
        self._submit_time[seq if w.request_response else msg_id] = now

    def _outstanding(self) -> int:
        return len(self._submit_time)

    def _submit_due(self, now: float) -> float | None:
        """Submit what the workload allows now; return when it next wants to submit (open loop)."""
        w = self.workload
        if w.rate:
            if not self._next_at:
                self._next_at = now
            interval = 1.0 / w.rate
            while self._next_at <= now and self._more() and self._outstanding() < self._limit:
                self._submit(now)
                self._next_at += interval
            return self._next_at if self._more() else None
        while self._more() and self._outstanding() < self._limit:
            self._submit(now)
        return None

    # -- loop ----------------------------------------------------------------------------------------

    def _turn(self, now: float) -> float | None:
        pump = self.pump
        assert pump is not None, "call open() first"
        pump.fire(now)
        pump.events(now)
        wake = self._submit_due(now)
        pump.flush(now)
        if not self._more() and not self._submit_time and not self._await_ack:
            if not self.completed:
                self.completed = True
                self.completed_at = now
            # Responses still need their ACKs to leave before we go.
            self.stop("completed")
            return None
        if self.first_reply is None and now - self.started > self.connect_timeout:
            self._no_receiver()
        wake = earliest(wake, (pump,))
        if self.first_reply is None:
            limit = self.started + self.connect_timeout
            if wake is None or limit < wake:
                wake = limit
        return wake

    def _no_receiver(self) -> None:
        where = f"{self.host}:{self.port}"
        if self.sent.refused:
            raise EndpointError(
                f"no receiver at {where} (connection refused); start `fabriclab srd recv --port {self.port}` "
                "there first or fix --to"
            )
        detail = f" ({self.sent.last_error})" if self.sent.last_error else ""
        raise EndpointError(
            f"no reply from {where} within {self.connect_timeout:g} s{detail}; check --to and that "
            "`fabriclab srd recv` runs there"
        )

    def _drain(self, recv: Callable[[int], bytes], ev: int, now: float) -> int:
        # One datagram per readiness report: ACKs are spread over the EV sockets, so a socket
        # rarely holds more than one, and the loop re-polls (one syscall for all sockets) rather
        # than paying a failing recv() on each.
        try:
            data = recv(self._recv_size)
        except BlockingIOError:
            return 0
        except ConnectionRefusedError:
            self.sent.refused += 1
            return 0
        except OSError as exc:
            self.sent.last_error = exc.strerror or str(exc)
            return 0
        self.conn.receive_datagram(data, now)
        self.datagrams_received += 1
        self.ev_received[ev] += 1
        if self.first_reply is None:
            self.first_reply = now
        return 1

    def _on_event(self, event: Event, now: float) -> None:
        rr = self.workload.request_response
        if isinstance(event, MessageAcked):
            self.bytes_acked += self._await_ack.pop(event.msg_id, 0)
            self.messages_acked += 1
            if not rr:
                t0 = self._submit_time.pop(event.msg_id, None)
                if t0 is not None:
                    self.completion_times.append(now - t0)
        elif isinstance(event, MessageReceived):
            data = event.data
            self.responses += 1
            self.response_bytes += len(data)
            if rr:
                t0 = self._submit_time.pop(payload_seq(data), None)
                if t0 is not None:
                    self.completion_times.append(now - t0)
            if self.on_response is not None:
                self.on_response(event.msg_id, data)

    # -- results -------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Open the sockets (unless open), run until done / duration / stop(), return metrics."""
        if not self.socks:
            self.open()
        try:
            self._run_loop()
            self.on_loop_end(time.monotonic())
            return self.results()
        finally:
            self.close()

    def results(self) -> SenderMetrics:
        """The metrics once the loop has ended, with what the kernel dropped on the sockets (read
        in their network namespace)."""
        self._socket_drops = socket_drops(self.socks)
        return self.metrics()

    def on_loop_end(self, now: float) -> None:
        # One last flush so that ACKs for responses received in the final turn leave.
        if self.pump is not None:
            self.pump.flush(now)

    def snapshot(self) -> dict[str, Any]:
        elapsed = max(1e-9, time.monotonic() - self.started)
        return {
            "role": self.role,
            "elapsed": elapsed,
            "bytes": self._bytes_submitted,
            "bytes_acked": self.bytes_acked,
            "messages_acked": self.messages_acked,
            "messages_submitted": self._seq,
            "goodput_bps": 8 * self.bytes_acked / elapsed,
        }

    def metrics(self) -> SenderMetrics:
        end = self.completed_at or self.finished or time.monotonic()
        duration = max(1e-9, end - self.started)
        acked = self.bytes_acked
        return {
            **self.cpu_metrics(),
            "role": self.role,
            "destination": f"{self.host}:{self.port}",
            "connection_id": self.connection_id,
            "completed": self.completed,
            "stop_reason": self.stop_reason,
            "duration": duration,
            "bytes": acked,
            "bytes_submitted": self._bytes_submitted,
            "goodput_bps": 8 * acked / duration,
            "messages": self.messages_acked,
            "messages_submitted": self._seq,
            "responses": self.responses,
            "response_bytes": self.response_bytes,
            "completion_times": summarize(self.completion_times),
            "datagrams_sent": self.sent.datagrams_sent,
            "datagrams_received": self.datagrams_received,
            "pps_sent": self.sent.datagrams_sent / duration,
            "ev_datagrams_sent": list(self.ev_sent),
            "ev_datagrams_received": list(self.ev_received),
            "base_port": self.base_port,
            "source_ports": [s.getsockname()[1] for s in self.socks] if self.socks else [],
            "send_errors": self.sent.send_errors,
            "refused": self.sent.refused,
            "socket_drops": getattr(self, "_socket_drops", None),
            "workload": {
                "total_bytes": self.workload.total_bytes,
                "messages": self.workload.messages,
                "size": self.workload.size,
                "rate": self.workload.rate,
                "outstanding": self._limit if self._limit < (1 << 30) else 0,
                "request_response": self.workload.request_response,
            },
            "config": self.config.to_dict(),
            **_connection_and_rto(self.conn),
        }


def _connection_and_rto(conn: Connection) -> dict[str, Any]:
    """The sender's `connection` metrics and `rto_s`, the RTO its own rule gives (transport.core.schema)."""
    metrics = conn.metrics()
    return {"rto_s": base_rto_s(metrics), "connection": metrics}
