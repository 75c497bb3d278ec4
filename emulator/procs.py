"""What /proc says of a process: whether it still runs (a zombie does not), its state, when it started.

A leaf module (the standard library only), so that the run records (emulator.state), the CPU ledger
(emulator.cpu) and the switch daemons' stop (emulator.ovs_daemons) share one reader of /proc/PID/stat.
"""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int | None, start: int | None = None) -> bool:
    """Whether `pid` is a running process (and, given its `start` as process_start read it, still the
    process that started then). A zombie (it has exited, and its parent has not reaped it yet) counts as
    gone: it holds nothing, and a run killed by a parent that has not yet waited for it (a script's
    Popen, a shell between prompts) must not keep `clean` from tearing the run down."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = proc_stat_fields(pid)
    if fields is None:  # no /proc to tell: the signal's answer stands
        return True
    if not fields or fields[0] in ("Z", "X"):
        return False
    return start is None or _start_of(fields) in (None, start)


def proc_stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name ([0] the state, [11] and [12] user and system CPU
    ticks, [19] the start time); [] once the process is gone, None where /proc cannot tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return []
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def process_state(pid: int) -> str | None:
    """The state letter of `pid` (R, S, D, Z for a zombie, ...); "" once it is gone, None where /proc
    cannot tell."""
    fields = proc_stat_fields(pid)
    return None if fields is None else (fields[0] if fields else "")


def process_start(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (/proc/PID/stat's starttime); None if it cannot tell."""
    return _start_of(proc_stat_fields(pid) or [])


def _start_of(fields: list[str]) -> int | None:
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None
