"""UDP endpoints that drive sans-I/O transport `Connection`s over real sockets.

The protocol core never touches a clock or a socket; this module is the thin I/O shell around it: a
single-threaded, non-blocking event loop built on epoll (`select.epoll`) and `time.monotonic`.

* `Sender` opens one UDP socket per entropy value (EV), bound to `base_port + ev`, so the low bits of
  the UDP source port carry the EV the connection chose for each packet. The fabric's spray mode maps
  those low bits to an uplink (ECMP hashes them), so choosing an EV chooses a path. With a base port
  that is a multiple of 16 the low four bits of the source port equal the EV.
* `Receiver` listens on one port, demultiplexes datagrams by (peer IP, connection id) — the peer's
  source *port* varies with the EV, so it cannot be part of the key — creates a `Connection` on the
  first valid DATA packet of an unknown connection, and sends each ACK to the source address of the
  DATA packet that triggered it (the ACK names that packet's EV); the sender reads all its EV sockets.

The hot path avoids per-packet work that is not strictly needed: sockets are connected (so `send`
needs no address), sends and receives are batched per loop turn, bound methods are hoisted out of the
loops, and nothing is logged per packet. This module never imports scapy.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import select
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transport import wire
from transport.config import TransportConfig
from transport.connection import Connection
from transport.events import MessageAcked, MessageReceived
from transport.metrics import preload as preload_metrics

log = logging.getLogger(__name__)

DEFAULT_PORT = 7471
# A multiple of 16, so that source port & 0xF == EV for up to 16 EVs.
DEFAULT_BASE_PORT = 40000
# Socket buffers large enough to absorb a window's worth of packets between two loop turns; the
# kernel silently caps them at net.core.{r,w}mem_max.
SOCKET_BUFFER_BYTES = 4 << 20
# At most this many datagrams are read from one socket per loop turn, so that ACKs and new data are
# sent between bursts instead of after an arbitrarily long drain.
RECV_BATCH = 256
# Timers closer than this are waited for by polling, not sleeping (see _Loop._run_loop): a sleep
# and its wake-up cost tens of microseconds, more than such a gap.
SPIN_BELOW = 0.00005
# Sequence-number prefix of generated messages: lets receivers verify content and lets request /
# response workloads match a response to its request in unordered delivery.
SEQ_LEN = 8
_PATTERN = bytes(range(256)) * 2
_TYPE_DATA = wire.TYPE_DATA
_TYPE_OFFSET = wire.TYPE_OFFSET
_EV_OFFSET = wire.EV_OFFSET


class EndpointError(Exception):
    """Bad input or environment at the socket level (address in use, no receiver, unreachable)."""


# --------------------------------------------------------------------------------------------------
# Workloads and payloads


@dataclass
class Workload:
    """What a sender sends.

    bulk:        `total_bytes` > 0, split into messages of `size` bytes, kept flowing closed-loop.
    messages:    `messages` messages of `size` bytes (0 = until the duration ends); open loop at
                 `rate` messages/s, or closed loop with `outstanding` messages unacknowledged.
    request_response: each message waits for a response from the receiver (echo or fixed size),
                 which is what counts as its completion.
    """

    total_bytes: int = 0
    messages: int = 0
    size: int = 65536
    rate: float = 0.0
    outstanding: int = 0
    request_response: bool = False

    def validate(self) -> None:
        if self.total_bytes < 0:
            raise EndpointError(f"bytes must be >= 0, got {self.total_bytes}")
        if self.messages < 0:
            raise EndpointError(f"messages must be >= 0, got {self.messages}")
        if self.size < 1:
            raise EndpointError(f"message size must be >= 1, got {self.size}")
        if self.rate < 0:
            raise EndpointError(f"rate must be >= 0, got {self.rate}")
        if self.outstanding < 0:
            raise EndpointError(f"outstanding must be >= 0, got {self.outstanding}")
        if self.request_response and self.size < SEQ_LEN:
            raise EndpointError(f"request/response messages need at least {SEQ_LEN} bytes")

    @property
    def unbounded(self) -> bool:
        return self.total_bytes == 0 and self.messages == 0


def make_payload(seq: int, size: int) -> bytes:
    """A message of `size` bytes: big-endian `seq`, then a pattern that shifts with `seq`."""
    head = seq.to_bytes(SEQ_LEN, "big")
    if size <= SEQ_LEN:
        return head[:size]
    body_len = size - SEQ_LEN
    start = seq & 0xFF
    if body_len <= 256:
        return head + _PATTERN[start : start + body_len]
    reps, rest = divmod(body_len, 256)
    block = _PATTERN[start : start + 256]
    return head + block * reps + block[:rest]


def payload_seq(data: bytes) -> int:
    return int.from_bytes(data[:SEQ_LEN], "big")


def check_payload(data: bytes) -> bool:
    """True when `data` is exactly what `make_payload` produces for its own sequence prefix."""
    return len(data) >= SEQ_LEN and data == make_payload(payload_seq(data), len(data))


# --------------------------------------------------------------------------------------------------
# Helpers


def summarize(values: list[float]) -> dict[str, float | int]:
    """count/mean/p50/p90/p99/max of a list of durations, without numpy (not on the hot path)."""
    if not values:
        return {"count": 0}
    ordered = sorted(values)
    n = len(ordered)

    def pct(p: float) -> float:
        return ordered[min(n - 1, int(p * n))]

    return {
        "count": n,
        "mean": sum(ordered) / n,
        "min": ordered[0],
        "p50": pct(0.50),
        "p90": pct(0.90),
        "p99": pct(0.99),
        "max": ordered[-1],
    }


def socket_drops(socks: list[socket.socket]) -> int | None:
    """Datagrams the kernel dropped on these sockets (receive buffer full), from /proc/net/udp*.

    Read once at the end of a run: cheaper than asking for SO_RXQ_OVFL ancillary data per packet.
    Returns None where /proc is not available.
    """
    inodes = set()
    for s in socks:
        try:
            inodes.add(os.fstat(s.fileno()).st_ino)
        except OSError:
            continue
    total = 0
    found = False
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            with open(table) as fh:
                lines = fh.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            # Columns: sl local rem st tx:rx tr:when retrnsmt uid timeout inode ref pointer drops
            if len(cols) >= 13 and cols[9].isdigit() and int(cols[9]) in inodes:
                total += int(cols[12])
                found = True
    return total if found else None


def resolve(host: str, port: int) -> tuple[int, tuple[Any, ...]]:
    """(address family, socket address) for a UDP destination, or an EndpointError saying why not."""
    if not 0 <= port <= 65535:
        raise EndpointError(f"port {port} is out of range; use 1-65535")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise EndpointError(f"cannot resolve {host!r}: {exc}; give an IP address or a known host name") from exc
    family, _, _, _, sockaddr = infos[0]
    return family, sockaddr


# IPv4 / IPv6 header plus UDP header: what the path MTU holds besides one transport datagram.
_IP_UDP_OVERHEAD = {socket.AF_INET: 20 + 8, socket.AF_INET6: 40 + 8}
# Linux socket options (not exported by every Python build): the route's MTU on a connected socket.
_IP_MTU = getattr(socket, "IP_MTU", 14)
_IPV6_MTU = getattr(socket, "IPV6_MTU", 24)


# `--mtu auto` never goes above a jumbo Ethernet frame: loopback's 64 KiB MTU would make one datagram
# hold a whole window and shrink the receiver's reassembly window to a handful of packets.
AUTO_MTU_CAP = 9000


def path_datagram_size(host: str, port: int) -> int:
    """The largest UDP payload that crosses the path to host:port unfragmented: the route's MTU (the
    outgoing interface's, or a learned smaller path MTU, at most AUTO_MTU_CAP) less the IP and UDP
    headers."""
    family, dest = resolve(host, port)
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect(dest)  # no packet leaves: it only picks the route
            if family == socket.AF_INET6:
                mtu = s.getsockopt(socket.IPPROTO_IPV6, _IPV6_MTU)
            else:
                mtu = s.getsockopt(socket.IPPROTO_IP, _IP_MTU)
        except OSError as exc:
            raise EndpointError(f"cannot find the path MTU to {host}: {exc.strerror}; give --mtu BYTES") from exc
    return min(mtu, AUTO_MTU_CAP) - _IP_UDP_OVERHEAD.get(family, 28)


def local_datagram_size(bind: str) -> int:
    """For a receiver: the largest UDP payload its interfaces take unfragmented, from the MTU of the
    interface that holds `bind` (of the largest non-loopback interface for a wildcard address)."""
    mtus: dict[str, int] = {}
    for name in os.listdir("/sys/class/net"):
        try:
            mtus[name] = int(Path(f"/sys/class/net/{name}/mtu").read_text())
        except (OSError, ValueError):
            continue
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    chosen = None
    if bind not in ("0.0.0.0", "::", ""):
        chosen = _interface_of(bind, family)
    mtu = mtus[chosen] if chosen in mtus else max((m for n, m in mtus.items() if n != "lo"), default=1500)
    return min(mtu, AUTO_MTU_CAP) - _IP_UDP_OVERHEAD[family]


def _interface_of(addr: str, family: int) -> str | None:
    """The interface whose address is `addr`: the kernel routes a local address through `lo`, so ask
    which interface a socket bound to it would leave by toward that interface's own subnet instead."""
    import fcntl  # Linux only, like the rest of this lookup

    if family != socket.AF_INET:
        return None
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                req = struct.pack("256s", name.encode()[:15])
                got = fcntl.ioctl(s.fileno(), siocgifaddr, req)
            except OSError:
                continue
            if socket.inet_ntoa(got[20:24]) == addr:
                return name
    return None


def announce_ready(path: str | None) -> None:
    """Create `path` (atomically) once the endpoint's sockets are open: the runner starts traffic only
    when every endpoint has done so, so start-up (imports, binding) stays out of the measured window."""
    if path:
        preload_metrics()
        write_json({"pid": os.getpid(), "t": time.monotonic()}, path)


def write_json(metrics: dict[str, Any], path: str | None) -> None:
    """Write metrics as JSON to `path` atomically (a reader never sees half a file)."""
    if not path:
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(metrics, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


def _tune(sock: socket.socket) -> None:
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)
        except OSError:  # pragma: no cover - some sandboxes forbid it; defaults still work
            pass
    sock.setblocking(False)


# --------------------------------------------------------------------------------------------------
# Event loop


class _Poller:
    """Readiness of a few sockets: `select.epoll` on Linux, `select.poll` elsewhere.

    Used directly rather than through `selectors`, whose per-call wrapping (key objects, a result
    list) costs more than the poll itself at tens of thousands of turns per second. Timeouts are in
    seconds; None blocks.
    """

    def __init__(self) -> None:
        if hasattr(select, "epoll"):
            self._ep = select.epoll()
            self._ms = False
        else:  # pragma: no cover - not Linux
            self._ep = select.poll()
            self._ms = True
        self._fds: list[int] = []
        self._select_ok = True

    def register(self, fd: int) -> None:
        self._ep.register(fd, select.POLLIN)
        self._fds.append(fd)
        # select() only takes descriptors below FD_SETSIZE (1024 on Linux).
        self._select_ok = self._select_ok and fd < 1024

    def poll(self, timeout: float | None) -> list[tuple[int, int]]:
        if timeout is not None and 0 < timeout < 0.001:
            if not self._select_ok:
                return self._ep.poll(0)  # the caller comes straight back: a spin, not a sleep
            # epoll and poll round timeouts up to whole milliseconds, far longer than an ACK delay
            # or a pacing gap; select() sleeps with microsecond resolution (and costs more per
            # call, which only matters when it sleeps anyway).
            readable = select.select(self._fds, [], [], timeout)[0]
            return [(fd, select.POLLIN) for fd in readable]
        if self._ms:  # pragma: no cover
            return self._ep.poll(None if timeout is None else timeout * 1000.0)
        return self._ep.poll(-1 if timeout is None else timeout)

    def close(self) -> None:
        if not self._ms:
            self._ep.close()


class _Loop:
    """Shared machinery: a poller, a wake-up socket pair for `stop()`, deadlines, progress."""

    role = "endpoint"

    def __init__(
        self,
        config: TransportConfig,
        *,
        duration: float | None = None,
        progress: Callable[[dict[str, Any]], None] | None = None,
        progress_interval: float = 0.5,
    ) -> None:
        config.validate()
        self.config = config
        self.duration = duration
        self.progress = progress
        self.progress_interval = progress_interval
        self._poller = _Poller()
        self._handlers: dict[int, Any] = {}  # fd -> what _drain needs for it
        self._owned: list[socket.socket] = []
        # stop() may be called from a signal handler or another thread: writing one byte to this
        # pair wakes the poll at once instead of waiting for the next timer.
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._wake_fd = self._wake_r.fileno()
        self._poller.register(self._wake_fd)
        self._stopping = False
        self.stop_reason = ""
        self.started = 0.0
        self.finished = 0.0
        self._cpu_started: float | None = None  # process CPU seconds when the loop started / ended
        self._cpu_finished: float | None = None
        self._next_progress = 0.0
        self._recv_size = max(65535, config.mtu + 64)

    def _register(self, sock: socket.socket, handler: Any) -> None:
        self._poller.register(sock.fileno())
        self._handlers[sock.fileno()] = handler
        self._owned.append(sock)

    def stop(self, reason: str = "stopped") -> None:
        """Ask the loop to finish its current turn and return; safe from signal handlers."""
        if not self._stopping:
            self.stop_reason = reason
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def close(self) -> None:
        for sock in (*self._owned, self._wake_r, self._wake_w):
            try:
                sock.close()
            except OSError:
                pass
        self._poller.close()

    # Subclasses fill these in.
    def _turn(self, now: float) -> float | None:  # returns the next wake-up time
        raise NotImplementedError

    def _drain(self, handler: Any, now: float) -> int:  # returns datagrams read
        raise NotImplementedError

    def snapshot(self) -> dict[str, Any]:
        raise NotImplementedError

    def _run_loop(self) -> None:
        mono = time.monotonic
        poll = self._poller.poll
        handlers = self._handlers
        drain = self._drain
        wake_fd = self._wake_fd
        self.started = mono()
        self._cpu_started = time.process_time()
        deadline = self.started + self.duration if self.duration else None
        self._next_progress = self.started + self.progress_interval
        try:
            while not self._stopping:
                now = mono()
                if deadline is not None and now >= deadline:
                    self.stop_reason = self.stop_reason or "duration"
                    break
                wake = self._turn(now)
                if self._stopping:
                    break
                if deadline is not None and (wake is None or deadline < wake):
                    wake = deadline
                if self.progress is not None:
                    if now >= self._next_progress:
                        self.progress(self.snapshot())
                        self._next_progress = now + self.progress_interval
                    if wake is None or self._next_progress < wake:
                        wake = self._next_progress
                timeout = None if wake is None else wake - now
                if timeout is not None and timeout < SPIN_BELOW:
                    # Too close to be worth sleeping for: poll without blocking and come
                    # straight back instead.
                    timeout = 0.0
                ready = poll(timeout)
                if not ready:
                    continue
                now = mono()
                # Read until nothing is pending (or a batch is full) before the next turn, so that
                # a turn processes many ACKs at once. Re-polling is one syscall for all sockets,
                # cheaper than a failing recv() per socket when ACKs are spread over many EVs.
                n = 0
                while ready:
                    for fd, _ in ready:
                        if fd == wake_fd:
                            try:
                                self._wake_r.recv(64)
                            except OSError:
                                pass
                            continue
                        n += drain(handlers[fd], now)
                    if n >= RECV_BATCH or self._stopping:
                        break
                    ready = poll(0)
        finally:
            self.finished = mono()
            self._cpu_finished = time.process_time()

    def cpu_metrics(self) -> dict[str, float]:
        """CPU seconds of this process: while the loop ran (the traffic), and in all (start-up too)."""
        end = self._cpu_finished if self._cpu_finished is not None else time.process_time()
        start = self._cpu_started if self._cpu_started is not None else end
        return {"cpu_run_s": round(end - start, 4),
                "cpu_total_s": round(time.process_time(), 4)}


# --------------------------------------------------------------------------------------------------
# Sender


class Sender(_Loop):
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
        if base_port and not 1 <= base_port <= 65536 - config.num_evs:
            raise EndpointError(
                f"base port {base_port} + {config.num_evs} EVs does not fit in 1-65535; "
                f"use a base port <= {65536 - config.num_evs}"
            )
        if base_port and base_port % 16:
            log.warning("base port %d is not a multiple of 16: source port low bits != EV", base_port)
        self.family, self.dest = resolve(host, port)
        self.host, self.port = host, port
        self.bind = bind if bind is not None else ("::" if self.family == socket.AF_INET6 else "0.0.0.0")
        self.base_port = base_port
        self.seed = seed
        self.connect_timeout = connect_timeout
        self.on_response = on_response
        if connection_id is None:
            connection_id = int.from_bytes(os.urandom(4), "big") or 1
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
        self.datagrams_sent = 0
        self.datagrams_received = 0
        self.ev_sent = [0] * config.num_evs
        self.ev_received = [0] * config.num_evs
        self.send_errors = 0
        self.refused = 0
        self.last_error = ""
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
                        "choose another --base-port (a multiple of 16)"
                    ) from exc
                raise EndpointError(f"cannot bind {self.bind}:{port}: {exc.strerror}; check --bind") from exc
            try:
                s.connect(self.dest)
            except OSError as exc:
                s.close()
                self._close_socks()
                raise EndpointError(f"cannot reach {self.host}:{self.port}: {exc.strerror}") from exc
            _tune(s)
            self._register(s, (s.recv, ev))
            self.socks.append(s)
        self._sends = [s.send for s in self.socks]

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

    def _pump(self, now: float) -> float | None:
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
        conn = self.conn
        timer = conn.get_timer()
        if timer is not None and timer <= now:
            conn.handle_timer(now)
        self._events(now)
        wake = self._pump(now)
        self._flush(now)
        if not self._more() and not self._submit_time and not self._await_ack:
            if not self.completed:
                self.completed = True
                self.completed_at = now
            # Responses still need their ACKs to leave before we go.
            self.stop("completed")
            return None
        if self.first_reply is None and now - self.started > self.connect_timeout:
            self._no_receiver()
        timer = conn.get_timer()
        if timer is not None and (wake is None or timer < wake):
            wake = timer
        if self.first_reply is None:
            limit = self.started + self.connect_timeout
            if wake is None or limit < wake:
                wake = limit
        return wake

    def _no_receiver(self) -> None:
        where = f"{self.host}:{self.port}"
        if self.refused:
            raise EndpointError(
                f"no receiver at {where} (connection refused); start `fabriclab srd recv --port {self.port}` "
                "there first or fix --to"
            )
        detail = f" ({self.last_error})" if self.last_error else ""
        raise EndpointError(
            f"no reply from {where} within {self.connect_timeout:g} s{detail}; check --to and that "
            "`fabriclab srd recv` runs there"
        )

    def _flush(self, now: float) -> None:
        out = self.conn.datagrams_to_send(now)
        if not out:
            return
        sends = self._sends
        ev_sent = self.ev_sent
        for dgram, ev in out:
            try:
                sends[ev](dgram)
            except BlockingIOError:
                # Socket buffer full: the datagram is lost and the transport will recover it, as it
                # would a packet dropped by a switch.
                self.send_errors += 1
            except ConnectionRefusedError:
                # An ICMP port-unreachable from an earlier datagram, reported on this send.
                self.refused += 1
            except OSError as exc:
                self.send_errors += 1
                self.last_error = exc.strerror or str(exc)
            ev_sent[ev] += 1
        self.datagrams_sent += len(out)

    def _drain(self, handler: tuple[Callable[[int], bytes], int], now: float) -> int:
        # One datagram per readiness report: ACKs are spread over the EV sockets, so a socket
        # rarely holds more than one, and the loop re-polls (one syscall for all sockets) rather
        # than paying a failing recv() on each.
        recv, ev = handler
        try:
            data = recv(self._recv_size)
        except BlockingIOError:
            return 0
        except ConnectionRefusedError:
            self.refused += 1
            return 0
        except OSError as exc:
            self.last_error = exc.strerror or str(exc)
            return 0
        self.conn.receive_datagram(data, now)
        self.datagrams_received += 1
        self.ev_received[ev] += 1
        if self.first_reply is None:
            self.first_reply = now
        return 1

    def _events(self, now: float) -> None:
        next_event = self.conn.next_event
        rr = self.workload.request_response
        while (event := next_event()) is not None:
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
            # One last flush so that ACKs for responses received in the final turn leave.
            self._flush(time.monotonic())
            self._socket_drops = socket_drops(self.socks)
            return self.metrics()
        finally:
            self.close()

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

    def metrics(self) -> dict[str, Any]:
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
            "datagrams_sent": self.datagrams_sent,
            "datagrams_received": self.datagrams_received,
            "pps_sent": self.datagrams_sent / duration,
            "ev_datagrams_sent": list(self.ev_sent),
            "ev_datagrams_received": list(self.ev_received),
            "base_port": self.base_port,
            "source_ports": [s.getsockname()[1] for s in self.socks] if self.socks else [],
            "send_errors": self.send_errors,
            "refused": self.refused,
            "socket_drops": getattr(self, "_socket_drops", None),
            "workload": {
                "total_bytes": self.workload.total_bytes,
                "messages": self.workload.messages,
                "size": self.workload.size,
                "rate": self.workload.rate,
                "outstanding": self._limit if self._limit < (1 << 30) else 0,
                "request_response": self.workload.request_response,
            },
            "config": _config_dict(self.config),
            "connection": self.conn.metrics(),
        }


# --------------------------------------------------------------------------------------------------
# Receiver


class _Peer:
    """One connection at the receiver, with the address its ACKs and responses go to."""

    __slots__ = (
        "addr", "bytes", "conn", "connection_id", "corrupt", "datagrams", "duplicates", "evaddr", "first",
        "host", "last", "last_message", "messages", "ports", "seen",
    )

    def __init__(self, conn: Connection, connection_id: int, addr: tuple[Any, ...], now: float) -> None:
        self.conn = conn
        self.connection_id = connection_id
        self.addr = addr
        self.host = addr[0]
        self.first = now
        self.last = now
        self.last_message = now
        self.bytes = 0
        self.messages = 0
        self.datagrams = 0
        self.corrupt = 0
        self.duplicates = 0
        self.ports: dict[int, int] = {}
        self.evaddr: dict[int, tuple[Any, ...]] = {}
        self.seen: set[int] | None = None


class Receiver(_Loop):
    """Listens on one UDP port and serves any number of sender connections."""

    role = "receiver"

    def __init__(
        self,
        config: TransportConfig,
        *,
        bind: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        expect_bytes: int = 0,
        duration: float | None = None,
        echo: bool = False,
        response_size: int = 0,
        verify: bool = False,
        linger: float = 0.5,
        on_message: Callable[[int, int, bytes], None] | None = None,
        progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        super().__init__(config, duration=duration, progress=progress)
        if expect_bytes < 0:
            raise EndpointError(f"expected bytes must be >= 0, got {expect_bytes}")
        if response_size < 0:
            raise EndpointError(f"response size must be >= 0, got {response_size}")
        if not 0 <= port <= 65535:
            raise EndpointError(f"port {port} is out of range; use 1-65535")
        self.bind, self.port = bind, port
        self.expect_bytes = expect_bytes
        self.echo = echo
        self.response_size = response_size
        self.verify = verify
        self.linger = linger
        self.on_message = on_message
        self.sock: socket.socket | None = None
        self.peers: dict[tuple[Any, int], _Peer] = {}
        self._active: set[_Peer] = set()
        self.datagrams_received = 0
        self.datagrams_sent = 0
        self.invalid = 0
        self.send_errors = 0
        self.bytes = 0
        self.messages = 0
        self.first_packet: float | None = None
        self.last_message: float | None = None
        self._done_at: float | None = None
        self._last_rx = 0.0
        self._magic = struct.pack("!H", wire.MAGIC)

    @property
    def address(self) -> tuple[str, int]:
        """The bound address (useful with port 0)."""
        assert self.sock is not None, "call open() first"
        host, port = self.sock.getsockname()[:2]
        return host, port

    def open(self) -> None:
        family = socket.AF_INET6 if ":" in self.bind else socket.AF_INET
        s = socket.socket(family, socket.SOCK_DGRAM)
        try:
            s.bind((self.bind, self.port))
        except OSError as exc:
            s.close()
            if exc.errno == errno.EADDRINUSE:
                raise EndpointError(f"port {self.port} is in use on {self.bind}; choose another --port") from exc
            raise EndpointError(f"cannot bind {self.bind}:{self.port}: {exc.strerror}; check --bind") from exc
        _tune(s)
        self._register(s, s.recvfrom)
        self.sock = s

    def _new_peer(self, data: bytes, cid: int, addr: tuple[Any, ...], now: float) -> _Peer | None:
        # Only a well-formed DATA packet opens a connection: stray ACKs or garbage must not make
        # the receiver allocate state.
        try:
            packet = wire.decode(data)
        except Exception:  # decode errors of any kind mean "not ours"
            return None
        if not isinstance(packet, wire.DataPacket):
            return None
        conn = Connection(self.config, cid, seed=cid)
        peer = _Peer(conn, cid, addr, now)
        if self.verify:
            peer.seen = set()
        self.peers[(addr[0], cid)] = peer
        log.info("new connection %#x from %s:%d", cid, addr[0], addr[1])
        return peer

    def _drain(self, recvfrom: Callable[[int], tuple[bytes, Any]], now: float) -> int:
        # One socket for all peers: drain it, so the failing recv() at the end is amortised.
        size = self._recv_size
        peers = self.peers
        read_cid = wire.read_conn_id
        active = self._active
        magic = self._magic
        n = 0
        while n < RECV_BATCH:
            try:
                data, addr = recvfrom(size)
            except BlockingIOError:
                break
            except OSError:
                # An ICMP error for an earlier reply (the sender went away): nothing to read.
                n += 1
                continue
            n += 1
            if magic is not None and not data.startswith(magic):
                self.invalid += 1
                continue
            try:
                cid = read_cid(data)
            except struct.error:
                self.invalid += 1
                continue
            peer = peers.get((addr[0], cid))
            if peer is None:
                peer = self._new_peer(data, cid, addr, now)
                if peer is None:
                    self.invalid += 1
                    continue
            peer.addr = addr
            peer.datagrams += 1
            ports = peer.ports
            port = addr[1]
            ports[port] = ports.get(port, 0) + 1
            if data[_TYPE_OFFSET] == _TYPE_DATA:
                # Remember which source address carries each EV: an ACK names the EV of the DATA
                # that triggered it and goes back to the socket that sent that DATA.
                peer.evaddr[data[_EV_OFFSET] << 8 | data[_EV_OFFSET + 1]] = addr
            peer.conn.receive_datagram(data, now)
            active.add(peer)
        if n:
            self.datagrams_received += n
            self._last_rx = now
            if self.first_packet is None:
                self.first_packet = now
        return n

    def _events(self, peer: _Peer, now: float) -> None:
        conn = peer.conn
        while (event := conn.next_event()) is not None:
            if not isinstance(event, MessageReceived):
                continue
            data = event.data
            size = len(data)
            peer.bytes += size
            peer.messages += 1
            peer.last_message = now
            self.bytes += size
            self.messages += 1
            self.last_message = now
            if peer.seen is not None:
                if not check_payload(data):
                    peer.corrupt += 1
                seq = payload_seq(data)
                if seq in peer.seen:
                    peer.duplicates += 1
                peer.seen.add(seq)
            if self.on_message is not None:
                self.on_message(peer.connection_id, event.msg_id, data)
            if self.echo:
                conn.send_message(data)
            elif self.response_size:
                # The response starts with the request's sequence prefix so the sender can match it.
                conn.send_message(data[:SEQ_LEN] + make_payload(payload_seq(data), self.response_size)[SEQ_LEN:]
                                  if self.response_size > SEQ_LEN else data[: self.response_size])

    def _turn(self, now: float) -> float | None:
        wake: float | None = None
        sendto = self.sock.sendto  # type: ignore[union-attr]
        active = self._active
        for peer in self.peers.values():
            conn = peer.conn
            timer = conn.get_timer()
            if timer is not None and timer <= now:
                conn.handle_timer(now)
                active.add(peer)
        for peer in active:
            conn = peer.conn
            self._events(peer, now)
            out = conn.datagrams_to_send(now)
            if out:
                addr = peer.addr
                evaddr_get = peer.evaddr.get
                for dgram, ev in out:
                    try:
                        sendto(dgram, evaddr_get(ev, addr))
                    except OSError:
                        self.send_errors += 1
                self.datagrams_sent += len(out)
        active.clear()
        for peer in self.peers.values():
            timer = peer.conn.get_timer()
            if timer is not None and (wake is None or timer < wake):
                wake = timer
        if self.expect_bytes and self.bytes >= self.expect_bytes:
            # Linger until the senders have gone quiet so that a lost final ACK can be repeated.
            if self._done_at is None:
                self._done_at = now
            quiet_since = max(self._last_rx, self._done_at)
            if now - quiet_since >= self.linger or now - self._done_at >= 10 * self.linger:
                self.stop("expected bytes received")
                return None
            limit = quiet_since + self.linger
            if wake is None or limit < wake:
                wake = limit
        return wake

    def run(self) -> dict[str, Any]:
        if self.sock is None:
            self.open()
        try:
            self._run_loop()
            self._socket_drops = socket_drops([self.sock]) if self.sock else None
            return self.metrics()
        finally:
            self.close()

    def snapshot(self) -> dict[str, Any]:
        elapsed = max(1e-9, time.monotonic() - (self.first_packet or self.started))
        return {
            "role": self.role,
            "elapsed": elapsed,
            "bytes": self.bytes,
            "messages": self.messages,
            "connections": len(self.peers),
            "goodput_bps": 8 * self.bytes / elapsed,
        }

    def metrics(self) -> dict[str, Any]:
        start = self.first_packet or self.started
        end = self.last_message or start
        duration = end - start
        wall = (self.finished or time.monotonic()) - self.started
        return {
            **self.cpu_metrics(),
            "role": self.role,
            "listen": f"{self.bind}:{self.port if self.sock is None else self.sock.getsockname()[1]}",
            "stop_reason": self.stop_reason,
            "duration": duration,
            "wall_time": wall,
            "bytes": self.bytes,
            "goodput_bps": 8 * self.bytes / duration if duration > 0 else 0.0,
            "messages": self.messages,
            "datagrams_received": self.datagrams_received,
            "datagrams_sent": self.datagrams_sent,
            "pps_received": self.datagrams_received / duration if duration > 0 else 0.0,
            "invalid_datagrams": self.invalid,
            "send_errors": self.send_errors,
            "socket_drops": getattr(self, "_socket_drops", None),
            "expect_bytes": self.expect_bytes,
            "config": _config_dict(self.config),
            "connections": [
                {
                    "connection_id": p.connection_id,
                    "peer": f"{p.host}",
                    "bytes": p.bytes,
                    "messages": p.messages,
                    "datagrams": p.datagrams,
                    "duration": p.last_message - p.first,
                    "goodput_bps": 8 * p.bytes / (p.last_message - p.first) if p.last_message > p.first else 0.0,
                    "source_port_datagrams": {str(k): v for k, v in sorted(p.ports.items())},
                    "corrupt_messages": p.corrupt if p.seen is not None else None,
                    "duplicate_messages": p.duplicates if p.seen is not None else None,
                    "transport": p.conn.metrics(),
                }
                for p in self.peers.values()
            ],
        }


def _config_dict(config: TransportConfig) -> dict[str, Any]:
    from dataclasses import asdict, is_dataclass

    return asdict(config) if is_dataclass(config) else dict(vars(config))
