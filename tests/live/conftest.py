"""Helpers for the live view's tests: a fake-backed server on 127.0.0.1 and a way to run coroutines."""

from __future__ import annotations

import asyncio
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
