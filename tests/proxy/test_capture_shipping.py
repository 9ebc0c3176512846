"""Capture shipping: sidecars in front of a three-node cluster, each shipping its capture
rows to one topic on another cluster, read back by ``kproxy analyze`` in batch and streaming.

- Every row the capture cluster acknowledged is in the topic, across a sidecar's restart
  (the capture flushes when kproxy stops): rows per ``proxy_instance`` in the topic equal
  the sidecars' ``rows_shipped``, and nothing was dropped or failed.
- The streamed tables (``--follow kafka://...``) equal the batch functions over the same
  rows, and the batch job's per-instance table counts each sidecar's pairs.
Settings, the queue bound and the admin listener's limits: ``tests/observers/test_capture_shipping.py``.
"""

from __future__ import annotations

import json
import os
import time
import uuid

import pytest

from tests.pipeline.conftest import spark  # noqa: F401 - the one session-wide SparkSession
from tests.proxy.cluster import ADMIN_TIMEOUT_S, create_topic, port_free_on, topic_name
from tests.proxy.harness import ProxyThread, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.timeout(600)]

SHUTDOWN_TIMEOUT_S = 10.0
MESSAGES = 30                    # per round trip through the sidecars
READ_TIMEOUT_S = 60.0


def _sidecar(node, cluster, port: int, capture_topic: str) -> ProxyThread:
    return ProxyThread(
        mode="sidecar", upstream=f"{node.host}:{node.port}", broker_port_rule="fixed",
        listen=f"127.0.0.1{node.node_id}:{port}", advertised_host_template="127.0.0.1{node_id}",
        instance_name=f"sidecar-{node.node_id}", shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        capture={"formats": ["kafka"], "kafka": {"bootstrap": cluster.bootstrap_servers,
                                                 "topic": capture_topic, "linger_ms": 20}},
        capture_autostart=True)


def _round_trip(bootstrap: str, topic: str, tag: str) -> None:
    """Produce MESSAGES keyed messages (every partition, so every sidecar) and consume them back."""
    from confluent_kafka import Consumer, Producer
    failures: list = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(MESSAGES):
        producer.produce(topic, key=f"k{i}".encode(), value=f"{tag}{i}".encode(),
                         on_delivery=lambda err, msg: err and failures.append(err))
    assert producer.flush(ADMIN_TIMEOUT_S) == 0 and not failures
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{tag}-{topic}",
                         "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                         "heartbeat.interval.ms": 1000})
    consumer.subscribe([topic])
    wanted = {f"{tag}{i}".encode() for i in range(MESSAGES)}
    got: set[bytes] = set()
    deadline = time.monotonic() + READ_TIMEOUT_S
    try:
        while not wanted <= got and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.add(message.value())
    finally:
        consumer.close()
    assert wanted <= got


def _shipped_rows(bootstrap: str, topic: str) -> list[dict]:
    """Every message of the capture topic, read directly (not through any kproxy)."""
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    metadata = consumer.list_topics(topic, timeout=ADMIN_TIMEOUT_S)
    partitions = [TopicPartition(topic, p) for p in metadata.topics[topic].partitions]
    ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=ADMIN_TIMEOUT_S)[1] for tp in partitions}
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    rows, seen = [], dict.fromkeys(ends, 0)
    deadline = time.monotonic() + READ_TIMEOUT_S
    while any(seen[p] < ends[p] for p in ends) and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            rows.append(json.loads(message.value()))
            seen[message.partition()] = message.offset() + 1
    consumer.close()
    assert seen == ends, "the capture topic could not be read to its end"
    return rows


@pytest.fixture(scope="module")
def fleet(cluster3, kafka_cluster):
    """Three sidecars (one restarted midway) shipped a capture of client traffic to one topic:
    (capture topic, each instance's capture counters as each of its runs stopped)."""
    from confluent_kafka.admin import AdminClient
    capture_topic = topic_name("shipped-capture")
    create_topic(AdminClient({"bootstrap.servers": kafka_cluster.bootstrap_servers}), capture_topic,
                 partitions=3, replication=1)
    nodes = cluster3.nodes
    port = port_free_on(f"127.0.0.1{n.node_id}" for n in nodes)    # a sidecar restarts on its port
    counters: dict[str, list[dict]] = {}

    def stop(proxy: ProxyThread) -> None:
        proxy.__exit__(None, None, None)             # a graceful stop, as on SIGTERM: flushes
        counters.setdefault(proxy.config.instance_name, []).append(proxy.runtime.capture.counters())

    sidecars = {}
    try:
        for node in nodes:
            sidecars[node.node_id] = _sidecar(node, kafka_cluster, port, capture_topic).__enter__()
        bootstrap = sidecars[nodes[0].node_id].bootstrap
        topic = topic_name("fleet-traffic")
        create_topic(AdminClient({"bootstrap.servers": bootstrap}), topic, partitions=6, replication=1)
        _round_trip(bootstrap, topic, "before")
        restarted = nodes[1]
        stop(sidecars.pop(restarted.node_id))
        sidecars[restarted.node_id] = _sidecar(restarted, kafka_cluster, port, capture_topic).__enter__()
        _round_trip(bootstrap, topic, "after")
    finally:
        for proxy in sidecars.values():
            stop(proxy)
    return capture_topic, counters


def test_every_acknowledged_row_reaches_the_topic_across_a_restart(fleet, kafka_cluster):
    capture_topic, counters = fleet
    rows = _shipped_rows(kafka_cluster.bootstrap_servers, capture_topic)
    assert sorted(counters) == sorted({r["proxy_instance"] for r in rows})
    for instance, runs in counters.items():
        for run in runs:
            assert run["ship_dropped"] == 0 and run["ship_failed"] == 0, (instance, run)
            assert run["rows_shipped"] == run["rows_written"] > 0, (instance, run)
        in_topic = [r for r in rows if r["proxy_instance"] == instance]
        assert len(in_topic) == sum(run["rows_shipped"] for run in runs), instance
    restarted = [name for name, runs in counters.items() if len(runs) == 2]
    assert len(restarted) == 1
    # Both runs of the restarted sidecar are there: connection ids restart with the process,
    # the connection start times tell the two apart.
    starts = {r["connection_start"] for r in rows if r["proxy_instance"] == restarted[0]}
    assert len(starts) >= 2
    apis = {r["api_name"] for r in rows}
    assert {"Produce", "Fetch", "Metadata"} <= apis
    assert all(r["capture_version"] and r["time"] for r in rows)


def test_streamed_tables_equal_the_batch_tables(fleet, kafka_cluster, spark, tmp_path):  # noqa: F811
    """``--follow kafka://...`` (streaming, once) writes the batch functions' series and client
    inventory over the same rows; the batch source's per-instance table counts what each
    sidecar shipped."""
    from kproxy.pipeline import tables as T
    from kproxy.pipeline.follow import follow
    from kproxy.pipeline.job import Options
    from kproxy.pipeline.load import load_capture
    from tests.pipeline.test_follow import _assert_tables_match

    capture_topic, counters = fleet
    uri = f"kafka://{kafka_cluster.bootstrap_servers}/{capture_topic}"
    shipped = {name: sum(run["rows_shipped"] for run in runs) for name, runs in counters.items()}
    inputs, pairs = load_capture(spark, [uri])
    assert inputs.format == "kafka"
    instances = T.instances(pairs).collect()
    assert {r["proxy_instance"]: r["requests"] for r in instances} == shipped
    assert all(r["connections"] >= 1 and r["clients"] >= 1 and r["latency_p99_ms"] is not None
               for r in instances)

    out = str(tmp_path / "follow")
    with open(os.devnull, "w") as quiet:
        followed = follow(spark, [uri], out, Options(), once=True, stream=quiet)
    total = sum(shipped.values())
    assert followed.rows == {"series": total, "client_inventory": total}
    assert _assert_tables_match(spark, out, [uri]) == total


@pytest.mark.soak
def test_the_batch_job_and_report_over_a_topic(fleet, kafka_cluster, spark, tmp_path):  # noqa: F811
    """The whole batch job (every table, the report) reads the topic: ``kproxy analyze kafka://...``."""
    from kproxy.pipeline.job import Options, analyze

    capture_topic, counters = fleet
    uri = f"kafka://{kafka_cluster.bootstrap_servers}/{capture_topic}"
    shipped = {name: sum(run["rows_shipped"] for run in runs) for name, runs in counters.items()}
    batch = analyze(spark, [uri], str(tmp_path / "batch"), Options())
    instances = {r["proxy_instance"]: r["requests"]
                 for r in spark.read.parquet(batch.tables["instances"]).collect()}
    assert instances == shipped
    with open(batch.report) as f:
        report = f.read()
    assert 'id="instances"' in report and all(name in report for name in shipped)
