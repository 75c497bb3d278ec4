"""The dashboard's HTTP server (aiohttp): the page, its static files, a JSON API and a push stream.

GET  /                  the page (static/index.html; app.js and style.css under /static/)
GET  /api/topology      tiers, nodes and links to draw (live.layout)
GET  /api/state         everything at once: status, links, metrics, placement, series, events
GET  /api/stream        server-sent events: a snapshot, then an update per sample (at least 1/s)
POST /api/mode          {"mode": "ecmp" | "spray" | "single"}
POST /api/policy        {"policy": "single" | "spray" | "adaptive" | the --path-policy FILE.py:CLASS}
                        (restarts the senders)
POST /api/link          {"link": "leaf1-spine1", "up": false}         (cut; true restores)
POST /api/loss          {"link": "leaf1-spine1", "loss_pct": 1.5}     (0-100; 0 turns it off)

Errors are JSON, {"error": "..."}, with a 4xx status for anything the client can fix. A request
that changes state must say it is JSON (Content-Type: application/json, 415 otherwise) and, when it
carries an Origin header, come from this server's own origin (403 otherwise): a page on another site
cannot drive the fabric through a browser that happens to have this one open. The Host header must
name this server too (403 otherwise; 400 when it is not a host at all), which keeps DNS-rebinding pages
out of reads as well: on a loopback bind a loopback address; on another address that address or
loopback; on a wildcard bind (0.0.0.0, ::) one of the machine's own names (its host name, its fully
qualified name, localhost) or addresses (one a socket can be bound to). A rebinding page's Host is
its own domain, which is none of these. The alternative, a per-run token in the URL, would guard
against other local users as well, but it breaks every URL a user types or bookmarks, and this view
already trusts whoever can reach its port.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import socket
from importlib import resources
from typing import Any

from aiohttp import web

from emulator.controller.api import host_name, is_loopback
from live import controls
from live.controls import ControlError
from live.session import LiveSession

log = logging.getLogger(__name__)

SESSION: web.AppKey[LiveSession] = web.AppKey("session", LiveSession)
BIND: web.AppKey[str] = web.AppKey("bind", str)
STATIC_FILES = {"app.js": "text/javascript", "style.css": "text/css", "index.html": "text/html"}
KEEPALIVE_S = 15.0
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
# The page loads nothing from anywhere else and runs no inline script.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
                               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=SECURITY_HEADERS)


class BadHost(ValueError):
    """A Host header that is no host[:port] at all (`[`, a port that is not a number)."""


def _hostname(host_header: str) -> str:
    name = host_name(host_header)
    if name is None:
        raise BadHost(host_header)
    return name.rstrip(".")


@functools.cache
def own_names() -> frozenset[str]:
    """The names this machine answers to: its host name and fully qualified name, and localhost."""
    names = {"localhost"}
    with contextlib.suppress(OSError):
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    return frozenset(n for n in names if n)


@functools.lru_cache(maxsize=256)  # Host is the client's to choose: keep what is remembered bounded
def is_own_address(host: str) -> bool:
    """Whether `host` is an IP address of this machine: one a socket can be bound to."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    # The unspecified address is how the URL of a wildcard bind reads (http://0.0.0.0:PORT/).
    if ip.is_loopback or ip.is_unspecified:
        return True
    if ip.is_multicast:
        return False
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.bind((str(ip), 0))
    except OSError:
        return False
    return True


def origin_allowed(origin: str | None, host_header: str | None, bind: str) -> bool:
    """Same-origin check for state-changing requests (no Origin header: not from a browser page)."""
    if origin is None:
        return True
    if not host_header or origin != f"http://{host_header}":
        return False
    return host_allowed(host_header, bind)


def host_allowed(host_header: str | None, bind: str) -> bool:
    """On a loopback bind only loopback names reach us; on another address, that address or loopback;
    on a wildcard bind (0.0.0.0, ::) the machine's own names and addresses. BadHost if it is no host."""
    name = _hostname(host_header or "").lower()
    if bind in ("0.0.0.0", "::", ""):
        return name in own_names() or is_own_address(name)
    if is_loopback(bind):
        return is_loopback(name)
    return name == bind.strip("[]") or is_loopback(name)


@web.middleware
async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
    bind = request.app[BIND]
    try:
        if not host_allowed(request.headers.get("Host"), bind):
            return _error(403, f"requests must name this server's address in their Host header ({bind})")
        same_origin = origin_allowed(request.headers.get("Origin"), request.headers.get("Host"), bind)
    except BadHost:
        return _error(400, "the Host header is not a host name or address (with an optional :port)")
    if request.method not in SAFE_METHODS:
        if not same_origin:
            return _error(403, "cross-origin request refused: controls are only accepted from this page")
        if request.content_type != "application/json":
            return _error(415, "send the body as JSON with Content-Type: application/json")
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if request.path.startswith("/api/") and exc.status >= 400:
            return _error(exc.status, exc.reason)
        raise


async def index(request: web.Request) -> web.Response:
    return _static_file("index.html")


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in STATIC_FILES:
        raise web.HTTPNotFound()
    return _static_file(name)


def _static_file(name: str) -> web.Response:
    data = (resources.files("live") / "static" / name).read_bytes()
    return web.Response(body=data, content_type=STATIC_FILES[name], charset="utf-8",
                        headers={"Cache-Control": "no-cache", **SECURITY_HEADERS})


async def favicon(request: web.Request) -> web.Response:
    return web.Response(status=204)  # no icon; saying so keeps the browser's console clean


async def topology(request: web.Request) -> web.Response:
    return web.json_response(request.app[SESSION].layout, headers=SECURITY_HEADERS)


async def state(request: web.Request) -> web.Response:
    return web.json_response(request.app[SESSION].snapshot(), headers=SECURITY_HEADERS)


async def stream(request: web.Request) -> web.StreamResponse:
    session = request.app[SESSION]
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                       "X-Accel-Buffering": "no", **SECURITY_HEADERS})
    await resp.prepare(request)
    q = session.subscribe()
    try:
        while True:
            try:
                item = await asyncio.wait_for(q.get(), timeout=KEEPALIVE_S)
            except TimeoutError:
                await resp.write(b": keepalive\n\n")
                continue
            if item is None:
                await resp.write(b"event: end\ndata: {}\n\n")
                break
            await resp.write(f"data: {item}\n\n".encode())
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        session.unsubscribe(q)
    return resp


async def control(request: web.Request) -> web.Response:
    session = request.app[SESSION]
    kind = request.match_info["kind"]
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: [[[[... nested too deep
        return _error(400, "the body is not valid JSON; e.g. " + controls.EXAMPLES.get(kind, "{}"))
    try:
        c = controls.parse(kind, body, session.topology, session.policies)
        result = await session.control(c)
    except ControlError as exc:
        return _error(exc.status, str(exc))
    return web.json_response(result, headers=SECURITY_HEADERS)


def make_app(session: LiveSession, bind: str = "127.0.0.1") -> web.Application:
    app = web.Application(middlewares=[guard], client_max_size=64 * 1024)
    app[SESSION] = session
    app[BIND] = bind
    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/favicon.ico", favicon)
    app.router.add_get("/api/topology", topology)
    app.router.add_get("/api/state", state)
    app.router.add_get("/api/stream", stream)
    app.router.add_post("/api/{kind}", control)

    async def end_streams(app: web.Application) -> None:
        for q in list(session._queues):
            session._put(q, None)

    app.on_shutdown.append(end_streams)
    return app


async def serve(session: LiveSession, host: str, port: int, stop: asyncio.Event,
                announce: Any = None, start_session: bool = True) -> None:
    """Serve until `stop` is set; bring the fabric up meanwhile; tear it down at the end.

    `announce(url)` is called once the socket listens (port 0 picks a free one)."""
    runner = web.AppRunner(make_app(session, host), access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    # With port 0 the kernel picks the port; ask the listening socket which.
    bound = runner.addresses[0][1] if runner.addresses else port
    url = f"http://{host if ':' not in host else f'[{host}]'}:{bound}/"
    if announce:
        announce(url)
    sampler = asyncio.create_task(session.run(stop))
    starter = asyncio.create_task(session.start()) if start_session else None
    failed: BaseException | None = None
    try:
        if starter is not None:
            waiter = asyncio.create_task(stop.wait())
            done, _ = await asyncio.wait({starter, waiter}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if starter in done and starter.exception() is not None:
                failed = starter.exception()
                stop.set()
        await stop.wait()
    finally:
        stop.set()
        await session.close()
        if starter is not None and not starter.done():
            with contextlib.suppress(BaseException):
                await starter
        sampler.cancel()
        with contextlib.suppress(BaseException):
            await sampler
        await runner.cleanup()
    if failed is not None:
        raise failed
