"""`python -m experiments.bare_loop send|recv ...`: the floor under `fabriclab bench endpoints`.

Two bare Python loops do only what the transport's endpoints cannot avoid, with the same kind of
sockets and the same wait (epoll): the sender sends a datagram of the endpoints' size at their pace and
reads what comes back; the receiver reads each datagram and answers every K-th, as often as the
endpoints' receiver ACKed, with an ACK-sized datagram. No headers, no state, no timers besides the
pacing. What they cost per delivered packet is this machine's price of a wake-up and a datagram; how
far the endpoints sit above it is what the transport itself costs.

Each writes `{"cpu_run_s", "datagrams_in", "datagrams_out"}` to its --json-out, the CPU counted from
its first datagram to its last, as the endpoints count the CPU of their loop.
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import sys
import time
from pathlib import Path

from transport.core.wire import ACK_LEN

END = b"E"  # shorter than any datagram of the run: the sender's last word
END_COPIES = 3  # the link does not drop at these rates, but a lost end would hold the receiver to its timeout
TRAILING_S = 0.05  # how long the sender still reads ACKs after its last datagram


def _drain(sock: socket.socket) -> list[tuple[bytes, object]]:
    got = []
    while True:
        try:
            got.append(sock.recvfrom(65535))
        except (BlockingIOError, InterruptedError):
            return got


def run_sender(to: tuple[str, int], size: int, count: int, gap_s: float) -> dict[str, float | int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.connect(to)
    sock.setblocking(False)
    poller = select.epoll()
    poller.register(sock.fileno(), select.EPOLLIN)
    payload = bytes(size)
    mono, send, poll = time.monotonic, sock.send, poller.poll
    cpu0 = time.process_time()
    sent = acks = 0
    next_send = mono()
    while sent < count:
        now = mono()
        if now >= next_send:
            send(payload)
            sent += 1
            next_send += gap_s
            continue
        if poll(next_send - now):
            acks += len(_drain(sock))
    for _ in range(END_COPIES):
        send(END)
    stop = mono() + TRAILING_S
    while (left := stop - mono()) > 0:
        if poll(left):
            acks += len(_drain(sock))
    cpu = time.process_time() - cpu0
    poller.close()
    sock.close()
    return {"cpu_run_s": round(cpu, 4), "datagrams_in": acks, "datagrams_out": sent}


def run_receiver(port: int, ack_every: int, ready_file: Path, timeout_s: float) -> dict[str, float | int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", port))
    sock.setblocking(False)
    poller = select.epoll()
    poller.register(sock.fileno(), select.EPOLLIN)
    ack = bytes(ACK_LEN)
    ready_file.write_text("ready\n")
    cpu0: float | None = None
    got = acked = 0
    last_from = None
    give_up = time.monotonic() + timeout_s
    done = False
    while not done and time.monotonic() < give_up:
        if not poller.poll(1.0):
            continue
        if cpu0 is None:
            cpu0 = time.process_time()
        for data, addr in _drain(sock):
            if len(data) == len(END):
                done = True
                break
            got += 1
            last_from = addr
            if got % ack_every == 0:
                sock.sendto(ack, addr)
                acked += 1
    if got % ack_every and last_from is not None:  # the last packets are ACKed too
        sock.sendto(ack, last_from)
        acked += 1
    cpu = 0.0 if cpu0 is None else time.process_time() - cpu0
    poller.close()
    sock.close()
    return {"cpu_run_s": round(cpu, 4), "datagrams_in": got, "datagrams_out": acked}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.bare_loop", description=__doc__.split("\n\n")[1])
    sub = p.add_subparsers(dest="role", required=True)
    s = sub.add_parser("send", help="send COUNT datagrams of SIZE bytes every GAP seconds to --to")
    s.add_argument("--to", required=True, help="HOST:PORT")
    s.add_argument("--size", type=int, required=True)
    s.add_argument("--count", type=int, required=True)
    s.add_argument("--gap", type=float, required=True)
    r = sub.add_parser("recv", help="read datagrams on 127.0.0.1:PORT, answering every --ack-every-th")
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--ack-every", type=int, default=1)
    r.add_argument("--ready-file", type=Path, required=True)
    r.add_argument("--timeout", type=float, default=60.0, help="give up after this many seconds")
    for q in (s, r):
        q.add_argument("--json-out", type=Path, required=True)
    a = p.parse_args(argv)
    if a.role == "send":
        host, _, port = a.to.rpartition(":")
        out = run_sender((host, int(port)), a.size, a.count, a.gap)
    else:
        out = run_receiver(a.port, max(1, a.ack_every), a.ready_file, a.timeout)
    a.json_out.write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
