"""Topic ids resolved across proxies: one sidecar's rows name a topic by id, another's
Metadata answer gave the name; the topic tables show one topic under its name."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.parquet as pq

from kproxy.observers.capture.parquet import COMPRESSION, SCHEMA
from kproxy.pipeline import load_capture, tables

TOPIC_ID = "hx3ONFVgRtqmrInl_2Nq4w"       # Kafka's base64 form of a 16-byte id
UNNAMED_ID = "AAECAwQFBgcICQoLDA0ODw"      # no row names this one
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def row(proxy: str, seconds: int, api: str, topics, topic_records=None, topic_ids=None) -> dict:
    return {"capture_version": 3, "time": T0 + dt.timedelta(seconds=seconds), "connection_id": seconds,
            "client_host": "127.0.0.1", "client_port": 40000 + seconds, "listener": "bootstrap",
            "upstream_host": "127.0.0.1", "upstream_port": 9092, "client_id": "consumer",
            "api_key": 3 if api == "Metadata" else 1, "api_name": api, "api_version": 13,
            "correlation_id": seconds, "outcome": "response", "latency_ms": 1.0, "request_size": 100,
            "response_size": 100, "error_count": 0, "errors": [], "topics": topics,
            "partition_count": len(topics), "record_count": None, "compression": [],
            "topic_records": topic_records, "proxy_instance": proxy,
            "connection_start": T0, "topic_ids": topic_ids}


def records(topic: str, count: int) -> list[dict]:
    return [{"topic": topic, "record_count": count, "record_bytes": 100 * count}]


def write(directory, proxy: str, rows: list[dict]) -> None:
    path = directory / f"kproxy-capture-{proxy}-20260101T000000-000001.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), str(path), compression=COMPRESSION)


def test_ids_one_proxy_wrote_are_named_by_another_proxys_metadata_rows(spark, tmp_path):
    # Sidecar a relayed the client's Metadata (id and name) and a Fetch by name; sidecar b only
    # Fetches by id (one for a topic no row names).
    write(tmp_path, "a", [
        row("a", 1, "Metadata", ["orders"], topic_ids=[{"topic_id": TOPIC_ID, "topic": "orders"}]),
        row("a", 2, "Fetch", ["orders"], records("orders", 3))])
    write(tmp_path, "b", [
        row("b", 3, "Fetch", [TOPIC_ID], records(TOPIC_ID, 2)),
        row("b", 4, "Fetch", [UNNAMED_ID], records(UNNAMED_ID, 1))])

    _, raw = load_capture(spark, [str(tmp_path)])
    assert "topic_ids" not in raw.columns
    flows = tables.topic_clients(raw)
    got = {r["topic"]: (r["pairs"], r["fetched_records"], r["fetched_bytes"])
           for r in tables.topics(raw, flows).collect()}
    assert got == {"orders": (3, 5, 500), UNNAMED_ID: (1, 1, 100)}
