"""Driving fabriclab's interactive commands through a pseudo-terminal (pexpect), as a person types them:
keys and Ctrl-C go to the terminal, not to a pid, so they reach the whole foreground process group as
they would from a shell. Whatever a test does, the command it started is ended by that pid: SIGTERM
first (the commands tear their fabric down on it), SIGKILL only if it hangs."""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pexpect

VENV_BIN = Path(sys.executable).parent
FABRICLAB = str(VENV_BIN / "fabriclab")
# Terminal escapes (colours, cursor moves, the alternate screen, bracketed paste), to read the text.
ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[()][0-9A-Za-z]|[=>78])")
# Unprivileged runs: a user with no rights of its own, which can still read the tree and the venv.
NOBODY = ("nobody", "nogroup")


def plain(text: str) -> str:
    return ANSI.sub("", text).replace("\r", "")


def env() -> dict[str, str]:
    """The caller's environment with the venv active (its bin first on PATH, as `source .venv/bin/activate`
    does: the emulated hosts inherit it, so `fabriclab` typed in a host's command is found), in a UTF-8
    xterm whatever the test runner had (CI may have no TERM at all)."""
    return {**os.environ, "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}", "TERM": "xterm",
            "LANG": "C.UTF-8"}


def _default_hangup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


class Terminal:
    """One command on a pseudo-terminal; `text` is all it printed, escapes removed."""

    def __init__(self, argv: list[str], *, cwd: str | Path | None = None, environ: dict[str, str] | None = None,
                 rows: int = 50, cols: int = 160) -> None:
        self.raw = ""
        self._plain = (0, "")  # (length of raw, its text): a full-screen view prints megabytes
        # A person at a terminal: the command starts with SIGHUP's default action whatever the test runner
        # inherited (run under nohup, the runner ignores it, and so would every command it starts: they are
        # meant to survive a hangup then, and the hangup tests would find them still running).
        self.child = pexpect.spawn(argv[0], argv[1:], cwd=str(cwd) if cwd else None, env=environ or env(),
                                   encoding="utf-8", codec_errors="replace", dimensions=(rows, cols), timeout=30,
                                   preexec_fn=_default_hangup)

    @property
    def text(self) -> str:
        if self._plain[0] != len(self.raw):
            self._plain = (len(self.raw), plain(self.raw))
        return self._plain[1]

    def tail(self, lines: int = 60) -> str:
        """The last lines with something on them (a full-screen view pads its frames with blank lines)."""
        return "\n".join([ln.rstrip() for ln in self.text[-40000:].split("\n") if ln.strip()][-lines:])

    def read(self, wait: float = 0.2) -> bool:
        """Take what the command has printed (waiting up to `wait` s for something); False at its end."""
        try:
            self.raw += self.child.read_nonblocking(65536, timeout=wait)
        except pexpect.TIMEOUT:
            pass
        except pexpect.EOF:
            return False
        return True

    def wait_for(self, pattern: str, timeout: float, since: int = 0) -> re.Match[str]:
        """Read until `pattern` (a regex, multi-line) appears in the text from offset `since`."""
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern, re.MULTILINE)
        while True:
            alive = self.read()
            if m := rx.search(self.text, since):
                return m
            if not alive or time.monotonic() > deadline:
                why = "the command ended" if not alive else f"not within {timeout:g} s"
                raise AssertionError(f"{pattern!r} did not appear ({why}); the terminal showed:\n{self.tail()}")

    def send(self, keys: str) -> None:
        self.child.send(keys)

    def exit_status(self, timeout: float) -> int:
        """Wait for the command to end by itself; its exit status."""
        deadline = time.monotonic() + timeout
        while self.read():
            if time.monotonic() > deadline:
                raise AssertionError(f"the command did not end within {timeout:g} s; the terminal showed:\n"
                                     f"{self.tail()}")
        self.child.close()
        assert self.child.exitstatus is not None, f"ended by signal {self.child.signalstatus}"
        return self.child.exitstatus

    def hang_up(self, timeout: float) -> int | None:
        """Close the terminal, as a window closed or an ssh session dropped would: the kernel hangs the
        command up (SIGHUP). Its exit status once it has ended; None if a signal ended it."""
        proc = self.child.ptyproc
        proc.fileobj.close()
        proc.fd, proc.closed = -1, True
        self.child.child_fd, self.child.closed = -1, True
        deadline = time.monotonic() + timeout
        while proc.isalive():
            if time.monotonic() > deadline:
                os.kill(proc.pid, signal.SIGKILL)
                raise AssertionError(f"the command outlived its terminal by {timeout:g} s")
            time.sleep(0.1)
        return proc.exitstatus

    def end(self, grace: float = 90.0) -> None:
        """If it still runs: SIGTERM by its pid, then SIGKILL by its pid after `grace` s. Then close."""
        if self.child.isalive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while self.read() and time.monotonic() < deadline:  # keep reading: a full terminal blocks its writes
                pass
            if self.child.isalive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.child.pid, signal.SIGKILL)
        self.child.close(force=True)


@contextlib.contextmanager
def terminal(argv: list[str], **kwargs) -> Iterator[Terminal]:
    term = Terminal(argv, **kwargs)
    try:
        yield term
    finally:
        term.end()


@contextlib.contextmanager
def unprivileged_home() -> Iterator[tuple[list[str], dict[str, str]]]:
    """(command prefix, environment) that run a command as `nobody`, with a HOME and TMPDIR of its own."""
    home = tempfile.mkdtemp(prefix="terminal-nobody-")
    try:
        os.chown(home, pwd.getpwnam(NOBODY[0]).pw_uid, grp.getgrnam(NOBODY[1]).gr_gid)
        prefix = ["setpriv", f"--reuid={NOBODY[0]}", f"--regid={NOBODY[1]}", "--clear-groups"]
        environ = {"PATH": f"{VENV_BIN}:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "TERM": "xterm",
                   "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        yield prefix, environ
    finally:
        shutil.rmtree(home, ignore_errors=True)
