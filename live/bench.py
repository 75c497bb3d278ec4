"""`fabriclab bench live`: how fast and how cheaply the live view follows the fabric.

Runs `fabriclab live --port 0` as a child process and reads its event stream the way the page does:
- update rate and the gaps between updates;
- age of the numbers on arrival: client receive time minus `t_sample` (when the server read the
  controller's counters), and the server's own share of it (`t_server` - `t_sample`);
- a link cut half way through: time from the request until the stream shows the link down, and until
  it shows the link carrying nothing (on a real fabric this includes the controller's counter poll);
- CPU seconds the live-view process itself uses per second of wall time (/proc/PID/stat, children
  such as the controller and the endpoints not included).
"""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from itertools import pairwise
from typing import Any

from emulator import cpu
from transport.core.metrics import percentile

BRING_UP_TIMEOUT_S = 180.0
IDLE_UTIL = 0.02


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def _post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def _cpu_seconds(proc: subprocess.Popen) -> float:
    seconds = cpu.process_cpu_seconds(proc.pid)
    if seconds is None:
        raise RuntimeError("fabriclab live exited during the bench")
    return seconds


def _pct(values: list[float], q: float) -> float | None:
    value = percentile(values, q, interpolate=False)
    return None if value is None else round(value, 2)


class _Follower(threading.Thread):
    """Reads the event stream; records (receive time, message) pairs."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True, name="bench-stream")
        self.url = url
        self.messages: list[tuple[float, dict[str, Any]]] = []
        self.stopping = False
        self.resp: Any = None

    def run(self) -> None:
        self.resp = urllib.request.urlopen(self.url + "api/stream", timeout=30)
        for raw in self.resp:
            if self.stopping:
                break
            line = raw.decode().rstrip("\n")
            if line.startswith("data: "):
                t = time.time()
                msg = json.loads(line[6:])
                if msg.get("type") in ("snapshot", "update"):
                    self.messages.append((t, msg))


def run_live_bench(topo: str, fake: bool = False, seconds: float = 20.0) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "cli", "live", "--port", "0", "--topo", topo]
    if fake:
        cmd.append("--fake")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if "http://" not in line:
            proc.wait(timeout=30)
            raise RuntimeError(f"fabriclab live did not start: {line}{proc.stderr.read() if proc.stderr else ''}")
        url = line.split("live view on ", 1)[1].split()[0]
        deadline = time.monotonic() + BRING_UP_TIMEOUT_S
        t_up = time.monotonic()
        while _get(url + "api/state")["phase"] != "running":
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the fabric did not come up")
            time.sleep(0.2)
        bring_up_s = time.monotonic() - t_up
        follower = _Follower(url)
        follower.start()
        time.sleep(2.0)  # let the stream settle and the counters fill
        cpu0, wall0 = _cpu_seconds(proc), time.monotonic()
        first = len(follower.messages)
        time.sleep(seconds / 2)
        state = _get(url + "api/state")
        hosts = {name for name, node in _get(url + "api/topology")["nodes"].items() if node["host"]}
        fabric = [lk for lk in state["links"] if lk["a"] not in hosts and lk["b"] not in hosts]
        busiest = max(fabric or state["links"], key=lambda lk: max(lk["util_ab"], lk["util_ba"]))
        t_cut = time.time()
        _post(url + "api/link", {"link": busiest["name"], "up": False})
        t_cut_done = time.time()
        time.sleep(seconds / 2)
        cpu1, wall1 = _cpu_seconds(proc), time.monotonic()
        _post(url + "api/link", {"link": busiest["name"], "up": True})
        follower.stopping = True
        msgs = follower.messages[first:]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    recv = [t for t, _ in msgs]
    gaps = [1e3 * (b - a) for a, b in pairwise(recv)]
    age = [1e3 * (t - m["t_sample"]) for t, m in msgs if m.get("t_sample")]
    server = [1e3 * (m["t_server"] - m["t_sample"]) for _, m in msgs if m.get("t_sample")]
    counter_age = [1e3 * (m["t_sample"] - m["t_counter"]) for _, m in msgs if m.get("t_counter") and m.get("t_sample")]

    def first_after(pred) -> float | None:
        for t, m in msgs:
            if t >= t_cut and pred(m):
                return round(1e3 * (t - t_cut), 1)
        return None

    def link_of(m: dict[str, Any]) -> dict[str, Any]:
        return next(lk for lk in m["links"] if lk["name"] == busiest["name"])

    return {
        "fake": fake,
        "topology": topo,
        "bring_up_s": round(bring_up_s, 2),
        "seconds": round(wall1 - wall0, 2),
        "updates": len(msgs),
        "update_hz": round(len(msgs) / (wall1 - wall0), 2) if wall1 > wall0 else None,
        "gap_ms": {"p50": _pct(gaps, 50), "p99": _pct(gaps, 99), "max": round(max(gaps), 1) if gaps else None},
        "age_on_arrival_ms": {"p50": _pct(age, 50), "p99": _pct(age, 99)},
        "server_share_ms": {"p50": _pct(server, 50), "p99": _pct(server, 99)},
        "counter_report_age_ms": {"p50": _pct(counter_age, 50)} if counter_age else None,
        "cut": {
            "link": busiest["name"],
            "request_ms": round(1e3 * (t_cut_done - t_cut), 1),
            "to_page_down_ms": first_after(lambda m: not link_of(m)["up"]),
            "to_page_idle_ms": first_after(lambda m: max(link_of(m)["util_ab"], link_of(m)["util_ba"]) < IDLE_UTIL),
        },
        "cpu_s_per_s": round((cpu1 - cpu0) / (wall1 - wall0), 4) if wall1 > wall0 else None,
        "cpu_per_update_ms": round(1e3 * (cpu1 - cpu0) / len(msgs), 2) if msgs else None,
        "mean_gap_ms": round(statistics.mean(gaps), 1) if gaps else None,
    }
