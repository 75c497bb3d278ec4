"""The live view's HTTP API against the fake backend: controls work, every bad input is a 4xx that
changes nothing, cross-origin writes are refused, and faults show in the state."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestClient, TestServer

from live.backend import FakeBackend
from live.server import make_app, serve
from live.session import LiveSession
from tests.live.conftest import SPEC, run
from topologies import parse_spec

TOPO = parse_spec(SPEC)
JSON = {"Content-Type": "application/json"}


@contextlib.asynccontextmanager
async def live(backend: FakeBackend | None = None, start: bool = True, interval: float = 0.05,
               bind: str = "127.0.0.1"):
    backend = backend or FakeBackend(TOPO)
    session = LiveSession(backend, interval=interval)
    stop = asyncio.Event()
    client = TestClient(TestServer(make_app(session, bind)))
    await client.start_server()
    starter = asyncio.create_task(session.start()) if start else None
    sampler = asyncio.create_task(session.run(stop))
    try:
        if starter is not None and backend.startup_s == 0:
            await starter
            await wait_for(session, lambda s: s.state.samples >= 2)
        yield client, session, backend
    finally:
        stop.set()
        await session.close()
        if starter is not None:
            with contextlib.suppress(BaseException):
                await starter
        await sampler
        await client.close()


async def wait_for(session: LiveSession, pred, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred(session):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.02)


async def post(client: TestClient, kind: str, body: Any, headers: dict[str, str] | None = None):
    data = body if isinstance(body, str | bytes) else json.dumps(body)
    resp = await client.post(f"/api/{kind}", data=data, headers=headers or JSON)
    return resp.status, await resp.json()


def link(session: LiveSession, name: str) -> dict[str, Any]:
    return next(lk for lk in session.state.links_view() if lk["name"] == name)


# -- the page and its files ---------------------------------------------------------------------------


def test_page_static_files_and_topology():
    async def body():
        async with live() as (client, _session, _backend):
            resp = await client.get("/")
            assert resp.status == 200 and "text/html" in resp.headers["Content-Type"]
            assert "default-src 'self'" in resp.headers["Content-Security-Policy"]
            html = await resp.text()
            assert "/static/app.js" in html and "http" not in html.replace("http-equiv", "")
            for name in ("app.js", "style.css"):
                assert (await client.get(f"/static/{name}")).status == 200
            assert (await client.get("/static/../server.py")).status == 404
            assert (await client.get("/static/secret.txt")).status == 404
            topo = await (await client.get("/api/topology")).json()
            assert [t["name"] for t in topo["tiers"]] == ["spine", "leaf", "host"]

    run(body)


def test_state_has_links_metrics_placement_and_timestamps():
    async def body():
        async with live() as (client, _session, _backend):
            st = await (await client.get("/api/state")).json()
            assert st["phase"] == "running" and st["controller"] == "ok" and st["mode"] == "ecmp"
            assert len(st["links"]) == len(TOPO.links) and st["metrics"]["goodput_bps"] > 0
            assert st["t_sample"] <= st["t_server"] and st["t_counter"] is not None
            assert len(st["placement"]["flows"]) == len(TOPO.hosts)
            assert st["series"] and st["events"][0]["kind"] == "info"

    run(body)


# -- controls -----------------------------------------------------------------------------------------


def test_mode_switch_to_spray_lowers_the_imbalance():
    async def body():
        async with live() as (client, session, backend):
            before = session.state.metrics.imbalance
            assert await post(client, "policy", {"policy": "spray"}) == (
                200, {"ok": True, "applied": "path policy spray", "mode": "ecmp", "policy": "spray"})
            status, out = await post(client, "mode", {"mode": "spray"})
            assert status == 200 and out["mode"] == "spray"
            n = session.state.samples
            await wait_for(session, lambda s: s.state.samples >= n + 2)
            assert session.state.metrics.imbalance < before
            assert session.state.metrics.imbalance < 1.1 and session.state.metrics.hot == []
            kinds = [e.kind for e in session.state.events]
            assert kinds[-2:] == ["policy", "mode"]
            assert backend.calls == [("set_policy", ("spray",)), ("set_mode", ("spray",))]

    run(body)


def test_cut_and_restore_a_link():
    async def body():
        async with live(FakeBackend(TOPO, mode="spray", policy="spray")) as (client, session, _backend):
            assert link(session, "leaf1-spine1")["util_ab"] > 0.2
            status, out = await post(client, "link", {"link": "spine1-leaf1", "up": False})  # either order
            assert status == 200 and out["applied"] == "cut leaf1-spine1"
            n = session.state.samples
            await wait_for(session, lambda s: s.state.samples > n)
            cut = link(session, "leaf1-spine1")
            assert not cut["up"] and cut["util_ab"] == 0 and cut["util_ba"] == 0
            assert link(session, "leaf1-spine2")["util_ab"] > 0.9  # the traffic moved to the other uplink
            assert session.state.events[-1].kind == "link_down"
            status, _ = await post(client, "link", {"link": "leaf1-spine1", "up": True})
            assert status == 200
            n = session.state.samples
            await wait_for(session, lambda s: s.state.samples > n)
            assert link(session, "leaf1-spine1")["up"] and link(session, "leaf1-spine1")["util_ab"] > 0.2
            assert session.state.events[-1].kind == "link_up"

    run(body)


def test_loss_on_a_link():
    async def body():
        async with live(FakeBackend(TOPO, mode="spray", policy="spray")) as (client, session, backend):
            before = session.state.metrics.goodput_bps
            status, out = await post(client, "loss", {"link": "leaf1-spine1", "loss_pct": 2.5})
            assert status == 200 and out["applied"] == "loss 2.5 % on leaf1-spine1"
            n = session.state.samples
            await wait_for(session, lambda s: s.state.samples >= n + 2)
            assert link(session, "leaf1-spine1")["loss_pct"] == 2.5
            assert session.state.metrics.goodput_bps < before
            assert session.state.events[-1].kind == "loss"
            assert (await post(client, "loss", {"link": "leaf1-spine1", "loss_pct": 0}))[0] == 200
            assert link(session, "leaf1-spine1")["loss_pct"] == 0
            assert backend.calls[-1] == ("set_loss", ("leaf1", "spine1", 0.0))

    run(body)


BAD = [
    ("mode", {"mode": "flood"}, 400, "unknown mode"),
    ("mode", {"mode": "local"}, 400, "choose one of ecmp, spray, single"),
    ("mode", {}, 400, "unknown mode"),
    ("mode", ["spray"], 400, "JSON object"),
    ("policy", {"policy": "random"}, 400, "unknown policy"),
    ("link", {"link": "leaf1-spine9", "up": False}, 404, "no link"),
    ("link", {"link": "h1-h2", "up": False}, 404, "no link"),
    ("link", {"link": 7, "up": False}, 400, "by name"),
    ("link", {"link": "leaf1-spine1"}, 400, '"up"'),
    ("link", {"link": "leaf1-spine1", "up": "no"}, 400, '"up"'),
    ("loss", {"link": "leaf1-spine1", "loss_pct": -1}, 400, "outside 0-100"),
    ("loss", {"link": "leaf1-spine1", "loss_pct": 100.5}, 400, "outside 0-100"),
    ("loss", {"link": "leaf1-spine1", "loss_pct": "5"}, 400, "number"),
    ("loss", {"link": "leaf1-spine1", "loss_pct": True}, 400, "number"),
    ("loss", '{"link": "leaf1-spine1", "loss_pct": NaN}', 400, "number"),
    ("loss", {"link": "nowhere", "loss_pct": 1}, 404, "no link"),
    ("loss", "{not json", 400, "not valid JSON"),
    ("reboot", {}, 404, "no control"),
]


@pytest.mark.parametrize(("kind", "body", "status", "words"), BAD, ids=[f"{k}-{i}" for i, (k, *_) in enumerate(BAD)])
def test_bad_input_is_a_4xx_and_changes_nothing(kind, body, status, words):
    async def check():
        async with live() as (client, session, backend):
            events = session.state.last_event_id
            got, out = await post(client, kind, body)
            assert got == status and words in out["error"], out
            assert backend.calls == [] and session.state.last_event_id == events
            assert backend.mode == "ecmp" and backend.policy == "single"

    run(check)


def test_writes_need_json_and_the_same_origin():
    async def body():
        async with live() as (client, _session, backend):
            host = f"127.0.0.1:{client.port}"
            status, out = await post(client, "mode", {"mode": "spray"}, {**JSON, "Origin": "http://evil.example"})
            assert status == 403 and "cross-origin" in out["error"]
            other_port = {**JSON, "Origin": f"http://127.0.0.1:{client.port + 1}"}
            status, _ = await post(client, "mode", {"mode": "spray"}, other_port)
            assert status == 403
            status, _ = await post(client, "mode", {"mode": "spray"}, {**JSON, "Origin": "null"})
            assert status == 403
            status, out = await post(client, "mode", {"mode": "spray"}, {"Content-Type": "text/plain"})
            assert status == 415 and "application/json" in out["error"]
            # A DNS-rebinding page: its Host and Origin agree, but name no loopback address.
            rebound = {**JSON, "Host": f"evil.example:{client.port}", "Origin": f"http://evil.example:{client.port}"}
            assert (await post(client, "mode", {"mode": "spray"}, rebound))[0] == 403
            assert (await client.get("/api/state", headers={"Host": "evil.example"})).status == 403
            assert backend.calls == []
            status, _ = await post(client, "mode", {"mode": "spray"}, {**JSON, "Origin": f"http://{host}"})
            assert status == 200 and backend.calls == [("set_mode", ("spray",))]
            resp = await client.put("/api/mode", data='{"mode": "ecmp"}', headers=JSON)
            assert resp.status == 405 and "error" in await resp.json()

    run(body)


def test_a_host_header_that_is_no_host_and_a_deeply_nested_body_are_400s():
    async def body():
        async with live() as (client, _session, backend):
            for bad in ("[", "[::1", "127.0.0.1:port"):
                resp = await client.get("/api/state", headers={"Host": bad})
                assert resp.status == 400 and "Host header" in (await resp.json())["error"], bad
            # Well under the 64 KiB body cap, deep enough for json's recursion limit.
            status, out = await post(client, "mode", "[" * 30_000 + "]" * 30_000)
            assert status == 400 and "not valid JSON" in out["error"]
            assert backend.calls == []

    run(body)


def test_a_wildcard_bind_accepts_only_this_machines_names_and_addresses():
    import socket

    async def body():
        async with live(bind="0.0.0.0") as (client, _session, backend):
            port = client.port

            async def status(host: str) -> int:
                return (await client.get("/api/state", headers={"Host": host})).status

            own = [f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", f"0.0.0.0:{port}",
                   f"{socket.gethostname()}:{port}", socket.getfqdn().upper()]
            assert [await status(h) for h in own] == [200] * len(own)
            # A DNS-rebinding page names its own domain; 192.0.2.1 (TEST-NET-1) is no address of ours.
            for foreign in (f"evil.example:{port}", "evil.example", f"192.0.2.1:{port}", "224.0.0.1"):
                assert await status(foreign) == 403, foreign
            rebound = {**JSON, "Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
            assert (await post(client, "mode", {"mode": "spray"}, rebound))[0] == 403
            assert backend.calls == []
            mine = {**JSON, "Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"}
            assert (await post(client, "mode", {"mode": "spray"}, mine))[0] == 200

    run(body)


def test_controls_while_the_fabric_comes_up_are_refused():
    async def body():
        backend = FakeBackend(TOPO, startup_s=0.6)
        async with live(backend) as (client, session, _backend):
            assert session.phase == "starting"
            status, out = await post(client, "mode", {"mode": "spray"})
            assert status == 409 and "still coming up" in out["error"]
            assert backend.calls == []
            st = await (await client.get("/api/state")).json()
            assert st["phase"] == "starting" and st["metrics"] is None
            await wait_for(session, lambda s: s.phase == "running")
            assert (await post(client, "mode", {"mode": "spray"}))[0] == 200

    run(body)


class FailingBackend(FakeBackend):
    def set_mode(self, mode: str) -> None:
        raise RuntimeError("controller PUT /mode: HTTP 504 switches did not confirm")


def test_a_control_the_fabric_rejects_is_reported_and_nothing_is_recorded():
    async def body():
        async with live(FailingBackend(TOPO)) as (client, session, _backend):
            events = session.state.last_event_id
            status, out = await post(client, "mode", {"mode": "spray"})
            assert status == 502 and "did not confirm" in out["error"]
            assert session.state.last_event_id == events

    run(body)


# -- faults -------------------------------------------------------------------------------------------


def test_controller_lost_keeps_the_last_numbers():
    async def body():
        async with live() as (client, session, backend):
            before = session.state.links_view()
            backend.kill_controller()
            await wait_for(session, lambda s: s.controller == "lost")
            st = await (await client.get("/api/state")).json()
            assert st["controller"] == "lost" and "does not answer" in st["controller_detail"]
            assert st["links"] == before and st["metrics"]["goodput_bps"] > 0
            assert session.state.events[-1].kind == "controller"
            backend.revive_controller()
            await wait_for(session, lambda s: s.controller == "ok")
            assert "again" in session.state.events[-1].text

    run(body)


def test_workload_death_shows():
    async def body():
        async with live() as (client, session, backend):
            backend.kill_workload("h1", "exit code 1: connection refused")
            await wait_for(session, lambda s: s.workload["alive"] < s.workload["processes"])
            st = await (await client.get("/api/state")).json()
            assert st["workload"]["exited"] == ["sender on h1 exited: exit code 1: connection refused"]
            assert [e.kind for e in session.state.events].count("workload") == 1  # reported once

    run(body)


def test_stream_sends_a_snapshot_then_updates():
    async def body():
        async with live() as (client, session, _backend):
            resp = await client.get("/api/stream")
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            msgs = []
            while len(msgs) < 3:
                line = (await resp.content.readline()).decode()
                if line.startswith("data: "):
                    msgs.append(json.loads(line[6:]))
            assert msgs[0]["type"] == "snapshot" and "series" in msgs[0]
            assert all(m["type"] == "update" for m in msgs[1:])
            assert msgs[2]["seq"] > msgs[1]["seq"] and msgs[2]["t_server"] >= msgs[2]["t_sample"]
            assert session.subscribers == 1
            resp.close()

    run(body)


def test_serve_listens_on_loopback_and_tears_down_on_stop():
    async def body():
        backend = FakeBackend(TOPO)
        session = LiveSession(backend, interval=0.05)
        stop = asyncio.Event()
        urls: list[str] = []
        task = asyncio.create_task(serve(session, "127.0.0.1", 0, stop, urls.append))
        while not urls:
            await asyncio.sleep(0.01)
        async with ClientSession() as http:
            for _ in range(100):
                st = await (await http.get(urls[0] + "api/state")).json()
                if st["phase"] == "running":
                    break
                await asyncio.sleep(0.02)
            assert st["phase"] == "running" and urls[0].startswith("http://127.0.0.1:")
            stream = await http.get(urls[0] + "api/stream")
            await stream.content.readline()
            stop.set()
            await asyncio.wait_for(task, 5)
            rest = await stream.content.read()
            assert b"event: end" in rest  # the page is told the view stopped
        assert session.phase == "stopped" and backend._last is None  # the backend was torn down

    run(body)


def test_serve_refuses_a_busy_port():
    async def body():
        session = LiveSession(FakeBackend(TOPO))
        first = asyncio.Event()
        urls: list[str] = []
        task = asyncio.create_task(serve(session, "127.0.0.1", 0, first, urls.append))
        while not urls:
            await asyncio.sleep(0.01)
        port = int(urls[0].rsplit(":", 1)[1].strip("/"))
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
            await serve(LiveSession(FakeBackend(TOPO)), "127.0.0.1", port, asyncio.Event())
        first.set()
        await task

    run(body)
