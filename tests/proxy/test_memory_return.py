"""Issue 10, item 7: memory goes back to the system after a burst.

2,000 connections holding half-frames left kproxy at 357 MB once they had closed: the
closed connections' frames waited for a full garbage collection (relay and endpoints
refer to each other), and the heap's freed pages stayed with the process (glibc keeps
free memory in the middle of its heap). kproxy now drops a connection's frames when it
closes and trims the heap once a burst of held frames is over.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time

import pytest

from kproxy.proxy import memory as memory_module
from kproxy.proxy.memory import TRIM_AFTER_BURST_BYTES, BufferBudget
from tests.protocol.frames import produce_v9
from tests.proxy.harness import KproxyProcess, rss, wait_for

pytestmark = [pytest.mark.timeout(180)]

BURST_CONNECTIONS = 500
FRAME_BYTES = 256 * 1024          # held whole (far below the streaming threshold)
SETTLE_TIMEOUT_S = 60.0           # generous: the trim waits for a quiet second, then runs in a thread


class Side:
    def __init__(self):
        self.held = 0

    def pause(self, why):
        pass

    def resume(self, why):
        pass


def test_the_budget_trims_once_a_burst_is_over_and_not_during_it(monkeypatch):
    monkeypatch.setattr(memory_module, "TRIM_QUIET_S", 0.05)
    monkeypatch.setattr(memory_module, "TRIM_MIN_INTERVAL_S", 0.3)
    trims = []

    async def scenario():
        budget = BufferBudget(limit=1 << 40, trim=lambda: trims.append(time.monotonic()))
        sides = [Side() for _ in range(4)]
        for side in sides:
            budget.update(side, TRIM_AFTER_BURST_BYTES // 2)     # a burst: 2x the threshold held
        budget.forget(sides[0])
        await asyncio.sleep(0.2)
        assert trims == []                      # 3/4 of the peak still held: the burst goes on
        for side in sides[1:]:
            budget.forget(side)
        await asyncio.sleep(0.2)
        assert len(trims) == 1                  # over: trimmed once
        for side in sides:                      # a second burst at once: rate-limited
            budget.update(side, TRIM_AFTER_BURST_BYTES // 2)
        for side in sides:
            budget.forget(side)
        await asyncio.sleep(0.1)
        assert len(trims) == 1
        await asyncio.sleep(0.5)
        assert len(trims) == 2
        small = Side()                          # ordinary traffic: no trims
        budget.update(small, 1 << 20)
        budget.update(small, 0)
        await asyncio.sleep(0.5)
        assert len(trims) == 2

    asyncio.run(scenario())


class DiscardUpstream:
    """Reads everything, answers nothing (partial requests are never answered anyway)."""

    def __init__(self):
        self.received = 0
        self.loop = asyncio.new_event_loop()
        self.server = None
        outer = self

        class Discard(asyncio.Protocol):
            def data_received(self, data):
                outer.received += len(data)

        async def serve():
            self.server = await self.loop.create_server(Discard, "127.0.0.1", 0, backlog=1024)
            return self.server.sockets[0].getsockname()[1]

        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.port = asyncio.run_coroutine_threadsafe(serve(), self.loop).result(10)

    def close(self):
        async def stop():
            self.server.close()
        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


def test_rss_falls_back_after_a_burst_of_half_frames_closes(tmp_path):
    upstream = DiscardUpstream()
    rest = b"\x00\x00\x03\xe8\x01\x00"
    frame = produce_v9(1, acks=1, rest=rest + b"r" * (FRAME_BYTES - len(rest)))
    half = frame[:len(frame) // 2]
    # /healthz: an upstream that never answers is never ready.
    with contextlib.closing(upstream), \
            KproxyProcess(tmp_path, upstream=f"127.0.0.1:{upstream.port}", broker_port_base=0,
                          ready="/healthz") as kproxy, contextlib.ExitStack() as clients:
        before = rss(kproxy.pid)
        for _ in range(BURST_CONNECTIONS):
            client = clients.enter_context(socket.create_connection(("127.0.0.1", kproxy.listen_port)))
            client.sendall(half)
        wait_for(lambda: upstream.received >= len(half) * BURST_CONNECTIONS, 30, "the burst to pass")
        peak = rss(kproxy.pid)
        added = peak - before
        assert added > BURST_CONNECTIONS * len(half) // 2      # the burst was held: something to give back
        clients.close()
        wait_for(lambda: rss(kproxy.pid) < peak - added // 2, SETTLE_TIMEOUT_S,
                 f"RSS to fall by half of the {added >> 20} MiB the burst added (peak {peak >> 20} MiB)")
