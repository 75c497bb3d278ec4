"""Loss recovery of the sender, in the shape of aioquic's QuicPacketRecovery.

``LossRecovery`` keeps a record of every PSN sent and not yet acknowledged and decides when one is
lost. The connection reports each transmission (``on_packet_sent``) and each ACK (``on_ack``), asks
when the next check is due (``loss_time``) and calls ``on_timeout`` then; what is declared lost
waits in a queue (``lost_packet`` / ``pop_lost``) for the connection to send again.

The rules, all here:

* RTT: one ``RttEstimator`` (RFC 6298 gains) for the connection, shared with congestion control,
  and one per EV for loss detection.
* Loss detection is time-based and per EV (RACK-like): a packet overtaken by a later-sent,
  acknowledged packet is lost once it is older than its EV's smoothed RTT times (1 + reorder_window)
  plus twice that EV's RTT variation (the connection's before the EV has a sample), plus the time
  the peer may hold an ACK (the holds it reports, believed up to ``max_ack_delay`` and below the
  round trip they are part of), plus, when the link rate is known, REORDER_FRAMES full-size frames'
  time on the link: sprayed paths' queues differ by whole frames, which a slow link makes long
  against the RTT (at 4 Mb/s a jumbo frame takes 18 ms). Packets sprayed over paths of different
  delay are then not declared lost for arriving late.
* Overdue packets: an overtaken packet older than its EV's smoothed RTT plus twice its variation
  and the frames' allowance is reported to the path policy (``on_suspect``, a hook only policies
  that steer have) before it is declared lost: it is not retransmitted and the window is not cut,
  since it may only be late, but a policy that steers can stop sending on a path that just died or
  slowed before the loss deadline's margins for reordering and held ACKs have passed. For a policy
  that then sends nothing new on that EV (``avoids_overdue``: the built-in adaptive one), such
  packets (``overdue``) hold no window while they wait, as RFC 6675's pipe leaves out what is likely lost:
  after a cut they had filled the window of an adaptive sender, which then sent at half its rate on
  the live paths until the loss deadline passed.
* RTO: srtt + 4 rttvar but at least 2 srtt and rto_min, doubled per consecutive timeout, running
  from the oldest packet in flight or the latest ACK that acknowledged something new. Before the
  first RTT sample, 3 RTT guesses (``config.rtt_guess``: the fabric's base RTT when known and longer
  than initial_rtt). The first timeout since progress (and any before an RTT sample) resends only
  the oldest packet, a probe: a queue that outgrew the estimate is likelier than a lost round, and
  the probe's ACK lets RACK find what is really lost. A second timeout in a row declares lost
  everything in flight for more than half the timeout.
* Spurious retransmissions, found from the echoed timestamp, undo the congestion window decrease
  and widen the reordering allowance, which narrows again after a quiet spell.
* Go-back-N (``recovery="gobackn"``): a NAK or a timeout resends everything from the gap on. A NAK
  rewinds only from a PSN the sender has outstanding, and only when it echoes the wire timestamp of a
  transmission of the packet that triggered it: the receiver echoes what it got, so a NAK is believed
  only from something that saw that packet. A NAK that echoes nothing sent (forged blind) is counted
  (``dropped.nak_ignored``), and the ACK's cumulative part alone is taken. A forged NAK every
  millisecond naming the oldest unacknowledged PSN once doubled a transfer's time and packets (140
  rewinds for 1 MiB). Stale NAKs, answering a copy sent before the gap was last resent, still rewind:
  the receiver NAKs each gap once, and ignoring that one left the gap to the RTO (lossless sprayed
  go-back-N fell from 454 to 262 Mb/s).
"""

from __future__ import annotations

import heapq
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from transport.core.rtt import OneWayDelay, RttEstimator, rto

if TYPE_CHECKING:
    from transport.core.config import TransportConfig
    from transport.core.congestion import CongestionControl
    from transport.core.metrics import Stats
    from transport.core.paths import PathPolicy

logger = logging.getLogger(__name__)

# Retransmitted PSNs remembered after being acknowledged, so that a late ACK echoing the original
# transmission can still reveal the retransmission as spurious.
_RETIRED_MAX = 4096
# The reordering allowance widens up to this multiple of reorder_window after spurious
# retransmissions, and halves again after this many smoothed RTTs without one.
_REORDER_SCALE_MAX = 16.0
_REORDER_DECAY_RTTS = 16.0
# Frames a sprayed packet may trail its successors by before it is late (see the rules above).
REORDER_FRAMES = 2


class SentPacket:
    """One PSN the sender has transmitted at least once and not yet seen acknowledged.

    The latest transmission is kept in plain fields (``ts``, ``ev``, ``sent_time``, ``tx_order``);
    the list of every transmission (``tx``) is only built once the PSN is retransmitted, so the
    common, single-transmission case allocates one object per packet.
    """

    __slots__ = (
        "ev", "frag_count", "frag_index", "lost", "lost_time", "msg", "msg_id", "msg_len", "payload", "sent_time",
        "seq", "spurious", "ts", "tx", "tx_order",
    )

    def __init__(
        self,
        seq: int,
        msg_id: int,
        frag_index: int,
        frag_count: int,
        msg_len: int,
        payload: bytes,
        msg: Any = None,
    ) -> None:
        self.seq = seq  # unbounded sequence number; the PSN on the wire is (initial + seq) mod 2^32
        self.msg_id = msg_id
        self.frag_index = frag_index
        self.frag_count = frag_count
        self.msg_len = msg_len
        self.payload = payload
        self.msg = msg  # the sender's record of the message (completion accounting)
        self.sent_time = 0.0  # of the latest transmission
        self.ev = 0  # of the latest transmission
        self.ts = 0  # wire timestamp of the latest transmission
        self.tx_order = 0  # transmission counter of the latest transmission (orders sends made at one instant)
        # Every transmission as (wire timestamp, ev, time), oldest first; None while there was one.
        self.tx: list[tuple[int, int, float]] | None = None
        self.lost = False
        self.lost_time: float | None = None  # when first declared lost
        self.spurious = False


class LossRecovery:
    """Sent-packet records, RTT, loss detection, RTO and retransmission queue of one sender.

    Sequence numbers here are the connection's unbounded ``seq`` values, never wire PSNs.
    ``sent`` holds every packet not yet acknowledged, ``inflight`` those of them not declared lost,
    in transmission order.
    """

    def __init__(
        self, config: TransportConfig, rtt: RttEstimator, cc: CongestionControl, policy: PathPolicy, stats: Stats,
    ) -> None:
        self.config = config
        self.rtt = rtt
        self._cc = cc
        self._policy = policy
        self._stats = stats
        self._gobackn = config.recovery == "gobackn"
        self.sent: dict[int, SentPacket] = {}
        self.inflight: OrderedDict[int, SentPacket] = OrderedDict()
        self.una = 0  # lowest seq not yet acknowledged
        self.next_seq = 0  # one past the highest seq sent
        # Heap of seqs declared lost, awaiting retransmission (read through lost_packet(); the
        # send loop tests it for emptiness before calling).
        self.lost_queue: list[int] = []
        self._retired: OrderedDict[int, SentPacket] = OrderedDict()
        self._tx_count = 0
        self._rack_order = 0  # tx_order of the most recently sent packet known delivered
        self._rack_dirty = False
        self._loss_time: float | None = None
        self._ev_rtt: dict[int, RttEstimator] = {}
        self._owd = OneWayDelay()
        # How long the peer may hold an ACK (RFC 9002's max_ack_delay): loss detection and the RTO
        # wait that much longer, since a packet answered by a held ACK is not late. Starts at our
        # own setting (both ends normally share one) and follows the longest holds the peer
        # reports: up at once, down slowly (a fast connection fills its batches in microseconds).
        self._ack_allow = config.ack_delay
        self._frames_allow = (REORDER_FRAMES * 8 * config.wire_packet_bytes / config.link_rate_bps
                              if config.link_rate_bps > 0 else 0.0)
        self._max_ack_delay = max(config.max_ack_delay, config.ack_delay)
        self._backoff = 0
        # The policy's optional hook for packets overdue but not yet lost (see the rules above).
        self._suspect = getattr(policy, "on_suspect", None)
        # EVs the policy has on probation with a packet out, and its hook for their deliveries.
        self._probing: set[int] | None = getattr(policy, "probing", None)
        self._on_delivered = getattr(policy, "on_delivered", None)
        # In-flight seqs found overdue, out of the window's count until acknowledged or declared lost
        # (see the rules above): only for a policy that sends nothing new on an overdue EV
        # (``avoids_overdue``), since for any other the freed window would go to the dead path too.
        self.overdue: set[int] = set()
        self._release_overdue = self._suspect is not None and getattr(policy, "avoids_overdue", False)
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

    # ------------------------------------------------------------------ sending

    def on_packet_sent(self, rec: SentPacket, ev: int, ts: int, now: float) -> None:
        """``rec`` left now on ``ev`` with wire timestamp ``ts``: its first transmission, or a
        retransmission after it was declared lost."""
        self._tx_count += 1
        if rec.tx_order:
            # Every transmission is kept, so that the echoed timestamp tells which copy arrived.
            tx = rec.tx
            if tx is None:
                tx = rec.tx = [(rec.ts, rec.ev, rec.sent_time)]
            tx.append((ts, ev, now))
            rec.lost = False
        else:
            self.sent[rec.seq] = rec
            self.next_seq = rec.seq + 1
        rec.sent_time = now
        rec.ev = ev
        rec.ts = ts
        rec.tx_order = self._tx_count
        self.inflight[rec.seq] = rec

    def lost_packet(self) -> SentPacket | None:
        """The lowest seq declared lost and not resent yet, left queued (see ``pop_lost``)."""
        # Entries whose packet was acknowledged meanwhile are discarded lazily.
        lost = self.lost_queue
        while lost:
            rec = self.sent.get(lost[0])
            if rec is not None and rec.lost:
                return rec
            heapq.heappop(lost)
        return None

    def pop_lost(self) -> None:
        """Take the packet ``lost_packet()`` returned off the queue: it is being resent."""
        heapq.heappop(self.lost_queue)

    # ------------------------------------------------------------------ acknowledgments

    def on_ack(
        self, cum: int, sack_base: int, sack_bitmap: int, ack_seq: int, echo_ts: int, ack_delay: int, nak: bool,
        now: float, owd: int | None = None,
    ) -> list[SentPacket]:
        """One ACK, validated and mapped to seqs by the connection: every seq below ``cum`` and
        ``sack_base + i`` for each bit i of ``sack_bitmap`` arrived; ``ack_seq`` is the packet
        whose timestamp ``echo_ts`` the ACK echoes after holding it ``ack_delay`` microseconds, and
        ``owd`` its one-way delay in the peer's clock less ours (None: not reported).
        Returns the packets it newly acknowledges, in the order it found them."""
        st = self._stats
        sent = self.sent
        # The record of the triggering PSN, looked up before acknowledged records are removed.
        trig = sent.get(ack_seq) or self._retired.get(ack_seq)
        una = self.una
        newly: list[SentPacket] = []
        if cum > una:
            pop = sent.pop
            for s in range(una, cum):
                rec = pop(s, None)
                if rec is not None:
                    newly.append(rec)
        bitmap = sack_bitmap
        while bitmap:
            low = bitmap & -bitmap
            bitmap ^= low
            rec = sent.pop(sack_base + low.bit_length() - 1, None)
            if rec is not None:
                newly.append(rec)
        una = cum if cum > una else una
        next_seq = self.next_seq
        while una < next_seq and una not in sent:
            una += 1
        self.una = una

        # What the echoed timestamp tells: an RTT sample, the peer's ACK hold, whether a
        # retransmission was spurious, and RACK's reference (the latest-sent delivered packet).
        rtt_sample: float | None = None
        echoed = False  # the ACK echoes a transmission of its triggering packet
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
            echoed = match >= 0
            if echoed:
                raw = now - sent_time
                if ack_delay:
                    # The hold the peer reports is believed only up to the longest it may hold an
                    # ACK, and only below the round trip it is part of (RFC 9002 section 5.3): a
                    # forged 0xFFFFFFFF us once stretched every loss deadline and RTO by 71 minutes.
                    held = ack_delay * 1e-6
                    if held > self._max_ack_delay:
                        held = self._max_ack_delay
                    if held < raw:
                        allow = self._ack_allow
                        self._ack_allow = held if held > allow else allow - (allow - held) / 64
                        rtt = raw - held
                    else:
                        rtt = raw
                else:
                    rtt = raw
                if rtt > 0:
                    rtt_sample = rtt
                    conn_rtt = self.rtt
                    conn_rtt.update(rtt)
                    if owd is not None:
                        # Only the way out's queueing is this connection's to control: the ACK may
                        # have queued behind the peer's own data on the way back. It cannot exceed the
                        # whole round trip's excess, which also bounds what a lying peer can claim.
                        q = self._owd.sample(owd)
                        excess = rtt - conn_rtt.min_rtt  # type: ignore[operator]
                        conn_rtt.queueing = q if q < excess else excess
                    self._rto_value = None
                    est = self._ev_rtt.get(ev)
                    if est is None:
                        est = self._ev_rtt[ev] = RttEstimator()
                    est.update(rtt)
                    st.rtt.append(rtt)
                    (st.per_ev.get(ev) or st.ev(ev)).rtt.append(rtt)
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

        # Acknowledged packets leave the flight; the latest-sent of them becomes RACK's reference.
        if newly:
            self._last_progress = now
            per_ev = st.per_ev
            inflight_pop = self.inflight.pop
            retired = self._retired
            rack = self._rack_order
            overdue = self.overdue
            probing = self._probing
            for rec in newly:
                inflight_pop(rec.seq, None)
                if overdue:
                    overdue.discard(rec.seq)
                if probing and rec.ev in probing:
                    self._on_delivered(rec.ev, now)  # type: ignore[misc]
                rec.lost = False
                (per_ev.get(rec.ev) or st.ev(rec.ev)).acked += 1
                if rec.tx is None:
                    if rec.tx_order > rack:
                        rack = rec.tx_order
                else:
                    # Retransmitted: remembered a while, for echoes of an earlier copy (above).
                    retired[rec.seq] = rec
                    if len(retired) > _RETIRED_MAX:
                        retired.popitem(last=False)
                if rec.lost_time is not None:
                    st.recovery.append(now - rec.lost_time)
            if rack > self._rack_order:
                self._rack_order = rack
                self._rack_dirty = True
            if self._backoff:
                self._backoff = 0
                self._rto_value = None
        if rtt_sample is not None:
            self._cc.on_ack(rtt_sample, len(newly), now)

        # What the ACK says about the packets still in flight.
        if self._gobackn:
            # One rewind per sequence error per RTT: NAKs for the same PSN may arrive in bursts.
            repeat = cum == self._rewind_seq and now - self._rewind_time <= (self.rtt.srtt or 0.0)
            if nak and cum in sent and not repeat:
                if echoed:
                    self._rewind(cum, now)
                else:
                    st.drop("nak_ignored")  # see the rules above
        elif self._rack_dirty:
            inflight = self.inflight
            if inflight and next(iter(inflight.values())).tx_order < self._rack_order:
                self.detect_lost(now)
            else:
                # Nothing in flight was overtaken (the common, in-order case): no loss timer.
                self._rack_dirty = False
                self._loss_time = None
        elif self._loss_time is not None and now >= self._loss_time:
            self.detect_lost(now)
        return newly

    def _on_spurious(self, now: float) -> None:
        """A retransmission was unnecessary: undo the window decrease it caused, and widen the
        reordering allowance (RACK's reo_wnd adapts the same way, on DSACKs), since paths whose
        delays differ by more than the allowance would otherwise keep tripping it."""
        self._cc.on_spurious(now)
        self._reorder_scale = min(self._reorder_scale * 2.0, _REORDER_SCALE_MAX)
        self._reorder_since = now

    # ------------------------------------------------------------------ loss detection

    def detect_lost(self, now: float) -> None:
        """RACK-like: an in-flight packet sent before the latest delivered one is lost once it is
        older than its own EV's RTT plus the reordering allowance."""
        self._rack_dirty = False
        self._loss_time = None
        rack = self._rack_order
        inflight = self.inflight
        if not inflight or next(iter(inflight.values())).tx_order >= rack:
            return  # nothing in flight was overtaken
        lost: list[SentPacket] = []
        allowance: dict[int, float] = {}
        ack_allow = self._ack_allow + self._frames_allow
        srtt = self.rtt.srtt
        scale = self._reorder_scale
        if scale > 1.0 and now - self._reorder_since > _REORDER_DECAY_RTTS * (srtt or 0.0):
            # No spurious retransmission for a while: narrow the allowance again, step by step.
            scale = self._reorder_scale = max(1.0, scale / 2)
            self._reorder_since = now
        window = self.config.reorder_window * scale
        loss_time = None
        overdue: dict[int, float] | None = {} if self._suspect is not None else None
        suspects: set[int] = set()
        release = self._release_overdue
        late: list[int] = []
        for rec in inflight.values():
            if rec.tx_order >= rack:
                break
            ev = rec.ev
            a = allowance.get(ev)
            if a is None:
                a = allowance[ev] = self._reorder_allowance(ev, window)
            deadline = rec.sent_time + a + ack_allow
            if deadline <= now:
                lost.append(rec)
                continue
            if loss_time is None or deadline < loss_time:
                loss_time = deadline
            # Every overdue packet counts when they leave the window; else one per EV tells the policy.
            if overdue is not None and (release or ev not in suspects):
                o = overdue.get(ev)
                if o is None:
                    o = overdue[ev] = self._overdue_after(ev)
                if rec.sent_time + o <= now:
                    suspects.add(ev)
                    if release:
                        late.append(rec.seq)
        self._loss_time = loss_time
        if release:
            self.overdue = set(late)
        for ev in suspects:
            self._suspect(ev, now)  # type: ignore[misc]
        if lost:
            evs = {rec.ev for rec in lost}
            share = self._ev_share(evs)
            for rec in lost:
                self._mark_lost(rec, now)
            for ev in evs:
                self._policy.on_loss(ev, now)
            self._cc.on_loss(now, share)

    def _reorder_allowance(self, ev: int, window: float) -> float:
        """How long after sending an overtaken packet on ``ev`` it is declared lost (before the
        peer's ACK delay): from the EV's own RTT, else the connection's, else the RTT guess."""
        est = self._ev_rtt.get(ev) or self.rtt
        if est.srtt is None:
            est = self.rtt
        if est.srtt is None:
            return self.config.rtt_guess * (1 + window) * 2
        return est.srtt * (1 + window) + 2 * est.rttvar

    def _overdue_after(self, ev: int) -> float:
        """How long after sending an overtaken packet on ``ev`` the path policy hears it is overdue:
        the loss deadline without its margins for reordering and held ACKs, i.e. the EV's smoothed
        RTT plus twice its variation and the frames' allowance. Without the variation, every packet
        slower than the mean was overdue: on paths that are their own bottlenecks the adaptive
        policy then benched live EVs all the time and carried 0.65 of what spray did in a fault-free
        trial."""
        return self._reorder_allowance(ev, 0.0) + self._frames_allow

    def _mark_lost(self, rec: SentPacket, now: float) -> None:
        self.inflight.pop(rec.seq, None)
        self.overdue.discard(rec.seq)
        rec.lost = True
        if rec.lost_time is None:
            rec.lost_time = now
        heapq.heappush(self.lost_queue, rec.seq)
        self._stats.losses_detected += 1
        self._stats.ev(rec.ev).losses += 1

    def _ev_share(self, evs: set[int]) -> float:
        """Fraction of the in-flight packets that were sent on ``evs``."""
        if not self.inflight:
            return 1.0
        on = sum(1 for rec in self.inflight.values() if rec.ev in evs)
        return max(on, 1) / len(self.inflight)

    def _rewind(self, seq: int, now: float) -> None:
        """Go-back-N: resend everything from ``seq`` on."""
        self._stats.gobackn_rewinds += 1
        self._rewind_seq = seq
        self._rewind_time = now
        first = self.sent[seq]
        self._policy.on_loss(first.ev, now)
        for rec in [r for r in self.inflight.values() if r.seq >= seq]:
            self._mark_lost(rec, now)
        self._cc.on_loss(now)

    # ------------------------------------------------------------------ timers

    def loss_time(self) -> float | None:
        """When ``on_timeout`` is next due: a loss-detection deadline or the RTO, or None."""
        t = self._loss_time
        if self.inflight:
            rt = self._rto_deadline()
            if t is None or rt < t:
                t = rt
        return t

    def on_timeout(self, now: float) -> None:
        """Run what is due at ``now``: loss detection, then the RTO."""
        if self._loss_time is not None and now >= self._loss_time:
            self.detect_lost(now)
        if self.inflight and now >= self._rto_deadline():
            self._on_rto(now)

    def rto(self) -> float:
        """The retransmission timeout for the current estimate and backoff (see ``rto()``)."""
        # Asked for on every loss_time(), but it only changes with an RTT sample or the backoff.
        value = self._rto_value
        if value is None:
            c = self.config
            value = self._rto_value = rto(self.rtt, c.rtt_guess, c.rto_min, c.rto_max, self._backoff)
        return value

    def _rto_deadline(self) -> float:
        start = next(iter(self.inflight.values())).sent_time
        if self._last_progress > start:
            start = self._last_progress
        return start + self.rto() + self._ack_allow

    def _on_rto(self, now: float) -> None:
        # The same expression as the deadline loss_time() reported: summed in another order, the
        # float could differ in its last bit and leave a due timer unserved forever.
        if not self.inflight or self._rto_deadline() > now:
            return
        timeout = self.rto() + self._ack_allow
        # Everything in flight for more than half the timeout is declared lost with the oldest
        # packet, so that one timeout resends a whole round in PSN order; timing each packet out
        # separately would resend them in their old order and could starve the lowest PSN
        # behind the same queue every round.
        expired = []
        if self.rtt.srtt is None or not self._backoff:
            # No RTT sample yet (the timeout only guessed the RTT, config.rtt_guess), or the first
            # timeout since progress: a queue that grew faster than the RTT estimate is the likelier
            # story than the loss of a whole round (an incast's queue doubles its RTT within one).
            # Probe with the oldest packet: its ACK lets RACK find what really is lost, and what
            # was only late is not resent. A second timeout in a row resends the round.
            expired.append(next(iter(self.inflight.values())))
        else:
            for rec in self.inflight.values():
                if rec.sent_time + timeout / 2 > now:
                    break
                expired.append(rec)
        st = self._stats
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
