"""The I/O shell every UDP endpoint shares: socket tuning, the poller, the event loop and its constants.

The srd `Sender` and `Receiver` (transport/io/sender.py, transport/io/receiver.py) and the all-reduce's
`UdpRingWorker` (transport/io/allreduce.py) are each one `EventLoop` subclass: a single-threaded,
non-blocking loop over `select.epoll` and `time.monotonic` that drives sans-I/O `Connection`s. A
subclass opens its sockets, registers a reader for each, and implements `_turn(now)`: fire due timers,
handle events, send what is due, and return when it next needs to run. The loop sleeps until then or
until a socket is readable, reads what is pending, and turns again.

At the paced rates of an emulated fabric (a few hundred packets per second per flow) an endpoint's
CPU goes on wake-ups, not on packets: a Python process woken from sleep, its caches cold, spends
tens of microseconds before and after the protocol's few. So the work of a wake-up is done once for
as many packets as it can cover: one clock read per wake-up, every pending datagram read before the
next turn, everything due sent in the turn, and a loop may ask (`defer_reads`) to sleep through
the arrivals it does not need at once, such as the rest of a batch a held ACK will answer, and read
them all when it wakes. Nothing is logged per packet and no exception is raised in the common case.
"""

from __future__ import annotations

import gc
import logging
import os
import select
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transport.core.config import TransportConfig
from transport.core.contract import CONTROL_TOS
from transport.core.pump import Datagrams

log = logging.getLogger(__name__)

# Socket buffers large enough to absorb a window's worth of packets between two loop turns; the
# kernel silently caps them at net.core.{r,w}mem_max.
SOCKET_BUFFER_BYTES = 4 << 20
# At most this many datagrams are read per loop turn, so that ACKs and new data are sent between
# bursts instead of after an arbitrarily long drain.
RECV_BATCH = 256
# A loop defers its reads (`EventLoop.defer_reads`) only for at least this long: a shorter sleep saves
# no wake-up, and at high packet rates the loop is busy and batches its reads anyway.
DEFER_MIN = 0.001
# Timers closer than this are waited for by polling, not sleeping: a sleep and its wake-up cost tens
# of microseconds, more than such a gap. Longer waits sleep in `Poller.poll`, which sleeps below a
# millisecond with select(); epoll alone rounds a timeout up to a whole millisecond, which is why a
# loop on bare epoll has to spin for anything under 1 ms instead.
SPIN_BELOW = 0.00005


class EndpointError(Exception):
    """Bad input or environment at the socket level (address in use, no receiver, unreachable)."""


def tune(sock: socket.socket) -> None:
    """Large buffers, non-blocking."""
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)
        except OSError:  # pragma: no cover - some sandboxes forbid it; defaults still work
            pass
    sock.setblocking(False)


def _tos_option(family: int) -> tuple[int, int]:
    """The (level, option) that sets a socket's or a datagram's TOS byte (traffic class in IPv6)."""
    return (socket.IPPROTO_IPV6, socket.IPV6_TCLASS) if family == socket.AF_INET6 else (socket.IPPROTO_IP,
                                                                                        socket.IP_TOS)


def mark_control(sock: socket.socket) -> None:
    """Mark what `sock` sends as transport control (the contract's CONTROL_DSCP): for a socket that sends
    only ACKs and credit, so that shaped links serve them before data (emulator/shaping.py)."""
    try:
        sock.setsockopt(*_tos_option(sock.family), CONTROL_TOS)
    except OSError as exc:  # pragma: no cover - an unmarked ACK still arrives, just not first
        log.warning("cannot mark control datagrams (DSCP %d): %s", CONTROL_TOS >> 2, exc)


def control_ancillary(family: int) -> list[tuple[int, int, bytes]]:
    """`sendmsg` ancillary data that marks one datagram as transport control, for a socket that sends
    data too (see mark_control)."""
    return [(*_tos_option(family), CONTROL_TOS.to_bytes(4, sys.byteorder))]


@dataclass(slots=True)
class SendCounters:
    """What an endpoint's sockets counted while sending (and `refused` while reading, too)."""

    datagrams_sent: int = 0
    send_errors: int = 0
    refused: int = 0  # ICMP port-unreachable for an earlier datagram: nobody listens there (yet)
    last_error: str = ""


class SocketSender:
    """A pump's `send` over sockets: each (datagram, EV) through `send(datagram, ev)`, socket errors
    counted in `counters`, never raised; `ev_sent` (if given) counts the datagrams of each EV.

    A full socket buffer loses the datagram, which the transport recovers as it would a packet a switch
    dropped; a refused send reports an ICMP port-unreachable for an earlier datagram.
    """

    __slots__ = ("counters", "ev_sent", "send")

    def __init__(self, send: Callable[[bytes, int], Any], counters: SendCounters,
                 ev_sent: list[int] | None = None) -> None:
        self.send = send
        self.counters = counters
        self.ev_sent = ev_sent

    def __call__(self, out: Datagrams, now: float) -> None:
        send = self.send
        counters = self.counters
        ev_sent = self.ev_sent
        for dgram, ev in out:
            try:
                send(dgram, ev)
            except BlockingIOError:
                counters.send_errors += 1
            except ConnectionRefusedError:
                counters.refused += 1
            except OSError as exc:
                counters.send_errors += 1
                counters.last_error = exc.strerror or str(exc)
            if ev_sent is not None:
                ev_sent[ev] += 1
        counters.datagrams_sent += len(out)


def read_batch(recvfrom: Callable[[int], tuple[bytes, Any]], size: int) -> tuple[list[tuple[bytes, Any]], int]:
    """Up to RECV_BATCH (datagram, source address) pairs from a non-blocking socket, and the reads
    that took: an ICMP error for an earlier send costs a read and yields nothing."""
    batch: list[tuple[bytes, Any]] = []
    append = batch.append
    reads = 0
    while reads < RECV_BATCH:
        try:
            append(recvfrom(size))
        except BlockingIOError:
            break
        except OSError:
            pass
        reads += 1
    return batch, reads


# SO_TIMESTAMPNS (Linux; the socket module does not name it): the kernel stamps each datagram with
# its arrival time, so a loop that reads late still knows when each packet came in.
SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("@ll")  # the struct timespec of SCM_TIMESTAMPNS (two C longs)
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size)


def stamp_arrivals(sock: socket.socket) -> bool:
    """Ask the kernel to stamp `sock`'s datagrams with their arrival time; whether it will."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def read_stamped_batch(recvmsg: Callable[..., tuple[bytes, list[tuple[int, int, bytes]], int, Any]],
                       size: int) -> tuple[list[tuple[bytes, Any]], list[float], int]:
    """`read_batch` for a socket with `stamp_arrivals`: the pairs, each one's arrival time on the
    `time.monotonic` clock (the read time where a datagram came unstamped), and the reads."""
    batch: list[tuple[bytes, Any]] = []
    times: list[float] = []
    append, stamp = batch.append, times.append
    unpack = _TIMESPEC.unpack
    # The stamps are wall-clock: one offset per batch maps them to the monotonic clock.
    mono = time.monotonic()
    offset = time.time() - mono
    reads = 0
    while reads < RECV_BATCH:
        try:
            data, anc, _flags, addr = recvmsg(size, _ANCILLARY)
        except BlockingIOError:
            break
        except OSError:
            reads += 1
            continue
        reads += 1
        t = mono
        for level, kind, cdata in anc:
            if kind == SO_TIMESTAMPNS and level == socket.SOL_SOCKET and len(cdata) >= _TIMESPEC.size:
                sec, nsec = unpack(cdata[:_TIMESPEC.size])
                t = sec - offset + nsec * 1e-9
                if t > mono:  # the clocks' offset moved by a hair meanwhile: never in the future
                    t = mono
        append((data, addr))
        stamp(t)
    return batch, times, reads


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


class Poller:
    """Readiness of a few sockets: `select.epoll` on Linux, `select.poll` elsewhere.

    Used directly rather than through `selectors`, whose per-call wrapping (key objects, a result
    list) costs more than the poll itself at tens of thousands of turns per second. Timeouts are in
    seconds; None blocks.
    """

    def __init__(self, select_below: int = 1024) -> None:
        if hasattr(select, "epoll"):
            self._ep = select.epoll()
            self._ms = False
        else:  # pragma: no cover - not Linux
            self._ep = select.poll()
            self._ms = True
        self._fds: list[int] = []
        self._select_ok = True
        # Short waits use select() only while it watches fewer descriptors than this: it scans every
        # one on each call, which with hundreds (a LoopGroup's) costs more than sleeping the gap through.
        self._select_below = select_below

    def register(self, fd: int) -> None:
        self._ep.register(fd, select.POLLIN)
        self._fds.append(fd)
        # select() only takes descriptors below FD_SETSIZE (1024 on Linux).
        self._select_ok = self._select_ok and fd < 1024 and len(self._fds) < self._select_below

    def unregister(self, fd: int) -> None:
        self._ep.unregister(fd)
        self._fds.remove(fd)
        self._select_ok = all(f < 1024 for f in self._fds) and len(self._fds) < self._select_below

    def poll(self, timeout: float | None) -> list[tuple[int, int]]:
        if timeout is not None and 0 < timeout < 0.001:
            if not self._select_ok:
                # Too many descriptors for select(): sleep the short gap through, then look.
                time.sleep(timeout)
                return self._ep.poll(0)
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


class EventLoop:
    """A poller, a wake-up socket pair for `stop()`, deadlines, progress reports, CPU time.

    Subclasses register each socket with a reader, `reader(now) -> datagrams read`, and implement
    `_turn(now) -> next wake-up time or None` (and `snapshot()` when they report progress).
    """

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
        self._poller = Poller()
        self._handlers: dict[int, Callable[[float], int]] = {}
        self._owned: list[socket.socket] = []
        # stop() may be called from a signal handler or another thread: writing one byte to this
        # pair wakes the poll at once instead of waiting for the next timer.
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._wake_fd = self._wake_r.fileno()
        self._poller.register(self._wake_fd)
        # While reads are deferred the loop sleeps on the wake-up pair alone.
        self._quiet = Poller()
        self._quiet.register(self._wake_fd)
        # Set by `_turn` for the wait that follows it: sleep until the wake-up time it returned
        # without watching the data sockets, then read them all. Cleared after each wait.
        self.defer_reads = False
        # Whether a wake-up re-polls after reading: a loop whose readers take one datagram per
        # readiness report (many sockets, few datagrams each) needs it, one whose readers drain
        # their socket to EAGAIN does not.
        self.repoll = True
        self._stopping = False
        self.stop_reason = ""
        self.started = 0.0
        self.finished = 0.0
        self._cpu_started: float | None = None  # process CPU seconds when the loop started / ended
        self._cpu_finished: float | None = None
        self._sys_started = self._sys_finished = 0.0  # of which in the kernel (os.times().system)
        self._next_progress = 0.0
        self._recv_size = max(65535, config.mtu + 64)
        # Set by a LoopGroup (transport/io/group.py): this loop's share of the process's CPU.
        self._shared_cpu: dict[str, float] | None = None

    def _register(self, sock: socket.socket, reader: Callable[[float], int]) -> None:
        """Tune `sock`, read it with `reader(now)` whenever it is readable, close it in close()."""
        tune(sock)
        self._poller.register(sock.fileno())
        self._handlers[sock.fileno()] = reader
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
        self._quiet.close()

    # Subclasses fill these in.
    def _turn(self, now: float) -> float | None:  # returns the next wake-up time
        raise NotImplementedError

    def snapshot(self) -> dict[str, Any]:
        raise NotImplementedError

    def _run_loop(self) -> None:
        mono = time.monotonic
        poll = self._poller.poll
        quiet = self._quiet.poll
        handlers = self._handlers
        data_ready = [(fd, select.POLLIN) for fd in handlers]
        wake_fd = self._wake_fd
        # What start-up built (modules, the config, the sockets) lives as long as the loop: kept out
        # of the collector's reach, its periodic sweeps touch only what the traffic allocates.
        gc.collect()
        gc.freeze()
        self.started = mono()
        self._cpu_started = time.process_time()
        self._sys_started = os.times().system
        deadline = self.started + self.duration if self.duration else None
        self._next_progress = self.started + self.progress_interval
        now = self.started
        try:
            while not self._stopping:
                # One clock read per wake-up: `now` is when the wait ended, for the reads and the
                # turn alike.
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
                if self.defer_reads and timeout is not None:
                    # Sleep through the arrivals until `wake` (stop() still wakes us), then read
                    # every socket: what arrived meanwhile is handled in one turn.
                    self.defer_reads = False
                    quiet(timeout)
                    now = mono()
                    if self._stopping:
                        break
                    ready = data_ready
                else:
                    self.defer_reads = False
                    ready = poll(timeout)
                    now = mono()
                    if not ready:
                        continue
                # Read until nothing is pending (or a batch is full) before the next turn, so that
                # a turn processes many datagrams at once. Re-polling is one syscall for all
                # sockets, cheaper than a failing recv() per socket when ACKs are spread over
                # many EVs; a loop whose readers drain to EAGAIN skips it.
                n = 0
                while ready:
                    for fd, _ in ready:
                        if fd == wake_fd:
                            try:
                                self._wake_r.recv(64)
                            except OSError:
                                pass
                            continue
                        n += handlers[fd](now)
                    if n >= RECV_BATCH or self._stopping or not self.repoll:
                        break
                    ready = poll(0)
        finally:
            self.finished = mono()
            self._cpu_finished = time.process_time()
            self._sys_finished = os.times().system

    def on_loop_end(self, now: float) -> None:
        """Last work once the loop has stopped (run by `run` and by a LoopGroup)."""

    def cpu_metrics(self) -> dict[str, float]:
        """CPU seconds of this process: while the loop ran (the traffic), and in all (start-up too);
        in a LoopGroup, this loop's share of the group's."""
        if self._shared_cpu is not None:
            return dict(self._shared_cpu)
        end = self._cpu_finished if self._cpu_finished is not None else time.process_time()
        start = self._cpu_started if self._cpu_started is not None else end
        sys_end = self._sys_finished if self._cpu_finished is not None else os.times().system
        return {"cpu_run_s": round(end - start, 4),
                # The kernel's part: system calls, and what sending a datagram runs in the sender's
                # context (the veth or loopback delivery, the shaped queue, waking the next hop).
                "cpu_run_kernel_s": round(max(0.0, sys_end - self._sys_started), 4),
                "cpu_total_s": round(time.process_time(), 4)}
