"""Kafka record batches and legacy message sets, decoded on demand.

Why this module exists: the codec keeps the ``records`` field of Produce
requests and Fetch / ShareFetch / FetchSnapshot responses as opaque bytes,
because the proxy forwards them untouched and most observers only want cheap
facts (how many batches, records and bytes, which compression). Those facts
sit in fixed-size batch headers, so :func:`iter_batches` walks the headers
over a ``memoryview`` of the blob without copying or decompressing anything.
Only a caller that wants the records themselves (capture, debugging) pays for
decompression, through :meth:`RecordBatch.records`.

Sans-I/O and safe on untrusted bytes: nothing here touches a socket, and the
only exception decoding raises is :class:`~kproxy.protocol.errors.DecodeError`.
Passing something that is not bytes-like at all is a programming error and
raises ``TypeError`` as usual.

Public API
----------
``iter_batches(data) -> BatchIterator``
    Walk a records blob (bytes, bytearray or memoryview; None, a null
    ``records`` field, walks as empty) holding any mix of magic 2 record
    batches and legacy magic 0/1 messages, one :class:`RecordBatch` per
    top-level entry. A truncated entry at the end (a
    Fetch response cut at ``max_bytes``) ends the walk quietly; once the
    iterator is exhausted its ``trailing_bytes`` attribute holds that entry's
    size (0 when the blob ends cleanly). Structural garbage raises DecodeError.
``split_batches(data) -> (list[RecordBatch], trailing_bytes)``
    The same walk, eagerly.
``RecordBatch``
    Immutable header of one entry (a named tuple: frozen, ``__slots__ = ()``,
    built with one ``struct`` unpack). Fields: ``base_offset, batch_length,
    partition_leader_epoch, magic, crc, attributes, last_offset_delta,
    base_timestamp, max_timestamp, producer_id, producer_epoch,
    base_sequence, record_count, raw``; derived properties ``compression``
    ("none", "gzip", "snappy", "lz4", "zstd", or "unknown"),
    ``timestamp_type``, ``is_transactional``, ``is_control``, ``size_bytes``,
    ``last_offset``, ``next_offset``. ``raw`` is a memoryview slice of the
    input covering the whole entry, never a copy. Methods ``verify_crc()``
    and ``records(max_decompressed_bytes=..., verify_crc=False)``.
``Record``
    Immutable record (a named tuple): ``offset, timestamp, key, value,
    headers, timestamp_type, attributes, sequence``. Control records
    (transaction markers) come out like any other, key and value as stored.
``TimestampType``, ``MAX_DECOMPRESSED_BYTES``, ``CODEC_NAMES``.

Legacy (magic 0/1) entries map onto RecordBatch as follows: ``base_offset``
is the message's offset field, which for a compressed magic 1 wrapper is the
offset of its *last* inner message (so ``last_offset`` is exact, the first
inner offset needs decompression); ``batch_length`` is the message size
field (like magic 2, the entry size minus 12); ``base_timestamp`` and
``max_timestamp`` are the message timestamp (-1 for magic 0);
``record_count`` is 1 for an uncompressed message and ``None`` for a
compressed wrapper, whose count is only known after decompression
(``len(batch.records())``); producer fields and the leader epoch are -1 and
``last_offset_delta`` is 0.

Format facts relied on (Kafka's ``DefaultRecordBatch`` / ``LegacyRecord``):

* Every entry starts with int64 offset and int32 size, the size counting the
  bytes after itself; the magic byte sits at byte 16 in every format.
* Magic 2 CRC is CRC-32C over attributes..end; magic 0/1 CRC is CRC-32 over
  magic..end.
* Magic 2 LogAppendTime batches give every record the batch max timestamp.
* A compressed magic 1 wrapper carries the absolute offset of its last inner
  message; inner offsets are relative, so absolute = wrapper offset - last
  inner offset + inner offset (inner offsets are kept as written when that
  base would be negative, e.g. in Produce requests). Magic 0 inner offsets
  are absolute. With LogAppendTime, inner messages take the wrapper's
  timestamp.
* Snappy comes raw or in xerial framing (``\\x82SNAPPY\\x00``, two int32,
  then int32-length-prefixed raw chunks); Kafka's Java client writes the
  latter.
* Kafka < 0.10 wrote LZ4 frames whose header checksum covered the magic
  number too; for magic 0/1 such a frame is repaired and decoded.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from kproxy.protocol.errors import DecodeError

# The compression and CRC-32C libraries are imported inside the functions that use them:
# walking batch headers, all a proxy does until a capture or the live page wants records,
# needs none of them. That keeps crc32c (which loads importlib.metadata), lz4 and zstandard,
# ~2 MiB resident, out of a fresh ``kproxy run`` (python-snappy is loaded there anyway, by
# prometheus_client's exposition).

__all__ = [
    "CODEC_NAMES",
    "MAX_DECOMPRESSED_BYTES",
    "DecompressionLimit",
    "BatchIterator",
    "Record",
    "RecordBatch",
    "TimestampType",
    "count_batches",
    "iter_batches",
    "split_batches",
]

# Decompression bomb guard. Brokers cap a batch at message.max.bytes (1 MiB by
# default, rarely above 100 MiB), and compression rarely beats 10:1 on real
# data, so honest batches stay far below this; a batch that inflates past it
# is hostile or corrupt, and we stop before it eats the proxy's memory.
MAX_DECOMPRESSED_BYTES = 256 * 1024 * 1024

# --- layout -----------------------------------------------------------------

_LOG_OVERHEAD = 12  # int64 offset + int32 size: the part the size excludes
_MAGIC_OFFSET = 16
# base_offset, batch_length, partition_leader_epoch, magic, crc, attributes,
# last_offset_delta, base_timestamp, max_timestamp, producer_id,
# producer_epoch, base_sequence, record_count
_V2_HEADER = struct.Struct(">qiibIHiqqqhii")
_V2_CRC_OFFSET = 17
_V2_CRC_START = 21  # CRC-32C covers attributes..end
_V2_MIN_SIZE = _V2_HEADER.size - _LOG_OVERHEAD
_V0_HEADER = struct.Struct(">qiIbB")  # offset, size, crc, magic, attributes
_V1_HEADER = struct.Struct(">qiIbBq")  # ... plus timestamp
_LEGACY_CRC_START = 16  # CRC-32 covers magic..end
_LEGACY_KEY_POS = (_V0_HEADER.size, _V1_HEADER.size)
# size field minimum: crc 4 + magic 1 + attributes 1 + key len 4 + value len 4
_V0_MIN_SIZE = 14
_V1_MIN_SIZE = _V0_MIN_SIZE + 8
_INT32 = struct.Struct(">i")
_INT32_MAX = 2**31 - 1

_CODEC_MASK = 0x07
_TIMESTAMP_TYPE_BIT = 0x08
_TRANSACTIONAL_BIT = 0x10
_CONTROL_BIT = 0x20

CODEC_NAMES = ("none", "gzip", "snappy", "lz4", "zstd", "unknown", "unknown", "unknown")
_CODEC_IDS = {name: i for i, name in enumerate(CODEC_NAMES[:5])}
_ZSTD = 4


def _crc32c(data: bytes | bytearray | memoryview) -> int:
    import crc32c  # on first use: see the note on the codec libraries at the imports

    return crc32c.crc32c(data)


class TimestampType(enum.IntEnum):
    NO_TIMESTAMP_TYPE = -1  # magic 0 carries no timestamp
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


_TS_TYPE_BY_BIT = (TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME)

Headers = tuple[tuple[str, bytes | None], ...]


# --- value objects ----------------------------------------------------------


class Record(NamedTuple):
    """One record. ``sequence`` is -1 without an idempotent producer."""

    offset: int = 0
    timestamp: int = -1
    key: bytes | None = None
    value: bytes | None = None
    headers: Headers = ()
    timestamp_type: int = TimestampType.CREATE_TIME
    attributes: int = 0
    sequence: int = -1


class RecordBatch(NamedTuple):
    """Header of one top-level entry; see the module docstring for legacy."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int | None
    raw: memoryview

    @property
    def compression(self) -> str:
        return CODEC_NAMES[self.attributes & _CODEC_MASK]

    @property
    def timestamp_type(self) -> TimestampType:
        if self.magic == 0:
            return TimestampType.NO_TIMESTAMP_TYPE
        return _TS_TYPE_BY_BIT[(self.attributes & _TIMESTAMP_TYPE_BIT) >> 3]

    @property
    def is_transactional(self) -> bool:
        return self.magic == 2 and bool(self.attributes & _TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return self.magic == 2 and bool(self.attributes & _CONTROL_BIT)

    @property
    def size_bytes(self) -> int:
        return self.batch_length + _LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    def verify_crc(self) -> None:
        """Raise DecodeError unless the stored CRC matches the entry bytes."""
        if self.magic == 2:
            actual = _crc32c(self.raw[_V2_CRC_START:])
        else:
            actual = zlib.crc32(self.raw[_LEGACY_CRC_START:])
        if actual != self.crc:
            raise DecodeError(
                f"batch at offset {self.base_offset}: CRC mismatch "
                f"(stored {self.crc:#010x}, computed {actual:#010x})"
            )

    def records(
        self,
        max_decompressed_bytes: int = MAX_DECOMPRESSED_BYTES,
        *,
        verify_crc: bool = False,
    ) -> list[Record]:
        """Decompress if needed and decode every record of this entry.

        With ``verify_crc`` the entry's CRC is checked first, and for a legacy
        wrapper the CRC of every inner message too.
        """
        if verify_crc:
            self.verify_crc()
        if self.magic == 2:
            return _v2_records(self, max_decompressed_bytes)
        return _legacy_records(self, max_decompressed_bytes, verify_crc)


_new_batch = tuple.__new__  # skips NamedTuple's argument parsing on the hot path


# --- the header walk --------------------------------------------------------


class BatchIterator:
    """Iterator over the entries of a records blob.

    ``trailing_bytes`` is the size of a truncated entry at the end of the blob;
    it is final once iteration has stopped (0 when the blob ended cleanly).
    """

    __slots__ = ("_walk", "trailing_bytes")

    def __init__(self, data: bytes | bytearray | memoryview | None) -> None:
        self.trailing_bytes = 0
        self._walk = _walk(_byte_view(data), self)

    def __iter__(self) -> Iterator[RecordBatch]:
        return self._walk  # a plain generator: the fastest loop Python has

    def __next__(self) -> RecordBatch:
        return next(self._walk)


def iter_batches(data: bytes | bytearray | memoryview | None) -> BatchIterator:
    """Walk the batch headers of a records blob without copying the payload."""
    return BatchIterator(data)


# batch_length, magic, attributes and record_count of a magic 2 batch header (``_V2_HEADER``):
# all that ``count_batches`` reads of it.
_V2_TOTALS = struct.Struct(">8xi4xb4xH34xi")


def count_batches(data: bytes | bytearray | memoryview | None, by_codec: dict[str, int]) -> tuple[int, int]:
    """Bytes and records of the entries of a records blob, each entry counted in ``by_codec``
    (compression name -> entries): what walking ``iter_batches`` counts (``size_bytes``,
    ``record_count or 0``, ``compression``) up to where it stops or raises, without a
    ``RecordBatch`` per entry. The metrics count every Produce and Fetch with it."""
    view = _byte_view(data)
    end = len(view)
    pos = records = 0
    # This loop runs for every batch of every Produce and Fetch: constants as locals, and no
    # byte total of its own (its batches lie end to end from 0: their bytes are where it stops).
    unpack, last, overhead, min_size, codecs = (_V2_TOTALS.unpack_from, end - _V2_HEADER.size, _LOG_OVERHEAD,
                                                _V2_MIN_SIZE, CODEC_NAMES)
    while pos <= last:
        size, magic, attributes, count = unpack(view, pos)
        stop = pos + overhead + size
        if magic != 2 or size < min_size or stop > end:
            break                        # legacy, malformed or cut short: the walk below decides
        records += count
        by_codec[codecs[attributes & _CODEC_MASK]] += 1
        pos = stop
    nbytes = pos
    if pos < end:
        try:
            for batch in iter_batches(view[pos:]):
                nbytes += batch.size_bytes
                records += batch.record_count or 0
                by_codec[batch.compression] += 1
        except DecodeError:
            pass                         # counted what was readable
    return nbytes, records


def split_batches(
    data: bytes | bytearray | memoryview | None,
) -> tuple[list[RecordBatch], int]:
    """All complete entries of a records blob, and the size of a truncated tail."""
    walker = BatchIterator(data)
    batches = list(walker._walk)
    return batches, walker.trailing_bytes


def _byte_view(data: bytes | bytearray | memoryview | None) -> memoryview:
    view = memoryview(b"" if data is None else data)  # records fields are nullable
    if view.format != "B" or view.ndim != 1 or not view.c_contiguous:
        view = view.cast("B")  # TypeError for non-contiguous views: a caller bug
    return view


def _walk(view: memoryview, owner: BatchIterator) -> Iterator[RecordBatch]:
    end = len(view)
    pos = 0
    # Locals, not globals, in the loop: this walk runs on every Fetch response.
    unpack_size = _INT32.unpack_from
    unpack_v2 = _V2_HEADER.unpack_from
    new_batch = _new_batch
    batch_type = RecordBatch
    while end - pos >= _LOG_OVERHEAD:
        (size,) = unpack_size(view, pos + 8)
        if size < _V0_MIN_SIZE:
            raise DecodeError(f"records at byte {pos}: entry size {size} is too small")
        stop = pos + _LOG_OVERHEAD + size
        if stop > end:
            if end - pos > _MAGIC_OFFSET and view[pos + _MAGIC_OFFSET] > 2:
                raise DecodeError(
                    f"records at byte {pos}: unknown magic {view[pos + _MAGIC_OFFSET]}"
                )
            break  # a partial entry: normal at the end of a Fetch response
        magic = view[pos + _MAGIC_OFFSET]
        if magic == 2:
            if size < _V2_MIN_SIZE:
                raise DecodeError(f"records at byte {pos}: batch length {size} is too small")
            yield new_batch(batch_type, unpack_v2(view, pos) + (view[pos:stop],))
        elif magic < 2:
            yield _legacy_entry(view, pos, stop, magic)
        else:
            raise DecodeError(f"records at byte {pos}: unknown magic {magic}")
        pos = stop
    owner.trailing_bytes = end - pos


def _legacy_entry(view: memoryview, pos: int, stop: int, magic: int) -> RecordBatch:
    if magic == 0:
        offset, size, crc, _, attributes = _V0_HEADER.unpack_from(view, pos)
        timestamp = -1
    else:
        if stop - pos < _LOG_OVERHEAD + _V1_MIN_SIZE:
            raise DecodeError(f"records at byte {pos}: message size too small for magic 1")
        offset, size, crc, _, attributes, timestamp = _V1_HEADER.unpack_from(view, pos)
    count = None if attributes & _CODEC_MASK else 1
    fields = (offset, size, -1, magic, crc, attributes, 0, timestamp, timestamp, -1, -1, -1, count)
    return _new_batch(RecordBatch, fields + (view[pos:stop],))


# --- decompression ----------------------------------------------------------


class DecompressionLimit(DecodeError):
    """A compressed payload would inflate past ``max_decompressed_bytes``: decompression
    stopped there (nothing beyond the limit was produced), so callers can count bombs
    apart from corrupt data."""


def _too_big(limit: int) -> DecodeError:
    return DecompressionLimit(f"payload inflates past {limit} bytes (decompression bomb guard)")


def _gunzip(data: memoryview, limit: int, magic: int) -> bytes:
    out: list[bytes] = []
    total = 0
    rest: bytes | memoryview = data
    while True:  # concatenated gzip members decode as one stream
        inflater = zlib.decompressobj(wbits=31)
        chunk = inflater.decompress(rest, limit - total + 1)
        total += len(chunk)
        if total > limit:
            raise _too_big(limit)
        out.append(chunk)
        if not inflater.eof:
            raise DecodeError("gzip payload is truncated")
        rest = inflater.unused_data
        if not rest:
            return b"".join(out)


_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE = 16  # magic, int32 version, int32 minimum compatible version


def _snappy_length(chunk: memoryview) -> int:
    """Uncompressed length from a raw snappy preamble (uvarint, at most 5 bytes)."""
    length = 0
    for i in range(min(5, len(chunk))):
        byte = chunk[i]
        length |= (byte & 0x7F) << (7 * i)
        if byte < 0x80:
            return length
    raise DecodeError("snappy chunk has no valid length preamble")


def _xerial_chunks(data: memoryview) -> Iterator[memoryview]:
    pos = _XERIAL_HEADER_SIZE
    end = len(data)
    while pos < end:
        if end - pos < 4:
            raise DecodeError("xerial snappy chunk length is truncated")
        (size,) = _INT32.unpack_from(data, pos)
        pos += 4
        if size < 0 or pos + size > end:
            raise DecodeError(f"xerial snappy chunk of {size} bytes does not fit")
        yield data[pos : pos + size]
        pos += size


def _unsnappy(data: memoryview, limit: int, magic: int) -> bytes:
    import snappy  # on first use: see the note on the codec libraries at the imports
    if len(data) >= _XERIAL_HEADER_SIZE and data[:8] == _XERIAL_MAGIC:
        chunks: Iterable[memoryview] = _xerial_chunks(data)
    else:
        chunks = (data,)
    out: list[bytes] = []
    total = 0
    for chunk in chunks:
        total += _snappy_length(chunk)
        if total > limit:
            raise _too_big(limit)
        out.append(snappy.decompress(chunk))
    return b"".join(out)


_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_XXH_PRIMES = (0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x165667B1)
_U32 = 0xFFFFFFFF


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _U32


def _xxh32(data: bytes, seed: int = 0) -> int:
    """XXH32, only used on LZ4 frame headers (a few bytes), so plain Python."""
    p1, p2, p3, p4, p5 = _XXH_PRIMES
    n = len(data)
    pos = 0
    if n >= 16:
        lanes = [(seed + p1 + p2) & _U32, (seed + p2) & _U32, seed, (seed - p1) & _U32]
        while pos + 16 <= n:
            for i, word in enumerate(struct.unpack_from("<4I", data, pos)):
                lanes[i] = _rotl32((lanes[i] + word * p2) & _U32, 13) * p1 & _U32
            pos += 16
        h = _rotl32(lanes[0], 1) + _rotl32(lanes[1], 7) + _rotl32(lanes[2], 12)
        h = (h + _rotl32(lanes[3], 18)) & _U32
    else:
        h = (seed + p5) & _U32
    h = (h + n) & _U32
    while pos + 4 <= n:
        (word,) = struct.unpack_from("<I", data, pos)
        h = _rotl32((h + word * p3) & _U32, 17) * p4 & _U32
        pos += 4
    while pos < n:
        h = _rotl32((h + data[pos] * p5) & _U32, 11) * p1 & _U32
        pos += 1
    h = ((h ^ (h >> 15)) * p2) & _U32
    h = ((h ^ (h >> 13)) * p3) & _U32
    return h ^ (h >> 16)


def _lz4_header_checksum_pos(frame: bytes | memoryview) -> int | None:
    """Where the HC byte sits: after FLG, BD and the optional size and dict id."""
    if len(frame) < 7 or frame[:4] != _LZ4_MAGIC:
        return None
    flags = frame[4]
    return 6 + (8 if flags & 0x08 else 0) + (4 if flags & 0x01 else 0)


def _lz4_legacy_checksum(frame: bytes | memoryview, hc_pos: int) -> int:
    """The HC byte Kafka < 0.10 wrote: hashed from the magic number on, not from FLG."""
    return (_xxh32(bytes(frame[:hc_pos])) >> 8) & 0xFF


def _lz4_repair_legacy_header(frame: memoryview) -> bytes | None:
    """The frame with its HC byte recomputed, if it carries Kafka's old wrong one."""
    hc_pos = _lz4_header_checksum_pos(frame)
    if hc_pos is None or len(frame) <= hc_pos:
        return None
    if frame[hc_pos] != _lz4_legacy_checksum(frame, hc_pos):
        return None
    fixed = bytearray(frame)
    fixed[hc_pos] = (_xxh32(bytes(frame[4:hc_pos])) >> 8) & 0xFF
    return bytes(fixed)


def _lz4_frames(data: bytes | memoryview, limit: int) -> bytes:
    import lz4.frame  # on first use: see the note on the codec libraries at the imports
    out: list[bytes] = []
    total = 0
    rest = data
    while True:  # concatenated frames decode as one stream
        decompressor = lz4.frame.LZ4FrameDecompressor()
        chunk = decompressor.decompress(rest, max_length=limit - total + 1)
        total += len(chunk)
        if total > limit:
            raise _too_big(limit)
        out.append(chunk)
        if not decompressor.eof:
            raise DecodeError("lz4 payload is truncated")
        rest = decompressor.unused_data
        if not rest:
            return b"".join(out)


def _unlz4(data: memoryview, limit: int, magic: int) -> bytes:
    try:
        return _lz4_frames(data, limit)
    except RuntimeError:
        repaired = _lz4_repair_legacy_header(data) if magic < 2 else None
        if repaired is None:
            raise
    return _lz4_frames(repaired, limit)


# A zstd block inflates to at most 128 KiB and an RLE block takes 4 input bytes,
# so one input byte yields at most 32 KiB. Feeding the decompressor no more
# input than the remaining budget / this bound keeps overshoot under a block.
_ZSTD_MAX_INFLATION = 128 * 1024 // 4
_ZSTD_MIN_STEP = 64


def _unzstd(data: memoryview, limit: int, magic: int) -> bytes:
    import zstandard  # on first use: see the note on the codec libraries at the imports
    decompressor = zstandard.ZstdDecompressor()
    out: list[bytes] = []
    total = 0
    pos = 0
    end = len(data)
    while pos < end or not out:  # concatenated frames decode as one stream
        stream = decompressor.decompressobj()
        while not stream.eof:
            if pos >= end:
                raise DecodeError("zstd payload is truncated")
            step = max(_ZSTD_MIN_STEP, (limit - total) // _ZSTD_MAX_INFLATION)
            chunk = stream.decompress(data[pos : pos + step])
            pos = min(pos + step, end)
            total += len(chunk)
            if total > limit:
                raise _too_big(limit)
            out.append(chunk)
        pos -= len(stream.unused_data)
    return b"".join(out)


# codec id -> decompress(payload, limit, magic). Errors the libraries raise for
# bad input are listed once, in _codec_errors, and become DecodeError at one place.
_DECOMPRESSORS: dict[int, Callable[[memoryview, int, int], bytes]] = {
    1: _gunzip,
    2: _unsnappy,
    3: _unlz4,
    4: _unzstd,
}


def _codec_errors() -> tuple[type[Exception], ...]:
    """What the libraries raise for bad input. A function, evaluated by ``except`` only
    when something was raised, so that naming the classes imports no library early."""
    import snappy  # on first error: see the note on the codec libraries at the imports
    import zstandard

    return (zlib.error, snappy.UncompressError, RuntimeError, zstandard.ZstdError)


def _decompress(codec: int, payload: memoryview, limit: int, magic: int, where: str) -> bytes:
    decompress = _DECOMPRESSORS.get(codec)
    if decompress is None or (codec == _ZSTD and magic < 2):
        raise DecodeError(f"{where}: compression codec {codec} is not valid for magic {magic}")
    try:
        return decompress(payload, limit, magic)
    except DecodeError as exc:                    # DecompressionLimit stays one
        raise type(exc)(f"{where}: {exc}") from None
    except _codec_errors() as exc:
        raise DecodeError(f"{where}: corrupt {CODEC_NAMES[codec]} payload ({exc})") from exc


def decompress(codec: int, payload, limit: int) -> bytes:
    """A payload compressed with one of Kafka's codecs (``CODEC_NAMES`` ids, as magic 2
    batches use them; KIP-714 telemetry pushes name theirs the same way), inflated to at
    most ``limit`` bytes. Raises DecodeError (DecompressionLimit past the limit)."""
    if codec == 0:
        if len(payload) > limit:
            raise DecompressionLimit(f"payload of {len(payload)} bytes is over {limit}")
        return bytes(payload)
    return _decompress(codec, memoryview(payload), limit, 2, "payload")


# --- magic 2 records --------------------------------------------------------


def _read_varint(buf: bytes | memoryview, pos: int, max_bytes: int) -> tuple[int, int]:
    """Zigzag varint at ``pos``; returns (value, next position)."""
    byte = buf[pos]
    if byte < 0x80:
        return (byte >> 1) ^ -(byte & 1), pos + 1
    value = byte & 0x7F
    shift = 7
    for i in range(pos + 1, pos + max_bytes):
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (value >> 1) ^ -(value & 1), i + 1
        shift += 7
    raise DecodeError(f"varint at byte {pos} is longer than {max_bytes} bytes")


def _read_nullable_bytes(buf: bytes | memoryview, pos: int, stop: int) -> tuple[bytes | None, int]:
    size, pos = _read_varint(buf, pos, 5)
    if size < 0:
        if size != -1:
            raise DecodeError(f"negative length {size} at byte {pos}")
        return None, pos
    if pos + size > stop:
        raise DecodeError(f"field of {size} bytes at byte {pos} overruns its record")
    return bytes(buf[pos : pos + size]), pos + size


def _read_headers(buf: bytes | memoryview, pos: int, stop: int) -> tuple[Headers, int]:
    count, pos = _read_varint(buf, pos, 5)
    if count == 0:
        return (), pos
    if count < 0 or count > (stop - pos) // 2:  # each header takes >= 2 bytes
        raise DecodeError(f"header count {count} at byte {pos} is impossible")
    headers = []
    for _ in range(count):
        name, pos = _read_nullable_bytes(buf, pos, stop)
        if name is None:
            raise DecodeError(f"null header key at byte {pos}")
        value, pos = _read_nullable_bytes(buf, pos, stop)
        try:
            headers.append((name.decode(), value))
        except UnicodeDecodeError as exc:
            raise DecodeError(f"header key before byte {pos} is not UTF-8") from exc
    return tuple(headers), pos


def _sequence(base_sequence: int, delta: int) -> int:
    """Producer sequences wrap from int32 max back to 0."""
    if base_sequence < 0:
        return -1
    return (base_sequence + delta) % (_INT32_MAX + 1)


def _parse_v2(buf: bytes | memoryview, batch: RecordBatch) -> list[Record]:
    base_offset = batch.base_offset
    base_timestamp = batch.base_timestamp
    timestamp_type = batch.timestamp_type
    append_time = batch.max_timestamp if timestamp_type == TimestampType.LOG_APPEND_TIME else None
    base_sequence = batch.base_sequence
    expected = batch.record_count
    records: list[Record] = []
    pos = 0
    end = len(buf)
    while pos < end:
        if len(records) >= expected:
            raise DecodeError(f"{end - pos} bytes after the last of {expected} records")
        size, pos = _read_varint(buf, pos, 5)
        stop = pos + size
        if size < 0 or stop > end:
            raise DecodeError(f"record length {size} at byte {pos} overruns the batch")
        attributes = buf[pos]
        delta_ts, pos = _read_varint(buf, pos + 1, 10)
        delta_offset, pos = _read_varint(buf, pos, 5)
        key, pos = _read_nullable_bytes(buf, pos, stop)
        value, pos = _read_nullable_bytes(buf, pos, stop)
        headers, pos = _read_headers(buf, pos, stop)
        if pos != stop:
            raise DecodeError(f"record ending at byte {pos} declared {size} bytes")
        records.append(
            Record(
                base_offset + delta_offset,
                base_timestamp + delta_ts if append_time is None else append_time,
                key,
                value,
                headers,
                timestamp_type,
                attributes,
                _sequence(base_sequence, delta_offset),
            )
        )
    if len(records) != expected:
        raise DecodeError(f"batch declares {expected} records, holds {len(records)}")
    return records


def _v2_records(batch: RecordBatch, limit: int) -> list[Record]:
    where = f"batch at offset {batch.base_offset}"
    payload: bytes | memoryview = batch.raw[_V2_HEADER.size :]
    codec = batch.attributes & _CODEC_MASK
    if codec:
        payload = _decompress(codec, payload, limit, 2, where)
    try:
        return _parse_v2(payload, batch)
    except IndexError:
        raise DecodeError(f"{where}: records are truncated") from None
    except DecodeError as exc:
        raise DecodeError(f"{where}: {exc}") from None


# --- legacy messages --------------------------------------------------------


def _legacy_key_value(entry: RecordBatch) -> tuple[memoryview | None, memoryview | None]:
    raw = entry.raw
    pos = _LEGACY_KEY_POS[entry.magic]
    fields: list[memoryview | None] = []
    for _ in range(2):
        if len(raw) - pos < 4:
            raise DecodeError(f"message at offset {entry.base_offset} is truncated")
        (size,) = _INT32.unpack_from(raw, pos)
        pos += 4
        if size == -1:
            fields.append(None)
            continue
        if size < 0 or pos + size > len(raw):
            raise DecodeError(f"message at offset {entry.base_offset}: bad length {size}")
        fields.append(raw[pos : pos + size])
        pos += size
    if pos != len(raw):
        raise DecodeError(f"message at offset {entry.base_offset}: {len(raw) - pos} stray bytes")
    return fields[0], fields[1]


def _copy(field: memoryview | None) -> bytes | None:
    return None if field is None else bytes(field)


def _inner_messages(wrapper: RecordBatch, limit: int, verify_crc: bool) -> list[RecordBatch]:
    where = f"message at offset {wrapper.base_offset}"
    _, value = _legacy_key_value(wrapper)
    if value is None:
        raise DecodeError(f"{where}: compressed message has a null value")
    inner = _decompress(wrapper.attributes & _CODEC_MASK, value, limit, wrapper.magic, where)
    try:
        entries, trailing = split_batches(inner)
    except DecodeError as exc:
        raise DecodeError(f"{where}: inner {exc}") from None
    if trailing or not entries:
        raise DecodeError(f"{where}: compressed message set is empty or truncated")
    for entry in entries:
        if entry.magic > 1 or entry.attributes & _CODEC_MASK:
            raise DecodeError(f"{where}: inner message at offset {entry.base_offset} is not plain")
        if verify_crc:
            entry.verify_crc()
    return entries


def _legacy_records(batch: RecordBatch, limit: int, verify_crc: bool) -> list[Record]:
    timestamp_type = batch.timestamp_type
    if not batch.attributes & _CODEC_MASK:
        key, value = _legacy_key_value(batch)
        return [
            Record(batch.base_offset, batch.base_timestamp, _copy(key), _copy(value), (),
                   timestamp_type, batch.attributes, -1)
        ]
    entries = _inner_messages(batch, limit, verify_crc)
    # Magic 1 wrappers hold the last absolute offset and relative inner offsets.
    base = batch.base_offset - entries[-1].base_offset if batch.magic == 1 else -1
    append_time = timestamp_type == TimestampType.LOG_APPEND_TIME
    records = []
    for entry in entries:
        key, value = _legacy_key_value(entry)
        records.append(
            Record(
                entry.base_offset + base if base >= 0 else entry.base_offset,
                batch.base_timestamp if append_time else entry.base_timestamp,
                _copy(key),
                _copy(value),
                (),
                timestamp_type,
                entry.attributes,
                -1,
            )
        )
    return records
