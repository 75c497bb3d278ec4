"""Sans-I/O connection of the fabriclab transport, in the shape of aioquic's QuicConnection.

The state machine never reads a clock, never touches a socket and draws randomness only from the
``random.Random(seed)`` it owns. It is driven by ``send_message()``, ``receive_datagram(data, now)``
and ``handle_timer(now)`` and drained by ``datagrams_to_send(now)``, ``get_timer()`` and
``next_event()``. Both ends use this class; each direction is independent (one side's sender
talks to the other side's receiver). The sender's loss recovery lives in ``transport.core.recovery``
(``LossRecovery``), the receive side in ``transport.core.reassembly`` (``Reassembler``), the wire
format in ``transport.core.wire``; this class drives them and sends.

A connection can be told to limit amplification (``limit_amplification``, what a receiver that
answers requests does): until the peer has shown that it receives what this end sends (an ACK
echoed the timestamp of one of its DATA packets, so that the round trip was measured), the DATA it
sends is at most ``factor`` times the bytes it received from the peer, beyond one packet at a time
while nothing is in flight, ``AMP_PROBES`` of them at most (else no first response could leave).
As QUIC's anti-amplification limit before address validation: a forged request with a spoofed
source once made an echoing receiver send its victim 1,807 times the request, retransmitted without
end.

Internally PSNs and message ids are unbounded integers ("seq"), counted from the initial PSN and
from 0; only the wire carries them modulo 2^32, and incoming values are mapped back with
serial-number arithmetic relative to a nearby reference, so wraparound needs no special cases.
"""

from __future__ import annotations

import logging
import random
from collections import deque

from transport.core.config import TransportConfig
from transport.core.congestion import Pacer, make_cc
from transport.core.credit import CreditReceiver, CreditScheduler, CreditSender
from transport.core.events import Event, MessageAcked, MessageReceived
from transport.core.metrics import Stats
from transport.core.paths import PathPolicy
from transport.core.policy_plugin import make_policy
from transport.core.reassembly import Reassembler
from transport.core.recovery import LossRecovery, SentPacket
from transport.core.rtt import RttEstimator
from transport.core.wire import (
    FLAG_CREDIT,
    FLAG_NAK,
    FLAG_RETRANSMIT,
    MSG_ID_MASK,
    PSN_MASK,
    TYPE_ACK,
    TYPE_CREDIT,
    TYPE_DATA,
    TYPE_OFFSET,
    TYPE_REQUEST,
    WireError,
    pack_ctrl,
    pack_data,
    parse_ack,
    parse_ctrl,
    parse_data,
    psn_diff,
    to_timestamp,
    why_malformed,
)

__all__ = ["Connection", "Event", "MessageAcked", "MessageReceived"]

# Packets a connection limiting its amplification sends beyond the limit before its peer is
# validated, one at a time while nothing is in flight (see the module's docstring): with the packet
# that crossed the limit, a first response packet and two retransmissions of it, so that one loss
# does not stall a genuine requester.
AMP_PROBES = 2

logger = logging.getLogger(__name__)


class _OutMessage:
    """A message being sent: fragmented lazily, and counted down as its fragments are acknowledged.

    Its fragments share its bytes equally (the last carries what the division leaves, a little
    less), instead of full-size fragments and a short remainder: a sprayed flow rotates its EVs
    packet by packet, and with a fixed number of fragments per message the short one fell on the
    same EV, and so the same path, message after message. 64 KiB messages in 9000-byte frames are 7
    full fragments and a third of one: the path that always got the third carried 9 % fewer bytes than
    the others, and on a fabric whose uplinks are all full the others capped every flow at 0.90 of the
    wire (0.97 with equal fragments, simulated 4x4 at 4 Mb/s). The receiver takes any fragment size:
    every fragment but the last carries the first's (reassembly.py)."""

    __slots__ = ("data", "frag_count", "frag_size", "msg_id", "next_frag", "remaining", "size", "submitted",
                 "wire_id")

    def __init__(self, msg_id: int, data: bytes, frag_count: int, submitted: float) -> None:
        self.msg_id = msg_id
        self.wire_id = msg_id & MSG_ID_MASK
        self.data = data
        self.size = len(data)
        self.frag_count = frag_count
        # Equal shares: at most max_payload, since frag_count = ceil(size / max_payload).
        self.frag_size = -(-self.size // frag_count) if self.size else 0
        self.next_frag = 0
        self.remaining = frag_count  # fragments not yet acknowledged
        self.submitted = submitted


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
        # One RTT estimate, kept up to date by loss recovery and read by congestion control.
        self._rtt = RttEstimator()
        self._cc = make_cc(config.cc, config, rtt=self._rtt)
        # With coalesced ACKs one ACK opens the window by up to ack_batch packets at once; a pacer
        # that banked only 4 intervals of idle time would split that into several wake-ups.
        self._pacer = Pacer(burst=max(4, config.ack_batch, config.pacing_packets) if config.ack_delay > 0
                            else max(4, config.pacing_packets))
        self._events: deque[Event] = deque()
        self._now = 0.0
        self.stats = Stats()
        self._recovery = LossRecovery(config, self._rtt, self._cc, self._policy, self.stats)
        self._payload = config.max_payload
        self._num_evs = config.num_evs
        self._rx = Reassembler(config, connection_id, self.initial_psn, self.stats, self._events)
        self._window_psns = self._rx.window_psns

        # --- sender ---
        self._next_msg = 0
        self._send_queue: deque[_OutMessage] = deque()
        self._pacing_blocked = False
        self._pacing_quantum = config.pacing_quantum
        self._pacing_packets = config.pacing_packets
        # Beyond this many PSNs past the oldest unacknowledged one the sender stops taking new
        # PSNs: bounds its own memory of unacknowledged packets.
        self._send_span = 4 * config.max_window + self._window_psns
        # Until the peer advertises its window, assume it is configured like us.
        self._peer_limit = min(config.max_window, self._window_psns)
        self._queued_frags = 0  # fragments queued and not yet sent once
        self._last_ev = 0  # EV of the latest new DATA packet
        # Receiver-driven credit (transport.core.credit): both sides of this connection take part, the
        # receiving side with a private scheduler until its owner attaches a shared one.
        self._credit_tx: CreditSender | None = None
        self._credit_rx: CreditReceiver | None = None
        self._own_scheduler: CreditScheduler | None = None
        if getattr(self._cc, "receiver_driven", False):
            self._own_scheduler = CreditScheduler.from_config(config)
            self._credit_tx = CreditSender(config, self.initial_psn)
            self._credit_rx = self._rx.credit = CreditReceiver(config, self._own_scheduler, self.initial_psn)
        # A controller that reads ECN (transport.core.congestion.nscc) hears of CE echoes before the ACK.
        self._on_ecn = getattr(self._cc, "on_ecn", None)
        # Amplification limit (see the module's docstring): 0 = none; bytes received from the peer.
        self._amp_factor = 0
        self._rx_bytes = 0
        self._amp_probes = 0  # packets sent beyond the limit

    # ------------------------------------------------------------------ API

    @property
    def path_policy(self) -> PathPolicy:
        """The policy choosing this connection's EVs (a plug-in's guard has a `fault`)."""
        return self._policy

    @property
    def credit_receiver(self) -> CreditReceiver | None:
        """The receiving side's credit state under cc "credit", else None."""
        return self._credit_rx

    def use_credit_scheduler(self, scheduler: CreditScheduler) -> CreditReceiver | None:
        """Grant this connection's credit from ``scheduler``, shared with the other connections of one
        receiving endpoint, whose owner then drives its timer; returns the connection's CreditReceiver
        (None when the connection does not use credit)."""
        rx = self._credit_rx
        if rx is None:
            return None
        rx.detach()
        rx.scheduler = scheduler
        scheduler.attach(rx)
        if rx.active:
            scheduler.changed(rx, self._now)
        self._own_scheduler = None
        return rx

    def limit_amplification(self, factor: int = 3) -> None:
        """Until the peer is validated, send at most ``factor`` times the bytes received from it (the
        module's docstring)."""
        self._amp_factor = factor

    @property
    def peer_validated(self) -> bool:
        """The peer echoed the timestamp of a DATA packet this end sent: it receives what we send."""
        return self._rtt.srtt is not None

    @property
    def sending(self) -> bool:
        """Messages of this end are queued or not yet acknowledged."""
        return bool(self._send_queue or self._recovery.sent)

    @property
    def max_message_size(self) -> int:
        """Largest message the peer (with the same configuration) can reassemble."""
        return self._rx.max_message

    def send_message(self, data: bytes, now: float | None = None) -> int:
        """Queue a message; returns its id. ``now`` defaults to the latest time the connection saw."""
        data = bytes(data)
        if len(data) > self._rx.max_message:
            raise ValueError(
                f"message of {len(data)} bytes exceeds the reassembly limit of {self._rx.max_message} bytes"
            )
        if now is not None:
            self._now = now
        msg_id = self._next_msg
        self._next_msg += 1
        count = max(1, -(-len(data) // self._payload))
        self._send_queue.append(_OutMessage(msg_id, data, count, self._now))
        self._queued_frags += count
        self.stats.messages_sent += 1
        return msg_id & MSG_ID_MASK

    def receive_datagram(self, data: bytes, now: float, ecn_ce: bool = False) -> bool:
        """Process one datagram from the peer. Never raises: bad input is counted as dropped.
        ``ecn_ce``: it arrived with the ECN CE codepoint in its IP header (the driver read the TOS byte).

        Returns True when the datagram parsed, passed its CRC and names this connection (whatever
        the protocol then made of it): only such a datagram may teach a driver where the peer is.
        """
        self._now = now
        try:
            ptype = data[TYPE_OFFSET] if len(data) > TYPE_OFFSET else 0
            if ptype == TYPE_DATA:
                cid, psn, msg_id, idx, count, msg_len, ts, ev, payload, _flags = parse_data(data)
            elif ptype == TYPE_ACK:
                (cid, cum_psn, sack_base, bitmap, ack_psn, echo_ts, _ev, rwnd, ack_delay, flags, credit,
                 ce, owd) = parse_ack(data)
            elif ptype in (TYPE_CREDIT, TYPE_REQUEST):
                _, cid, limit, _ev, _flags = parse_ctrl(data)
            else:
                raise WireError(why_malformed(data))
        except WireError as exc:
            self.stats.drop("malformed")
            logger.debug("dropped malformed datagram: %s", exc)
            return False
        except Exception:  # a decoder bug must not take the connection down
            self.stats.drop("malformed")
            logger.exception("unexpected error decoding a datagram")
            return False
        if cid != self.connection_id:
            self.stats.drop("wrong_connection")
            return False
        self._rx_bytes += len(data)
        try:
            if ptype == TYPE_DATA:
                self._rx.on_data(psn, msg_id, idx, count, msg_len, ts, ev, payload, now, ecn_ce)
            elif ptype == TYPE_ACK:
                self._on_ack(cum_psn, sack_base, bitmap, ack_psn, echo_ts, ack_delay, rwnd, flags, now, credit, ce,
                             owd)
            else:
                self._on_ctrl(ptype, limit, now)
        except Exception:
            # Validation happens before any state changes, so this is a bug; keep running.
            self.stats.drop("internal_error")
            logger.exception("error processing a datagram")
        return True

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, int]]:
        """Everything that may be sent now: ACKs first, then retransmissions, then new data."""
        self._now = now
        out = self._rx.take_acks(now)
        crx = self._credit_rx
        if crx is not None and crx.dirty:
            # Credit granted since the latest ACK was built (an ACK carries the limit of its moment).
            crx.dirty = False
            out.append((pack_ctrl(TYPE_CREDIT, 0, crx.ev, self.connection_id,
                                  crx.credit_field), crx.ev % self._num_evs))
            self.stats.credits_sent += 1
        self._pacing_blocked = False
        queue = self._send_queue
        recovery = self._recovery
        lost_queue = recovery.lost_queue
        ctx = self._credit_tx
        if not (queue or lost_queue):
            if ctx is not None and ctx.stalled_since is not None:
                ctx.note_stall(False, now)
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
        span = interval * self._pacing_packets
        horizon = now + (0.0 if q <= 0 else (q if q > span else span))
        ts = to_timestamp(now)
        # Overdue packets on a path the policy steers away from are likely lost: they hold no
        # window, so the live paths carry the rate while the loss deadline runs (RFC 6675's pipe).
        n_inflight = len(recovery.inflight) - len(recovery.overdue)
        on_sent = recovery.on_packet_sent
        append = out.append
        next_ev = self._policy.next_ev
        num_evs = self._num_evs
        cid = self.connection_id
        ipsn = self.initial_psn
        st = self.stats
        per_ev = st.per_ev
        span = self._send_span
        # New PSNs leave only below the receiver's credit (cc "credit"); without credit, no limit.
        credit_limit = ctx.limit if ctx is not None else float("inf")
        ev = self._last_ev
        n_new = 0
        new_bytes = 0
        # Bytes this end may still send before the peer is validated (see the module's docstring).
        amp_left = (self._amp_factor * self._rx_bytes - st.bytes_sent
                    if self._amp_factor and self._rtt.srtt is None else None)
        while True:
            rec = recovery.lost_packet() if lost_queue else None
            if rec is None:
                if not queue:
                    break
                seq = recovery.next_seq
                if seq - recovery.una >= span or not (seq < self._peer_limit or not n_inflight):
                    # Receive window closed (one packet may probe it when nothing is in flight,
                    # so a lost window update cannot stall the connection).
                    break
                if seq >= credit_limit:
                    break
            if n_inflight >= cwnd:
                break
            if next_time > horizon:
                self._pacing_blocked = True
                break
            if amp_left is not None and amp_left - new_bytes <= 0:
                # Over the amplification limit: one packet at a time while nothing is in flight, a
                # first response and its retransmissions, AMP_PROBES of them at most.
                if n_inflight or self._amp_probes >= AMP_PROBES:
                    break
                self._amp_probes += 1
            if rec is not None:
                recovery.pop_lost()
                retx = self._retransmit(rec, ts, now)
                append(retx)
                if amp_left is not None:
                    amp_left -= len(retx[0])
            else:
                # A new PSN: the next fragment of the oldest queued message.
                msg = queue[0]
                i = msg.next_frag
                fsize = msg.frag_size
                payload = msg.data[i * fsize : (i + 1) * fsize]
                msg.next_frag = i + 1
                if i + 1 >= msg.frag_count:
                    queue.popleft()
                ev = next_ev(now, None) % num_evs
                on_sent(SentPacket(seq, msg.msg_id, i, msg.frag_count, msg.size, payload, msg), ev, ts, now)
                data = pack_data(
                    0, ev, cid, (ipsn + seq) & PSN_MASK, msg.wire_id, i, msg.frag_count, msg.size, ts, payload,
                )
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
        self._queued_frags -= n_new
        self._last_ev = ev
        if ctx is not None:
            # CreditSender.need_request() and note_stall(), inlined: this runs on every call.
            demand = recovery.next_seq + self._queued_frags
            if ctx.request_due or (demand > ctx.reported and demand > ctx.limit):
                append((pack_ctrl(TYPE_REQUEST, 0, ev, cid, (ipsn + demand) & PSN_MASK), ev))
                ctx.sent_request(demand)
            if queue and recovery.next_seq >= ctx.limit and not recovery.inflight:
                if ctx.stalled_since is None:
                    ctx.stalled_since = now
            elif ctx.stalled_since is not None:
                ctx.stalled_since = None
        return out

    def get_timer(self) -> float | None:
        """Absolute time of the next timer (ACK delay, loss detection, RTO or pacing), or None."""
        t = self._rx.ack_deadline
        lt = self._recovery.loss_time()
        if lt is not None and (t is None or lt < t):
            t = lt
        if self._pacing_blocked:
            pt = self._pacer.next_time
            if t is None or pt < t:
                t = pt
        ctx = self._credit_tx
        if ctx is not None:
            ct = ctx.timer()
            if ct is not None and (t is None or ct < t):
                t = ct
            if self._own_scheduler is not None:
                ct = self._own_scheduler.get_timer()
                if ct is not None and (t is None or ct < t):
                    t = ct
        return t

    def handle_timer(self, now: float) -> None:
        self._now = now
        self._rx.on_timer(now)
        self._recovery.on_timeout(now)
        if self._pacing_blocked and now >= self._pacer.next_time:
            self._pacing_blocked = False  # the driver's next datagrams_to_send() sends
        if self._credit_tx is not None:
            self._credit_tx.on_timer(now)
            if self._own_scheduler is not None:
                self._own_scheduler.handle_timer(now)

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    @property
    def ack_room(self) -> int:
        """While a coalesced ACK is held: how many more DATA packets may arrive before it leaves at
        once (the batch fills, or one of them completes a message); 0 while none is held. Else it
        leaves at its deadline (part of ``get_timer()``). Its RTT echo and reported hold come from
        the batch's first packet, so a driver that read that packet promptly may read the next ones
        lazily until then: the ACK answers them all, as if they had arrived together."""
        return self._rx.ack_room

    @property
    def message_packets_left(self) -> int:
        """DATA packets the message being received (that of the latest packet) still waits for; 0
        when it is complete: the next packet may be any message's."""
        return self._rx.message_packets_left

    @property
    def idle(self) -> bool:
        """Nothing outstanding, nothing queued to send, no ACK owed."""
        return not (self._send_queue or self._recovery.sent or self._rx.owes_ack)

    def metrics(self) -> dict:
        m = self.stats.summary()
        m["connection_id"] = self.connection_id
        m["config"] = self.config.to_dict()
        m["state"] = {
            "cwnd": self._cc.window,
            "srtt": self._rtt.srtt,
            "rttvar": self._rtt.rttvar,
            "min_rtt": self._rtt.min_rtt,
            "inflight": len(self._recovery.inflight),
            "unacked": len(self._recovery.sent),
            "queued_messages": len(self._send_queue),
            "cc": self._cc.state(),
            "path_policy": self._policy.state(),
        }
        if self._credit_tx is not None and self._credit_rx is not None:
            tx, rx = self._credit_tx, self._credit_rx
            m["state"]["cc"] = {**m["state"]["cc"], "credit": {
                "limit": tx.limit, "requests_sent": tx.requests_sent, "credits_received": tx.credits_received,
                "granted": rx.granted, "demand": rx.demand, "used": rx.used, "written_off": rx.written_off,
                "scheduler": rx.scheduler.state(),
            }}
        # A plug-in policy's first fault (transport.core.policy_plugin; its state() may be the one), or None.
        m["path_policy_fault"] = getattr(self._policy, "fault", None)
        return m

    # ------------------------------------------------------------------ sender

    def _retransmit(self, rec: SentPacket, ts: int, now: float) -> tuple[bytes, int]:
        """Send a packet declared lost again, on another EV than last time where the policy can."""
        ev = self._policy.next_ev(now, rec.ev) % self._num_evs
        self._recovery.on_packet_sent(rec, ev, ts, now)
        data = pack_data(
            FLAG_RETRANSMIT, ev, self.connection_id, (self.initial_psn + rec.seq) & PSN_MASK,
            rec.msg_id & MSG_ID_MASK, rec.frag_index, rec.frag_count, rec.msg_len, ts, rec.payload,
        )
        st = self.stats
        evs = st.ev(ev)
        st.packets_sent += 1
        st.bytes_sent += len(data)
        st.retransmissions += 1
        evs.packets_sent += 1
        evs.bytes_sent += len(data)
        evs.retransmissions += 1
        return data, ev

    def _on_ctrl(self, ptype: int, limit: int, now: float) -> None:
        """A CREDIT or REQUEST for this connection whose header decoded and whose CRC matched."""
        rel = (limit - self.initial_psn) & PSN_MASK
        if ptype == TYPE_CREDIT and self._credit_tx is not None:
            self._credit_tx.on_credit(rel, now, self._recovery.next_seq)
        elif ptype == TYPE_REQUEST and self._credit_rx is not None:
            self.stats.requests_received += 1
            self._credit_rx.on_request(rel, now)
        else:
            self.stats.drop("credit_unused")  # the peer runs credit, this end does not

    def _on_ack(
        self, cum_psn: int, sack_base: int, sack_bitmap: int, ack_psn: int, echo_ts: int, ack_delay: int, rwnd: int,
        flags: int, now: float, credit: int = 0, ce: int = 0, owd: int = 0,
    ) -> None:
        """An ACK for this connection whose header decoded and whose CRC matched."""
        st = self.stats
        recovery = self._recovery
        # PSNs to seqs, relative to the oldest unacknowledged one; anything beyond what was sent is bogus.
        una = recovery.una
        ref = self.initial_psn + una
        # An ACK per packet in order moves the cumulative point one past the oldest unacknowledged.
        cum = una + 1 if cum_psn == (ref + 1) & PSN_MASK else una + psn_diff(cum_psn, ref)
        if cum > recovery.next_seq:
            st.drop("ack_unsent")
            return
        base = 0
        if sack_bitmap:
            base = una + psn_diff(sack_base, ref)
            if base + sack_bitmap.bit_length() - 1 >= recovery.next_seq:
                st.drop("ack_unsent")
                return
        st.acks_received += 1
        ctx = self._credit_tx
        # Most ACKs repeat the limit the previous one brought: compared as it is on the wire, unmapped.
        if flags & FLAG_CREDIT and ctx is not None and credit != ctx.credit_field:
            ctx.on_credit((credit - self.initial_psn) & PSN_MASK, now, recovery.next_seq)
        if ce:
            st.ecn_ce_echoed += ce
            if self._on_ecn is not None:
                self._on_ecn(ce, now)
        # An ACK usually answers the packet just below its cumulative point.
        ack_seq = cum - 1 if (ack_psn + 1) & PSN_MASK == cum_psn else una + psn_diff(ack_psn, ref)
        newly = recovery.on_ack(cum, base, sack_bitmap, ack_seq, echo_ts, ack_delay, flags & FLAG_NAK != 0, now, owd)
        # The receiver's window ends at a fixed distance from the start of the message it is
        # reassembling, so the end only moves forward; reordered ACKs cannot shrink it.
        limit = cum + (rwnd if rwnd < self._window_psns else self._window_psns)
        if limit > self._peer_limit:
            self._peer_limit = limit
        for rec in newly:
            msg = rec.msg
            msg.remaining -= 1
            if msg.remaining <= 0:
                st.messages_acked += 1
                st.bytes_acked += msg.size
                latency = now - msg.submitted
                st.completion.append(latency)
                self._events.append(MessageAcked(msg.wire_id, latency))
            rec.msg = None  # the message's data can go once its last fragment is acknowledged
