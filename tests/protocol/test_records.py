"""Record batch decoding, checked against kafka-python as an independent oracle.

kafka-python's record builders and readers are a separate implementation of
the same format: batches it writes must decode to exactly the records it was
given, and batches we write must read back through it. Formats it cannot
write (xerial snappy by hand, Kafka < 0.10's LZ4 header checksum, control
batches, LogAppendTime) are built here from the format description.
"""

from __future__ import annotations

import gzip
import struct
import zlib

import crc32c
import lz4.frame
import pytest
import snappy
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.codec import snappy_decode, snappy_encode
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from kproxy.protocol.errors import DecodeError
from kproxy.protocol.record_encoder import build_batch
from kproxy.protocol.records import (
    MAX_DECOMPRESSED_BYTES,
    Record,
    RecordBatch,
    TimestampType,
    iter_batches,
    split_batches,
)

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
BIG = 4 * 1024 * 1024  # batch_size for kafka-python builders: never full

# Compressible values so kafka-python keeps the compressed form; one value
# larger than an LZ4 block (64 KiB) and a xerial chunk (32 KiB).
SAMPLE = [
    Record(timestamp=1_700_000_000_000, key=b"k0", value=b"v" * 50, headers=(("h", b"x"),)),
    Record(timestamp=1_700_000_000_005, key=None, value=b"abc" * 40),
    Record(timestamp=1_699_999_999_990, key=b"", value=None, headers=(("n", None), ("é", b""))),
    Record(timestamp=1_700_000_000_100, key=b"big", value=bytes(range(256)) * 400),
    Record(timestamp=1_700_000_000_100, key=b"k4", value=b""),
]


def legacy_sample(magic: int) -> list[Record]:
    records = [r._replace(headers=()) for r in SAMPLE]
    if magic == 0:
        records = [r._replace(timestamp=-1) for r in records]
    return records


def fields(records, magic=2):
    """What must round-trip: offset, timestamp, key, value, headers."""
    out = []
    for r in records:
        timestamp = r.timestamp
        if magic == 0 and timestamp is None:  # kafka-python says None, Kafka says -1
            timestamp = -1
        out.append((r.offset, timestamp, r.key, r.value, tuple(r.headers)))
    return out


def expected(records, base_offset=0):
    return [
        (base_offset + i, r.timestamp, r.key, r.value, tuple(r.headers))
        for i, r in enumerate(records)
    ]


def decode_all(blob) -> list[Record]:
    return [r for b in iter_batches(blob) for r in b.records(verify_crc=True)]


def oracle_read(blob) -> list:
    out = []
    for batch in MemoryRecords(bytes(blob)):
        assert batch.validate_crc()
        out.extend(fields(list(batch), batch.magic))
    return out


def oracle_v2(records, codec, base_offset=0, **producer) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=CODECS[codec],
        is_transactional=producer.get("is_transactional", False),
        producer_id=producer.get("producer_id", -1),
        producer_epoch=producer.get("producer_epoch", -1),
        base_sequence=producer.get("base_sequence", -1),
        batch_size=BIG,
    )
    for i, r in enumerate(records):
        builder.append(i, timestamp=r.timestamp, key=r.key, value=r.value, headers=list(r.headers))
    blob = bytearray(builder.build())
    struct.pack_into(">q", blob, 0, base_offset)  # not covered by the CRC
    return bytes(blob)


def oracle_legacy(records, magic, codec, wrapper_offset=None) -> bytes:
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=CODECS[codec], batch_size=BIG)
    for i, r in enumerate(records):
        builder.append(i, timestamp=None if magic == 0 else r.timestamp, key=r.key, value=r.value)
    blob = bytearray(builder.build())
    if wrapper_offset is not None:
        struct.pack_into(">q", blob, 0, wrapper_offset)  # not covered by the CRC
    return bytes(blob)


def xxh32(data: bytes) -> int:
    """XXH32 from an independent source: the LZ4 content checksum is XXH32."""
    frame = lz4.frame.compress(data, content_checksum=True, store_size=False)
    return int.from_bytes(frame[-4:], "little")


MATRIX = [
    (magic, codec)
    for magic in (0, 1, 2)
    for codec in CODECS
    if not (magic < 2 and codec == "zstd")
]


# kafka-python needs the xxhash package for magic 0 lz4 (Kafka < 0.10's header
# checksum); test_lz4_legacy_checksum covers that pair from the format instead.
ORACLE_MATRIX = [pair for pair in MATRIX if pair != (0, "lz4")]


# --- against kafka-python ----------------------------------------------------


@pytest.mark.parametrize("magic,codec", ORACLE_MATRIX)
def test_decodes_what_kafka_python_writes(magic, codec):
    if magic == 2:
        records = SAMPLE
        blob = oracle_v2(records, codec, base_offset=1000)
    else:
        records = legacy_sample(magic)
        blob = oracle_legacy(records, magic, codec, wrapper_offset=1000 + len(records) - 1
                             if codec != "none" else None)
        if codec == "none":  # uncompressed legacy: each message carries its own offset
            blob = b"".join(
                oracle_legacy([r], magic, codec, wrapper_offset=1000 + i) for i, r in enumerate(records)
            )
    batches, trailing = split_batches(blob)
    assert trailing == 0
    assert {b.compression for b in batches} == {codec}
    got = [r for b in batches for r in b.records(verify_crc=True)]
    # Magic 0 inner offsets are absolute as written (0..n-1 here), whatever the wrapper says.
    base = 0 if magic == 0 and codec != "none" else 1000
    assert fields(got) == expected(records, base)
    assert fields(got) == oracle_read(blob)


@pytest.mark.parametrize("magic,codec", ORACLE_MATRIX)
def test_kafka_python_reads_what_we_write(magic, codec):
    records = SAMPLE if magic == 2 else legacy_sample(magic)
    blob = build_batch(records, codec, magic, base_offset=77)
    assert oracle_read(blob) == expected(records, 77)
    assert fields(decode_all(blob)) == expected(records, 77)


@given(
    records=st.lists(
        st.builds(
            Record,
            timestamp=st.integers(0, 2**40),
            key=st.none() | st.binary(max_size=40),
            value=st.none() | st.binary(max_size=300),
            headers=st.lists(
                st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3
            ).map(tuple),
        ),
        min_size=1,
        max_size=12,
    ),
    codec=st.sampled_from(list(CODECS)),
    base_offset=st.integers(0, 2**40),
)
@settings(max_examples=150, deadline=None)
def test_v2_round_trips_random_records_both_ways(records, codec, base_offset):
    ours = build_batch(records, codec, base_offset=base_offset)
    theirs = oracle_v2(records, codec, base_offset=base_offset)
    want = expected(records, base_offset)
    assert fields(decode_all(ours)) == want
    assert fields(decode_all(theirs)) == want
    assert oracle_read(ours) == want


def test_header_fields_match_kafka_python():
    blob = oracle_v2(SAMPLE, "lz4", base_offset=5, producer_id=42, producer_epoch=3,
                     base_sequence=17, is_transactional=True)
    (batch,) = iter_batches(blob)
    (theirs,) = MemoryRecords(blob)
    assert (batch.base_offset, batch.magic, batch.crc, batch.attributes, batch.last_offset_delta,
            batch.base_timestamp, batch.max_timestamp, batch.producer_id, batch.producer_epoch,
            batch.base_sequence, batch.record_count, batch.size_bytes) == (
        theirs.base_offset, theirs.magic, theirs.crc, theirs.attributes, theirs.last_offset_delta,
        theirs.first_timestamp, theirs.max_timestamp, theirs.producer_id, theirs.producer_epoch,
        theirs.base_sequence, theirs.records_count, theirs.size_in_bytes)
    assert batch.compression == "lz4"
    assert batch.is_transactional and not batch.is_control
    assert batch.timestamp_type == TimestampType.CREATE_TIME
    assert batch.last_offset == 5 + len(SAMPLE) - 1 == batch.next_offset - 1
    assert batch.batch_length == len(blob) - 12
    assert [r.sequence for r in batch.records()] == [17 + i for i in range(len(SAMPLE))]


def test_sequence_numbers_wrap_at_int32_max():
    blob = build_batch(SAMPLE[:3], producer_id=1, producer_epoch=0, base_sequence=2**31 - 2)
    assert [r.sequence for r in decode_all(blob)] == [2**31 - 2, 2**31 - 1, 0]


def test_log_append_time_gives_every_record_the_max_timestamp():
    blob = build_batch(SAMPLE, "gzip", timestamp_type=TimestampType.LOG_APPEND_TIME)
    (batch,) = iter_batches(blob)
    assert batch.timestamp_type == TimestampType.LOG_APPEND_TIME
    want = max(r.timestamp for r in SAMPLE)
    assert {r.timestamp for r in batch.records()} == {want}
    assert {r.timestamp_type for r in batch.records()} == {TimestampType.LOG_APPEND_TIME}
    assert {r[1] for r in oracle_read(blob)} == {want}


def test_control_batch_decodes_like_kafka_python():
    # A COMMIT marker: key = version 0, type 1; value = version 0, coordinator epoch 7.
    marker = Record(timestamp=123, key=struct.pack(">hh", 0, 1), value=struct.pack(">hi", 0, 7))
    blob = build_batch([marker], producer_id=9, producer_epoch=1, is_transactional=True,
                       is_control=True, base_offset=40)
    (batch,) = iter_batches(blob)
    assert batch.is_control and batch.is_transactional
    (record,) = batch.records(verify_crc=True)
    assert (record.offset, record.key, record.value) == (40, marker.key, marker.value)
    (theirs,) = list(next(iter(MemoryRecords(blob))))
    assert theirs.commit and (theirs.key, theirs.value) == (marker.key, marker.value)


# --- legacy message sets -------------------------------------------------------


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4"])
def test_magic1_wrapper_offsets_are_relative_to_the_last_inner_offset(codec):
    records = legacy_sample(1)
    blob = oracle_legacy(records, 1, codec, wrapper_offset=500)
    (wrapper,) = iter_batches(blob)
    assert wrapper.base_offset == wrapper.last_offset == 500
    assert wrapper.record_count is None
    assert [r.offset for r in wrapper.records()] == list(range(500 - len(records) + 1, 501))
    assert fields(wrapper.records()) == oracle_read(blob)


def test_magic1_wrapper_with_offset_zero_keeps_inner_offsets():
    # Producers write 0 in the wrapper; Kafka then leaves the inner offsets alone.
    blob = oracle_legacy(legacy_sample(1), 1, "gzip")
    assert [r.offset for r in decode_all(blob)] == list(range(len(SAMPLE)))
    assert fields(decode_all(blob)) == oracle_read(blob)


def test_magic0_wrapper_inner_offsets_are_absolute():
    blob = build_batch(legacy_sample(0), "gzip", 0, base_offset=300)
    (wrapper,) = iter_batches(blob)
    assert wrapper.base_offset == 300 + len(SAMPLE) - 1
    assert [r.offset for r in wrapper.records()] == list(range(300, 300 + len(SAMPLE)))
    assert {r.timestamp_type for r in wrapper.records()} == {TimestampType.NO_TIMESTAMP_TYPE}


def test_magic1_log_append_time_wrapper_timestamp_wins():
    records = legacy_sample(1)
    blob = build_batch(records, "snappy", 1, timestamp_type=TimestampType.LOG_APPEND_TIME)
    (wrapper,) = iter_batches(blob)
    assert wrapper.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert {r.timestamp for r in wrapper.records()} == {wrapper.base_timestamp}
    assert [r[1] for r in oracle_read(blob)] == [r.timestamp for r in wrapper.records()]


def test_mixed_magics_in_one_blob_walk_in_order():
    parts = [
        build_batch(legacy_sample(0)[:2], "none", 0, base_offset=0),
        build_batch(legacy_sample(1)[:2], "gzip", 1, base_offset=2),
        build_batch(SAMPLE, "zstd", 2, base_offset=4),
        build_batch(legacy_sample(1)[:1], "none", 1, base_offset=4 + len(SAMPLE)),
    ]
    blob = b"".join(parts)
    batches, trailing = split_batches(blob)
    assert trailing == 0
    assert [b.magic for b in batches] == [0, 0, 1, 2, 1]
    assert [b.record_count for b in batches] == [1, 1, None, len(SAMPLE), 1]
    assert [r.offset for r in decode_all(blob)] == list(range(5 + len(SAMPLE)))
    assert sum(b.size_bytes for b in batches) == len(blob)


def test_nested_compression_is_rejected():
    inner = build_batch(legacy_sample(1)[:2], "gzip", 1)
    wrapper = _legacy_wrapper(inner, magic=1, codec=1)
    with pytest.raises(DecodeError, match="not plain"):
        decode_all(wrapper)


def _legacy_wrapper(inner: bytes, magic: int, codec: int, compress=gzip.compress) -> bytes:
    """A wrapper message around ``inner`` built from the format description."""
    value = compress(inner)
    body = struct.pack(">bb", magic, codec) + (struct.pack(">q", 0) if magic else b"")
    body += struct.pack(">i", -1) + struct.pack(">i", len(value)) + value
    return struct.pack(">qiI", 0, 4 + len(body), zlib.crc32(body)) + body


# --- snappy and lz4 framing ------------------------------------------------------


def _xerial(data: bytes, chunk: int) -> bytes:
    """xerial framing from its description: magic, version, compat, chunks."""
    out = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    for start in range(0, len(data), chunk):
        block = snappy.compress(data[start : start + chunk])
        out += struct.pack(">i", len(block)) + block
    return out


def _v2_with_payload(records, codec: int, payload: bytes, attributes: int = 0) -> bytes:
    """Swap a magic 2 batch's payload for ``payload`` and fix length and CRC."""
    plain = bytearray(build_batch(records))
    blob = plain[:61] + payload
    struct.pack_into(">i", blob, 8, len(blob) - 12)
    struct.pack_into(">H", blob, 21, codec | attributes)
    struct.pack_into(">I", blob, 17, crc32c.crc32c(blob[21:]))
    return bytes(blob)


@pytest.mark.parametrize("framing", ["xerial-small-chunks", "xerial-one-chunk", "raw", "kafka-python"])
def test_snappy_framings(framing):
    plain = build_batch(SAMPLE)[61:]
    payload = {
        "xerial-small-chunks": lambda: _xerial(plain, 1000),
        "xerial-one-chunk": lambda: _xerial(plain, len(plain)),
        "raw": lambda: snappy.compress(plain),
        "kafka-python": lambda: snappy_encode(plain),
    }[framing]()
    blob = _v2_with_payload(SAMPLE, 2, payload)
    assert fields(decode_all(blob)) == expected(SAMPLE)
    assert oracle_read(blob) == expected(SAMPLE)


def test_our_snappy_is_xerial_unless_asked_for_raw():
    xerial = build_batch(SAMPLE, "snappy")[61:]
    raw = build_batch(SAMPLE, "snappy", snappy_xerial=False)[61:]
    assert xerial.startswith(b"\x82SNAPPY\x00")
    assert snappy_decode(xerial) == snappy.decompress(raw) == build_batch(SAMPLE)[61:]


def _broken_hc_frame(data: bytes) -> bytes:
    """An LZ4 frame as Kafka < 0.10 wrote it: HC hashed from the magic number on."""
    frame = lz4.frame.compress(data, block_linked=False, store_size=False, content_checksum=False)
    assert frame[6] == (xxh32(frame[4:6]) >> 8) & 0xFF  # the correct HC, as a sanity check
    return frame[:6] + bytes([(xxh32(frame[:6]) >> 8) & 0xFF]) + frame[7:]


@pytest.mark.parametrize("magic", [0, 1])
def test_lz4_legacy_checksum(magic):
    records = legacy_sample(magic)
    inner = build_batch(records, "none", magic, base_offset=0)
    frame = _broken_hc_frame(inner)
    with pytest.raises(RuntimeError):
        lz4.frame.decompress(frame)  # the library alone refuses it
    blob = _legacy_wrapper(inner, magic, 3, compress=lambda _: frame)
    assert [r.value for r in decode_all(blob)] == [r.value for r in records]
    # Our writer reproduces the quirk for magic 0, as Kafka's Java client did.
    ours = build_batch(records, "lz4", magic)
    value = ours[18 + 8 * magic + 8 :]  # after the header, the null key and the value length
    if magic == 0:
        assert value[:7] == frame[:7]
    else:
        assert lz4.frame.decompress(value) == inner
    assert [r.value for r in decode_all(ours)] == [r.value for r in records]


def test_lz4_legacy_checksum_is_not_accepted_in_magic2():
    frame = _broken_hc_frame(build_batch(SAMPLE)[61:])
    with pytest.raises(DecodeError, match="lz4"):
        decode_all(_v2_with_payload(SAMPLE, 3, frame))


def test_lz4_frame_with_some_other_wrong_checksum_is_rejected():
    inner = build_batch(legacy_sample(1), "none", 1)
    frame = bytearray(_broken_hc_frame(inner))
    frame[6] ^= 0x55
    with pytest.raises(DecodeError, match="lz4"):
        decode_all(_legacy_wrapper(inner, 1, 3, compress=lambda _: bytes(frame)))


@given(st.binary(max_size=80))
@settings(max_examples=200, deadline=None)
def test_xxh32_matches_lz4s_content_checksum(data):
    from kproxy.protocol.records import _xxh32

    assert _xxh32(data) == xxh32(data)


def test_zstd_with_and_without_content_size_and_concatenated_frames():
    plain = build_batch(SAMPLE)[61:]
    half = len(plain) // 2
    for payload in (
        zstandard.ZstdCompressor(write_content_size=True).compress(plain),
        zstandard.ZstdCompressor(write_content_size=False).compress(plain),
        b"".join(zstandard.ZstdCompressor().compress(p) for p in (plain[:half], plain[half:])),
    ):
        assert fields(decode_all(_v2_with_payload(SAMPLE, 4, payload))) == expected(SAMPLE)


def test_concatenated_gzip_members_and_lz4_frames():
    plain = build_batch(SAMPLE)[61:]
    half = len(plain) // 2
    gz = gzip.compress(plain[:half]) + gzip.compress(plain[half:])
    lz = lz4.frame.compress(plain[:half]) + lz4.frame.compress(plain[half:])
    for codec, payload in ((1, gz), (3, lz)):
        assert fields(decode_all(_v2_with_payload(SAMPLE, codec, payload))) == expected(SAMPLE)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_truncated_compressed_payload_is_a_decode_error(codec):
    blob = build_batch(SAMPLE, codec)
    cut = _v2_with_payload(SAMPLE, CODECS[codec], blob[61:-7])
    with pytest.raises(DecodeError):
        decode_all(cut)


# --- limits --------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_decompression_bomb_guard(codec):
    bomb = [Record(timestamp=0, value=bytes(2 * 1024 * 1024))]
    (batch,) = iter_batches(build_batch(bomb, codec))
    assert len(batch.raw) < 200 * 1024  # small on the wire
    with pytest.raises(DecodeError, match="bomb"):
        batch.records(max_decompressed_bytes=1024 * 1024)
    assert batch.records()[0].value == bomb[0].value  # the default is generous
    assert MAX_DECOMPRESSED_BYTES >= 64 * 1024 * 1024


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4"])
def test_decompression_bomb_guard_legacy(codec):
    bomb = [Record(timestamp=0, value=bytes(2 * 1024 * 1024))]
    (batch,) = iter_batches(build_batch(bomb, codec, 1))
    with pytest.raises(DecodeError, match="bomb"):
        batch.records(max_decompressed_bytes=1024 * 1024)


def test_snappy_length_preamble_is_checked_before_decompressing():
    lying = b"\xff\xff\xff\xff\x0f" + b"\x00" * 10  # claims 4 GiB
    with pytest.raises(DecodeError, match="bomb"):
        decode_all(_v2_with_payload(SAMPLE, 2, lying))


# --- the header walk -------------------------------------------------------------


def _blob(n: int = 5) -> bytes:
    return b"".join(build_batch(SAMPLE, "lz4", base_offset=i * 10) for i in range(n))


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_walk_is_zero_copy(kind):
    data = kind(_blob())
    owner = data.obj if isinstance(data, memoryview) else data
    for batch in iter_batches(data):
        assert isinstance(batch.raw, memoryview)
        assert batch.raw.obj is owner  # a view into the caller's buffer, not a copy
        assert len(batch.raw) == batch.size_bytes


def test_walk_never_touches_the_payload():
    # A batch whose compressed payload is garbage (and CRC therefore wrong):
    # every header field still reads; only records() and verify_crc complain.
    blob = bytearray(build_batch(SAMPLE, "zstd", base_offset=9))
    blob[61:] = b"\xee" * (len(blob) - 61)
    (batch,) = iter_batches(bytes(blob))
    assert (batch.base_offset, batch.record_count, batch.compression) == (9, len(SAMPLE), "zstd")
    with pytest.raises(DecodeError, match="CRC"):
        batch.verify_crc()
    with pytest.raises(DecodeError, match="zstd"):
        batch.records()


def test_records_are_frozen_value_objects():
    (batch,) = iter_batches(build_batch(SAMPLE))
    record = batch.records()[0]
    for obj in (batch, record):
        assert type(obj).__slots__ == ()
        with pytest.raises(AttributeError):
            obj.offset = 1  # type: ignore[misc]
    assert isinstance(batch, RecordBatch)


def test_truncated_trailing_batch_ends_the_walk_quietly():
    blob = _blob(3)
    last = build_batch(SAMPLE, "lz4", base_offset=20)
    first_two = len(blob) - len(last)
    for cut in range(first_two, len(blob)):
        walker = iter_batches(blob[:cut])
        assert len(list(walker)) == 2
        assert walker.trailing_bytes == cut - first_two
        assert split_batches(blob[:cut])[1] == cut - first_two
    assert split_batches(blob) == (list(iter_batches(blob)), 0)


def test_null_and_empty_records_walk_as_empty():
    assert split_batches(None) == ([], 0)
    assert split_batches(b"") == ([], 0)


def test_iterator_protocol():
    walker = iter_batches(_blob(2))
    assert next(walker).base_offset == 0
    assert next(walker).base_offset == 10
    with pytest.raises(StopIteration):
        next(walker)
    assert walker.trailing_bytes == 0


@pytest.mark.parametrize(
    "garbage",
    [
        struct.pack(">qi", 0, -5) + b"\x00" * 20,  # negative size
        struct.pack(">qi", 0, 3) + b"\x00" * 20,  # smaller than any entry
        struct.pack(">qiib", 0, 80, 0, 7) + b"\x00" * 80,  # unknown magic
        struct.pack(">qiib", 0, 20, 0, 2) + b"\x00" * 20,  # too small for a v2 header
        struct.pack(">qiib", 0, 15, 0, 1) + b"\x00" * 15,  # too small for a v1 message
    ],
)
def test_garbage_in_the_middle_is_a_decode_error(garbage):
    blob = _blob(1) + garbage + _blob(1)
    with pytest.raises(DecodeError):
        split_batches(blob)


def test_unknown_magic_in_a_partial_tail_is_garbage():
    blob = _blob(1) + struct.pack(">qiib", 0, 1000, 0, 9)
    with pytest.raises(DecodeError, match="magic"):
        split_batches(blob)


def test_crc_mismatch_is_detected():
    for blob in (build_batch(SAMPLE, "gzip"), build_batch(legacy_sample(1), "gzip", 1),
                 build_batch(legacy_sample(0)[:1], "none", 0)):
        damaged = bytearray(blob)
        damaged[-3] ^= 0x01
        (batch,) = iter_batches(bytes(damaged))
        with pytest.raises(DecodeError, match="CRC"):
            batch.verify_crc()
        with pytest.raises(DecodeError, match="CRC"):
            batch.records(verify_crc=True)
    # The base offset and leader epoch lie outside the v2 CRC: brokers rewrite them.
    moved = bytearray(build_batch(SAMPLE))
    struct.pack_into(">qii", moved, 0, 123, len(moved) - 12, 99)
    (batch,) = iter_batches(bytes(moved))
    batch.verify_crc()
    assert batch.partition_leader_epoch == 99


def test_record_count_mismatch_is_a_decode_error():
    blob = bytearray(build_batch(SAMPLE))
    struct.pack_into(">i", blob, 57, len(SAMPLE) + 1)
    with pytest.raises(DecodeError, match="declares"):
        next(iter_batches(bytes(blob))).records()
    struct.pack_into(">i", blob, 57, len(SAMPLE) - 1)
    with pytest.raises(DecodeError, match="after the last"):
        next(iter_batches(bytes(blob))).records()


def test_build_batch_rejects_what_the_format_cannot_say():
    with pytest.raises(ValueError):
        build_batch([])
    with pytest.raises(ValueError):
        build_batch(SAMPLE, "brotli")
    with pytest.raises(ValueError):
        build_batch(legacy_sample(1), "zstd", 1)
    with pytest.raises(ValueError):
        build_batch(SAMPLE, "none", 1)  # headers need magic 2


# --- fuzz: only DecodeError, ever ------------------------------------------------


def _exercise(data: bytes) -> None:
    """Walk, verify and decode; anything but DecodeError fails the test."""
    try:
        batches, _ = split_batches(data)
    except DecodeError:
        return
    for batch in batches:
        for step in (batch.verify_crc, lambda: batch.records(1 << 22),
                     lambda: batch.records(1 << 22, verify_crc=True)):
            try:
                step()
            except DecodeError:
                pass
        _ = (batch.compression, batch.timestamp_type, batch.is_control, batch.size_bytes)


VALID = [
    build_batch(SAMPLE[:3], codec, 2, base_offset=3)
    for codec in CODECS
] + [
    build_batch(legacy_sample(magic)[:3], codec, magic)
    for magic in (0, 1)
    for codec in ("none", "gzip", "snappy", "lz4")
] + [
    build_batch(SAMPLE[:2], "snappy", snappy_xerial=False),
]


@given(st.binary(max_size=400))
@settings(max_examples=400, deadline=None)
def test_fuzz_random_bytes(data):
    _exercise(data)


@given(st.binary(min_size=17, max_size=200))
@settings(max_examples=200, deadline=None)
def test_fuzz_random_bytes_behind_a_valid_magic(data):
    for magic in (0, 1, 2):
        blob = bytearray(data)
        blob[16] = magic
        struct.pack_into(">i", blob, 8, len(blob) - 12)
        _exercise(bytes(blob))


@st.composite
def mutated(draw):
    blob = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete"]))
        pos = draw(st.integers(0, max(0, len(blob) - 1)))
        if kind == "flip" and blob:
            blob[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and blob:
            blob[pos] = draw(st.integers(0, 255))
        elif kind == "truncate":
            del blob[pos:]
        elif kind == "insert":
            blob[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del blob[pos : pos + draw(st.integers(1, 8))]
    return bytes(blob)


@given(mutated())
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_fuzz_mutated_valid_batches(data):
    _exercise(data)


@given(mutated())
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_fuzz_mutated_batches_with_fixed_length_and_crc(data):
    """Mutations that keep the framing and CRC valid reach the deep decoders."""
    if len(data) < 61 or data[16] != 2:
        return
    blob = bytearray(data)
    struct.pack_into(">i", blob, 8, len(blob) - 12)
    struct.pack_into(">I", blob, 17, crc32c.crc32c(blob[21:]))
    _exercise(bytes(blob))
