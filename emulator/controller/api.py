"""The controller's JSON HTTP API (stdlib ThreadingHTTPServer, one thread per request).

GET /health, /links, /ports, /events, /mode, /rules[?switch=NAME]; PUT /mode {"mode": "spray"}.
Errors are one-line JSON objects: {"error": "..."}.
"""

from __future__ import annotations

import json
import logging
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger(__name__)


class Backend(Protocol):
    def api_health(self) -> dict[str, Any]: ...
    def api_links(self) -> dict[str, Any]: ...
    def api_ports(self) -> dict[str, Any]: ...
    def api_events(self) -> list[dict[str, Any]]: ...
    def api_get_mode(self) -> dict[str, Any]: ...
    def api_set_mode(self, mode: Any) -> dict[str, Any]: ...  # ValueError: bad mode; TimeoutError
    def api_rules(self, switch: str | None) -> dict[str, Any]: ...  # KeyError: unknown switch


class ApiError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def _handler_class(backend: Backend) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "fabriclab-controller"
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("api %s - %s", self.address_string(), format % args)

        def _send(self, status: HTTPStatus, body: Any) -> None:
            data = (json.dumps(body) + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _dispatch(self, method: str) -> None:
            url = urlsplit(self.path)
            path = url.path.rstrip("/") or "/"
            try:
                body = self._route(method, path, parse_qs(url.query))
                self._send(HTTPStatus.OK, body)
            except ApiError as e:
                self._send(e.status, {"error": str(e)})
            except Exception as e:
                log.exception("api %s %s failed", method, self.path)
                self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(e).__name__}: {e}"})

        def _read_json(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                return json.loads(raw or b"null")
            except ValueError as e:
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
            raise ApiError(HTTPStatus.NOT_FOUND, f"no such endpoint: {method} {path}")

        def do_GET(self) -> None:
            self._dispatch("GET")

        def do_PUT(self) -> None:
            self._dispatch("PUT")

        def do_POST(self) -> None:
            # POST /mode is accepted as a synonym, for clients that cannot PUT.
            self._dispatch("PUT" if urlsplit(self.path).path.rstrip("/") == "/mode" else "POST")

    return Handler


class ApiServer:
    """The HTTP server on host:port, served from a daemon thread."""

    def __init__(self, backend: Backend, host: str, port: int) -> None:
        self.httpd = ThreadingHTTPServer((host, port), _handler_class(backend))
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
