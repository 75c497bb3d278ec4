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
from collections import OrderedDict, deque
from dataclasses import dataclass

from transport.config import TransportConfig
from transport.congestion import make_cc
from transport.events import Event, MessageAcked, MessageReceived
from transport.metrics import Stats
from transport.paths import make_policy
from transport.recovery import Pacer, RttEstimator, SentPacket, reorder_allowance, rto
from transport.wire import (
    FLAG_NAK,
    FLAG_RETRANSMIT,
    MSG_ID_MASK,
    PSN_MASK,
    SACK_BITS,
    AckPacket,
    DataPacket,
    WireError,
    decode,
    encode,
    psn_diff,
    to_timestamp,
)

__all__ = ["Connection", "Event", "MessageAcked", "MessageReceived"]

logger = logging.getLogger(__name__)

# Retransmitted PSNs remembered after being acknowledged, so that a late ACK echoing the original
# transmission can still reveal the retransmission as spurious.
_RETIRED_MAX = 4096


@dataclass
class _OutMessage:
    msg_id: int
    data: bytes
    frag_count: int
    next_frag: int
    submitted: float


@dataclass
class _Reassembly:
    first_seq: int
    frag_count: int
    msg_len: int
    frag_size: int  # payload of every fragment but the last; 0 until known
    frags: list[bytes | None]
    received: int = 0
    nbytes: int = 0


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
        self._cc = make_cc(config.cc, config.window, config.max_window, config.target_delay, config.pacing)
        self._pacer = Pacer()
        self._events: deque[Event] = deque()
        self._now = 0.0
        self.stats = Stats()
        self._payload = config.max_payload
        self._gobackn = config.recovery == "gobackn"
        self._ordered = config.delivery == "ordered"

        # --- sender ---
        self._next_msg = 0
        self._send_queue: deque[_OutMessage] = deque()
        self._msg_remaining: dict[int, tuple[int, float, int]] = {}  # msg -> (unacked frags, submitted, size)
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
        self._backoff = 0
        self._rewind_seq = -1
        self._rewind_time = float("-inf")
        self._pacing_blocked = False

        # --- receiver ---
        self._window_psns = max(1, config.max_reassembly_bytes // self._payload)
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
        self._ack_trigger: tuple[int, int, int, float] | None = None  # (seq, echo_ts, ev, arrival)

    # ------------------------------------------------------------------ API

    @property
    def max_message_size(self) -> int:
        """Largest message the peer (with the same configuration) can reassemble."""
        return self._window_psns * self._payload

    def send_message(self, data: bytes, now: float | None = None) -> int:
        """Queue a message; returns its id. ``now`` defaults to the latest time the connection saw."""
        data = bytes(data)
        if len(data) > self.max_message_size:
            raise ValueError(
                f"message of {len(data)} bytes exceeds the reassembly limit of {self.max_message_size} bytes"
            )
        if now is not None:
            self._now = now
        msg_id = self._next_msg
        self._next_msg += 1
        count = max(1, -(-len(data) // self._payload))
        self._send_queue.append(_OutMessage(msg_id, data, count, 0, self._now))
        self._msg_remaining[msg_id] = (count, self._now, len(data))
        self.stats.messages_sent += 1
        return msg_id & MSG_ID_MASK

    def receive_datagram(self, data: bytes, now: float) -> None:
        """Process one datagram from the peer. Never raises: bad input is counted as dropped."""
        self._now = now
        try:
            pkt = decode(data)
        except WireError as exc:
            self.stats.drop("malformed")
            logger.debug("dropped malformed datagram: %s", exc)
            return
        except Exception:  # a decoder bug must not take the connection down
            self.stats.drop("malformed")
            logger.exception("unexpected error decoding a datagram")
            return
        if pkt.conn_id != self.connection_id:
            self.stats.drop("wrong_connection")
            return
        try:
            if isinstance(pkt, DataPacket):
                self._on_data(pkt, now)
            else:
                self._on_ack(pkt, now)
        except Exception:
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
        cc = self._cc
        while True:
            has_retx = self._has_retx()
            has_new = bool(self._send_queue) and self._rwnd_allows()
            if not (has_retx or has_new):
                break
            if len(self._inflight) >= cc.window:
                break
            if not self._pacer.can_send(now):
                self._pacing_blocked = True
                break
            if has_retx:
                rec = self._sent[heapq.heappop(self._retx)]
                out.append(self._transmit(rec, now, retransmit=True))
            else:
                out.append(self._transmit(self._new_packet(), now, retransmit=False))
            self._pacer.on_sent(now, cc.pacing_rate)
        return out

    def get_timer(self) -> float | None:
        """Absolute time of the next timer (ACK delay, loss detection, RTO or pacing), or None."""
        times = []
        if self._ack_pending and self._ack_deadline is not None:
            times.append(self._ack_deadline)
        if self._loss_time is not None:
            times.append(self._loss_time)
        if self._inflight:
            times.append(self._rto_deadline())
        if self._pacing_blocked:
            times.append(self._pacer.next_time)
        return min(times) if times else None

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
        return m

    # ------------------------------------------------------------------ sender

    def _rwnd_allows(self) -> bool:
        # With nothing in flight one packet may probe a closed window, so a lost window update
        # cannot stall the connection (the receiver answers a beyond-window packet with an ACK).
        if self._next_seq - self._snd_una >= 4 * self.config.max_window + self._window_psns:
            return False  # bound the sender's own memory of unacknowledged packets
        return self._next_seq < self._peer_limit or not self._inflight

    def _has_retx(self) -> bool:
        # Entries whose packet was acknowledged meanwhile are discarded lazily.
        retx = self._retx
        while retx:
            rec = self._sent.get(retx[0])
            if rec is not None and rec.lost:
                return True
            heapq.heappop(retx)
        return False

    def _new_packet(self) -> SentPacket:
        msg = self._send_queue[0]
        i = msg.next_frag
        payload = msg.data[i * self._payload : (i + 1) * self._payload]
        rec = SentPacket(self._next_seq, msg.msg_id, i, msg.frag_count, len(msg.data), payload)
        self._next_seq += 1
        msg.next_frag += 1
        if msg.next_frag >= msg.frag_count:
            self._send_queue.popleft()
        self._sent[rec.seq] = rec
        return rec

    def _transmit(self, rec: SentPacket, now: float, retransmit: bool) -> tuple[bytes, int]:
        ev = self._policy.next_ev(now, rec.ev if retransmit else None) % self.config.num_evs
        ts = to_timestamp(now)
        self._tx_counter += 1
        rec.sent_time = now
        rec.ev = ev
        rec.tx_order = self._tx_counter
        rec.tx.append((ts, ev, now))
        rec.lost = False
        self._inflight[rec.seq] = rec
        pkt = DataPacket(
            self.connection_id,
            (self.initial_psn + rec.seq) & PSN_MASK,
            rec.msg_id & MSG_ID_MASK,
            rec.frag_index,
            rec.frag_count,
            rec.msg_len,
            ts,
            ev,
            rec.payload,
            FLAG_RETRANSMIT if retransmit else 0,
        )
        data = encode(pkt)
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

    def _on_ack(self, ack: AckPacket, now: float) -> None:
        st = self.stats
        cum = self._seq_from_psn(ack.cum_psn, self._snd_una)
        if cum > self._next_seq:
            st.drop("ack_unsent")  # acknowledges PSNs never sent
            return
        sacked: list[int] = []
        if ack.sack_bitmap:
            base = self._seq_from_psn(ack.sack_base, self._snd_una)
            sacked = [base + i for i in range(SACK_BITS) if ack.sack_bitmap >> i & 1]
            if sacked[-1] >= self._next_seq:
                st.drop("ack_unsent")
                return
        st.acks_received += 1

        newly: list[SentPacket] = []
        sent = self._sent
        if cum > self._snd_una:
            for s in range(self._snd_una, cum):
                rec = sent.pop(s, None)
                if rec is not None:
                    newly.append(rec)
        for s in sacked:
            rec = sent.pop(s, None)
            if rec is not None:
                newly.append(rec)
        # The receiver's window ends at a fixed distance from the start of the message it is
        # reassembling, so the end only moves forward; reordered ACKs cannot shrink it.
        self._peer_limit = max(self._peer_limit, cum + min(ack.rwnd, self._window_psns))
        while self._snd_una < self._next_seq and self._snd_una not in sent:
            self._snd_una += 1

        # RTT sample and spurious-retransmission check from the echoed timestamp.
        ack_seq = self._seq_from_psn(ack.ack_psn, self._snd_una)
        trig = None
        for rec in newly:
            if rec.seq == ack_seq:
                trig = rec
                break
        if trig is None:
            trig = sent.get(ack_seq) or self._retired.get(ack_seq)
        rtt_sample: float | None = None
        if trig is not None:
            for i, (ts, ev, sent_time) in enumerate(trig.tx):
                if ts != ack.echo_ts:
                    continue
                rtt = now - sent_time - ack.ack_delay * 1e-6
                if rtt <= 0:
                    rtt = now - sent_time
                if rtt > 0:
                    rtt_sample = rtt
                    self._rtt.update(rtt)
                    est = self._ev_rtt.get(ev)
                    if est is None:
                        est = self._ev_rtt[ev] = RttEstimator()
                    est.update(rtt)
                    st.rtt.append(rtt)
                    st.ev(ev).rtt.append(rtt)
                    self._policy.on_ack(ev, rtt, now)
                delivered = trig.seq not in sent
                if delivered and i < len(trig.tx) - 1 and not trig.spurious:
                    # An earlier copy reached the receiver: the later copies were not needed.
                    trig.spurious = True
                    n = len(trig.tx) - 1 - i
                    st.spurious_retransmissions += n
                if delivered and i == len(trig.tx) - 1 and trig.tx_order > self._rack_order:
                    self._rack_order = trig.tx_order
                    self._rack_dirty = True
                break

        for rec in newly:
            self._on_delivered(rec, now)
        if newly:
            self._backoff = 0
        if rtt_sample is not None:
            self._cc.on_ack(rtt_sample, len(newly), now)

        if self._gobackn:
            # One rewind per sequence error per RTT: NAKs for the same PSN may arrive in bursts.
            repeat = cum == self._rewind_seq and now - self._rewind_time <= (self._rtt.srtt or 0.0)
            if ack.flags & FLAG_NAK and cum in sent and not repeat:
                self._rewind(cum, now)
        elif self._rack_dirty or (self._loss_time is not None and now >= self._loss_time):
            self._detect_losses(now)

    def _on_delivered(self, rec: SentPacket, now: float) -> None:
        st = self.stats
        self._inflight.pop(rec.seq, None)
        rec.lost = False
        st.ev(rec.ev).acked += 1
        if len(rec.tx) == 1:
            if rec.tx_order > self._rack_order:
                self._rack_order = rec.tx_order
                self._rack_dirty = True
        else:
            self._retired[rec.seq] = rec
            if len(self._retired) > _RETIRED_MAX:
                self._retired.popitem(last=False)
        if rec.lost_time is not None:
            st.recovery.append(now - rec.lost_time)
        remaining, submitted, size = self._msg_remaining[rec.msg_id]
        if remaining <= 1:
            del self._msg_remaining[rec.msg_id]
            st.messages_acked += 1
            st.bytes_acked += size
            st.completion.append(now - submitted)
            self._events.append(MessageAcked(rec.msg_id & MSG_ID_MASK, now - submitted))
        else:
            self._msg_remaining[rec.msg_id] = (remaining - 1, submitted, size)

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
        lost: list[SentPacket] = []
        rack = self._rack_order
        allowance: dict[int, float] = {}
        loss_time = None
        for rec in self._inflight.values():
            if rec.tx_order >= rack:
                break
            a = allowance.get(rec.ev)
            if a is None:
                a = allowance[rec.ev] = reorder_allowance(
                    self._ev_rtt.get(rec.ev) or self._rtt, self._rtt, self.config.initial_rtt,
                    self.config.reorder_window,
                )
            deadline = rec.sent_time + a
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

    def _rto_deadline(self) -> float:
        oldest = next(iter(self._inflight.values()))
        c = self.config
        return oldest.sent_time + rto(self._rtt, c.initial_rtt, c.rto_min, c.rto_max, self._backoff)

    def _on_rto(self, now: float) -> None:
        c = self.config
        timeout = rto(self._rtt, c.initial_rtt, c.rto_min, c.rto_max, self._backoff)
        if not self._inflight or next(iter(self._inflight.values())).sent_time + timeout > now:
            return
        # Everything in flight for more than half the timeout is declared lost with the oldest
        # packet, so that one timeout resends a whole round in PSN order; timing each packet out
        # separately would resend them in their old order and could starve the lowest PSN
        # behind the same queue every round.
        expired = []
        for rec in self._inflight.values():
            if rec.sent_time + timeout / 2 > now:
                break
            expired.append(rec)
        st = self.stats
        st.timeouts += 1
        self._backoff += 1
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

    def _on_data(self, pkt: DataPacket, now: float) -> None:
        st = self.stats
        plen = len(pkt.payload)
        if plen > self._payload:
            st.drop("oversize")
            return
        ref = self._rcv_nxt
        seq = ref + psn_diff(pkt.psn, (self.initial_psn + ref) & PSN_MASK)
        if seq < self._rcv_nxt or seq in self._rcv_ooo:
            st.duplicates += 1
            self._queue_ack(seq, pkt, now)
            return
        if self._gobackn and seq != self._rcv_nxt:
            st.drop("out_of_order")
            if self._nak_sent_for != self._rcv_nxt:
                # RoCE-style: one NAK per sequence error, then silence until the expected PSN arrives.
                self._nak_sent_for = self._rcv_nxt
                self._out_acks.append(self._build_ack(seq, pkt.timestamp, pkt.ev, 0, FLAG_NAK))
            return
        if seq - self._rcv_base >= self._window_psns:
            st.drop("beyond_window")
            # Tell the sender where the window really ends (it may be probing a closed window).
            self._out_acks.append(self._build_ack(seq, pkt.timestamp, pkt.ev, 0))
            return
        msg = self._msg_head + _msg_diff(pkt.msg_id, self._msg_head & MSG_ID_MASK)
        if msg < self._msg_head or msg in self._delivered_above or msg in self._completed:
            st.drop("inconsistent")
            return
        if msg - self._msg_head >= self.config.max_reassembly_messages:
            st.drop("over_message_cap")
            return
        first_seq = seq - pkt.frag_index
        r = self._reasm.get(msg)
        idx, count = pkt.frag_index, pkt.frag_count
        last = count - 1
        if r is None:
            if pkt.msg_len > self.max_message_size or count > self._window_psns:
                st.drop("oversize")
                return
            frag_size = 0
            if idx < last:
                frag_size = plen
            elif count > 1:
                rest = pkt.msg_len - plen
                if rest % last:
                    st.drop("inconsistent")
                    return
                frag_size = rest // last
            if not self._fragment_fits(frag_size, count, pkt.msg_len, idx, plen):
                st.drop("inconsistent")
                return
            r = _Reassembly(first_seq, count, pkt.msg_len, frag_size, [None] * count)
            new_msg = True
        else:
            if (
                r.frag_count != count
                or r.msg_len != pkt.msg_len
                or r.first_seq != first_seq
                or r.frags[idx] is not None
            ):
                st.drop("inconsistent")
                return
            if r.frag_size == 0 and idx < last:
                r.frag_size = plen
            if not self._fragment_fits(r.frag_size, count, pkt.msg_len, idx, plen):
                st.drop("inconsistent")
                return
            new_msg = False
        if st.reassembly_bytes + plen > self.config.max_reassembly_bytes:
            st.drop("over_byte_cap")
            return

        # Accepted: from here on the packet is part of the connection's state.
        if new_msg:
            self._reasm[msg] = r
        r.frags[idx] = pkt.payload
        r.received += 1
        r.nbytes += plen
        st.reassembly_bytes += plen
        if st.reassembly_bytes > st.peak_reassembly_bytes:
            st.peak_reassembly_bytes = st.reassembly_bytes
        held = len(self._reasm) + len(self._completed)
        if held > st.peak_reassembly_messages:
            st.peak_reassembly_messages = held
        st.data_received += 1
        if seq < self._rcv_highest:
            st.out_of_order += 1
            st.reorder_distance.append(self._rcv_highest - seq)
        else:
            self._rcv_highest = seq
        if seq == self._rcv_nxt:
            self._advance(seq, idx, count)
        else:
            self._rcv_ooo[seq] = (idx, count)
        if r.received == r.frag_count:
            del self._reasm[msg]
            self._complete(msg, r, now)
        self._queue_ack(seq, pkt, now)

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

    def _advance(self, seq: int, idx: int, count: int) -> None:
        """rcv_nxt moves past ``seq`` and any consecutive out-of-order PSNs after it."""
        ooo = self._rcv_ooo
        while True:
            self._rcv_base = seq + 1 if idx == count - 1 else seq - idx
            seq += 1
            nxt = ooo.pop(seq, None)
            if nxt is None:
                break
            idx, count = nxt
        self._rcv_nxt = seq

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

    def _queue_ack(self, seq: int, pkt: DataPacket, now: float) -> None:
        if self.config.ack_delay <= 0:
            self._out_acks.append(self._build_ack(seq, pkt.timestamp, pkt.ev, 0))
            return
        self._ack_pending += 1
        self._ack_trigger = (seq, pkt.timestamp, pkt.ev, now)
        if self._ack_deadline is None:
            self._ack_deadline = now + self.config.ack_delay
        if self._ack_pending >= self.config.ack_batch:
            self._flush_ack(now)

    def _flush_ack(self, now: float) -> None:
        if self._ack_trigger is not None:
            seq, ts, ev, arrival = self._ack_trigger
            self._out_acks.append(self._build_ack(seq, ts, ev, round((now - arrival) * 1e6)))
        self._ack_pending = 0
        self._ack_deadline = None
        self._ack_trigger = None

    def _build_ack(self, seq: int, echo_ts: int, ev: int, delay_us: int, flags: int = 0) -> tuple[bytes, int]:
        nxt = self._rcv_nxt
        base = nxt + 1 if seq <= nxt + SACK_BITS else seq - SACK_BITS + 1
        bitmap = 0
        ooo = self._rcv_ooo
        if ooo:
            for i in range(SACK_BITS):
                if base + i in ooo:
                    bitmap |= 1 << i
        rwnd = max(0, self._window_psns - (nxt - self._rcv_base))
        ack = AckPacket(
            self.connection_id,
            (self.initial_psn + nxt) & PSN_MASK,
            (self.initial_psn + base) & PSN_MASK,
            bitmap,
            (self.initial_psn + seq) & PSN_MASK,
            echo_ts,
            ev,
            min(rwnd, 0xFFFFFFFF),
            min(max(delay_us, 0), 0xFFFFFFFF),
            flags,
        )
        self.stats.acks_sent += 1
        return encode(ack), ev % self.config.num_evs
