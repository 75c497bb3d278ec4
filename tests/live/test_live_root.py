"""The live view's API against a real fabric (root: Mininet, Open vSwitch, the controller, the transport's
endpoints in the hosts): mode switch, policy switch, cut, restore, loss, bad input, a dying controller,
the all-reduce workload, and nothing left behind."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer

from live.backend import FabricBackend
from live.server import make_app
from live.session import LiveSession
from tests.emulator_helpers import assert_no_leftovers, new_leftovers
from tests.live.conftest import SPEC, run
from topologies import parse_spec

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(300)]

JSON = {"Content-Type": "application/json"}
FABRICLAB = [sys.executable, "-m", "cli"]


@contextlib.asynccontextmanager
async def real(workload: str = "permutation"):
    backend = FabricBackend(parse_spec(SPEC), workload=workload)
    session = LiveSession(backend)
    stop = asyncio.Event()
    client = TestClient(TestServer(make_app(session)))
    await client.start_server()
    sampler = asyncio.create_task(session.run(stop))
    pids: list[int] = []
    try:
        await session.start()
        assert backend.traffic is not None
        pids = [p.popen.pid for p in backend.traffic.receivers + backend.traffic.senders]
        await until(session, lambda s: s.state.samples >= 4, 20)
        yield client, session, backend
    finally:
        stop.set()
        await session.close()
        await sampler
        await client.close()
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            assert not _alive(pid), f"workload process {pid} survived the teardown"
    assert_no_leftovers()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def until(session: LiveSession, pred, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not pred(session):
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.1)


async def post(client: TestClient, kind: str, body) -> tuple[int, dict]:
    resp = await client.post(f"/api/{kind}", data=json.dumps(body), headers=JSON)
    return resp.status, await resp.json()


def link(session: LiveSession, name: str) -> dict:
    return next(lk for lk in session.state.links_view() if lk["name"] == name)


def test_controls_on_a_real_fabric():
    async def body():
        async with real() as (client, session, backend):
            wl = session.workload
            assert wl["processes"] == 2 * len(backend.topology.hosts) and wl["alive"] == wl["processes"]
            await until(session, lambda s: s.state.metrics.goodput_bps > 1e6, 20)

            assert (await post(client, "mode", {"mode": "spray"}))[0] == 200
            assert backend.fab.api.mode() == "spray"
            assert (await post(client, "policy", {"policy": "spray"}))[0] == 200
            await until(session, lambda s: s.workload["alive"] == s.workload["processes"], 10)
            assert all("--policy" in p.popen.args and "spray" in p.popen.args for p in backend.traffic.senders)
            # The restarted senders fill the links again; one 0.5 s sample on a starved machine can
            # still read a stall, so the balanced reading is awaited, with the links carrying traffic.
            await until(session, lambda s: s.state.metrics.goodput_bps > 1e6 and s.state.metrics.imbalance < 1.3,
                        20)

            assert (await post(client, "link", {"link": "leaf1-spine1", "up": False}))[0] == 200
            await until(session, lambda s: not link(s, "leaf1-spine1")["up"], 10)
            await until(session, lambda s: max(link(s, "leaf1-spine1")["util_ab"],
                                               link(s, "leaf1-spine1")["util_ba"]) < 0.02, 10)
            await until(session, lambda s: link(s, "leaf1-spine2")["util_ab"] > 0.3, 10)
            assert (await post(client, "link", {"link": "leaf1-spine1", "up": True}))[0] == 200
            await until(session, lambda s: link(s, "leaf1-spine1")["up"], 10)

            status, out = await post(client, "loss", {"link": "leaf2-spine2", "loss_pct": 1})
            assert status == 200, out
            assert link(session, "leaf2-spine2")["loss_pct"] == 1
            assert (await post(client, "loss", {"link": "leaf2-spine2", "loss_pct": 0}))[0] == 200

            for kind, bad in [("mode", {"mode": "flood"}), ("link", {"link": "leaf9-spine1", "up": False}),
                              ("policy", {"policy": "x"}), ("loss", {"link": "leaf1-spine1", "loss_pct": 101})]:
                assert 400 <= (await post(client, kind, bad))[0] < 500
            assert backend.fab.api.mode() == "spray"
            kinds = [e.kind for e in session.state.events]
            for k in ("mode", "policy", "link_down", "link_up", "loss"):
                assert k in kinds

    run(body)


def test_controller_death_shows_and_teardown_is_still_clean():
    async def body():
        async with real() as (client, session, backend):
            last = session.state.links_view()
            backend.fab.controller.proc.kill()  # our own child, by its pid
            await until(session, lambda s: s.controller == "lost", 10)
            st = await (await client.get("/api/state")).json()
            assert st["controller"] == "lost" and "exited" in st["controller_detail"]
            assert st["links"] == last  # the view keeps the last numbers
            status, _ = await post(client, "mode", {"mode": "spray"})
            assert status == 502

    run(body)


def test_allreduce_workload_runs_and_switches_policy():
    async def body():
        async with real("allreduce") as (client, session, backend):
            n = len(backend.topology.hosts)
            assert session.workload["processes"] == n and session.workload["alive"] == n
            await until(session, lambda s: s.state.metrics.goodput_bps > 1e5, 30)
            assert (await post(client, "policy", {"policy": "spray"}))[0] == 200
            await until(session, lambda s: s.workload["alive"] == n, 10)

    run(body)


def test_a_killed_live_view_leaves_nothing_after_clean():
    # SIGKILL gives the view no teardown: its endpoints, started in the hosts' namespaces and not children
    # of the hosts' shells, outlive it, and `clean` must find them through the run's record.
    proc = subprocess.Popen([*FABRICLAB, "live", "--topo", SPEC, "--port", "0", "--duration", "120"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 90
        for line in proc.stdout:
            if "live view on" in line or time.monotonic() > deadline:
                break
        while not new_leftovers()["endpoints"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert new_leftovers()["endpoints"], "the view's workload never started"
    finally:
        proc.kill()
        proc.wait()
    assert new_leftovers()["endpoints"], "a killed view leaves its endpoints for clean to find"
    out = subprocess.run([*FABRICLAB, "clean"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert_no_leftovers()
