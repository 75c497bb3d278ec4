"""Sized TCP flows whose completion time is when the receiver holds every byte.

`iperf3 -n BYTES` ends a test once the client has *written* the bytes into its socket buffer, so on a
slow link a flow "completes" long before the data arrives. Here the sender writes N bytes, shuts down
its side and waits for the receiver to close the connection, which the receiver does only once it has
read up to EOF: the sender sees completion when that FIN arrives, half a round trip after the last byte
reached the receiver (as a message-based sender sees its last ACK).

    python -m cli.endpoint tcpflow recv --port P [--bind ADDR] [--timed] [--json-out F] [--ready-file F]
    python -m cli.endpoint tcpflow send --to HOST:PORT (--bytes N | --seconds S) [--cport P] [--hold] ...

A timed flow (--seconds, the TCP baseline beside the transport's timed arms) writes for S seconds, counts
the bytes the receiver acknowledged by then (TCP_INFO's bytes_acked), and resets the connection instead of
draining what its socket and the fabric's queues still hold (seconds' worth on a slow link); its
receiver, told --timed, takes that reset as the end. iperf3 did this job before and spun in select()
while it waited for its server at each end of a test (esnet/iperf #1213, #2018): on a 16-host fat-tree
at 2 Mb/s its clients took 1-1.8 of two cores for a second or two.

Both write JSON metrics (--json-out) and a one-line summary on stdout. The receiver accepts one
connection. The sender binds --cport so that the fabric's ECMP hash of the flow is reproducible; with
--hold it connects, announces readiness and sends only on SIGUSR1 (SIGTERM/SIGINT: exit 0, nothing sent).
Exit status: 0 completed, 1 timed out / refused / reset / stopped, 2 bad arguments. The options are
parsed in cli/tcpflow.py.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import struct
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

from transport.io.endpoint import write_json

CHUNK = 64 << 10
RECV_BUF = 256 << 10
BIN_S = 0.1
CONNECT_RETRY_S = 5.0  # the receiver may still be starting: retry refused connections this long
CONNECT_RETRY_GAP_S = 0.05
# Socket waits are bounded by this, so deadlines hold and the sender samples TCP_INFO during stalls.
WAIT_S = BIN_S
TCP_INFO_LEN = 256
# Byte offsets in struct tcp_info (linux/tcp.h): 8 bytes of u8 fields, then u32 rto(8) ato snd_mss(16)
# ... pmtu(60) ... total_retrans(100), u64 pacing_rate(104) max_pacing_rate bytes_acked(120)
# bytes_received, u32 segs_out(136) segs_in notsent_bytes min_rtt(148). Older kernels return less.
_TCPI = {"snd_mss": (16, "=I"), "pmtu": (60, "=I"), "total_retrans": (100, "=I"),
         "bytes_acked": (120, "=Q"), "min_rtt": (148, "=I")}
_SENT = memoryview(bytes(range(256)) * (CHUNK // 256))


class FlowError(Exception):
    """The flow could not run or finish (no receiver, address in use, reset, timeout, SIGTERM)."""


def tcp_info(sock: socket.socket) -> dict[str, int | None]:
    """The few tcp_info fields the metrics use; None for those the kernel did not return."""
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_LEN)
    except (OSError, AttributeError):  # not Linux, or the socket is already gone
        raw = b""
    return {name: struct.unpack_from(fmt, raw, off)[0] if len(raw) >= off + struct.calcsize(fmt) else None
            for name, (off, fmt) in _TCPI.items()}


def add_to_bins(bins: list[float], t0: float, t1: float, amount: float) -> None:
    """Spread `amount` over the BIN_S bins covering [t0, t1] (seconds since the flow started), in
    proportion to the overlap: samples are taken between writes, not exactly at bin edges."""
    if t1 <= t0:
        t0 = t1 = max(t0, t1)
    first, last = int(t0 / BIN_S), int(t1 / BIN_S)
    bins.extend([0.0] * (last + 1 - len(bins)))
    for i in range(first, last + 1):
        share = 1.0 if t1 == t0 else (min(t1, (i + 1) * BIN_S) - max(t0, i * BIN_S)) / (t1 - t0)
        bins[i] += amount * share


def _bps(bins: list[float]) -> list[float]:
    return [round(8 * b / BIN_S, 1) for b in bins]


@contextmanager
def _stop_on_signals() -> Iterator[None]:
    # Raising from the handler interrupts a blocked send/recv, and the metrics are still written.
    def stop(signum: int, _frame: Any) -> NoReturn:
        raise FlowError(f"stopped by {signal.Signals(signum).name}")

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _ready(path: str | None) -> None:
    # announce_ready's format, without its numpy preload: nothing here needs numpy.
    write_json({"pid": os.getpid(), "t": time.monotonic()}, path)


def receive(args: argparse.Namespace) -> int:
    """`tcpflow recv`: accept one connection, read to EOF, close; write the metrics. Exit status."""
    try:
        # create_server sets SO_REUSEADDR, so a rerun can listen while the last flow is in TIME_WAIT.
        lsock = socket.create_server((args.bind, args.port), backlog=1)
    except OSError as exc:
        raise FlowError(f"cannot listen on {args.bind}:{args.port}: {exc.strerror or exc}; "
                        "choose another --port or --bind") from exc
    port = lsock.getsockname()[1]
    m: dict[str, Any] = {"role": "receiver", "port": port, "completed": False, "bin_s": BIN_S}
    deadline = time.monotonic() + args.timeout
    _ready(args.ready_file)
    bins: list[float] = []
    first = last = t_acc = 0.0
    total, cpu0 = 0, time.process_time()
    try:
        with lsock, _stop_on_signals():
            lsock.settimeout(args.timeout)
            try:
                conn, _peer = lsock.accept()
            except TimeoutError:
                raise FlowError(f"no connection within {args.timeout:g} s") from None
            t_acc, cpu0 = time.monotonic(), time.process_time()
            m["t_accept"] = t_acc
            view = memoryview(bytearray(RECV_BUF))
            with conn:
                conn.settimeout(WAIT_S)
                while True:
                    try:
                        n = conn.recv_into(view)
                    except TimeoutError:
                        if time.monotonic() > deadline:
                            raise FlowError(f"no EOF within {args.timeout:g} s") from None
                        continue
                    except ConnectionResetError:
                        if not args.timed:
                            raise
                        break  # a timed sender's end
                    if not n:
                        break
                    now = time.monotonic()
                    if now > deadline:
                        raise FlowError(f"no EOF within {args.timeout:g} s")
                    if not total:
                        first = now
                    last, total = now, total + n
                    add_to_bins(bins, now - first, now - first, n)
            # Closed before the metrics are written: the sender's completion is this close.
            m.update(completed=True, stop_reason="completed")
    except (FlowError, OSError) as exc:
        m["stop_reason"] = str(exc)
    m.update(bytes=total, cpu_run_s=time.process_time() - cpu0, series_bps=_bps(bins),
             first_byte_s=first - t_acc if total else None, last_byte_s=last - t_acc if total else None)
    write_json(m, args.json_out)
    print(f"received {m['bytes']} bytes on port {port} ({m['stop_reason']})")
    if not m["completed"]:
        print(f"tcpflow recv: {m['stop_reason']}", file=sys.stderr)
    return 0 if m["completed"] else 1


def _connect(host: str, port: int, bind: str | None, cport: int, timeout: float) -> socket.socket:
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise FlowError(f"cannot resolve {host!r}: {exc}; give an IP address or a known host name") from exc
    local = (bind or ("::" if family == socket.AF_INET6 else "0.0.0.0"), cport)
    refused_until = time.monotonic() + CONNECT_RETRY_S
    while True:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(local)
        except OSError as exc:
            sock.close()
            raise FlowError(f"cannot bind {local[0]}:{cport}: {exc.strerror or exc}; "
                            "choose another --cport or --bind") from exc
        try:
            sock.settimeout(timeout)
            sock.connect(addr)
            return sock
        except ConnectionRefusedError:
            sock.close()
            if time.monotonic() + CONNECT_RETRY_GAP_S > refused_until:
                raise FlowError(f"connection to {host}:{port} refused for {CONNECT_RETRY_S:g} s; "
                                "is the receiver listening?") from None
            time.sleep(CONNECT_RETRY_GAP_S)
        except TimeoutError:
            sock.close()
            raise FlowError(f"no answer from {host}:{port} within {timeout:g} s") from None
        except OSError as exc:
            sock.close()
            raise FlowError(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from exc


def _flow(sock: socket.socket, n: int | None, timeout: float, m: dict[str, Any],
          seconds: float | None = None) -> None:
    """Send n bytes, half-close, wait for the receiver's close; or, given `seconds` instead of n, send
    for that long, count what the receiver acknowledged and reset. Fills m as it goes."""
    bins: list[float] = []
    start = time.monotonic()
    cpu0, deadline = time.process_time(), start + timeout
    left = n or 0
    # bytes_acked counts the SYN and the FIN too: measure from here and cap a sized flow at n.
    prev_t, prev_acked = 0.0, tcp_info(sock)["bytes_acked"] or 0
    base = prev_acked
    cap = None if n is None else base + n
    m["t_start"] = start

    def sample(now: float) -> None:
        nonlocal prev_t, prev_acked
        acked = tcp_info(sock)["bytes_acked"]
        if acked is not None:
            if cap is not None:
                acked = min(acked, cap)
            add_to_bins(bins, prev_t, now - start, acked - prev_acked)
            prev_t, prev_acked = now - start, acked

    try:
        # Timed waits rather than plain blocking ones: a send still sleeps until the buffer has room,
        # but wakes every WAIT_S to sample TCP_INFO and to notice the deadline if the peer stalls.
        sock.settimeout(WAIT_S)
        next_sample = start + BIN_S
        stop_at = None if seconds is None else start + seconds
        while True:
            now = time.monotonic()
            if stop_at is not None:
                if now >= stop_at:
                    sample(now)
                    acked = prev_acked - base
                    m.update(completed=True, stop_reason="duration", duration_s=now - start, bytes=acked,
                             goodput_bps=8 * acked / (now - start))
                    # Reset rather than drain what the socket and the fabric's queues still hold.
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                sock.settimeout(min(WAIT_S, stop_at - now))
            try:
                if stop_at is not None:
                    sock.send(_SENT)
                elif left:
                    left -= sock.send(_SENT[:min(CHUNK, left)])
                    if not left:
                        sock.shutdown(socket.SHUT_WR)
                elif not sock.recv(RECV_BUF):
                    break  # EOF: the receiver has read everything and closed
            except TimeoutError:
                pass
            now = time.monotonic()
            if now >= next_sample:
                sample(now)
                next_sample = now + BIN_S
            if now > deadline:
                raise FlowError(f"not complete within {timeout:g} s ({(n or 0) - left} of {n} bytes written)")
        done = time.monotonic()
        sample(done)
        m.update(completed=True, stop_reason="completed", duration_s=done - start,
                 goodput_bps=8 * (n or 0) / (done - start))
    except OSError as exc:  # reset, broken pipe, unreachable
        raise FlowError(f"connection lost: {exc.strerror or exc}") from exc
    finally:
        info = tcp_info(sock)
        m.update(retransmissions=info["total_retrans"], mss=info["snd_mss"], pmtu=info["pmtu"],
                 min_rtt_s=info["min_rtt"] / 1e6 if info["min_rtt"] is not None else None,
                 series_bps=_bps(bins), cpu_run_s=time.process_time() - cpu0)


def send(args: argparse.Namespace) -> int:
    """`tcpflow send`: send --bytes, done when the receiver has closed, or for --seconds; write the
    metrics. Exit status."""
    host, port = args.to
    m: dict[str, Any] = {"role": "sender", "destination": f"{host}:{port}", "bytes": args.bytes,
                         "seconds": args.seconds, "completed": False, "bin_s": BIN_S, "series_bps": [],
                         **dict.fromkeys(("stop_reason", "duration_s", "goodput_bps", "retransmissions",
                                          "min_rtt_s", "mss", "pmtu", "cpu_run_s"))}
    waited = {signal.SIGUSR1, signal.SIGTERM, signal.SIGINT}
    # Blocked before the ready file appears, so a start signal sent the moment it does is not lost
    # (SIGUSR1's default action would end the process).
    old = signal.pthread_sigmask(signal.SIG_BLOCK, waited) if args.hold else None
    try:
        with _connect(host, port, args.bind, args.cport, args.timeout) as sock, _stop_on_signals():
            _ready(args.ready_file)
            if old is not None:
                got = signal.sigwait(waited)
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
                if got != signal.SIGUSR1:
                    print("tcpflow send: stopped before the start signal; nothing sent", file=sys.stderr)
                    return 0
            _flow(sock, args.bytes, args.timeout, m, seconds=args.seconds)
    except FlowError as exc:
        m["stop_reason"] = str(exc)
    finally:
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
    m["cpu_total_s"] = time.process_time()
    write_json(m, args.json_out)
    if not m["completed"]:
        print(f"tcpflow send: {m['stop_reason']}", file=sys.stderr)
        return 1
    print(f"sent {m['bytes']} bytes to {host}:{port} in {m['duration_s']:.3f} s: "
          f"{m['goodput_bps'] / 1e6:.2f} Mb/s, {m['retransmissions']} retransmissions")
    return 0
