"""The README keeps its promises: the two commands on the first screen, the wire format tables true to
the code, and `.ci/run` calling `make test`."""

from __future__ import annotations

import struct
from pathlib import Path

from transport.core.wire import ACK_FIELDS, DATA_FIELDS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_first_screen_shows_the_two_commands():
    first_screen = "\n".join(README.splitlines()[:40])
    assert "make demo" in first_screen and "make test" in first_screen


def test_wire_format_tables_match_the_code():
    for fields in (DATA_FIELDS, ACK_FIELDS):
        for name, code, desc in fields:
            assert f"| `{name}` | {struct.calcsize('!' + code) * 8} | {desc} |" in README, name


def test_ci_runs_make_test():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
