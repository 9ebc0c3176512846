"""One Kafka broker with a KIP-714 receiver plugin, shared by this package's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kproxy.embedded import KAFKA_4_VERSION, LIGHT_BROKER_JVM_ARGS, KafkaCluster
from tests.observers.telemetry import plugin

# Pushes every second: several per test, few enough to compare push by push.
PUSH_INTERVAL_MS = 1000


@pytest.fixture(scope="session")
def telemetry_cluster(require_kafka, tmp_path_factory) -> Iterator[tuple[KafkaCluster, plugin.Receiver]]:
    """A 4.x node offering KIP-714 (the plugin), subscribing every client to its producer
    and consumer metrics; and what the plugin received."""
    require_kafka(KAFKA_4_VERSION)
    directory = tmp_path_factory.mktemp("telemetry-plugin")
    received = directory / "pushes.txt"
    classes = plugin.compile_plugin(KAFKA_4_VERSION, directory)
    with KafkaCluster(extra_config=plugin.broker_settings(received), extra_classpath=[classes],
                      jvm_args=LIGHT_BROKER_JVM_ARGS) as cluster:
        plugin.subscribe(cluster.bootstrap_servers, ["org.apache.kafka.producer.", "org.apache.kafka.consumer."],
                         PUSH_INTERVAL_MS)
        yield cluster, plugin.Receiver(received)
