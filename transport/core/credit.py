"""Receiver-driven credit (`cc="credit"`), in the style of EQDS and Ultra Ethernet's RCCC.

A receiver knows its own link rate and sees every sender that wants it; it hands out permission to
send ("credit") at that rate, so its downlink does not queue and an incast does not collapse. Three
sans-I/O objects hold it: ``CreditSender`` (a connection's sending side), ``CreditReceiver`` (a
connection's receiving side) and ``CreditScheduler`` (one per receiving endpoint, shared by every
connection it serves; a connection alone owns a private one). Credit is counted in PSNs (the
connection's unbounded ``seq``) and travels as a cumulative limit, so a lost grant is repaired by
any later one.

The rules, all here:

* Unscheduled window: a sender may send new PSNs below ``initial_window`` (one BDP when the
  configuration knows the link rate and base RTT, TransportConfig.initial_window) before any credit;
  both ends derive the same number from the configuration they share.
* After that a new PSN leaves only below the latest credit limit, carried by a CREDIT packet or by
  the ACK's credit field (flag FLAG_CREDIT). Retransmissions need no credit: they replace packets the
  receiver's accounting has already written off (below), and loss recovery bounds them.
* A limit is believed only up to what the receiver could have granted: its scheduler keeps at most
  ``receiver_window`` PSNs outstanding beyond what it has seen used, and it cannot have seen a PSN the
  sender never sent, so a limit beyond one past the highest PSN sent plus that window is cut to it.
  One forged CREDIT claiming 2^31 - 1 once let a sender burst its whole backlog into a 64-packet
  queue (25,683 drops for 4 MiB); now it buys at most one window, once. A genuine limit cut so is
  read again from the next ACK, which repeats it.
* Demand: the receiver learns how far a sender wants to send from the extent of each message it
  sees (first PSN + fragment count) and from REQUEST packets, which the sender sends whenever it
  queues data beyond both its credit and the demand it last reported.
* Grants: the scheduler grants one PSN at a time, round robin over the connections whose demand
  exceeds their credit, at ``credit_rate_bps`` (receiver_rate_bps, else link_rate_bps; a full-size
  packet per grant). A DATA packet shorter than full size (a message's last fragment) gives the bank
  back the share of its grant's wire time it left unused, so the grants fill the link whatever the
  message size (64 KiB messages in 9000-byte frames end in a third of a frame: without it, 91 % of
  the link). Arriving DATA clocks the grants: what the rate allows by then goes at once
  (and rides in the ACK the packet gets); without arrivals a timer grants in rounds of at least
  ``pacing_quantum``. Either way only while the credit outstanding
  over all its connections (granted, up to demand, and not yet seen used: the highest PSN received)
  is below the receiver window, one BDP plus one round of grants (``receiver_window``). Without a
  rate only that window bounds it. The first grants thus wait until the unscheduled windows of an
  incast have drained, and after that the downlink queue stays near one round of grants. A
  scheduler that was idle starts its first round one quantum after the first packet, with no
  tokens banked: the senders of an incast that start together are all known before credit flows,
  so none gets a head start.
* Lost credit and lost data: a connection whose credit has been outstanding without a DATA packet for
  ``credit_timeout(config)`` (max(rto_min, 4 base RTTs), the base RTT being initial_rtt while
  unknown) has it written off the window, and its current limit is sent again in a CREDIT packet.
  A sender with data to send, no credit and nothing in flight sends its REQUEST again once the same
  span has passed, doubling the wait up to rto_max while nothing answers; the receiver answers a
  REQUEST with its current limit.
* Proof: a connection proves it is real by using credit, i.e. by a DATA packet at a PSN beyond its
  unscheduled window (only a grant allowed that), or by a complete message. Until then, credit of
  its that is written off for want of DATA makes it dormant: it wants no more credit, whatever its
  REQUESTs claim (they are still answered with its limit), until a DATA packet of it is accepted
  again. A proven connection's lost credit is written off and granted again as before. Ten
  connections opened by two forged datagrams each (a first fragment and a REQUEST for 2^30 PSNs)
  once took their share of every round for good: two genuine 2 MiB flows took 2.16 s instead of
  0.36 s. Now each holds credit for one write-off period, and again only for each DATA packet
  accepted from it, as any sender would. A genuine sender goes dormant too when its first grants
  are written off before it used them (its DATA or the CREDIT lost), and wakes with its next DATA
  packet: in simulated incasts into 4-6 packet queues that moved the slowest flow's completion by
  -0.3 % to +0.4 % (and 276 retransmissions to 187 in one), none at all without drops.
* Path: credit is blind to EVs, so it works alike with spraying and a single path; CREDIT and
  REQUEST go on the EV of the latest DATA packet (the sender's last path, which the receiver's
  endpoint knows the address of).
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, Any

from transport.core.wire import PSN_MASK, psn_diff

_PSN_HALF = 1 << 31

if TYPE_CHECKING:
    from transport.core.config import TransportConfig


def credit_timeout(config: TransportConfig) -> float:
    """How long outstanding credit may go unused before it is written off (see the rules above)."""
    base = config.base_rtt if config.base_rtt > 0 else config.initial_rtt
    return max(config.rto_min, 4 * base)


def receiver_window(config: TransportConfig) -> int:
    """Credit a receiver lets be outstanding over all its connections: one BDP plus one round of grants
    (the packets its rate grants in ``pacing_quantum``, at least one), since grants come in rounds."""
    rate = config.credit_rate_bps / (8 * config.wire_packet_bytes)
    return config.initial_window + max(1, math.ceil(rate * config.pacing_quantum))


class CreditSender:
    """A connection's sending side under credit: the limit it may send new PSNs below, and the demand
    it has reported."""

    __slots__ = (
        "_base_wait",
        "_initial_psn",
        "_max_wait",
        "_window",
        "credit_field",
        "credits_received",
        "limit",
        "reported",
        "request_due",
        "requests_sent",
        "stalled_since",
        "wait",
    )

    def __init__(self, config: TransportConfig, initial_psn: int = 0) -> None:
        self.limit = config.initial_window
        # The limit as an ACK's or a CREDIT's credit field carries it (the connection's PSNs start at
        # ``initial_psn``): nearly every ACK repeats it, and is recognised without mapping its field.
        self._initial_psn = initial_psn
        self.credit_field = (initial_psn + self.limit) & PSN_MASK
        self.reported = 0  # the highest demand sent in a REQUEST
        self.request_due = False  # a REQUEST must go even though the demand has not grown (timeout)
        self.stalled_since: float | None = None  # out of credit with data and nothing in flight, since
        self._base_wait = credit_timeout(config)
        self._max_wait = max(config.rto_max, self._base_wait)
        self.wait = self._base_wait
        self.credits_received = 0  # CREDIT packets and ACKs that moved the limit
        self.requests_sent = 0
        self._window = receiver_window(config)  # the most a receiver lets be outstanding (see the rules above)

    def on_credit(self, wire_limit: int, now: float, sent: int = 0) -> None:
        """A CREDIT packet or an ACK's credit field: the cumulative limit, mapped near our own.
        ``sent``: one past the highest PSN (seq) sent, which bounds what the receiver can have granted."""
        self.credits_received += 1
        old = self.limit
        # psn_diff(wire_limit, old), inlined: this runs for every ACK.
        limit = old + ((wire_limit - old + _PSN_HALF) & PSN_MASK) - _PSN_HALF
        cap = sent + self._window
        if limit > cap:
            limit = cap
        if limit > old:
            self.limit = limit
            self.credit_field = (self._initial_psn + limit) & PSN_MASK
            self.stalled_since = None
            self.wait = self._base_wait

    def need_request(self, demand: int) -> bool:
        """Whether a REQUEST for ``demand`` (one past the last PSN queued) must go now."""
        return self.request_due or (demand > self.reported and demand > self.limit)

    def sent_request(self, demand: int) -> None:
        self.reported = demand if demand > self.reported else self.reported
        self.request_due = False
        self.requests_sent += 1

    def note_stall(self, stalled: bool, now: float) -> None:
        """After each send: whether the sender is out of credit with data and nothing in flight."""
        if not stalled:
            self.stalled_since = None
        elif self.stalled_since is None:
            self.stalled_since = now

    def timer(self) -> float | None:
        return None if self.stalled_since is None else self.stalled_since + self.wait

    def on_timer(self, now: float) -> None:
        if self.stalled_since is not None and now >= self.stalled_since + self.wait:
            # Nothing answered: the REQUEST or the CREDIT was lost. Ask again, waiting longer each time.
            self.request_due = True
            self.stalled_since = now
            self.wait = min(self.wait * 2, self._max_wait)


class CreditReceiver:
    """A connection's receiving side under credit: what it granted, what the sender wants, what it
    has seen used. The scheduler it belongs to grants; ``dirty`` says a CREDIT should go."""

    __slots__ = (
        "_counted",
        "_initial_psn",
        "_top",
        "_unscheduled",
        "active",
        "credit_field",
        "demand",
        "dirty",
        "dormant",
        "ev",
        "granted",
        "grants",
        "last_data",
        "owner",
        "proven",
        "queued",
        "scheduler",
        "used",
        "written_off",
    )

    def __init__(self, config: TransportConfig, scheduler: CreditScheduler, initial_psn: int = 0) -> None:
        self.granted = config.initial_window  # the sender's unscheduled window is credit granted in advance
        # ``granted`` as the credit field of each ACK and CREDIT carries it (the connection's PSNs start at
        # ``initial_psn``): worked out in _grant(), where it moves, not for every ACK.
        self._initial_psn = initial_psn
        self.credit_field = (initial_psn + self.granted) & PSN_MASK
        self.demand = 0  # one past the highest PSN the sender has shown it wants to send
        self.used = 0  # one past the highest PSN received
        self.last_data = 0.0
        self.ev = 0  # EV of the latest DATA packet: where CREDIT goes
        self.dirty = False
        self.active = False  # seen any DATA or REQUEST: only then does it count toward the window
        # Proof and dormancy (the rules above): PSNs from here on needed a grant.
        self._unscheduled = config.initial_window
        self.proven = False
        self.dormant = False  # unproven and its credit written off: wants nothing until DATA comes
        self.queued = False  # in the scheduler's queue of connections wanting credit
        self._counted = 0  # this connection's share of the scheduler's outstanding total
        # min(granted, demand), what that share counts up to, so that a packet need not work it out: the
        # scheduler sets it whenever either moves (changed() follows every new demand, _grant() moves granted).
        self._top = 0
        self.grants = 0
        self.written_off = 0
        self.owner: Any = None  # whatever the driver holding the connection wants back from handle_timer()
        self.scheduler = scheduler
        scheduler.attach(self)

    @property
    def want(self) -> int:
        return self.demand - self.granted

    def outstanding(self) -> int:
        top = self.granted if self.granted < self.demand else self.demand
        return top - self.used if top > self.used else 0

    def _update(self, now: float) -> None:
        self.active = True
        self.scheduler.changed(self, now)

    def on_data(self, seq: int, msg_end: int, ev: int, now: float, short: float = 0.0,
                complete: bool = False) -> None:
        """An accepted DATA packet of PSN ``seq`` whose message ends before ``msg_end``; ``short``: the
        share of a full-size packet's wire time it did not use (a message's last fragment); ``complete``:
        it completed its message."""
        sched = self.scheduler
        if short > 0.0:
            sched.refund(short)
        self.last_data = now
        self.ev = ev
        demand = self.demand
        counted = self._counted
        woke = False
        if not self.proven:
            if seq >= self._unscheduled or complete:
                self.proven = True
            if self.dormant:
                self.dormant = False
                woke = True  # wants credit again: the scheduler recounts
        if msg_end > demand or not counted or woke:
            # New demand (the share may grow, the connection come to want credit), or none of this
            # connection's credit outstanding (the scheduler may be idle): the scheduler recounts.
            self.active = True
            if seq >= self.used:
                self.used = seq + 1
            if msg_end > demand:
                self.demand = msg_end
            sched.changed(self, now)
            return
        # Nearly every packet only uses credit, and this runs for each: sched.changed() less what cannot
        # happen then. The connection is active and the scheduler not idle (this share is outstanding).
        # The demand did not move and the limit moved only in _grant(), which added what it granted to
        # ``_counted``, so the share cannot have grown: no write-off check to start, and a connection
        # that wants credit is still queued.
        used = self.used
        if seq >= used:
            used = self.used = seq + 1
        top = self._top
        share = top - used if top > used else 0
        self._counted = share
        outstanding = sched.outstanding + share - counted
        sched.outstanding = outstanding
        if outstanding < sched._clock_below and sched._wanting:
            sched._clock(now)

    def on_request(self, wire_limit: int, now: float) -> None:
        demand = self.demand + psn_diff(wire_limit, self.demand & PSN_MASK)
        if demand > self.demand:
            self.demand = demand
        self.dirty = True  # answer with the current limit: the sender may have missed it
        if not self.dormant:  # a dormant connection wants nothing until DATA comes (the rules above)
            self._update(now)

    def detach(self) -> None:
        self.scheduler.detach(self)


class CreditScheduler:
    """Grants credit to the connections of one receiving endpoint, round robin, at its link rate, within
    one receiver window (the rules at the top of this module). Sans-I/O: its owner asks ``get_timer()``
    and calls ``handle_timer(now)`` when due, which returns the connections it wrote to (their driver
    must let them send)."""

    # Every DATA packet reads and writes a few of these: slots keep them in the object itself, not in a
    # values array of their own, one cache line fewer to fetch.
    __slots__ = (
        "_batch", "_burst", "_clock_below", "_last", "_members", "_next_check", "_tokens", "_touched", "_wanting",
        "grants", "keep_touched", "outstanding", "quantum", "rate_pps", "timeout", "window", "write_offs",
    )

    def __init__(self, rate_pps: float, window: int, quantum: float, timeout: float) -> None:
        self.rate_pps = rate_pps if rate_pps > 0 else 0.0
        self.window = max(1, window)
        self.quantum = quantum
        self.timeout = timeout
        self.outstanding = 0
        self._members: set[CreditReceiver] = set()
        self._wanting: deque[CreditReceiver] = deque()
        # Tokens (packets) bank at the rate up to one round's worth, so a late wake-up does not lose rate.
        self._burst = self.rate_pps * quantum + 1.0
        # Arrivals grant once this many PSNs are due (half a round, or a quarter of the window unpaced),
        # not one at a time: each grant costs the receiver a call, and its ACK carries them all alike.
        self._batch = max(1, math.ceil(self.rate_pps * quantum / 2) if self.rate_pps else self.window // 4)
        # Unpaced, only the window bounds the grants: the bank is bottomless, and stays so.
        self._tokens = 0.0 if self.rate_pps else math.inf
        # An arrival looks at the bank while the outstanding credit is below this: paced, while there is
        # room at all (the bank refills as it is looked at); unpaced, once a batch fits in the window.
        self._clock_below = self.window if self.rate_pps else self.window - self._batch + 1
        self._last = 0.0
        self._next_check: float | None = None  # when outstanding credit is next looked at for write-off
        self._touched: list[CreditReceiver] = []
        # Whether take_touched() is read: an owner that flushes only the connections it is told of (the
        # srd receiver) sets it; drivers that flush every connection anyway leave it off.
        self.keep_touched = False
        self.grants = 0
        self.write_offs = 0

    @classmethod
    def from_config(cls, config: TransportConfig) -> CreditScheduler:
        rate = config.credit_rate_bps / (8 * config.wire_packet_bytes)
        return cls(rate, receiver_window(config), config.pacing_quantum, credit_timeout(config))

    def attach(self, rx: CreditReceiver) -> None:
        self._members.add(rx)

    def detach(self, rx: CreditReceiver) -> None:
        self._members.discard(rx)
        self.outstanding -= rx._counted
        rx._counted = 0
        if rx.queued:
            rx.queued = False
            self._wanting.remove(rx)

    def changed(self, rx: CreditReceiver, now: float) -> None:
        """``rx``'s demand or use moved: recount its share and whether it wants credit (CreditReceiver.on_data
        has its own copy for a packet that only uses credit)."""
        if not self.outstanding and not self._wanting:
            self._wake(now)
        # rx.outstanding(), inlined.
        granted, demand, used = rx.granted, rx.demand, rx.used
        top = rx._top = granted if granted < demand else demand
        share = top - used if top > used else 0
        counted = rx._counted
        self.outstanding += share - counted
        rx._counted = share
        # While any credit is outstanding a write-off check is due (here and _grant() see to it), so only
        # a share that grew can need one started.
        if share > counted and self._next_check is None:
            self._next_check = now + self.timeout / 2
        if demand > granted and not rx.queued and not rx.dormant:
            rx.queued = True
            self._wanting.append(rx)
        if self._wanting and self.outstanding < self._clock_below:
            self._clock(now)

    def _wake(self, now: float) -> None:
        """Idle until now: the first round waits a quantum from here with an empty bank, so that the
        senders of an incast that start together are all known before credit flows."""
        if self.rate_pps:
            self._tokens = 0.0
        self._last = now

    def _clock(self, now: float) -> None:
        """Arrivals clock the grants: what the rate allows by now goes at once, so the ACK this packet is
        about to get carries it, and no timer has to wake the receiver for it. Called while some connection
        wants credit and the outstanding credit is below ``_clock_below``; it grants once both the tokens and
        the room reach a batch."""
        if self.rate_pps:
            self._refill(now)
            if self._tokens < self._batch or self.window - self.outstanding < self._batch:
                return
        self._grant(now, self._touched if self.keep_touched else None)

    def refund(self, packets: float) -> None:
        """Give back to the bank the part of a grant a short packet left unused (the rules above)."""
        if self.rate_pps:
            t = self._tokens + packets
            self._tokens = t if t < self._burst else self._burst

    def take_touched(self) -> list[CreditReceiver]:
        """The connections granted to by arrivals since the last call (whose CREDIT their driver must let
        go); handle_timer() returns its own."""
        out, self._touched = self._touched, []
        return out

    def _can_grant(self) -> bool:
        return bool(self._wanting) and self.outstanding < self.window

    def get_timer(self) -> float | None:
        t = self._next_check
        if self._can_grant():
            if self.rate_pps and self._tokens < 1.0:
                due = self._last + max(self.quantum, (1.0 - self._tokens) / self.rate_pps)
            else:
                due = self._last
            if t is None or due < t:
                t = due
        return t

    def handle_timer(self, now: float) -> list[CreditReceiver]:
        """Grant what is due by ``now`` and write off stale credit; the connections given a CREDIT."""
        touched: list[CreditReceiver] = []
        if self._next_check is not None and now >= self._next_check:
            self._write_off(now, touched)
        if not self._can_grant():
            if self.rate_pps:
                self._refill(now)
            return touched
        if self.rate_pps:
            if now < self._last + self.quantum and self._tokens < 1.0:
                return touched
            self._refill(now)
        else:
            self._last = now
        self._grant(now, touched)
        return touched

    def _grant(self, now: float, touched: list[CreditReceiver] | None) -> None:
        """Round robin while tokens and the window allow: each round gives every connection wanting
        credit an equal part of what is left to grant (at least one PSN, at most what it still wants),
        and what a round leaves, it shares again."""
        wanting = self._wanting
        room = self.window - self.outstanding
        tokens = self._tokens
        n = room if room < tokens else int(tokens)
        turns = 0  # left in this round
        each = 0
        while n > 0 and wanting:
            if not turns:
                turns = len(wanting)
                each = n // turns or 1
            turns -= 1
            rx = wanting.popleft()
            want = rx.demand - rx.granted
            part = each if each < want else want
            if part > n:
                part = n
            # Below its demand every PSN granted is one more outstanding.
            granted = rx.granted = rx.granted + part
            rx._top = granted if granted < rx.demand else rx.demand
            rx.credit_field = (rx._initial_psn + granted) & PSN_MASK
            rx.grants += part
            rx._counted += part
            self.grants += part
            self.outstanding += part
            self._tokens -= part
            n -= part
            if not rx.dirty:
                rx.dirty = True
                if touched is not None:
                    touched.append(rx)
            if rx.demand > rx.granted:
                wanting.append(rx)
            else:
                rx.queued = False
        if self._next_check is None and self.outstanding:
            self._next_check = now + self.timeout / 2

    def _refill(self, now: float) -> None:
        if now > self._last:
            self._tokens = min(self._burst, self._tokens + (now - self._last) * self.rate_pps)
            self._last = now

    def _write_off(self, now: float, touched: list[CreditReceiver]) -> None:
        """Credit outstanding without a DATA packet for the timeout was lost (or its data was): take it
        out of the window and send the connection its limit again."""
        pending = False
        for rx in self._members:
            if not rx._counted:
                continue
            if now - rx.last_data >= self.timeout:
                top = rx.granted if rx.granted < rx.demand else rx.demand
                rx.used = max(rx.used, top)
                self.outstanding -= rx._counted
                rx._counted = 0
                rx.written_off += 1
                self.write_offs += 1
                if not rx.proven:
                    # It never used credit: no more until it sends DATA (the rules above).
                    rx.dormant = True
                    if rx.queued:
                        rx.queued = False
                        self._wanting.remove(rx)
                if not rx.dirty:
                    rx.dirty = True
                    touched.append(rx)
            else:
                pending = True
        self._next_check = now + self.timeout / 2 if pending else None

    def state(self) -> dict:
        return {
            "rate_pps": self.rate_pps, "window": self.window, "outstanding": self.outstanding,
            "wanting": len(self._wanting), "grants": self.grants, "write_offs": self.write_offs,
        }
