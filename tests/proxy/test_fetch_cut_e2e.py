"""A consumer through kproxy in front of a real Kafka: Fetch answers of hundreds of KiB, whose
records pass to the client as they arrive (``protocol/fetch_cut.py``), over plaintext and
TLS, reach it intact and in order, and no broker address with them. How much of an answer
passes early depends on how the broker's bytes fall into reads (an answer one read brought
whole has nothing to pass early): ``tests/protocol/test_fetch_cut.py`` and
``test_relay_buffers.py`` show that part read by read."""

from __future__ import annotations

import os
import struct
import time
import uuid

import pytest

from tests.proxy.harness import ssl_config
from tests.proxy.wire import create_topic

pytestmark = pytest.mark.broker

RECORDS = 3000
RECORD_BYTES = 1024           # incompressible: ~3 MiB, Fetch answers of up to 1 MiB (held: v16+)
CONSUME_TIMEOUT_S = 60.0


def produce(bootstrap: str, topic: str) -> list[bytes]:
    from confluent_kafka import Producer
    values = [i.to_bytes(4, "big") + os.urandom(RECORD_BYTES - 4) for i in range(RECORDS)]
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for value in values:
        producer.produce(topic, value)
    assert producer.flush(30) == 0
    return values


def consume(settings: dict, topic: str, count: int) -> list[bytes]:
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"group.id": f"g-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False, **settings})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + CONSUME_TIMEOUT_S
    try:
        while len(got) < count and time.monotonic() < deadline:
            for message in consumer.consume(min(500, count - len(got)), 1.0):
                assert message.error() is None, message.error()
                got.append(message.value())
    finally:
        consumer.close()
    return got


def test_every_record_reaches_the_consumer_intact_and_no_broker_address(kafka_cluster, start_proxy,
                                                                       client_bytes):
    topic = create_topic(kafka_cluster.bootstrap_servers)
    values = produce(kafka_cluster.bootstrap_servers, topic)
    proxy = start_proxy()
    assert consume({"bootstrap.servers": proxy.bootstrap}, topic, RECORDS) == values
    stream = b"".join(client_bytes)                                 # the held tails, rewritten
    for node in kafka_cluster.nodes:
        assert node.host.encode() + struct.pack(">i", node.port) not in stream


def test_over_tls_on_both_sides_too(tls_cluster, pki, start_proxy):
    plaintext = tls_cluster.internal_bootstrap_servers               # the broker's own listener
    topic = create_topic(plaintext)
    values = produce(plaintext, topic)
    proxy = start_proxy(upstream=tls_cluster.bootstrap_servers,
                        tls_client={"ca_file": str(pki.ca), "cert_file": str(pki.client.cert),
                                    "key_file": str(pki.client.key)},
                        tls_server={"cert_file": str(pki.server.cert), "key_file": str(pki.server.key)})
    assert consume(ssl_config(proxy, pki), topic, RECORDS) == values
