"""Clients that pipeline without reading share the event loop with everyone else (``fairness.py``).

Ten connections send ApiVersions v0 as fast as kproxy takes them and never read an
answer, in front of a real Kafka 4.4 broker; an ordinary client beside them makes one
request at a time. Each pipelining read brings hundreds of requests, and their answers
come by the hundred: the observers' work for them used to run in every connection's own
callback each turn (ten at once), so a turn took as long as ten connections' steps.
Now it waits in one queue per event loop that gets a bounded number of events per turn
for all those connections together, and their reads wait until it is done.

What is asserted is behaviour, counted in loop turns (a callback that re-queues itself
each turn counts them), not time: the ordinary client is answered in order throughout;
per turn, events handed to observers outside a read callback (the deferred ones) stay
within ``DEFERRED_EVENTS_PER_TURN``, also while the pipelining connections close with
events still waiting; a read callback hands over at most one read's few
events per side at once; every connection's requests reach observers in order, paired
with their answers. How long the ordinary client waits is ``bench_hostile_memory.py``'s.
"""

from __future__ import annotations

import socket
import struct
import sys
import threading
import time
from collections import defaultdict

import pytest

from kproxy.protocol.events import RequestReceived
from kproxy.proxy.fairness import DEFERRED_EVENTS_PER_TURN
from kproxy.proxy.relay import OBSERVER_EVENTS_PER_CHECK
from tests.proxy.harness import wait_for
from tests.proxy.wire import API_VERSIONS, CLOSE_TIMEOUT_S, RawClient, api_versions_ok

pytestmark = [pytest.mark.timeout(180)]

PIPELINERS = 10
PIPELINED_REQUESTS = 20_000          # each: ~420 KB, far more than kproxy takes in the test
PIPELINED_VERSION = 0                # theirs; the ordinary client asks ApiVersions v3
PIPELINE_S = 3.0                     # how long the ordinary client works beside them
CANARY_PAUSE_S = 0.02                # its pace between requests
MIN_CANARY_REQUESTS = 5              # answered while the others pipelined
MIN_DEFERRED_TURNS = 20              # turns that did deferred work: the flood was on
PIPELINER_RCVBUF = 4096              # they never read: keep what the kernel takes of answers small
SEND_TIMEOUT_S = 0.2                 # a blocked send looks at the stop flag this often


def api_versions_v0(correlation_id: int) -> bytes:
    """ApiVersions v0 (header v1, client id "pipeliner", empty body)."""
    client_id = b"pipeliner"
    body = struct.pack(">hhih", API_VERSIONS, PIPELINED_VERSION, correlation_id, len(client_id)) + client_id
    return struct.pack(">i", len(body)) + body


class TurnProbe:
    """An observer that notes, per loop turn, who got which events and from where.

    ``tick`` re-queues itself with ``call_soon``: it runs once per turn of the loop, so the
    turn an event is observed in is the number of ticks so far. An event is *inline* when
    observed within a read callback (``buffer_updated`` on the stack), *deferred* otherwise."""

    def __init__(self):
        self.turn = 0
        self.on = True
        self.deferred: dict[int, int] = defaultdict(int)                 # turn -> events
        self.inline: dict[tuple[int, int], int] = defaultdict(int)       # (turn, connection) -> events
        self.requests: dict[int, list[int]] = defaultdict(list)         # connection -> correlation ids
        self.answered: dict[int, list[int]] = defaultdict(list)

    def tick(self, loop) -> None:
        self.turn += 1
        if self.on:
            loop.call_soon(self.tick, loop)

    def __call__(self, info, events) -> None:
        if not self.on:
            return
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_name != "buffer_updated":
            frame = frame.f_back
        if frame is None:
            self.deferred[self.turn] += len(events)
        else:
            self.inline[(self.turn, info.id)] += len(events)
        for event in events:
            request = event if event.__class__ is RequestReceived else event.request_event
            if request.api_version != PIPELINED_VERSION:
                continue                     # the ordinary client's
            if event is request:
                self.requests[info.id].append(event.correlation_id)
            else:
                assert event.correlation_id == request.correlation_id
                self.answered[info.id].append(event.correlation_id)


def _pipeline(port: int, data: bytes, stop: threading.Event) -> None:
    """Send ``data`` as fast as kproxy takes it (it stops taking it at the in-flight cap)."""
    sock = RawClient(("127.0.0.1", port), rcvbuf=PIPELINER_RCVBUF).sock
    sock.settimeout(SEND_TIMEOUT_S)
    pending = memoryview(data)
    try:
        while pending and not stop.is_set():
            try:
                pending = pending[sock.send(pending):]
            except socket.timeout:
                continue
        stop.wait()
    finally:
        sock.close()


def open_relays(proxy) -> list:
    async def relays():
        return [r for r in proxy.runtime.proxy.relays if r.tracker is not None]
    return proxy.call(relays())


def test_pipelining_clients_that_never_read_get_a_bounded_share_of_each_loop_turn(start_proxy):
    probe = TurnProbe()
    proxy = start_proxy(observers=[probe])
    port = int(proxy.bootstrap.rsplit(":", 1)[1])
    canary = RawClient(proxy.bootstrap)
    api_versions_ok(canary)                  # its connection is up before the flood
    proxy.loop.call_soon_threadsafe(probe.tick, proxy.loop)
    data = b"".join(api_versions_v0(i + 1) for i in range(PIPELINED_REQUESTS))
    stop = threading.Event()
    threads = [threading.Thread(target=_pipeline, args=(port, data, stop), daemon=True)
               for _ in range(PIPELINERS)]
    for thread in threads:
        thread.start()
    answered = 0
    try:
        ends = time.monotonic() + PIPELINE_S
        while time.monotonic() < ends:
            api_versions_ok(canary)          # answered, with its own correlation id, or raises
            answered += 1
            time.sleep(CANARY_PAUSE_S)
        stop.set()                           # they close with events still waiting: counted too
        for thread in threads:
            thread.join(CLOSE_TIMEOUT_S)
        wait_for(lambda: len(open_relays(proxy)) == 1, CLOSE_TIMEOUT_S, "the pipelining connections to close")
    finally:
        probe.on = False
        stop.set()
        canary.close()
    assert answered >= MIN_CANARY_REQUESTS
    assert len(probe.deferred) >= MIN_DEFERRED_TURNS, "the pipelining clients' work was never deferred"
    assert max(probe.deferred.values()) <= DEFERRED_EVENTS_PER_TURN
    # A read hands over at most its few events at once, per side (a client read and a broker read).
    assert max(probe.inline.values()) <= 2 * OBSERVER_EVENTS_PER_CHECK
    assert len(probe.requests) == PIPELINERS
    for connection in probe.requests:
        ids = probe.requests[connection]
        assert ids == list(range(1, len(ids) + 1))                     # in order, none skipped
        answers = probe.answered[connection]
        assert answers == ids[:len(answers)] and answers            # answered in order
