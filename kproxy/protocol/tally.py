"""Tallies: what the per-pair observers count of a Produce or Fetch pair, read straight from its frame.

Every Produce and Fetch pair passes the metrics (records and bytes per partition, the
answer's error codes and throttle time; for Fetch the consumer's positions and the
partition ends, for the lag), the failover observer (did a partition fail?) and, for
answers, the address check (does it name KIP-951 node endpoints?). The partial decode
(``skim``) gives them that, but builds a struct per topic and partition and a request
object on the way: about half of the metrics' time per pair. A tally reads the same
numbers in one pass over the frame and makes only the values handed on
(``ProduceTally``, ``ProduceAnswerTally``, ``FetchTally``, ``FetchAnswerTally``).

Common case only. A frame with anything unusual gets no tally (None) and its readers
fall back to the partial decode: a tagged field anywhere (the leader hints and node
endpoints that come after a leader moved, a follower's replica state, unknown tags), a
version past the newest layout written here, anything the strict reader would refuse.
So a tally exists only for a frame the strict reader accepts, and holds what it would
read (``tests/protocol/test_tally.py`` checks both on generated and mutated frames of
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

FETCH = int(ApiKey.FETCH)
_FETCH_REQUEST, _FETCH_RESPONSE = schema.REQUESTS[FETCH], schema.RESPONSES[FETCH]
# As NEWEST_LAYOUT, for Fetch (Kafka 4.x: 18).
FETCH_NEWEST_LAYOUT = 18
FETCH_FIRST_VERSION = _FETCH_REQUEST.versions[0]
FETCH_FLEXIBLE_SINCE = _FETCH_REQUEST.first_flexible
REPLICA_STATE_SINCE = _since(_FETCH_REQUEST, "replica_state")     # replica_id moves into a tagged field
MAX_BYTES_SINCE = _since(_FETCH_REQUEST, "max_bytes")
ISOLATION_LEVEL_SINCE = _since(_FETCH_REQUEST, "isolation_level")
SESSION_SINCE = _since(_FETCH_REQUEST, "session_epoch")            # and session_id, forgotten_topics_data
RACK_ID_SINCE = _since(_FETCH_REQUEST, "rack_id")
FETCH_TOPIC_ID_SINCE = _since(_FETCH_REQUEST, "topic_id", "FetchTopic")
LEADER_EPOCH_SINCE = _since(_FETCH_REQUEST, "current_leader_epoch", "FetchPartition")
LAST_FETCHED_EPOCH_SINCE = _since(_FETCH_REQUEST, "last_fetched_epoch", "FetchPartition")
FETCH_LOG_START_SINCE = _since(_FETCH_REQUEST, "log_start_offset", "FetchPartition")
FETCH_THROTTLE_SINCE = _since(_FETCH_RESPONSE, "throttle_time_ms")
FETCH_ERROR_CODE_SINCE = _since(_FETCH_RESPONSE, "error_code")     # and session_id
LAST_STABLE_OFFSET_SINCE = _since(_FETCH_RESPONSE, "last_stable_offset", "PartitionData")   # and aborted_transactions
ANSWER_LOG_START_SINCE = _since(_FETCH_RESPONSE, "log_start_offset", "PartitionData")
PREFERRED_REPLICA_SINCE = _since(_FETCH_RESPONSE, "preferred_read_replica", "PartitionData")
NO_REPLICA = -1                                   # a consumer's replica id (and the tagged field's default)
NO_OFFSET = -1                                    # no last stable offset (before v4)
_ABORTED_TRANSACTION_BYTES = 16                   # producer_id, first_offset: int64 each

TALLIED = frozenset({PRODUCE, FETCH})              # the API keys with tallies

_HEAD = struct.Struct(">hhih").unpack_from       # api key, version, correlation id, client_id length
_ERROR_CODE = struct.Struct(">h").unpack_from     # of a partition answer, after its int32 index
_I16 = struct.Struct(">h").unpack_from
_I32 = struct.Struct(">i").unpack_from
_ACKS = _I16
_I8 = struct.Struct(">b").unpack_from
_I64 = struct.Struct(">q").unpack_from
_PARTITION_HEAD = struct.Struct(">ihq").unpack_from    # a Fetch answer's partition_index, error_code, high_watermark
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


class FetchTally(NamedTuple):
    """What the observers read of a Fetch request: who asks (a consumer's replica id is -1),
    its session and isolation, and per topic (name up to v12, else id) the partitions it asks
    for from which offset; and the partitions it forgets (incremental sessions, KIP-227)."""
    client_id: str | None
    replica_id: int
    isolation_level: int
    session_epoch: int
    topics: list[tuple[str | Uuid, list[tuple[int, int]]]]      # (topic, [(partition, fetch_offset)])
    forgotten: list[tuple[str | Uuid, list[int]]]               # (topic, [partition])


class FetchedPartition(NamedTuple):
    index: int
    error_code: int
    high_watermark: int
    last_stable_offset: int          # -1 before v4
    records: memoryview | None


class FetchedTopic(NamedTuple):
    name: str | None                 # up to v12
    topic_id: Uuid | None            # v13+
    partitions: list[FetchedPartition]


class FetchAnswerTally(NamedTuple):
    """What the observers read of a Fetch answer: as ``ProduceAnswerTally`` (error codes top
    level first, then per partition), its top-level error code, and each partition's header
    and records. No node endpoints, leader hints or diverging epochs (tagged: no tally)."""
    throttle_time_ms: int | None
    error_code: int
    errors: list[int]
    topics: list[FetchedTopic]


def tally_request(frame) -> ProduceTally | FetchTally | None:
    """The tally of a Produce request frame (after its size prefix), or None (see the module)."""
    try:
        return _request(frame) if _I16(frame, 0)[0] == PRODUCE else _fetch_request(frame)
    except _MALFORMED:
        return None


def tally_response(frame, api_key: int, api_version: int) -> ProduceAnswerTally | FetchAnswerTally | None:
    """The tally of an answer to a Produce or Fetch request of ``api_version``, or None (see the module)."""
    try:
        if api_key == PRODUCE:
            return _response(frame, api_version) if FIRST_VERSION <= api_version <= NEWEST_LAYOUT else None
        if api_key == FETCH:
            return _fetch_response(frame, api_version) \
                if FETCH_FIRST_VERSION <= api_version <= FETCH_NEWEST_LAYOUT else None
        return None
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
                    b = buf[pos]
                    if 0 < b < 0x80:     # two bytes (up to 16 KiB), minimal
                        n = ((n + 1) & 0x7F | b << 7) - 1     # n + 1: the first byte
                        pos += 1
                    else:
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
                if flexible and buf[pos] == 1 and buf[pos + 1] == 0:
                    pos += 2                     # no record errors, no error message: nearly always
                else:
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


def _skip_nullable_string(buf, pos: int, flexible: bool, end: int, nullable: bool = True) -> int:
    if flexible:
        n = buf[pos] - 1
        pos += 1
        if n >= 0x7F:
            n, pos = _long_length(buf, pos - 1)
    else:
        n, = _I16(buf, pos)
        pos += 2
    if n < (-1 if nullable else 0) or pos + n > end:
        raise DecodeError("malformed string")
    return pos + n if n > 0 else pos


def _fetch_request(buf) -> FetchTally | None:
    end = len(buf)
    api_key, version, _, n = _HEAD(buf, 0)
    if api_key != FETCH or not FETCH_FIRST_VERSION <= version <= FETCH_NEWEST_LAYOUT:
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
    flexible = version >= FETCH_FLEXIBLE_SINCE
    if flexible:
        if buf[pos]:                     # header tagged fields
            return None
        pos += 1
    replica_id = NO_REPLICA
    if version < REPLICA_STATE_SINCE:
        replica_id, = _I32(buf, pos)
        pos += 4
    pos += 8 + 4 * (version >= MAX_BYTES_SINCE)       # max_wait_ms, min_bytes, max_bytes
    isolation_level = 0
    if version >= ISOLATION_LEVEL_SINCE:
        isolation_level, = _I8(buf, pos)
        pos += 1
    session_epoch = -1
    if version >= SESSION_SINCE:
        session_epoch, = _I32(buf, pos + 4)           # after session_id
        pos += 8
    by_id = version >= FETCH_TOPIC_ID_SINCE
    # A partition: partition int32, [current_leader_epoch int32], fetch_offset int64,
    # [last_fetched_epoch int32], [log_start_offset int64], partition_max_bytes int32.
    offset_at = 4 + 4 * (version >= LEADER_EPOCH_SINCE)
    width = offset_at + 12 + 4 * (version >= LAST_FETCHED_EPOCH_SINCE) + 8 * (version >= FETCH_LOG_START_SINCE)
    topics = []
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
    for _ in range(count):
        if by_id:
            if pos + _UUID_BYTES > end:
                return None
            topic = Uuid(buf[pos:pos + _UUID_BYTES])
            pos += _UUID_BYTES
        else:
            topic, pos = _topic(buf, pos, flexible, False, end)
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
        asked = []
        for _ in range(partitions):
            if pos + width > end:
                return None
            asked.append((_I32(buf, pos)[0], _I64(buf, pos + offset_at)[0]))
            pos += width
            if flexible:
                if buf[pos]:             # replica_directory_id, high_watermark: followers
                    return None
                pos += 1
        if flexible:
            if buf[pos]:
                return None
            pos += 1
        topics.append((topic, asked))
    forgotten = []
    if version >= SESSION_SINCE:
        count, pos = _array_count(buf, pos, flexible, end)
        for _ in range(count):
            topic, pos = _topic(buf, pos, flexible, by_id, end)
            partitions, pos = _array_count(buf, pos, flexible, end)
            if pos + 4 * partitions > end:
                return None
            forgotten.append((topic, list(struct.unpack_from(f">{partitions}i", buf, pos))))
            pos += 4 * partitions
            if flexible:
                if buf[pos]:
                    return None
                pos += 1
    if version >= RACK_ID_SINCE:
        pos = _skip_nullable_string(buf, pos, flexible, end, nullable=False)
    if flexible and buf[pos]:
        return None                      # cluster_id, replica_state (a follower) or unknown tags
    return FetchTally(client_id, replica_id, isolation_level, session_epoch, topics, forgotten)


def _fetch_response(buf, version: int) -> FetchAnswerTally | None:
    end = len(buf)
    pos = 4                              # the correlation id
    flexible = version >= FETCH_FLEXIBLE_SINCE
    if flexible:
        if buf[pos]:                     # header tagged fields
            return None
        pos += 1
    throttle = None
    if version >= FETCH_THROTTLE_SINCE:
        throttle, = _I32(buf, pos)
        pos += 4
    error_code = 0
    if version >= FETCH_ERROR_CODE_SINCE:
        error_code, = _I16(buf, pos)
        pos += 6                         # and session_id
    errors = [error_code] if error_code else []
    by_id = version >= FETCH_TOPIC_ID_SINCE
    stable = version >= LAST_STABLE_OFFSET_SINCE
    # partition_index int32, error_code int16, high_watermark int64, [last_stable_offset int64],
    # [log_start_offset int64]
    fixed = 14 + 8 * stable + 8 * (version >= ANSWER_LOG_START_SINCE)
    preferred = 4 * (version >= PREFERRED_REPLICA_SINCE)
    view = memoryview(buf)
    topics = []
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
    for _ in range(count):
        if by_id:
            if pos + _UUID_BYTES > end:
                return None
            name, topic_id = None, Uuid(buf[pos:pos + _UUID_BYTES])
            pos += _UUID_BYTES
        else:
            name, pos = _topic(buf, pos, flexible, False, end)
            topic_id = None
        if flexible:
            count_partitions = buf[pos] - 1
            pos += 1
            if count_partitions >= 0x7F:
                count_partitions, pos = _long_length(buf, pos - 1)
        else:
            count_partitions, = _I32(buf, pos)
            pos += 4
        if count_partitions < 0 or count_partitions > end - pos:
            return None
        partitions = []
        for _ in range(count_partitions):
            if pos + fixed > end:
                return None
            index, code, high_watermark = _PARTITION_HEAD(buf, pos)
            last_stable = _I64(buf, pos + 14)[0] if stable else NO_OFFSET
            if code:
                errors.append(code)
            pos += fixed
            if stable:                   # aborted_transactions (nullable)
                if flexible:
                    n = buf[pos] - 1
                    pos += 1
                    if n >= 0x7F:
                        n, pos = _long_length(buf, pos - 1)
                else:
                    n, = _I32(buf, pos)
                    pos += 4
                if n < -1 or n > end - pos:
                    return None
                if flexible:
                    for _ in range(n):
                        pos += _ABORTED_TRANSACTION_BYTES
                        if buf[pos]:
                            return None
                        pos += 1
                elif n > 0:
                    pos += n * _ABORTED_TRANSACTION_BYTES
            pos += preferred
            if flexible:
                n = buf[pos] - 1
                pos += 1
                if n >= 0x7F:            # records of 127 bytes and more
                    b = buf[pos]
                    if 0 < b < 0x80:     # two bytes (up to 16 KiB), minimal
                        n = ((n + 1) & 0x7F | b << 7) - 1     # n + 1: the first byte
                        pos += 1
                    else:
                        n, pos = _long_length(buf, pos - 1)
            else:
                n, = _I32(buf, pos)
                pos += 4
            if n < 0:
                if n != -1:
                    return None
                records = None
            else:
                if pos + n > end:
                    return None
                records = view[pos:pos + n]
                pos += n
            if flexible:
                if buf[pos]:             # diverging_epoch, current_leader, snapshot_id
                    return None
                pos += 1
            partitions.append(FetchedPartition(index, code, high_watermark, last_stable, records))
        if flexible:
            if buf[pos]:
                return None
            pos += 1
        topics.append(FetchedTopic(name, topic_id, partitions))
    if flexible and buf[pos]:
        return None                      # node endpoints (KIP-951) or unknown tags
    return FetchAnswerTally(throttle, error_code, errors, topics)


def _array_count(buf, pos: int, flexible: bool, end: int) -> tuple[int, int]:
    """A non-nullable array's count, checked as the strict reader checks it."""
    if flexible:
        n = buf[pos] - 1
        pos += 1
        if n >= 0x7F:
            n, pos = _long_length(buf, pos - 1)
    else:
        n, = _I32(buf, pos)
        pos += 4
    if n < 0 or n > end - pos:
        raise DecodeError("malformed array count")
    return n, pos


def _topic(buf, pos: int, flexible: bool, by_id: bool, end: int) -> tuple[str | Uuid, int]:
    """A topic's id (``by_id``) or name (a non-nullable string)."""
    if by_id:
        if pos + _UUID_BYTES > end:
            raise DecodeError("truncated topic id")
        return Uuid(buf[pos:pos + _UUID_BYTES]), pos + _UUID_BYTES
    if flexible:
        n = buf[pos] - 1
        pos += 1
        if n >= 0x7F:
            n, pos = _long_length(buf, pos - 1)
    else:
        n, = _I16(buf, pos)
        pos += 2
    if n < 0 or pos + n > end:
        raise DecodeError("malformed topic name")
    return str(buf[pos:pos + n], "utf-8", "surrogateescape"), pos + n
