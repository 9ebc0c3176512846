"""kproxy in front of a real Kafka broker, driven by real clients.

The broker advertises its real address; every client bootstraps from kproxy
and must end up talking only to kproxy, and must never be handed the
broker's address.
"""

from __future__ import annotations

import struct
import time
import urllib.request
import uuid

import pytest

from kproxy.protocol.events import ResponseReceived
from tests.proxy.harness import ProxyThread, kafka_python_group_consumer

pytestmark = pytest.mark.broker



@pytest.fixture
def proxy(kafka_cluster, client_bytes):
    """Every port chosen by the OS: kproxy binds first and advertises what it bound."""
    responses = []

    def record(info, events):
        responses.extend(e for e in events if isinstance(e, ResponseReceived))

    with ProxyThread(observers=[record], upstream=kafka_cluster.bootstrap_servers) as p:
        p.responses = responses
        yield p


def served(proxy, kafka_cluster) -> set[tuple[str, int]]:
    """The broker addresses kproxy bound and advertises, one per node."""
    addresses = proxy.served_broker_addresses()
    assert len(addresses) == len(kafka_cluster.nodes)
    return addresses


def assert_no_upstream_address(kafka_cluster, client_bytes, proxy):
    stream = b"".join(client_bytes)
    for node in kafka_cluster.nodes:
        for port_bytes in (struct.pack(">i", node.port), struct.pack(">H", node.port)):
            assert node.host.encode() + port_bytes not in stream, f"upstream {node.host}:{node.port} leaked"
    # Positive control: the rewritten address is there.
    assert any(host.encode() + struct.pack(">i", port) in stream
               for host, port in served(proxy, kafka_cluster))


def test_kafka_python_produce_consume_through_kproxy(kafka_cluster, proxy, client_bytes):
    from kafka import KafkaAdminClient, KafkaProducer
    from kafka.admin import NewTopic

    topic = f"kp-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=proxy.bootstrap, client_id="e2e-admin")
    admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])
    cluster = admin.describe_cluster()
    admin.close()
    assert {(b["host"], b["port"]) for b in cluster["brokers"]} == served(proxy, kafka_cluster)

    producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, compression_type="lz4")
    sent = {f"key-{i}".encode(): f"value-{i}".encode() for i in range(200)}
    for key, value in sent.items():
        producer.send(topic, key=key, value=value)
    producer.flush()
    producer.close()

    # The iteration ends once every key came (or nothing came for 8 s, and the check fails).
    consumer = kafka_python_group_consumer(proxy.bootstrap, topic, f"g-{topic}", consumer_timeout_ms=8000)
    got = {}
    for m in consumer:
        got[m.key] = m.value
        if len(got) == len(sent):
            break
    consumer.close()
    assert got == sent

    apis = {e.request_event.api_name for e in proxy.responses}
    assert {"Metadata", "Produce", "Fetch", "FindCoordinator", "JoinGroup", "SyncGroup"} <= apis
    assert all(e.decode_error is None for e in proxy.responses)
    assert_no_upstream_address(kafka_cluster, client_bytes, proxy)


def test_confluent_kafka_sees_only_kproxy_addresses(kafka_cluster, proxy, client_bytes):
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient

    topic = f"kp-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "compression.type": "zstd",
                         "enable.idempotence": True})
    for i in range(100):
        producer.produce(topic, key=str(i), value=f"v{i}")
    assert producer.flush(30) == 0

    metadata = AdminClient({"bootstrap.servers": proxy.bootstrap}).list_topics(timeout=10)
    assert {(b.host, b.port) for b in metadata.brokers.values()} == served(proxy, kafka_cluster)

    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": f"g-{topic}",
                         "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
    consumer.subscribe([topic])
    got = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is not None and msg.error() is None:
            got.add(msg.value())

        if len(got) == 100:
            break
    consumer.close()
    assert got == {f"v{i}".encode() for i in range(100)}
    assert_no_upstream_address(kafka_cluster, client_bytes, proxy)


def test_health_and_readiness(proxy):
    with urllib.request.urlopen(proxy.admin_url + "/healthz", timeout=5) as r:
        assert r.status == 200 and r.read() == b"ok\n"
    with urllib.request.urlopen(proxy.admin_url + "/readyz", timeout=5) as r:
        assert r.status == 200
