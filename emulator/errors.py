"""Errors of the emulator that a user can act on; the CLI prints them as one line."""

from __future__ import annotations


class EmulatorError(RuntimeError):
    """Bringing up, driving or tearing down the emulated fabric failed; the message says how to fix it."""
