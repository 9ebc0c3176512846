"""The admin HTTP listener: liveness, readiness, metrics, capture control.

A deliberately tiny HTTP/1.1 responder on asyncio streams: probes and
scrapes need GET and a status line, nothing more, and it keeps the admin
port free of extra dependencies.

Protected routes (capture control) need ``Authorization: Bearer <token>``
matching the configured admin token, compared in constant time; without a
configured token they answer 403 to everyone. The check runs before the
request body is read. The token is never logged, and neither is what a
caller sent; refusals are logged at most once per ``REFUSAL_LOG_INTERVAL_S``
with a count.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from typing import Awaitable, Callable, Collection

log = logging.getLogger("kproxy.admin")

REQUEST_LINE_LIMIT = 8192          # bytes; anything longer is not a probe
READ_TIMEOUT_S = 5.0               # a client that sends nothing is dropped after this
READINESS_TIMEOUT_S = 2.0          # upstream connect check for /readyz
MAX_BODY_BYTES = 64 * 1024         # capture settings fit in far less; anything bigger is a mistake
MAX_HEADER_LINES = 100             # curl sends 3, Prometheus 5; a stream of headers is not a request
# Refused calls to protected routes are logged once per interval, with how many there were:
# a caller guessing tokens cannot fill the log.
REFUSAL_LOG_INTERVAL_S = 60.0

# GET: () -> (status, content type, body); POST: (request body) -> the same.
Route = Callable[..., Awaitable[tuple[int, str, bytes]]]
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed", 409: "Conflict", 413: "Content Too Large",
           500: "Internal Server Error", 503: "Service Unavailable"}
_JSON = "application/json"


async def upstream_reachable(addresses) -> tuple[bool, str]:
    """True if a TCP connection to any of the addresses opens."""
    errors = []
    for host, port in addresses:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), READINESS_TIMEOUT_S)
            writer.close()
            return True, f"{host}:{port} reachable"
        except (OSError, asyncio.TimeoutError) as exc:
            errors.append(f"{host}:{port}: {str(exc) or type(exc).__name__}")   # timeouts have no text
    return False, "; ".join(errors)


class AdminServer:
    def __init__(self, routes: dict[str, Route], admin_token: str | None = None,
                 protected: Collection[str] = ()):
        self.routes = routes
        self.protected = frozenset(protected)
        self._token = admin_token.encode("ascii") if admin_token else None
        self.server: asyncio.Server | None = None
        self.refused = 0                   # protected calls refused (no token configured, or a bad one)
        self._refusals_unlogged = 0
        self._refusal_logged_at = float("-inf")

    async def start(self, host: str, port: int) -> None:
        self.server = await asyncio.start_server(self._handle, host, port)

    @property
    def address(self) -> tuple[str, int]:
        return self.server.sockets[0].getsockname()[:2]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    def _authorize(self, authorization: str | None) -> tuple[int, str, bytes] | None:
        """None if the caller may use a protected route; otherwise the refusal to send."""
        if self._token is None:
            return 403, _JSON, (b'{"error": "capture control is off: no admin token is configured '
                                b'(admin_token_file or KPROXY_ADMIN_TOKEN)"}\n')
        scheme, _, credentials = (authorization or "").strip().partition(" ")
        given = credentials.strip().encode("latin-1") if scheme.lower() == "bearer" else b""
        if given and hmac.compare_digest(given, self._token):
            return None
        return 401, _JSON, b'{"error": "missing or wrong admin token (Authorization: Bearer ...)"}\n'

    def _log_refusal(self, method: str, path: str, peer, status: int) -> None:
        self.refused += 1
        self._refusals_unlogged += 1
        now = time.monotonic()
        if now - self._refusal_logged_at >= REFUSAL_LOG_INTERVAL_S:
            host = peer[0] if isinstance(peer, tuple) else peer
            log.warning("admin: refused %s %s from %s (%d): %s; %d refused since the last such line",
                        method, path, host, status,
                        "no admin token configured" if status == 403 else "missing or wrong token",
                        self._refusals_unlogged)
            self._refusal_logged_at = now
            self._refusals_unlogged = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), READ_TIMEOUT_S)
            if len(line) > REQUEST_LINE_LIMIT:
                return
            length, authorization, header_lines = 0, None, 0
            while True:                          # headers: only the body length and credentials matter
                header = await asyncio.wait_for(reader.readline(), READ_TIMEOUT_S)
                if header in (b"\r\n", b"\n", b""):
                    break
                header_lines += 1
                if header_lines > MAX_HEADER_LINES:
                    return
                name, _, value = header.decode("latin-1").partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    length = int(value.strip() or 0)
                elif name == "authorization":
                    authorization = value
            parts = line.decode("latin-1").split()
            method, path = (parts[0], parts[1].split("?")[0]) if len(parts) >= 2 else ("", "")
            handlers = self.routes.get(path)
            if handlers is not None and not isinstance(handlers, dict):
                handlers = {"GET": handlers}                  # a bare route answers GET
            extra_headers = ""
            if handlers is None:
                status, ctype, body = 404, "text/plain", b"not found\n"
            elif length > MAX_BODY_BYTES or length < 0:
                status, ctype, body = 413, "text/plain", b"body too large\n"
            elif (method if method != "HEAD" else "GET") not in handlers:
                allowed = ", ".join(sorted(handlers))
                status, ctype, body = 405, "text/plain", f"allowed: {allowed}\n".encode()
            elif path in self.protected and (refusal := self._authorize(authorization)) is not None:
                status, ctype, body = refusal
                self._log_refusal(method, path, writer.get_extra_info("peername"), status)
                if status == 401:
                    extra_headers = 'WWW-Authenticate: Bearer realm="kproxy-admin"\r\n'
            else:
                request_body = await asyncio.wait_for(reader.readexactly(length), READ_TIMEOUT_S) \
                    if length else b""
                handler = handlers[method if method != "HEAD" else "GET"]
                try:
                    status, ctype, body = await (handler(request_body) if method == "POST" else handler())
                except Exception:                 # noqa: BLE001 - a bug answers 500, never a dropped socket
                    log.exception("admin: %s %s failed", method, path)
                    status, ctype, body = 500, "text/plain", b"internal error (logged)\n"
            head = (f"HTTP/1.1 {status} {REASONS.get(status, '')}\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(body)}\r\n{extra_headers}Connection: close\r\n\r\n").encode()
            writer.write(head + (body if method != "HEAD" else b""))
            await writer.drain()
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError,
                UnicodeDecodeError, ValueError):
            pass
        finally:
            writer.close()
