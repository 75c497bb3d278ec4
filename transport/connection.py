"""Sans-I/O connection of the fabriclab transport, in the shape of aioquic's QuicConnection.

The state machine never reads a clock, never touches a socket and draws randomness only from the
``random.Random(seed)`` it owns. It is driven by ``send_message()``, ``receive_datagram(data, now)``
and ``handle_timer(now)`` and drained by ``datagrams_to_send(now)``, ``get_timer()`` and
``next_event()``. Both ends use this class; each direction is independent (one side's sender
talks to the other side's receiver).

Internally PSNs and message ids are unbounded integers ("seq"), counted from the initial PSN and
from 0; only the wire carries them modulo 2^32, and incoming values are mapped back with
serial-number arithmetic relative to a nearby reference, so wraparound needs no special cases.
"""

from __future__ import annotations

import heapq
import logging
import random
import zlib
from collections import OrderedDict, deque

from transport.config import TransportConfig
from transport.congestion import make_cc
from transport.events import Event, MessageAcked, MessageReceived
from transport.metrics import Stats
from transport.paths import PathPolicy, make_policy
from transport.recovery import Pacer, RttEstimator, SentPacket, reorder_allowance, rto
from transport.wire import (
    ACK_LEN,
    ACK_NOCRC_STRUCT,
    ACK_STRUCT,
    CRC_STRUCT,
    DATA_HEADER_LEN,
    DATA_NOCRC_STRUCT,
    DATA_STRUCT,
    FLAG_NAK,
    FLAG_RETRANSMIT,
    MAGIC,
    MSG_ID_MASK,
    PSN_MASK,
    SACK_BITS,
    TIMESTAMP_MASK,
    TYPE_ACK,
    TYPE_DATA,
    VERSION,
    AckPacket,
    DataPacket,
    WireError,
    decode,
    psn_diff,
)

__all__ = ["Connection", "Event", "MessageAcked", "MessageReceived"]

logger = logging.getLogger(__name__)

# Retransmitted PSNs remembered after being acknowledged, so that a late ACK echoing the original
# transmission can still reveal the retransmission as spurious.
_RETIRED_MAX = 4096
# The reordering allowance widens up to this multiple of reorder_window after spurious
# retransmissions, and halves again after this many smoothed RTTs without one.
_REORDER_SCALE_MAX = 16.0
_REORDER_DECAY_RTTS = 16.0


# The hot path packs and parses headers with these directly (see wire.py for the layout).
_pack_data_head = DATA_NOCRC_STRUCT.pack
_pack_ack_head = ACK_NOCRC_STRUCT.pack
_pack_crc = CRC_STRUCT.pack
_unpack_data = DATA_STRUCT.unpack_from
_unpack_ack = ACK_STRUCT.unpack_from
_crc32 = zlib.crc32
_HEAD_NOCRC = DATA_HEADER_LEN - 4
_ACK_NOCRC = ACK_LEN - 4
_HALF = 1 << 31
_FULL = 1 << 32


class _OutMessage:
    """A message being sent: fragmented lazily, and counted down as its fragments are acknowledged."""

    __slots__ = ("data", "frag_count", "msg_id", "next_frag", "remaining", "size", "submitted", "wire_id")

    def __init__(self, msg_id: int, data: bytes, frag_count: int, submitted: float) -> None:
        self.msg_id = msg_id
        self.wire_id = msg_id & MSG_ID_MASK
        self.data = data
        self.size = len(data)
        self.frag_count = frag_count
        self.next_frag = 0
        self.remaining = frag_count  # fragments not yet acknowledged
        self.submitted = submitted


class _Reassembly:
    """A message being reassembled from its fragments."""

    __slots__ = ("first_seq", "frag_count", "frag_size", "frags", "last_size", "msg_len", "nbytes", "received")

    def __init__(self, first_seq: int, frag_count: int, msg_len: int, frag_size: int) -> None:
        self.first_seq = first_seq
        self.frag_count = frag_count
        self.msg_len = msg_len
        self.frag_size = frag_size  # payload of every fragment but the last; 0 until known
        # Size the last fragment must have (known once frag_size is); -1 = not known yet.
        self.last_size = msg_len - frag_size * (frag_count - 1) if frag_size else -1
        self.frags: list[bytes | None] = [None] * frag_count
        self.received = 0
        self.nbytes = 0


def _msg_diff(a: int, b: int) -> int:
    d = (a - b) & MSG_ID_MASK
    return d - (1 << 32) if d >= 1 << 31 else d


class Connection:
    def __init__(self, config: TransportConfig, connection_id: int, *, seed: int = 0, initial_psn: int = 0) -> None:
        config.validate()
        if not 0 <= connection_id <= 0xFFFFFFFF:
            raise ValueError(f"connection_id {connection_id} does not fit 32 bits")
        self.config = config
        self.connection_id = connection_id
        self.initial_psn = initial_psn & PSN_MASK
        self._rng = random.Random(seed)
        self._policy = make_policy(config.path_policy, config.num_evs, self._rng)
        self._cc = make_cc(
            config.cc, config.window, config.max_window, config.target_delay, config.pacing, config.target_packets
        )
        # With coalesced ACKs one ACK opens the window by up to ack_batch packets at once; a pacer
        # that banked only 4 intervals of idle time would split that into several wake-ups.
        self._pacer = Pacer(burst=max(4, config.ack_batch) if config.ack_delay > 0 else 4)
        self._events: deque[Event] = deque()
        self._now = 0.0
        self.stats = Stats()
        self._payload = config.max_payload
        self._gobackn = config.recovery == "gobackn"
        self._ordered = config.delivery == "ordered"
        self._num_evs = config.num_evs
        self._ack_delay = config.ack_delay
        self._ack_batch = config.ack_batch

        # --- sender ---
        self._next_msg = 0
        self._send_queue: deque[_OutMessage] = deque()
        self._next_seq = 0  # next new PSN (as seq)
        self._snd_una = 0  # lowest unacknowledged seq
        self._sent: dict[int, SentPacket] = {}  # unacknowledged, transmitted at least once
        self._inflight: OrderedDict[int, SentPacket] = OrderedDict()  # in transmission order
        self._retx: list[int] = []  # heap of seqs declared lost, awaiting retransmission
        self._retired: OrderedDict[int, SentPacket] = OrderedDict()
        self._tx_counter = 0
        self._rack_order = 0  # tx_order of the most recently sent packet known delivered
        self._rack_dirty = False
        self._loss_time: float | None = None
        self._rtt = RttEstimator()
        self._ev_rtt: dict[int, RttEstimator] = {}
        # How long the peer may hold an ACK (RFC 9002's max_ack_delay): loss detection and the RTO
        # wait that much longer, since a packet answered by a held ACK is not late. Starts at our
        # own setting (both ends normally share one) and follows the longest holds the peer
        # reports: up at once, down slowly (a fast connection fills its batches in microseconds).
        self._ack_allow = config.ack_delay
        self._backoff = 0
        # When an ACK last acknowledged something new: the RTO runs from here as well as from the
        # oldest packet's send time (RFC 6298 restarts the timer on new ACKs). While ACKs keep
        # arriving, a queue is draining, not a path dead; losses in it are RACK's to find.
        self._last_progress = float("-inf")
        # Multiplier of reorder_window, doubled per spurious retransmission (see _on_spurious).
        self._reorder_scale = 1.0
        self._reorder_since = 0.0
        self._rto_value: float | None = None  # rto() for the current estimate and backoff; None = stale
        self._rewind_seq = -1
        self._rewind_time = float("-inf")
        self._pacing_blocked = False
        self._pacing_quantum = config.pacing_quantum
        # Beyond this many PSNs past the oldest unacknowledged one the sender stops taking new
        # PSNs: bounds its own memory of unacknowledged packets.
        self._send_span = 4 * config.max_window + max(1, config.max_reassembly_bytes // self._payload)

        # --- receiver ---
        self._window_psns = max(1, config.max_reassembly_bytes // self._payload)
        self._max_message = self._window_psns * self._payload
        # Until the peer advertises its window, assume it is configured like us.
        self._peer_limit = min(config.max_window, self._window_psns)
        self._rcv_nxt = 0  # every seq below has been received
        self._rcv_base = 0  # first seq of the message straddling rcv_nxt (memory is counted from here)
        self._rcv_ooo: dict[int, tuple[int, int]] = {}  # seq above rcv_nxt -> (frag_index, frag_count)
        self._rcv_highest = -1
        self._msg_head = 0  # lowest message id not yet delivered
        self._reasm: dict[int, _Reassembly] = {}
        self._completed: dict[int, bytes] = {}  # ordered delivery: complete, waiting for earlier ids
        self._delivered_above: set[int] = set()  # unordered delivery: delivered ids above the head
        self._nak_sent_for = -1
        self._out_acks: list[tuple[bytes, int]] = []
        self._ack_pending = 0
        self._ack_deadline: float | None = None
        # The packet the next coalesced ACK answers (the batch's first): seq, echo timestamp, EV, arrival.
        self._ack_seq = -1
        self._ack_lo = self._ack_hi = -1  # lowest and highest PSN (seq) the held ACK answers
        self._ack_ts = 0
        self._ack_ev = 0
        self._ack_arrival = 0.0

    # ------------------------------------------------------------------ API

    @property
    def path_policy(self) -> PathPolicy:
        """The policy choosing this connection's EVs (a plug-in's guard has a `fault`)."""
        return self._policy

    @property
    def max_message_size(self) -> int:
        """Largest message the peer (with the same configuration) can reassemble."""
        return self._max_message

    def send_message(self, data: bytes, now: float | None = None) -> int:
        """Queue a message; returns its id. ``now`` defaults to the latest time the connection saw."""
        data = bytes(data)
        if len(data) > self._max_message:
            raise ValueError(
                f"message of {len(data)} bytes exceeds the reassembly limit of {self._max_message} bytes"
            )
        if now is not None:
            self._now = now
        msg_id = self._next_msg
        self._next_msg += 1
        count = max(1, -(-len(data) // self._payload))
        self._send_queue.append(_OutMessage(msg_id, data, count, self._now))
        self.stats.messages_sent += 1
        return msg_id & MSG_ID_MASK

    def receive_datagram(self, data: bytes, now: float) -> None:
        """Process one datagram from the peer. Never raises: bad input is counted as dropped."""
        self._now = now
        # Fast path: parse the fixed header in place and validate it exactly as wire.decode()
        # does, without building a packet object; anything it does not accept goes through
        # decode(), which names the problem.
        try:
            n = len(data)
            ptype = data[3] if n > 3 else 0
            if ptype == TYPE_DATA and n >= DATA_HEADER_LEN:
                (magic, version, _t, _flags, ev, cid, psn, msg_id, idx, count, msg_len, ts, plen,
                 crc) = _unpack_data(data)
                payload = bytes(data[DATA_HEADER_LEN:])
                if (
                    magic == MAGIC
                    and version == VERSION
                    and plen == n - DATA_HEADER_LEN
                    and _crc32(payload, _crc32(data[:_HEAD_NOCRC])) == crc
                    and idx < count
                    and plen <= msg_len
                ):
                    if cid != self.connection_id:
                        self.stats.drop("wrong_connection")
                        return
                    try:
                        self._on_data(psn, msg_id, idx, count, msg_len, ts, ev, payload, now)
                    except Exception:
                        self._internal_error()
                    return
            elif ptype == TYPE_ACK and n == ACK_LEN:
                fields = _unpack_ack(data)
                if fields[0] == MAGIC and fields[1] == VERSION and _crc32(data[:_ACK_NOCRC]) == fields[-1]:
                    if fields[5] != self.connection_id:
                        self.stats.drop("wrong_connection")
                        return
                    try:
                        self._on_ack(fields, now)
                    except Exception:
                        self._internal_error()
                    return
            pkt = decode(data)  # raises WireError for everything the fast path rejected
        except WireError as exc:
            self.stats.drop("malformed")
            logger.debug("dropped malformed datagram: %s", exc)
            return
        except Exception:  # a decoder bug must not take the connection down
            self.stats.drop("malformed")
            logger.exception("unexpected error decoding a datagram")
            return
        # Only reached if decode() accepts what the fast path did not (it should not happen).
        if pkt.conn_id != self.connection_id:
            self.stats.drop("wrong_connection")
            return
        try:
            if isinstance(pkt, DataPacket):
                self._on_data(
                    pkt.psn, pkt.msg_id, pkt.frag_index, pkt.frag_count, pkt.msg_len, pkt.timestamp, pkt.ev,
                    pkt.payload, now,
                )
            else:
                self._on_ack(_ack_fields(pkt), now)
        except Exception:
            self._internal_error()

    def _internal_error(self) -> None:
        # Validation happens before any state changes, so this is a bug; keep running.
        self.stats.drop("internal_error")
        logger.exception("error processing a datagram")

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, int]]:
        """Everything that may be sent now: ACKs first, then retransmissions, then new data."""
        self._now = now
        if self._ack_pending and self._ack_deadline is not None and now >= self._ack_deadline:
            self._flush_ack(now)
        out = self._out_acks
        self._out_acks = []
        self._pacing_blocked = False
        queue = self._send_queue
        retx = self._retx
        if not (queue or retx):
            return out
        # Window, pacing rate and timestamp cannot change within one call (only ACKs, losses and
        # timeouts move them), so they are read once.
        cc = self._cc
        cwnd = cc.window
        rate = cc.pacing_rate
        interval = 1.0 / rate if rate and rate > 0 else 0.0
        pacer = self._pacer
        next_time = pacer.next_time
        burst_floor = now - pacer.burst * interval
        # Pace in quanta: the timer wakes the driver when the next packet is due, and the call
        # then also sends what falls due within the quantum (at least one packet interval), so
        # a slow connection sends 2+ packets per wake-up. Every wake-up of a Python endpoint
        # costs far more CPU than the packet itself; the average rate is unchanged.
        q = self._pacing_quantum
        horizon = now + (0.0 if q <= 0 else (q if q > interval else interval))
        ts = round(now * 1e6) & TIMESTAMP_MASK
        inflight = self._inflight
        sent = self._sent
        n_inflight = len(inflight)
        append = out.append
        next_ev = self._policy.next_ev
        num_evs = self._num_evs
        size = self._payload
        cid = self.connection_id
        ipsn = self.initial_psn
        st = self.stats
        per_ev = st.per_ev
        span = self._send_span
        n_new = 0
        new_bytes = 0
        while True:
            has_retx = bool(retx) and self._has_retx()
            if not has_retx:
                if not queue:
                    break
                seq = self._next_seq
                if seq - self._snd_una >= span or not (seq < self._peer_limit or not n_inflight):
                    # Receive window closed (one packet may probe it when nothing is in flight,
                    # so a lost window update cannot stall the connection).
                    break
            if n_inflight >= cwnd:
                break
            if next_time > horizon:
                self._pacing_blocked = True
                break
            if has_retx:
                append(self._transmit(sent[heapq.heappop(retx)], now, retransmit=True))
            else:
                # A new PSN: the next fragment of the oldest queued message.
                msg = queue[0]
                i = msg.next_frag
                payload = msg.data[i * size : (i + 1) * size]
                rec = SentPacket(seq, msg.msg_id, i, msg.frag_count, msg.size, payload, msg)
                self._next_seq = seq + 1
                msg.next_frag = i + 1
                if i + 1 >= msg.frag_count:
                    queue.popleft()
                ev = next_ev(now, None) % num_evs
                self._tx_counter += 1
                rec.sent_time = now
                rec.ev = ev
                rec.ts = ts
                rec.tx_order = self._tx_counter
                sent[seq] = rec
                inflight[seq] = rec
                head = _pack_data_head(
                    MAGIC, VERSION, TYPE_DATA, 0, ev, cid, (ipsn + seq) & PSN_MASK, msg.wire_id, i,
                    msg.frag_count, msg.size, ts, len(payload),
                )
                data = head + _pack_crc(_crc32(payload, _crc32(head))) + payload
                nbytes = len(data)
                evs = per_ev.get(ev) or st.ev(ev)
                evs.packets_sent += 1
                evs.bytes_sent += nbytes
                n_new += 1
                new_bytes += nbytes
                append((data, ev))
            n_inflight += 1
            if interval:
                next_time = (next_time if next_time > burst_floor else burst_floor) + interval
            else:
                next_time = float("-inf")
        pacer.next_time = next_time
        st.packets_sent += n_new
        st.bytes_sent += new_bytes
        return out

    def get_timer(self) -> float | None:
        """Absolute time of the next timer (ACK delay, loss detection, RTO or pacing), or None."""
        t = self._ack_deadline if self._ack_pending else None
        lt = self._loss_time
        if lt is not None and (t is None or lt < t):
            t = lt
        if self._inflight:
            rt = self._rto_deadline()
            if t is None or rt < t:
                t = rt
        if self._pacing_blocked:
            pt = self._pacer.next_time
            if t is None or pt < t:
                t = pt
        return t

    def handle_timer(self, now: float) -> None:
        self._now = now
        if self._ack_pending and self._ack_deadline is not None and now >= self._ack_deadline:
            self._flush_ack(now)
        if self._loss_time is not None and now >= self._loss_time:
            self._detect_losses(now)
        if self._inflight and now >= self._rto_deadline():
            self._on_rto(now)
        if self._pacing_blocked and now >= self._pacer.next_time:
            self._pacing_blocked = False  # the driver's next datagrams_to_send() sends

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    @property
    def idle(self) -> bool:
        """Nothing outstanding, nothing queued to send, no ACK owed."""
        return not (self._send_queue or self._sent or self._out_acks or self._ack_pending)

    def metrics(self) -> dict:
        m = self.stats.summary()
        m["connection_id"] = self.connection_id
        m["config"] = self.config.to_dict()
        m["state"] = {
            "cwnd": self._cc.window,
            "srtt": self._rtt.srtt,
            "rttvar": self._rtt.rttvar,
            "min_rtt": self._rtt.min_rtt,
            "inflight": len(self._inflight),
            "unacked": len(self._sent),
            "queued_messages": len(self._send_queue),
            "cc": self._cc.state(),
            "path_policy": self._policy.state(),
        }
        # A plug-in policy's first fault (transport.policy_plugin; its state() may be the one), or None.
        m["path_policy_fault"] = getattr(self._policy, "fault", None)
        return m

    # ------------------------------------------------------------------ sender

    def _has_retx(self) -> bool:
        # Entries whose packet was acknowledged meanwhile are discarded lazily.
        retx = self._retx
        while retx:
            rec = self._sent.get(retx[0])
            if rec is not None and rec.lost:
                return True
            heapq.heappop(retx)
        return False

    def _transmit(self, rec: SentPacket, now: float, retransmit: bool) -> tuple[bytes, int]:
        """(Re)transmit a PSN that has a record; new PSNs take the inlined copy of this in
        datagrams_to_send()."""
        ev = self._policy.next_ev(now, rec.ev if retransmit else None) % self._num_evs
        ts = round(now * 1e6) & TIMESTAMP_MASK
        self._tx_counter += 1
        if rec.tx is None and rec.tx_order:
            rec.tx = [(rec.ts, rec.ev, rec.sent_time)]
        rec.sent_time = now
        rec.ev = ev
        rec.ts = ts
        rec.tx_order = self._tx_counter
        if rec.tx is not None:
            rec.tx.append((ts, ev, now))
        rec.lost = False
        self._inflight[rec.seq] = rec
        payload = rec.payload
        head = _pack_data_head(
            MAGIC, VERSION, TYPE_DATA, FLAG_RETRANSMIT if retransmit else 0, ev, self.connection_id,
            (self.initial_psn + rec.seq) & PSN_MASK, rec.msg_id & MSG_ID_MASK, rec.frag_index, rec.frag_count,
            rec.msg_len, ts, len(payload),
        )
        data = head + _pack_crc(_crc32(payload, _crc32(head))) + payload
        st = self.stats
        evs = st.ev(ev)
        st.packets_sent += 1
        st.bytes_sent += len(data)
        evs.packets_sent += 1
        evs.bytes_sent += len(data)
        if retransmit:
            st.retransmissions += 1
            evs.retransmissions += 1
        return data, ev

    def _seq_from_psn(self, psn: int, ref: int) -> int:
        return ref + psn_diff(psn, (self.initial_psn + ref) & PSN_MASK)

    def _on_ack(self, fields: tuple, now: float) -> None:
        """``fields``: the ACK header as unpacked by wire.ACK_STRUCT."""
        (_m, _v, _t, flags, _ev, _cid, cum_psn, sack_base, bitmap, ack_psn, echo_ts, ack_delay, rwnd,
         _crc) = fields
        st = self.stats
        ipsn = self.initial_psn
        una = self._snd_una
        next_seq = self._next_seq
        d = (cum_psn - ipsn - una) & PSN_MASK
        cum = una + (d - _FULL if d >= _HALF else d)
        if cum > next_seq:
            st.drop("ack_unsent")  # acknowledges PSNs never sent
            return
        base = 0
        if bitmap:
            d = (sack_base - ipsn - una) & PSN_MASK
            base = una + (d - _FULL if d >= _HALF else d)
            if base + bitmap.bit_length() - 1 >= next_seq:
                st.drop("ack_unsent")
                return
        st.acks_received += 1

        sent = self._sent
        # The record of the triggering PSN, looked up before acknowledged records are removed.
        d = (ack_psn - ipsn - una) & PSN_MASK
        ack_seq = una + (d - _FULL if d >= _HALF else d)
        trig = sent.get(ack_seq) or self._retired.get(ack_seq)

        newly: list[SentPacket] = []
        if cum > una:
            pop = sent.pop
            for s in range(una, cum):
                rec = pop(s, None)
                if rec is not None:
                    newly.append(rec)
        while bitmap:
            low = bitmap & -bitmap
            bitmap ^= low
            rec = sent.pop(base + low.bit_length() - 1, None)
            if rec is not None:
                newly.append(rec)
        # The receiver's window ends at a fixed distance from the start of the message it is
        # reassembling, so the end only moves forward; reordered ACKs cannot shrink it.
        limit = cum + (rwnd if rwnd < self._window_psns else self._window_psns)
        if limit > self._peer_limit:
            self._peer_limit = limit
        una = cum if cum > una else una
        while una < next_seq and una not in sent:
            una += 1
        self._snd_una = una

        # RTT sample and spurious-retransmission check from the echoed timestamp.
        rtt_sample: float | None = None
        if trig is not None:
            tx = trig.tx
            if tx is None:
                match = 0 if trig.ts == echo_ts else -1
                n_tx = 1
                sent_time = trig.sent_time
                ev = trig.ev
            else:
                match = -1
                n_tx = len(tx)
                sent_time, ev = 0.0, 0
                for i, (ts, t_ev, t_time) in enumerate(tx):
                    if ts == echo_ts:
                        match, ev, sent_time = i, t_ev, t_time
                        break
            if ack_delay:
                held = ack_delay * 1e-6
                allow = self._ack_allow
                self._ack_allow = held if held > allow else allow - (allow - held) / 64
            if match >= 0:
                rtt = now - sent_time - ack_delay * 1e-6
                if rtt <= 0:
                    rtt = now - sent_time
                if rtt > 0:
                    rtt_sample = rtt
                    self._rtt.update(rtt)
                    self._rto_value = None
                    est = self._ev_rtt.get(ev)
                    if est is None:
                        est = self._ev_rtt[ev] = RttEstimator()
                    est.update(rtt)
                    st.rtt.append(rtt)
                    st.ev(ev).rtt.append(rtt)
                    self._policy.on_ack(ev, rtt, now)
                delivered = trig.seq not in sent
                if delivered and match < n_tx - 1 and not trig.spurious:
                    # An earlier copy reached the receiver: the later copies were not needed.
                    trig.spurious = True
                    st.spurious_retransmissions += n_tx - 1 - match
                    self._on_spurious(now)
                if delivered and match == n_tx - 1 and trig.tx_order > self._rack_order:
                    self._rack_order = trig.tx_order
                    self._rack_dirty = True

        if newly:
            self._last_progress = now
            self._on_delivered(newly, now)
            if self._backoff:
                self._backoff = 0
                self._rto_value = None
        if rtt_sample is not None:
            self._cc.on_ack(rtt_sample, len(newly), now)

        if self._gobackn:
            # One rewind per sequence error per RTT: NAKs for the same PSN may arrive in bursts.
            repeat = cum == self._rewind_seq and now - self._rewind_time <= (self._rtt.srtt or 0.0)
            if flags & FLAG_NAK and cum in sent and not repeat:
                self._rewind(cum, now)
        elif self._rack_dirty or (self._loss_time is not None and now >= self._loss_time):
            self._detect_losses(now)

    def _on_delivered(self, newly: list[SentPacket], now: float) -> None:
        st = self.stats
        per_ev = st.per_ev
        inflight_pop = self._inflight.pop
        rack = self._rack_order
        for rec in newly:
            inflight_pop(rec.seq, None)
            rec.lost = False
            (per_ev.get(rec.ev) or st.ev(rec.ev)).acked += 1
            if rec.tx is None:
                if rec.tx_order > rack:
                    rack = rec.tx_order
            else:
                self._retired[rec.seq] = rec
                if len(self._retired) > _RETIRED_MAX:
                    self._retired.popitem(last=False)
            if rec.lost_time is not None:
                st.recovery.append(now - rec.lost_time)
            msg = rec.msg
            msg.remaining -= 1
            if msg.remaining <= 0:
                st.messages_acked += 1
                st.bytes_acked += msg.size
                latency = now - msg.submitted
                st.completion.append(latency)
                self._events.append(MessageAcked(msg.wire_id, latency))
            rec.msg = None  # the message's data can go once its last fragment is acknowledged
        if rack > self._rack_order:
            self._rack_order = rack
            self._rack_dirty = True

    def _mark_lost(self, rec: SentPacket, now: float) -> None:
        self._inflight.pop(rec.seq, None)
        rec.lost = True
        if rec.lost_time is None:
            rec.lost_time = now
        heapq.heappush(self._retx, rec.seq)
        self.stats.losses_detected += 1
        self.stats.ev(rec.ev).losses += 1

    def _detect_losses(self, now: float) -> None:
        """RACK-like: an in-flight packet sent before the latest delivered one is lost once it is
        older than its own EV's RTT plus the reordering allowance."""
        self._rack_dirty = False
        self._loss_time = None
        rack = self._rack_order
        inflight = self._inflight
        if not inflight or next(iter(inflight.values())).tx_order >= rack:
            return  # nothing in flight was overtaken (the common, in-order case)
        lost: list[SentPacket] = []
        allowance: dict[int, float] = {}
        ack_allow = self._ack_allow
        scale = self._reorder_scale
        if scale > 1.0 and now - self._reorder_since > _REORDER_DECAY_RTTS * (self._rtt.srtt or 0.0):
            # No spurious retransmission for a while: narrow the allowance again, step by step.
            scale = self._reorder_scale = max(1.0, scale / 2)
            self._reorder_since = now
        window = self.config.reorder_window * scale
        loss_time = None
        for rec in inflight.values():
            if rec.tx_order >= rack:
                break
            a = allowance.get(rec.ev)
            if a is None:
                a = allowance[rec.ev] = reorder_allowance(
                    self._ev_rtt.get(rec.ev) or self._rtt, self._rtt, self.config.initial_rtt, window,
                )
            deadline = rec.sent_time + a + ack_allow
            if deadline <= now:
                lost.append(rec)
            elif loss_time is None or deadline < loss_time:
                loss_time = deadline
        self._loss_time = loss_time
        if lost:
            evs = {rec.ev for rec in lost}
            share = self._ev_share(evs)
            for rec in lost:
                self._mark_lost(rec, now)
            for ev in evs:
                self._policy.on_loss(ev, now)
            self._cc.on_loss(now, share)

    def _on_spurious(self, now: float) -> None:
        """A retransmission was unnecessary: undo the window decrease it caused, and widen the
        reordering allowance (RACK's reo_wnd adapts the same way, on DSACKs), since paths whose
        delays differ by more than the allowance would otherwise keep tripping it."""
        self._cc.on_spurious(now)
        self._reorder_scale = min(self._reorder_scale * 2.0, _REORDER_SCALE_MAX)
        self._reorder_since = now

    def _ev_share(self, evs: set[int]) -> float:
        """Fraction of the in-flight packets that were sent on ``evs``."""
        if not self._inflight:
            return 1.0
        on = sum(1 for rec in self._inflight.values() if rec.ev in evs)
        return max(on, 1) / len(self._inflight)

    def _rewind(self, seq: int, now: float) -> None:
        """Go-back-N: resend everything from ``seq`` on."""
        self.stats.gobackn_rewinds += 1
        self._rewind_seq = seq
        self._rewind_time = now
        first = self._sent[seq]
        self._policy.on_loss(first.ev, now)
        for rec in [r for r in self._inflight.values() if r.seq >= seq]:
            self._mark_lost(rec, now)
        self._cc.on_loss(now)

    def _rto(self) -> float:
        # Asked for on every get_timer(), but it only changes with an RTT sample or the backoff.
        value = self._rto_value
        if value is None:
            c = self.config
            value = self._rto_value = rto(self._rtt, c.initial_rtt, c.rto_min, c.rto_max, self._backoff)
        return value

    def _rto_deadline(self) -> float:
        start = next(iter(self._inflight.values())).sent_time
        if self._last_progress > start:
            start = self._last_progress
        return start + self._rto() + self._ack_allow

    def _on_rto(self, now: float) -> None:
        # The same expression as the deadline get_timer() reported: summed in another order, the
        # float could differ in its last bit and leave a due timer unserved forever.
        if not self._inflight or self._rto_deadline() > now:
            return
        timeout = self._rto() + self._ack_allow
        # Everything in flight for more than half the timeout is declared lost with the oldest
        # packet, so that one timeout resends a whole round in PSN order; timing each packet out
        # separately would resend them in their old order and could starve the lowest PSN
        # behind the same queue every round.
        expired = []
        if self._rtt.srtt is None:
            # No RTT sample yet: the timeout only guessed the RTT (from initial_rtt), and a first
            # window queued behind a slow link is the likelier story than its loss. Probe with the
            # oldest packet rather than resending the whole window into the same queue.
            expired.append(next(iter(self._inflight.values())))
        else:
            for rec in self._inflight.values():
                if rec.sent_time + timeout / 2 > now:
                    break
                expired.append(rec)
        st = self.stats
        st.timeouts += 1
        self._backoff += 1
        self._rto_value = None
        evs = {rec.ev for rec in expired}
        for ev in evs:
            st.ev(ev).timeouts += 1
            self._policy.on_timeout(ev, now)
        if self._gobackn:
            self._rewind_seq = -1
            self._rewind(min(rec.seq for rec in expired), now)
        else:
            for rec in expired:
                self._mark_lost(rec, now)
        self._cc.on_timeout(now)
        logger.debug("RTO at %.6f: %d packets on EVs %s", now, len(expired), sorted(evs))

    # ------------------------------------------------------------------ receiver

    def _on_data(
        self, psn: int, msg_id: int, idx: int, count: int, msg_len: int, ts: int, ev: int, payload: bytes,
        now: float,
    ) -> None:
        """One DATA packet whose header decoded and whose CRC matched."""
        st = self.stats
        plen = len(payload)
        if plen > self._payload:
            st.drop("oversize")
            return
        nxt = self._rcv_nxt
        d = (psn - self.initial_psn - nxt) & PSN_MASK
        seq = nxt + (d - _FULL if d >= _HALF else d)
        ooo = self._rcv_ooo
        if seq < nxt or seq in ooo:
            st.duplicates += 1
            self._queue_ack(seq, ts, ev, now)
            return
        if self._gobackn and seq != nxt:
            st.drop("out_of_order")
            if self._nak_sent_for != nxt:
                # RoCE-style: one NAK per sequence error, then silence until the expected PSN arrives.
                self._nak_sent_for = nxt
                self._out_acks.append(self._build_ack(seq, ts, ev, 0, FLAG_NAK))
            return
        if seq - self._rcv_base >= self._window_psns:
            st.drop("beyond_window")
            # Tell the sender where the window really ends (it may be probing a closed window).
            self._out_acks.append(self._build_ack(seq, ts, ev, 0))
            return
        head = self._msg_head
        d = (msg_id - head) & MSG_ID_MASK
        msg = head + (d - _FULL if d >= _HALF else d)
        if msg < head or msg in self._delivered_above or msg in self._completed:
            st.drop("inconsistent")
            return
        if msg - head >= self.config.max_reassembly_messages:
            st.drop("over_message_cap")
            return
        first_seq = seq - idx
        r = self._reasm.get(msg)
        last = count - 1
        if r is None:
            if msg_len > self._max_message or count > self._window_psns:
                st.drop("oversize")
                return
            frag_size = 0
            if idx < last:
                frag_size = plen
            elif count > 1:
                rest = msg_len - plen
                if rest % last:
                    st.drop("inconsistent")
                    return
                frag_size = rest // last
            if not self._fragment_fits(frag_size, count, msg_len, idx, plen):
                st.drop("inconsistent")
                return
            r = _Reassembly(first_seq, count, msg_len, frag_size)
            new_msg = True
        else:
            if (
                r.frag_count != count
                or r.msg_len != msg_len
                or r.first_seq != first_seq
                or r.frags[idx] is not None
            ):
                st.drop("inconsistent")
                return
            # Every fragment but the last carries frag_size bytes, the last last_size (both fixed
            # when the message's first fragment was accepted), so a completed message is exact.
            if plen != (r.frag_size if idx < last else r.last_size):
                st.drop("inconsistent")
                return
            new_msg = False
        reasm_bytes = st.reassembly_bytes + plen
        if reasm_bytes > self.config.max_reassembly_bytes:
            st.drop("over_byte_cap")
            return

        # Accepted: from here on the packet is part of the connection's state.
        if new_msg:
            self._reasm[msg] = r
        r.frags[idx] = payload
        r.received += 1
        r.nbytes += plen
        st.reassembly_bytes = reasm_bytes
        if reasm_bytes > st.peak_reassembly_bytes:
            st.peak_reassembly_bytes = reasm_bytes
        held = len(self._reasm) + len(self._completed)
        if held > st.peak_reassembly_messages:
            st.peak_reassembly_messages = held
        st.data_received += 1
        if seq < self._rcv_highest:
            st.out_of_order += 1
            st.reorder_distance.append(self._rcv_highest - seq)
        else:
            self._rcv_highest = seq
        if seq == nxt:
            # rcv_nxt moves past seq and any consecutive out-of-order PSNs after it.
            s, i, c = seq, idx, count
            while True:
                self._rcv_base = s + 1 if i == c - 1 else s - i
                s += 1
                if not ooo:
                    break
                nx = ooo.pop(s, None)
                if nx is None:
                    break
                i, c = nx
            self._rcv_nxt = s
        else:
            ooo[seq] = (idx, count)
        if r.received == count:
            del self._reasm[msg]
            self._complete(msg, r, now)
        # Inlined _queue_ack() for ACK-per-packet.
        if self._ack_delay <= 0:
            self._out_acks.append(self._build_ack(seq, ts, ev, 0))
            return
        self._queue_ack(seq, ts, ev, now)

    @staticmethod
    def _fragment_fits(frag_size: int, count: int, msg_len: int, idx: int, plen: int) -> bool:
        """Fragment sizes must add up to the message length, so a completed message is exact:
        every fragment but the last carries frag_size bytes, the last 1..frag_size bytes."""
        if count == 1:
            return plen == msg_len
        if frag_size <= 0:
            return False
        last_size = msg_len - frag_size * (count - 1)
        if not 0 < last_size <= frag_size:
            return False
        return plen == (frag_size if idx < count - 1 else last_size)

    def _complete(self, msg: int, r: _Reassembly, now: float) -> None:
        data = b"".join(r.frags)  # type: ignore[arg-type]
        if self._ordered:
            self._completed[msg] = data
            while self._msg_head in self._completed:
                self._deliver(self._msg_head, self._completed.pop(self._msg_head), now)
                self._msg_head += 1
        else:
            self._deliver(msg, data, now)
            if msg == self._msg_head:
                self._msg_head += 1
                while self._msg_head in self._delivered_above:
                    self._delivered_above.discard(self._msg_head)
                    self._msg_head += 1
            else:
                self._delivered_above.add(msg)

    def _deliver(self, msg: int, data: bytes, now: float) -> None:
        st = self.stats
        st.reassembly_bytes -= len(data)
        st.messages_delivered += 1
        st.bytes_delivered += len(data)
        st.goodput.add(now, len(data))
        self._events.append(MessageReceived(msg & MSG_ID_MASK, data))

    def _queue_ack(self, seq: int, ts: int, ev: int, now: float) -> None:
        if self._ack_delay <= 0:
            self._out_acks.append(self._build_ack(seq, ts, ev, 0))
            return
        if self._ack_pending:
            # One SACK bitmap must describe every packet the held ACK answers: a packet the ACK
            # leaves out looks lost to the sender once later packets are acknowledged. Send the
            # held ACK first when this packet would stretch the batch beyond the bitmap.
            lo, hi = self._ack_lo, self._ack_hi
            if (seq if seq > hi else hi) - (seq if seq < lo else lo) >= SACK_BITS:
                self._flush_ack(now)
        if self._ack_pending:
            if seq > self._ack_hi:
                self._ack_hi = seq
            elif seq < self._ack_lo:
                self._ack_lo = seq
        else:
            # The ACK answers (echoes) the batch's first packet, the one held longest: its
            # ack_delay is then the longest hold in the batch, which the sender's loss detection
            # must allow for, and its RTT sample less that hold is as exact as any other.
            self._ack_lo = self._ack_hi = seq
            self._ack_seq = seq
            self._ack_ts = ts
            self._ack_ev = ev
            self._ack_arrival = now
            self._ack_deadline = now + self._ack_delay
        self._ack_pending += 1
        if self._ack_pending >= self._ack_batch:
            self._flush_ack(now)

    def _flush_ack(self, now: float) -> None:
        if self._ack_pending:
            # The echo (RTT sample) answers the batch's first arrival; the bitmap ends at the
            # batch's highest PSN so that it covers the whole batch.
            self._out_acks.append(
                self._build_ack(
                    self._ack_seq, self._ack_ts, self._ack_ev, round((now - self._ack_arrival) * 1e6),
                    cover=self._ack_hi,
                )
            )
        self._ack_pending = 0
        self._ack_deadline = None

    def _build_ack(
        self, seq: int, echo_ts: int, ev: int, delay_us: int, flags: int = 0, cover: int = -1,
    ) -> tuple[bytes, int]:
        """An ACK answering ``seq``; its SACK bitmap ends at ``cover`` (default ``seq``) when that is
        beyond the 64 PSNs after the cumulative point."""
        nxt = self._rcv_nxt
        top = cover if cover > seq else seq
        base = nxt + 1 if top <= nxt + SACK_BITS else top - SACK_BITS + 1
        bitmap = 0
        ooo = self._rcv_ooo
        if ooo:
            if len(ooo) <= SACK_BITS:
                # Few PSNs held out of order: test each against the bitmap's range.
                for s in ooo:
                    i = s - base
                    if 0 <= i < SACK_BITS:
                        bitmap |= 1 << i
            else:
                for i in range(SACK_BITS):
                    if base + i in ooo:
                        bitmap |= 1 << i
        rwnd = self._window_psns - (nxt - self._rcv_base)
        ipsn = self.initial_psn
        head = _pack_ack_head(
            MAGIC, VERSION, TYPE_ACK, flags, ev, self.connection_id, (ipsn + nxt) & PSN_MASK,
            (ipsn + base) & PSN_MASK, bitmap, (ipsn + seq) & PSN_MASK, echo_ts,
            min(max(delay_us, 0), 0xFFFFFFFF), min(max(rwnd, 0), 0xFFFFFFFF),
        )
        self.stats.acks_sent += 1
        return head + _pack_crc(_crc32(head)), ev % self._num_evs


def _ack_fields(ack: AckPacket) -> tuple:
    """An AckPacket as the tuple wire.ACK_STRUCT unpacks (the CRC, already checked, as 0)."""
    return (
        MAGIC, VERSION, TYPE_ACK, ack.flags, ack.ev, ack.conn_id, ack.cum_psn, ack.sack_base, ack.sack_bitmap,
        ack.ack_psn, ack.echo_ts, ack.ack_delay, ack.rwnd, 0,
    )
