"""pollskip, the library preloaded into the per-switch OVS daemons: a non-blocking read on a descriptor the
thread's last poll() found empty is answered EAGAIN without the kernel, nothing is lost (the next poll
sees the data), and blocking reads are never answered for the kernel. Run in a child Python with the
library preloaded (CPython's socket calls go through libc's recv, poll and accept). Its poll() on epoll
answers every case as the kernel's poll() does: readiness, a descriptor left out, a closed number reused,
dup2, a file closed behind its back, POLLOUT, a regular file and a closed descriptor. A dense wake-up
lingers (wake-up moderation) and a sparse one does not."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from emulator.ovs_daemons import LINGER_MAX_US, POLLSKIP, daemon_env, linger_us, pollskip_path

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


# poll() on epoll: a thread whose poll() asks about 8 descriptors or more is answered from an epoll set.
EPOLL_CHILD = textwrap.dedent("""
    import os, select, socket, tempfile, threading, time

    def uses_epoll():
        return any(os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[eventpoll]"
                   for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}"))

    def poll(socks, timeout_ms=0, events=select.POLLIN):
        p = select.poll()
        for s in socks:
            p.register(s, events)
        return {fd: ev for fd, ev in p.poll(timeout_ms)}

    def pair_on(fd):
        # A new socket pair, one end of which took the number `fd` (the lowest free one): (it, the other).
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        mine, peer = (a, b) if a.fileno() == fd else (b, a)
        assert mine.fileno() == fd, "the closed number was not reused"
        return mine, peer

    def forked_child_uses_epoll():
        # A daemon forks to detach before its main loop: the child's poll() must still run on epoll.
        pid = os.fork()
        if pid == 0:
            socks = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)[1] for _ in range(10)]
            poll(socks)
            os._exit(0 if uses_epoll() else 1)
        return os.waitpid(pid, 0)[1] == 0

    forked = forked_child_uses_epoll()
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(10)]
    rx = [b for _, b in pairs]
    for b in rx:
        b.setblocking(False)
    assert poll(rx) == {}
    print("epoll", uses_epoll(), forked)

    # Exactly the readable ones, level-triggered: still reported until read.
    pairs[2][0].send(b"x"); pairs[7][0].send(b"y")
    print("ready", sorted(i for i, b in enumerate(rx) if b.fileno() in poll(rx)))
    print("still", len(poll(rx)))
    rx[2].recv(10); rx[7].recv(10)

    # A wait is woken by data from another thread.
    threading.Timer(0.1, lambda: pairs[5][0].send(b"z")).start()
    t0 = time.monotonic()
    got = poll(rx, 5000)
    print("woken", list(got) == [rx[5].fileno()], time.monotonic() - t0 < 2)

    # A descriptor no longer asked about does not wake the caller, though its data is still there.
    t0 = time.monotonic()
    others = [b for i, b in enumerate(rx) if i != 5]
    print("left-out", poll(others, 200) == {}, time.monotonic() - t0 >= 0.15)
    print("back-in", list(poll(rx)) == [rx[5].fileno()])
    rx[5].recv(10)

    # Closed, and its number taken by a new socket: the new one is watched.
    fd = rx[3].fileno()
    rx[3].close()
    rx[3], peer = pair_on(fd)
    peer.send(b"reuse")
    print("reused", list(poll(rx)) == [fd])
    rx[3].recv(10)

    # dup2 over a watched descriptor: the file now behind the number is watched.
    c, d = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    target = rx[4].fileno()
    os.dup2(d.fileno(), target)
    c.send(b"dup2")
    print("dup2", list(poll(rx)) == [target])
    os.read(target, 10)

    # Closed behind the library's back (close_range, which it does not see), number reused: found again
    # at the latest after the next wait that times out.
    victim = rx[6].fileno()
    os.closerange(victim, victim + 1)
    rx[6].detach()
    rx[6], peer = pair_on(victim)
    peer.send(b"behind")
    poll(rx, 100)  # may time out: the set still held the closed file's registration
    print("behind-back", list(poll(rx, 100)) == [victim])
    rx[6].recv(10)

    # Closed behind its back while the file lives on under another number: the kernel keeps a
    # registration nobody can name; it must neither end waits early nor stand for the new socket.
    victim = rx[8].fileno()
    keep = os.dup(victim)
    os.closerange(victim, victim + 1)
    rx[8].detach()
    pairs[8][0].send(b"old")  # the old file is readable, and nobody asks about it
    t0 = time.monotonic()
    print("stale-waits", poll(rx[:8] + rx[9:], 300) == {}, time.monotonic() - t0 >= 0.25)
    rx[8], peer = pair_on(victim)
    t0 = time.monotonic()
    print("stale-reused", poll(rx, 300) == {}, time.monotonic() - t0 >= 0.25)
    peer.send(b"new")
    print("stale-new-data", list(poll(rx, 300)) == [victim])
    rx[8].recv(10)
    os.close(keep)

    # A long wait is cut at a second (a timeout, as OVS's loop takes it), so that nothing a registration
    # might miss is late by more; the kernel's poll() waits the whole time.
    t0 = time.monotonic()
    empty = poll(rx, 2500) == {}
    waited = time.monotonic() - t0
    print("long-wait", empty, 0.9 <= waited < 1.6 if uses_epoll() else waited >= 2.4)

    # A small poll() of the same thread is the kernel's, and leaves the set as it was.
    print("small", poll(rx[:1], 0) == {} and poll(rx) == {})

    # POLLOUT is answered as poll() answers it.
    print("pollout", len(poll(rx, 0, select.POLLOUT)) == len(rx))

    # A regular file, which epoll refuses, and a closed descriptor: the real poll() answers.
    with tempfile.TemporaryFile() as tf:
        p = select.poll()
        for s in rx:
            p.register(s, select.POLLIN)
        p.register(tf.fileno(), select.POLLIN)
        print("file", dict(p.poll(0)).get(tf.fileno(), 0) & select.POLLIN != 0)
    p = select.poll()
    for s in rx:
        p.register(s, select.POLLIN)
    r, w = os.pipe(); os.close(r)
    p.register(r, select.POLLIN)
    print("closed", dict(p.poll(0)).get(r, 0) & select.POLLNVAL != 0)

    # Its own epoll descriptor closed behind its back: poll() is the kernel's from then on.
    for fd in os.listdir("/proc/self/fd"):
        if os.path.exists(f"/proc/self/fd/{fd}") and os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[eventpoll]":
            os.closerange(int(fd), int(fd) + 1)
    pairs[1][0].send(b"after")
    print("own-set-closed", list(poll(rx, 300)) == [rx[1].fileno()], uses_epoll())
""")

EPOLL_EXPECTED = ["epoll True True", "ready [2, 7]", "still 2", "woken True True", "left-out True True", "back-in True",
                  "reused True", "dup2 True", "behind-back True", "stale-waits True True", "stale-reused True True",
                  "stale-new-data True", "long-wait True True", "small True", "pollout True", "file True",
                  "closed True", "own-set-closed True False"]


def test_poll_on_epoll_answers_as_poll_does():
    env = {**os.environ, "LD_PRELOAD": _built()}
    env.pop("FABRICLAB_POLLSKIP_EPOLL", None)
    env.pop("FABRICLAB_POLLSKIP_LINGER_US", None)
    out = subprocess.run([sys.executable, "-c", EPOLL_CHILD], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:-1] == EPOLL_EXPECTED, out.stdout


@pytest.mark.parametrize("preload", [True, False])
def test_the_same_answers_from_the_kernel_poll(preload):
    # The control: FABRICLAB_POLLSKIP_EPOLL=0, and no library at all, answer every case alike.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if preload:
        env.update(LD_PRELOAD=_built(), FABRICLAB_POLLSKIP_EPOLL="0")
    out = subprocess.run([sys.executable, "-c", EPOLL_CHILD], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:-1] == ["epoll False False", *EPOLL_EXPECTED[1:]], out.stdout


def test_fabriclab_pollskip_epoll_0_reaches_the_daemons(monkeypatch):
    _built()
    monkeypatch.setenv("FABRICLAB_POLLSKIP_EPOLL", "0")
    assert "FABRICLAB_POLLSKIP_EPOLL=0 " in daemon_env()
    monkeypatch.delenv("FABRICLAB_POLLSKIP_EPOLL")
    assert "FABRICLAB_POLLSKIP_EPOLL" not in daemon_env()


# Wake-up moderation: while packets come densely a poll() first sleeps its linger, then answers with all
# that came meanwhile; a sparse wake-up (or no linger asked for) answers at once with what woke it, and so
# does a ping's reply, which comes soon after its request but among sparse traffic.
# Arrivals are timerfds' expiries, timed by the kernel from the poll's start, so that a thread that stalls
# (a loaded machine, a hypervisor's steal) cannot move them: a wait that lingers sleeps the whole linger
# (it took >= LINGER) and then finds everything that expired by then, even what came 5 ms before its end.
# The lingering run asks for 50 ms, the most pollskip.c accepts (its LINGER_MAX_US), which leaves a wait
# that answers at once (woken 5 ms in) 40 ms to return before the next arrival. Dense is "the last wake-up
# by I/O less than four lingers (200 ms) ago and a mean gap between them under that".
LINGER_US = 50000
LINGER_CHILD = textwrap.dedent("""
    import ctypes, os, select, sys, time

    LINGER = %(linger)s
    libc = ctypes.CDLL(None, use_errno=True)

    class Timespec(ctypes.Structure):
        _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]

    class Itimerspec(ctypes.Structure):
        _fields_ = [("interval", Timespec), ("value", Timespec)]

    def timerfd():
        fd = libc.timerfd_create(time.CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
        assert fd >= 0, os.strerror(ctypes.get_errno())
        return fd

    def arm(fd, at):
        # Readable from `at` on (time.monotonic's clock, TFD_TIMER_ABSTIME); 0: disarmed, and not readable.
        spec = Itimerspec(Timespec(0, 0), Timespec(*divmod(round(at * 1e9), 10**9)))
        assert libc.timerfd_settime(fd, 1 if at else 0, ctypes.byref(spec), None) == 0, os.strerror(ctypes.get_errno())

    fds = [timerfd() for _ in range(10)]  # 8 descriptors or more: the poll runs on epoll
    p = select.poll()
    for fd in fds:
        p.register(fd, select.POLLIN)

    def woken_by(*arrivals):
        # Each (delay s, descriptor): readable `delay` after the poll starts. Returns (descriptors ready,
        # seconds the poll took), every timer disarmed again.
        t0 = time.monotonic()
        for delay, i in arrivals:
            arm(fds[i], t0 + delay)
        got = {fd for fd, _ in p.poll(5000)}
        took = time.monotonic() - t0
        for fd in fds:
            arm(fd, 0)
        ready = sorted(i for i, fd in enumerate(fds) if fd in got)
        print(f"{arrivals}: {ready} in {took * 1000:.1f} ms", file=sys.stderr)  # shown when the test fails
        return ready, took

    p.poll(0)
    # Wake-ups by I/O 10-50 ms apart, one right after another: dense against a 50 ms linger (four lingers:
    # 200 ms). The first gap seeds the mean and each later one moves it an eighth of the way, so it takes a
    # stall of ~400 ms in the first gap, or of more than a second in a later one, to make them sparse.
    for _ in range(8):
        woken_by((0.01, 1))
    ready, took = woken_by((0.005, 2), (0.045, 3))
    print("dense", ready, took >= LINGER)
    # 1.5 s of silence: sparse (more than four lingers since the last wake-up). The same arrivals as the
    # dense wait's are answered at once. That gap also lifts the mean to over 1.5 s / 8 whatever it was.
    time.sleep(1.5)
    ready, took = woken_by((0.005, 4), (0.045, 5))
    print("sparse", ready, took < LINGER)
    replies = []
    for _ in range(4):  # pings: a request after 400 ms, its reply soon after: recent, but sparse on average
        # (every gap at least what its sleeps make it, the mean stays over 200 ms: ~215 ms at least)
        time.sleep(0.4)
        woken_by((0.005, 6))
        ready, took = woken_by((0.005, 7))
        replies.append(took < LINGER)
    print("pings answered at once", replies)
""") % {"linger": LINGER_US / 1e6}


@pytest.mark.parametrize(("linger", "dense"), [(str(LINGER_US), "[2, 3]"), ("0", "[2]")])
def test_a_wait_among_dense_traffic_lingers_first_and_gathers_what_came_meanwhile(linger, dense):
    env = {**os.environ, "LD_PRELOAD": _built(), "FABRICLAB_POLLSKIP_LINGER_US": linger}
    env.pop("FABRICLAB_POLLSKIP_EPOLL", None)
    out = subprocess.run([sys.executable, "-c", LINGER_CHILD], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")[:-1]
    assert lines[0] == f"dense {dense} {linger != '0'}", out.stdout + out.stderr
    assert lines[1] == "sparse [4] True", out.stdout + out.stderr
    assert lines[2] == "pings answered at once [True, True, True, True]", out.stdout + out.stderr


def test_the_linger_is_sized_to_the_switch_links_and_the_environment_overrides_it(monkeypatch):
    # A quarter of a full frame's time on the fastest link: 1514 bytes at 6 Mb/s is 2019 µs.
    assert linger_us([4.0, 6.0], 1500) == 504
    assert linger_us([4.0], 9000) == 4507  # 18 ms jumbo frames
    assert linger_us([1.0], 9000) == 18028  # the k=8 fat-tree's 72 ms frames
    assert linger_us([0.5], 9000) == LINGER_MAX_US  # 144 ms frames: capped
    assert linger_us([0.0, 4.0], 1500) == 0  # an unshaped port: packets need not wait for it
    assert linger_us([40.0], 1500) == 0  # 76 µs: below the floor, nothing to gather
    assert linger_us([], 1500) == 0
    _built()
    monkeypatch.delenv("FABRICLAB_POLLSKIP_LINGER_US", raising=False)
    assert "FABRICLAB_POLLSKIP_LINGER_US=252 " in daemon_env(252)
    assert "LINGER" not in daemon_env(0)
    monkeypatch.setenv("FABRICLAB_POLLSKIP_LINGER_US", "0")
    assert "LINGER" not in daemon_env(252)
    monkeypatch.setenv("FABRICLAB_POLLSKIP_LINGER_US", "700")
    assert "FABRICLAB_POLLSKIP_LINGER_US=700 " in daemon_env(0)
