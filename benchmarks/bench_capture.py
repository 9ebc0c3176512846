#!/usr/bin/env python3
"""What capture costs: the event loop's share (filter + enqueue, or drop) and the writer's.

Capture splits its work in two (see ``kproxy/observers/capture``): on the
event loop, after the bytes are forwarded, it only filters and enqueues (or
drops, when the queue is full); a writer thread decodes, redacts and writes.
This measures both halves on an in-memory stream of typical traffic (Produce
and Fetch pairs carrying 1 MiB of uncompressed records each, and Heartbeats),
per format, no sockets. The disk is a real temporary directory.

    python benchmarks/bench_capture.py [--pairs 300] [--formats jsonl,parquet,pcapng] [--json]
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kproxy.observers.capture import Capture, CaptureConfig  # noqa: E402
from kproxy.protocol import Request, Response, Struct, encode_request, encode_response, new_body  # noqa: E402
from kproxy.protocol.connection import Connection  # noqa: E402
from kproxy.protocol.record_encoder import build_batch  # noqa: E402
from kproxy.protocol.records import Record  # noqa: E402

RECORD_BYTES = 1024
RECORDS_PER_BATCH = 1000          # ~1 MiB per Produce request and Fetch response, like bench_proxy
CHUNK = 64 * 1024                 # what one socket read hands the tracker
FORMATS = ("jsonl", "parquet", "pcapng")


class _Info:
    """The connection a real relay would pass (``observers.contract.ConnectionInfo``'s fields)."""
    id = 1
    client = ("127.0.0.1", 50000)
    listener = "127.0.0.1:9092"
    upstream = ("127.0.0.1", 19092)
    node_id = 1


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def traffic(pairs: int) -> list[list]:
    """Event lists as the tracker hands them to observers: Produce, Fetch, Heartbeat in turn."""
    batch = build_batch([Record(i, 1_700_000_000_000, None, b"x" * RECORD_BYTES, ())
                         for i in range(RECORDS_PER_BATCH)], "none")
    kinds = [
        (0, 9, dict(acks=-1, timeout_ms=30000, topic_data=[Struct(name="bench", partition_data=[
            Struct(index=0, records=batch)])]),
         dict(responses=[Struct(name="bench", partition_responses=[
             Struct(index=0, error_code=0, base_offset=100, log_append_time_ms=-1, log_start_offset=0,
                    record_errors=[], error_message=None)])])),
        (1, 12, dict(topics=[]),
         dict(responses=[Struct(topic="bench", partitions=[
             Struct(partition_index=0, high_watermark=1000, records=batch)])])),
        (12, 4, dict(group_id="g", generation_id=3, member_id="m"), dict()),
    ]
    conn = Connection()
    out = []
    for i in range(pairs):
        api_key, version, req, resp = kinds[i % len(kinds)]
        request = framed(encode_request(Request(api_key, version, i, "bench",
                                                new_body("request", api_key, version, **req))))
        response = framed(encode_response(Response(i, new_body("response", api_key, version, **resp)),
                                          api_key, version))
        for stream, feed in ((request, conn.receive_client), (response, conn.relay_broker)):
            for pos in range(0, len(stream), CHUNK):
                result = feed(stream[pos:pos + CHUNK])
                events = result[0] if isinstance(result, tuple) else result
                if events:
                    out.append(events)
    return out


def measure(events: list[list], formats: tuple[str, ...], queue_bytes: int) -> dict:
    """Feed every event list to a running capture; time the feed (event loop side) and
    the drain (writer side: from the first event to the last file closed)."""
    with tempfile.TemporaryDirectory() as tmp:
        capture = Capture()
        capture.start(CaptureConfig(directory=tmp, formats=formats, queue_max_bytes=queue_bytes,
                                    queue_max_items=1_000_000, writer_cpu_share=1.0))
        info = _Info()
        start = time.perf_counter()
        for batch in events:
            capture(info, batch)
        fed = time.perf_counter()
        capture.stop(timeout=600)
        done = time.perf_counter()
        counters = capture.counters()
    return {"feed_s": fed - start, "total_s": done - start, **counters}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--formats", default=",".join(FORMATS),
                        help="comma-separated; each is measured alone")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    events = traffic(args.pairs)
    n_events = sum(len(batch) for batch in events)
    results = {"pairs": args.pairs, "events": n_events, "formats": {}}
    for fmt in args.formats.split(","):
        runs = [measure(events, (fmt,), 1 << 40) for _ in range(args.repeat)]
        best = min(runs, key=lambda r: r["total_s"])
        results["formats"][fmt] = {
            "enqueue_us_per_event": best["feed_s"] / n_events * 1e6,
            "writer_us_per_pair": best["total_s"] / args.pairs * 1e6,
            "rows_written": best["rows_written"], "packets_written": best["packets_written"],
            "bytes_written": best["bytes_written"]}
    # A queue that is always full: every event is dropped and counted.
    drop = min((measure(events, ("jsonl",), 1) for _ in range(args.repeat)), key=lambda r: r["feed_s"])
    results["drop_us_per_event"] = drop["feed_s"] / n_events * 1e6
    results["dropped"] = drop["dropped"]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{args.pairs} pairs (Produce v9 and Fetch v12 with {RECORDS_PER_BATCH} x {RECORD_BYTES} B "
          f"records, Heartbeat v4), {n_events} events, best of {args.repeat}")
    print(f"{'format':10}{'enqueue us/event':>18}{'writer us/pair':>16}{'MB written':>12}")
    for fmt, r in results["formats"].items():
        print(f"{fmt:10}{r['enqueue_us_per_event']:18.2f}{r['writer_us_per_pair']:16.1f}"
              f"{r['bytes_written'] / 1e6:12.2f}")
    print(f"queue full: drop and count {results['drop_us_per_event']:.2f} us/event "
          f"({results['dropped']} dropped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
