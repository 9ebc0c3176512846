"""Fetch tallies: a consumer's positions (session, isolation, partitions and offsets asked
for, partitions forgotten); an answer's partition headers, records, error codes and
throttle time."""

from __future__ import annotations

import struct
from typing import NamedTuple

from .. import schema
from .._codec import Uuid
from ..api_keys import ApiKey
from ._common import (HEAD, I8, I16, I32, I64, UUID_BYTES, array_count, long_length, read_topic, since,
                      skip_nullable_string)

FETCH = int(ApiKey.FETCH)
_REQUEST, _RESPONSE = schema.REQUESTS[FETCH], schema.RESPONSES[FETCH]
# The newest Fetch version whose layout the readers below follow (Kafka 4.x: 18). Newer ones
# (a regenerated schema) get no tally until these readers learn them: the partial decode
# answers for them meanwhile (a test fails when the schema moves past this).
NEWEST_LAYOUT = 18
FIRST_VERSION = _REQUEST.versions[0]
FLEXIBLE_SINCE = _REQUEST.first_flexible
REPLICA_STATE_SINCE = since(_REQUEST, "replica_state")     # replica_id moves into a tagged field
MAX_BYTES_SINCE = since(_REQUEST, "max_bytes")
ISOLATION_LEVEL_SINCE = since(_REQUEST, "isolation_level")
SESSION_SINCE = since(_REQUEST, "session_epoch")            # and session_id, forgotten_topics_data
RACK_ID_SINCE = since(_REQUEST, "rack_id")
TOPIC_ID_SINCE = since(_REQUEST, "topic_id", "FetchTopic")
LEADER_EPOCH_SINCE = since(_REQUEST, "current_leader_epoch", "FetchPartition")
LAST_FETCHED_EPOCH_SINCE = since(_REQUEST, "last_fetched_epoch", "FetchPartition")
ASKED_LOG_START_SINCE = since(_REQUEST, "log_start_offset", "FetchPartition")
THROTTLE_SINCE = since(_RESPONSE, "throttle_time_ms")
ERROR_CODE_SINCE = since(_RESPONSE, "error_code")     # and session_id
LAST_STABLE_OFFSET_SINCE = since(_RESPONSE, "last_stable_offset", "PartitionData")   # and aborted_transactions
ANSWER_LOG_START_SINCE = since(_RESPONSE, "log_start_offset", "PartitionData")
PREFERRED_REPLICA_SINCE = since(_RESPONSE, "preferred_read_replica", "PartitionData")
NO_REPLICA = -1                                   # a consumer's replica id (and the tagged field's default)
NO_OFFSET = -1                                    # no last stable offset (before v4)
_ABORTED_TRANSACTION_BYTES = 16                   # producer_id, first_offset: int64 each

_PARTITION_HEAD = struct.Struct(">ihq").unpack_from    # an answer's partition_index, error_code, high_watermark


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


def read_request(buf) -> FetchTally | None:
    end = len(buf)
    api_key, version, _, n = HEAD(buf, 0)
    if api_key != FETCH or not FIRST_VERSION <= version <= NEWEST_LAYOUT:
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
    replica_id = NO_REPLICA
    if version < REPLICA_STATE_SINCE:
        replica_id, = I32(buf, pos)
        pos += 4
    pos += 8 + 4 * (version >= MAX_BYTES_SINCE)       # max_wait_ms, min_bytes, max_bytes
    isolation_level = 0
    if version >= ISOLATION_LEVEL_SINCE:
        isolation_level, = I8(buf, pos)
        pos += 1
    session_epoch = -1
    if version >= SESSION_SINCE:
        session_epoch, = I32(buf, pos + 4)           # after session_id
        pos += 8
    by_id = version >= TOPIC_ID_SINCE
    # A partition: partition int32, [current_leader_epoch int32], fetch_offset int64,
    # [last_fetched_epoch int32], [log_start_offset int64], partition_max_bytes int32.
    offset_at = 4 + 4 * (version >= LEADER_EPOCH_SINCE)
    width = offset_at + 12 + 4 * (version >= LAST_FETCHED_EPOCH_SINCE) + 8 * (version >= ASKED_LOG_START_SINCE)
    topics = []
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
    for _ in range(count):
        if by_id:
            if pos + UUID_BYTES > end:
                return None
            topic = Uuid(buf[pos:pos + UUID_BYTES])
            pos += UUID_BYTES
        else:
            topic, pos = read_topic(buf, pos, flexible, False, end)
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
        asked = []
        for _ in range(partitions):
            if pos + width > end:
                return None
            asked.append((I32(buf, pos)[0], I64(buf, pos + offset_at)[0]))
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
        count, pos = array_count(buf, pos, flexible, end)
        for _ in range(count):
            topic, pos = read_topic(buf, pos, flexible, by_id, end)
            partitions, pos = array_count(buf, pos, flexible, end)
            if pos + 4 * partitions > end:
                return None
            forgotten.append((topic, list(struct.unpack_from(f">{partitions}i", buf, pos))))
            pos += 4 * partitions
            if flexible:
                if buf[pos]:
                    return None
                pos += 1
    if version >= RACK_ID_SINCE:
        pos = skip_nullable_string(buf, pos, flexible, end, nullable=False)
    if flexible and buf[pos]:
        return None                      # cluster_id, replica_state (a follower) or unknown tags
    return FetchTally(client_id, replica_id, isolation_level, session_epoch, topics, forgotten)


def read_answer(buf, version: int) -> FetchAnswerTally | None:
    end = len(buf)
    pos = 4                              # the correlation id
    flexible = version >= FLEXIBLE_SINCE
    if flexible:
        if buf[pos]:                     # header tagged fields
            return None
        pos += 1
    throttle = None
    if version >= THROTTLE_SINCE:
        throttle, = I32(buf, pos)
        pos += 4
    error_code = 0
    if version >= ERROR_CODE_SINCE:
        error_code, = I16(buf, pos)
        pos += 6                         # and session_id
    errors = [error_code] if error_code else []
    by_id = version >= TOPIC_ID_SINCE
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
            count, pos = long_length(buf, pos - 1)
    else:
        count, = I32(buf, pos)
        pos += 4
    if count < 0 or count > end - pos:
        return None
    for _ in range(count):
        if by_id:
            if pos + UUID_BYTES > end:
                return None
            name, topic_id = None, Uuid(buf[pos:pos + UUID_BYTES])
            pos += UUID_BYTES
        else:
            name, pos = read_topic(buf, pos, flexible, False, end)
            topic_id = None
        if flexible:
            count_partitions = buf[pos] - 1
            pos += 1
            if count_partitions >= 0x7F:
                count_partitions, pos = long_length(buf, pos - 1)
        else:
            count_partitions, = I32(buf, pos)
            pos += 4
        if count_partitions < 0 or count_partitions > end - pos:
            return None
        partitions = []
        for _ in range(count_partitions):
            if pos + fixed > end:
                return None
            index, code, high_watermark = _PARTITION_HEAD(buf, pos)
            last_stable = I64(buf, pos + 14)[0] if stable else NO_OFFSET
            if code:
                errors.append(code)
            pos += fixed
            if stable:                   # aborted_transactions (nullable)
                if flexible:
                    n = buf[pos] - 1
                    pos += 1
                    if n >= 0x7F:
                        n, pos = long_length(buf, pos - 1)
                else:
                    n, = I32(buf, pos)
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
                        n, pos = long_length(buf, pos - 1)
            else:
                n, = I32(buf, pos)
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
