"""A minimal KIP-714 receiver for a real broker: a ``metric.reporters`` class implementing
``ClientTelemetry``, compiled from a few lines of Java against the Kafka jars.

The broker offers GetTelemetrySubscriptions/PushTelemetry only when such a plugin is
installed; this one appends each push it is handed (client instance id, terminating
flag, the payload as the broker decompressed it, base64) as one line to a file, so a
test can compare what kproxy exported with what the broker received.
"""

from __future__ import annotations

import base64
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from kproxy.embedded import kafka

CLASS_NAME = "KproxyTestTelemetryReceiver"
# The broker passes a reporter its own configs: this one names the file to write.
FILE_CONFIG = "kproxy.test.telemetry.file"

SOURCE = """
import java.io.FileWriter;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import org.apache.kafka.common.metrics.KafkaMetric;
import org.apache.kafka.common.metrics.MetricsReporter;
import org.apache.kafka.server.telemetry.ClientTelemetry;
import org.apache.kafka.server.telemetry.ClientTelemetryReceiver;

public class %(name)s implements MetricsReporter, ClientTelemetry {
    private String file;
    public void configure(Map<String, ?> configs) { file = String.valueOf(configs.get("%(key)s")); }
    public void init(List<KafkaMetric> metrics) {}
    public void metricChange(KafkaMetric metric) {}
    public void metricRemoval(KafkaMetric metric) {}
    public void close() {}
    public ClientTelemetryReceiver clientReceiver() {
        return (context, payload) -> {
            ByteBuffer data = payload.data().duplicate();
            byte[] bytes = new byte[data.remaining()];
            data.get(bytes);
            String line = payload.clientInstanceId() + " " + payload.isTerminating() + " "
                + Base64.getEncoder().encodeToString(bytes) + "\\n";
            synchronized (this) {
                try (FileWriter out = new FileWriter(file, true)) { out.write(line); }
                catch (IOException e) { throw new RuntimeException(e); }
            }
        };
    }
}
""" % {"name": CLASS_NAME, "key": FILE_CONFIG}


@dataclass(frozen=True)
class Push:
    client_instance_id: uuid.UUID
    terminating: bool
    payload: bytes            # OTLP MetricsData, uncompressed


def compile_plugin(version: str, directory: Path) -> Path:
    """Compile the receiver into ``directory``; the classpath entry to give the broker."""
    home = kafka.fetch_kafka(version)
    source = directory / f"{CLASS_NAME}.java"
    source.write_text(SOURCE)
    javac = Path(kafka.java_executable()).with_name("javac")
    subprocess.run([str(javac), "-cp", f"{home / 'lib'}/*", "-d", str(directory), str(source)],
                   check=True, capture_output=True, text=True, timeout=120)
    return directory


def broker_settings(received: Path) -> dict[str, str]:
    return {"metric.reporters": CLASS_NAME, FILE_CONFIG: str(received)}


def subscribe(bootstrap: str, prefixes: list[str], interval_ms: int) -> None:
    """Subscribe every client (client-metrics resource "all") to metrics named with these prefixes."""
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        result = admin.alter_configs([ConfigResource(ConfigResourceType.CLIENT_METRICS, "all", configs={
            "metrics": ",".join(prefixes), "interval.ms": str(interval_ms)})])
        outcomes = [r for by_name in result.values() for r in by_name.values()]
        assert outcomes and all(getattr(r, "errno", 0) == 0 for r in outcomes), result
    finally:
        admin.close()


@dataclass(frozen=True)
class Receiver:
    """The file the plugin writes."""
    path: Path

    def pushes(self, instance: uuid.UUID | None = None) -> list[Push]:
        return [p for p in read_pushes(self.path) if instance is None or p.client_instance_id == instance]


def read_pushes(received: Path) -> list[Push]:
    if not received.exists():
        return []
    pushes = []
    text = received.read_text()
    for line in text[:text.rfind("\n") + 1].splitlines():     # not a line being written
        instance, terminating, data = line.split(" ")
        pushes.append(Push(uuid.UUID(_java_uuid_hex(instance)), terminating == "true",
                           base64.b64decode(data)))
    return pushes


def _java_uuid_hex(text: str) -> str:
    """Kafka's ``Uuid.toString`` is URL-safe base64 of the 16 bytes, unpadded."""
    return base64.urlsafe_b64decode(text + "==").hex()
