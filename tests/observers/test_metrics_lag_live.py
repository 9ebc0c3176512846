"""Consumer lag from the wire, checked against the broker's own end offsets.

The witness is the broker: ListOffsets (latest) through the consumer itself,
minus the consumer's position, is the lag kproxy must show.
"""

from __future__ import annotations

import pytest

from tests.observers.metrics import sample, unique, scrape_until
from tests.proxy.harness import ProxyThread

pytestmark = pytest.mark.broker

LAG = "kproxy_consumer_lag_records"
FIRST, SECOND = 30, 45           # records read before the pause, records written during it


@pytest.fixture
def proxy(kafka_cluster):
    with ProxyThread(upstream=kafka_cluster.bootstrap_servers, metrics_topic_label=True,
                     metrics_client_id_label=True) as p:
        yield p


def test_a_paused_consumer_that_never_commits_shows_the_brokers_lag(proxy):
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic, client_id = unique("lag"), unique("reader")
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 50})
    for i in range(FIRST):
        producer.produce(topic, b"x%d" % i, partition=0)
    assert producer.flush(30) == 0
    # No group, no commits: only its fetches say where it is. queued.min.messages=1 makes
    # librdkafka fetch only when its local queue is empty, so once the application stops
    # polling, the consumer stops fetching where the application stopped.
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": unique("unused"),
                         "client.id": client_id, "enable.auto.commit": False,
                         "queued.min.messages": 1, "session.timeout.ms": 6000,
                         "fetch.wait.max.ms": 100})
    partition = TopicPartition(topic, 0, 0)
    consumer.assign([partition])
    try:
        read = 0
        while read < FIRST:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                read += 1
        # Caught up: its next fetch asks for offset FIRST, and kproxy sees no lag.
        scrape_until(lambda m: sample(m, LAG, client_id=client_id, topic=topic) == 0
                 and (LAG, (("client_id", client_id), ("topic", topic))) in m,
                 "the caught-up consumer's fetch", proxy)
        # Paused (no more polls) while the topic grows by one produce request.
        for i in range(SECOND):
            producer.produce(topic, b"y%d" % i, partition=0)
        assert producer.flush(30) == 0
        _, latest = consumer.get_watermark_offsets(partition, timeout=10, cached=False)
        position = consumer.position([partition])[0].offset
        assert (latest, position) == (FIRST + SECOND, FIRST)      # the broker's view, the consumer's
        m = scrape_until(lambda m: sample(m, LAG, client_id=client_id, topic=topic) == latest - position,
                     f"lag {latest - position}", proxy)
        assert sample(m, LAG, client_id=client_id, topic=topic) == SECOND
    finally:
        consumer.close()
    # Its connections closed: it is behind no more, as far as kproxy knows.
    scrape_until(lambda m: sample(m, LAG, client_id=client_id, topic=topic) == 0, "no lag once closed", proxy)
