"""The admin HTTP listener: liveness, readiness (and, later, metrics).

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

Route = Callable[[], Awaitable[tuple[int, str, bytes]]]    # -> (status, content type, body)
REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


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
            while True:                                       # skip headers
                header = await asyncio.wait_for(reader.readline(), READ_TIMEOUT_S)
                if header in (b"\r\n", b"\n", b""):
                    break
            parts = line.decode("latin-1").split()
            method, path = (parts[0], parts[1].split("?")[0]) if len(parts) >= 2 else ("", "")
            route = self.routes.get(path)
            if route is None:
                status, ctype, body = 404, "text/plain", b"not found\n"
            elif method not in ("GET", "HEAD"):
                status, ctype, body = 405, "text/plain", b"GET only\n"
            else:
                status, ctype, body = await route()
            head = (f"HTTP/1.1 {status} {REASONS.get(status, '')}\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
            writer.write(head + (body if method != "HEAD" else b""))
            await writer.drain()
        except (asyncio.TimeoutError, ConnectionError, UnicodeDecodeError):
            pass
        finally:
            writer.close()
