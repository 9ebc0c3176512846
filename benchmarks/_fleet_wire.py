"""The Kafka requests a fleet client sends, built once with kproxy's own codec.

Pure functions, no sockets (``_fleet.py`` owns those): a light client can keep a
thousand producer connections in a few processes only if a send costs a buffer
copy, not a client library's machinery. A Produce request is therefore encoded
once per connection as a template; each send patches its correlation id in place.
Answers are read with the same codec (``decode_response``), except the Produce
answer's error code, which sits at a fixed offset for a one-partition request.
"""

from __future__ import annotations

import struct
import time

from kproxy.protocol import Request, Struct, decode_response, encode_request, new_body
from kproxy.protocol.record_encoder import build_batch
from kproxy.protocol.records import Record, split_batches

PRODUCE, FETCH, METADATA, API_VERSIONS = 0, 1, 3, 18
# Produce v9 and Fetch v12: the newest versions without KIP-951 NodeEndpoints in their
# answers (Produce v10+, Fetch v16+), which kafka-proxy does not rewrite; a client that
# learnt the broker's own address from them would bypass that proxy. Both are flexible.
PRODUCE_VERSION, FETCH_VERSION, METADATA_VERSION = 9, 12, 12
API_VERSIONS_VERSION = 3
ACKS_ALL = -1
PRODUCE_TIMEOUT_MS = 30_000
SIZE = struct.Struct(">i")
CORRELATION = struct.Struct(">i")
CORRELATION_AT = 4 + 2 + 2          # after the size prefix, api_key and api_version
ERROR_CODE = struct.Struct(">h")


def framed(frame: bytes) -> bytes:
    return SIZE.pack(len(frame)) + frame


def api_versions_request(correlation_id: int, client_id: str) -> bytes:
    body = new_body("request", API_VERSIONS, API_VERSIONS_VERSION, client_software_name="kproxy-bench",
                    client_software_version="1")
    return framed(encode_request(Request(API_VERSIONS, API_VERSIONS_VERSION, correlation_id, client_id, body)))


def metadata_request(correlation_id: int, topic: str) -> bytes:
    body = new_body("request", METADATA, METADATA_VERSION, topics=[Struct(topic_id=bytes(16), name=topic)],
                    allow_auto_topic_creation=False)
    return framed(encode_request(Request(METADATA, METADATA_VERSION, correlation_id, "bench-fleet", body)))


def leaders(frame: bytes, topic: str) -> dict[int, str]:
    """Partition -> "host:port" of its leader, from a Metadata answer (frame without size prefix)."""
    body = decode_response(frame, METADATA, METADATA_VERSION).body
    brokers = {b.node_id: f"{b.host}:{b.port}" for b in body.brokers}
    (entry,) = [t for t in body.topics if t.name == topic]
    if entry.error_code:
        raise RuntimeError(f"Metadata for {topic}: error {entry.error_code}")
    return {p.partition_index: brokers[p.leader_id] for p in entry.partitions}


class ProduceTemplate:
    """One partition's Produce v9 request (acks=all) with ``records`` records of ``size``
    bytes, encoded once; ``frame(correlation_id)`` gives the bytes to send.

    Every send repeats the same batch (its timestamp is when the template was built:
    Kafka's default ``log.message.timestamp.before.max.ms`` accepts any age).
    """

    def __init__(self, topic: str, partition: int, records: int, size: int, client_id: str):
        now_ms = int(time.time() * 1000)
        batch = build_batch([Record(timestamp=now_ms, value=bytes(size)) for _ in range(records)])
        body = new_body("request", PRODUCE, PRODUCE_VERSION, acks=ACKS_ALL, timeout_ms=PRODUCE_TIMEOUT_MS,
                        topic_data=[Struct(name=topic, partition_data=[Struct(index=partition, records=batch)])])
        self.bytes = bytearray(framed(encode_request(Request(PRODUCE, PRODUCE_VERSION, 0, client_id, body))))
        self.record_bytes = records * size
        # The answer: header v1 (correlation id, empty tag block), responses (compact array of
        # one: uvarint 2), the topic name (compact string: uvarint length + 1), partitions
        # (uvarint 2), partition index (int32), then the error code.
        name = len(topic.encode())
        if name + 1 >= 0x80:
            raise ValueError("a topic name of 127 bytes or more takes a longer varint")
        self.error_code_at = 4 + 1 + 1 + 1 + name + 1 + 4

    def frame(self, correlation_id: int) -> bytearray:
        CORRELATION.pack_into(self.bytes, CORRELATION_AT, correlation_id)
        return self.bytes

    def error_code(self, answer: bytes | memoryview) -> int:
        """The partition's error code in the answer to this request (frame without size prefix)."""
        return ERROR_CODE.unpack_from(answer, self.error_code_at)[0]


def fetch_request(correlation_id: int, client_id: str, topic: str, partition: int, offset: int,
                  max_wait_ms: int, min_bytes: int, max_bytes: int) -> bytes:
    body = new_body("request", FETCH, FETCH_VERSION, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                    max_bytes=max_bytes, topics=[Struct(topic=topic, partitions=[Struct(
                        partition=partition, current_leader_epoch=-1, fetch_offset=offset,
                        last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=max_bytes)])])
    return framed(encode_request(Request(FETCH, FETCH_VERSION, correlation_id, client_id, body)))


def fetched(frame: bytes | memoryview, offset: int) -> tuple[int, int, int]:
    """(error code, next offset, records fetched) from a one-partition Fetch v12 answer."""
    body = decode_response(frame, FETCH, FETCH_VERSION).body
    if body.error_code:
        return body.error_code, offset, 0
    (partition,) = body.responses[0].partitions
    if partition.error_code:
        return partition.error_code, offset, 0
    batches, _ = split_batches(partition.records)
    count = 0
    for batch in batches:
        last = batch.base_offset + batch.last_offset_delta
        if last >= offset:
            count += last + 1 - max(offset, batch.base_offset)
            offset = last + 1
    return 0, offset, count
