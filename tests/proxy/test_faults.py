"""Faults: kproxy in front of a real Kafka broker while things go wrong.

Every test breaks something (a broker dies, a client vanishes mid-request,
sends garbage or a frame too large, too many clients connect, a client idles
or stops reading, the upstream cannot be reached, kproxy is told to stop) and
then shows the next client is served normally. Clients kproxy must survive
are raw sockets speaking frames built with ``kproxy.protocol``: real clients
never misbehave on purpose.

Waits are deadlines on a condition, never sleeps that decide the outcome: the
machine is shared with other brokers and may be slow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import struct
import threading
import time
import urllib.request
import uuid

import pytest

from kproxy.protocol.events import RequestReceived
from kproxy.proxy.relay import READ_CHUNK, WRITE_HIGH_WATER
from tests.proxy.harness import (KproxyProcess, ProxyThread, free_ports, http_status, silent_port,
                                  wait_for)
from tests.proxy.wire import (ADMIN_TIMEOUT_S, API_VERSIONS, API_VERSIONS_FIELDS, CLOSE_TIMEOUT_S, FETCH,
                              FETCH_VERSION, METADATA, RESPONSE_TIMEOUT_S, RawClient, RelayState, address,
                              api_versions_ok, close_reasons, create_topic, fetch_fields, framed,
                              relay_count, relay_states, request_frame, start_long_poll)

pytestmark = [pytest.mark.broker, pytest.mark.timeout(240)]

LONG_POLL_MS = 60_000             # a Fetch long-poll that would outlive every test if not cut

BIG_TOPIC_BYTES = 50 * 1024 * 1024
BIG_RECORD_BYTES = 100 * 1024     # under the broker's 1 MiB message.max.bytes
STUCK_RCVBUF = 64 * 1024          # the stuck client's receive buffer: keeps the kernel's share small
# What kproxy may have read from the broker for a client that reads nothing: its write
# buffer (high water + one read) plus the kernel's socket buffers on the way (loopback
# send buffer autotunes up to tcp_wmem's 4 MiB here). Tens of MB would mean no backpressure.
STUCK_READ_BOUND = 16 * 1024 * 1024


# ---------------------------------------------------------------- proxy and broker helpers

def assert_served(proxy: ProxyThread, topic: str) -> None:
    """A real client (librdkafka) sees only kproxy's addresses and gets a message acknowledged."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    metadata = AdminClient({"bootstrap.servers": proxy.bootstrap}).list_topics(timeout=ADMIN_TIMEOUT_S)
    assert {(b.host, b.port) for b in metadata.brokers.values()} == proxy.broker_addresses
    results = []
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "all",
                         "message.timeout.ms": int(RESPONSE_TIMEOUT_S * 1000)})
    producer.produce(topic, value=b"still served", on_delivery=lambda err, msg: results.append(err))
    assert producer.flush(RESPONSE_TIMEOUT_S) == 0
    assert results == [None]


@pytest.fixture(scope="module")
def big_topic(kafka_cluster) -> str:
    """A one-partition topic holding ~50 MB, produced straight to the broker."""
    from confluent_kafka import Producer
    topic = create_topic(kafka_cluster.bootstrap_servers)
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers, "acks": 1,
                         "linger.ms": 20, "batch.size": 1_000_000})
    value = random.Random(7).randbytes(BIG_RECORD_BYTES)       # incompressible
    for _ in range(BIG_TOPIC_BYTES // BIG_RECORD_BYTES):
        while True:
            try:
                producer.produce(topic, value=value)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(120) == 0
    return topic


def kill_node(cluster, node_id: int) -> None:
    """SIGKILL a broker: no controlled shutdown, the kernel just drops its sockets.

    KafkaCluster has only the graceful ``stop_node``; its process handle is private.
    """
    cluster._nodes[node_id].process.kill()
    cluster._nodes[node_id].process.wait(timeout=30)


# ---------------------------------------------------------------- tests

def test_broker_killed_mid_stream(make_kafka_cluster, kproxy_log):
    """Long-polls in flight when the broker dies: their clients see the close at once,
    new clients are closed while it is down (/readyz says 503), and it all works again
    once the broker is back."""
    cluster = make_kafka_cluster()
    topic = create_topic(cluster.bootstrap_servers)
    port = free_ports(1)[0]
    with ProxyThread(upstream=cluster.bootstrap_servers, broker_port_rule="map",
                     broker_port_map={1: port}, shutdown_timeout=5.0) as proxy:
        assert_served(proxy, topic)
        assert proxy.broker_addresses == {("127.0.0.1", port)}
        pollers = [RawClient(proxy.bootstrap), RawClient(("127.0.0.1", port))]
        for poller in pollers:
            start_long_poll(poller, topic, LONG_POLL_MS)
        wait_for(lambda: sum(s.in_flight for s in relay_states(proxy)) == 2, RESPONSE_TIMEOUT_S,
                 "both long-polls in flight")

        kill_node(cluster, 1)
        for poller in pollers:
            elapsed, _ = poller.wait_closed()
            assert elapsed < CLOSE_TIMEOUT_S
        wait_for(lambda: relay_count(proxy) == 0, CLOSE_TIMEOUT_S, "kproxy to drop both connections")
        reasons = close_reasons(kproxy_log)
        for poller in pollers:
            [reason] = [r for r in reasons if f"client=127.0.0.1:{poller.port} " in r]
            assert "reason=broker closed" in reason or "reason=socket error" in reason

        # While the broker is down: a new client is closed promptly, readiness fails.
        latecomer = RawClient(proxy.bootstrap)
        latecomer.send(request_frame(API_VERSIONS, 3, 1))
        elapsed, received = latecomer.wait_closed()
        assert received == 0
        status, body = http_status(proxy.admin_url + "/readyz")
        assert status == 503 and f"127.0.0.1:{cluster.nodes[0].port}" in body
        assert http_status(proxy.admin_url + "/healthz")[0] == 200
        assert any("upstream unreachable" in r.getMessage() for r in kproxy_log.records)

        cluster.stop_node(1)                  # reaps the killed process
        cluster.start_node(1)
        wait_for(lambda: http_status(proxy.admin_url + "/readyz")[0] == 200, RESPONSE_TIMEOUT_S,
                 "/readyz to recover")
        assert_served(proxy, topic)


@pytest.mark.parametrize("how", ["close", "reset"])
def test_client_killed_mid_request(start_proxy, topic, kproxy_log, how):
    """Half a request, then the client is gone: kproxy closes the broker side too."""
    proxy = start_proxy()
    client = RawClient(proxy.bootstrap)
    api_versions_ok(client)
    half = request_frame(METADATA, 12, 2, topics=None)
    client.send(half[:len(half) // 2])
    wait_for(lambda: any(s.buffered for s in relay_states(proxy)), RESPONSE_TIMEOUT_S,
             "kproxy to hold the half frame")
    client.close() if how == "close" else client.abort()
    wait_for(lambda: relay_count(proxy) == 0, CLOSE_TIMEOUT_S, "kproxy to close the connection")
    [reason] = close_reasons(kproxy_log)
    assert ("reason=client closed" if how == "close" else "reason=socket error") in reason
    assert_served(proxy, topic)


# name: (bytes, the close reason kproxy logs, whether an answer arrives first)
GARBAGE = {
    # A negative size prefix: kproxy refuses it itself, before the broker sees a byte.
    "negative size": (b"\xff\xff\xff\xfe" + random.Random(1).randbytes(4096),
                      "reason=client frame of -2 bytes", False),
    # A size prefix far above max_frame_size: the same.
    "huge size": (b"\x7f" + random.Random(2).randbytes(4095), "reason=client frame of ", False),
    # A well-framed request of random bytes: forwarded; the broker rejects it and closes.
    "random frame": (framed(random.Random(3).randbytes(512)), "reason=broker closed", False),
    # Random bytes after a valid request: its answer still arrives, then the close.
    "garbage after a request": (request_frame(API_VERSIONS, 3, 1)
                                + framed(b"\x7f\x7f" + random.Random(4).randbytes(64)),
                                "reason=broker closed", True),
}


@pytest.mark.parametrize("garbage,reason,answered", GARBAGE.values(), ids=GARBAGE.keys())
def test_garbage_from_a_client(start_proxy, topic, kproxy_log, garbage, reason, answered):
    proxy = start_proxy()
    client = RawClient(proxy.bootstrap)
    client.send(garbage)
    _, received = client.wait_closed()
    assert (received > 0) == answered
    wait_for(lambda: relay_count(proxy) == 0, CLOSE_TIMEOUT_S, "kproxy to close the connection")
    [logged] = close_reasons(kproxy_log)
    assert reason in logged
    if reason.startswith("reason=client frame"):
        assert "bytes_client_to_broker=0 " in logged
    assert_served(proxy, topic)


def test_oversized_frame_from_client_is_refused(start_proxy, topic, kproxy_log):
    limit = 1024 * 1024
    proxy = start_proxy(max_frame_size=limit)
    client = RawClient(proxy.bootstrap)
    api_versions_ok(client)
    client.send(struct.pack(">i", 2 * limit) + b"\x00" * 1000)
    client.wait_closed()
    wait_for(lambda: close_reasons(kproxy_log), CLOSE_TIMEOUT_S, "the close to be logged")
    [reason] = close_reasons(kproxy_log)
    assert f"reason=client frame of {2 * limit} bytes (maximum {limit})" in reason
    # Refused before forwarding: the broker got the ApiVersions request and nothing more.
    assert f"bytes_client_to_broker={len(request_frame(API_VERSIONS, 3, 1, **API_VERSIONS_FIELDS))} " \
        in reason
    assert_served(proxy, topic)


def test_oversized_frame_from_broker_closes_that_connection(start_proxy, big_topic, topic, kproxy_log):
    """A Fetch answer above max_frame_size is cut, not buffered; other clients are unaffected."""
    limit = 1024 * 1024
    proxy = start_proxy(max_frame_size=limit)
    client = RawClient(proxy.bootstrap)
    client.send_request(FETCH, FETCH_VERSION, **fetch_fields(big_topic, 0, max_bytes=8 * limit))
    client.wait_closed()
    wait_for(lambda: close_reasons(kproxy_log), CLOSE_TIMEOUT_S, "the close to be logged")
    [reason] = close_reasons(kproxy_log)
    assert "reason=broker frame of" in reason and f"(maximum {limit})" in reason
    assert_served(proxy, topic)


def test_max_connections(start_proxy, kproxy_log):
    proxy = start_proxy(max_connections=2)
    first, second = RawClient(proxy.bootstrap), RawClient(proxy.bootstrap)
    api_versions_ok(first)
    api_versions_ok(second)

    extra = RawClient(proxy.bootstrap)            # the TCP handshake completes; kproxy closes it
    with contextlib.suppress(OSError):
        extra.send(request_frame(API_VERSIONS, 3, 1))
    _, received = extra.wait_closed()
    assert received == 0
    assert proxy.runtime.proxy.rejected_connections == 1
    assert any("max_connections (2) reached" in r.getMessage() for r in kproxy_log.records)

    api_versions_ok(first)                        # the two accepted ones are untouched
    api_versions_ok(second)
    first.close()
    wait_for(lambda: relay_count(proxy) == 1, CLOSE_TIMEOUT_S, "a slot to free up")
    third = RawClient(proxy.bootstrap)
    api_versions_ok(third)
    second.close()
    third.close()


def test_idle_timeout_closes_idle_connections_only(start_proxy, topic, kproxy_log):
    """An idle connection is closed after idle_timeout; one waiting on a long-poll is not."""
    idle_timeout = 1.0
    long_poll_ms = 2500                            # well past the idle timeout (2.5 of them)
    proxy = start_proxy(idle_timeout=idle_timeout)
    idle, polling = RawClient(proxy.bootstrap), RawClient(proxy.bootstrap)
    api_versions_ok(polling)
    started = time.monotonic()                     # before either connection's last activity
    api_versions_ok(idle)
    start_long_poll(polling, topic, long_poll_ms)

    idle.wait_closed(timeout=idle_timeout + CLOSE_TIMEOUT_S)
    assert time.monotonic() - started >= idle_timeout * 0.9
    response = polling.read_response()             # the long-poll was left alone
    assert response.body.responses[0].partitions[0].error_code == 0
    assert time.monotonic() - started >= long_poll_ms / 1000 * 0.9
    polling.wait_closed(timeout=idle_timeout + CLOSE_TIMEOUT_S)  # then it idles and goes too
    # The client sees the close a moment before kproxy logs it.
    reasons = wait_for(lambda: len(close_reasons(kproxy_log)) == 2 and close_reasons(kproxy_log),
                       CLOSE_TIMEOUT_S, "both closes to be logged")
    assert all("reason=idle for more than 1s" in r for r in reasons)
    assert_served(proxy, topic)


@pytest.fixture
def blackhole():
    """A local address whose TCP handshakes never complete: a listener with its one-slot
    backlog already full drops further SYNs, like a firewalled host."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    filler = socket.create_connection(listener.getsockname())
    yield listener.getsockname()
    filler.close()
    listener.close()


@pytest.mark.parametrize("kind", ["refused", "timeout"])
def test_upstream_unreachable(start_proxy, kafka_cluster, blackhole, topic, kproxy_log, kind):
    connect_timeout = 1.0
    if kind == "refused":
        upstream = ("127.0.0.1", free_ports(1)[0])
    else:
        upstream = blackhole
    proxy = start_proxy(upstream=f"{upstream[0]}:{upstream[1]}", connect_timeout=connect_timeout)
    started = time.monotonic()
    client = RawClient(proxy.bootstrap)
    client.send(request_frame(API_VERSIONS, 3, 1))
    _, received = client.wait_closed()
    assert received == 0
    why = "Connection refused" if kind == "refused" else "TimeoutError"
    if kind == "timeout":                            # it did wait for the connect
        assert time.monotonic() - started >= connect_timeout * 0.9
    assert any("upstream unreachable" in r.getMessage() and why in r.getMessage()
               for r in kproxy_log.records)
    status, body = http_status(proxy.admin_url + "/readyz")
    assert status == 503 and f"{upstream[0]}:{upstream[1]}: " in body and why in body
    assert http_status(proxy.admin_url + "/healthz")[0] == 200

    # A second upstream that works: bootstrap falls through to it, readiness recovers.
    proxy2 = start_proxy(upstream=f"{upstream[0]}:{upstream[1]},{kafka_cluster.bootstrap_servers}",
                         connect_timeout=connect_timeout)
    assert http_status(proxy2.admin_url + "/readyz")[0] == 200
    assert_served(proxy2, topic)


def test_graceful_shutdown_lets_in_flight_requests_finish(start_proxy, topic, kproxy_log):
    long_poll_ms = 4000
    proxy = start_proxy(shutdown_timeout=30.0)
    assert_served(proxy, topic)                  # the broker listener is open too
    poller = RawClient(proxy.bootstrap)
    sent = time.monotonic()
    start_long_poll(poller, topic, long_poll_ms)
    wait_for(lambda: sum(s.in_flight for s in relay_states(proxy)) == 1, RESPONSE_TIMEOUT_S,
             "the long-poll to be in flight")
    bootstrap = address(proxy.bootstrap)
    broker_port = next(iter(proxy.broker_addresses))

    stopping = asyncio.run_coroutine_threadsafe(proxy.runtime.stop(), proxy.loop)

    def refused(target) -> bool:
        try:
            socket.create_connection(target, timeout=RESPONSE_TIMEOUT_S).close()
        except ConnectionRefusedError:
            return True
        return False

    wait_for(lambda: refused(bootstrap) and refused(broker_port), CLOSE_TIMEOUT_S,
             "new connections to be refused")
    assert http_status(proxy.admin_url + "/readyz") == (503, "stopping\n")
    assert not stopping.done(), "stop() returned with a request still in flight"

    response = poller.read_response()           # the in-flight long-poll completes normally
    assert response.body.responses[0].partitions[0].error_code == 0
    assert time.monotonic() - sent >= long_poll_ms / 1000 * 0.9
    poller.wait_closed()
    stopping.result(timeout=RESPONSE_TIMEOUT_S)
    wait_for(lambda: any(f"client=127.0.0.1:{poller.port} reason=shutting down" in r
                         for r in close_reasons(kproxy_log)), CLOSE_TIMEOUT_S, "the close to be logged")


def test_graceful_shutdown_with_a_busy_consumer(start_proxy, topic, kproxy_log):
    """A consumer long-polls back to back, so some request is nearly always in flight:
    kproxy must stop taking new requests and close each connection once answered, not
    wait out shutdown_timeout and then cut requests off anyway."""
    from confluent_kafka import Consumer

    shutdown_timeout = 30.0
    fetches = []

    def count_fetches(info, events):
        fetches.extend(e for e in events if isinstance(e, RequestReceived) and e.api_key == FETCH)
    proxy = start_proxy(shutdown_timeout=shutdown_timeout, observers=[count_fetches])
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "latest", "fetch.wait.max.ms": 500})
    consumer.subscribe([topic])
    stop = threading.Event()
    polling = threading.Thread(target=lambda: [consumer.poll(0.1) for _ in iter(stop.is_set, True)],
                               daemon=True)
    polling.start()
    try:
        wait_for(lambda: len(fetches) >= 5, RESPONSE_TIMEOUT_S, "the consumer to be long-polling")
        started = time.monotonic()
        proxy.call(proxy.runtime.stop(), timeout=shutdown_timeout + 10)
        took = time.monotonic() - started
    finally:
        stop.set()
        polling.join(RESPONSE_TIMEOUT_S)
        consumer.close()
    assert took < shutdown_timeout / 3, f"stop() took {took:.1f}s with one consumer"
    reasons = [r for r in close_reasons(kproxy_log) if "reason=shutting down" in r]
    assert reasons and all(r.endswith("in_flight=0") for r in reasons), reasons


def test_shutdown_while_connecting_upstream(start_proxy, blackhole, kproxy_log):
    """A connection still waiting for its broker when kproxy stops is closed quietly."""
    proxy = start_proxy(upstream=f"{blackhole[0]}:{blackhole[1]}", connect_timeout=60.0)
    client = RawClient(proxy.bootstrap)
    client.send(request_frame(API_VERSIONS, 3, 1))
    wait_for(lambda: relay_count(proxy) == 1, RESPONSE_TIMEOUT_S, "kproxy to accept the client")
    started = time.monotonic()
    proxy.call(proxy.runtime.stop(), timeout=RESPONSE_TIMEOUT_S)
    assert time.monotonic() - started < CLOSE_TIMEOUT_S
    _, received = client.wait_closed()
    assert received == 0
    # kproxy_log fails the test if asyncio logged the cancelled handler as an error.


def test_backpressure_client_that_stops_reading(start_proxy, big_topic, topic, kproxy_log):
    """A client that asks for 200 MB and reads nothing: kproxy stops reading the broker
    for it (bounded buffers), while other clients, even ones fetching the same 50 MB,
    are served."""
    fetches = 4
    big = 64 * 1024 * 1024                           # the whole topic in one answer
    proxy = start_proxy()
    stuck = RawClient(proxy.bootstrap, rcvbuf=STUCK_RCVBUF)
    for _ in range(fetches):
        stuck.send_request(FETCH, FETCH_VERSION, **fetch_fields(big_topic, 0, max_bytes=big))

    def stuck_state() -> RelayState | None:
        return next((s for s in relay_states(proxy) if s.client_port == stuck.port), None)

    # Sample until kproxy has stopped reading the broker for this client: no growth for 2 s.
    samples: list[RelayState] = []
    deadline = time.monotonic() + 60
    while True:
        state = stuck_state()
        if state is not None:
            samples.append(state)
        steady = [s for s in samples if s.from_broker == samples[-1].from_broker] if samples else []
        if len(steady) >= 2 / 0.1 and samples[-1].from_broker > 0:
            break
        assert time.monotonic() < deadline, f"reads from the broker never levelled off: {samples[-5:]}"
        time.sleep(0.1)
    assert max(s.write_buffer for s in samples) <= WRITE_HIGH_WATER + READ_CHUNK
    assert max(s.from_broker for s in samples) < STUCK_READ_BOUND
    assert max(s.buffered for s in samples) < STUCK_READ_BOUND

    # Others are served meanwhile: a normal producer, and a reader of the same 50 MB.
    assert_served(proxy, topic)
    reader = RawClient(proxy.bootstrap)
    answer = reader.roundtrip(FETCH, FETCH_VERSION, **fetch_fields(big_topic, 0, max_bytes=big))
    partition = answer.body.responses[0].partitions[0]
    assert partition.error_code == 0 and len(partition.records) >= BIG_TOPIC_BYTES * 0.9
    reader.close()
    assert stuck_state().from_broker < STUCK_READ_BOUND            # still parked

    stuck.abort()
    wait_for(lambda: stuck_state() is None, CLOSE_TIMEOUT_S, "kproxy to drop the stuck client")


def test_decode_failures_are_logged_once_per_kind(caplog):
    """A request kproxy cannot decode is forwarded, counted, and logged once, not per frame."""
    from kproxy.config import build
    from kproxy.protocol.connection import Connection
    from kproxy.proxy.server import Proxy

    proxy = Proxy(build({"upstream": "127.0.0.1:1"}))
    conn = Connection()
    bad = struct.pack(">hhih", 3, 12, 1, 5) + b"ab"          # Metadata v12, client_id cut short
    frame = struct.pack(">i", len(bad)) + bad
    with caplog.at_level(logging.WARNING, logger="kproxy.server"):
        for _ in range(3):
            proxy._log_decode_failures(None, conn.receive_client(frame))
    lines = [r.getMessage() for r in caplog.records if "cannot decode" in r.getMessage()]
    assert len(lines) == 1 and "Metadata v12 request" in lines[0]


def test_an_outage_is_logged_once_per_cause_and_every_refusal_counted(caplog):
    """An upstream that is down fails every client's connect: one WARNING for the cause
    (within the interval), every refused connection counted (was: a WARNING each, 465-693
    in a 17 s outage)."""
    caplog.set_level(logging.INFO, logger="kproxy")
    down = f"127.0.0.1:{free_ports(1)[0]}"
    clients = 12
    with ProxyThread(upstream=down, connect_timeout=1.0) as proxy:
        for _ in range(clients):
            client = RawClient(proxy.bootstrap)
            client.send(request_frame(API_VERSIONS, 3, 1))
            _, received = client.wait_closed()
            assert received == 0
        text = urllib.request.urlopen(proxy.admin_url + "/metrics", timeout=10).read().decode()
    refused = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith("kproxy_connections_closed_total{")
                  and 'reason="upstream_unreachable"' in line)
    assert refused == clients
    lines = [r.getMessage() for r in caplog.records if "upstream unreachable" in r.getMessage()]
    assert len(lines) == 1 and down in lines[0] and "Connection refused" in lines[0], lines


def test_readiness_asks_the_broker_not_just_its_port(caplog):
    """A broker that is stopped (SIGSTOP) or wedged still has its port accept TCP (the
    kernel completes the handshake into the listen backlog): /readyz must say 503, because
    it asks for ApiVersions (was: 200, from a TCP connect alone)."""
    with silent_port() as (host, port), ProxyThread(upstream=f"{host}:{port}") as proxy:
        status, body = http_status(proxy.admin_url + "/readyz")
    assert status == 503 and f"{host}:{port}: TimeoutError" in body, (status, body)


def test_the_open_file_limit_refuses_with_a_reason_instead_of_dropping_silently(tmp_path):
    """At the open-file limit uvloop accepts and closes new clients without a word. kproxy
    stops taking connections while descriptors are left, and says why (log + metric)."""
    import resource

    hard_limit = 160

    def limit_files():
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard_limit, hard_limit))

    # The upstream's connects complete in its backlog and are never answered.
    with silent_port() as upstream, \
            KproxyProcess(tmp_path, upstream="%s:%d" % upstream, ready="/healthz",
                          preexec_fn=limit_files) as kproxy, contextlib.ExitStack() as clients:
        for _ in range(hard_limit):       # more than it can hold: two sockets per connection
            clients.enter_context(socket.create_connection(("127.0.0.1", kproxy.listen_port)))
        wait_for(lambda: "refusing connection" in kproxy.log_text(), 10, "the refusal to be logged")
        text = urllib.request.urlopen(kproxy.admin_url + "/metrics", timeout=10).read().decode()
        refused = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                      if line.startswith("kproxy_connections_closed_total{") and 'reason="fd_limit"' in line)
        assert refused > 0
        assert http_status(kproxy.admin_url + "/healthz")[0] == 200   # still serving
    logged = kproxy.log_text()
    assert "allows" in logged and "fewer than max_connections" in logged    # said at start
    assert logged.count("open file limit (160) leaves room") == 1           # said once, counted after
