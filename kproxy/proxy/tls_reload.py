"""TLS certificates, keys and CAs reloaded while kproxy runs, without dropping a connection.

One ``ReloadingContext`` per side (``server``: what clients are shown; ``client``: what
kproxy shows brokers and trusts them by). ``current`` is always a whole, checked SSL
context; a reload builds a new one from a fresh ``tls_files.Snapshot`` and swaps it in
only if every file checked out. A failed reload keeps the old context and logs one
WARNING naming the setting and the cause; the same broken files are not retried (or
logged again) until they change, or SIGHUP asks.

Who picks the new context up: a connection's context is fixed when its handshake starts.
Upstream connections take ``current`` at each connect. A listener's context is fixed when
asyncio creates the server, so listeners keep one context for good (``Proxy._server_ssl``)
whose SNI callback -- run early in every handshake, before the certificate is chosen --
switches the handshake to ``current`` (``ssl_object.context = ...``, the documented way).
Established connections keep the context they started with; nothing is re-bound.

Why polling: a Kubernetes Secret volume is updated by swapping a ``..data`` symlink, which
inotify on the file never sees, and some volumes have no change events at all. Reading a
few small files every ``POLL_INTERVAL_S`` costs nothing measurable.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import Callable

from ..observers.contract import Hook
from .relay import notify_hook
from ..certs.tls_files import Material, Snapshot, TLSFilesError, file_settings, load, read

log = logging.getLogger("kproxy.tls")

# How often the files are read for a change. cert-manager renews weeks ahead of expiry and
# the kubelet takes up to a minute or two to update a mounted Secret, so seconds are plenty;
# reading a few KiB that often costs nothing.
POLL_INTERVAL_S = 5.0
# A change is acted on once the files read the same twice this far apart: a writer that
# replaces the certificate and then the key (cp, cp) is not caught half-way and warned about.
SETTLE_S = 1.0


class ReloadingContext:
    """One side's SSL context, rebuilt from its files when they change or when asked.

    ``build(material)`` makes a context from checked material. ``observers`` hear
    ``tls_certificate_loaded(side, not_after)`` and ``tls_reloaded(side, outcome)``.
    Raises ``TLSFilesError`` if the files cannot be used at start.
    """

    def __init__(self, side: str, key: str, tls, build: Callable[[Material], ssl.SSLContext],
                 observers: list):
        self.side, self.key, self.tls = side, key, tls
        self._build = build
        self._observers = observers
        self.material = load(key, tls)
        self.current = build(self.material)
        self.loaded_at = time.time()
        self._failed_digest: str | None = None      # broken files already warned about
        self._lock = asyncio.Lock()
        self._on_change: list[Callable[[Material], None]] = []
        self.files = sorted(file_settings(tls).values())
        notify_hook(observers, Hook.TLS_CERTIFICATE_LOADED, side, self.material.not_after)
        if self.files:
            log.info("TLS %s: %s; watching %s for changes every %gs (and on SIGHUP)", side,
                     self.material.describe(), ", ".join(self.files), POLL_INTERVAL_S)
        else:
            log.info("TLS %s: no files (the system trust store)", side)

    def on_change(self, callback: Callable[[Material], None]) -> None:
        """``callback(material)`` after each successful reload."""
        self._on_change.append(callback)

    async def watch(self) -> None:
        """Poll the files until cancelled."""
        while True:
            await asyncio.sleep(POLL_INTERVAL_S)
            try:
                await self._check()
            except Exception:                        # noqa: BLE001 - the watch must go on
                log.exception("TLS %s: checking the files for a change failed", self.side)

    async def _check(self) -> None:
        snap = await asyncio.to_thread(read, self.tls)
        if snap.digest in (self.material.digest, self._failed_digest):
            return
        await asyncio.sleep(SETTLE_S)
        again = await asyncio.to_thread(read, self.tls)
        if again.digest != snap.digest:             # still being written: look next time
            return
        await self.reload("files changed", again)

    async def reload(self, why: str, snap: Snapshot | None = None) -> bool:
        """Build a context from the files (read now unless given) and swap it in; False
        (the old context kept, one WARNING) if they cannot be used."""
        async with self._lock:
            snap = snap or await asyncio.to_thread(read, self.tls)
            try:
                material, ctx = await asyncio.to_thread(self._load, snap)
            except (TLSFilesError, ssl.SSLError, ValueError) as exc:
                self._failed_digest = snap.digest
                notify_hook(self._observers, Hook.TLS_RELOADED, self.side, "failure")
                log.warning("TLS %s: not reloaded (%s): %s; still using the %s loaded at %s", self.side,
                            why, exc, self.material.describe(),
                            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.loaded_at)))
                return False
            self.material, self.current, self.loaded_at = material, ctx, time.time()
            self._failed_digest = None
            notify_hook(self._observers, Hook.TLS_RELOADED, self.side, "success")
            notify_hook(self._observers, Hook.TLS_CERTIFICATE_LOADED, self.side, material.not_after)
            log.info("TLS %s: reloaded (%s): %s; new handshakes use it, open connections keep theirs",
                     self.side, why, material.describe())
            for callback in self._on_change:
                callback(material)
            return True

    def _load(self, snap: Snapshot) -> tuple[Material, ssl.SSLContext]:
        material = load(self.key, self.tls, snap)
        return material, self._build(material)
