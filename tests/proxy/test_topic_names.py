"""A sidecar names the topics clients fetch by id (Fetch v13+) though it never relayed the
Metadata answer that named them: it asks its broker (``proxy.topic_names``).

The client here is a raw one that fetches by id through the sidecar with no Metadata
first, as a Kafka 4 consumer does on a sidecar other than the one it bootstrapped at.
"""

from __future__ import annotations

import time

import pytest
from prometheus_client import generate_latest

from kproxy.observers.capture import CaptureConfig
from kproxy.observers.live import ViewerFilter
from kproxy.protocol import Struct, Uuid
from tests.observers.captures import read_jsonl
from tests.proxy.harness import ProxyThread, wait_for
from tests.proxy.wire import FETCH, METADATA, RawClient, create_topic

FETCH_BY_ID_VERSION = 13
METADATA_BY_ID_VERSION = 12
LEARN_TIMEOUT_S = 20.0       # a question of kproxy's own, on a loaded machine


def topic_id_of(bootstrap: str, topic: str) -> Uuid:
    """The topic's id, asked of the broker directly (not through the sidecar)."""
    client = RawClient(bootstrap)
    try:
        response = client.roundtrip(METADATA, METADATA_BY_ID_VERSION,
                                    topics=[Struct(topic_id=Uuid(bytes(16)), name=topic)])
    finally:
        client.close()
    (answer,) = response.body.topics
    assert answer.error_code == 0 and any(answer.topic_id)
    return answer.topic_id


def fetch_by_id(client: RawClient, topic_id: Uuid):
    partition = Struct(partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                       log_start_offset=-1, partition_max_bytes=1 << 20)
    response = client.roundtrip(FETCH, FETCH_BY_ID_VERSION, max_wait_ms=50, min_bytes=1,
                                max_bytes=1 << 20,
                                topics=[Struct(topic_id=topic_id, partitions=[partition])])
    assert response.body.error_code == 0
    return response


def _on_loop(function, *args):
    async def call():
        return function(*args)
    return call()


def scrape(proxy: ProxyThread) -> str:
    """The proxy's /metrics text (the lag gauge carries the topic label)."""
    return generate_latest(proxy.runtime.metrics.registry).decode()


@pytest.mark.parametrize("lookup", [True, False], ids=["lookup", "no-lookup"])
def test_a_sidecar_names_a_topic_fetched_by_id_before_any_metadata(kafka_cluster, kproxy_log,
                                                                  tmp_path, lookup):
    topic = create_topic(kafka_cluster.bootstrap_servers)
    topic_id = topic_id_of(kafka_cluster.bootstrap_servers, topic)
    with ProxyThread(mode="sidecar", broker_port_rule="fixed", upstream=kafka_cluster.bootstrap_servers,
                     shutdown_timeout=5.0,
                     metrics_topic_label=True, topic_id_lookup=lookup) as proxy:
        proxy.runtime.capture.start(CaptureConfig(directory=str(tmp_path), formats=("jsonl",)))
        live = proxy.runtime.live
        viewer = proxy.call(_on_loop(live.add_viewer, ViewerFilter({"apis": "Fetch"}).compile()))
        client = RawClient(proxy.bootstrap)
        try:
            fetch_by_id(client, topic_id)
            named = f'topic="{topic}"'
            deadline = time.monotonic() + (LEARN_TIMEOUT_S if lookup else 1.0)
            while named not in scrape(proxy) and time.monotonic() < deadline:
                time.sleep(0.05)
            metrics = scrape(proxy)
            fetch_by_id(client, topic_id)           # after the answer: its row names the topic
            deadline = time.monotonic() + LEARN_TIMEOUT_S
            while len(viewer.backlog) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            live_rows = proxy.call(_on_loop(viewer.take))
        finally:
            client.close()
            proxy.runtime.capture.stop()
    fetches = [r for r in read_jsonl(tmp_path) if r["api_name"] == "Fetch"]
    assert len(fetches) == 2
    if lookup:
        # The first fetch's row may carry the id (its pair can reach the writer first); the
        # second comes after the name is known.
        assert fetches[-1]["topics"] == [topic]
        assert fetches[-1]["topic_ids"] == [{"topic_id": str(topic_id), "topic": topic}]
        assert live_rows[-1]["topics"] == [topic]                  # the live page's row too
        assert all(r["topics"] in ([topic], [str(topic_id)]) for r in fetches)
        assert named in metrics and str(topic_id) not in metrics
        assert proxy.runtime.proxy.topic_names.questions == 1     # one question, however many fetches
    else:
        assert [r["topics"] for r in fetches] == [[str(topic_id)]] * 2
        assert [r["topics"] for r in live_rows] == [[str(topic_id)]] * 2
        assert named not in metrics and f'topic="{topic_id}"' in metrics


RECORDS = 5


def topic_bytes(proxy: ProxyThread, metric: str) -> dict[str, float]:
    """topic label -> value of ``metric`` (a per-topic byte counter)."""
    from prometheus_client.parser import text_string_to_metric_families
    return {s.labels["topic"]: s.value for f in text_string_to_metric_families(scrape(proxy))
            for s in f.samples if s.name == metric}


def test_bytes_counted_under_a_topic_id_move_to_its_name_once_known(kafka_cluster, kproxy_log):
    """Fetched by id before any Metadata: counted under the id; a Metadata answer naming the
    topic then moves those bytes to the name, and the id's series goes."""
    from confluent_kafka import Producer
    topic = create_topic(kafka_cluster.bootstrap_servers)
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers})
    for i in range(RECORDS):
        producer.produce(topic, b"v" * 100 + bytes([i]))
    assert producer.flush(LEARN_TIMEOUT_S) == 0
    del producer                              # (its threads would go on trying the session broker)
    topic_id = topic_id_of(kafka_cluster.bootstrap_servers, topic)
    with ProxyThread(mode="sidecar", broker_port_rule="fixed", upstream=kafka_cluster.bootstrap_servers,
                     shutdown_timeout=5.0, metrics_topic_label=True, topic_id_lookup=False) as proxy:
        client = RawClient(proxy.bootstrap)
        try:
            fetched = fetch_by_id(client, topic_id)
            size = len(fetched.body.responses[0].partitions[0].records)
            assert size
            counted = lambda: topic_bytes(proxy, "kproxy_topic_fetched_bytes_total")   # noqa: E731
            # (observers see a pair just after its bytes are on their way: waited for)
            wait_for(lambda: counted() == {str(topic_id): size}, LEARN_TIMEOUT_S, "bytes under the id")
            client.roundtrip(METADATA, METADATA_BY_ID_VERSION, topics=[Struct(topic_id=Uuid(bytes(16)), name=topic)])
            wait_for(lambda: counted() == {topic: size}, LEARN_TIMEOUT_S, "the bytes moved to the name")
            fetch_by_id(client, topic_id)             # from now on counted under the name at once
            wait_for(lambda: counted() == {topic: 2 * size}, LEARN_TIMEOUT_S, "the next bytes under the name")
        finally:
            client.close()
