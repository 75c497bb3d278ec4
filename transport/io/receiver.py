"""The srd receiver: one UDP port serving any number of sender connections.

Datagrams are demultiplexed by (peer IP, connection id): the peer's source *port* varies with the
EV, so it cannot be part of the key. The first valid DATA packet of an unknown connection creates its
`Connection`, and each ACK goes to the source address of the DATA packet that triggered it (the ACK
names that packet's EV), so it reaches the sender's socket for that EV.

What a datagram can make the receiver hold is bounded (the transport trusts the fabric, but not
every datagram on it; docs/transport.md, "Trust model"): at most `max_connections` connections, at
most `max_connections_per_source` from one source address; addresses are learnt only from datagrams
that passed the CRC. A connection is forgotten once it has been silent for `idle_timeout`, whatever
it holds (a sender retransmits within `rto_max` while anything is missing, so one silent that long
is gone), and sooner, after `UNPROVEN_RTOS` times `rto_max`, while it has not proved it is real:
while it has delivered no message, or has responses of ours outstanding and has never echoed one
(its round trip is unmeasured). 1,024 first fragments from spoofed sources once held every slot for
good (a genuine sender refused 600 s later), and 16 ids x 1,024 partial messages 11.5 MB for good.
What a forgotten connection held undelivered, or had of ours unacknowledged, is logged.
Connection timers wait in a heap, so a loop turn touches only the connections that are due or active.

With `--echo` or `--response-size`, every connection limits its amplification
(`Connection.limit_amplification`): until its peer has echoed one of our DATA packets, it sends at
most 3 times the bytes received from it, beyond one packet at a time, so a forged request with the
victim's source address buys the victim a packet or so, not the whole response, and the short expiry
above ends its retransmissions.

Under a controller that reads ECN (`nscc`) the socket also asks for each datagram's TOS byte
(IP_RECVTOS, read from recvmsg's ancillary data) and tells the connection which arrived CE-marked;
otherwise it reads with plain recvfrom, which is cheaper.

Under receiver-driven credit (`credit`) every connection draws its credit from one `CreditScheduler`
(transport.core.credit), since they all share this host's link; the loop fires it by its timer like
the connections' own and lets the connections it granted to send.

At the paced rates of an emulated fabric the receiver's CPU goes on wake-ups. Its one socket is read
to EAGAIN on each (no re-poll), and while the one connection it serves holds a coalesced ACK, it does
not wake for each further packet the ACK will answer: it sleeps until the ACK is due (its deadline,
or the time the batch should fill at the rate packets have been arriving) and reads them all then.
The first packet of each batch is still read as it arrives, so the ACK's RTT echo and reported hold
are exact; the ACK's content is what it would have been. With the kernel's arrival times
(SO_TIMESTAMPNS, asked for with coalesced ACKs unless the socket reads TOS bytes for ECN) it also
sleeps between batches while a message streams in. Under credit, whose grants are clocked by
arrivals, it reads as packets arrive.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import logging
import socket
import struct
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from transport.core import wire
from transport.core.config import TransportConfig
from transport.core.connection import Connection
from transport.core.credit import CreditScheduler
from transport.core.events import Event, MessageReceived
from transport.core.pump import Pump, linger
from transport.core.schema import ReceiverConnection, ReceiverMetrics
from transport.io.addressing import DEFAULT_PORT
from transport.io.eventloop import (
    DEFER_MIN,
    EndpointError,
    EventLoop,
    SendCounters,
    SocketSender,
    mark_control,
    read_batch,
    read_stamped_batch,
    socket_drops,
    stamp_arrivals,
)
from transport.io.workload import SEQ_LEN, check_payload, make_payload, payload_seq

log = logging.getLogger(__name__)

_TYPE_DATA = wire.TYPE_DATA
_TYPE_OFFSET = wire.TYPE_OFFSET
_EV_OFFSET = wire.EV_OFFSET
# Connections examined for expiry in one loop turn at most: forgetting one computes its final record
# (~20 us), and a burst of them falling due together must not hold up the traffic of the others.
_EXPIRE_PER_TURN = 64
# A connection that has not proved it is real (see the module's docstring) is forgotten after this
# many rto_max of silence (4 s by default), or idle_timeout if that is shorter.
UNPROVEN_RTOS = 4
# Amplification allowed towards a peer not yet validated (Connection.limit_amplification).
AMPLIFICATION = 3
# Weight of a new sample in the receiver's running mean of the time between packets.
_GAP_GAIN = 0.125
# Reads further apart than this are separate bursts, not one flow's spacing.
_GAP_MAX = 0.5
_ECN_CE = 0x3  # the CE codepoint in the low two bits of the TOS byte
_ECN_READERS = ("nscc",)  # controllers that act on CE marks


def _recv_with_ce(sock: socket.socket) -> Callable[[int], tuple[Any, ...]]:
    """A recvfrom for `sock` that returns (data, address) and, for a CE-marked datagram, a third item."""
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    recvmsg = sock.recvmsg
    space = socket.CMSG_SPACE(1)
    ip, tos = socket.IPPROTO_IP, socket.IP_TOS

    def recv(size: int) -> tuple[Any, ...]:
        data, ancillary, _flags, addr = recvmsg(size, space)
        for level, kind, value in ancillary:
            if level == ip and kind == tos and value and value[0] & _ECN_CE == _ECN_CE:
                return data, addr, True
        return data, addr

    return recv


class _Peer:
    """One connection at the receiver, with the address its ACKs and responses go to."""

    __slots__ = (
        "addr", "bytes", "conn", "connection_id", "corrupt", "datagrams", "duplicates", "evaddr", "first",
        "host", "key", "last", "last_message", "messages", "ports", "pump", "seen", "timer",
    )

    def __init__(self, conn: Connection, connection_id: int, addr: tuple[Any, ...], now: float) -> None:
        self.conn = conn
        self.connection_id = connection_id
        self.addr = addr
        self.host = addr[0]
        self.key = (addr[0], connection_id)
        self.first = now
        self.last = now  # the latest datagram
        self.timer: float | None = None  # the deadline this peer has in the receiver's timer heap
        self.last_message = now
        self.bytes = 0
        self.messages = 0
        self.datagrams = 0
        self.corrupt = 0
        self.duplicates = 0
        self.ports: dict[int, int] = {}
        self.evaddr: dict[int, tuple[Any, ...]] = {}
        self.seen: set[int] | None = None
        self.pump: Pump  # set by the receiver, whose sends it makes


class Receiver(EventLoop):
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
        # (deadline, tie-break, peer): a peer's entry is live while its deadline is peer.timer;
        # entries left behind when a timer moves are skipped as they surface.
        self._timers: list[tuple[float, int, _Peer]] = []
        # (when to look at the peer again, tie-break, peer): whether it has gone idle.
        self._expiry: list[tuple[float, int, _Peer]] = []
        self._tie = itertools.count()
        self._per_source: dict[Any, int] = {}
        self._expired: list[ReceiverConnection] = []  # records of forgotten connections, capped
        self.connections_refused = 0
        self.connections_expired = 0
        self.datagrams_received = 0
        self.invalid = 0
        self.sent = SendCounters()
        self.bytes = 0
        self.messages = 0
        self.first_packet: float | None = None
        self.last_message: float | None = None
        self._done_at: float | None = None
        self._last_rx = 0.0
        self._gap = 0.0  # running mean of the time between datagrams (0: not known yet)
        self._stamped = False  # the socket's datagrams carry their arrival time (open())
        self._last_arrival = 0.0
        self.repoll = False  # its reader drains the one socket to EAGAIN
        self._magic = struct.pack("!H", wire.MAGIC)
        self._credit: CreditScheduler | None = None  # made with the first connection that uses credit

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
        # This socket sends nothing but ACKs and credit: control, served before data on shaped links.
        mark_control(s)
        ecn = self.config.cc in _ECN_READERS and family == socket.AF_INET
        # With coalesced ACKs the loop reads late on purpose (see _defer), so it asks the kernel when
        # each datagram arrived: the core is handed that, not the read time. (A socket that reads
        # TOS bytes for ECN reads on arrival between ACK batches instead.)
        self._stamped = not ecn and self.config.ack_delay > 0 and stamp_arrivals(s)
        if self._stamped:
            reader = partial(self._drain_stamped, s.recvmsg)
        else:
            reader = partial(self._drain, _recv_with_ce(s) if ecn else s.recvfrom)
        self._register(s, reader)
        self.sock = s

    def _new_peer(self, data: bytes, cid: int, addr: tuple[Any, ...], now: float) -> _Peer | None:
        """The connection a datagram of an unknown (source, connection id) opens; None (counted as
        invalid or refused) when it opens none."""
        # Only a well-formed DATA packet opens a connection: stray ACKs or garbage must not make
        # the receiver allocate state.
        try:
            packet = wire.decode(data)
        except Exception:  # decode errors of any kind mean "not ours"
            packet = None
        if not isinstance(packet, wire.DataPacket):
            self.invalid += 1
            return None
        config = self.config
        host = addr[0]
        from_host = self._per_source.get(host, 0)
        if len(self.peers) >= config.max_connections or from_host >= config.max_connections_per_source:
            if not self.connections_refused:
                log.warning(
                    "refusing new connections: %d held (max_connections %d), %d from %s "
                    "(max_connections_per_source %d)", len(self.peers), config.max_connections, from_host, host,
                    config.max_connections_per_source,
                )
            self.connections_refused += 1
            return None
        conn = Connection(config, cid, seed=cid)
        if self.echo or self.response_size:
            conn.limit_amplification(AMPLIFICATION)
        peer = _Peer(conn, cid, addr, now)
        if conn.credit_receiver is not None:
            if self._credit is None:
                self._credit = CreditScheduler.from_config(config)
                self._credit.keep_touched = True
            conn.use_credit_scheduler(self._credit).owner = peer  # type: ignore[union-attr]
        if self.verify:
            peer.seen = set()
        sendto = self.sock.sendto  # type: ignore[union-attr]  # the datagram came in on it
        evaddr_get = peer.evaddr.get
        # Each ACK goes back to the address that sent the DATA it names (peer.addr: the latest one).
        peer.pump = Pump(conn, SocketSender(lambda dgram, ev: sendto(dgram, evaddr_get(ev, peer.addr)), self.sent),
                         partial(self._on_event, peer))
        self.peers[peer.key] = peer
        self._per_source[host] = from_host + 1
        if config.idle_timeout > 0:
            heapq.heappush(self._expiry, (now + self._silence_allowed(peer), next(self._tie), peer))
        log.info("new connection %#x from %s:%d", cid, addr[0], addr[1])
        return peer

    def _silence_allowed(self, peer: _Peer) -> float:
        """How long ``peer`` may stay silent before it is forgotten (see the module's docstring)."""
        conn = peer.conn
        idle = self.config.idle_timeout
        if conn.peer_validated or (peer.messages and not conn.sending):
            return idle
        return min(idle, UNPROVEN_RTOS * self.config.rto_max)

    def _expire(self, now: float) -> None:
        """Forget connections silent for longer than they may be, whatever they hold."""
        heap = self._expiry
        peers = self.peers
        for _ in range(_EXPIRE_PER_TURN):
            if not heap or heap[0][0] > now:
                return
            _, _, peer = heapq.heappop(heap)
            if peers.get(peer.key) is not peer:
                continue
            quiet_until = peer.last + self._silence_allowed(peer)
            if quiet_until > now:
                heapq.heappush(heap, (quiet_until, next(self._tie), peer))  # heard from since
            else:
                self._forget(peer)

    def _forget(self, peer: _Peer) -> None:
        conn = peer.conn
        held = conn.stats.reassembly_bytes
        if held or conn.sending:
            # Loss is never silent: what dies with the connection is said; as a warning once it had
            # delivered a message (spoofed first fragments would flood the log with one each).
            log.log(logging.WARNING if peer.messages else logging.INFO,
                    "connection %#x from %s forgotten after %.3g s of silence with %d bytes undelivered and %d "
                    "messages of ours unacknowledged", peer.connection_id, peer.host, self._silence_allowed(peer),
                    held, conn.stats.messages_sent - conn.stats.messages_acked)
        del self.peers[peer.key]
        if peer.conn.credit_receiver is not None:
            peer.conn.credit_receiver.detach()
        left = self._per_source[peer.host] - 1
        if left:
            self._per_source[peer.host] = left
        else:
            del self._per_source[peer.host]
        peer.timer = None  # its timer heap entries are stale now
        self._active.discard(peer)
        self.connections_expired += 1
        # The final record stays in the metrics (an experiment joins it with the sender's), for as
        # many forgotten connections as may be held at once; beyond that they are only counted.
        if len(self._expired) < self.config.max_connections:
            self._expired.append(self._record(peer))
        log.info("connection %#x from %s idle for %g s: forgotten", peer.connection_id, peer.host,
                 self.config.idle_timeout)

    def _drain(self, recvfrom: Callable[[int], tuple[bytes, Any]], now: float) -> int:
        # One socket for all peers: drain it, so the failing recv() at the end is amortised.
        # An ICMP error for an earlier reply (the sender went away) counts as a read.
        batch, n = read_batch(recvfrom, self._recv_size)
        self._take(batch, None, now)
        if n:
            gap = now - self._last_rx
            if gap < _GAP_MAX:
                self._gap_sample(gap / n)
            self._counted(n, now)
        return n

    def _drain_stamped(self, recvmsg: Callable[..., Any], now: float) -> int:
        """`_drain` with each datagram's arrival time from the kernel."""
        batch, times, n = read_stamped_batch(recvmsg, self._recv_size)
        self._take(batch, times, now)
        if times:
            gap = times[-1] - self._last_arrival
            if gap < _GAP_MAX:
                self._gap_sample(gap / len(times))
            self._last_arrival = times[-1]
        if n:
            self._counted(n, now)
        return n

    def _gap_sample(self, sample: float) -> None:
        g = self._gap
        self._gap = sample if not g else g + (sample - g) * _GAP_GAIN

    def _counted(self, n: int, now: float) -> None:
        self.datagrams_received += n
        self._last_rx = now
        if self.first_packet is None:
            self.first_packet = now

    def _take(self, batch: list[tuple[Any, ...]], times: list[float] | None, now: float) -> None:
        """Hand each datagram to its connection (opening one for a new sender's first DATA), at the
        time it arrived (`times`) or at `now`."""
        peers = self.peers
        read_cid = wire.read_conn_id
        active = self._active
        magic = self._magic
        t = now
        # A reader for ECN adds a third item to a CE-marked datagram's pair.
        for i, (data, addr, *ce) in enumerate(batch):
            if times is not None:
                t = times[i]
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
                peer = self._new_peer(data, cid, addr, t)
                if peer is None:
                    continue
            peer.datagrams += 1
            peer.last = t
            ports = peer.ports
            port = addr[1]
            ports[port] = ports.get(port, 0) + 1
            if peer.conn.receive_datagram(data, t, bool(ce)):
                # Addresses are learnt only from datagrams that parsed and passed the CRC, so
                # that a garbage packet with a forged source cannot redirect the ACKs.
                peer.addr = addr
                if data[_TYPE_OFFSET] == _TYPE_DATA:
                    # Remember which source address carries each EV: an ACK names the EV of the
                    # DATA that triggered it and goes back to the socket that sent that DATA.
                    peer.evaddr[data[_EV_OFFSET] << 8 | data[_EV_OFFSET + 1]] = addr
            active.add(peer)

    def _on_event(self, peer: _Peer, event: Event, now: float) -> None:
        if not isinstance(event, MessageReceived):
            return
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
            peer.conn.send_message(data)
        elif self.response_size:
            # The response starts with the request's sequence prefix so the sender can match it.
            peer.conn.send_message(data[:SEQ_LEN] + make_payload(payload_seq(data), self.response_size)[SEQ_LEN:]
                                   if self.response_size > SEQ_LEN else data[: self.response_size])

    def _turn(self, now: float) -> float | None:
        active = self._active
        timers = self._timers
        heappop, heappush = heapq.heappop, heapq.heappush
        while timers and timers[0][0] <= now:
            t, _, peer = heappop(timers)
            if peer.timer != t:
                continue  # moved or forgotten since
            peer.timer = None
            peer.conn.handle_timer(now)
            active.add(peer)
        if self._expiry and self._expiry[0][0] <= now:
            self._expire(now)
        credit = self._credit
        if credit is not None:
            for rx in credit.take_touched():
                active.add(rx.owner)
            t = credit.get_timer()
            if t is not None and t <= now:
                for rx in credit.handle_timer(now):
                    active.add(rx.owner)
        tie = self._tie
        for peer in active:
            pump = peer.pump
            pump.events(now)
            pump.flush(now)
            # Only what ran this turn can have moved its timer.
            timer = pump.timer()
            if timer != peer.timer:
                peer.timer = timer
                if timer is not None:
                    heappush(timers, (timer, next(tie), peer))
        active.clear()
        while timers and timers[0][2].timer != timers[0][0]:
            heappop(timers)
        if len(timers) > 4 * len(self.peers) + 64:
            # Timers that keep moving leave stale entries behind: rebuild from the live ones.
            timers[:] = [e for e in timers if e[2].timer == e[0]]
            heapq.heapify(timers)
        wake = timers[0][0] if timers else None
        if credit is not None:
            t = credit.get_timer()
            if t is not None and (wake is None or t < wake):
                wake = t
        if self._expiry:
            t = self._expiry[0][0]
            if wake is None or t < wake:
                wake = t
        if self.expect_bytes and self.bytes >= self.expect_bytes:
            # Linger until the senders have gone quiet so that a lost final ACK can be repeated.
            if self._done_at is None:
                self._done_at = now
            over, until = linger(now, self._done_at, self._last_rx, self.linger)
            if over:
                self.stop("expected bytes received")
                return None
            if wake is None or until < wake:
                wake = until
        if len(self.peers) == 1 and self._credit is None:  # credit grants are clocked by arrivals
            wake = self._defer(now, wake)
        return wake

    def _defer(self, now: float, wake: float | None) -> float | None:
        """Sleep through the packets a coalesced ACK will answer instead of waking for each.

        While the one connection holds an ACK: until `wake` (its deadline at the latest) or when
        the packets that send it at once should have arrived, at the rate packets have been
        arriving. With arrival times from the kernel, also between ACKs while a message streams in:
        until the next batch should be complete or its first packet's hold is over, whichever is
        sooner.
        """
        conn = next(iter(self.peers.values())).conn
        room = conn.ack_room
        gap = self._gap
        if room:
            until = wake
            if gap:
                fill = now + room * gap
                if until is None or fill < until:
                    until = fill
        elif self._stamped and gap and now - self._last_rx <= 2 * gap and (left := conn.message_packets_left):
            # Mid-message (a message's last packet, or a request, is read as it arrives): the next
            # batch's first packet is stamped as it arrives, so its ACK's hold and RTT echo stay
            # exact however late it is read, and reading by its deadline keeps the ACK on time.
            batch = self.config.ack_batch
            if left < 2 or batch < 2:
                # The next packet is read as it arrives: a message's last is ACKed at once, and a
                # deferral that ended just before it would add an empty wake-up.
                return wake
            # Until the batch should be complete, or the next packet (about a gap from now) has
            # waited its hold: either way its ACK is due when the loop wakes, so one wake-up (one
            # turn, in a group) reads the batch and answers it. Ending one hold from now instead
            # woke twice per ACK when packets came further apart than half the hold: once to find
            # one packet, and again at that packet's deadline.
            until = now + min(min(left, batch) * gap, gap + self.config.ack_delay)
            if wake is not None and wake < until:
                until = wake
        else:
            return wake
        if until is not None and until - now >= DEFER_MIN:
            # Reading late is safe only for one connection: the first packet of another's batch
            # would wait behind this one's. Socket buffers hold far more than a deferral's worth
            # of packets at the rates where it applies.
            self.defer_reads = True
            return until
        return wake

    def run(self) -> dict[str, Any]:
        if self.sock is None:
            self.open()
        try:
            self._run_loop()
            return self.results()
        finally:
            self.close()

    def results(self) -> ReceiverMetrics:
        """The metrics once the loop has ended, with what the kernel dropped on the socket (read in
        its network namespace)."""
        self._socket_drops = socket_drops([self.sock]) if self.sock else None
        return self.metrics()

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

    def metrics(self) -> ReceiverMetrics:
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
            "datagrams_sent": self.sent.datagrams_sent,
            "pps_received": self.datagrams_received / duration if duration > 0 else 0.0,
            "invalid_datagrams": self.invalid,
            # Any failed send: a receiver's unconnected socket has no refused count of its own.
            "send_errors": self.sent.send_errors + self.sent.refused,
            "socket_drops": getattr(self, "_socket_drops", None),
            "expect_bytes": self.expect_bytes,
            "config": self.config.to_dict(),
            "connections_refused": self.connections_refused,
            "connections_expired": self.connections_expired,
            "connections": [*self._expired, *(self._record(p) for p in self.peers.values())],
        }

    @staticmethod
    def _record(p: _Peer) -> ReceiverConnection:
        return {
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
