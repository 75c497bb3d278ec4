"""The two ends of the path-spread probe, run inside emulated hosts: `python -m emulator.probe_agent`.

send: N UDP datagrams to DST:PORT at a paced rate, from one source port (fixed entropy) or rotating over
K source ports (rotate), so the fabric's hash or spray rules see one flow or many.
recv: counts datagrams until none arrive for --idle seconds; writes a JSON summary including the
largest gap between arrivals (the outage a reroute caused).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time


def send(dst: str, port: int, packets: int, sources: int, base_port: int, rate: float, size: int) -> dict:
    socks = []
    for i in range(sources):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("0.0.0.0", base_port + i))
        socks.append(s)
    start = time.monotonic()
    interval = 1.0 / rate
    next_at = start
    for i in range(packets):
        payload = i.to_bytes(4, "big") + bytes(max(0, size - 4))
        socks[i % sources].sendto(payload, (dst, port))
        # Never catch up after a stall with a burst: a burst of hundreds of packets overflows the
        # switch's ingress socket buffer and the probe would measure its own burst, not the paths.
        next_at = max(next_at + interval, time.monotonic() - 8 * interval)
        ahead = next_at - time.monotonic()
        if ahead > 0.001:
            time.sleep(ahead)
    for s in socks:
        s.close()
    return {"sent": packets, "duration_s": time.monotonic() - start}


def recv(port: int, idle: float, deadline: float, out: str, ready: str | None) -> dict:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.bind(("0.0.0.0", port))
    if ready:
        open(ready, "w").close()
    seen: set[int] = set()
    received = duplicates = 0
    first = last = None
    max_gap = 0.0
    gap_at = None
    end = time.monotonic() + deadline
    s.settimeout(0.05)
    while time.monotonic() < end:
        try:
            data = s.recv(65535)
        except TimeoutError:
            if last is not None and time.monotonic() - last > idle:
                break
            continue
        now = time.monotonic()
        seq = int.from_bytes(data[:4], "big")
        if seq in seen:
            duplicates += 1
            continue
        seen.add(seq)
        received += 1
        if first is None:
            first = now
        elif now - last > max_gap:
            max_gap = now - last
            gap_at = last - first
        last = now
    result = {
        "received": received,
        "duplicates": duplicates,
        "duration_s": (last - first) if first is not None and last is not None else 0.0,
        "max_gap_s": max_gap,
        "max_gap_at_s": gap_at,
    }
    with open(out, "w") as f:
        json.dump(result, f)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="probe_agent", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    ps = sub.add_parser("send")
    ps.add_argument("--dst", required=True)
    ps.add_argument("--port", type=int, required=True)
    ps.add_argument("--packets", type=int, required=True)
    ps.add_argument("--sources", type=int, default=1)
    ps.add_argument("--base-port", type=int, default=40000)
    ps.add_argument("--rate", type=float, default=2000.0)
    ps.add_argument("--size", type=int, default=64)
    pr = sub.add_parser("recv")
    pr.add_argument("--port", type=int, required=True)
    pr.add_argument("--idle", type=float, default=1.0)
    pr.add_argument("--deadline", type=float, default=60.0)
    pr.add_argument("--out", required=True)
    pr.add_argument("--ready")
    a = p.parse_args(argv)
    if a.cmd == "send":
        json.dump(send(a.dst, a.port, a.packets, a.sources, a.base_port, a.rate, a.size), sys.stdout)
    else:
        recv(a.port, a.idle, a.deadline, a.out, a.ready)
    return 0


if __name__ == "__main__":
    sys.exit(main())
