"""Record batches from records: the encoder for tests, benchmarks and tools.

``build_batch(records, compression="none", magic=2, ...) -> bytes`` writes a magic 2
batch, or a legacy magic 0/1 message set (one wrapper message when compressed), as
Kafka's clients do (xerial snappy framing, the legacy LZ4 header checksum on request).
kproxy itself never encodes records: it forwards the bytes it was given. ``records``
is the decoder this encoder's output is read back with.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Callable, Iterable

from .records import (_CODEC_IDS, _CONTROL_BIT, _INT32, _TIMESTAMP_TYPE_BIT, _TRANSACTIONAL_BIT, _V2_CRC_OFFSET,
                      _V2_CRC_START, _V2_HEADER, _V2_MIN_SIZE, _XERIAL_MAGIC, _ZSTD, Record, TimestampType, _crc32c,
                      _lz4_header_checksum_pos, _lz4_legacy_checksum)


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _varint(value: int) -> bytes:
    return _uvarint((value << 1) ^ (value >> 63))


def _varint_bytes(data: bytes | None) -> bytes:
    return _varint(-1) if data is None else _varint(len(data)) + data


def _encode_v2_record(record: Record, offset_delta: int, base_timestamp: int) -> bytes:
    body = [
        b"\x00",
        _varint(record.timestamp - base_timestamp),
        _varint(offset_delta),
        _varint_bytes(record.key),
        _varint_bytes(record.value),
        _varint(len(record.headers)),
    ]
    for name, value in record.headers:
        body.append(_varint_bytes(name.encode()))
        body.append(_varint_bytes(value))
    encoded = b"".join(body)
    return _varint(len(encoded)) + encoded


_XERIAL_BLOCK = 32 * 1024  # the xerial library's default, as Kafka's Java client uses


def _snappy_xerial(data: bytes) -> bytes:
    import snappy  # on first use: see the note on the codec libraries at the imports

    out = [_XERIAL_MAGIC, struct.pack(">ii", 1, 1)]
    for start in range(0, len(data), _XERIAL_BLOCK):
        block = snappy.compress(data[start : start + _XERIAL_BLOCK])
        out.append(_INT32.pack(len(block)) + block)
    return b"".join(out)


def _lz4_kafka(data: bytes, legacy_checksum: bool) -> bytes:
    import lz4.frame  # on first use: see the note on the codec libraries at the imports

    # Kafka's Java writer: 64 KiB independent blocks, no content size or checksum.
    frame = lz4.frame.compress(
        data,
        block_size=lz4.frame.BLOCKSIZE_MAX64KB,
        block_linked=False,
        content_checksum=False,
        store_size=False,
    )
    if not legacy_checksum:
        return frame
    hc_pos = _lz4_header_checksum_pos(frame)
    assert hc_pos is not None
    return frame[:hc_pos] + bytes([_lz4_legacy_checksum(frame, hc_pos)]) + frame[hc_pos + 1 :]


def _compress(codec: str, data: bytes, *, snappy_xerial: bool, lz4_legacy_checksum: bool) -> bytes:
    if codec == "gzip":
        return gzip.compress(data, mtime=0)
    if codec == "snappy":
        import snappy  # on first use: see the note on the codec libraries at the imports

        return _snappy_xerial(data) if snappy_xerial else snappy.compress(data)
    if codec == "lz4":
        return _lz4_kafka(data, lz4_legacy_checksum)
    if codec == "zstd":  # like zstd-jni's streaming writer: no content size
        import zstandard  # on first use: see the note on the codec libraries at the imports

        return zstandard.ZstdCompressor(write_content_size=False).compress(data)
    raise ValueError(f"unknown compression {codec!r}")


def _build_v2(
    records: list[Record],
    codec: int,
    payload: bytes,
    *,
    base_offset: int,
    partition_leader_epoch: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    attributes: int,
) -> bytes:
    header = _V2_HEADER.pack(
        base_offset,
        _V2_MIN_SIZE + len(payload),
        partition_leader_epoch,
        2,
        0,
        attributes | codec,
        len(records) - 1,
        records[0].timestamp,
        max(r.timestamp for r in records),
        producer_id,
        producer_epoch,
        base_sequence,
        len(records),
    )
    batch = bytearray(header + payload)
    struct.pack_into(">I", batch, _V2_CRC_OFFSET, _crc32c(batch[_V2_CRC_START:]))
    return bytes(batch)


def _legacy_message(offset: int, magic: int, attributes: int, timestamp: int,
                    key: bytes | None, value: bytes | None) -> bytes:
    body = bytearray(struct.pack(">bb", magic, attributes))
    if magic == 1:
        body += struct.pack(">q", timestamp)
    for field in (key, value):
        body += _INT32.pack(-1) if field is None else _INT32.pack(len(field)) + field
    return struct.pack(">qiI", offset, 4 + len(body), zlib.crc32(body)) + bytes(body)


def _build_legacy(records: list[Record], magic: int, codec: int, base_offset: int,
                  timestamp_type: int, compress: Callable[[bytes], bytes]) -> bytes:
    if any(r.headers for r in records):
        raise ValueError("magic 0/1 messages cannot carry headers")
    type_bit = _TIMESTAMP_TYPE_BIT if magic == 1 and timestamp_type == TimestampType.LOG_APPEND_TIME else 0
    if not codec:
        return b"".join(
            _legacy_message(base_offset + i, magic, type_bit, r.timestamp, r.key, r.value)
            for i, r in enumerate(records)
        )
    # Inner offsets: relative for magic 1, absolute for magic 0.
    first_inner = 0 if magic == 1 else base_offset
    inner = b"".join(
        _legacy_message(first_inner + i, magic, 0, r.timestamp, r.key, r.value)
        for i, r in enumerate(records)
    )
    wrapper_timestamp = max(r.timestamp for r in records)
    return _legacy_message(base_offset + len(records) - 1, magic, codec | type_bit,
                           wrapper_timestamp, None, compress(inner))


def build_batch(
    records: Iterable[Record],
    compression: str = "none",
    magic: int = 2,
    *,
    base_offset: int = 0,
    partition_leader_epoch: int = -1,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    is_transactional: bool = False,
    is_control: bool = False,
    timestamp_type: int = TimestampType.CREATE_TIME,
    snappy_xerial: bool = True,
    lz4_legacy_checksum: bool | None = None,
) -> bytes:
    """Encode records as one magic 2 batch or a legacy magic 0/1 message set.

    Offsets are assigned consecutively from ``base_offset``; each record's own
    ``offset``, ``timestamp_type``, ``attributes`` and ``sequence`` are
    ignored. Snappy is written in xerial framing unless ``snappy_xerial`` is
    false. ``lz4_legacy_checksum`` (default: only for magic 0, as Kafka's Java
    client did) writes the LZ4 header checksum the way Kafka < 0.10 did.
    Raises ValueError for requests the format cannot express.
    """
    records = list(records)
    if not records:
        raise ValueError("a batch needs at least one record")
    codec = _CODEC_IDS.get(compression)
    if codec is None:
        raise ValueError(f"unknown compression {compression!r}")
    if magic not in (0, 1, 2) or (magic < 2 and codec == _ZSTD):
        raise ValueError(f"compression {compression!r} with magic {magic} is not valid")

    def compress(data: bytes) -> bytes:
        legacy = magic == 0 if lz4_legacy_checksum is None else lz4_legacy_checksum
        return _compress(compression, data, snappy_xerial=snappy_xerial, lz4_legacy_checksum=legacy)

    if magic < 2:
        return _build_legacy(records, magic, codec, base_offset, timestamp_type, compress)
    base_timestamp = records[0].timestamp
    payload = b"".join(
        _encode_v2_record(r, i, base_timestamp) for i, r in enumerate(records)
    )
    if codec:
        payload = compress(payload)
    attributes = (
        (_TIMESTAMP_TYPE_BIT if timestamp_type == TimestampType.LOG_APPEND_TIME else 0)
        | (_TRANSACTIONAL_BIT if is_transactional else 0)
        | (_CONTROL_BIT if is_control else 0)
    )
    return _build_v2(
        records,
        codec,
        payload,
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        attributes=attributes,
    )
