"""The embedded brokers really serve Kafka clients: Python clients, Kafka's own Java tools,
multi-node clusters, advertised-address overrides and node restarts.

Clusters are shared (the session fixtures, ``cluster3`` for three nodes) because a KRaft
start costs 5-15 s on 2 cores.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer

from kproxy.embedded import (
    KAFKA_4_VERSION,
    KafkaCluster,
    KafkaToolError,
    TansuBroker,
    fetch_kafka,
    is_fetched,
    metadata_brokers,
    run_tool,
)

pytestmark = pytest.mark.broker

MESSAGES = 50

# Consumers: a short session so a group forms and dissolves quickly (the brief's 6 s).
SESSION_TIMEOUT_MS = 6000

# Upper bound for a produce/consume round trip including group join; normally ~3-5 s.
ROUND_TRIP_TIMEOUT_S = 60.0

# Client-side admin calls against a loopback cluster.
ADMIN_TIMEOUT_S = 30.0


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _payloads(count: int = MESSAGES) -> list[bytes]:
    return [f"message-{i}".encode() for i in range(count)]


def _confluent_round_trip(bootstrap: str, topic: str, consumer_config: dict[str, object]) -> list[bytes]:
    producer = Producer({"bootstrap.servers": bootstrap})
    for payload in _payloads():
        producer.produce(topic, payload)
    assert producer.flush(ROUND_TRIP_TIMEOUT_S) == 0, "messages left unsent"
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": _topic("group"),
            "auto.offset.reset": "earliest",
            **consumer_config,
        }
    )
    received: list[bytes] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + ROUND_TRIP_TIMEOUT_S
        while len(received) < MESSAGES and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            value = message.value()
            assert value is not None
            received.append(value)
    finally:
        consumer.close()
    return received


@pytest.mark.parametrize(
    "consumer_config",
    [
        pytest.param({"session.timeout.ms": SESSION_TIMEOUT_MS}, id="classic"),
        # KIP-848: on by default in 4.x brokers; the session timeout is then set broker-side.
        pytest.param({"group.protocol": "consumer"}, id="kip848"),
    ],
)
def test_kafka4_round_trip_confluent(kafka_cluster: KafkaCluster, consumer_config: dict[str, object]) -> None:
    assert kafka_cluster.version == KAFKA_4_VERSION
    received = _confluent_round_trip(kafka_cluster.bootstrap_servers, _topic("confluent"), consumer_config)
    assert received == _payloads()


def test_kafka3_round_trip_kafka_python(kafka3_cluster: KafkaCluster) -> None:
    topic = _topic("kafka-python")
    producer = KafkaProducer(bootstrap_servers=kafka3_cluster.bootstrap_servers)
    for payload in _payloads():
        producer.send(topic, payload)
    producer.flush(timeout=ROUND_TRIP_TIMEOUT_S)
    producer.close()
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=kafka3_cluster.bootstrap_servers,
        group_id=_topic("group"),
        auto_offset_reset="earliest",
        session_timeout_ms=SESSION_TIMEOUT_MS,
        consumer_timeout_ms=int(ROUND_TRIP_TIMEOUT_S * 1000),
    )
    received = []
    try:
        for record in consumer:
            received.append(record.value)
            if len(received) == MESSAGES:
                break
    finally:
        consumer.close()
    assert received == _payloads()


@pytest.fixture(params=[
    # Soak only for 4.x: tests/proxy/test_client_matrix.py::test_java_tools runs the same
    # tools (topics --create, console producer, console consumer in a group, consumer-groups
    # --describe) of the same session broker through run_tool, and checks their output.
    pytest.param("kafka_cluster", id="kafka4", marks=pytest.mark.soak),
    pytest.param("kafka3_cluster", id="kafka3"),
])
def any_kafka(request: pytest.FixtureRequest) -> KafkaCluster:
    """Each session cluster in turn: the tool class names differ between 3.x and 4.x."""
    cluster: KafkaCluster = request.getfixturevalue(request.param)
    return cluster


def test_console_tools_move_messages(any_kafka: KafkaCluster) -> None:
    tools, bootstrap = any_kafka.tools, any_kafka.bootstrap_servers
    topic, group = _topic("console"), _topic("console-group")
    lines = [f"line-{i}" for i in range(MESSAGES)]

    created = run_tool(any_kafka, tools.topics, "--bootstrap-server", bootstrap, "--create", "--topic", topic)
    assert f"Created topic {topic}" in created.stdout
    run_tool(
        any_kafka,
        tools.console_producer,
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        input="\n".join(lines) + "\n",
    )
    consumed = run_tool(
        any_kafka,
        tools.console_consumer,
        "--bootstrap-server", bootstrap,
        "--topic", topic,
        "--group", group,
        "--from-beginning",
        "--max-messages", str(MESSAGES),
        "--timeout-ms", str(int(ROUND_TRIP_TIMEOUT_S * 1000)),
    )  # fmt: skip
    assert consumed.stdout.splitlines() == lines
    described = run_tool(
        any_kafka, tools.consumer_groups, "--bootstrap-server", bootstrap, "--describe", "--group", group
    )
    assert group in described.stdout and topic in described.stdout


def test_perf_tools_run(kafka3_cluster: KafkaCluster) -> None:
    """3.x's perf tools (their class names and flags differ from 4.x's). 4.x's run in
    tests/proxy/test_client_matrix.py::test_java_tools on the same session broker, through
    kproxy, with the same checks (N records sent, N consumed) on ten times the records."""
    tools, bootstrap = kafka3_cluster.tools, kafka3_cluster.bootstrap_servers
    topic, records = _topic("perf"), 2000
    produced = run_tool(
        kafka3_cluster,
        tools.producer_perf,
        "--topic", topic,
        "--num-records", str(records),
        "--record-size", "100",
        "--throughput", "-1",
        "--producer-props", f"bootstrap.servers={bootstrap}",  # deprecated in 4.3, still accepted
    )  # fmt: skip
    assert f"{records} records sent" in produced.stdout
    consumed = run_tool(
        kafka3_cluster,
        tools.consumer_perf,
        "--bootstrap-server", bootstrap,
        "--topic", topic,
        "--messages", str(records),  # deprecated in 4.x for --num-records, which 3.9 lacks
        "--timeout", str(int(ROUND_TRIP_TIMEOUT_S * 1000)),
    )  # fmt: skip
    header, result = consumed.stdout.strip().splitlines()[-2:]
    assert int(dict(zip(header.split(", "), result.split(", "), strict=True))["data.consumed.in.nMsg"]) == records


def test_tool_failure_carries_its_output(kafka_cluster: KafkaCluster) -> None:
    with pytest.raises(KafkaToolError) as failure:
        run_tool(
            kafka_cluster,
            kafka_cluster.tools.topics,
            "--bootstrap-server",
            kafka_cluster.bootstrap_servers,
            "--no-such-option",
        )
    assert failure.value.returncode != 0
    assert "no-such-option" in str(failure.value)


def test_fetch_is_idempotent(kafka_cluster: KafkaCluster) -> None:
    assert is_fetched(kafka_cluster.version)
    started = time.monotonic()
    home = fetch_kafka(kafka_cluster.version)
    assert time.monotonic() - started < 1.0, "a fetched version must not run Maven again"
    assert (home / "lib").is_dir() and (home / "tools-lib").is_dir()


def test_three_nodes_form_one_cluster(cluster3: KafkaCluster) -> None:
    admin = AdminClient({"bootstrap.servers": cluster3.bootstrap_servers})
    description = admin.describe_cluster().result(ADMIN_TIMEOUT_S)
    assert sorted(node.id for node in description.nodes) == [1, 2, 3]
    assert {(node.host, node.port) for node in description.nodes} == {(n.host, n.port) for n in cluster3.nodes}

    topic = _topic("replicated")
    admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=3)])[topic].result(ADMIN_TIMEOUT_S)
    received = _confluent_round_trip(cluster3.bootstrap_servers, topic, {"session.timeout.ms": SESSION_TIMEOUT_MS})
    assert sorted(received) == sorted(_payloads())


# Soak only: the default suite stops and starts a cluster3 node through this same API in
# tests/proxy/test_cluster.py (gateway across a broker restart), asserting the cluster
# serves again afterwards; this one costs 13 s more.
@pytest.mark.soak
def test_stop_and_start_node(cluster3: KafkaCluster) -> None:
    first = cluster3.nodes[0]
    cluster3.stop_node(3)
    try:
        assert cluster3.running_node_ids() == [1, 2]
        assert sorted(b.node_id for b in metadata_brokers(first.host, first.port)) == [1, 2]
    finally:
        cluster3.start_node(3)
    assert cluster3.running_node_ids() == [1, 2, 3]
    assert sorted(b.node_id for b in metadata_brokers(first.host, first.port)) == [1, 2, 3]


def test_unreachable_advertised_address(make_kafka_cluster: Callable[..., KafkaCluster]) -> None:
    """A broker can advertise a relay that does not exist yet: start-up probes the INTERNAL
    listener, and the CLIENT listener hands out the override (here a function of the node
    id and the port it listens on)."""
    cluster = make_kafka_cluster(advertised=lambda node_id, port: f"relay{node_id}.invalid:{port + 1}")
    (node,) = cluster.nodes
    assert metadata_brokers(node.host, node.port) == [(1, "relay1.invalid", node.port + 1)]
    internal_host, internal_port = cluster.internal_bootstrap_servers.split(":")
    assert metadata_brokers(internal_host, int(internal_port)) == [(1, internal_host, int(internal_port))]

    workdir = cluster.workdir
    cluster.stop()
    assert not workdir.exists(), "a temporary workdir is removed by stop()"


def test_tansu_serves_clients(tansu_broker: TansuBroker) -> None:
    host, port = tansu_broker.bootstrap_servers.split(":")
    assert metadata_brokers(host, int(port)) == [(111, host, int(port))]
    received = _confluent_round_trip(
        tansu_broker.bootstrap_servers, _topic("tansu"), {"session.timeout.ms": SESSION_TIMEOUT_MS}
    )
    assert sorted(received) == sorted(_payloads())  # Tansu auto-creates several partitions


def test_tansu_advertised_override(tansu_broker: TansuBroker) -> None:
    """(The session broker is requested for its availability check and skip rule.)"""
    with TansuBroker(advertised="relay.invalid:19092") as broker:
        assert broker.metadata_brokers() == [(111, "relay.invalid", 19092)]
