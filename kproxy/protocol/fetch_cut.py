"""How much of a held Fetch answer may go to the client before the answer is complete.

A Fetch v16+ answer is held because its top-level tagged fields may carry broker addresses
(KIP-951 ``NodeEndpoints``), at its very end, after up to megabytes of records. Holding it
whole makes the client wait for the last byte before it gets the first, where a relay that
knows nothing of Kafka passes each read on at once. Kafka fills ``NodeEndpoints`` only with
the leaders of partitions answered NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH (each also
given a ``CurrentLeader`` tagged field). ``FetchCut`` walks the answer as its bytes arrive,
skipping each record set by its length: once every partition's header has arrived with
neither error and no ``CurrentLeader`` before it, all up to the end of the last partition's
records may pass as it arrives (the cut); the rest, that partition's, its topic's and the
answer's tagged fields (a few bytes), is held. The tracker still checks the complete answer
and closes the connection if a rewrite would change what has passed: a broker that sends
addresses without those errors costs a reconnection, never a leak.

Sans-I/O, read-only: offsets into the buffer the answer is assembled in.
"""

from __future__ import annotations

import struct

# Partition errors that come with a leader hint (and so with node endpoints): the answer is
# held whole, as every answer was before.
NOT_LEADER_OR_FOLLOWER = 6
FENCED_LEADER_EPOCH = 74
_LEADER_HINT_ERRORS = (NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH)
_CURRENT_LEADER_TAG = 1            # PartitionData's tagged field holding the hint
FIRST_FLEXIBLE_VERSION = 12        # the layout walked below (tagged fields, compact lengths)
_FIRST_TOPIC_ID_VERSION = 13       # topics named by a 16-byte id instead of a string
# PartitionData's fixed head: partition_index int32, error_code int16, high_watermark,
# last_stable_offset, log_start_offset int64.
_PARTITION_HEAD = 30
_ERROR_AT = 4
_ABORTED_TRANSACTION = 16          # producer_id, first_offset int64 (then its tagged fields)
# What the answer ends with after the last records: the partition's, the topic's and the
# answer's tagged fields, at least a count byte each.
_TAILS_AFTER_RECORDS = 3
_EMPTY_TAILS = bytes(_TAILS_AFTER_RECORDS)        # each a count of no fields
_I16 = struct.Struct(">h")
_MAX_UVARINT_BYTES = 5

HOLD_WHOLE = -1                    # the answer is held whole (a cut of nothing)

_HEAD, _TOPIC, _PARTITION, _AFTER_RECORDS = range(4)


class _More(Exception):
    """The walk needs bytes that have not arrived yet."""


class _Odd(Exception):
    """Not the layout expected: the answer is held whole (the usual checks judge it)."""


class FetchCut:
    """The walk of one Fetch answer (v12+) being assembled in ``buffer`` from ``base`` (its
    size prefix first), ``total`` bytes long. ``advance(filled)`` after each read: the cut
    (bytes from the size prefix on that may pass once arrived), ``HOLD_WHOLE``, or None
    while undecided. Each structure is read once: a piece that has not fully arrived is
    read again from its start by the next call."""

    __slots__ = ("_buffer", "_base", "_total", "_topic_ids", "_stage", "_pos", "_topics", "_partitions",
                 "cut")

    def __init__(self, buffer, base: int, total: int, version: int):
        self._buffer = buffer
        self._base = base
        self._total = total
        self._topic_ids = version >= _FIRST_TOPIC_ID_VERSION
        self._stage = _HEAD
        self._pos = base + 4               # after the size prefix
        self._topics = 0                   # topics still to come after the current one
        self._partitions = 0               # partitions of the current topic still to come
        self.cut: int | None = None        # decided: the cut, or HOLD_WHOLE

    def advance(self, filled: int) -> int | None:
        """The decision, given that ``filled`` bytes of the answer (size prefix included)
        have arrived; None: not yet."""
        if self.cut is not None:
            return self.cut
        end = self._base + min(filled, self._total)
        try:
            while self.cut is None:
                self._step(end)
        except _More:
            return None
        except (_Odd, IndexError, struct.error):
            self.cut = HOLD_WHOLE
        return self.cut

    def bare_tail(self, frame) -> bool:
        """Whether the complete answer (``frame``, size prefix excluded) ends at the cut with
        three empty tagged-field blocks: then it holds no address and no leader hint at all
        (those before the cut were walked), and there is nothing to rewrite."""
        cut = self.cut
        return (cut is not None and len(frame) + 4 - cut == _TAILS_AFTER_RECORDS
                and frame[-_TAILS_AFTER_RECORDS:] == _EMPTY_TAILS)

    def view(self, start: int, end: int) -> memoryview:
        """Bytes ``start`` to ``end`` of the answer (size prefix included), uncopied."""
        return memoryview(self._buffer)[self._base + start:self._base + end]

    def _step(self, end: int) -> None:
        buffer, pos, stage = self._buffer, self._pos, self._stage
        if stage == _HEAD:
            pos = _skip_tagged(buffer, pos + 4, end)[0]        # correlation id, header's tags
            count, pos = _uvarint(buffer, pos + 10, end)       # throttle, error, session; topics
            if count <= 1:                                     # null or empty: no records to pass
                raise _Odd
            self._topics = count - 2
            stage = _TOPIC
        elif stage == _TOPIC:
            if self._topic_ids:
                pos += 16
            else:
                length, pos = _uvarint(buffer, pos, end)
                if not length:                                 # a null name
                    raise _Odd
                pos += length - 1
            count, pos = _uvarint(buffer, pos, end)
            if count <= 1:
                raise _Odd
            self._partitions = count - 1
            stage = _PARTITION
        elif stage == _PARTITION:
            _need(pos + _PARTITION_HEAD, end)
            if _I16.unpack_from(buffer, pos + _ERROR_AT)[0] in _LEADER_HINT_ERRORS:
                raise _Odd
            count, pos = _uvarint(buffer, pos + _PARTITION_HEAD, end)   # aborted transactions
            for _ in range(count - 1):
                pos = _skip_tagged(buffer, pos + _ABORTED_TRANSACTION, end)[0]
            length, pos = _uvarint(buffer, pos + 4, end)       # preferred read replica; records
            pos += max(length - 1, 0)
            self._partitions -= 1
            if not self._partitions and not self._topics:
                if pos - self._base > self._total - _TAILS_AFTER_RECORDS:
                    raise _Odd
                self.cut = pos - self._base
                return
            stage = _AFTER_RECORDS
        else:
            pos, leader_hint = _skip_tagged(buffer, pos, end)  # the partition's
            if leader_hint:
                raise _Odd
            if self._partitions:
                stage = _PARTITION
            else:
                pos = _skip_tagged(buffer, pos, end)[0]         # the topic's
                self._topics -= 1
                stage = _TOPIC
        if pos > self._base + self._total:
            raise _Odd
        self._pos, self._stage = pos, stage


def _need(pos: int, end: int) -> None:
    if pos > end:
        raise _More


def _uvarint(buffer, pos: int, end: int) -> tuple[int, int]:
    if pos < end and buffer[pos] < 0x80:                    # one byte: nearly every count here
        return buffer[pos], pos + 1
    value = shift = 0
    for _ in range(_MAX_UVARINT_BYTES):
        if pos >= end:
            raise _More
        byte = buffer[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise _Odd


def _skip_tagged(buffer, pos: int, end: int) -> tuple[int, bool]:
    """Past a tagged-field block (all of it arrived); whether it holds a leader hint."""
    count, pos = _uvarint(buffer, pos, end)
    hint = False
    for _ in range(count):
        tag, pos = _uvarint(buffer, pos, end)
        size, pos = _uvarint(buffer, pos, end)
        pos += size
        _need(pos, end)
        hint = hint or tag == _CURRENT_LEADER_TAG
    return pos, hint
