"""Synthetic capture files: a realistic mix of pairs for trying and benchmarking the pipeline.

    python -m kproxy.pipeline.synthetic --rows 1000000 /tmp/synthetic-capture

Rows follow the capture writer's own Arrow schema (the newest version) and
are built column-wise with numpy (10 M rows in seconds): producers and
consumers on a few proxies, topics, consumer groups that rebalance now and
then, empty Fetch long-polls, some errors and throttling, one latency spike.
Not traffic, only its shape: tests of the pipeline's arithmetic use real
captures; this feeds benchmarks and the report's look.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..observers.capture.parquet import COMPRESSION, SCHEMA

# api name -> (key, version, share of pairs, median latency ms)
API_MIX = {
    "Produce": (0, 9, 0.34, 4.0),
    "Fetch": (1, 12, 0.40, 2.0),
    "ListOffsets": (2, 7, 0.02, 1.0),
    "Metadata": (3, 12, 0.03, 1.0),
    "OffsetCommit": (8, 8, 0.05, 3.0),
    "OffsetFetch": (9, 8, 0.01, 1.5),
    "FindCoordinator": (10, 4, 0.01, 1.0),
    "JoinGroup": (11, 9, 0.005, 30.0),
    "Heartbeat": (12, 4, 0.09, 0.8),
    "SyncGroup": (14, 5, 0.005, 5.0),
    "ApiVersions": (18, 3, 0.02, 0.5),
    "InitProducerId": (22, 4, 0.01, 2.0),
    "ConsumerGroupHeartbeat": (68, 0, 0.01, 1.0),
}
OLD_PRODUCE_VERSION = 2            # a legacy client on a version Kafka 4.0 removed
SOFTWARE = [("apache-kafka-java", "3.9.1"), ("confluent-kafka-python", "2.6.0"),
            ("librdkafka", "2.6.0"), ("kafka-python", "2.0.2"), (None, None)]
ERRORS = ["NOT_LEADER_OR_FOLLOWER", "REQUEST_TIMED_OUT", "REBALANCE_IN_PROGRESS", "UNKNOWN_MEMBER_ID"]
LONG_POLL_MS = 500.0
# Rows per Parquet row group by default: one group per file of a benchmark's chunk (a
# compacted capture). kproxy's own writer closes a row group per flush (1,000 rows or a
# second by default); ``row_group_rows=1000`` writes files shaped like its captures.
ROW_GROUP_ROWS = 1_000_000
SPIKE_AT = 0.7                     # where in the span a p99 spike sits (an anomaly to find)


def _strings(indices: np.ndarray, values: list) -> pa.Array:
    """Strings picked by index from ``values`` (None allowed), without a Python object per row."""
    dictionary = pa.array(values, type=pa.string())
    return pa.DictionaryArray.from_arrays(pa.array(indices, type=pa.int32()), dictionary).cast(pa.string())


def _where(present: np.ndarray, values: pa.Array) -> pa.Array:
    """``values`` where present, null elsewhere."""
    return pc.if_else(pa.array(present), values, pa.scalar(None, values.type))


def _lists(values: pa.Array, present: np.ndarray) -> pa.Array:
    """A list column: ``[values[i]]`` where present, an empty list elsewhere."""
    offsets = np.concatenate([[0], np.cumsum(present.astype(np.int32))]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), values.filter(pa.array(present)))


def synthetic_table(rows: int, seed: int = 0, start: dt.datetime | None = None,
                    span_seconds: float = 3600.0, clients: int = 40, topics: int = 12,
                    groups: int = 4, proxies: int = 3) -> pa.Table:
    rng = np.random.default_rng(seed)
    start = start or dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.timezone.utc)
    names = list(API_MIX)
    shares = np.array([API_MIX[n][2] for n in names])
    api = rng.choice(len(names), size=rows, p=shares / shares.sum())
    is_api = {n: api == i for i, n in enumerate(names)}
    key = np.array([API_MIX[n][0] for n in names], dtype=np.int16)[api]
    version = np.array([API_MIX[n][1] for n in names], dtype=np.int16)[api]
    offset_s = np.sort(rng.uniform(0, span_seconds, rows))
    time_us = int(start.timestamp() * 1e6) + (offset_s * 1e6).astype(np.int64)

    client = rng.integers(0, clients, rows)
    legacy = client == clients - 1                     # the last client is on old versions
    version = np.where(legacy & is_api["Produce"], OLD_PRODUCE_VERSION, version).astype(np.int16)
    conn_per_client = 3
    connection = client * conn_per_client + rng.integers(0, conn_per_client, rows)
    proxy = connection % proxies
    conn_start_us = int(start.timestamp() * 1e6) - (connection % 7) * 60_000_000
    software = client % len(SOFTWARE)

    median = np.array([API_MIX[n][3] for n in names])[api]
    latency = median * rng.lognormal(0.0, 0.6, rows)
    empty_fetch = is_api["Fetch"] & (rng.random(rows) < 0.5)
    latency = np.where(empty_fetch, LONG_POLL_MS + rng.normal(0, 2, rows).clip(0), latency)
    spike = np.abs(offset_s / span_seconds - SPIKE_AT) < 0.01
    latency = np.where(spike & is_api["Produce"], latency * 40, latency)
    no_response = is_api["Produce"] & (rng.random(rows) < 0.01)     # acks=0
    latency_arr = pa.array(latency, mask=no_response)

    error = rng.random(rows) < 0.004
    error_kind = rng.integers(0, len(ERRORS), rows)
    throttle = np.where(rng.random(rows) < 0.02, rng.integers(1, 500, rows), 0).astype(np.int32)
    has_throttle = ~is_api["ApiVersions"] & ~no_response

    topic = (client * 7 + rng.integers(0, 2, rows)) % topics
    topic_names = [f"orders-{i}" for i in range(topics)]
    carries_records = is_api["Produce"] | is_api["Fetch"]
    records = np.where(empty_fetch, 0, rng.integers(1, 500, rows)).astype(np.int64)
    record_bytes = records * 1024
    names_topic = _strings(topic, topic_names)
    with_topic = carries_records | is_api["Metadata"] | is_api["ListOffsets"] | is_api["OffsetCommit"]

    group = client % groups
    group_api = (is_api["JoinGroup"] | is_api["SyncGroup"] | is_api["Heartbeat"] | is_api["OffsetCommit"]
                 | is_api["OffsetFetch"] | is_api["ConsumerGroupHeartbeat"])
    generation = (offset_s // (span_seconds / 6)).astype(np.int32) + 1        # ~6 rebalances per group

    topic_struct = pa.StructArray.from_arrays(
        [names_topic, pa.array(records), pa.array(record_bytes)],
        fields=list(SCHEMA.field("topic_records").type.value_type))
    columns = {
        "capture_version": pa.array(np.full(rows, 2, np.int16)),
        "time": pa.array(time_us, type=pa.timestamp("us", tz="UTC")),
        "connection_id": pa.array(connection.astype(np.int64)),
        "client_host": _strings(client % 250, [f"10.0.{i // 250}.{i % 250}" for i in range(250)]),
        "client_port": pa.array((40000 + connection % 20000).astype(np.int32)),
        "listener": _strings(np.zeros(rows, np.int32), ["bootstrap"]),
        "upstream_host": _strings(np.zeros(rows, np.int32), ["10.1.0.1"]),
        "upstream_port": pa.array(np.full(rows, 9092, np.int32)),
        "client_id": _strings(client, [f"service-{i}" for i in range(clients)]),
        "api_key": pa.array(key),
        "api_name": _strings(api, names),
        "api_version": pa.array(version),
        "correlation_id": pa.array((np.arange(rows) % 2_000_000_000).astype(np.int32)),
        "outcome": _strings(no_response.astype(np.int32), ["response", "no_response"]),
        "latency_ms": latency_arr,
        "request_size": pa.array(np.where(is_api["Produce"], record_bytes + 120, 80).astype(np.int32)),
        "response_size": pa.array(np.where(is_api["Fetch"], record_bytes + 100, 60).astype(np.int32),
                                  mask=no_response),
        "throttle_ms": pa.array(throttle, mask=~has_throttle),
        "error_count": pa.array(error.astype(np.int32)),
        "errors": _lists(_strings(error_kind, ERRORS), error),
        "topics": _lists(names_topic, with_topic),
        "partition_count": pa.array(with_topic.astype(np.int32)),
        "record_count": pa.array(records, mask=~carries_records),
        "record_bytes": pa.array(record_bytes, mask=~carries_records),
        "batch_count": pa.array(np.ones(rows, np.int32), mask=~carries_records),
        "compression": _lists(_strings(np.zeros(rows, np.int32), ["lz4"]), carries_records),
        "topic_records": pa.ListArray.from_arrays(
            pa.array(np.arange(rows + 1, dtype=np.int32)), topic_struct,
            mask=pa.array(~carries_records)),
        "proxy_instance": _strings(proxy, [f"kproxy-{i}" for i in range(proxies)]),
        "connection_start": pa.array(conn_start_us, type=pa.timestamp("us", tz="UTC")),
        "client_software_name": _strings(software, [s[0] for s in SOFTWARE]),
        "client_software_version": _strings(software, [s[1] for s in SOFTWARE]),
        "group_id": _where(group_api, _strings(group, [f"group-{i}" for i in range(groups)])),
        "member_id": _where(group_api, _strings(connection % 1000, [f"member-{i}" for i in range(1000)])),
        "generation": pa.array(generation, mask=~group_api),
    }
    arrays = []
    for f in SCHEMA:
        column = columns.get(f.name)
        arrays.append(pa.nulls(rows, f.type) if column is None else column.cast(f.type))
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def write_synthetic(directory: str, rows: int, files: int = 4, prefix: str = "kproxy-capture",
                    row_group_rows: int = ROW_GROUP_ROWS, **kwargs) -> list[str]:
    """Write ``rows`` synthetic pairs as ``files`` Parquet files named as kproxy names them."""
    os.makedirs(directory, exist_ok=True)
    table = synthetic_table(rows, **kwargs)
    times = table.column("time")
    paths = []
    step = -(-rows // files)
    for index in range(files):
        part = table.slice(index * step, step)
        if part.num_rows == 0:
            break
        first = times[index * step].as_py()
        stamp = first.strftime("%Y%m%dT%H%M%S")
        path = os.path.join(directory, f"{prefix}-{stamp}-{index + 1:06d}.parquet")
        pq.write_table(part, path, compression=COMPRESSION, row_group_size=row_group_rows)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kproxy.pipeline.synthetic",
                                     description="write a synthetic kproxy capture (Parquet)")
    parser.add_argument("directory")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--row-group-rows", type=int, default=ROW_GROUP_ROWS,
                        help="rows per Parquet row group (kproxy's writer: 1000)")
    args = parser.parse_args(argv)
    paths = write_synthetic(args.directory, args.rows, files=args.files, seed=args.seed,
                            row_group_rows=args.row_group_rows)
    print(f"{args.rows:,} pairs in {len(paths)} files under {args.directory}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
