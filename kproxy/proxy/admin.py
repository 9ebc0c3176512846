"""The admin HTTP listener: liveness, readiness, metrics, capture control.

A deliberately tiny HTTP/1.1 responder on asyncio streams: probes and
scrapes need GET and a status line, nothing more, and it keeps the admin
port free of extra dependencies.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

log = logging.getLogger("kproxy.admin")

REQUEST_LINE_LIMIT = 8192          # bytes; anything longer is not a probe
READ_TIMEOUT_S = 5.0               # a client that sends nothing is dropped after this
READINESS_TIMEOUT_S = 2.0          # upstream connect check for /readyz
MAX_BODY_BYTES = 64 * 1024         # capture settings fit in far less; anything bigger is a mistake

# GET: () -> (status, content type, body); POST: (request body) -> the same.
Route = Callable[..., Awaitable[tuple[int, str, bytes]]]
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           409: "Conflict", 413: "Content Too Large", 500: "Internal Server Error",
           503: "Service Unavailable"}


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
    def __init__(self, routes: dict[str, Route]):
        self.routes = routes
        self.server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> None:
        self.server = await asyncio.start_server(self._handle, host, port)

    @property
    def address(self) -> tuple[str, int]:
        return self.server.sockets[0].getsockname()[:2]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), READ_TIMEOUT_S)
            if len(line) > REQUEST_LINE_LIMIT:
                return
            length = 0
            while True:                                       # headers: only the body length matters
                header = await asyncio.wait_for(reader.readline(), READ_TIMEOUT_S)
                if header in (b"\r\n", b"\n", b""):
                    break
                name, _, value = header.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip() or 0)
            parts = line.decode("latin-1").split()
            method, path = (parts[0], parts[1].split("?")[0]) if len(parts) >= 2 else ("", "")
            handlers = self.routes.get(path)
            if handlers is not None and not isinstance(handlers, dict):
                handlers = {"GET": handlers}                  # a bare route answers GET
            if handlers is None:
                status, ctype, body = 404, "text/plain", b"not found\n"
            elif length > MAX_BODY_BYTES or length < 0:
                status, ctype, body = 413, "text/plain", b"body too large\n"
            elif (method if method != "HEAD" else "GET") not in handlers:
                allowed = ", ".join(sorted(handlers))
                status, ctype, body = 405, "text/plain", f"allowed: {allowed}\n".encode()
            else:
                request_body = await asyncio.wait_for(reader.readexactly(length), READ_TIMEOUT_S) \
                    if length else b""
                handler = handlers[method if method != "HEAD" else "GET"]
                status, ctype, body = await (handler(request_body) if method == "POST" else handler())
            head = (f"HTTP/1.1 {status} {REASONS.get(status, '')}\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
            writer.write(head + (body if method != "HEAD" else b""))
            await writer.drain()
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError,
                UnicodeDecodeError, ValueError):
            pass
        finally:
            writer.close()
