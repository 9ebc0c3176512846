"""Issue 10, items 4 and 8: what one connection may cost everybody else.

- A client pipelining requests without reading answers had every one of them
  forwarded and tracked (14,016 in flight in the issue): kproxy now stops reading a
  client with ``MAX_IN_FLIGHT_PER_CONNECTION`` unanswered.
- One read of thousands of tiny requests went to the observers in one synchronous
  step (435 ms in the issue): observers now get at most ``EVENTS_PER_STEP`` events at a
  time, in order (``fairness.py``).
- A request trickled a byte at a time kept its connection open forever (every byte is
  activity): a request must now be complete ``REQUEST_DEADLINE_S`` after its first byte.
- Item 7: connections each sending most of a large frame held it all (5 x 96 MiB took
  RSS to 659 MB): past a process-wide buffer budget kproxy stops reading the sides
  that hold incomplete frames, all but one, and every frame still completes.

Real Kafka 4.4 broker, raw sockets sending exactly the bytes in question.
"""

from __future__ import annotations

import struct
import threading
import time

import pytest

from kproxy.protocol.events import RequestReceived
from kproxy.proxy import memory as memory_module
from kproxy.proxy import relay as relay_module
from kproxy.proxy.fairness import EVENTS_PER_STEP
from kproxy.proxy.relay import MAX_IN_FLIGHT_PER_CONNECTION, PIPELINED_READ_BYTES, READ_CHUNK
from tests.protocol.frames import produce_v9
from tests.proxy.harness import wait_for
from tests.proxy.wire import (API_VERSIONS, CLOSE_TIMEOUT_S, FETCH, FETCH_VERSION, METADATA, RawClient,
                              close_reasons, fetch_fields, request_frame)

pytestmark = [pytest.mark.timeout(120)]

PIPELINED_FETCHES = 20_000        # ~1.4 MB of long-polls: far more than the cap, more than one read
LONG_POLL_MS = 5_000              # the broker answers one of them per this (no data, and it reads one at a time)
PIPELINED_API_VERSIONS = 10_000   # tiny requests: thousands in one read
# Until the observer has seen them all: the broker answers them a cap-full at a time.
# More than 10 s on a machine shared with other test runs (load ~50 on 2 cores); a
# deadline, not a speed target (the test returns as soon as they are seen).
FLOOD_OBSERVED_TIMEOUT_S = 120.0
SETTLE_S = 2.0                    # how long the pipelining client is watched
TRICKLE_DEADLINE_S = 1.5          # the request deadline, shortened for the test
TRICKLE_INTERVAL_S = 0.3          # one byte this often: active, never complete
BUDGET_BYTES = 4 * 1024 * 1024    # the process-wide buffer budget, shortened for the test
BIG_FRAME_BYTES = 3 * 1024 * 1024
BIG_FRAME_CLIENTS = 8             # 8 x 2.5 MiB held without a budget: 5 times the budget
BIG_FRAME_FIRST_PART = 5 / 6      # what each client sends before the test lets it finish


def send_in_background(client: RawClient, data: bytes) -> None:
    """sendall without blocking the test: kproxy may (should) stop reading part way."""
    def send():
        try:
            client.sock.sendall(data)
        except OSError:
            pass                   # closed by the test when it is done
    threading.Thread(target=send, daemon=True).start()


def relay_in_flight(proxy) -> list[int]:
    async def states():
        return [(r.in_flight, r.bytes_from_client) for r in proxy.runtime.proxy.relays if r.tracker]
    return proxy.call(states())


def test_a_pipelining_client_is_not_read_past_the_in_flight_cap(start_proxy, topic):
    proxy = start_proxy(shutdown_timeout=1.0)      # its long polls need not be waited for
    client = RawClient(proxy.bootstrap)
    frames = [request_frame(FETCH, FETCH_VERSION, i + 1, **fetch_fields(topic, max_wait_ms=LONG_POLL_MS))
              for i in range(PIPELINED_FETCHES)]
    data = b"".join(frames)
    send_in_background(client, data)
    seen = []
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        seen += relay_in_flight(proxy)
        time.sleep(0.05)
    client.close()
    # One read may carry the rest of a request and PIPELINED_READ_BYTES of new ones past the
    # cap, never more (its first read too: it once took up to READ_CHUNK).
    bound = MAX_IN_FLIGHT_PER_CONNECTION + PIPELINED_READ_BYTES // len(frames[0]) + 1
    assert bound < PIPELINED_FETCHES
    assert max(in_flight for in_flight, _ in seen) >= MAX_IN_FLIGHT_PER_CONNECTION   # the cap was met
    assert max(in_flight for in_flight, _ in seen) <= bound
    assert max(read for _, read in seen) < len(data)                                  # reading stopped


def test_observers_get_a_flood_of_pipelined_requests_a_step_at_a_time_in_order(start_proxy):
    batches = []

    def observer(info, events):
        batches.append([e.correlation_id for e in events if isinstance(e, RequestReceived)])

    proxy = start_proxy(observers=[observer])
    client = RawClient(proxy.bootstrap)
    data = b"".join(request_frame(API_VERSIONS, 0, i + 1) for i in range(PIPELINED_API_VERSIONS))
    send_in_background(client, data)
    wait_for(lambda: sum(map(len, batches)) >= PIPELINED_API_VERSIONS, FLOOD_OBSERVED_TIMEOUT_S,
             "the observer to see every request")
    client.close()
    assert max(map(len, batches)) <= EVENTS_PER_STEP
    observed = [cid for batch in batches for cid in batch]
    assert observed[:PIPELINED_API_VERSIONS] == list(range(1, PIPELINED_API_VERSIONS + 1))


def test_a_trickled_request_closes_at_the_request_deadline(start_proxy, kproxy_log, monkeypatch):
    monkeypatch.setattr(relay_module, "REQUEST_DEADLINE_S", TRICKLE_DEADLINE_S)
    proxy = start_proxy()
    client = RawClient(proxy.bootstrap)
    frame = request_frame(METADATA, 12, 1, topics=None)
    started = time.monotonic()
    closed = False
    for i in range(len(frame) - 1):           # never the last byte
        try:
            client.send(frame[i:i + 1])
        except OSError:
            closed = True
            break
        if time.monotonic() - started > CLOSE_TIMEOUT_S:
            break
        time.sleep(TRICKLE_INTERVAL_S)
        if not relay_in_flight(proxy):
            closed = True
            break
    client.close()
    assert closed, f"connection still open {time.monotonic() - started:.1f}s into a trickled request"
    wait_for(lambda: close_reasons(kproxy_log), CLOSE_TIMEOUT_S, "the close to be logged")
    assert any("request not complete" in reason for reason in close_reasons(kproxy_log))


def test_large_incomplete_frames_are_held_within_the_buffer_budget(start_proxy, monkeypatch):
    monkeypatch.setattr(memory_module, "DEFAULT_BUFFER_BUDGET", BUDGET_BYTES)
    proxy = start_proxy()
    # A Produce Kafka answers although its body ends in trailing bytes (megabytes of them).
    rest = struct.pack(">i", 1000) + b"\x01\x00"
    frame = produce_v9(1, acks=1, rest=rest + b"j" * (BIG_FRAME_BYTES - len(rest)))
    cut = int(len(frame) * BIG_FRAME_FIRST_PART)
    finish = threading.Event()
    clients = [RawClient(proxy.bootstrap) for _ in range(BIG_FRAME_CLIENTS)]

    def send(client):
        try:
            client.sock.sendall(frame[:cut])
            finish.wait()
            client.sock.sendall(frame[cut:])
        except OSError:
            pass

    for client in clients:
        threading.Thread(target=send, args=(client,), daemon=True).start()

    async def held():
        return [r.tracker.buffered for r in proxy.runtime.proxy.relays if r.tracker]

    peaks = []
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        peaks.append(sum(proxy.call(held())))
        time.sleep(0.05)
    finish.set()
    try:
        # Every frame completes: the one side still read finishes, the next is let go, ...
        wait_for(lambda: len(proxy.call(held())) == BIG_FRAME_CLIENTS and not any(proxy.call(held())),
                 CLOSE_TIMEOUT_S * 3, "every large frame to complete")
        for client in clients:                   # and is answered
            size, = struct.unpack(">i", client._recv_exactly(4))
            assert struct.unpack_from(">i", client._recv_exactly(size))[0] == 1
    finally:
        for client in clients:
            client.close()
    # Over the budget by at most the one frame still read and a read per paused side.
    assert max(peaks) <= BUDGET_BYTES + len(frame) + BIG_FRAME_CLIENTS * READ_CHUNK
    assert max(peaks) > BUDGET_BYTES              # the budget was met, not merely never reached
