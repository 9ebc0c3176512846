"""Start and stop a whole kproxy: the proxy listeners plus the admin listener.

Used by ``kproxy run``, the demo and end-to-end tests, so all three run the
same wiring. Shutdown order: stop accepting connections and reading new requests
(``/readyz`` turns 503), close each connection once its in-flight requests are
answered (all by ``shutdown_timeout``), close the admin port.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Iterable

from .config import Config
from .proxy.admin import AdminServer, upstream_reachable
from .proxy.relay import Observer
from .proxy.server import Proxy

log = logging.getLogger("kproxy")


class Runtime:
    def __init__(self, config: Config, observers: Iterable[Observer] = ()):
        self.config = config
        self.proxy = Proxy(config, observers)
        self.admin = AdminServer({"/healthz": self._healthz, "/readyz": self._readyz})

    async def _healthz(self):
        return 200, "text/plain", b"ok\n"

    async def _readyz(self):
        if not self.proxy.started:
            return 503, "text/plain", b"starting\n"
        if self.proxy.stopping:             # draining: load balancers should send no one new
            return 503, "text/plain", b"stopping\n"
        ok, detail = await upstream_reachable(self.config.upstreams)
        return (200 if ok else 503), "text/plain", (detail + "\n").encode()

    @property
    def admin_url(self) -> str | None:
        if self.admin.server is None:
            return None
        host, port = self.admin.address
        return f"http://{host}:{port}"

    async def start(self) -> None:
        await self.proxy.start()
        if self.config.admin_listen is not None:
            await self.admin.start(*self.config.admin_listen)

    async def stop(self) -> None:
        await self.proxy.stop()
        await self.admin.stop()

    async def run_until_signalled(self) -> None:
        """Serve until SIGTERM or SIGINT, then shut down gracefully."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        try:
            await stop.wait()
            log.info("signal received: shutting down (up to %gs for in-flight requests)",
                     self.config.shutdown_timeout)
        finally:
            await self.stop()
