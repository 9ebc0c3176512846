"""The probe listener: ``/healthz`` and ``/readyz`` on a port and a thread of their own.

On the admin port a probe shares the kernel's accept queue and the event loop
with every scrape, live stream and capture call: during a storm of 1,000
scrapes it waited behind the wave's connections (hundreds of ms), and a kubelet
whose probes time out restarts a kproxy that was only busy. The probe listener
(``probe_listen``) is an ``AdminServer`` (the same limits against slow and
malformed callers) serving only the two probes, run by an event loop in a
thread of its own: its answers wait for neither the admin port's queue nor
the proxy's event loop, only for the interpreter lock (handed over within
``PROBE_SWITCH_INTERVAL_S``, except during a garbage collection, which keeps it).

Answered from another thread, ``/healthz`` must still tell the truth about the
proxy's loop: the loop stamps a heartbeat every ``HEARTBEAT_INTERVAL_S``
(``LoopHeartbeat``), and ``/healthz`` is 503 once it has not turned for
``LOOP_STALL_LIMIT_S``. ``/readyz`` answers what the admin port's does (the
runtime's checks; the broker's ApiVersions answer is cached): when that answer
has expired the proxy's loop, which owns every upstream connection, runs the
check and the probe waits for it at most ``READY_WAIT_S`` (a loop too busy to
run it within that is reported as not ready).
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from typing import Callable

from .admin import AdminServer, Route

# How often the proxy's event loop stamps its heartbeat: often enough that a healthy
# loop is never mistaken for a stalled one, rarely enough to cost nothing (4 callbacks/s).
HEARTBEAT_INTERVAL_S = 0.25
# /healthz fails once the loop has not turned for this long. Nothing kproxy does on the
# loop takes more than milliseconds (rendering and capture run in threads); a loop silent
# for seconds serves no client, and Kafka clients time requests out after 30 s. The
# shipped liveness probes restart after three failures 10 s apart.
LOOP_STALL_LIMIT_S = 5.0
# A /readyz whose cached answer expired waits this long for the proxy's loop to ask the
# broker (the check itself gives up after own_requests.READINESS_TIMEOUT_S, 2 s); below
# the shipped readiness probes' 3 s timeout, so they get an answer, not a timeout.
READY_WAIT_S = 2.5
# How long a thread that wants the interpreter lock waits before the running one must
# hand it over (Python's default: 5 ms). A probe needs the lock several times (accept,
# read, answer, close): during a scrape storm the probe port's median was 7-10 ms at 5 ms,
# 4-6 ms at this (benchmarks/bench_admin.py). Set while the probe listener runs. With no
# other thread waiting it costs nothing; between the loop and the render or capture
# threads it only makes their turns shorter, not their shares different.
PROBE_SWITCH_INTERVAL_S = 0.0005
# The probe listener's thread binds within this at start, or kproxy does not start.
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0

_TEXT = "text/plain"


class LoopHeartbeat:
    """The proxy's event loop stamps ``last`` every ``interval``; ``health()`` (callable
    from any thread) is the ``/healthz`` answer: 503 once the loop has been silent for
    more than ``stall_limit`` seconds."""

    def __init__(self, interval: float = HEARTBEAT_INTERVAL_S, stall_limit: float = LOOP_STALL_LIMIT_S,
                 clock: Callable[[], float] = time.monotonic):
        self.interval = interval
        self.stall_limit = stall_limit
        self.clock = clock
        self.last: float | None = None          # None until started: nothing to judge yet
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._beat()

    def _beat(self) -> None:
        self.last = self.clock()
        self._next = self._loop.call_later(self.interval, self._beat)

    def stop(self) -> None:
        if self._next is not None:
            self._next.cancel()
            self._next = None
        self.last = None

    def silent_for(self) -> float:
        """Seconds since the loop last turned (0 before it started)."""
        last = self.last
        return 0.0 if last is None else max(0.0, self.clock() - last)

    def health(self) -> tuple[int, str, bytes]:
        silent = self.silent_for()
        if silent > self.stall_limit:
            return 503, _TEXT, (f"event loop stalled: it has not turned for {silent:.1f}s "
                                f"(limit {self.stall_limit:g}s)\n").encode()
        return 200, _TEXT, b"ok\n"


class ProbeListener:
    """An ``AdminServer`` for ``routes``, run by an event loop in a thread of its own.

    ``start``/``stop`` are blocking (call them through ``asyncio.to_thread`` from a loop);
    ``start`` raises what binding raised. The routes run on the probe thread's loop.
    """

    def __init__(self, routes: dict[str, Route]):
        self.server = AdminServer(routes)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self, host: str, port: int) -> None:
        loop = asyncio.new_event_loop()
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval, PROBE_SWITCH_INTERVAL_S))
        thread = threading.Thread(target=loop.run_forever, name="kproxy-probes", daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        try:
            asyncio.run_coroutine_threadsafe(self.server.start(host, port), loop).result(START_TIMEOUT_S)
        except BaseException:
            self._end_thread()
            raise

    @property
    def address(self) -> tuple[str, int]:
        return self.server.address

    @property
    def running(self) -> bool:
        return self.server.server is not None

    def stop(self) -> None:
        if self._loop is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(STOP_TIMEOUT_S)
        finally:
            self._end_thread()

    def _end_thread(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        sys.setswitchinterval(self._switch_interval)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(STOP_TIMEOUT_S)
        if not thread.is_alive():
            loop.close()


async def on_loop(loop: asyncio.AbstractEventLoop, coro_factory: Callable, timeout: float):
    """Run ``coro_factory()`` on ``loop`` (another thread's) and await its result here,
    for at most ``timeout`` seconds (``asyncio.TimeoutError``; the call is then cancelled)."""
    future = asyncio.run_coroutine_threadsafe(coro_factory(), loop)
    return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
