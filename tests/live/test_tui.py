"""The terminal view: keys become the same requests the page sends, and the screen shows the numbers."""

from __future__ import annotations

import asyncio

from rich.console import Console

from live import controls
from live.backend import FakeBackend
from live.session import LiveSession
from live.tui import KeyInput, numbered_links, render, run_tui, spark
from tests.live.conftest import SPEC, run
from topologies import parse_spec

TOPO = parse_spec(SPEC)
LINKS = numbered_links(TOPO)


def feed(keys: KeyInput, text: str):
    out = None
    for ch in text:
        out = keys.feed(ch)
    return out


def test_links_are_numbered_fabric_first():
    assert LINKS[0] == "leaf1-spine1" and LINKS[7] == "leaf4-spine2" and LINKS[8] == "h1-leaf1"
    assert sorted(LINKS) == sorted(lk.name for lk in TOPO.links)


def test_keys_become_requests():
    keys = KeyInput(LINKS)
    assert feed(keys, "e") == ("mode", {"mode": "ecmp"})
    assert feed(keys, "s") == ("mode", {"mode": "spray"})
    assert feed(keys, "1") == ("mode", {"mode": "single"})
    assert feed(keys, "p") == ("policy", {"policy": "spray"})
    keys.policy = "adaptive"
    assert feed(keys, "p") == ("policy", {"policy": "single"})
    assert feed(keys, "c1\r") == ("link", {"link": "leaf1-spine1", "up": False})
    assert feed(keys, "r2\n") == ("link", {"link": "leaf1-spine2", "up": True})
    assert feed(keys, "l3\r2.5\r") == ("loss", {"link": "leaf2-spine1", "loss_pct": 2.5})
    assert feed(keys, "q") == "quit"
    for kind, body in [("mode", {"mode": "spray"}), ("loss", {"link": "leaf2-spine1", "loss_pct": 2.5})]:
        controls.parse(kind, body, TOPO)  # what the keys produce is valid for the session


def test_prompts_edit_cancel_and_reject():
    keys = KeyInput(LINKS)
    assert feed(keys, "c") is None and keys.prompt == "cut link #"
    assert feed(keys, "12\x7f") is None and keys.buffer == "1"
    assert feed(keys, "\x1b") is None and keys.prompt == "" and keys.message == "cancelled"
    assert feed(keys, "c99\r") is None and "from 1 to 16" in keys.message
    assert feed(keys, "cx\r") is None and "no link 'x'" in keys.message
    assert feed(keys, "l1\rlots\r") is None and "not a number" in keys.message
    # Out of range goes through: controls.parse refuses it with the page's own message.
    kind, body = feed(keys, "l1\r150\r")
    try:
        controls.parse(kind, body, TOPO)
    except controls.ControlError as exc:
        assert exc.status == 400 and "outside 0-100" in str(exc)
    else:
        raise AssertionError("150 % was accepted")
    assert feed(keys, "z") is None and "unknown key" in keys.message


def test_spark():
    assert spark([]) == ""
    assert spark([0, 1, 2, 4]) == "▁▂▄█"


def screen(msg, keys=None, series=()) -> str:
    console = Console(record=True, width=150, color_system=None)
    console.print(render(msg, keys or KeyInput(LINKS), list(series)))
    return console.export_text()


def test_screen_shows_numbers_cuts_loss_and_faults():
    async def body():
        backend = FakeBackend(TOPO)
        session = LiveSession(backend)
        await session.start()
        backend.set_link_up("leaf1", "spine1", False)
        backend.set_loss("leaf2", "spine1", 3.0)
        session.state.set_loss("leaf2-spine1", 3.0)
        await session.sample_once()
        await asyncio.sleep(0.05)
        await session.sample_once()
        msg = session.snapshot()
        text = screen(msg, series=msg["series"])
        assert "[running] routing ecmp  policy single" in text
        assert "goodput" in text and "Mb/s" in text and "imbalance" in text
        assert "CUT" in text and "loss 3%" in text
        assert "uplinks and the flows" in text and "h1->" in text
        backend.kill_controller()
        await session.sample_once()
        assert "controller lost" in screen(session.snapshot())
        keys = KeyInput(LINKS)
        feed(keys, "c4")
        assert "cut link #: 4" in screen(session.snapshot(), keys)
        await session.close()

    run(body)


def test_run_tui_follows_the_session_and_tears_down():
    async def body():
        backend = FakeBackend(TOPO)
        session = LiveSession(backend, interval=0.05)
        stop = asyncio.Event()
        task = asyncio.create_task(run_tui(session, stop))
        for _ in range(200):
            if session.state.samples >= 3:
                break
            await asyncio.sleep(0.02)
        assert session.state.samples >= 3
        stop.set()
        assert await asyncio.wait_for(task, 5) == 0
        assert session.phase == "stopped" and backend._last is None

    run(body)
