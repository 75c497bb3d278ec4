"""The live view in a terminal (rich.Live), for machines reached over ssh only.

The same session as the page, the same numbers, the same switches on keys:

    e / s / 1     routing mode ecmp / spray / single
    p             next path policy (single -> spray -> adaptive; restarts the senders)
    c N Enter     cut link N          r N Enter   restore link N
    l N Enter P Enter                 loss P % on link N (0 turns it off)
    Esc           cancel a prompt     q           quit (tears the fabric down)

Links are numbered as listed: switch-to-switch links first, then host links.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from emulator.network import detach_from_terminal
from experiments.analysis.links import fabric_hops
from live import controls
from live.controls import ControlError
from live.session import LiveSession
from topologies import Topology

SPARK = "▁▂▃▄▅▆▇█"
BAR_WIDTH = 20


def numbered_links(topo: Topology) -> list[str]:
    """Link names in the order the terminal numbers them (1-based): fabric links, then host links."""
    fabric = fabric_hops(topo)
    names = [lk.name for lk in topo.links]
    return [n for n in names if n in fabric] + [n for n in names if n not in fabric]


@dataclass
class KeyInput:
    """Keys -> control requests. `feed` returns (kind, body) as the page would POST to /api/<kind>,
    "quit", or None (more keys needed, or nothing to do). Requests are checked by controls.parse, the
    same rules and messages as for the page."""

    links: list[str]
    policy: str = "single"
    policies: tuple[str, ...] = controls.POLICIES
    prompt: str = ""
    buffer: str = ""
    message: str = ""
    _pending: dict[str, Any] = field(default_factory=dict)

    def feed(self, ch: str) -> tuple[str, dict[str, Any]] | str | None:
        if self.prompt:
            return self._prompt_key(ch)
        self.message = ""
        if ch == "q":
            return "quit"
        if ch in ("e", "s", "1"):
            return "mode", {"mode": {"e": "ecmp", "s": "spray", "1": "single"}[ch]}
        if ch == "p":
            i = self.policies.index(self.policy) if self.policy in self.policies else -1
            nxt = self.policies[(i + 1) % len(self.policies)]
            return "policy", {"policy": nxt}
        if ch in ("c", "r", "l"):
            self._pending = {"key": ch}
            self.prompt = {"c": "cut link #", "r": "restore link #", "l": "loss on link #"}[ch]
            self.buffer = ""
            return None
        if ch.strip():
            self.message = f"unknown key {ch!r}: e s 1 mode, p policy, c/r/l link, q quit"
        return None

    def _prompt_key(self, ch: str) -> tuple[str, dict[str, Any]] | None:
        if ch == "\x1b":
            self.prompt = self.buffer = ""
            self.message = "cancelled"
            return None
        if ch in ("\x7f", "\b"):
            self.buffer = self.buffer[:-1]
            return None
        if ch not in ("\r", "\n"):
            if ch.isprintable():
                self.buffer += ch
            return None
        text, self.buffer = self.buffer.strip(), ""
        key = self._pending.get("key")
        if "link" not in self._pending:
            try:
                n = int(text)
                if not 1 <= n <= len(self.links):
                    raise ValueError
            except ValueError:
                self.prompt = ""
                self.message = f"no link {text!r}: give a number from 1 to {len(self.links)}"
                return None
            self._pending["link"] = self.links[n - 1]
            if key == "l":
                self.prompt = f"loss % on {self.links[n - 1]}"
                return None
            self.prompt = ""
            return "link", {"link": self.links[n - 1], "up": key == "r"}
        self.prompt = ""
        try:
            pct = float(text)
        except ValueError:
            self.message = f"loss {text!r} is not a number of percent"
            return None
        return "loss", {"link": self._pending["link"], "loss_pct": pct}


def _bar(u: float, hot: bool) -> Text:
    filled = min(BAR_WIDTH, round(BAR_WIDTH * min(u, 1.0)))
    style = "red" if u >= 0.75 else "yellow" if u >= 0.4 else "green"
    t = Text("█" * filled, style="bold " + style if hot else style)
    t.append("·" * (BAR_WIDTH - filled), style="grey50")
    t.append(f" {100 * u:4.0f}%")
    if hot:
        t.append(" hot", style="bold red")
    return t


def spark(values: list[float], width: int = 40) -> str:
    vals = values[-width:]
    if not vals:
        return ""
    top = max(vals) or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, int(v / top * (len(SPARK) - 1)))] for v in vals)


def render(msg: dict[str, Any], keys: KeyInput, series: list[dict[str, float]]) -> Group:
    """One screen from one session message (the same dict the page gets)."""
    head = Text(f"fabriclab live  {msg.get('topology', '')}  ", style="bold")
    phase = msg.get("phase", "?")
    head.append(f"[{phase}] ", style="green" if phase == "running" else "yellow")
    head.append(f"routing {msg.get('mode')}  policy {msg.get('policy')}  ")
    ctl = msg.get("controller")
    head.append("controller lost — last numbers shown " if ctl == "lost" else f"controller {ctl} ",
                style="bold red" if ctl == "lost" else "")
    wl = msg.get("workload") or {}
    dead = wl.get("processes", 0) - wl.get("alive", 0)
    head.append(f"{wl.get('kind', '')} {wl.get('alive', 0)}/{wl.get('processes', 0)} processes",
                style="bold red" if dead > 0 and phase == "running" else "")
    parts: list[Any] = [head]
    if msg.get("error"):
        parts.append(Text(f"failed: {msg['error']}", style="bold red"))
    m = msg.get("metrics")
    if m:
        mt = Table.grid(padding=(0, 2))
        mt.add_row("goodput", f"{m['goodput_bps'] / 1e6:7.1f} Mb/s", spark([p["goodput_bps"] for p in series]))
        mt.add_row("imbalance", f"{m['imbalance']:7.2f}", spark([p["imbalance"] for p in series]))
        mt.add_row("hot links", f"{m['hot_count']:7d}", ", ".join(h["label"] for h in m["hot"])[:90])
        parts.append(mt)
    links = {lk["name"]: lk for lk in msg.get("links", [])}
    table = Table(title="links (a→b / b→a)", expand=False, pad_edge=False, show_edge=False)
    for col in ("#", "link", "a → b", "b → a", ""):
        table.add_column(col)
    for i, name in enumerate(keys.links, 1):
        lk = links.get(name)
        if lk is None:
            continue
        note = Text("CUT", style="bold red") if not lk["up"] else Text("")
        if lk.get("loss_pct"):
            note.append(f" loss {lk['loss_pct']:g}%", style="yellow")
        table.add_row(str(i), name, _bar(lk["util_ab"], lk["hot_ab"]), _bar(lk["util_ba"], lk["hot_ba"]), note)
    parts.append(table)
    placement = (msg.get("placement") or {}).get("uplinks", [])
    if placement:
        pt = Table(title="uplinks and the flows the counters put on them (inferred)", show_edge=False)
        for col in ("uplink", "util", "flows"):
            pt.add_column(col)
        for r in placement:
            flows = ", ".join(r["flows"]) or "—"
            if r["ambiguous"]:
                flows += " (could be elsewhere)"
            pt.add_row(r["label"], f"{100 * r['util']:.0f}%", flows)
        parts.append(pt)
    events = msg.get("_events", [])
    if events:
        et = Text("events:\n", style="bold")
        for ev in events[-6:]:
            et.append(f"  {time.strftime('%H:%M:%S', time.localtime(ev['t']))} {ev['kind']}: {ev['text']}\n")
        parts.append(et)
    foot = Text("keys: e/s/1 routing  p policy  c N⏎ cut  r N⏎ restore  l N⏎ P⏎ loss  q quit", style="dim")
    if keys.prompt:
        foot = Text(f"{keys.prompt}: {keys.buffer}█", style="bold cyan")
    parts.append(foot)
    if keys.message:
        parts.append(Text(keys.message, style="yellow"))
    return Group(*parts)


async def run_tui(session: LiveSession, stop: asyncio.Event) -> int:
    console = Console()
    keys = KeyInput(numbered_links(session.topology), policy=session.backend.policy, policies=session.policies)
    series: list[dict[str, float]] = []
    events: dict[int, dict[str, Any]] = {}
    last: dict[str, Any] = session.snapshot()
    series.extend(last.get("series", []))
    for ev in last.get("events", []):
        events[ev["id"]] = ev
    loop = asyncio.get_running_loop()
    live = Live(console=console, screen=True, auto_refresh=False, transient=False)

    def redraw() -> None:
        last["_events"] = sorted(events.values(), key=lambda e: e["id"])
        keys.policy = last.get("policy", keys.policy)
        live.update(render(last, keys, series), refresh=True)

    def on_message(msg: dict[str, Any]) -> None:
        nonlocal last
        if "point" in msg:
            series.append(msg["point"])
            del series[:-120]
        for ev in msg.get("events", []):
            events[ev["id"]] = ev
        last = msg
        redraw()

    tasks: set[asyncio.Task] = set()

    async def apply(kind: str, body: dict[str, Any]) -> None:
        try:
            c = controls.parse(kind, body, session.topology, session.policies)
            keys.message = f"applying {c.describe()}…"
            redraw()
            await session.control(c)
            keys.message = f"done: {c.describe()}"
        except ControlError as exc:
            keys.message = str(exc)
        redraw()

    def on_key() -> None:
        # Read the bytes themselves: sys.stdin's buffer would swallow keys the reader is not told about.
        try:
            data = os.read(sys.stdin.fileno(), 1024).decode(errors="replace")
        except OSError:  # EIO: the terminal was hung up
            data = ""
        if not data:  # the terminal went away (its hangup may not have been handled yet)
            loop.remove_reader(sys.stdin.fileno())
            detach_from_terminal()
            stop.set()
            return
        for ch in data:
            out = keys.feed(ch)
            if out == "quit":
                stop.set()
            elif isinstance(out, tuple):
                task = asyncio.ensure_future(apply(*out))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        redraw()

    session.listen(on_message)
    restore = _cbreak(sys.stdin)
    if restore is not None:
        loop.add_reader(sys.stdin.fileno(), on_key)
    starter = asyncio.create_task(session.start())
    sampler = asyncio.create_task(session.run(stop))
    failed: BaseException | None = None
    try:
        with live:
            redraw()
            waiter = asyncio.create_task(stop.wait())
            done, _ = await asyncio.wait({starter, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if starter in done and starter.exception() is not None:
                failed = starter.exception()
                stop.set()
            await stop.wait()
            waiter.cancel()
    finally:
        if restore is not None:
            loop.remove_reader(sys.stdin.fileno())
            restore()
        with contextlib.suppress(OSError):  # a terminal that went away takes no more output
            console.print("stopping the traffic and tearing the fabric down…")
        await session.close()
        if not starter.done():
            with contextlib.suppress(BaseException):
                await starter
        sampler.cancel()
        with contextlib.suppress(BaseException):
            await sampler
    if failed is not None:
        raise failed
    return 0


def _cbreak(stream: Any):
    """Keys without Enter and without echo; returns the function that restores the terminal."""
    if not stream.isatty():
        return None
    import termios
    import tty

    fd = stream.fileno()
    old = termios.tcgetattr(fd)
    tty.setcbreak(fd)

    def restore() -> None:
        with contextlib.suppress(termios.error, OSError):  # nothing to restore on a terminal that went away
            termios.tcsetattr(fd, termios.TCSADRAIN, old)

    return restore
