"""One live view of one fabric: samples it, keeps the state, applies controls, pushes updates.

The page (server.py) and the terminal (tui.py) are two faces of a `LiveSession`. It runs in an
asyncio loop; every backend call blocks, so it goes to a worker thread: bring-up, controls and
teardown to one dedicated thread (Mininet's objects are not thread-safe, and a teardown queued behind
a bring-up in progress then simply waits for it), counter reads to another so that a slow control
never stalls the view. Controls are applied one at a time.

Every pushed message carries server-side timestamps: `t_counter` (the controller's time in its
`GET /links` answer), `t_sample` (when that answer arrived here) and `t_server` (when the message
left), so a client can tell how old the numbers it shows are.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from live.backend import Backend
from live.controls import POLICIES, Control, ControlError
from live.layout import layout
from live.state import LiveState

log = logging.getLogger(__name__)

SAMPLE_INTERVAL = 0.5  # the controller polls port counters every 0.5 s; sampling faster shows nothing new
QUEUE_DEPTH = 8  # messages a slow client may fall behind before it loses the oldest


class LiveSession:
    def __init__(self, backend: Backend, interval: float = SAMPLE_INTERVAL) -> None:
        self.backend = backend
        self.topology = backend.topology
        self.interval = interval
        self.state = LiveState(self.topology, backend.flows())
        self.phase = "starting"  # starting, running, failed, stopping, stopped
        self.error: str | None = None
        self.controller = "waiting"  # waiting, ok, lost
        self.controller_detail = ""
        # The built-in policies, and the user's own when the view started with --path-policy.
        self.policies = POLICIES if backend.policy in POLICIES else (*POLICIES, backend.policy)
        self.workload: dict[str, Any] = {"kind": backend.workload, "policy": backend.policy, "processes": 0,
                                         "alive": 0, "exited": []}
        self.seq = 0
        self.t_counter: float | None = None
        self.layout = layout(self.topology)
        self._fabric = ThreadPoolExecutor(1, thread_name_prefix="live-fabric")
        self._poll = ThreadPoolExecutor(1, thread_name_prefix="live-poll")
        self._queues: set[asyncio.Queue[str | None]] = set()
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        self._lock: asyncio.Lock | None = None
        self._wake: asyncio.Event | None = None
        self._pushed_event = 0
        self._new_point = False

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Bring the fabric up and start the workload (in the fabric thread)."""
        loop = asyncio.get_running_loop()
        self.publish()
        try:
            await loop.run_in_executor(self._fabric, self.backend.start)
        except Exception as exc:
            self.phase, self.error = "failed", str(exc)
            self.event("info", f"the fabric failed to come up: {exc}")
            self.publish()
            raise
        if self.phase != "starting":  # stopped while coming up
            return
        self.phase = "running"
        self.state.set_flows(self.backend.flows())
        self.event("info", f"fabric up: routing {self.backend.mode}, policy {self.backend.policy}, "
                           f"{self.backend.workload} traffic on {len(self.backend.flows())} flows")
        self.publish()

    async def run(self, stop: asyncio.Event) -> None:
        """Sample every `interval` seconds until `stop` is set."""
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        while not stop.is_set():
            due = loop.time() + self.interval
            self._wake.clear()
            if self.phase == "running":
                await self.sample_once()
            waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(self._wake.wait())]
            _, pending = await asyncio.wait(waiters, timeout=max(0.0, due - loop.time()),
                                            return_when=asyncio.FIRST_COMPLETED)
            for w in pending:
                w.cancel()

    async def sample_once(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            sample = await loop.run_in_executor(self._poll, self.backend.links)
        except Exception as exc:  # whatever the cause, the view keeps its last numbers
            if self.controller != "lost":
                self.event("controller", f"controller lost: {exc}")
                log.warning("controller lost: %s", exc)
            self.controller, self.controller_detail = "lost", str(exc)
        else:
            now = time.time()
            self.state.one_path_per_flow = self.backend.policy == "single"
            if self.controller == "lost":
                self.event("controller", "controller answers again")
            self.controller, self.controller_detail = "ok", ""
            self.t_counter = sample.get("time")
            self.state.update(sample, now)
            self._new_point = True
        try:
            wl = await loop.run_in_executor(self._poll, self.backend.workload_status)
        except Exception as exc:
            log.warning("workload status: %s", exc)
        else:
            for text in wl.get("new_exits", []):
                self.event("workload", text)
            self.workload = {k: v for k, v in wl.items() if k != "new_exits"}
        self.publish()

    async def close(self) -> None:
        """Tear down (after a bring-up still in progress) and end every stream."""
        if self.phase in ("stopping", "stopped"):
            return
        self.phase = "stopping"
        self.publish()
        for q in list(self._queues):
            self._put(q, None)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._fabric, self.backend.stop)
        finally:
            self.phase = "stopped"
            self._fabric.shutdown(wait=False)
            self._poll.shutdown(wait=False)

    # -- controls ----------------------------------------------------------------------------------
    async def control(self, c: Control) -> dict[str, Any]:
        """Apply one control; ControlError (4xx/5xx) when it cannot be, and then nothing changed."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        self._check_phase()
        async with self._lock:
            self._check_phase()
            call, kind, text = self._plan(c)
            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(self._fabric, call)
            except Exception as exc:
                log.warning("%s failed: %s", c.describe(), exc)
                raise ControlError(502, f"{c.describe()} failed: {exc}") from None
            if c.kind == "loss":
                assert c.link is not None and c.loss_pct is not None
                self.state.set_loss(c.link, c.loss_pct)
            self.event(kind, text)
            self.publish()
            if self._wake is not None:  # read the counters now rather than at the next tick
                self._wake.set()
        return {"ok": True, "applied": c.describe(), "mode": self.backend.mode, "policy": self.backend.policy}

    def _check_phase(self) -> None:
        if self.phase == "starting":
            raise ControlError(409, "the fabric is still coming up; try again in a moment")
        if self.phase == "failed":
            raise ControlError(409, f"the fabric failed to come up: {self.error}")
        if self.phase != "running":
            raise ControlError(409, "the live view is shutting down")

    def _plan(self, c: Control) -> tuple[Callable[[], None], str, str]:
        b = self.backend
        if c.kind == "mode":
            assert c.mode is not None
            mode = c.mode
            return (lambda: b.set_mode(mode)), "mode", f"routing mode {b.mode} -> {mode}"
        if c.kind == "policy":
            assert c.policy is not None
            policy = c.policy
            return (lambda: b.set_policy(policy)), "policy", f"path policy {b.policy} -> {policy} (senders restarted)"
        assert c.link is not None
        lk = next(lk for lk in self.topology.links if lk.name == c.link)
        if c.kind == "link":
            up = bool(c.up)
            return ((lambda: b.set_link_up(lk.a, lk.b, up)), "link_up" if up else "link_down",
                    f"{'restored' if up else 'cut'} {lk.name}")
        pct = float(c.loss_pct or 0.0)
        text = f"loss {pct:g} % on {lk.name}" if pct > 0 else f"loss off on {lk.name}"
        return (lambda: b.set_loss(lk.a, lk.b, pct)), "loss", text

    # -- output ------------------------------------------------------------------------------------
    def event(self, kind: str, text: str) -> None:
        self.state.add_event(kind, text, time.time())

    def status(self) -> dict[str, Any]:
        return {
            "seq": self.seq, "t_server": time.time(), "t_sample": self.state.last_sample_t,
            "t_counter": self.t_counter, "phase": self.phase, "error": self.error,
            "controller": self.controller, "controller_detail": self.controller_detail,
            "workload": self.workload, "mode": self.backend.mode, "policy": self.backend.policy,
            "policies": list(self.policies),
            "topology": self.topology.name, "interval": self.interval,
        }

    def snapshot(self) -> dict[str, Any]:
        return {"type": "snapshot", **self.status(), **self.state.snapshot()}

    def _update(self) -> dict[str, Any]:
        msg = {"type": "update", **self.status(), **self.state.view(),
               "events": self.state.events_after(self._pushed_event)}
        if self._new_point and self.state.series:
            msg["point"] = self.state.series[-1]
        return msg

    def publish(self) -> None:
        self.seq += 1
        msg = self._update()
        self._new_point = False
        self._pushed_event = self.state.last_event_id
        text = json.dumps(msg, separators=(",", ":"))
        for q in list(self._queues):
            self._put(q, text)
        for fn in list(self._listeners):
            try:
                fn(msg)
            except Exception:
                log.exception("live view listener failed")

    @staticmethod
    def _put(q: asyncio.Queue[str | None], item: str | None) -> None:
        if q.full():  # a slow client loses the oldest message, never the newest
            with contextlib.suppress(asyncio.QueueEmpty):
                q.get_nowait()
        q.put_nowait(item)

    def subscribe(self) -> asyncio.Queue[str | None]:
        """A queue of JSON messages: a full snapshot first, then every update; None = the end."""
        q: asyncio.Queue[str | None] = asyncio.Queue(maxsize=QUEUE_DEPTH)
        q.put_nowait(json.dumps(self.snapshot(), separators=(",", ":")))
        if self.phase in ("stopping", "stopped"):
            q.put_nowait(None)
        self._queues.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[str | None]) -> None:
        self._queues.discard(q)

    def listen(self, fn: Callable[[dict[str, Any]], None]) -> None:
        """Call fn with every update message (a dict), in the loop's thread."""
        self._listeners.append(fn)

    @property
    def subscribers(self) -> int:
        return len(self._queues)
