"""``kproxy analyze``'s producer latency split: client-pushed queue time and request latency
(KIP-714, capture schema v4) beside kproxy's Produce latency for the same client and windows."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.parquet as pq

from kproxy.observers.capture.parquet import SCHEMA
from kproxy.pipeline import tables as T
from kproxy.pipeline.report import _Data, _latency_split
from kproxy.pipeline.load import load_capture
from kproxy.protocol.client_telemetry import NODE_REQUEST_LATENCY_AVG, RECORD_QUEUE_TIME_AVG

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc).timestamp()


def row(seconds: float, api: str, latency_ms: float, client_id="orders-app", host="10.0.0.7", **columns) -> dict:
    out = dict.fromkeys(SCHEMA.names)
    out.update(capture_version=4, time=int((T0 + seconds) * 1_000_000), connection_id=1, client_host=host,
               client_port=40000, listener="bootstrap", upstream_host="127.0.0.1", upstream_port=9092,
               client_id=client_id, api_key={"Produce": 0, "PushTelemetry": 72}[api], api_name=api,
               api_version=0, correlation_id=int(seconds * 10), outcome="response", latency_ms=latency_ms,
               request_size=100, response_size=20, error_count=0, errors=[], topics=[], partition_count=0,
               compression=[], client_software_name="apache-kafka-java", client_software_version="4.4.0")
    out.update(columns)
    return out


def push(seconds: float, queue_ms: float, node_ms: list[float], instance="AAAAAAAAAAAAAAAAAAAAAQ", **kw) -> dict:
    metrics = [{"name": RECORD_QUEUE_TIME_AVG, "attributes": "", "value": queue_ms}] + [
        {"name": NODE_REQUEST_LATENCY_AVG, "attributes": f"node.id={i}", "value": v} for i, v in enumerate(node_ms)]
    return row(seconds, "PushTelemetry", 0.5, client_instance_id=instance, telemetry_metrics=metrics, **kw)


def test_queue_request_and_broker_per_producer(spark, tmp_path):
    rows = [push(0, 400.0, [12.0]),
            row(1, "Produce", 8.0), row(2, "Produce", 10.0), row(3, "Produce", 12.0),   # window 1: mean 10
            row(3, "Produce", 99.0, client_id="someone-else"),                        # another client
            push(5, 500.0, [14.0, 16.0]),
            row(6, "Produce", 20.0),                                                  # window 2: 20
            push(10, 450.0, [20.0]),
            push(10, 1.0, [1.0], instance="AAAAAAAAAAAAAAAAAAAAAg", client_id="other-app"),   # no Produce
            row(11, "Produce", 1000.0)]                                               # after the last push
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), tmp_path / "kproxy-capture-20260101T000000-000001.parquet")
    _, pairs = load_capture(spark, [str(tmp_path)])
    got = {r["client_instance_id"]: r.asDict() for r in T.latency_split(pairs).collect()}
    first = got["AAAAAAAAAAAAAAAAAAAAAQ"]
    assert first["pushes"] == 3 and first["produce_pairs"] == 4
    assert first["queue_ms"] == (400 + 500 + 450) / 3
    assert first["request_ms"] == (12 + 15 + 20) / 3                # per push: the mean over nodes
    assert first["broker_ms"] == (8 + 10 + 12 + 20) / 4
    assert abs(first["network_ms"] - (first["request_ms"] - first["broker_ms"])) < 1e-9
    assert abs(first["queue_share"] - first["queue_ms"] / (first["queue_ms"] + first["request_ms"])) < 1e-9
    assert (first["client_id"], first["client_host"], first["client_software_name"]) == \
        ("orders-app", "10.0.0.7", "apache-kafka-java")
    other = got["AAAAAAAAAAAAAAAAAAAAAg"]
    assert other["produce_pairs"] == 0 and other["broker_ms"] is None
    html = _latency_split(_Data({"latency_split": [first, other]}, {}, None))
    assert "Producer latency split" in html and "orders-app" in html
    assert f"{first['queue_share'] * 100:.1f} %" in html
