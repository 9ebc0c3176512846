"""What hostile connections cost ``kproxy run``, measured as RSS (/proc), in front of Kafka.

- Partial frames: clients that each send the first 64 KiB of a frame claiming 128 KiB and
  stop cost ~600 KiB of RSS each (the frame was assembled in a 1 MiB read buffer it kept
  whole). Now at most twice the bytes held plus a small constant per connection.
- Pipelining without reading: clients sending ApiVersions as fast as they can and never
  reading an answer held up to 6,000 requests in flight each (their first read took up to
  1 MiB of tiny requests, against a cap of 1,000), ~21 MiB of RSS each, and an ordinary
  client beside them waited seconds per request. Now the cap holds within a read's worth,
  RSS per such client stays near the answers buffered towards it, and the ordinary client
  is answered every time (its latency is a benchmark's business:
  ``benchmarks/bench_hostile_memory.py``).

The fast variants run in the default suite; the full-size ones with ``--soak-seconds``.
"""

from __future__ import annotations

import contextlib
import re
import socket
import struct
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kproxy.observers import live
from kproxy.admin import live_web
from kproxy.proxy.relay import MAX_IN_FLIGHT_PER_CONNECTION, PIPELINED_READ_BYTES, WRITE_HIGH_WATER
from tests.proxy.harness import KproxyProcess, http_status, rss, wait_for
from tests.proxy.wire import (API_VERSIONS, FETCH, FETCH_VERSION, RawClient, api_versions_ok, create_topic,
                              fetch_fields, request_frame)

pytestmark = [pytest.mark.timeout(300)]

HELD_BYTES = 64 * 1024               # what each partial-frame client sends ...
CLAIMED_BYTES = 128 * 1024           # ... of a frame claiming this much
# Per connection beyond twice what it holds: its sockets, transports, relay and tracker
# (an idle connection measured ~9 KiB) with room for the allocator's rounding.
CONNECTION_OVERHEAD_BYTES = 32 * 1024
SETTLE_TIMEOUT_S = 60.0
SETTLE_S = 1.0                       # RSS read again this long after the bytes were all in

PIPELINERS = 10
PIPELINE_S = 6.0                     # how long they pipeline (the soak variant: --soak-seconds)
PIPELINE_BATCH = 100                 # requests per send
CANARY_PAUSE_S = 0.02                # an ordinary client's pace between requests
MIN_CANARY_REQUESTS = 5              # answered while the pipeliners ran: the canary was served
# Per request in flight beyond its bytes: the tracker's event and its deque slot
# (measured: a few hundred bytes), with room to spare.
PER_REQUEST_OVERHEAD_BYTES = 1024
# Per pipelining connection beyond its requests: the answers buffered towards it (kproxy
# stops reading the broker for it past WRITE_HIGH_WATER), a read's worth of requests, and
# the same per-connection overhead as above.
PER_PIPELINER_BYTES = WRITE_HIGH_WATER + PIPELINED_READ_BYTES + CONNECTION_OVERHEAD_BYTES
RSS_SLACK_BYTES = 8 * 1024 * 1024    # the interpreter's own growth while all this runs


def _open_connections(kproxy: KproxyProcess) -> float:
    status, text = http_status(f"{kproxy.admin_url}/metrics")
    assert status == 200
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "kproxy_connections_open")


def _settled_rss(pid: int, at_least: int) -> int:
    """RSS once it holds ``at_least`` and a moment later (reads still arriving are in)."""
    wait_for(lambda: rss(pid) >= at_least, SETTLE_TIMEOUT_S, f"RSS to reach {at_least >> 20} MiB")
    time.sleep(SETTLE_S)
    return rss(pid)


def partial_frame_start() -> bytes:
    """The first HELD_BYTES of a Produce v9 frame whose size prefix claims CLAIMED_BYTES."""
    frame = request_frame(0, 9, 1, acks=1, timeout_ms=1000, topic_data=[])
    claimed = struct.pack(">i", CLAIMED_BYTES - 4) + frame[4:]
    return (claimed + b"r" * HELD_BYTES)[:HELD_BYTES]


@pytest.mark.parametrize("connections", [
    300,
    pytest.param(2000, marks=pytest.mark.soak, id="2000-soak"),
])
def test_a_partial_frame_costs_at_most_twice_its_bytes(kafka_cluster, tmp_path, connections):
    start = partial_frame_start()
    with KproxyProcess(tmp_path, upstream=kafka_cluster.bootstrap_servers, broker_port_base=0) as kproxy, \
            contextlib.ExitStack() as clients:
        before = rss(kproxy.pid)
        sockets = [clients.enter_context(socket.create_connection(("127.0.0.1", kproxy.listen_port)))
                   for _ in range(connections)]
        # Every relay linked before the bytes come: they land in the loop's read buffers.
        wait_for(lambda: _open_connections(kproxy) >= connections, SETTLE_TIMEOUT_S, "the relays to link")
        for sock in sockets:
            sock.sendall(start)
        held = connections * len(start)
        after = _settled_rss(kproxy.pid, before + held)
        per_connection = (after - before) / connections
        assert per_connection <= 2 * len(start) + CONNECTION_OVERHEAD_BYTES, \
            f"{per_connection / 1024:.0f} KiB per connection holding {len(start) // 1024} KiB"


def _pipeline(port: int, stop: threading.Event, errors: list) -> None:
    """ApiVersions v0 as fast as kproxy takes them; never read an answer."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.settimeout(0.2)
    batch = b"".join(request_frame(API_VERSIONS, 0, i + 1) for i in range(PIPELINE_BATCH))
    pending = memoryview(batch)
    try:
        while not stop.is_set():
            try:
                sent = sock.send(pending)
            except socket.timeout:
                continue
            pending = pending[sent:] or memoryview(batch)
        stop.wait()
    except OSError as exc:
        errors.append(exc)
    finally:
        sock.close()


def _in_flight_at_close(log: str) -> list[int]:
    return [int(n) for n in re.findall(r"conn=\d+ close .* in_flight=(\d+)", log)]


@pytest.mark.parametrize("seconds", [
    PIPELINE_S,
    pytest.param(None, marks=pytest.mark.soak, id="soak"),
])
def test_pipelining_clients_that_never_read_leave_others_served_and_memory_bounded(
        kafka_cluster, tmp_path, seconds, request):
    seconds = seconds or request.getfixturevalue("soak_seconds")
    with KproxyProcess(tmp_path, upstream=kafka_cluster.bootstrap_servers, broker_port_base=0) as kproxy:
        canary = RawClient(("127.0.0.1", kproxy.listen_port))
        api_versions_ok(canary)                 # the canary's connection is up before the flood
        before = rss(kproxy.pid)
        stop = threading.Event()
        errors: list[OSError] = []
        threads = [threading.Thread(target=_pipeline, args=(kproxy.listen_port, stop, errors), daemon=True)
                   for _ in range(PIPELINERS)]
        for thread in threads:
            thread.start()
        peak = before
        answered = 0
        ends = time.monotonic() + seconds
        try:
            while time.monotonic() < ends:
                api_versions_ok(canary)         # raises if not answered (RawClient's timeout)
                answered += 1
                peak = max(peak, rss(kproxy.pid))
                time.sleep(CANARY_PAUSE_S)
            assert http_status(f"{kproxy.admin_url}/metrics")[0] == 200
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
            canary.close()
        assert not errors
        assert answered >= MIN_CANARY_REQUESTS
        kproxy.stop()
        in_flight = sorted(_in_flight_at_close(kproxy.log_text()))[-PIPELINERS:]
        assert len(in_flight) == PIPELINERS
        frame_bytes = len(request_frame(API_VERSIONS, 0, 1))
        # The cap holds within one read's worth of requests.
        assert max(in_flight) <= MAX_IN_FLIGHT_PER_CONNECTION + PIPELINED_READ_BYTES // frame_bytes
        bound = (PIPELINERS * PER_PIPELINER_BYTES + RSS_SLACK_BYTES
                 + PIPELINERS * (MAX_IN_FLIGHT_PER_CONNECTION + PIPELINED_READ_BYTES // frame_bytes)
                 * (frame_bytes + PER_REQUEST_OVERHEAD_BYTES))
        assert peak - before <= bound, \
            f"RSS grew {(peak - before) >> 20} MiB (bound {bound >> 20} MiB), in flight at close {in_flight}"


# ---------------------------------------------------------------- live-page viewers that never read

VIEWERS = 100
VIEWERS_S = 6.0                      # how long they hang on (the soak variant: --soak-seconds)
VIEWER_RCVBUF = 4096
# A soak's viewers are replaced this often: kproxy hangs up on a stalled stream after
# live_web.VIEWER_STALL_S (30 s), and a hostile page would simply open another.
VIEWERS_RENEW_S = 20.0
ADMIN_TOKEN = "t" * 32
# What the streams may cost together: the pairs the live view keeps for the detail view
# once anyone watches (RECENT_MAX_BYTES; measured: +20 MiB with 100 viewers, +0 without), at
# most MAX_VIEWERS streams (the rest get a 503), each with a backlog of VIEWER_BACKLOG compact
# rows (under 1 KiB each) and a transport buffer like its kernel one, plus the interpreter's
# own growth.
ROW_BYTES = 1024
VIEWERS_RSS_BOUND = (live.RECENT_MAX_BYTES + RSS_SLACK_BYTES
                     + live.MAX_VIEWERS * (live.VIEWER_BACKLOG * ROW_BYTES + live_web.STREAM_SEND_BUFFER))


def _open_viewers(admin_url: str, count: int) -> list[socket.socket]:
    """Streams opened and never read (a 4 KiB receive buffer each)."""
    host, port = admin_url.removeprefix("http://").rsplit(":", 1)
    request = (f"GET /live/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\r\n").encode()
    viewers = []
    for _ in range(count):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, VIEWER_RCVBUF)
        sock.connect((host, int(port)))
        sock.sendall(request)
        viewers.append(sock)
    return viewers


@pytest.mark.parametrize("seconds", [
    VIEWERS_S,
    pytest.param(None, marks=pytest.mark.soak, id="soak"),
])
def test_live_page_viewers_that_never_read_leave_traffic_and_scrapes_served(
        kafka_cluster, tmp_path, seconds, request):
    """100 live streams opened and never read while an ordinary client sends requests back
    to back: every request answered, every scrape answered, RSS bounded."""
    seconds = seconds or request.getfixturevalue("soak_seconds")
    with KproxyProcess(tmp_path, upstream=kafka_cluster.bootstrap_servers, broker_port_base=0,
                       env={"KPROXY_ADMIN_TOKEN": ADMIN_TOKEN}) as kproxy:
        canary = RawClient(("127.0.0.1", kproxy.listen_port))
        api_versions_ok(canary)
        before = rss(kproxy.pid)
        viewers = _open_viewers(kproxy.admin_url, VIEWERS)
        renewed = time.monotonic()
        answered, scrapes, slowest_scrape, peak = 0, 0, 0.0, before
        ends = time.monotonic() + seconds
        try:
            while time.monotonic() < ends:
                for _ in range(20):
                    api_versions_ok(canary)     # raises if not answered (RawClient's timeout)
                    answered += 1
                started = time.monotonic()
                assert http_status(f"{kproxy.admin_url}/metrics")[0] == 200
                slowest_scrape = max(slowest_scrape, time.monotonic() - started)
                scrapes += 1
                peak = max(peak, rss(kproxy.pid))
                if time.monotonic() - renewed > VIEWERS_RENEW_S:
                    for sock in viewers:
                        sock.close()
                    viewers, renewed = _open_viewers(kproxy.admin_url, VIEWERS), time.monotonic()
        finally:
            for sock in viewers:
                sock.close()
            canary.close()
        print(f"{answered} requests and {scrapes} scrapes answered (slowest {slowest_scrape:.2f} s); "
              f"RSS {before >> 20} -> peak {peak >> 20} MiB")
        assert answered >= MIN_CANARY_REQUESTS and scrapes >= 1
        assert peak - before <= VIEWERS_RSS_BOUND, f"RSS grew {(peak - before) >> 20} MiB"
        kproxy.stop()
        assert "Traceback" not in kproxy.log_text()


# ---------------------------------------------------------------- answers nobody reads

UNREAD_CLIENTS = 40
FETCHES_PER_CLIENT = 12              # each answered with about ANSWER_BYTES, never read
ANSWER_BYTES = 1024 * 1024
RECORD_BYTES = 100 * 1024
SMALL_BUDGET = 16 * 1024 * 1024      # the buffer budget, shortened for the test
# Per client past the budget: the small read its answers keep alive (OVER_BUDGET_READ_BYTES),
# its connection's own state (CONNECTION_OVERHEAD_BYTES) and the allocator's rounding.
UNREAD_PER_CLIENT_BYTES = 160 * 1024
# The interpreter's own growth meanwhile, with room for a loaded machine (measured in all:
# +27 to +32 MiB at load 40-100; +56 MiB before answers counted against the budget).
UNREAD_SLACK_BYTES = 20 * 1024 * 1024
# `kproxy run` with that budget (a constant, read when the event loop's budget is made).
KPROXY_SMALL_BUDGET = ("import sys; from kproxy.proxy import memory; memory.DEFAULT_BUFFER_BUDGET = %d; "
                       "from kproxy.cli import main; sys.exit(main(sys.argv[1:]))" % SMALL_BUDGET)


def _topic_of_about(bootstrap: str, nbytes: int) -> str:
    """A one-partition topic holding about ``nbytes`` of records, written directly."""
    from confluent_kafka import Producer
    topic = create_topic(bootstrap)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for _ in range(nbytes // RECORD_BYTES + 1):
        producer.produce(topic, b"a" * RECORD_BYTES)
    assert producer.flush(60) == 0
    return topic


def test_answers_nobody_reads_stay_within_the_buffer_budget(kafka_cluster, tmp_path):
    """40 clients each send 12 Fetch requests whose answers are ~1 MiB and read none of them
    (each kept a read buffer of ~1 MiB alive, and up to the write buffer's high mark more:
    +56 MiB in all, measured, whatever the budget).
    Under a 16 MiB budget, RSS grows by the budget plus a small read per connection, and an
    ordinary client is answered meanwhile."""
    topic = _topic_of_about(kafka_cluster.bootstrap_servers, ANSWER_BYTES)
    fetch = fetch_fields(topic, 0, max_wait_ms=0, max_bytes=ANSWER_BYTES)
    with KproxyProcess(tmp_path, upstream=kafka_cluster.bootstrap_servers, broker_port_base=0,
                       entry=("-c", KPROXY_SMALL_BUDGET)) as kproxy, contextlib.ExitStack() as clients:
        canary = RawClient(("127.0.0.1", kproxy.listen_port))
        api_versions_ok(canary)
        before = rss(kproxy.pid)
        unread = [clients.enter_context(contextlib.closing(
            RawClient(("127.0.0.1", kproxy.listen_port), rcvbuf=4096))) for _ in range(UNREAD_CLIENTS)]
        for client in unread:
            for _ in range(FETCHES_PER_CLIENT):
                client.send_request(FETCH, FETCH_VERSION, **fetch)
        # Answers flow until every connection is squeezed or holds its high mark: then RSS
        # stays put.
        peak, last_change, last = before, time.monotonic(), before
        while time.monotonic() - last_change < 3.0:
            api_versions_ok(canary)
            now = rss(kproxy.pid)
            if abs(now - last) > 1024 * 1024:
                last, last_change = now, time.monotonic()
            peak = max(peak, now)
            time.sleep(0.1)
            assert time.monotonic() - last_change < 60
        canary.close()
    grown = peak - before
    bound = SMALL_BUDGET + UNREAD_CLIENTS * UNREAD_PER_CLIENT_BYTES + UNREAD_SLACK_BYTES
    print(f"RSS {before >> 20} -> peak {peak >> 20} MiB (+{grown / UNREAD_CLIENTS / 1024:.0f} KiB per "
          f"unread client; bound {bound >> 20} MiB)")
    assert grown <= bound, f"RSS grew {grown >> 20} MiB, bound {bound >> 20} MiB"
