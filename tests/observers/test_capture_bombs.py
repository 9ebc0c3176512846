"""A decompression bomb in a Produce request costs capture a bounded amount of memory (issue 10, item 3).

The bomb of the issue: a Produce v3 request of ~200 KiB whose magic-1 gzip wrapper
inflates to 200 MiB. Capture inflates legacy wrappers to count their records (and to
write record data): it must stop at its bound, count the refusal, and keep going.
Memory is measured with tracemalloc across the whole capture (tracker, queue, writer
thread), since zlib's output buffers are Python allocations.
"""

from __future__ import annotations

import struct
import time
import tracemalloc
import zlib

import pytest
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from kproxy.observers.capture import Capture, CaptureConfig
from kproxy.observers.capture.redact import MAX_INFLATED_BYTES
from kproxy.observers.metrics import Metrics
from prometheus_client import generate_latest
from tests.observers.captures import Link, produce_request, produce_response, read_jsonl

BOMB_INFLATED_BYTES = 200 * 1024 * 1024
_CHUNK = 1024 * 1024


def gzip_bomb_wrapper(inflated: int) -> bytes:
    """A magic-1 message set holding one gzip wrapper whose inner message carries
    ``inflated`` zero bytes; built in chunks, so the test itself never holds them."""
    zeros = bytes(_CHUNK)
    # inner message: offset, size, crc, magic 1, attributes 0, timestamp, key null, value
    inner_tail = struct.pack(">bbqi", 1, 0, 0, -1)
    value_len = struct.pack(">i", inflated)
    crc = zlib.crc32(inner_tail)
    crc = zlib.crc32(value_len, crc)
    for _ in range(inflated // _CHUNK):
        crc = zlib.crc32(zeros, crc)
    inner_size = 4 + len(inner_tail) + 4 + inflated
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)            # gzip framing
    parts = [deflate.compress(struct.pack(">qiI", 0, inner_size, crc) + inner_tail + value_len)]
    for _ in range(inflated // _CHUNK):
        parts.append(deflate.compress(zeros))
    parts.append(deflate.flush())
    compressed = b"".join(parts)
    # wrapper: magic 1, attributes 1 (gzip), timestamp, key null, value = the gzip stream
    body = struct.pack(">bbqi", 1, 1, 0, -1) + struct.pack(">i", len(compressed)) + compressed
    message = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", 0, len(message)) + message


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return gzip_bomb_wrapper(BOMB_INFLATED_BYTES)


def test_the_bomb_is_what_the_issue_describes(bomb):
    """~200 KiB on the wire, 200 MiB inflated (counted in pieces, never held)."""
    assert len(bomb) < 250 * 1024
    inflater, rest, inflated = zlib.decompressobj(wbits=31), bomb[34:], 0    # 34: the wrapper's header
    while rest:
        inflated += len(inflater.decompress(rest, _CHUNK))
        rest = inflater.unconsumed_tail
    assert inflater.eof and inflated > BOMB_INFLATED_BYTES
    from kproxy.protocol.records import DecompressionLimit, iter_batches
    (batch,) = iter_batches(bomb)
    assert batch.compression == "gzip" and batch.record_count is None
    with pytest.raises(DecompressionLimit):
        batch.records(max_decompressed_bytes=MAX_INFLATED_BYTES)


@pytest.mark.parametrize("formats", [("jsonl",), ("jsonl", "parquet", "pcapng")])
def test_a_gzip_bomb_costs_capture_bounded_memory_and_is_counted(bomb, tmp_path, formats):
    capture = Capture()
    capture.start(CaptureConfig(directory=str(tmp_path), formats=formats, include_bodies=True))
    before = capture.counters()["decompression_refused"]
    link = Link(capture)
    tracemalloc.start()
    try:
        link.exchange(0, 3, 1, produce_request(recs=bomb), produce_response())
        link.exchange(0, 3, 2, produce_request(), produce_response())     # capture goes on
        link.close(capture)
        capture.stop()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The bound plus the records parsed from it (at most about as much again) and the
    # bomb's own 200 KiB frames; the 200 MiB it claims are never produced.
    assert peak < 3 * MAX_INFLATED_BYTES, f"capture peaked at {peak / 2**20:.0f} MiB"
    assert capture.counters()["decompression_refused"] > before
    rows = read_jsonl(tmp_path)
    assert [r["correlation_id"] for r in rows] == [1, 2] and capture.row_errors == 0
    bomb_row = rows[0]
    assert bomb_row["compression"] == ["gzip"] and bomb_row["record_count"] == 0
    records = bomb_row["request"]["topic_data"][0]["partition_data"][0]["records"]
    assert records["batches"] == 1 and records["records"] == 0
    exposition = generate_latest(Metrics(capture=capture).registry).decode()
    (line,) = [x for x in exposition.splitlines()
               if x.startswith("kproxy_capture_decompression_refused_total ")]
    assert float(line.split()[1]) >= 1


def test_honest_legacy_wrappers_are_still_counted(tmp_path):
    builder = LegacyRecordBatchBuilder(magic=1, compression_type=1, batch_size=1 << 20)
    for i in range(10):
        builder.append(i, timestamp=1_700_000_000_000, key=None, value=b"v%d" % i)
    wrapper = bytes(builder.build())
    capture = Capture()
    capture.start(CaptureConfig(directory=str(tmp_path), formats=("jsonl",)))
    before = capture.counters()["decompression_refused"]
    link = Link(capture)
    link.exchange(0, 3, 1, produce_request(recs=wrapper), produce_response())
    link.close(capture)
    capture.stop()
    (row,) = read_jsonl(tmp_path)
    assert row["record_count"] == 10 and row["compression"] == ["gzip"]
    assert capture.counters()["decompression_refused"] == before
