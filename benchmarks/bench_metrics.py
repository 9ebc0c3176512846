#!/usr/bin/env python3
"""What the metrics observer costs per request/response pair, beside the tracker alone.

The proxy's per-pair work is: the tracker frames and pairs (always), then the
metrics observer decodes both frames and updates its series. This measures
both on the same in-memory stream of typical traffic, no sockets.

    python benchmarks/bench_metrics.py [--pairs 20000] [--json]
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kproxy.observers.metrics import Metrics  # noqa: E402
from kproxy.protocol import Request, Response, Struct, encode_request, encode_response, new_body  # noqa: E402
from kproxy.protocol.connection import Connection, ResponseReceived  # noqa: E402
from kproxy.protocol.records import Record, build_batch  # noqa: E402


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def traffic(pairs: int) -> tuple[bytes, bytes]:
    """A client stream and a broker stream: Produce, Fetch and Heartbeat pairs in turn
    (the Fetch names 4 partitions, as a consumer does, and is answered with records)."""
    batch = build_batch([Record(i, 1_700_000_000_000, b"k", b"v" * 200, ()) for i in range(20)], "lz4")
    kinds = [  # one in KINDS is a Fetch
        (0, 9, dict(acks=-1, timeout_ms=30000, topic_data=[Struct(name="orders", partition_data=[
            Struct(index=p, records=batch) for p in range(2)])]),
         dict(responses=[Struct(name="orders", partition_responses=[
             Struct(index=p, error_code=0, base_offset=100, log_append_time_ms=-1, log_start_offset=0,
                    record_errors=[], error_message=None) for p in range(2)])])),
        (1, 12, dict(session_epoch=-1, topics=[Struct(topic="orders", partitions=[
            Struct(partition=p, fetch_offset=980) for p in range(4)])]),
         dict(responses=[Struct(topic="orders", partitions=[
             Struct(partition_index=p, high_watermark=1000, records=batch) for p in range(4)])])),
        (12, 4, dict(group_id="g", generation_id=3, member_id="m"), dict()),
    ]
    client, broker = bytearray(), bytearray()
    for i in range(pairs):
        api_key, version, req, resp = kinds[i % len(kinds)]
        client += framed(encode_request(Request(api_key, version, i, "bench",
                                                new_body("request", api_key, version, **req))))
        broker += framed(encode_response(Response(i, new_body("response", api_key, version, **resp)),
                                         api_key, version))
    return bytes(client), bytes(broker)


KINDS = 3          # Produce, Fetch, Heartbeat
CHUNK = 64 * 1024


def run(client: bytes, broker: bytes, observer) -> float:
    conn = Connection()
    start = time.perf_counter()
    for stream, feed in ((client, conn.receive_client), (broker, conn.relay_broker)):
        for pos in range(0, len(stream), CHUNK):
            result = feed(stream[pos:pos + CHUNK])
            events = result[0] if isinstance(result, tuple) else result
            if observer is not None and events:
                observer(None, events)
    return time.perf_counter() - start


def lag_alone(client: bytes, broker: bytes, repeat: int) -> float:
    """Seconds per Fetch pair of the consumer-lag step alone, on frames decoded beforehand:
    the difference of two whole runs drowns in noise on a shared machine; this does not."""
    conn = Connection()
    conn.receive_client(client)
    fetches = [e for e in conn.receive_broker(broker) if isinstance(e, ResponseReceived) and e.api_key == 1]
    bodies = [(e, e.response.body) for e in fetches if e.request_event.request is not None]
    best = float("inf")
    for _ in range(repeat):
        metrics = Metrics()
        start = time.perf_counter()
        for event, body in bodies:
            metrics._fetch_answered(event, None, body)
        best = min(best, (time.perf_counter() - start) / len(bodies))
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    client, broker = traffic(args.pairs)
    tracker = min(run(client, broker, None) for _ in range(args.repeat))
    # Alternated, so both see the same machine load.
    without_lag, metrics = [], []
    for _ in range(args.repeat):
        without_lag.append(run(client, broker, Metrics(consumer_lag=False)))
        metrics.append(run(client, broker, Metrics()))
    without_lag, metrics = min(without_lag), min(metrics)
    per_pair = lambda t: t / args.pairs * 1e6  # noqa: E731
    result = {"pairs": args.pairs, "tracker_us_per_pair": per_pair(tracker),
              "tracker_and_metrics_us_per_pair": per_pair(metrics),
              "metrics_us_per_pair": per_pair(metrics - tracker),
              "metrics_without_lag_us_per_pair": per_pair(without_lag - tracker),
              "consumer_lag_us_per_fetch_pair": per_pair(metrics - without_lag) * KINDS,
              "consumer_lag_alone_us_per_fetch_pair": lag_alone(client, broker, args.repeat) * 1e6}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.pairs} request/response pairs (Produce v9, Fetch v12 of 4 partitions with records, Heartbeat v4), "
          f"best of {args.repeat}")
    print(f"tracker only (framing, pairing)          {result['tracker_us_per_pair']:7.1f} us/pair")
    print(f"tracker + metrics (decode + series)      {result['tracker_and_metrics_us_per_pair']:7.1f} us/pair")
    print(f"metrics' own cost                        {result['metrics_us_per_pair']:7.1f} us/pair")
    print(f"  of which consumer lag                  {result['consumer_lag_us_per_fetch_pair']:7.1f} us "
          f"per Fetch pair (4 partitions; metrics without it: "
          f"{result['metrics_without_lag_us_per_pair']:.1f} us/pair)")
    print(f"  consumer lag step alone                {result['consumer_lag_alone_us_per_fetch_pair']:7.1f} us "
          f"per Fetch pair (decoded beforehand)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
