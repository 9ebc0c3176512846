"""Run a real kproxy Runtime on its own event-loop thread, for tests driving blocking clients."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from typing import Iterable

import uvloop

from kproxy import config as config_module
from kproxy.runtime import Runtime

START_TIMEOUT_S = 10.0


def free_ports(n: int) -> list[int]:
    """n distinct loopback ports free right now (all bound at once, so no repeats).

    Free *now* only: another process may take one before it is used. Only for tests of
    fixed port rules; kproxy's own ports are best left to the OS (``ProxyThread``'s
    default), which kproxy binds first and then advertises.
    """
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def _proc_stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name; None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` now."""
    return [child for child in map(int, filter(str.isdigit, os.listdir("/proc")))
            if (_proc_stat(child) or [None, None])[1] == str(pid)]


def process_state(pid: int) -> str | None:
    """``pid``'s state letter (R, S, T for stopped, Z ...); None once it is gone."""
    fields = _proc_stat(pid)
    return None if fields is None else fields[0]


def exited(pid: int) -> bool:
    """True once ``pid`` has ended (gone, or a zombie nobody reaped yet)."""
    return process_state(pid) in (None, "Z", "X")


class ProxyThread:
    """``with ProxyThread(upstream=..., ...) as proxy: proxy.bootstrap`` → "127.0.0.1:PORT".

    Every port defaults to 0 (broker listeners too, in gateway mode): kproxy binds first
    and advertises what it bound, so no race with other processes for a free port.
    """

    def __init__(self, observers: Iterable = (), **settings):
        settings.setdefault("listen", "127.0.0.1:0")
        settings.setdefault("admin_listen", "127.0.0.1:0")
        if settings.get("mode", "gateway") == "gateway" and settings.get("routing") != "sni":
            settings.setdefault("broker_port_base", 0)
        self.config = config_module.build(settings)
        self.runtime = Runtime(self.config, observers)
        self.loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="kproxy")

    def call(self, coro, timeout: float = START_TIMEOUT_S):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def __enter__(self) -> "ProxyThread":
        self._thread.start()
        self.call(self.runtime.start())
        return self

    def __exit__(self, *exc) -> None:
        self.call(self.runtime.stop(), timeout=self.config.shutdown_timeout + 10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)

    @property
    def bootstrap(self) -> str:
        host, port = self.runtime.proxy.bootstrap_address
        return f"{host}:{port}"

    @property
    def admin_url(self) -> str:
        return self.runtime.admin_url

    def served_broker_addresses(self) -> set[tuple[str, int]]:
        """The broker addresses kproxy hands out now (gateway: listeners it has bound)."""
        return set(self.runtime.proxy.broker_addresses().values())
