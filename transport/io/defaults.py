"""The endpoints' defaults that a simulated endpoint must share with a real one: how long and how many
packets an ACK is held for, and how many packet intervals a pacer's wake-up covers.

The UDP endpoints coalesce ACKs by default although the protocol core ACKs every packet: in a Python
process each datagram costs a wake-up and a syscall at both ends, and in the emulator every packet
also costs Open vSwitch a wake-up per switch it crosses (`fabriclab bench fidelity`); on slow emulated
links one 100-byte ACK per 1442-byte packet would also take 7 % of the reverse link, which the host's
own data shares. One ACK per 8 packets, or after at most 10 ms: at the demo's 4 Mb/s a packet takes 3 ms, so ACKs
still leave every few packets; the packet completing a message is acknowledged at once. Tried and not
kept: one ACK per 4 packets held up to 100 ms, with senders sending 4 packets' worth per wake-up. It cut
wake-ups 4-5x but not the endpoints' CPU per packet (`fabriclab bench endpoints`: 105 -> 97 µs at 1500
bytes, within the noise), and in the failover experiment it slowed the recovery from a cut (adaptive
0.2 -> 0.4 s, ECMP with reroute 1.3 -> 2.4 s) and left some flows at half their rate: the hold starves
the ACK clock on slow links. Unless an endpoint is given its own hold, a path whose base RTT exceeds
40 ms holds for a quarter of it instead (transport.core.config.path_ack_delay): four ACKs a round
trip, not one ACK per 72 ms jumbo frame.
"""

from __future__ import annotations

ENDPOINT_ACK_DELAY = 0.010
ENDPOINT_ACK_BATCH = 8
ENDPOINT_PACING_PACKETS = 1
