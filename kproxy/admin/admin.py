"""The admin HTTP listener: liveness, readiness, metrics, capture control, the live page.

Served by aiohttp's web server (``AppRunner`` + ``TCPSite`` on kproxy's own
event loop): request parsing, keep-alive and limits are a well-kept library's
job. One catch-all handler dispatches to the routes kproxy registers, so what
each route answers (status, content type, body) stays exactly what it was on
the hand-written responder before it.

Two kinds of route:

- plain routes ``path -> handler`` or ``path -> {"GET": h, "POST": h}``; a GET
  handler takes no argument, a POST handler the request body; both return
  ``(status, content type, body bytes)``;
- ``web_routes``: aiohttp handlers taking the ``web.Request`` (the live stream,
  files), for answers that are not one body; a path ending in "/" (other than
  "/" itself) answers every path under it. Plain routes win.

Protected routes need ``Authorization: Bearer <token>`` matching the configured
admin token, compared in constant time; without a configured token they answer
403 to everyone. The check runs before the request body is read. Only the header
counts (never a query parameter: URLs end up in histories and logs). The token is
never logged, and neither is what a caller sent (aiohttp's access log is off);
refusals are logged at most once per ``REFUSAL_LOG_INTERVAL_S`` with a count.

Slow callers cannot hold the port: a connection that has not completed its
request headers within ``READ_TIMEOUT_S`` is closed (aiohttp's keep-alive timer
runs from the connection's start), and so is one that trickles its body.

``/metrics`` is rendered by ``SharedRender``: off the event loop, one render at
a time, every scrape that arrives meanwhile sharing its result, and at most
``MAX_WAITING_SCRAPES`` waiting (the rest get 503 at once), so a scrape storm
neither stalls forwarding nor renders for callers that are gone.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from typing import Awaitable, Callable, Collection

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CONTENT_TYPE_LATEST

from ..http_limits import LISTEN_BACKLOG, MAX_HEADER_LINES, MAX_LINE_BYTES, READ_TIMEOUT_S

log = logging.getLogger("kproxy.admin")

MAX_BODY_BYTES = 64 * 1024         # capture settings fit in far less; anything bigger is a mistake
# Refused calls to protected routes are logged once per interval, with how many there were:
# a caller guessing tokens cannot fill the log.
REFUSAL_LOG_INTERVAL_S = 60.0
# Scrapes waiting for the render in flight; Prometheus sends one per interval per server,
# so more than this at once is a storm: the rest are told to come back (503) for free.
MAX_WAITING_SCRAPES = 32
# Handlers still running at stop get this long before they are cancelled (live streams end at once).
SHUTDOWN_TIMEOUT_S = 2.0

# GET: () -> (status, content type, body); POST: (request body) -> the same.
Route = Callable[..., Awaitable[tuple[int, str, bytes]]]
WebRoute = Callable[[web.Request], Awaitable[web.StreamResponse]]
_JSON = "application/json"


class ScrapeBusy(Exception):
    """Too many scrapes are already waiting for the render in flight."""


class SharedRender:
    """``await render()``: the result of ``produce()`` run in a worker thread, one at a time.

    Callers arriving while a render runs await that same render (so a thousand
    concurrent scrapes cost one render, not a thousand); past ``max_waiting``
    callers ``ScrapeBusy`` is raised at once. A caller that goes away does not
    cancel the render the others await.
    """

    def __init__(self, produce: Callable[[], bytes], max_waiting: int = MAX_WAITING_SCRAPES):
        self.produce = produce
        self.max_waiting = max_waiting
        self.renders = 0                      # how many times produce() ran (tests, benchmarks)
        self.refused = 0
        self._pending: asyncio.Future | None = None
        self._waiting = 0

    async def __call__(self) -> bytes:
        if self._waiting >= self.max_waiting:
            self.refused += 1
            raise ScrapeBusy()
        if self._pending is None:
            self.renders += 1
            self._pending = asyncio.get_running_loop().run_in_executor(None, self.produce)
            self._pending.add_done_callback(self._done)
        self._waiting += 1
        try:
            return await asyncio.shield(self._pending)
        finally:
            self._waiting -= 1

    def _done(self, future: asyncio.Future) -> None:
        if self._pending is future:
            self._pending = None
        if not future.cancelled():
            future.exception()                # retrieved, so asyncio does not log it as lost


async def metrics_answer(scrape: SharedRender) -> tuple[int, str, bytes]:
    """The /metrics answer: ``scrape``'s exposition, or 503 at once when too many scrapes wait."""
    try:
        return 200, CONTENT_TYPE_LATEST, await scrape()
    except ScrapeBusy:
        return 503, "text/plain", b"too many scrapes at once; retry\n"


def bearer_token(request: web.Request) -> str:
    """The credentials of ``Authorization: Bearer <token>``; "" for anything else."""
    scheme, _, credentials = request.headers.get("Authorization", "").strip().partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else ""


class _MalformedRequestLog(logging.Filter):
    """aiohttp logs every malformed request (line too long, too many headers, garbage)
    at ERROR with a traceback: anyone reaching the port could fill the log. Here they
    become one WARNING line per REFUSAL_LOG_INTERVAL_S with a count; a request handler's
    own failure (not a parse error) is logged as aiohttp logs it."""

    def __init__(self):
        super().__init__()
        self.unlogged = 0
        self.logged_at = float("-inf")

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, HttpProcessingError) or record.levelno < logging.ERROR:
            return True
        self.unlogged += 1
        now = time.monotonic()
        if now - self.logged_at < REFUSAL_LOG_INTERVAL_S:
            return False
        record.msg = "admin: malformed HTTP request from %s (%d %s); %d since the last such line"
        record.args = (*(record.args or ("?",))[:1], error.code,
                       str(error.message).splitlines()[0][:100] if error.message else "", self.unlogged)
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info = record.exc_text = None
        self.logged_at, self.unlogged = now, 0
        return True


# aiohttp's server log for the admin listener, its malformed-request lines budgeted.
_http_log = logging.getLogger("kproxy.admin.http")
malformed_request_log = _MalformedRequestLog()           # one budget per process
_http_log.addFilter(malformed_request_log)


class AdminServer:
    def __init__(self, routes: dict[str, Route], admin_token: str | None = None,
                 protected: Collection[str] = (), web_routes: dict[str, WebRoute] | None = None,
                 protected_prefixes: Collection[str] = (), read_timeout: float = READ_TIMEOUT_S):
        self.routes = routes
        self.read_timeout = read_timeout
        self.web_routes = dict(web_routes or {})
        self.protected = frozenset(protected)
        self.protected_prefixes = tuple(protected_prefixes)
        self._token = admin_token.encode("ascii") if admin_token else None
        self.runner: web.AppRunner | None = None
        self.server: web.TCPSite | None = None           # None until started
        self.refused = 0                   # protected calls refused (no token configured, or a bad one)
        self._refusals_unlogged = 0
        self._refusal_logged_at = float("-inf")
        # "/live/" answers every path under it; "/" only itself.
        self._web_prefixes = tuple(sorted((p for p in self.web_routes if p.endswith("/") and p != "/"),
                                          key=len, reverse=True))

    @property
    def token_required(self) -> bool:
        return self._token is not None

    async def start(self, host: str, port: int) -> None:
        app = web.Application(client_max_size=MAX_BODY_BYTES, handler_args={
            "keepalive_timeout": self.read_timeout, "lingering_time": self.read_timeout,
            "max_line_size": MAX_LINE_BYTES,
            "max_field_size": MAX_LINE_BYTES, "max_headers": MAX_HEADER_LINES, "logger": _http_log})
        app.router.add_route("*", "/{path:.*}", self._dispatch)
        # access_log=None: one line per probe and scrape is noise; refusals are logged above.
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                    shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port, reuse_address=True, backlog=LISTEN_BACKLOG)
        await site.start()
        self.server = site

    @property
    def address(self) -> tuple[str, int]:
        return tuple(self.runner.addresses[0][:2])

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
            self.server = None

    def is_protected(self, path: str) -> bool:
        return path in self.protected or path.startswith(self.protected_prefixes)

    def _authorize(self, token: str | None) -> tuple[int, str, bytes] | None:
        """None if the caller may use a protected route; otherwise the refusal to send.
        ``token``: what the caller offered (``bearer_token``)."""
        if self._token is None:
            return 403, _JSON, (b'{"error": "capture control and the live view are off: no admin token is '
                                b'configured (admin_token_file or KPROXY_ADMIN_TOKEN)"}\n')
        given = (token or "").encode("latin-1", "replace")
        if given and hmac.compare_digest(given, self._token):
            return None
        return 401, _JSON, b'{"error": "missing or wrong admin token (Authorization: Bearer ...)"}\n'

    def check(self, request: web.Request) -> web.Response | None:
        """For web routes that decide protection themselves: None, or the refusal to return."""
        refusal = self._authorize(bearer_token(request))
        if refusal is None:
            return None
        self._log_refusal(request.method, request.path, request.remote, refusal[0])
        return _response(*refusal)

    def _log_refusal(self, method: str, path: str, host, status: int) -> None:
        self.refused += 1
        self._refusals_unlogged += 1
        now = time.monotonic()
        if now - self._refusal_logged_at >= REFUSAL_LOG_INTERVAL_S:
            log.warning("admin: refused %s %s from %s (%d): %s; %d refused since the last such line",
                        method, path, host, status,
                        "no admin token configured" if status == 403 else "missing or wrong token",
                        self._refusals_unlogged)
            self._refusal_logged_at = now
            self._refusals_unlogged = 0

    def _web_route(self, path: str) -> WebRoute | None:
        route = self.web_routes.get(path)
        if route is None:
            route = next((self.web_routes[p] for p in self._web_prefixes if path.startswith(p)), None)
        return route

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        method, path = request.method, request.path
        get = "GET" if method == "HEAD" else method
        handlers = self.routes.get(path)
        web_route = self._web_route(path) if handlers is None else None
        if handlers is not None and not isinstance(handlers, dict):
            handlers = {"GET": handlers}                  # a bare route answers GET
        if handlers is None and web_route is None:
            return _response(404, "text/plain", b"not found\n")
        length = request.content_length
        if length is not None and length > MAX_BODY_BYTES:
            return _response(413, "text/plain", b"body too large\n")
        if web_route is not None:
            if self.is_protected(path) and (refused := self.check(request)) is not None:
                return refused
            return await web_route(request)
        if get not in handlers:
            allowed = ", ".join(sorted(handlers))
            return _response(405, "text/plain", f"allowed: {allowed}\n".encode())
        if self.is_protected(path) and (refusal := self._authorize(bearer_token(request))) is not None:
            self._log_refusal(method, path, request.remote, refusal[0])
            headers = {"WWW-Authenticate": 'Bearer realm="kproxy-admin"'} if refusal[0] == 401 else None
            return _response(*refusal, headers)
        try:
            body = b""
            if method == "POST" and request.body_exists:
                body = await asyncio.wait_for(request.read(), self.read_timeout)
        except web.HTTPRequestEntityTooLarge:
            return _response(413, "text/plain", b"body too large\n")
        except asyncio.TimeoutError:              # a trickled body: answer and hang up
            return _response(408, "text/plain", b"request body too slow\n", {"Connection": "close"})
        handler = handlers[get]
        try:
            status, ctype, answer = await (handler(body) if method == "POST" else handler())
        except Exception:                 # noqa: BLE001 - a bug answers 500, never a dropped socket
            log.exception("admin: %s %s failed", method, path)
            status, ctype, answer = 500, "text/plain", b"internal error (logged)\n"
        return _response(status, ctype, answer)


def _response(status: int, ctype: str, body: bytes, headers: dict | None = None) -> web.Response:
    """Exactly the content type given (aiohttp would add a charset to text types)."""
    return web.Response(status=status, body=body, headers={"Content-Type": ctype, **(headers or {})})
