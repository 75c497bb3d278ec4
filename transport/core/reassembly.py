"""Receiving half of a connection: DATA packets in, messages reassembled and delivered, ACKs out.

``Reassembler`` takes each DATA packet the connection has parsed and checked, keeps what is
acceptable under the memory caps, hands complete messages over as ``MessageReceived`` events
(unordered, or in message-id order) and answers with ACKs: cumulative PSN, a 64-bit SACK bitmap and
the echoed timestamp, one per packet or coalesced for up to ``ack_delay``. In go-back-N mode it takes
only the expected PSN and sends one NAK per sequence error.

Sequence numbers are unbounded ``seq`` values as in the sender; only the wire carries them
modulo 2^32.

An ACK is held only for packets that can join it: when DATA has been arriving further apart than
``ack_delay`` (the smaller of the smoothed gap between accepted packets, gain 1/8, and the latest
gap), the next packet would come after the held ACK's deadline, so the ACK goes at once. Holding it
would only delay the sender's clock and cost a timer.

A coalesced ACK leaves on the EV of one of the latest ``ACK_EV_SLOTS`` accepted packets, the
slots taken in turn (ACK n the packet whose arrival count is n modulo the slots), not on the EV of
the packet it echoes. The echo is a batch's first packet, and batches of 8 over 16 round-robin EVs
echo EVs of one parity only: every ACK took the same half of the paths back, and a cut on one of
them silenced the connection. Taken in turn, the ACKs spread over the EVs the sender is using (one
for a single-path flow, those in good standing for an adaptive one) whatever the batch size. The
ACK's header still names the echoed packet's EV, which the sender's per-EV state reads.

A hole older than the ACK hold and ``QUICK_ACK_FRAMES`` frames' time on the link is a lost packet,
not sprayed reordering: until it fills, every arrival is acknowledged at once (``quick_acks``), as
TCP does after a loss, and so is the packet that fills it. While losses are repaired the sender's
window stands full of packets in flight and moves only as ACKs come: one ACK per batch then left the
sender idle between them (after a cut in the simulated failover fabric, bursts of sends 20-30 ms apart
instead of a steady stream).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from transport.core.config import TransportConfig
from transport.core.events import Event, MessageReceived
from transport.core.metrics import Stats
from transport.core.wire import FLAG_CREDIT, FLAG_NAK, MSG_ID_MASK, PSN_MASK, SACK_BITS, pack_ack, psn_diff

if TYPE_CHECKING:
    from transport.core.credit import CreditReceiver

_U32 = 0xFFFFFFFF
# Bytes a slot of a message's fragment table costs (a list entry).
_SLOT_BYTES = 8
# Gain of the smoothed gap between accepted DATA packets (see the rule above).
_GAP_GAIN = 0.125
# Latest arrivals whose EVs coalesced ACKs leave on, in turn (see the rule above); a power of two.
ACK_EV_SLOTS = 16
# A hole must outlast the ACK hold and this many full-size frames' time on the link before every
# arrival is acknowledged at once (see the rule above).
QUICK_ACK_FRAMES = 4


class _Sparse(dict):
    """Fragment index -> payload, for a message whose full table would outweigh what arrived;
    a missing index reads as None, as an empty slot of the list does."""

    __slots__ = ()

    def __missing__(self, key: int) -> None:
        return None


class _Reassembly:
    """A message being reassembled from its fragments."""

    __slots__ = ("first_seq", "frag_count", "frag_size", "frags", "last_size", "msg_len", "nbytes", "received")

    def __init__(self, first_seq: int, frag_count: int, msg_len: int, frag_size: int, first_len: int) -> None:
        self.first_seq = first_seq
        self.frag_count = frag_count
        self.msg_len = msg_len
        self.frag_size = frag_size  # payload of every fragment but the last; 0 until known
        # Size the last fragment must have (known once frag_size is); -1 = not known yet.
        self.last_size = msg_len - frag_size * (frag_count - 1) if frag_size else -1
        # The table of fragments weighs at most the fragment that opened it (first_len bytes): a
        # table sized by the count a packet claims let one small first fragment pin count * 8
        # bytes the byte cap never saw (1,024 such packets of 43 bytes held 51 MB). Typical
        # messages (up to max_payload / 8 fragments) keep the preallocated list, the fast path;
        # larger ones, or tiny fragments, hold only what arrived.
        self.frags: list[bytes | None] | _Sparse = (
            [None] * frag_count if frag_count * _SLOT_BYTES <= first_len else _Sparse()
        )
        self.received = 0
        self.nbytes = 0


class Reassembler:
    """The receive side of one connection; ACK datagrams it owes wait in ``take_acks()``."""

    def __init__(
        self, config: TransportConfig, connection_id: int, initial_psn: int, stats: Stats, events: deque[Event],
    ) -> None:
        self.config = config
        self.connection_id = connection_id
        self.initial_psn = initial_psn
        self.stats = stats
        self._events = events
        self._payload = config.max_payload
        self._wire = config.wire_packet_bytes  # a full-size DATA packet on the link
        self._gobackn = config.recovery == "gobackn"
        self._ordered = config.delivery == "ordered"
        self._num_evs = config.num_evs
        self._ack_delay = config.ack_delay
        self._ack_batch = config.ack_batch
        self._ack_on_message = config.ack_on_message and config.ack_delay > 0
        self._last_reasm: _Reassembly | None = None  # the message the latest accepted packet belongs to
        # PSNs accepted beyond the start of the oldest incomplete message: bounds buffered bytes.
        self.window_psns = max(1, config.max_reassembly_bytes // self._payload)
        self.max_message = self.window_psns * self._payload
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
        self.ack_deadline: float | None = None  # when the held ACK must go; None while none is held
        # The packet the next coalesced ACK answers (the batch's first): seq, echo timestamp, EV, arrival.
        self._ack_seq = -1
        self._ack_lo = self._ack_hi = -1  # lowest and highest PSN (seq) the held ACK answers
        self._ack_ts = 0
        self._ack_ev = 0
        self._ack_arrival = 0.0
        # EVs of the latest ACK_EV_SLOTS packets held for an ACK, by arrival count; -1: none yet.
        self._arrival_evs = [-1] * ACK_EV_SLOTS
        self._held_count = 0
        self._acks_flushed = 0
        self._last_data = -1.0  # arrival of the latest accepted DATA packet; < 0 before the first
        self._gap_smooth = 0.0  # smoothed gap between accepted DATA packets; 0 until measured
        self._data_gap = 0.0  # the smaller of that and the latest gap: what decides a hold
        self._ce = 0  # CE-marked DATA packets not yet echoed in an ACK
        # Since when the lowest missing PSN has been missing (while any is): a hole older than
        # _quick_after means a lost packet, and then every arrival is acknowledged at once.
        self._hole_since = 0.0
        frame = 8 * self._wire / config.link_rate_bps if config.link_rate_bps > 0 else 0.0
        self._quick_after = max(config.ack_delay, QUICK_ACK_FRAMES * frame)
        # Receiver-driven credit (cc "credit"): told of each accepted packet, its limit rides in every ACK.
        self.credit: CreditReceiver | None = None

    @property
    def owes_ack(self) -> bool:
        """An ACK is waiting to be sent or held for coalescing."""
        return bool(self._out_acks or self._ack_pending)

    @property
    def ack_room(self) -> int:
        """Further packets the held ACK waits for at most (see ``Connection.ack_room``); 0: none held."""
        pending = self._ack_pending
        if not pending:
            return 0
        room = self._ack_batch - pending
        r = self._last_reasm
        if self._ack_on_message and r is not None and r.received < r.frag_count:
            left = r.frag_count - r.received
            if left < room:
                room = left
        return room if room > 0 else 1

    @property
    def message_packets_left(self) -> int:
        """Packets the message of the latest accepted packet still waits for; 0 once it is complete."""
        r = self._last_reasm
        return 0 if r is None else r.frag_count - r.received

    def on_timer(self, now: float) -> None:
        """Release the held ACK once its deadline has come."""
        if self._ack_pending and self.ack_deadline is not None and now >= self.ack_deadline:
            self._flush_ack(now)

    def take_acks(self, now: float) -> list[tuple[bytes, int]]:
        """The ACK datagrams to send now (with their EV), a held one included once it is due."""
        self.on_timer(now)
        out = self._out_acks
        self._out_acks = []
        return out

    def on_data(
        self, psn: int, msg_id: int, idx: int, count: int, msg_len: int, ts: int, ev: int, payload: bytes,
        now: float, ce: bool = False,
    ) -> None:
        """One DATA packet whose header decoded and whose CRC matched; ``ce``: it arrived CE-marked."""
        st = self.stats
        if ce:
            # Echoed by the next ACK, duplicates included: a mark says the path queues, whatever it carried.
            self._ce += 1
            st.ecn_ce_received += 1
        plen = len(payload)
        if plen > self._payload:
            st.drop("oversize")
            return
        nxt = self._rcv_nxt
        # In order (the common case) the PSN is the expected one: no serial-number arithmetic.
        nxt_psn = (self.initial_psn + nxt) & PSN_MASK
        seq = nxt if psn == nxt_psn else nxt + psn_diff(psn, nxt_psn)
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
                self._out_acks.append(self._build_ack(seq, ts, ev, 0, now, FLAG_NAK))
            return
        if seq - self._rcv_base >= self.window_psns:
            st.drop("beyond_window")
            # Tell the sender where the window really ends (it may be probing a closed window).
            self._out_acks.append(self._build_ack(seq, ts, ev, 0, now))
            return
        head = self._msg_head
        # Message ids wrap at 2^32 like PSNs; most packets belong to the head message.
        msg = head if msg_id == head & MSG_ID_MASK else head + psn_diff(msg_id, head)
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
            if msg_len > self.max_message or count > self.window_psns:
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
            r = _Reassembly(first_seq, count, msg_len, frag_size, plen)
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
        st.arrivals.add(now, plen)
        if self._ack_delay > 0:  # the gap decides holds only (see the rule above)
            prev = self._last_data
            if prev >= 0.0:
                gap = now - prev
                g = self._gap_smooth
                g = self._gap_smooth = gap if not g else g + (gap - g) * _GAP_GAIN
                # The latest gap as well: packets that start coming close together are held at once.
                self._data_gap = g if g < gap else gap
            self._last_data = now
        if seq < self._rcv_highest:
            st.out_of_order += 1
            st.reorder_distance.append(self._rcv_highest - seq)
        else:
            self._rcv_highest = seq
        had_hole = bool(ooo)
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
            # The packet that fills an old hole is usually its retransmission: say so at once.
            quick = had_hole and now - self._hole_since > self._quick_after
            self._hole_since = now
        else:
            if had_hole:
                quick = now - self._hole_since > self._quick_after
            else:
                quick = False
                self._hole_since = now
            ooo[seq] = (idx, count)
        self._last_reasm = r
        completed = r.received == count
        if completed:
            self._last_reasm = None
            del self._reasm[msg]
            self._complete(msg, r, now)
        if self.credit is not None:
            short = (self._payload - plen) / self._wire if plen < self._payload else 0.0
            self.credit.on_data(seq, first_seq + count, ev, now, short, completed)
        if completed and self._ack_on_message:
            self._queue_ack(seq, ts, ev, now)
            self._flush_ack(now)
            return
        # Inlined _queue_ack() for ACK-per-packet.
        if self._ack_delay <= 0:
            self._out_acks.append(self._build_ack(seq, ts, ev, 0, now))
            return
        self._queue_ack(seq, ts, ev, now)
        if quick and self._ack_pending:
            self.stats.quick_acks += 1
            self._flush_ack(now)

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
        frags = r.frags
        # A sparse table holds its fragments in arrival order: join them in index order.
        data = b"".join(frags if type(frags) is list else map(frags.__getitem__, range(r.frag_count)))  # type: ignore[arg-type]
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
            self._out_acks.append(self._build_ack(seq, ts, ev, 0, now))
            return
        n = self._held_count
        self._arrival_evs[n & (ACK_EV_SLOTS - 1)] = ev
        self._held_count = n + 1
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
            self.ack_deadline = now + self._ack_delay
        self._ack_pending += 1
        if self._ack_pending >= self._ack_batch or self._data_gap > self._ack_delay:
            self._flush_ack(now)

    def _flush_ack(self, now: float) -> None:
        if self._ack_pending:
            # The echo (RTT sample) answers the batch's first arrival; the bitmap ends at the
            # batch's highest PSN so that it covers the whole batch; the EVs it leaves on rotate.
            k = self._acks_flushed
            self._acks_flushed = k + 1
            via = self._arrival_evs[k & (ACK_EV_SLOTS - 1)]
            self._out_acks.append(
                self._build_ack(
                    self._ack_seq, self._ack_ts, self._ack_ev, round((now - self._ack_arrival) * 1e6),
                    self._ack_arrival, cover=self._ack_hi, via=via,
                )
            )
        self._ack_pending = 0
        self.ack_deadline = None

    def _build_ack(
        self, seq: int, echo_ts: int, ev: int, delay_us: int, arrival: float, flags: int = 0, cover: int = -1,
        via: int = -1,
    ) -> tuple[bytes, int]:
        """An ACK answering ``seq``, which arrived at ``arrival`` bearing timestamp ``echo_ts`` on EV
        ``ev``; its SACK bitmap ends at ``cover`` (default ``seq``) when that is beyond the 64 PSNs
        after the cumulative point. It leaves on EV ``via`` (default ``ev``)."""
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
        rwnd = self.window_psns - (nxt - self._rcv_base)
        ipsn = self.initial_psn
        credit = 0
        crx = self.credit
        if crx is not None:
            flags |= FLAG_CREDIT
            credit = (ipsn + crx.granted) & PSN_MASK
            crx.dirty = False  # this ACK carries the current limit
        ce = self._ce
        if ce:
            self._ce = 0
            if ce > 0xFFFF:
                ce = 0xFFFF
        data = pack_ack(
            flags, ev, self.connection_id, (ipsn + nxt) & PSN_MASK, (ipsn + base) & PSN_MASK, bitmap,
            (ipsn + seq) & PSN_MASK, echo_ts,
            # Clamped to their 32-bit fields; chained comparisons spare four builtin min/max
            # calls per ACK, a measurable share of the receive path.
            delay_us if 0 <= delay_us <= _U32 else (0 if delay_us < 0 else _U32),
            rwnd if 0 <= rwnd <= _U32 else (0 if rwnd < 0 else _U32),
            credit, ce,
            # The one-way delay in our clock less the sender's, modulo the field: only differences
            # between samples mean anything, and the sender takes only those.
            (round(arrival * 1e6) - echo_ts) & _U32,
        )
        self.stats.acks_sent += 1
        return data, (via if via >= 0 else ev) % self._num_evs

