"""The controller's HTTP API refuses what a browser page or a stalling client could send: foreign Host
and Origin headers, bodies that are not JSON or too large, and connections that go idle. A fake backend
stands in for the controller: nothing here needs root or starts a fabric."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from emulator.controller.api import MAX_BODY_BYTES, ApiServer


class Fake:
    def __init__(self) -> None:
        self.mode = "ecmp"
        self.set_calls: list[Any] = []

    def api_health(self) -> dict[str, Any]:
        return {"ready": True, "mode": self.mode}

    def api_links(self) -> dict[str, Any]:
        return {"links": []}

    def api_ports(self) -> dict[str, Any]:
        return {"ports": []}

    def api_events(self) -> list[dict[str, Any]]:
        return []

    def api_get_mode(self) -> dict[str, Any]:
        return {"mode": self.mode}

    def api_set_mode(self, mode: Any) -> dict[str, Any]:
        self.set_calls.append(mode)
        self.mode = mode
        return {"mode": mode}

    def api_rules(self, switch: str | None) -> dict[str, Any]:
        return {"switches": {}}

    def api_get_reaction_delay(self) -> dict[str, Any]:
        return {"seconds": 0.0}

    def api_set_reaction_delay(self, seconds: Any) -> dict[str, Any]:
        from emulator.controller.app import FabricController

        FabricController.api_set_reaction_delay(self, seconds)  # the app's own validation
        return {"seconds": seconds}

    def _record(self, kind: str, **info: Any) -> dict[str, Any]:
        return {"kind": kind, **info}

    reaction_delay = 0.0


@pytest.fixture
def api() -> Iterator[tuple[ApiServer, Fake]]:
    backend = Fake()
    server = ApiServer(backend, "127.0.0.1", 0, idle_timeout_s=0.5)
    server.start()
    try:
        yield server, backend
    finally:
        server.stop()


def request(server: ApiServer, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    host, port = server.address
    conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def read_to_close(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


JSON = {"Content-Type": "application/json"}
SPRAY = b'{"mode": "spray"}'


def test_the_client_s_own_requests_pass(api):
    server, backend = api
    assert request(server, "PUT", "/mode", SPRAY, JSON) == (200, {"mode": "spray"})
    utf8 = {"Content-Type": "application/json; charset=utf-8"}
    assert request(server, "POST", "/mode", b'{"mode": "ecmp"}', utf8)[0] == 200
    assert request(server, "GET", "/mode") == (200, {"mode": "ecmp"})
    assert backend.set_calls == ["spray", "ecmp"]


def test_a_cross_origin_text_plain_post_no_longer_changes_the_mode(api):
    server, backend = api
    # What a page on another site can send without a preflight: a "simple" POST of text/plain.
    status, out = request(server, "POST", "/mode", SPRAY, {"Content-Type": "text/plain",
                                                          "Origin": "http://evil.example"})
    assert status == 403 and "cross-origin" in out["error"]
    status, out = request(server, "POST", "/mode", SPRAY, {"Content-Type": "text/plain"})
    assert status == 415 and "application/json" in out["error"]
    status, _ = request(server, "PUT", "/mode", SPRAY, {**JSON, "Origin": "null"})
    assert status == 403
    assert backend.set_calls == [] and backend.mode == "ecmp"


@pytest.mark.parametrize(("host", "status"), [
    ("evil.example", 403), ("evil.example:8080", 403), ("10.0.0.1", 403), ("[", 400), ("127.0.0.1:x", 400),
    ("localhost", 200), ("[::1]:1", 200),
])
def test_the_host_header_must_name_a_loopback_address(api, host, status):
    server, _ = api
    assert request(server, "GET", "/health", headers={"Host": host})[0] == status


def test_a_request_without_a_host_header_is_refused(api):
    server, _ = api
    with socket.create_connection(server.address, timeout=5) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 400")


def test_a_huge_content_length_is_refused_before_anything_is_read(api):
    server, backend = api
    for length in ("1000000000", str(MAX_BODY_BYTES + 1), "9" * 40):
        with socket.create_connection(server.address, timeout=5) as sock:
            t0 = time.monotonic()
            sock.sendall(f"PUT /mode HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         f"Content-Length: {length}\r\n\r\n".encode())
            # Answered at once, not after the idle timeout, and closed: the body is never read.
            reply = read_to_close(sock)
            assert reply.startswith(b"HTTP/1.1 413") and b"at most" in reply, reply
            assert time.monotonic() - t0 < 0.4
    with socket.create_connection(server.address, timeout=5) as sock:
        sock.sendall(b"PUT /mode HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1e9\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 400")
    assert backend.set_calls == []


def test_an_idle_client_does_not_hold_a_handler(api):
    server, backend = api
    # Headers promise 100 bytes; 2 arrive. The handler gives up after the idle timeout (0.5 s here).
    with socket.create_connection(server.address, timeout=5) as sock:
        t0 = time.monotonic()
        sock.sendall(b"PUT /mode HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"")
        reply = sock.recv(4096)
        assert reply.startswith(b"HTTP/1.1 408"), reply
        assert 0.4 < time.monotonic() - t0 < 3.0
    # A client that sends nothing at all is dropped too.
    with socket.create_connection(server.address, timeout=5) as sock:
        t0 = time.monotonic()
        assert sock.recv(4096) == b""
        assert time.monotonic() - t0 < 3.0
    assert backend.set_calls == []


def test_a_deeply_nested_body_is_a_400(api):
    server, backend = api
    status, out = request(server, "PUT", "/mode", b"[" * 30_000 + b"]" * 30_000, JSON)
    assert status == 400 and "not JSON" in out["error"]
    assert backend.set_calls == []


@pytest.mark.parametrize("body,status", [(b'{"seconds": 0.5}', 200), (b'{"seconds": 11}', 400),
                                         (b'{"seconds": -1}', 400), (b'{"seconds": true}', 400),
                                         (b'{"delay": 1}', 400)])
def test_the_reaction_delay_takes_seconds_from_0_to_10(api, body, status):
    server, _ = api
    code, reply = request(server, "PUT", "/reaction_delay", body, JSON)
    assert code == status, reply
