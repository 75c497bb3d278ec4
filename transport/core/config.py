"""Configuration of one transport connection, with validation that names the field and the fix."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass

from transport.core.congestion import CONTROLLERS
from transport.core.contract import NUM_EVS
from transport.core.headers import UDP_FRAME_OVERHEAD
from transport.core.paths import POLICIES, is_plugin
from transport.core.wire import DATA_HEADER_LEN, MAX_PAYLOAD

DELIVERY_MODES = ("unordered", "ordered")
RECOVERY_MODES = ("selective", "gobackn")
# The names registered when the transport is imported (transport.core.paths.POLICIES,
# transport.core.congestion.CONTROLLERS); validation asks the registries themselves, so a controller or
# policy registered later is as valid as the built-ins.
PATH_POLICIES = POLICIES.names()
CC_ALGORITHMS = CONTROLLERS.names()
# The initial (and, with credit, unscheduled) window never goes below this many packets: one being
# serialised while the next waits keeps a link busy across a store-and-forward hop.
MIN_INITIAL_WINDOW = 2
# A coalesced ACK is held at most this share of the path's base RTT when that is longer than the
# endpoint's own hold (path_ack_delay): four ACKs a round trip keep the sender's clock, as QUIC stacks'
# ACK decimation does (a quarter of the minimum RTT), while a fixed hold on a slow path in jumbo frames
# (a 72 ms frame at 1 Mb/s) sends one ACK for every DATA packet, and every ACK costs the emulated
# switches as much as a DATA packet.
ACK_HOLD_RTT_SHARE = 0.25
# ... and never longer than this, whatever the path (TransportConfig.validate's bound on ack_delay).
ACK_HOLD_MAX = 1.0


class ConfigError(ValueError):
    """A TransportConfig field has a value the transport cannot run with."""


def env_positive(name: str, default: float, unit: str) -> float:
    """A positive number from the environment variable `name` (`default` when unset); a ValueError
    saying so, in one line, when it is anything else."""
    raw = os.environ.get(name, "")
    try:
        value = float(raw) if raw else default
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{name}={raw!r} is not a positive number of {unit}")
    return value


def rtt_guess(initial_rtt: float, base_rtt: float) -> float:
    """The RTT assumed before the first sample (TransportConfig.rtt_guess), from a configuration's
    two fields: the fabric's base RTT when known and longer than initial_rtt."""
    return base_rtt if base_rtt > initial_rtt else initial_rtt


def path_ack_delay(ack_delay: float, base_rtt: float) -> float:
    """The ACK hold for a path of `base_rtt` seconds (0: unknown) given an endpoint's own `ack_delay`:
    a quarter of the base RTT where that is longer (ACK_HOLD_RTT_SHARE, at most ACK_HOLD_MAX), else
    ack_delay. 0 (an ACK per packet) stays 0. Both ends derive it from the same base RTT, so the sender
    believes the holds its receiver reports (Recovery's max_ack_delay follows ack_delay)."""
    if ack_delay <= 0:
        return 0.0
    return max(ack_delay, min(ACK_HOLD_MAX, base_rtt * ACK_HOLD_RTT_SHARE))


@dataclass
class TransportConfig:
    mtu: int = 1400  # max UDP payload bytes per datagram (header included)
    delivery: str = "unordered"  # "unordered" (SRD/RUD) | "ordered" (ROD, head-of-line blocking)
    recovery: str = "selective"  # "selective" | "gobackn"
    path_policy: str = "spray"  # a name in transport.core.paths.POLICIES, or "/abs/FILE.py:ClassName" (a plug-in)
    num_evs: int = NUM_EVS
    cc: str = "delay"  # a name in transport.core.congestion.CONTROLLERS (see CONTROLLERS.help())
    # Packets: the fixed window, and the initial window of the other controllers while the link rate or
    # the base RTT is unknown (see initial_window).
    window: int = 64
    max_window: int = 1024
    target_delay: float = 0.002  # seconds of queueing delay the delay CC aims for (a floor, see below)
    # ... but at least this many packets' worth at the connection's own rate (srtt / cwnd each), so
    # that the target covers a few packet times on slow links too (0 = target_delay only).
    target_packets: float = 16.0
    ack_delay: float = 0.0  # 0 = ACK every packet; else coalesce ACKs for at most this long
    ack_batch: int = 16  # with ack_delay > 0, ACK at once when this many packets are unacknowledged
    # With ack_delay > 0, also ACK at once the packet that completes a message, so that holding ACKs
    # for a batch does not add the hold to every message's completion time.
    ack_on_message: bool = False
    # The longest ACK hold a peer's report is believed up to (RFC 9002's max_ack_delay; our own
    # ack_delay if that is longer): loss detection and the RTO wait for at most this much more.
    max_ack_delay: float = 0.025
    rto_min: float = 0.005  # seconds (a floor suited to an emulator, far below TCP's 200 ms)
    rto_max: float = 1.0
    initial_rtt: float = 0.005  # RTT assumed until the first sample
    # Loss detection is time-based (RACK-like, per EV): a packet overtaken by a later-sent,
    # acknowledged packet is lost once it is older than its EV's smoothed RTT times
    # (1 + reorder_window) plus twice that EV's RTT variation.
    reorder_window: float = 0.25
    max_reassembly_bytes: int = 8 * 2**20
    max_reassembly_messages: int = 1024
    # A receiver serving many senders (`srd recv`) holds at most this many connections, at most
    # max_connections_per_source of them from one source address, and forgets one silent for
    # idle_timeout seconds once it owes nothing and holds nothing undelivered (0 = never).
    max_connections: int = 1024
    max_connections_per_source: int = 256
    idle_timeout: float = 60.0
    # What the connection knows of its fabric (0 = unknown): the rate of its host's link in bits/s and
    # the fabric's unloaded RTT for a full-size packet. Together they size the initial window to one
    # bandwidth-delay product (initial_window); credit grants at receiver_rate_bps (0 = link_rate_bps).
    link_rate_bps: float = 0.0
    base_rtt: float = 0.0
    receiver_rate_bps: float = 0.0
    pacing: bool = True
    # Seconds: each wake-up sends what pacing allows within this horizon (and always at least
    # the next packet interval), so a slow connection sends 2+ packets per wake-up, not one.
    pacing_quantum: float = 0.001
    # ... and at least this many packet intervals: sized to the peer's ACK batch, a wake-up (an ACK's
    # or the pacer's) sends what the next ACK will answer, so sends and ACKs share wake-ups.
    pacing_packets: int = 1

    @property
    def max_payload(self) -> int:
        """Payload bytes that fit one datagram."""
        return min(self.mtu - DATA_HEADER_LEN, MAX_PAYLOAD)

    @property
    def rtt_guess(self) -> float:
        """The RTT assumed before the first sample: the fabric's base RTT when it is known and longer
        than initial_rtt. A 5 ms guess timed every flow out at once on slow jumbo-frame links, where one
        frame takes 18 ms a hop at 4 Mb/s."""
        return rtt_guess(self.initial_rtt, self.base_rtt)

    @property
    def wire_packet_bytes(self) -> int:
        """Bytes a full-size DATA packet takes on a link (Ethernet, IPv4 and UDP headers included)."""
        return self.mtu + UDP_FRAME_OVERHEAD

    @property
    def bdp_packets(self) -> float | None:
        """One bandwidth-delay product in full-size packets, link_rate_bps x base_rtt / packet bits;
        None while either is unknown."""
        if self.link_rate_bps > 0 and self.base_rtt > 0:
            return self.link_rate_bps * self.base_rtt / (8 * self.wire_packet_bytes)
        return None

    @property
    def initial_window(self) -> int:
        """Packets a connection may send before its first feedback: one BDP rounded up (bdp_packets),
        at least MIN_INITIAL_WINDOW and at most max_window, when the link rate and the base RTT are
        known; ``window`` otherwise. A fixed 64 packets overfilled slow links: at 1 Mb/s with a 9000-byte
        MTU one BDP is a few packets, and 64 of them queue for seconds."""
        bdp = self.bdp_packets
        if bdp is None:
            return self.window
        return max(MIN_INITIAL_WINDOW, min(self.max_window, math.ceil(bdp)))

    @property
    def credit_rate_bps(self) -> float:
        """The rate at which a receiver grants credit: receiver_rate_bps, else link_rate_bps (0 = no pacing,
        credit then only bounded by the receiver's window of one BDP)."""
        return self.receiver_rate_bps if self.receiver_rate_bps > 0 else self.link_rate_bps

    def to_dict(self) -> dict:
        return asdict(self)

    def validate(self) -> None:
        """Raise ConfigError naming the first bad field and how to fix it."""

        def bad(field: str, fix: str) -> ConfigError:
            return ConfigError(f"{field}={getattr(self, field)!r}: {fix}")

        if not isinstance(self.mtu, int) or self.mtu < DATA_HEADER_LEN + 1:
            raise bad("mtu", f"use an integer of at least {DATA_HEADER_LEN + 1} (header + 1 byte)")
        if self.mtu > 65507:
            raise bad("mtu", "use at most 65507, the largest UDP payload over IPv4")
        if self.delivery not in DELIVERY_MODES:
            raise bad("delivery", f"use one of {', '.join(DELIVERY_MODES)}")
        if self.recovery not in RECOVERY_MODES:
            raise bad("recovery", f"use one of {', '.join(RECOVERY_MODES)}")
        if self.path_policy not in POLICIES and not is_plugin(self.path_policy):
            raise bad("path_policy", f"use one of {', '.join(POLICIES)}, or FILE.py:ClassName")
        if not isinstance(self.num_evs, int) or not 1 <= self.num_evs <= 65536:
            raise bad("num_evs", "use an integer from 1 to 65536 (the EV is 16 bits)")
        if self.cc not in CONTROLLERS:
            raise bad("cc", f"use one of {', '.join(CONTROLLERS)}")
        if not isinstance(self.max_window, int) or not 1 <= self.max_window <= 2**20:
            raise bad("max_window", "use an integer from 1 to 1048576 packets")
        if not isinstance(self.window, int) or not 1 <= self.window <= self.max_window:
            raise bad("window", f"use an integer from 1 to max_window ({self.max_window})")
        for name in ("link_rate_bps", "base_rtt", "receiver_rate_bps"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                raise bad(name, "use 0 (unknown) or a positive number")
        if not self.target_delay > 0:
            raise bad("target_delay", "use a positive number of seconds, e.g. 0.002")
        if not 0 <= self.ack_delay <= 1.0:
            raise bad("ack_delay", "use 0 (ACK every packet) or a delay in seconds up to 1.0")
        if not 0 <= self.max_ack_delay <= 1.0:
            raise bad("max_ack_delay", "use a delay in seconds from 0 to 1.0, e.g. 0.025")
        if not 0 <= self.target_packets <= 1e6:
            raise bad("target_packets", "use a number of packets from 0 (off) upwards, e.g. 16")
        if not isinstance(self.ack_batch, int) or self.ack_batch < 1:
            raise bad("ack_batch", "use a positive integer")
        if not self.rto_min > 0:
            raise bad("rto_min", "use a positive number of seconds, e.g. 0.005")
        if not self.rto_max >= self.rto_min:
            raise bad("rto_max", f"use a value of at least rto_min ({self.rto_min})")
        if not self.initial_rtt > 0:
            raise bad("initial_rtt", "use a positive number of seconds")
        if not 0 <= self.reorder_window <= 10:
            raise bad("reorder_window", "use a fraction of the smoothed RTT from 0 to 10, e.g. 0.25")
        if not isinstance(self.pacing_packets, int) or not 1 <= self.pacing_packets <= 1024:
            raise bad("pacing_packets", "use an integer from 1 (the next packet only) to 1024")
        if not 0 <= self.pacing_quantum <= 1.0:
            raise bad("pacing_quantum", "use seconds from 0 (one packet per wake-up) to 1.0, e.g. 0.001")
        if not isinstance(self.max_reassembly_bytes, int) or self.max_reassembly_bytes < self.max_payload:
            raise bad("max_reassembly_bytes", f"use at least one datagram's payload ({self.max_payload})")
        if not isinstance(self.max_reassembly_messages, int) or self.max_reassembly_messages < 1:
            raise bad("max_reassembly_messages", "use a positive integer")
        if not isinstance(self.max_connections, int) or self.max_connections < 1:
            raise bad("max_connections", "use a positive integer, e.g. 1024")
        if not isinstance(self.max_connections_per_source, int) or self.max_connections_per_source < 1:
            raise bad("max_connections_per_source", "use a positive integer, e.g. 256")
        if not 0 <= self.idle_timeout <= 1e6:
            raise bad("idle_timeout", "use seconds, e.g. 60, or 0 to keep idle connections forever")
