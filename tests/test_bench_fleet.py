"""The fleet benchmark's light client (``benchmarks/_fleet_wire.py``) against a real broker.

The benchmark reads a Produce answer's error code at a fixed offset and counts fetched
records from batch headers; if either were wrong its figures would be too, silently.
"""

from __future__ import annotations

import socket
import struct
import time

import pytest

from benchmarks import _fleet_wire as wire
from kproxy.embedded import recv_exactly
from kproxy.protocol import decode_response
from tests.proxy.wire import create_topic

UNKNOWN_TOPIC_OR_PARTITION = 3
# A new partition's leader can be named in Metadata a moment before it takes writes (seen
# once in a full suite run under load): the first Produce is sent again until it does.
NOT_LEADER_OR_FOLLOWER = 6
LEADER_WAIT_S = 30


def _round_trip(sock: socket.socket, request: bytes | bytearray) -> bytes:
    sock.sendall(request)
    return recv_exactly(sock, struct.unpack(">i", recv_exactly(sock, 4))[0])


def _leaders(bootstrap: str, topic: str, partitions: int) -> dict[int, str]:
    host, port = bootstrap.rsplit(":", 1)
    deadline = time.monotonic() + LEADER_WAIT_S
    while True:
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            try:
                leaders = wire.leaders(_round_trip(sock, wire.metadata_request(1, topic)), topic)
            except (KeyError, RuntimeError):          # no leader elected yet
                leaders = {}
        if len(leaders) == partitions or time.monotonic() > deadline:
            return leaders
        time.sleep(0.2)


def test_fleet_requests_and_answers_read_as_the_broker_means_them(kafka_cluster):
    topic = create_topic(kafka_cluster.bootstrap_servers, partitions=2)
    leaders = _leaders(kafka_cluster.bootstrap_servers, topic, 2)
    assert sorted(leaders) == [0, 1]
    host, port = leaders[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        hello = _round_trip(sock, wire.api_versions_request(0, "fleet-test"))
        assert decode_response(hello, wire.API_VERSIONS, wire.API_VERSIONS_VERSION).body.error_code == 0

        template = wire.ProduceTemplate(topic, 1, 3, 100, "fleet-test")
        for correlation_id in (7, 8):              # the same template, patched per send
            deadline = time.monotonic() + LEADER_WAIT_S
            answer = _round_trip(sock, template.frame(correlation_id))
            while template.error_code(answer) == NOT_LEADER_OR_FOLLOWER and time.monotonic() < deadline:
                time.sleep(0.2)                    # refused, so nothing written: send it again
                answer = _round_trip(sock, template.frame(correlation_id))
            decoded = decode_response(answer, wire.PRODUCE, wire.PRODUCE_VERSION)
            assert decoded.correlation_id == correlation_id
            (partition,) = decoded.body.responses[0].partition_responses
            assert (template.error_code(answer), partition.error_code) == (0, 0)
            assert partition.base_offset == 3 * (correlation_id - 7)

        missing = wire.ProduceTemplate(topic, 5, 1, 100, "fleet-test")   # no partition 5
        answer = _round_trip(sock, missing.frame(9))
        (partition,) = decode_response(answer, wire.PRODUCE, wire.PRODUCE_VERSION).body.responses[0].partition_responses
        assert template.error_code(answer) == partition.error_code == UNKNOWN_TOPIC_OR_PARTITION

        def fetch(offset: int) -> tuple[int, int, int]:
            request = wire.fetch_request(10, "fleet-test", topic, 1, offset, 100, 1, 1 << 20)
            return wire.fetched(_round_trip(sock, request), offset)

        assert fetch(0) == (0, 6, 6)
        assert fetch(4) == (0, 6, 2)               # the broker answers from the batch holding 4 (3-5)


def test_a_topic_name_too_long_for_the_fixed_offset_is_refused():
    with pytest.raises(ValueError, match="127 bytes"):
        wire.ProduceTemplate("t" * 127, 0, 1, 10, "fleet-test")
