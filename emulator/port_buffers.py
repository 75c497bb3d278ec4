"""Socket buffers of the userspace switches' ports, sized so that the shaped queue is the port's limit.

Userspace Open vSwitch sends every packet a daemon forwards through one AF_PACKET socket of its own
(made at its first send; each port also has a socket of its own for receiving). A packet waiting in a
port's egress qdisc (the shaped queue) stays charged to that socket's send buffer until the link
transmits it, and the buffer is the kernel's default (`net.core.wmem_default`, 212,992 bytes of skb
memory: about 90 standard frames or 13-19 jumbo frames, for all the switch's ports together). Once it
is full the send fails and the packet is dropped where neither tc nor OVS's port counters see it
("error sending Ethernet packet ... Resource temporarily unavailable" in the daemon's log). Measured on
an 8:1 incast at 9000 bytes: the receiver's downlink queue never grew past 19 packets and 214 packets
vanished, while its tc queue allowed 1000.

The sysctl cannot be raised inside a network namespace on these kernels, and raising it for the
machine would outlive the run. Instead each port socket of the run's own daemons is given a larger
buffer directly: `pidfd_getfd` lends this process a duplicate of the daemon's socket, `SO_SNDBUFFORCE`
and `SO_RCVBUFFORCE` on the duplicate set the one socket both descriptors name, and the duplicate is
closed. The sockets end with their ports, so nothing outlives the run.
"""

from __future__ import annotations

import ctypes
import logging
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SO_SNDBUFFORCE = 32
SO_RCVBUFFORCE = 33
# skb memory one frame costs beyond its bytes (headroom, skb_shared_info, the allocator's rounding):
# 212,992 bytes held ~92 frames of 1500 bytes (2,300 each).
FRAME_OVERHEAD = 1024
# A queue of unset depth is the interface's txqueuelen: 1000 packets.
DEFAULT_QUEUE_PACKETS = 1000


@dataclass
class PortSocket:
    fd: int
    ifindex: int


def buffer_bytes(queue_packets: int, mtu: int, ports: int = 1) -> int:
    """Socket buffer that holds `ports` full queues of `queue_packets` frames of `mtu` bytes, with room
    to spare (the kernel charges whole allocations). It is a limit, not an allocation."""
    frame = mtu + 14 + FRAME_OVERHEAD
    return min(1 << 30, max(1 << 20, 2 * ports * queue_packets * frame))


# An LLDP frame (nearest-bridge address, which no bridge forwards): sent once out of one port of each
# switch so that its daemon makes its send socket; the neighbour's table-miss entry drops it.
PRIMING_FRAME = "0180c200000e" + "0200000000fe" + "88cc" + "00" * 46


def priming_command(ofctl_target: str, port: int) -> list[str]:
    """`ovs-ofctl packet-out` of PRIMING_FRAME out of `port` of the switch at `ofctl_target`."""
    return ["ovs-ofctl", "-O", "OpenFlow13", "--timeout=10", "packet-out", ofctl_target,
            f"in_port=controller packet={PRIMING_FRAME} actions=output:{port}"]


def packet_sockets(pid: int) -> list[PortSocket]:
    """The AF_PACKET sockets process `pid` holds, each with the interface it is bound to."""
    by_inode: dict[int, int] = {}
    try:
        lines = Path(f"/proc/{pid}/net/packet").read_text().splitlines()[1:]
    except OSError:
        return []
    for line in lines:
        f = line.split()
        if len(f) >= 9:
            by_inode[int(f[8])] = int(f[4])
    out = []
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        fds = list(fd_dir.iterdir())
    except OSError:
        return []
    for entry in fds:
        try:
            target = os.readlink(entry)
        except OSError:
            continue
        if target.startswith("socket:["):
            inode = int(target[8:-1])
            if inode in by_inode:
                out.append(PortSocket(int(entry.name), by_inode[inode]))
    return out


# pidfd_getfd(2) has one number on every architecture (syscalls added since 5.1 share one table).
_SYS_PIDFD_GETFD = 438


def _pidfd_getfd(pidfd: int, fd: int) -> int:
    got = ctypes.CDLL(None, use_errno=True).syscall(_SYS_PIDFD_GETFD, pidfd, fd, 0)
    if got < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return got


def borrowed_sockets(pid: int) -> Iterator[tuple[PortSocket, socket.socket]]:
    """Each AF_PACKET socket of process `pid`, lent to this process as a duplicate (the same socket:
    options set on it are the daemon's); each duplicate is closed once the loop moves on."""
    pidfd = os.pidfd_open(pid)
    try:
        for ps in packet_sockets(pid):
            dup = _pidfd_getfd(pidfd, ps.fd)
            try:
                sock = socket.socket(fileno=dup)
                try:
                    yield ps, sock
                finally:
                    sock.detach()
            finally:
                os.close(dup)
    finally:
        os.close(pidfd)


def enlarge(pids: list[int], size: int) -> int:
    """Give every AF_PACKET socket of the daemons `pids` send and receive buffers of `size` bytes;
    returns how many sockets were changed. Failures are logged, not raised: the run goes on with the
    kernel's default buffers, and its fidelity check still counts the packets those lose."""
    changed = 0
    for pid in pids:
        try:
            for _ps, sock in borrowed_sockets(pid):
                sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, size)
                sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, size)
                changed += 1
        except OSError as exc:
            log.warning("cannot enlarge the socket buffers of Open vSwitch %d's ports (%s): queues deeper "
                        "than ~200 kB of frames will drop early", pid, exc)
    log.debug("port socket buffers of %d sockets set to %d bytes", changed, size)
    return changed


def send_buffers(pid: int) -> dict[int, int]:
    """Each AF_PACKET socket of process `pid`: its interface index (0: the unbound send socket) ->
    its send buffer in bytes, as the kernel reports it."""
    out: dict[int, int] = {}
    for ps, sock in borrowed_sockets(pid):
        out[ps.ifindex] = min(out.get(ps.ifindex, 1 << 62), sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))
    return out
