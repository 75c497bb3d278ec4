"""`fabriclab live` in a terminal on real fabrics (root), as the README and the labs tell a person to use
it: the terminal view with the README's and the labs' options and keys, Ctrl-C ending the browser
view's run, and either view's terminal closed under it. Each ends with nothing left on the machine."""

from __future__ import annotations

import re

import pytest

from labs.catalogue import find_lab
from tests.emulator_helpers import assert_no_leftovers, new_leftovers
from tests.labs.shell_blocks import blocks, commands
from tests.live.conftest import FLOWING, QUIT, ROWS, SERVING, link_row, press, status, wait_until_running
from tests.terminal import FABRICLAB, terminal

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(180)]


def lab_live_command(number: int) -> list[str]:
    """The `fabriclab live ...` step of lab `number`'s README, as argv for this venv."""
    lab = find_lab(number)
    found = [c for b in blocks(lab.path / "README.md") for c in commands(b.text) if c.startswith("fabriclab live")]
    assert len(found) == 1, f"lab {number} should have one `fabriclab live` step, has {found}"
    return [FABRICLAB, *found[0].split()[1:]]


def test_real_tui_as_the_readme_runs_it(tmp_path):
    """`sudo .venv/bin/fabriclab live --tui`: traffic's numbers on the screen, a key switches the real
    fabric, q tears it down."""
    with terminal([FABRICLAB, "live", "--tui"], cwd=tmp_path, rows=ROWS) as term:
        term.wait_for(status("ecmp", "single"), 90)
        term.wait_for(FLOWING, 60)
        press(term, "s", "done: routing mode spray", status("spray", "single"))
        term.send("q")
        assert term.exit_status(90) == 0
        assert QUIT in term.text
    assert_no_leftovers()


# What the labs say the terminal view's keys do, and what each shows.
CUT_AND_RESTORE = [("c1\r", "done: cut leaf1-spine1", link_row(1, "leaf1-spine1", "CUT")),
                   ("r1\r", "done: restore leaf1-spine1", link_row(1, "leaf1-spine1"))]
LAB_KEYS = {
    4: [*CUT_AND_RESTORE,
        ("l1\r100\r", "done: loss 100 % on leaf1-spine1", link_row(1, "leaf1-spine1", "loss 100%")),
        ("p", "done: path policy adaptive", status("spray", "adaptive"))],
    5: [*CUT_AND_RESTORE,
        ("l1\r20\r", "done: loss 20 % on leaf1-spine1", link_row(1, "leaf1-spine1", "loss 20%")),
        ("l1\r0\r", "done: loss 0 % on leaf1-spine1", link_row(1, "leaf1-spine1"))],
}


@pytest.mark.parametrize("lab", sorted(LAB_KEYS))
def test_lab_tui_keys_on_a_real_fabric(lab, tmp_path):
    """Labs 4 and 5: "`fabriclab live --tui` (same options)" with their keys for cut, restore, loss, policy."""
    text = find_lab(lab).path.joinpath("README.md").read_text()
    assert "`fabriclab live --tui`" in text and "`c N Enter`" in text and "`l N Enter P Enter`" in text
    with terminal([*lab_live_command(lab), "--tui"], cwd=tmp_path, rows=ROWS) as term:
        term.wait_for(FLOWING, 90)
        for keys, done, row in LAB_KEYS[lab]:
            press(term, keys, re.escape(done), row)
        term.send("q")
        assert term.exit_status(90) == 0
    assert_no_leftovers()


def test_ctrl_c_ends_the_browser_view_and_tears_down(tmp_path):
    """Lab 1's step 2: `fabriclab live --duration 300`, which "Ctrl-C ends sooner and tears the fabric
    down" (a free port instead of 8080, which may be taken here)."""
    with terminal([*lab_live_command(1), "--port", "0"], cwd=tmp_path) as term:
        wait_until_running(term.wait_for(SERVING, 60).group(1))
        term.send("\x03")
        assert term.exit_status(90) == 0
    assert_no_leftovers()


@pytest.mark.parametrize("view", [["--tui"], ["--port", "0"]], ids=["tui", "browser"])
def test_closing_the_terminal_tears_the_live_view_down(view, tmp_path):
    """Over ssh, the session can drop: the hangup (SIGHUP) stops the traffic and tears the fabric down."""
    with terminal([FABRICLAB, "live", "--topo", "leaf-spine:spines=2,leaves=2,hosts=2,rate=4", *view], cwd=tmp_path,
                  rows=ROWS) as term:
        if "--tui" in view:
            term.wait_for(FLOWING, 90)
        else:
            wait_until_running(term.wait_for(SERVING, 60).group(1))
        assert new_leftovers()["endpoints"]
        # It ends by itself, as on SIGTERM: the terminal view's last frame goes nowhere instead of failing.
        assert term.hang_up(90) == 0
    assert_no_leftovers()
