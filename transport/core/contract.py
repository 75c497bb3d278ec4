"""The fabric contract: what the fabric (emulator and controller) and the transport agree on, in one place.

* The routing modes the controller installs (`ROUTING_MODES`).
* Entropy: a packet's entropy value (EV) rides in the low `EV_BITS` bits of its UDP source port. A
  sender uses `NUM_EVS` EVs from a base port that is a multiple of `PORT_ALIGNMENT`, so that
  `source port & (NUM_EVS - 1) == EV`; in `spray` mode the controller maps those bits to a next hop
  (and hashes them with the rest of the 5-tuple in `ecmp`).
* The default ports: the receivers' `DEFAULT_PORT`, the senders' `DEFAULT_BASE_PORT`. A reply from
  `DEFAULT_PORT` (an ACK) goes to the EV port its data came from, so its destination port's low bits
  are that EV; in `spray` mode the controller sprays such replies by them, back along the data's path.
* Traffic classes: a socket that sends only the transport's control datagrams (ACKs, credit; a
  receiver's) marks them `CONTROL_DSCP`, and every shaped link serves that class before data
  (emulator/shaping.py), as fabrics give transport control a priority of its own.

The transport still knows paths only as EVs; nothing here names a topology. This module imports nothing,
so the transport, the emulator and the controller (a process of its own) all import it.
"""

from __future__ import annotations

ROUTING_MODES = ("ecmp", "spray", "single", "local", "via-tor")

EV_BITS = 4
NUM_EVS = 1 << EV_BITS  # 16 EVs: one flow covers every path of a fabric with up to 16 of them
PORT_ALIGNMENT = NUM_EVS  # base ports are multiples of this, so the low bits of a source port are the EV
UDP_PORT_BITS = 16

CONTROL_DSCP = 46  # Expedited Forwarding
CONTROL_TOS = CONTROL_DSCP << 2  # the IP TOS byte of a control datagram (ECN bits clear: not ECN-capable)

DEFAULT_PORT = 7471  # where a receiver listens
DEFAULT_BASE_PORT = 40000  # a sender's source port of EV 0; a multiple of PORT_ALIGNMENT


def source_port(base_port: int, ev: int) -> int:
    """The UDP source port a sender bound at `base_port` sends EV `ev` from."""
    return base_port + ev


def ev_of_port(port: int) -> int:
    """The EV the fabric reads from a UDP source port (with an aligned base port: the sender's EV)."""
    return port & (NUM_EVS - 1)


def base_port_problem(base_port: int, num_evs: int) -> str | None:
    """Why `num_evs` source ports from `base_port` do not fit the UDP port range, or None when they do."""
    if 1 <= base_port <= (1 << UDP_PORT_BITS) - num_evs:
        return None
    return (f"base port {base_port} + {num_evs} EVs does not fit in 1-{(1 << UDP_PORT_BITS) - 1}; "
            f"use a base port <= {(1 << UDP_PORT_BITS) - num_evs}")


def is_aligned(base_port: int) -> bool:
    """Whether the low EV_BITS bits of every source port from `base_port` equal its EV."""
    return base_port % PORT_ALIGNMENT == 0
