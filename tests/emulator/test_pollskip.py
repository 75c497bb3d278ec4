"""pollskip, the library preloaded into the per-switch OVS daemons: a non-blocking read on a descriptor the
thread's last poll() found empty is answered EAGAIN without the kernel, nothing is lost (the next poll
sees the data), and blocking reads are never answered for the kernel. Run in a child Python with the
library preloaded (CPython's socket calls go through libc's recv, poll and accept)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from emulator.ovs_daemons import POLLSKIP, daemon_env, pollskip_path

CHILD = textwrap.dedent("""
    import errno, select, socket, threading, time

    def poll_once(*socks):
        p = select.poll()
        for s in socks:
            p.register(s, select.POLLIN)
        return {fd for fd, _ in p.poll(0)}

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    b.setblocking(False)
    assert poll_once(b) == set()
    a.send(b"late")  # arrives after the poll that found b empty
    try:
        b.recv(100)
        print("read-reached-kernel")
    except BlockingIOError:
        print("skipped")
    assert poll_once(b) == {b.fileno()}, "the next poll must see the datagram"
    print("then", b.recv(100).decode())
    assert poll_once(b) == set()
    a.send(b"after-send")
    # A poll that finds it readable marks nothing.
    assert poll_once(b) == {b.fileno()}
    print("ready", b.recv(100).decode())

    # Blocking descriptors are never answered for the kernel, even right after an empty poll.
    c, d = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    assert poll_once(d) == set()
    threading.Timer(0.2, lambda: c.send(b"blocked")).start()
    print("blocking", d.recv(100).decode())

    # A descriptor made non-blocking after its first read is seen as such (fcntl is followed).
    e, f = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    e.send(b"x"); f.recv(10)
    f.setblocking(False)
    assert poll_once(f) == set()
    e.send(b"y")
    try:
        f.recv(10)
        print("nb-reached-kernel")
    except BlockingIOError:
        print("nb-skipped")

    # A listening socket: accept after an empty poll is skipped, the next poll sees the connection.
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(); srv.setblocking(False)
    assert poll_once(srv) == set()
    cl = socket.create_connection(srv.getsockname())
    time.sleep(0.05)
    try:
        srv.accept()
        print("accept-reached-kernel")
    except BlockingIOError:
        print("accept-skipped")
    assert poll_once(srv) == {srv.fileno()}
    conn, _ = srv.accept()
    print("accepted")
""")


def _built() -> str:
    path = pollskip_path()
    assert path is not None, f"{POLLSKIP} is not built: run 'make setup' (it needs gcc)"
    return str(path)


def test_reads_that_poll_found_empty_are_answered_without_the_kernel_and_nothing_is_lost():
    env = {**os.environ, "LD_PRELOAD": _built()}
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:-1] == [
        "skipped", "then late", "ready after-send", "blocking blocked", "nb-skipped", "accept-skipped", "accepted",
    ], out.stdout


def test_without_the_library_the_same_read_reaches_the_kernel():
    # The control: unpreloaded, the read after the empty poll returns the datagram that arrived since.
    first = CHILD[:CHILD.index("assert poll_once(b) == {b.fileno()}")]
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    out = subprocess.run([sys.executable, "-c", first], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout == "read-reached-kernel\n", out.stdout + out.stderr


@pytest.mark.parametrize(("value", "included"), [("1", True), ("0", False)])
def test_fabriclab_pollskip_0_leaves_it_out_of_the_daemons(monkeypatch, value, included):
    _built()
    monkeypatch.setenv("FABRICLAB_POLLSKIP", value)
    assert ("fabriclab-pollskip.so" in daemon_env()) is included
    assert "libtcmalloc_minimal.so.4" in daemon_env() and "MALLOC_TRIM_THRESHOLD_=" in daemon_env()
