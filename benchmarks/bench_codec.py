"""Micro-benchmark of kproxy's codec: how long decoding (and re-encoding) typical frames takes.

    python benchmarks/bench_codec.py            # a table
    python benchmarks/bench_codec.py --json     # machine-readable results
    python benchmarks/bench_codec.py --repeat 9 --min-time 0.5

Each line times one operation on one frame, timeit-style: the loop count is
chosen so one run lasts at least --min-time seconds, the run is repeated
--repeat times, and the best run counts (the least disturbed by the rest of
the machine). See benchmarks/README.md for what each line means.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import timeit
from dataclasses import asdict, dataclass

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from kproxy.protocol import (Request, Response, Struct, Uuid, decode_request,  # noqa: E402
                             decode_response, encode_request, encode_response, new_body)

METADATA, PRODUCE, FETCH = 3, 0, 1
KIB = 1024
MIB = 1024 * KIB


@dataclass
class Result:
    key: str              # stable identifier for scripts
    operation: str
    frame_bytes: int
    us_per_op: float
    ops_per_s: float
    mb_per_s: float       # frame bytes processed per second, in MB (10**6 bytes)
    loops: int
    repeat: int


# ------------------------------------------------------------ frames

def _uuid(rng: random.Random) -> Uuid:
    return Uuid(rng.randbytes(16))


def metadata_response_frame(version: int = 12, topics: int = 20, partitions: int = 3,
                            brokers: int = 3) -> bytes:
    """A Metadata response: `brokers` brokers, `topics` topics of `partitions` partitions each,
    replicas and ISR of 3."""
    rng = random.Random(1)
    body = new_body(
        "response", METADATA, version,
        throttle_time_ms=0,
        brokers=[Struct(node_id=n, host=f"broker-{n}.kafka.svc.cluster.local", port=9092,
                        rack=f"zone-{n % 3}") for n in range(brokers)],
        cluster_id="kproxy-bench-cluster-0001",
        controller_id=0,
        topics=[Struct(error_code=0, name=f"orders.events.v1.{t:03d}", topic_id=_uuid(rng),
                       is_internal=False,
                       partitions=[Struct(error_code=0, partition_index=p, leader_id=(t + p) % brokers,
                                          leader_epoch=7, replica_nodes=[0, 1, 2], isr_nodes=[0, 1, 2],
                                          offline_replicas=[])
                                   for p in range(partitions)],
                       topic_authorized_operations=-2147483648)
                for t in range(topics)],
    )
    return encode_response(Response(1001, body), METADATA, version)


def produce_request_frame(version: int, topics: int = 5, partitions: int = 2,
                          records_bytes: int = 16 * KIB) -> bytes:
    """A Produce request: topics x partitions, each with `records_bytes` of (opaque) records."""
    rng = random.Random(2)
    payload = rng.randbytes(records_bytes)
    topic_data = []
    for t in range(topics):
        topic = Struct(partition_data=[Struct(index=p, records=payload) for p in range(partitions)])
        if version >= 13:
            topic.topic_id = _uuid(rng)
        else:
            topic.name = f"orders.events.v1.{t:03d}"
        topic_data.append(topic)
    body = new_body("request", PRODUCE, version, transactional_id=None, acks=-1,
                    timeout_ms=30000, topic_data=topic_data)
    return encode_request(Request(PRODUCE, version, 2002, "bench-producer", body))


def fetch_response_frame(version: int, topics: int = 4, partitions: int = 4,
                         total_records: int = 1 * MIB) -> bytes:
    """A Fetch response: topics x partitions sharing `total_records` bytes of (opaque) records."""
    rng = random.Random(3)
    per_partition = total_records // (topics * partitions)
    payload = rng.randbytes(per_partition)
    responses = []
    for t in range(topics):
        topic = Struct(partitions=[Struct(partition_index=p, error_code=0, high_watermark=1_000_000 + p,
                                          last_stable_offset=1_000_000 + p, log_start_offset=0,
                                          aborted_transactions=[], preferred_read_replica=-1,
                                          records=payload)
                                   for p in range(partitions)])
        if version >= 13:
            topic.topic_id = _uuid(rng)
        else:
            topic.topic = f"orders.events.v1.{t:03d}"
        responses.append(topic)
    body = new_body("response", FETCH, version, throttle_time_ms=0, error_code=0,
                    session_id=12345, responses=responses)
    return encode_response(Response(3003, body), FETCH, version)


# ------------------------------------------------------------ timing

def measure(key: str, name: str, size: int, fn, repeat: int, min_time: float) -> Result:
    timer = timeit.Timer(fn)
    loops = 1
    while timer.timeit(loops) < min_time:     # like timeit.autorange, up to min_time
        loops *= 2
    best = min(timer.repeat(repeat=repeat, number=loops)) / loops
    return Result(key, name, size, best * 1e6, 1 / best, size / best / 1e6, loops, repeat)


def benchmarks():
    """(key, operation, frame size, callable) for every line of the table."""
    lines = []

    metadata = metadata_response_frame()
    lines.append(("metadata_v12_decode", "decode Metadata v12 response (20 topics x 3 partitions, 3 brokers)",
                  len(metadata), lambda: decode_response(metadata, METADATA, 12)))

    for version in (9, 11, 13):
        produce = produce_request_frame(version)
        lines.append((f"produce_v{version}_decode", f"decode Produce v{version} request (5 topics x 2 partitions x 16 KiB)",
                      len(produce), lambda f=produce: decode_request(f)))

    for version in (12, 16):
        fetch = fetch_response_frame(version)
        decoded = decode_response(fetch, FETCH, version)
        records = decoded.body.responses[0].partitions[0].records
        assert isinstance(records, memoryview), "records must be zero-copy views of the frame"
        lines.append((f"fetch_v{version}_decode", f"decode Fetch v{version} response (16 partitions, 1 MiB records)",
                      len(fetch), lambda f=fetch, v=version: decode_response(f, FETCH, v)))

    decoded_metadata = decode_response(metadata, METADATA, 12)
    assert encode_response(decoded_metadata, METADATA, 12) == metadata
    lines.append(("metadata_v12_encode", "encode Metadata v12 response (address-rewrite path)",
                  len(metadata), lambda: encode_response(decoded_metadata, METADATA, 12)))

    def rewrite_round_trip():
        response = decode_response(metadata, METADATA, 12)
        for broker in response.body.brokers:
            broker.host = "proxy.example.com"
            broker.port += 10000
        return encode_response(response, METADATA, 12)
    lines.append(("metadata_v12_rewrite", "decode + rewrite hosts + encode Metadata v12", len(metadata), rewrite_round_trip))

    kio_line = _kio_metadata_line(metadata)
    if kio_line is not None:
        lines.append(kio_line)
    return lines


def _kio_metadata_line(frame: bytes):
    """The same Metadata decode by kio (Rust core), as an independent reference figure."""
    try:
        from kio.index import load_response_schema
        from kio.serial import entity_reader
    except ImportError:
        return None
    read = entity_reader(load_response_schema(METADATA, 12))
    start = 5                                 # correlation id + empty header tag block
    entity, size = read(frame, start)
    assert start + size == len(frame) and len(entity.topics) == 20
    return ("kio_metadata_v12_decode", "reference: kio decode of the same Metadata v12 body", len(frame),
            lambda: read(frame, start))


# ------------------------------------------------------------ output

def print_table(results: list[Result]) -> None:
    width = max(len(r.operation) for r in results)
    header = f"{'operation':<{width}}  {'bytes':>9}  {'us/op':>9}  {'ops/s':>9}  {'MB/s':>9}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r.operation:<{width}}  {r.frame_bytes:>9,}  {r.us_per_op:>9.1f}  "
              f"{r.ops_per_s:>9,.0f}  {r.mb_per_s:>9,.0f}")
    print(f"\nbest of {results[0].repeat} runs; Python {platform.python_version()} "
          f"({platform.python_implementation()}) on {platform.machine()}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument("--repeat", type=int, default=5, help="runs per line; the best counts")
    parser.add_argument("--min-time", type=float, default=0.2,
                        help="seconds each run lasts at least (the loop count is chosen to match)")
    args = parser.parse_args(argv)
    results = [measure(key, name, size, fn, args.repeat, args.min_time)
               for key, name, size, fn in benchmarks()]
    if args.json:
        print(json.dumps({"python": platform.python_version(), "machine": platform.machine(),
                          "results": [asdict(r) for r in results]}, indent=2))
    else:
        print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
