"""Several endpoints in one process: their event loops share one poller, one clock read per wake-up
and one warm interpreter.

In an emulated fabric every host's endpoint is otherwise a process of its own, woken for each packet
of its flow: a few hundred times a second, tens of milliseconds apart, each wake-up paying for caches
that the other processes (Open vSwitch, the other endpoints) emptied meanwhile. Measured on a 2-core
machine, a bare Python loop that answers one datagram per wake-up costs ~110 µs a packet when each of
16 such loops is its own process, ~70 µs when one process serves all 16 sockets. `LoopGroup` runs
`EventLoop`s (transport/io/eventloop.py) of any kind that way: each keeps its sockets, readers, timers
and `_turn`; the group polls all their sockets at once, reads what is ready, turns the loops that read
something or whose wake-up time came, and sleeps until the earliest next one.

Rules:
- A loop turns at its start (its offset after `run` began, for staggered senders), whenever one of its
  sockets was read, and when the time it last asked for comes; never otherwise.
- A loop ends when it stops itself (`stop()`, as it would alone), when its duration is over, or when the
  group is stopped: its sockets leave the poller and its `on_loop_end(now)` runs at once; `on_end(loop)`
  (metrics, results) runs for every loop once all have ended and the CPU time is shared out.
- A loop that asks to defer its reads (`defer_reads`: sleep through the packets a held ACK will answer)
  gets it: its sockets leave the poller until the wake-up time it gave, and are then read in full.
- The group's CPU time while it ran is shared among the loops in proportion to the datagrams each
  sent and read, so that summing the endpoints' `cpu_run_s` counts the process once.

A loop's sockets live in whatever network namespace they were opened in (`netns`): an emulated host's
endpoints can be opened from one process by entering each host's namespace in turn.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import heapq
import os
import resource
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import count

from transport.io.eventloop import RECV_BATCH, SPIN_BELOW, EndpointError, EventLoop, Poller

_CLONE_NEWNET = 0x40000000
# A group watching more sockets than this sleeps through waits under a millisecond instead of
# select()ing them all (transport/io/eventloop.py's Poller): what arrives meanwhile is read at the end.
SELECT_BELOW = 64
# Wake-up moderation, as a NIC's interrupt moderation and the switches' (emulator/ovs_daemons.py): paced
# flows bring a group one datagram or timer per wake-up, and a wake-up's cost is mostly its cold caches,
# not its packets. So while work comes densely (at least DENSE_WORK datagrams read or loops turned per
# linger, averaged over DENSITY_WINDOW, or a whole window's worth sooner), a wake-up comes at most once
# per linger: what arrives or falls due meanwhile waits, and is taken together. A sparse exchange (a
# ping, a lone request) is answered at once. The linger: LINGER_FRACTION of a full frame's time at the
# loops' fastest link rate, at most LINGER_MAX; so it stays well inside the pacer's banked burst (four
# packet intervals), and a paced flow loses no rate to it. Where the kernel stamps a receiver's arrivals
# (coalesced ACKs, no ECN reading), its ACKs still report when data came; elsewhere an RTT sample can
# read up to a linger long. LINGER_MAX keeps a linger under the 25 ms a peer believes an ACK may be held
# (TransportConfig.max_ack_delay); it used to be 2 ms, which on slow links in jumbo frames (a 72 ms frame
# at 1 Mb/s) left a group waking for nearly every datagram.
LINGER_FRACTION = 1 / 4
LINGER_MAX = 0.020
LINGER_MIN = 0.0001
DENSE_WORK = 2
DENSITY_WINDOW = 0.1
LINGER_ENV = "FABRICLAB_GROUP_LINGER_US"


def group_linger(loops: list[EventLoop]) -> float:
    """The linger (s) for a group of `loops`: LINGER_FRACTION of a full frame's time at the fastest
    link rate they were given, at most LINGER_MAX; 0 when a loop has no link rate or the figure is
    under LINGER_MIN. LINGER_ENV (µs) overrides it."""
    override = os.environ.get(LINGER_ENV, "").strip()
    if override:
        try:
            return max(0.0, float(override)) * 1e-6
        except ValueError:
            raise EndpointError(f"{LINGER_ENV}={override!r}: give microseconds, e.g. 500 (0: off)") from None
    rates = [loop.config.link_rate_bps for loop in loops]
    if not rates or min(rates) <= 0:
        return 0.0
    frame = max(loop.config.wire_packet_bytes for loop in loops) * 8 / max(rates)
    linger = min(LINGER_MAX, frame * LINGER_FRACTION)
    return linger if linger >= LINGER_MIN else 0.0


@contextmanager
def netns(path: str | None) -> Iterator[None]:
    """Run the block in the network namespace at `path` (e.g. /proc/PID/ns/net), then return to this
    thread's own; None: stay where we are. Sockets opened inside keep that namespace for good."""
    if not path:
        yield
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        try:
            target = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise EndpointError(f"network namespace {path}: {exc.strerror}; is the host still up?") from None
        try:
            if libc.setns(target, _CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise EndpointError(f"cannot enter network namespace {path}: {os.strerror(err)} (needs root)")
        finally:
            os.close(target)
        try:
            yield
        finally:
            if libc.setns(own, _CLONE_NEWNET) != 0:  # pragma: no cover - our own namespace is always there
                raise OSError(ctypes.get_errno(), "cannot return to the original network namespace")
    finally:
        os.close(own)


def raise_open_files_limit() -> None:
    """Let this process open as many descriptors as it may: a sender holds one socket per EV, and a
    group of a big fabric's senders holds thousands."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _datagrams(loop: EventLoop) -> int:
    """Datagrams a loop sent and read: how the group's CPU is shared out."""
    sent = getattr(getattr(loop, "sent", None), "datagrams_sent", 0)
    return sent + getattr(loop, "datagrams_received", 0)


class LoopGroup:
    """Run `loops` together until every one has ended; `starts[i]` delays loop i's first turn (s)."""

    def __init__(self, loops: list[EventLoop], starts: list[float] | None = None, linger: float = 0.0) -> None:
        if starts is not None and len(starts) != len(loops):
            raise ValueError("one start offset per loop")
        if linger < 0:
            raise ValueError("linger must be >= 0")
        self.linger = linger
        # Only the wake-up pair: what a linger watches, so that stop() still ends it at once.
        self._quiet = Poller()
        self.loops = loops
        self.starts = starts or [0.0] * len(loops)
        self._poller = Poller(select_below=SELECT_BELOW)
        # fd -> (index of its loop, its reader)
        self._owner: dict[int, tuple[int, Callable[[float], int]]] = {}
        for i, loop in enumerate(loops):
            for fd, reader in loop._handlers.items():
                self._poller.register(fd)
                self._owner[fd] = (i, reader)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._poller.register(self._wake_r.fileno())
        self._quiet.register(self._wake_r.fileno())
        self._stopping = False
        self.cpu_run_s = 0.0
        self.wakeups = 0  # waits that ended (timer or arrival): what the group's CPU goes on
        self.turns = 0  # loop turns: a wake-up turns every loop that read or whose time came
        self.page_faults = 0  # minor faults while the loops ran: memory touched for the first time or again

    def stop(self, reason: str = "stopped") -> None:
        """Stop every loop after the current turn; safe from signal handlers."""
        self._stopping = True
        for loop in self.loops:
            loop.stop(reason)
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def close(self) -> None:
        for s in (self._wake_r, self._wake_w):
            s.close()
        self._poller.close()
        self._quiet.close()

    def run(self, on_end: Callable[[EventLoop], None] | None = None) -> None:
        mono = time.monotonic
        gc.collect()
        gc.freeze()
        t_start = mono()
        cpu0, sys0 = time.process_time(), os.times().system
        faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        tie = count()
        # (wake-up time, tie, loop index): a loop's entry is live while it equals wake[index].
        wake: list[float | None] = [t_start + s for s in self.starts]
        deadline: list[float | None] = [None] * len(self.loops)
        started = [False] * len(self.loops)
        ended = [False] * len(self.loops)
        heap = [(w, next(tie), i) for i, w in enumerate(wake) if w is not None]
        heapq.heapify(heap)
        live = len(self.loops)
        poll = self._poller.poll
        owner = self._owner
        wake_fd = self._wake_r.fileno()

        deferred = [False] * len(self.loops)

        def watch(i: int, on: bool) -> None:
            for fd in self.loops[i]._handlers:
                if on:
                    self._poller.register(fd)
                else:
                    self._poller.unregister(fd)

        def end(i: int, now: float) -> None:
            nonlocal live
            loop = self.loops[i]
            ended[i] = True
            live -= 1
            wake[i] = None
            loop.finished = now
            if not deferred[i]:
                watch(i, False)
            for fd in loop._handlers:
                owner.pop(fd, None)
            loop.on_loop_end(now)
            order.append(loop)

        # Wake-up moderation (see LINGER_*): on while the work per linger (datagrams read, loops
        # turned) averaged at least DENSE_WORK over the last DENSITY_WINDOW.
        linger = self.linger
        quiet = self._quiet.poll
        dense = False
        window_start, window_work = t_start, 0
        last_wake = t_start
        now = t_start
        order: list[EventLoop] = []
        touched: set[int] = set()
        try:
            while live:
                while heap and heap[0][0] <= now:
                    w, _, i = heapq.heappop(heap)
                    if wake[i] == w:
                        touched.add(i)
                        if deferred[i]:
                            # Its deferral is over: watch its sockets again and read what came.
                            deferred[i] = False
                            watch(i, True)
                            for reader in self.loops[i]._handlers.values():
                                reader(now)
                self.turns += len(touched)
                window_work += len(touched)
                for i in sorted(touched):
                    if ended[i]:
                        continue
                    loop = self.loops[i]
                    if not started[i]:
                        if now < t_start + self.starts[i]:
                            continue  # its socket was read before its start: nothing to send yet
                        started[i] = True
                        loop.started = now
                        if loop.duration:
                            deadline[i] = now + loop.duration
                    d = deadline[i]
                    if loop._stopping or (d is not None and now >= d):
                        loop.stop_reason = loop.stop_reason or "duration"
                        end(i, now)
                        continue
                    w = loop._turn(now)
                    if loop._stopping:
                        loop.defer_reads = False
                        end(i, now)
                        continue
                    if d is not None and (w is None or d < w):
                        w = d
                    if loop.defer_reads:
                        loop.defer_reads = False
                        if w is not None and not deferred[i]:
                            # It sleeps through its own arrivals until w, as it would alone: its
                            # sockets leave the poller meanwhile.
                            deferred[i] = True
                            watch(i, False)
                    wake[i] = w
                    if w is not None:
                        heapq.heappush(heap, (w, next(tie), i))
                touched.clear()
                if not live or self._stopping:
                    break
                while heap and wake[heap[0][2]] != heap[0][0]:
                    heapq.heappop(heap)
                if dense:
                    gap = last_wake + linger - now
                    if gap >= SPIN_BELOW:
                        # Sleep through what comes meanwhile, timers included, then take it all in
                        # one wake-up.
                        quiet(gap)
                        now = mono()
                timeout = None if not heap else max(0.0, heap[0][0] - now)
                if timeout is not None and timeout < SPIN_BELOW:
                    timeout = 0.0
                ready = poll(timeout)
                now = last_wake = mono()
                self.wakeups += 1
                n = 0
                while ready:
                    for fd, _ in ready:
                        if fd == wake_fd:
                            try:
                                self._wake_r.recv(64)
                            except OSError:
                                pass
                            continue
                        entry = owner.get(fd)
                        if entry is None:
                            continue
                        i, reader = entry
                        n += reader(now)
                        touched.add(i)
                    if n >= RECV_BATCH or self._stopping:
                        break
                    ready = poll(0)
                if linger:
                    window_work += n
                    if now - window_start >= DENSITY_WINDOW:
                        dense = window_work * linger >= DENSE_WORK * (now - window_start)
                        window_start, window_work = now, 0
                    elif not dense and window_work * linger >= DENSE_WORK * DENSITY_WINDOW:
                        # A whole dense window's work already came: waiting out the window would
                        # spend a wake-up per datagram on a transfer's start (5,000 a second in
                        # the paced-pair test), which is when short collectives spend their time.
                        dense = True
                        window_start, window_work = now, 0
            for i in range(len(self.loops)):
                if not ended[i]:
                    self.loops[i].stop_reason = self.loops[i].stop_reason or "stopped"
                    end(i, now)
        finally:
            self.cpu_run_s = time.process_time() - cpu0
            self.page_faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
            self._share_cpu(self.cpu_run_s, max(0.0, os.times().system - sys0))
        if on_end is not None:
            for loop in order:
                on_end(loop)

    def _share_cpu(self, run_s: float, kernel_s: float) -> None:
        counts = [_datagrams(loop) for loop in self.loops]
        total = sum(counts)
        for loop, c in zip(self.loops, counts, strict=True):
            share = c / total if total else 1 / len(self.loops)
            loop._shared_cpu = {"cpu_run_s": round(run_s * share, 4),
                                "cpu_run_kernel_s": round(kernel_s * share, 4),
                                "cpu_total_s": round(time.process_time() * share, 4)}


__all__ = ["LoopGroup", "group_linger", "netns", "raise_open_files_limit"]
