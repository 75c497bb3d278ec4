"""The srd receiver: one UDP port serving any number of sender connections.

Datagrams are demultiplexed by (peer IP, connection id): the peer's source *port* varies with the
EV, so it cannot be part of the key. The first valid DATA packet of an unknown connection creates its
`Connection`, and each ACK goes to the source address of the DATA packet that triggered it (the ACK
names that packet's EV), so it reaches the sender's socket for that EV.
"""

from __future__ import annotations

import errno
import logging
import socket
import struct
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from transport import wire
from transport.addressing import DEFAULT_PORT
from transport.config import TransportConfig
from transport.connection import Connection
from transport.eventloop import EndpointError, EventLoop, read_batch, socket_drops
from transport.events import MessageReceived
from transport.schema import ReceiverMetrics
from transport.workload import SEQ_LEN, check_payload, make_payload, payload_seq

log = logging.getLogger(__name__)

_TYPE_DATA = wire.TYPE_DATA
_TYPE_OFFSET = wire.TYPE_OFFSET
_EV_OFFSET = wire.EV_OFFSET


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
        self._register(s, partial(self._drain, s.recvfrom))
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
        # An ICMP error for an earlier reply (the sender went away) counts as a read.
        batch, n = read_batch(recvfrom, size)
        for data, addr in batch:
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
            peer.datagrams += 1
            ports = peer.ports
            port = addr[1]
            ports[port] = ports.get(port, 0) + 1
            if peer.conn.receive_datagram(data, now):
                # Addresses are learnt only from datagrams that parsed and passed the CRC, so
                # that a garbage packet with a forged source cannot redirect the ACKs.
                peer.addr = addr
                if data[_TYPE_OFFSET] == _TYPE_DATA:
                    # Remember which source address carries each EV: an ACK names the EV of the
                    # DATA that triggered it and goes back to the socket that sent that DATA.
                    peer.evaddr[data[_EV_OFFSET] << 8 | data[_EV_OFFSET + 1]] = addr
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
            "datagrams_sent": self.datagrams_sent,
            "pps_received": self.datagrams_received / duration if duration > 0 else 0.0,
            "invalid_datagrams": self.invalid,
            "send_errors": self.send_errors,
            "socket_drops": getattr(self, "_socket_drops", None),
            "expect_bytes": self.expect_bytes,
            "config": self.config.to_dict(),
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
