"""Link shaping and impairments on one interface: HTB for the rate, netem or nftables for delay and loss,
RED for ECN marking (where the kernel has sch_red: the VM's does).

A shaped interface has two traffic classes under its rate, as a fabric's switches and NICs do: control
(datagrams whose DSCP is CONTROL_DSCP: the transport's ACKs and credit) goes first, then
everything else. An ACK that waited behind a host's own outgoing data (tens of milliseconds of queue at
these rates) held its flow's window that long: in a permutation, where every host sends and receives,
sprayed goodput stayed near 0.92 of the wire with the delay controller, and 0.97-0.99 with control
first (transport/sim, 16 hosts). Control is small (one ACK per up to eight data packets), so it is
guaranteed a tenth of the rate and may borrow the rest; data borrows whatever control leaves.

Every command is built here as an argument list and run through a `runner` (the root namespace or a
Mininet host's shell), so the same code serves switch-side and host-side interfaces. Which method
applied each impairment is reported, because results depend on it.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from emulator.errors import EmulatorError
from emulator.state import NFT_PREFIX
from transport.core.contract import CONTROL_DSCP

log = logging.getLogger(__name__)

# runner(argv) -> (exit code, output)
Runner = Callable[[list[str]], tuple[int, str]]

HTB_HANDLE = "5:"
HTB_CLASS = "5:1"  # the link's rate, shared by its two classes
DATA_CLASS = "5:2"  # everything but control; the HTB default
CONTROL_CLASS = "5:3"  # datagrams marked CONTROL_DSCP, served first
LEAF_HANDLE = "10:"
CONTROL_LEAF_HANDLE = "30:"
# With ECN marking, RED sits under the data class and the netem or pfifo leaf under RED's one class.
RED_HANDLE = "10:"
RED_CLASS = "10:1"
RED_LEAF_HANDLE = "20:"
# The share of a link's rate guaranteed to control; it may borrow up to the whole rate.
CONTROL_SHARE = 0.1
# Loss granularity: nftables draws from numgen mod LOSS_SCALE, so 0.01 % steps.
LOSS_SCALE = 10000


@dataclass(frozen=True)
class Impairment:
    rate_mbps: float | None = None
    delay_ms: float = 0.0
    loss_pct: float = 0.0
    queue_packets: int | None = None
    ecn: bool = False


def red_ecn_args(rate_mbps: float | None) -> list[str]:
    """RED that marks ECN-capable packets CE instead of dropping them, sized to the link's rate: marking
    starts at about 5 ms of queue, is certain from 15 ms, and the queue is capped at 120 ms."""
    rate = rate_mbps or 1000.0
    min_bytes = max(15000, int(rate * 125 * 5))  # 125 bytes per ms per Mb/s
    max_bytes = 3 * min_bytes
    avpkt = 1000
    burst = (2 * min_bytes + max_bytes) // (3 * avpkt) + 1
    return ["red", "limit", str(8 * max_bytes), "min", str(min_bytes), "max", str(max_bytes), "avpkt", str(avpkt),
            "burst", str(burst), "bandwidth", f"{rate}mbit", "probability", "0.1", "ecn"]


def nft_table_name(intf: str) -> str:
    return NFT_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", intf)


# The fewest bytes a shaped link's token bucket holds: two standard frames.
MIN_BURST_BYTES = 3000


def burst_bytes(rate_mbps: float) -> int:
    """The token bucket of a link shaped to `rate_mbps`: one millisecond's worth of bytes, at least two
    standard frames. A real link never sends faster than its rate; what the bucket holds leaves at the
    veth's speed after an idle spell, so a deep bucket (15 kB was 10 frames, 20 ms at 6 Mb/s) turned a
    paced flow into bursts. HTB sends a frame larger than the bucket all the same (its tokens go
    negative and refill), so jumbo frames keep their rate."""
    return max(MIN_BURST_BYTES, int(rate_mbps * 125))  # 125 bytes per ms per Mb/s


def _htb_classes(verb: str, intf: str, rate_mbps: float) -> list[list[str]]:
    """`tc class add|change` of the link's HTB classes: the link's rate and token bucket, and under it
    control (CONTROL_DSCP, prio 0) and data (prio 1), each guaranteed its share and allowed the whole rate."""
    burst = str(burst_bytes(rate_mbps))

    def cls(parent: str, classid: str, rate: float, *extra: str) -> list[str]:
        return ["tc", "class", verb, "dev", intf, "parent", parent, "classid", classid, "htb",
                "rate", f"{rate:.6g}mbit", "ceil", f"{rate_mbps:.6g}mbit", "burst", burst, "cburst", burst, *extra]

    control = rate_mbps * CONTROL_SHARE
    return [cls(HTB_HANDLE, HTB_CLASS, rate_mbps),
            cls(HTB_CLASS, CONTROL_CLASS, control, "prio", "0"),
            cls(HTB_CLASS, DATA_CLASS, rate_mbps - control, "prio", "1")]


def rate_change_commands(intf: str, rate_mbps: float) -> list[list[str]]:
    return _htb_classes("change", intf, rate_mbps)


def control_filter_command(intf: str) -> list[str]:
    """The u32 filter that sends datagrams marked CONTROL_DSCP to the control class."""
    return ["tc", "filter", "add", "dev", intf, "parent", HTB_HANDLE, "protocol", "ip", "prio", "1", "u32",
            "match", "ip", "tos", hex(CONTROL_DSCP << 2), "0xfc", "flowid", CONTROL_CLASS]


def shape_commands(intf: str, imp: Impairment, *, netem: bool) -> list[list[str]]:
    """tc commands that give `intf` its rate, queue and (with netem) delay and loss on egress."""
    cmds: list[list[str]] = [["tc", "qdisc", "del", "dev", intf, "root"]]
    parent = "root"
    if imp.rate_mbps:
        cmds.append(["tc", "qdisc", "add", "dev", intf, "root", "handle", HTB_HANDLE, "htb", "default",
                     DATA_CLASS.split(":")[1]])
        cmds.extend(_htb_classes("add", intf, imp.rate_mbps))
        cmds.append(control_filter_command(intf))
        parent = f"parent {DATA_CLASS}"
    wants_netem = imp.delay_ms > 0 or (imp.loss_pct > 0 and netem)
    if wants_netem:
        if not netem:
            raise EmulatorError(
                f"{intf}: a delay of {imp.delay_ms} ms needs netem (sch_netem), which this kernel lacks; "
                "remove the delay (delay=0) or run it in the VM, whose kernel has netem (make vm-shell)"
            )
        leaf = ["netem"]
        if imp.delay_ms > 0:
            leaf += ["delay", f"{imp.delay_ms}ms"]
        if imp.loss_pct > 0:
            leaf += ["loss", f"{imp.loss_pct}%"]
        leaf += ["limit", str(imp.queue_packets or 1000)]
    elif imp.queue_packets:
        leaf = ["pfifo", "limit", str(imp.queue_packets)]
    else:
        leaf = []
    where = parent.split() if parent != "root" else ["root"]
    if imp.ecn:
        cmds.append(["tc", "qdisc", "add", "dev", intf, *where, "handle", RED_HANDLE, *red_ecn_args(imp.rate_mbps)])
        if leaf:
            cmds.append(["tc", "qdisc", "add", "dev", intf, "parent", RED_CLASS, "handle", RED_LEAF_HANDLE, *leaf])
    elif leaf:
        cmds.append(["tc", "qdisc", "add", "dev", intf, *where, "handle", LEAF_HANDLE, *leaf])
    if imp.rate_mbps and leaf:
        # Control meets the link's delay and loss too (netem), and a queue of its own length.
        cmds.append(["tc", "qdisc", "add", "dev", intf, "parent", CONTROL_CLASS, "handle", CONTROL_LEAF_HANDLE,
                     *leaf])
    return cmds


def initial_shape_commands(intf: str, imp: Impairment, *, netem: bool) -> list[list[str]]:
    """`shape_commands` for an interface that has never been shaped: nothing to delete first."""
    return [c for c in shape_commands(intf, imp, netem=netem) if c[2] != "del"]


def tc_batch(commands: list[list[str]]) -> str:
    """`tc -batch` input for tc commands (one line each, without the leading `tc`)."""
    lines = []
    for cmd in commands:
        if cmd[0] != "tc":
            raise ValueError(f"not a tc command: {cmd}")
        lines.append(shlex.join(cmd[1:]))
    return "\n".join(lines) + "\n"


def nft_loss_ruleset(intf: str, loss_pct: float) -> str:
    """An nftables netdev table dropping loss_pct % of IPv4 packets leaving intf."""
    threshold = round(loss_pct / 100 * LOSS_SCALE)
    # numgen's values are 0..LOSS_SCALE-1, and nft refuses a bound above them: at 100 % every packet goes.
    chance = f"numgen random mod {LOSS_SCALE} lt {threshold} " if threshold < LOSS_SCALE else ""
    return (
        f'table netdev {nft_table_name(intf)} {{ chain egress {{ type filter hook egress device "{intf}" '
        f"priority 0; meta protocol ip {chance}counter drop ; }} ; }}"
    )


class InterfaceShaper:
    """Applies and changes impairments on interfaces; knows whether to use netem or nftables."""

    def __init__(self, *, netem: bool, nft_egress: bool, red_ecn: bool = False) -> None:
        self.netem = netem
        self.nft_egress = nft_egress
        self.red_ecn = red_ecn

    @property
    def loss_method(self) -> str | None:
        return "netem" if self.netem else ("nftables" if self.nft_egress else None)

    def apply(self, intf: str, imp: Impairment, run: Runner) -> list[str]:
        """Configure intf; returns the nftables tables created (the caller records them)."""
        if imp.ecn and not self.red_ecn:
            raise EmulatorError(
                f"{intf}: ECN marking needs RED (sch_red), which this kernel lacks; "
                "run it in the VM, whose kernel has RED (make vm-shell)"
            )
        for cmd in shape_commands(intf, imp, netem=self.netem):
            code, out = run(cmd)
            # Deleting a root qdisc that is not there fails harmlessly.
            if code != 0 and cmd[2] != "del":
                raise EmulatorError(f"{intf}: '{shlex.join(cmd)}' failed: {out.strip()}")
        return self.set_loss(intf, imp.loss_pct, run) if not self.netem else []

    def set_loss(self, intf: str, loss_pct: float, run: Runner, imp: Impairment | None = None) -> list[str]:
        """Change random loss on intf's egress at runtime. 100 % is allowed here (a topology's links stay
        below it): a link that drops everything while its ports stay up, the silent failure of lab 4."""
        if not 0 <= loss_pct <= 100:
            raise EmulatorError(f"loss {loss_pct} % is out of range; use 0 <= loss <= 100")
        if self.netem:
            imp = Impairment(
                rate_mbps=imp.rate_mbps if imp else None,
                delay_ms=imp.delay_ms if imp else 0.0,
                loss_pct=loss_pct,
                queue_packets=imp.queue_packets if imp else None,
                ecn=imp.ecn if imp else False,
            )
            self.apply(intf, imp, run)
            return []
        table = nft_table_name(intf)
        run(["nft", "delete", "table", "netdev", table])
        if loss_pct <= 0:
            return []
        if not self.nft_egress:
            raise EmulatorError(
                f"{intf}: random loss needs netem or nftables' netdev egress hook; this kernel has neither"
            )
        code, out = run(["nft", nft_loss_ruleset(intf, loss_pct)])
        if code != 0:
            raise EmulatorError(f"{intf}: nftables loss rule failed: {out.strip()}")
        return [table]
