"""Client inventory, deprecated requests and group rebalances, from real clients and real Kafka.

The witnesses are the clients themselves: the software versions their own
packages report, the request version a pinned kafka-python must use, and the
assignment each consumer reports once the group has settled.
"""

from __future__ import annotations

import time

import pytest

from kproxy.embedded.kafka import tools_version
from tests.background_tool import BackgroundTool
from tests.observers.metrics import WAIT_S, sample, scrape, unique, scrape_until
from tests.proxy.harness import ProxyThread

pytestmark = pytest.mark.broker

SESSION_TIMEOUT_MS = 6000


def software_series(m) -> dict[tuple[str, str], float]:
    return {(dict(labels)["client_software_name"], dict(labels)["client_software_version"]): value
            for (name, labels), value in m.items()
            if name == "kproxy_client_software_connections" and value}


@pytest.fixture
def proxy(kafka_cluster):
    with ProxyThread(upstream=kafka_cluster.bootstrap_servers, metrics_group_label=True) as p:
        yield p


def test_inventory_names_each_client_and_its_version(proxy):
    import confluent_kafka
    import kafka
    from kafka import KafkaProducer

    topic = unique("inv")
    librdkafka = confluent_kafka.Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 0})
    librdkafka.produce(topic, b"v")
    assert librdkafka.flush(30) == 0
    python = KafkaProducer(bootstrap_servers=proxy.bootstrap)
    python.send(topic, b"v").get(timeout=30)
    try:
        m = scrape_until(lambda m: any(name == "kafka-python" for name, _ in software_series(m)),
                     "kafka-python in the inventory", proxy)
        seen = software_series(m)
        # Both clients say who they are in their own words (their packages' versions).
        ck = [(name, version) for name, version in seen if name == "confluent-kafka-python"]
        assert ck and all(version.startswith(confluent_kafka.version()[0]) for _, version in ck), seen
        assert ("kafka-python", kafka.__version__) in seen, seen
        # Every open connection is counted once: the inventory adds up to the open connections.
        open_now = sum(v for (name, _), v in m.items() if name == "kproxy_connections_open")
        assert sum(v for (name, _), v in m.items() if name == "kproxy_client_software_connections") == open_now
        assert sum(v for (name, _), v in m.items() if name == "kproxy_deprecated_requests_total") == 0
    finally:
        python.close()
        del librdkafka


def test_old_kafka_python_is_counted_as_deprecated_on_kafka_3(kafka3_cluster):
    from kafka import KafkaProducer

    topic = unique("old")
    with ProxyThread(upstream=kafka3_cluster.bootstrap_servers) as proxy:
        producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, api_version=(0, 10))
        for i in range(3):
            producer.send(topic, str(i).encode()).get(timeout=30)
        producer.close()
        m = scrape(proxy)
    produce = {dict(labels)["version"]: value for (name, labels), value in m.items()
               if name == "kproxy_request_versions_total" and dict(labels)["api"] == "Produce"}
    deprecated = {(dict(labels)["api"], dict(labels)["version"]): value for (name, labels), value in m.items()
                  if name == "kproxy_deprecated_requests_total"}
    assert set(produce) == {"2"}, produce            # a 0.10 client produces with v2, which Kafka 4 removed
    assert deprecated[("Produce", "2")] == produce["2"] >= 3
    # A pinned client skips ApiVersions: its software is unknown.
    assert sample(m, "kproxy_deprecated_requests_total", api="Produce", version="2",
                  client_software_name="unknown") == produce["2"]


def _consumer(proxy, group: str, topic: str, **extra):
    from confluent_kafka import Consumer

    config = {"bootstrap.servers": proxy.bootstrap, "group.id": group, "auto.offset.reset": "earliest"}
    if extra.get("group.protocol") != "consumer":     # KIP-848 groups take these from the broker
        config.update({"session.timeout.ms": SESSION_TIMEOUT_MS, "heartbeat.interval.ms": 500})
    consumer = Consumer({**config, **extra})
    consumer.subscribe([topic])
    return consumer


def _create_topic(proxy, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def _assigned(consumers, expected: int):
    """Poll every consumer until the partitions are spread over all of them."""
    def poll():
        for consumer in consumers:
            consumer.poll(0.1)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        poll()
        sizes = [len(c.assignment()) for c in consumers]
        if sum(sizes) == expected and all(sizes):
            return poll
    raise AssertionError(f"assignment never settled: {[c.assignment() for c in consumers]}")


def test_a_second_classic_consumer_is_a_counted_rebalance(proxy):
    group, topic = unique("grp"), unique("grp-t")
    _create_topic(proxy, topic, 4)
    first = _consumer(proxy, group, topic)
    second = None
    try:
        poll = _assigned([first], 4)
        m = scrape_until(lambda m: sample(m, "kproxy_group_rebalance_seconds_count", group=group) >= 1,
                     "the first round's duration", proxy, poll=poll)
        before = sample(m, "kproxy_group_rebalances_total", group=group, protocol="classic")
        assert before >= 1 and sample(m, "kproxy_group_members", group=group) == 1
        second = _consumer(proxy, group, topic)
        poll = _assigned([first, second], 4)
        m = scrape_until(lambda m: sample(m, "kproxy_group_members", group=group) == 2,
                     "two members", proxy, poll=poll)
        assert sample(m, "kproxy_group_rebalances_total", group=group, protocol="classic") >= before + 1
        assert sample(m, "kproxy_group_rebalance_seconds_count", group=group) >= 2
        # The first member was told to rejoin while the second joined.
        assert sample(m, "kproxy_group_rejoin_errors_total", group=group, api="Heartbeat",
                      error="REBALANCE_IN_PROGRESS") >= 1
    finally:
        for consumer in (first, second):
            if consumer is not None:
                consumer.close()


def test_a_second_kip848_consumer_bumps_the_group_epoch(proxy):
    group, topic = unique("g848"), unique("g848-t")
    _create_topic(proxy, topic, 4)
    extra = {"group.protocol": "consumer"}
    first = _consumer(proxy, group, topic, **extra)
    second = None
    try:
        poll = _assigned([first], 4)
        m = scrape_until(lambda m: sample(m, "kproxy_group_members", group=group) == 1, "one member", proxy,
                     poll=poll)
        before = sample(m, "kproxy_group_rebalances_total", group=group, protocol="consumer")
        assert before >= 1
        second = _consumer(proxy, group, topic, **extra)
        poll = _assigned([first, second], 4)
        m = scrape_until(lambda m: sample(m, "kproxy_group_members", group=group) == 2, "two members", proxy,
                     poll=poll)
        assert sample(m, "kproxy_group_rebalances_total", group=group, protocol="consumer") >= before + 1
        assert sample(m, "kproxy_group_rebalances_total", group=group, protocol="classic") == 0
    finally:
        for consumer in (first, second):
            if consumer is not None:
                consumer.close()


def test_inventory_names_the_java_client(proxy, kafka_cluster):
    """Kafka's own console consumer (kafka-clients of the broker's release), kept connected."""
    topic = unique("inv-java")
    _create_topic(proxy, topic, 1)
    # No records: it stays connected (its idle timeout only bounds it) and is stopped once seen.
    with BackgroundTool(kafka_cluster, kafka_cluster.tools.console_consumer, "--bootstrap-server",
                        proxy.bootstrap, "--topic", topic, "--timeout-ms", "90000") as consumer:
        m = scrape_until(lambda m: consumer.process.poll() is not None
                         or any(name == "apache-kafka-java" for name, _ in software_series(m)),
                         "the Java client in the inventory", proxy, timeout=90)
        java = ("apache-kafka-java", tools_version(kafka_cluster.version))     # the tools' kafka-clients
        assert java in software_series(m), (software_series(m), consumer.stderr()[-2000:])
