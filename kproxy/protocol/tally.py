"""Tallies: what the per-pair observers count of a Produce pair, read straight from its frame.

Every Produce request and answer passes the metrics (records and bytes per partition,
the answer's error codes and throttle time), the failover observer (did a partition
fail?) and, for answers, the address check (does it name KIP-951 node endpoints?).
The partial decode (``skim``) gives them that, but builds a struct per topic and
partition and a request object on the way: about half of the metrics' time per pair.
A tally reads the same numbers in one pass over the frame and makes only the values
handed on (``ProduceTally``, ``ProduceAnswerTally``).

Common case only. A frame with anything unusual gets no tally (None) and its readers
fall back to the partial decode: a tagged field anywhere (the leader hints and node
endpoints that come after a leader moved, or unknown tags), a version past the
newest layout written here, anything the strict reader would refuse. So a tally
exists only for a frame the strict reader accepts, and holds what it would read
(``tests/protocol/test_tally.py`` checks both on generated and mutated frames of
every version). The version thresholds are read from the schema's rows.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from . import schema
from ._codec import Uuid, read_uvarint
from .api_keys import ApiKey
from .errors import DecodeError

PRODUCE = int(ApiKey.PRODUCE)
_REQUEST, _RESPONSE = schema.REQUESTS[PRODUCE], schema.RESPONSES[PRODUCE]


def _since(spec: schema.MessageSpec, field: str, struct_name: str | None = None) -> int:
    """The first version of ``spec`` (or its struct) with ``field``."""
    rows = spec.fields if struct_name is None else spec.structs[struct_name]
    return next(f.versions[0] for f in rows if f.name == field)


# The newest Produce version whose layout the readers below follow (Kafka 4.x: 13). Newer
# ones (a regenerated schema) get no tally until these readers learn them: the partial decode
# answers for them meanwhile (a test fails when the schema moves past this).
NEWEST_LAYOUT = 13
FIRST_VERSION = _REQUEST.versions[0]
FLEXIBLE_SINCE = _REQUEST.first_flexible                     # compact lengths, tag blocks, header v2
TRANSACTIONAL_ID_SINCE = _since(_REQUEST, "transactional_id")
TOPIC_ID_SINCE = _since(_REQUEST, "topic_id", "TopicProduceData")   # topics by id, not name
THROTTLE_SINCE = _since(_RESPONSE, "throttle_time_ms")
LOG_APPEND_TIME_SINCE = _since(_RESPONSE, "log_append_time_ms", "PartitionProduceResponse")
LOG_START_OFFSET_SINCE = _since(_RESPONSE, "log_start_offset", "PartitionProduceResponse")
RECORD_ERRORS_SINCE = _since(_RESPONSE, "record_errors", "PartitionProduceResponse")   # and error_message

_HEAD = struct.Struct(">hhih").unpack_from       # api key, version, correlation id, client_id length
_ERROR_CODE = struct.Struct(">h").unpack_from     # of a partition answer, after its int32 index
_I16 = struct.Struct(">h").unpack_from
_I32 = struct.Struct(">i").unpack_from
_ACKS = _I16
_ACKS_TIMEOUT_BYTES = 6                           # acks int16, timeout_ms int32
_INDEX_BYTES = 4                                  # a partition index, int32
_UUID_BYTES = 16
_MALFORMED = (DecodeError, struct.error, IndexError)


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


def tally_request(frame) -> ProduceTally | None:
    """The tally of a Produce request frame (after its size prefix), or None (see the module)."""
    try:
        return _request(frame)
    except _MALFORMED:
        return None


def tally_response(frame, api_version: int) -> ProduceAnswerTally | None:
    """The tally of an answer to a Produce request of ``api_version``, or None (see the module)."""
    if not FIRST_VERSION <= api_version <= NEWEST_LAYOUT:
        return None
    try:
        return _response(frame, api_version)
    except _MALFORMED:
        return None


def _long_length(buf, pos: int) -> tuple[int, int]:
    """A compact length (uvarint N+1) of two bytes or more: N, and where it ends."""
    n, pos = read_uvarint(buf, pos)
    return n - 1, pos


# The readers spell each length out (a compact one of one byte inline, a classic one in one
# unpack): a helper call per length cost as much as the rest of the reading.

def _request(buf) -> ProduceTally | None:
    end = len(buf)
    api_key, version, _, n = _HEAD(buf, 0)
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
                n, pos = _long_length(buf, pos - 1)
        else:
            n, = _I16(buf, pos)
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
            count, pos = _long_length(buf, pos - 1)
    else:
        count, = _I32(buf, pos)
        pos += 4
    if count < 0 or count > end - pos:
        return None
    by_id = version >= TOPIC_ID_SINCE
    view = memoryview(buf)
    topics = []
    for _ in range(count):
        if by_id:
            if pos + _UUID_BYTES > end:
                return None
            name, topic_id = None, Uuid(buf[pos:pos + _UUID_BYTES])
            pos += _UUID_BYTES
        else:
            if flexible:
                n = buf[pos] - 1
                pos += 1
                if n >= 0x7F:
                    n, pos = _long_length(buf, pos - 1)
            else:
                n, = _I16(buf, pos)
                pos += 2
            if n < 0 or pos + n > end:
                return None
            name, topic_id = str(buf[pos:pos + n], "utf-8", "surrogateescape"), None
            pos += n
        if flexible:
            partitions = buf[pos] - 1
            pos += 1
            if partitions >= 0x7F:
                partitions, pos = _long_length(buf, pos - 1)
        else:
            partitions, = _I32(buf, pos)
            pos += 4
        if partitions < 0 or partitions > end - pos:
            return None
        records = []
        for _ in range(partitions):
            pos += _INDEX_BYTES
            if flexible:
                n = buf[pos] - 1
                pos += 1
                if n >= 0x7F:            # records of 127 bytes and more
                    n, pos = _long_length(buf, pos - 1)
            else:
                n, = _I32(buf, pos)
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


def _response(buf, version: int) -> ProduceAnswerTally | None:
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
            count, pos = _long_length(buf, pos - 1)
    else:
        count, = _I32(buf, pos)
        pos += 4
    if count < 0 or count > end - pos:
        return None
    by_id = version >= TOPIC_ID_SINCE
    for _ in range(count):
        if by_id:
            pos += _UUID_BYTES
            if pos > end:
                return None
        else:
            if flexible:
                n = buf[pos] - 1
                pos += 1
                if n >= 0x7F:
                    n, pos = _long_length(buf, pos - 1)
            else:
                n, = _I16(buf, pos)
                pos += 2
            if n < 0 or pos + n > end:
                return None
            pos += n
        if flexible:
            partitions = buf[pos] - 1
            pos += 1
            if partitions >= 0x7F:
                partitions, pos = _long_length(buf, pos - 1)
        else:
            partitions, = _I32(buf, pos)
            pos += 4
        if partitions < 0 or partitions > end - pos:
            return None
        for _ in range(partitions):
            if pos + fixed > end:
                return None
            code, = _ERROR_CODE(buf, pos + _INDEX_BYTES)
            if code:
                errors.append(code)
            pos += fixed
            if record_errors:
                pos = _skip_record_errors(buf, pos, flexible, end)
                pos = _skip_nullable_string(buf, pos, flexible, end)      # error_message
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
        throttle, = _I32(buf, pos)
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
            n, pos = _long_length(buf, pos - 1)
    else:
        n, = _I32(buf, pos)
        pos += 4
    if n < 0 or n > end - pos:
        raise DecodeError("malformed record_errors")
    for _ in range(n):
        pos = _skip_nullable_string(buf, pos + _INDEX_BYTES, flexible, end)
        if flexible:
            if buf[pos]:
                raise DecodeError("tagged fields in record_errors")
            pos += 1
    return pos


def _skip_nullable_string(buf, pos: int, flexible: bool, end: int) -> int:
    if flexible:
        n = buf[pos] - 1
        pos += 1
        if n >= 0x7F:
            n, pos = _long_length(buf, pos - 1)
    else:
        n, = _I16(buf, pos)
        pos += 2
    if n < -1 or pos + n > end:
        raise DecodeError("malformed string")
    return pos + n if n > 0 else pos
