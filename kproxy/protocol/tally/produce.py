"""Produce tallies: a request's records per partition (and topic, client id, acks); an
answer's error codes and throttle time."""

from __future__ import annotations

import struct
from typing import NamedTuple

from .. import schema
from .._codec import Uuid
from ..api_keys import ApiKey
from ..errors import DecodeError
from ._common import HEAD, I16, I32, INDEX_BYTES, UUID_BYTES, long_length, since, skip_nullable_string

PRODUCE = int(ApiKey.PRODUCE)
_REQUEST, _RESPONSE = schema.REQUESTS[PRODUCE], schema.RESPONSES[PRODUCE]
# The newest Produce version whose layout the readers below follow (Kafka 4.x: 13). Newer
# ones (a regenerated schema) get no tally until these readers learn them: the partial decode
# answers for them meanwhile (a test fails when the schema moves past this).
NEWEST_LAYOUT = 13
FIRST_VERSION = _REQUEST.versions[0]
FLEXIBLE_SINCE = _REQUEST.first_flexible                     # compact lengths, tag blocks, header v2
TRANSACTIONAL_ID_SINCE = since(_REQUEST, "transactional_id")
TOPIC_ID_SINCE = since(_REQUEST, "topic_id", "TopicProduceData")   # topics by id, not name
THROTTLE_SINCE = since(_RESPONSE, "throttle_time_ms")
LOG_APPEND_TIME_SINCE = since(_RESPONSE, "log_append_time_ms", "PartitionProduceResponse")
LOG_START_OFFSET_SINCE = since(_RESPONSE, "log_start_offset", "PartitionProduceResponse")
RECORD_ERRORS_SINCE = since(_RESPONSE, "record_errors", "PartitionProduceResponse")   # and error_message

_ERROR_CODE = struct.Struct(">h").unpack_from     # of a partition answer, after its int32 index
_ACKS = I16
_ACKS_TIMEOUT_BYTES = 6                           # acks int16, timeout_ms int32


class TopicRecords(NamedTuple):
    """One topic of a Produce request: its name (by name up to v12) or id (v13+), and each
    partition's records (None: null)."""
    name: str | None
    topic_id: Uuid | None
    records: list


class ProduceTally(NamedTuple):
    """What the observers read of a Produce request."""
    client_id: str | None
    acks: int
    topics: list[TopicRecords]


class ProduceAnswerTally(NamedTuple):
    """What the observers read of a Produce answer: its non-zero error codes in partition order
    (as ``walk.error_codes`` finds them) and its throttle time (None before v1). It has no node
    endpoints and no leader hints: those are tagged fields, which leave an answer untallied."""
    throttle_time_ms: int | None
    errors: list[int]


# The readers spell each length out (a compact one of one byte inline, a classic one in one
# unpack): a helper call per length cost as much as the rest of the reading.

def read_request(buf) -> ProduceTally | None:
    end = len(buf)
    api_key, version, _, n = HEAD(buf, 0)
    if api_key != PRODUCE or not FIRST_VERSION <= version <= NEWEST_LAYOUT:
        return None
    pos = 10
    client_id = None
    if n >= 0:
        if pos + n > end:
            return None
        client_id = str(buf[pos:pos + n], "utf-8", "surrogateescape")
        pos += n
    elif n != -1:
        return None
    flexible = version >= FLEXIBLE_SINCE
    if flexible:
        if buf[pos]:                     # header tagged fields
            return None
        pos += 1
    if version >= TRANSACTIONAL_ID_SINCE:
        if flexible:
            n = buf[pos] - 1
            pos += 1
            if n >= 0x7F:
                n, pos = long_length(buf, pos - 1)
        else:
            n, = I16(buf, pos)
            pos += 2
        if n < -1 or pos + n > end:
            return None
        if n > 0:
            pos += n
    acks, = _ACKS(buf, pos)
    pos += _ACKS_TIMEOUT_BYTES
    if flexible:
        count = buf[pos] - 1
        pos += 1
        if count >= 0x7F:
            count, pos = long_length(buf, pos - 1)
    else:
        count, = I32(buf, pos)
        pos += 4
    if count < 0 or count > end - pos:
        return None
    by_id = version >= TOPIC_ID_SINCE
    view = memoryview(buf)
    topics = []
    for _ in range(count):
        if by_id:
            if pos + UUID_BYTES > end:
                return None
            name, topic_id = None, Uuid(buf[pos:pos + UUID_BYTES])
            pos += UUID_BYTES
        else:
            if flexible:
                n = buf[pos] - 1
                pos += 1
                if n >= 0x7F:
                    n, pos = long_length(buf, pos - 1)
            else:
                n, = I16(buf, pos)
                pos += 2
            if n < 0 or pos + n > end:
                return None
            name, topic_id = str(buf[pos:pos + n], "utf-8", "surrogateescape"), None
            pos += n
        if flexible:
            partitions = buf[pos] - 1
            pos += 1
            if partitions >= 0x7F:
                partitions, pos = long_length(buf, pos - 1)
        else:
            partitions, = I32(buf, pos)
            pos += 4
        if partitions < 0 or partitions > end - pos:
            return None
        records = []
        for _ in range(partitions):
            pos += INDEX_BYTES
            if flexible:
                n = buf[pos] - 1
                pos += 1
                if n >= 0x7F:            # records of 127 bytes and more
                    b = buf[pos]
                    if 0 < b < 0x80:     # two bytes (up to 16 KiB), minimal
                        n = ((n + 1) & 0x7F | b << 7) - 1     # n + 1: the first byte
                        pos += 1
                    else:
                        n, pos = long_length(buf, pos - 1)
            else:
                n, = I32(buf, pos)
                pos += 4
            if n < 0:
                if n != -1:
                    return None
                records.append(None)
            else:
                if pos + n > end:
                    return None
                records.append(view[pos:pos + n])
                pos += n
            if flexible:
                if buf[pos]:
                    return None
                pos += 1
        if flexible:
            if buf[pos]:
                return None
            pos += 1
        topics.append(TopicRecords(name, topic_id, records))
    if flexible and buf[pos]:
        return None                      # bytes after the body are allowed (Kafka ignores them)
    return ProduceTally(client_id, acks, topics)


def read_answer(buf, version: int) -> ProduceAnswerTally | None:
    end = len(buf)
    pos = 4                              # the correlation id
    flexible = version >= FLEXIBLE_SINCE
    if flexible:
        if buf[pos]:                     # header tagged fields
            return None
        pos += 1
    # A partition answer's fixed run: index int32, error_code int16, base_offset int64, then
    # log_append_time_ms and log_start_offset (int64 each) from their versions on.
    fixed = 14 + 8 * (version >= LOG_APPEND_TIME_SINCE) + 8 * (version >= LOG_START_OFFSET_SINCE)
    record_errors = version >= RECORD_ERRORS_SINCE
    errors = []
    if flexible:
        count = buf[pos] - 1
        pos += 1
        if count >= 0x7F:
            count, pos = long_length(buf, pos - 1)
    else:
        count, = I32(buf, pos)
        pos += 4
    if count < 0 or count > end - pos:
        return None
    by_id = version >= TOPIC_ID_SINCE
    for _ in range(count):
        if by_id:
            pos += UUID_BYTES
            if pos > end:
                return None
        else:
            if flexible:
                n = buf[pos] - 1
                pos += 1
                if n >= 0x7F:
                    n, pos = long_length(buf, pos - 1)
            else:
                n, = I16(buf, pos)
                pos += 2
            if n < 0 or pos + n > end:
                return None
            pos += n
        if flexible:
            partitions = buf[pos] - 1
            pos += 1
            if partitions >= 0x7F:
                partitions, pos = long_length(buf, pos - 1)
        else:
            partitions, = I32(buf, pos)
            pos += 4
        if partitions < 0 or partitions > end - pos:
            return None
        for _ in range(partitions):
            if pos + fixed > end:
                return None
            code, = _ERROR_CODE(buf, pos + INDEX_BYTES)
            if code:
                errors.append(code)
            pos += fixed
            if record_errors:
                if flexible and buf[pos] == 1 and buf[pos + 1] == 0:
                    pos += 2                     # no record errors, no error message: nearly always
                else:
                    pos = _skip_record_errors(buf, pos, flexible, end)
                    pos = skip_nullable_string(buf, pos, flexible, end)      # error_message
            if flexible:
                if buf[pos]:             # the leader hint (current_leader) or unknown tags
                    return None
                pos += 1
        if flexible:
            if buf[pos]:
                return None
            pos += 1
    throttle = None
    if version >= THROTTLE_SINCE:
        throttle, = I32(buf, pos)
        pos += 4
    if flexible and buf[pos]:
        return None                      # node endpoints (KIP-951) or unknown tags
    return ProduceAnswerTally(throttle, errors)


def _skip_record_errors(buf, pos: int, flexible: bool, end: int) -> int:
    """Past a partition answer's record_errors (batch_index int32, batch_index_error_message)."""
    if flexible:
        n = buf[pos] - 1
        pos += 1
        if n >= 0x7F:
            n, pos = long_length(buf, pos - 1)
    else:
        n, = I32(buf, pos)
        pos += 4
    if n < 0 or n > end - pos:
        raise DecodeError("malformed record_errors")
    for _ in range(n):
        pos = skip_nullable_string(buf, pos + INDEX_BYTES, flexible, end)
        if flexible:
            if buf[pos]:
                raise DecodeError("tagged fields in record_errors")
            pos += 1
    return pos
