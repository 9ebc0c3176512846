"""Issue 10, items 2, 5 and 6: what hostile or unusual clients did to the wire path.

- A Produce whose header Kafka reads but kproxy's strict codec did not (a padded
  varint) made kproxy expect an answer the broker never sends, pair the next answer
  with it and forward a Metadata response unrewritten: the broker's own address.
- Clients that connect and reset at once, while kproxy connects upstream, raised in
  the accept path and left upstream connections open.
- A client that sends a request and then shuts down its sending side got no answer
  through kproxy, although Kafka answers it.

Each test runs against a real Kafka 4.4 broker through kproxy, with raw sockets
sending exactly the bytes in question; the broker's own behaviour, which the tracker
must match, is checked directly too.
"""

from __future__ import annotations

import logging
import os
import socket
import struct

import pytest

from kproxy.protocol import Struct, Uuid, decode_response
from kproxy.proxy.relay import READ_CHUNK
from kproxy.proxy.server import DECODE_LOG_INTERVAL_S, DECODE_LOG_KINDS_PER_INTERVAL
from tests.protocol.frames import PADDED_BUT_ACCEPTED, REFUSED_BY_THE_BROKER, produce_v9
from tests.proxy.harness import wait_for
from tests.proxy.wire import (API_VERSIONS, API_VERSIONS_FIELDS, CLOSE_TIMEOUT_S, METADATA, RESPONSE_TIMEOUT_S,
                              RawClient, address, api_versions_ok, close_reasons, relay_count)

pytestmark = [pytest.mark.timeout(300)]

METADATA_VERSION = 12
# Enough 200-character topic names that the broker's answer (one error entry per name)
# is larger than one kproxy read, so it must arrive in several.
SPANNING_TOPICS = READ_CHUNK // 200 + 300    # a Metadata answer a little larger than one read
RESET_CLIENTS = 2_000             # the count: connect, then reset at once
HALF_CLOSE_TRIES = 5


def read_frame(client: RawClient) -> bytes:
    size, = struct.unpack(">i", client._recv_exactly(4))
    return client._recv_exactly(size)


def assert_rewritten(proxy, kafka_cluster, metadata) -> None:
    advertised = {(b.host, b.port) for b in metadata.body.brokers}
    assert advertised == proxy.broker_addresses
    assert not advertised & {(n.host, n.port) for n in kafka_cluster.nodes}


# ---------------------------------------------------------------- 2: pairing as the broker does

def test_padded_acks_0_produce_then_metadata_with_the_same_correlation_id(start_proxy, kafka_cluster):
    """The issue's reproduction: Produce v9 acks=0 with header tagged-field count 80 00, then
    Metadata v12 with the same correlation id. Kafka answers only the Metadata."""
    proxy = start_proxy()
    client = RawClient(proxy.bootstrap)
    client.send(produce_v9(1, acks=0, header_tags=b"\x80\x00"))
    metadata = client.roundtrip(METADATA, METADATA_VERSION, topics=None)     # correlation id 1 too
    assert_rewritten(proxy, kafka_cluster, metadata)
    api_versions_ok(client)                                                  # and nothing is left over


def test_padded_acks_0_produce_then_metadata_answer_spanning_reads(start_proxy, kafka_cluster):
    """Distinct correlation ids, and an answer larger than one read: its start used to be
    forwarded before it was complete, as if it answered the Produce."""
    proxy = start_proxy()
    client = RawClient(proxy.bootstrap)
    client.send(produce_v9(1000, acks=0, header_tags=b"\x80\x00"))
    topics = [Struct(topic_id=Uuid(bytes(16)), name=f"kp-absent-{i:05d}-".ljust(200, "x"))
              for i in range(SPANNING_TOPICS)]
    correlation_id = client.send_request(METADATA, METADATA_VERSION, topics=topics,
                                         allow_auto_topic_creation=False)
    frame = read_frame(client)
    assert len(frame) > READ_CHUNK
    metadata = decode_response(frame, METADATA, METADATA_VERSION)
    assert metadata.correlation_id == correlation_id and len(metadata.body.topics) == SPANNING_TOPICS
    assert_rewritten(proxy, kafka_cluster, metadata)


@pytest.mark.parametrize("fields", PADDED_BUT_ACCEPTED.values(), ids=PADDED_BUT_ACCEPTED.keys())
def test_kafka_answers_padded_produce_requests_as_the_tracker_expects(kafka_cluster, start_proxy, fields):
    """Directly and through kproxy: acks=0 is not answered (the next answer is the next
    request's), acks=1 is; the connection stays open."""
    proxy = start_proxy()
    for target in (kafka_cluster.bootstrap_servers, proxy.bootstrap):
        client = RawClient(target)
        client.send(produce_v9(1000, acks=0, **fields))
        api_versions_ok(client)
        client.send(produce_v9(1001, acks=1, **fields))
        assert struct.unpack_from(">i", read_frame(client))[0] == 1001
        api_versions_ok(client)
        client.close()


@pytest.mark.parametrize("fields", REFUSED_BY_THE_BROKER.values(), ids=REFUSED_BY_THE_BROKER.keys())
def test_produce_requests_kafka_refuses_close_the_connection(kafka_cluster, start_proxy, kproxy_log, fields):
    """Kafka closes the connection on them without an answer; kproxy closes it before the
    broker sees a byte, instead of guessing whether an answer will come."""
    proxy = start_proxy()
    for target in (kafka_cluster.bootstrap_servers, proxy.bootstrap):
        client = RawClient(target)
        client.send(produce_v9(1000, acks=0, **fields))
        client.send_request(API_VERSIONS, 3, **API_VERSIONS_FIELDS)
        _, received = client.wait_closed()
        assert received == 0
    wait_for(lambda: relay_count(proxy) == 0, CLOSE_TIMEOUT_S, "kproxy to close the connection")
    [reason] = close_reasons(kproxy_log)
    assert "cannot tell whether it is answered" in reason and "bytes_client_to_broker=0 " in reason


def test_decode_failure_log_cannot_be_used_up(caplog):
    """Garbage of more kinds than any budget quiets the log for one interval, not for good."""
    from kproxy.config import build
    from kproxy.protocol.connection import Connection
    from kproxy.proxy.server import Proxy

    now = [1000.0]
    proxy = Proxy(build({"upstream": "127.0.0.1:1"}))
    proxy._decode_log.clock = lambda: now[0]

    def bad_metadata(version: int) -> bytes:
        bad = struct.pack(">hhih", METADATA, version, 1, 5) + b"ab"      # client_id cut short
        return struct.pack(">i", len(bad)) + bad

    def log_lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if "cannot decode" in r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="kproxy.server"):
        for version in range(300):                                          # more than the old 256 kinds
            proxy._log_decode_failures(None, Connection().receive_client(bad_metadata(version)))
        assert len(log_lines()) == DECODE_LOG_KINDS_PER_INTERVAL
        now[0] += DECODE_LOG_INTERVAL_S
        proxy._log_decode_failures(None, Connection().receive_client(bad_metadata(12)))
    lines = log_lines()
    assert len(lines) == DECODE_LOG_KINDS_PER_INTERVAL + 1
    assert "Metadata v12 request" in lines[-1]
    assert f"{300 - DECODE_LOG_KINDS_PER_INTERVAL} earlier failures were not logged" in lines[-1]


# ---------------------------------------------------------------- 5: reset while connecting

def sockets_connected_to(port: int) -> int:
    """TCP sockets of this process (kproxy runs in it) whose peer is ``port``."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            next(rows)
            for row in rows:
                fields = row.split()
                if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[9] in inodes:
                    count += 1
    return count


def test_clients_resetting_while_kproxy_connects_upstream(start_proxy, kafka_cluster, kproxy_log):
    """Every such client is handled without a traceback (kproxy_log fails the test on any
    error logged), and no upstream connection or file descriptor outlives it."""
    proxy = start_proxy()
    broker_port = address(kafka_cluster.bootstrap_servers)[1]
    host, port = address(proxy.bootstrap)
    warm_up = RawClient(proxy.bootstrap)                 # kproxy's lazily built parts exist now
    api_versions_ok(warm_up)
    warm_up.close()
    wait_for(lambda: relay_count(proxy) == 0, CLOSE_TIMEOUT_S, "the warm-up connection to close")
    fds_before = len(os.listdir("/proc/self/fd"))
    for _ in range(RESET_CLIENTS):
        sock = socket.create_connection((host, port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()

    def handled() -> int:
        return sum(1 for r in kproxy_log.records if r.name == "kproxy.relay" and (
            "closed while connecting upstream" in r.getMessage() or " close client=" in r.getMessage()))

    wait_for(lambda: handled() >= RESET_CLIENTS + 1, RESPONSE_TIMEOUT_S, "kproxy to handle every client")
    wait_for(lambda: relay_count(proxy) == 0, CLOSE_TIMEOUT_S, "kproxy to drop every connection")
    wait_for(lambda: sockets_connected_to(broker_port) == 0, CLOSE_TIMEOUT_S,
             "kproxy to close every upstream connection")
    wait_for(lambda: len(os.listdir("/proc/self/fd")) <= fds_before, CLOSE_TIMEOUT_S,
             "file descriptors to return to where they were")
    after = RawClient(proxy.bootstrap)
    api_versions_ok(after)
    after.close()


# ---------------------------------------------------------------- 6: half-close

def test_half_closed_client_gets_its_answer_as_from_kafka(start_proxy, kafka_cluster, kproxy_log):
    proxy = start_proxy()

    def answered(target: str) -> int:
        count = 0
        for _ in range(HALF_CLOSE_TRIES):
            client = RawClient(target)
            client.send_request(METADATA, METADATA_VERSION, topics=None)
            client.sock.shutdown(socket.SHUT_WR)
            try:
                metadata = client.read_response()
            except ConnectionError:
                continue
            finally:
                client.close()
            if target == proxy.bootstrap:
                assert_rewritten(proxy, kafka_cluster, metadata)
            count += 1
        return count

    assert answered(kafka_cluster.bootstrap_servers) == HALF_CLOSE_TRIES
    assert answered(proxy.bootstrap) == HALF_CLOSE_TRIES
    wait_for(lambda: relay_count(proxy) == 0, CLOSE_TIMEOUT_S, "kproxy to close the connections")
    reasons = close_reasons(kproxy_log)
    assert len(reasons) == HALF_CLOSE_TRIES
    assert all("in_flight=0" in r and "reason=client closed" in r for r in reasons)
