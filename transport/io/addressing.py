"""Where the UDP endpoints talk: default ports, name resolution and the largest datagram a path takes."""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path
from typing import Any

from transport.core.contract import DEFAULT_BASE_PORT, DEFAULT_PORT  # the fabric contract's, re-exported
from transport.core.headers import datagram_size_for_mtu
from transport.io.eventloop import EndpointError

__all__ = ["AUTO_MTU_CAP", "DEFAULT_BASE_PORT", "DEFAULT_PORT", "local_datagram_size", "path_datagram_size", "resolve"]


def resolve(host: str, port: int) -> tuple[int, tuple[Any, ...]]:
    """(address family, socket address) for a UDP destination, or an EndpointError saying why not."""
    if not 0 <= port <= 65535:
        raise EndpointError(f"port {port} is out of range; use 1-65535")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise EndpointError(f"cannot resolve {host!r}: {exc}; give an IP address or a known host name") from exc
    family, _, _, _, sockaddr = infos[0]
    return family, sockaddr


# Linux socket options (not exported by every Python build): the route's MTU on a connected socket.
_IP_MTU = getattr(socket, "IP_MTU", 14)
_IPV6_MTU = getattr(socket, "IPV6_MTU", 24)


# `--mtu auto` never goes above a jumbo Ethernet frame: loopback's 64 KiB MTU would make one datagram
# hold a whole window and shrink the receiver's reassembly window to a handful of packets.
AUTO_MTU_CAP = 9000


def path_datagram_size(host: str, port: int) -> int:
    """The largest UDP payload that crosses the path to host:port unfragmented: the route's MTU (the
    outgoing interface's, or a learned smaller path MTU, at most AUTO_MTU_CAP) less the IP and UDP
    headers."""
    family, dest = resolve(host, port)
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect(dest)  # no packet leaves: it only picks the route
            if family == socket.AF_INET6:
                mtu = s.getsockopt(socket.IPPROTO_IPV6, _IPV6_MTU)
            else:
                mtu = s.getsockopt(socket.IPPROTO_IP, _IP_MTU)
        except OSError as exc:
            raise EndpointError(f"cannot find the path MTU to {host}: {exc.strerror}; give --mtu BYTES") from exc
    return datagram_size_for_mtu(min(mtu, AUTO_MTU_CAP), ipv6=family == socket.AF_INET6)


def local_datagram_size(bind: str) -> int:
    """For a receiver: the largest UDP payload its interfaces take unfragmented, from the MTU of the
    interface that holds `bind` (of the largest non-loopback interface for a wildcard address)."""
    mtus: dict[str, int] = {}
    for name in os.listdir("/sys/class/net"):
        try:
            mtus[name] = int(Path(f"/sys/class/net/{name}/mtu").read_text())
        except (OSError, ValueError):
            continue
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    chosen = None
    if bind not in ("0.0.0.0", "::", ""):
        chosen = _interface_of(bind, family)
    mtu = mtus[chosen] if chosen in mtus else max((m for n, m in mtus.items() if n != "lo"), default=1500)
    return datagram_size_for_mtu(min(mtu, AUTO_MTU_CAP), ipv6=family == socket.AF_INET6)


def _interface_of(addr: str, family: int) -> str | None:
    """The interface whose address is `addr`: the kernel routes a local address through `lo`, so ask
    which interface a socket bound to it would leave by toward that interface's own subnet instead."""
    import fcntl  # Linux only, like the rest of this lookup

    if family != socket.AF_INET:
        return None
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                req = struct.pack("256s", name.encode()[:15])
                got = fcntl.ioctl(s.fileno(), siocgifaddr, req)
            except OSError:
                continue
            if socket.inet_ntoa(got[20:24]) == addr:
                return name
    return None
