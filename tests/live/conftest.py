"""Helpers for the live view's tests: a fake-backed server on 127.0.0.1, a way to run coroutines, and
what the terminal view shows (for the tests that drive it through a pseudo-terminal)."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from topologies import parse_spec

SPEC = "leaf-spine:spines=2,leaves=4,hosts=2,rate=10"


@pytest.fixture
def topo():
    return parse_spec(SPEC)


def run(coro_fn: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run an async test body in a fresh event loop (no asyncio plugin needed)."""
    return asyncio.run(coro_fn())


# The terminal view in a pseudo-terminal: rows for the whole screen of a 2x4x2 fabric (status, numbers,
# 16 links, uplinks, events, keys), and what it shows.
ROWS = 70
NUMBERS = r"^goodput +\d+\.\d Mb/s.*\n^imbalance +\d+\.\d\d"
FLOWING = r"^goodput +(?!0\.0 )\d+\.\d Mb/s"  # traffic's numbers, above zero
QUIT = "stopping the traffic and tearing the fabric down"
SERVING = r"live view on (http://127\.0\.0\.1:\d+/)"


def status(mode: str, policy: str) -> str:
    return rf"\[running\] routing {mode}  policy {policy} "


def link_row(n: int, name: str, note: str = "") -> str:
    """Row n of the links table, its note column ending with `note` (nothing: no note at all)."""
    return rf"^{n} +│ {re.escape(name)} +│[^│\n]+%[^│\n]*│[^│\n]+%[^│\n]*│ *{re.escape(note)} *$"


def press(term: Any, keys: str, *shown: str, timeout: float = 60) -> None:
    """Type `keys` on a tests.terminal.Terminal; each pattern of `shown` must then appear on the screen."""
    since = len(term.text)
    term.send(keys)
    for pattern in shown:
        term.wait_for(pattern, timeout, since=since)


def wait_until_running(url: str, timeout: float = 90) -> None:
    """Ask the page's own question until the answer is yes: is the traffic running?"""
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(url + "api/state", timeout=10) as resp:
            if json.loads(resp.read()).get("phase") == "running":
                return
        assert time.monotonic() < deadline, "the traffic did not start"
        time.sleep(0.5)
