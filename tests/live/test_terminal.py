"""`fabriclab live --tui --fake` in a terminal, as the README and docs/live.md tell a person to try it:
the numbers on the screen, the keys s and p switching, q quitting; as the caller and as an unprivileged
user. The real fabric's terminal runs are in test_terminal_root.py."""

from __future__ import annotations

import pwd
from pathlib import Path

import pytest

from tests.live.conftest import NUMBERS, QUIT, ROWS, link_row, press, status
from tests.terminal import FABRICLAB, NOBODY, Terminal, terminal, unprivileged_home
from tests.test_readme import README, ROOT

LIVE_DOC = (ROOT / "docs" / "live.md").read_text()


def drive_the_fake_tui(term: Terminal) -> None:
    """The docs' keys on the fake backend: numbers shown, s and p switch, q quits."""
    term.wait_for(status("ecmp", "single"), 30)
    term.wait_for(NUMBERS, 30)
    term.wait_for(link_row(1, "leaf1-spine1"), 30)
    press(term, "s", "done: routing mode spray", status("spray", "single"))
    press(term, "p", "done: path policy spray", status("spray", "spray"))
    term.send("q")
    assert term.exit_status(30) == 0
    assert QUIT in term.text


@pytest.mark.timeout(120)
def test_fake_tui_keys_in_a_terminal(tmp_path):
    for line in (".venv/bin/fabriclab live --fake", "sudo .venv/bin/fabriclab live --tui"):
        assert line in README and line in LIVE_DOC
    assert "| `e` / `s` / `1` | routing mode ecmp / spray / single |" in LIVE_DOC
    with terminal([FABRICLAB, "live", "--tui", "--fake"], cwd=tmp_path, rows=ROWS) as term:
        drive_the_fake_tui(term)


@pytest.mark.root
@pytest.mark.timeout(120)
def test_fake_tui_keys_as_an_unprivileged_user():
    """`--fake` needs no root: run it as nobody (root only switches to it), in a terminal of its own."""
    with unprivileged_home() as (prefix, environ), \
            terminal([*prefix, FABRICLAB, "live", "--tui", "--fake"], cwd=environ["HOME"], environ=environ,
                     rows=ROWS) as term:
        term.wait_for(status("ecmp", "single"), 30)
        uid = Path(f"/proc/{term.child.pid}/status").read_text().split("Uid:")[1].split()[0]
        assert int(uid) == pwd.getpwnam(NOBODY[0]).pw_uid
        drive_the_fake_tui(term)
        assert "Permission denied" not in term.text and "Traceback" not in term.text
