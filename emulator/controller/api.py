"""The controller's JSON HTTP API (stdlib ThreadingHTTPServer, one thread per request).

GET /health, /links, /ports, /events, /mode, /rules[?switch=NAME], /reaction_delay; PUT /mode {"mode": "spray"},
PUT /reaction_delay {"seconds": 0.5}.
Errors are one-line JSON objects: {"error": "..."}.

Only fabriclab's own client is meant to call it, so it refuses what a browser page could send: a
request must name the server in its Host header (a loopback name or address, or the address it
listens on: 403 otherwise, 400 without one), a request with an Origin header must come from that same
server (403), and a body must be JSON with Content-Type: application/json (415) of at most
MAX_BODY_BYTES (413, refused before it is read). A connection idle for IDLE_TIMEOUT_S (headers or
body not sent) is closed, so a client cannot hold a handler thread.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024  # {"mode": "spray"} is 17 bytes
IDLE_TIMEOUT_S = 10.0


class Backend(Protocol):
    def api_health(self) -> dict[str, Any]: ...
    def api_links(self) -> dict[str, Any]: ...
    def api_ports(self) -> dict[str, Any]: ...
    def api_events(self) -> list[dict[str, Any]]: ...
    def api_get_mode(self) -> dict[str, Any]: ...
    def api_set_mode(self, mode: Any) -> dict[str, Any]: ...  # ValueError: bad mode; TimeoutError
    def api_rules(self, switch: str | None) -> dict[str, Any]: ...  # KeyError: unknown switch
    def api_get_reaction_delay(self) -> dict[str, Any]: ...
    def api_set_reaction_delay(self, seconds: Any) -> dict[str, Any]: ...  # ValueError: out of range


class ApiError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address, IPv6 in brackets or not) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str | None:
    """The host part of a Host header (None if it is no host[:port])."""
    try:
        parts = urlsplit(f"//{header}")
        parts.port  # noqa: B018 (raises ValueError on a port that is not a number)
    except ValueError:
        return None
    return parts.hostname


def _handler_class(backend: Backend, listen: str = "127.0.0.1",
                   idle_timeout_s: float = IDLE_TIMEOUT_S) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "fabriclab-controller"
        protocol_version = "HTTP/1.1"
        timeout = idle_timeout_s  # on the socket: a read that waits longer raises TimeoutError

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("api %s - %s", self.address_string(), format % args)

        def _send(self, status: HTTPStatus, body: Any) -> None:
            data = (json.dumps(body) + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _check_request(self, method: str) -> None:
            host = self.headers.get("Host")
            if not host:
                raise ApiError(HTTPStatus.BAD_REQUEST, "no Host header; name the server, e.g. Host: 127.0.0.1")
            name = host_name(host)
            if name is None:
                raise ApiError(HTTPStatus.BAD_REQUEST, "the Host header is not a host name or address")
            if not (is_loopback(name) or name == listen.strip("[]")):
                raise ApiError(HTTPStatus.FORBIDDEN, "the Host header must name this server (a loopback address)")
            origin = self.headers.get("Origin")
            if origin is not None and origin != f"http://{host}":
                raise ApiError(HTTPStatus.FORBIDDEN, "cross-origin request refused")
            if method != "GET":
                kind = (self.headers.get("Content-Type") or "").partition(";")[0].strip().lower()
                if kind != "application/json":
                    raise ApiError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                                   "send the body as JSON with Content-Type: application/json")

        def _dispatch(self, method: str) -> None:
            url = urlsplit(self.path)
            path = url.path.rstrip("/") or "/"
            self._body_read = False
            try:
                self._check_request(method)
                body = self._route(method, path, parse_qs(url.query))
                self._send(HTTPStatus.OK, body)
            except ApiError as e:
                if method != "GET" and not self._body_read:
                    # A body refused unread is still in the stream: no further request can follow it.
                    self.close_connection = True
                self._send(e.status, {"error": str(e)})
            except Exception as e:
                log.exception("api %s %s failed", method, self.path)
                self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(e).__name__}: {e}"})

        _body_read = False

        def _read_json(self) -> Any:
            text = (self.headers.get("Content-Length") or "0").strip()
            if not text.isdigit():
                raise ApiError(HTTPStatus.BAD_REQUEST, f"Content-Length {text[:20]!r} is not a number of bytes")
            length = int(text) if len(text) < 12 else MAX_BODY_BYTES + 1
            if length > MAX_BODY_BYTES:
                raise ApiError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                               f"the body may have at most {MAX_BODY_BYTES} bytes")
            try:
                raw = self.rfile.read(length) if length else b""
            except TimeoutError:
                raise ApiError(HTTPStatus.REQUEST_TIMEOUT,
                               f"the body did not arrive within {idle_timeout_s:g} s") from None
            if len(raw) < length:
                raise ApiError(HTTPStatus.BAD_REQUEST, "the body is shorter than its Content-Length")
            self._body_read = True
            try:
                return json.loads(raw or b"null")
            except (ValueError, RecursionError) as e:
                raise ApiError(HTTPStatus.BAD_REQUEST, f"body is not JSON: {e}") from None

        def _route(self, method: str, path: str, query: dict[str, list[str]]) -> Any:
            if method == "GET":
                if path == "/health":
                    return backend.api_health()
                if path == "/links":
                    return backend.api_links()
                if path == "/ports":
                    return backend.api_ports()
                if path == "/events":
                    return backend.api_events()
                if path == "/mode":
                    return backend.api_get_mode()
                if path == "/reaction_delay":
                    return backend.api_get_reaction_delay()
                if path == "/rules":
                    try:
                        return backend.api_rules(query.get("switch", [None])[0])
                    except KeyError as e:
                        raise ApiError(HTTPStatus.NOT_FOUND, f"unknown switch {e}") from None
            elif method == "PUT" and path == "/mode":
                body = self._read_json()
                if not isinstance(body, dict) or "mode" not in body:
                    raise ApiError(HTTPStatus.BAD_REQUEST, 'expected a body like {"mode": "spray"}')
                try:
                    return backend.api_set_mode(body["mode"])
                except ValueError as e:
                    raise ApiError(HTTPStatus.BAD_REQUEST, str(e)) from None
                except TimeoutError as e:
                    raise ApiError(HTTPStatus.GATEWAY_TIMEOUT, str(e)) from None
            elif method == "PUT" and path == "/reaction_delay":
                body = self._read_json()
                if not isinstance(body, dict) or "seconds" not in body:
                    raise ApiError(HTTPStatus.BAD_REQUEST, 'expected a body like {"seconds": 0.5}')
                try:
                    return backend.api_set_reaction_delay(body["seconds"])
                except ValueError as e:
                    raise ApiError(HTTPStatus.BAD_REQUEST, str(e)) from None
            raise ApiError(HTTPStatus.NOT_FOUND, f"no such endpoint: {method} {path}")

        def do_GET(self) -> None:
            self._dispatch("GET")

        def do_PUT(self) -> None:
            self._dispatch("PUT")

        def do_POST(self) -> None:
            # POST is accepted as a synonym of PUT, for clients that cannot PUT.
            puts = ("/mode", "/reaction_delay")
            self._dispatch("PUT" if urlsplit(self.path).path.rstrip("/") in puts else "POST")

    return Handler


class ApiServer:
    """The HTTP server on host:port, served from a daemon thread."""

    def __init__(self, backend: Backend, host: str, port: int, idle_timeout_s: float = IDLE_TIMEOUT_S) -> None:
        self.httpd = ThreadingHTTPServer((host, port), _handler_class(backend, host, idle_timeout_s))
        self.httpd.daemon_threads = True
        self.thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.httpd.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="api", daemon=True)
        self.thread.start()
        log.info("HTTP API on http://%s:%d", *self.address)

    def stop(self) -> None:
        """Stop serving and wait for the serving loop to end."""
        self.httpd.shutdown()
        self.httpd.server_close()

    def close(self) -> None:
        """Close the listening socket without waiting (for a process that exits right after)."""
        self.httpd.server_close()
