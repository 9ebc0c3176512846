"""Capture rows from a Kafka topic: ``kafka://BOOTSTRAP/TOPIC``.

kproxies capturing with ``formats = ["kafka"]`` ship each row as one JSON
message (``observers/capture/kafka_sink.py``). Spark's own Kafka source reads
the topic, in batch (every row from the earliest offset to the latest now) or
as a stream (``--follow``: new rows as they are acknowledged); the message
values parse with the capture schema, as a JSONL file's lines do, so the
tables cannot tell a topic from files. The connector's jars: ``kafka_jars``.

``kafka://host1:9092,host2:9092/kproxy-capture?security.protocol=SSL&ssl.truststore.location=...``:
the query string's settings go to Kafka's Java client as they are (``kafka.`` prefixed
for Spark), for a cluster that needs TLS or SASL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlparse

from .source import _TIME_COLUMNS, InputError, Inputs, spark_schema

SCHEME = "kafka"
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
# A catch-up micro-batch of --follow reads at most this many rows (a few hundred MB of
# JSON at most): bounded memory and a progress line while catching up.
MAX_ROWS_PER_TRIGGER = 500_000


@dataclass(frozen=True)
class KafkaInput:
    """One topic of capture rows, and the Kafka client settings to reach it."""
    bootstrap: str
    topic: str
    client_settings: tuple[tuple[str, str], ...] = ()

    @property
    def uri(self) -> str:
        return f"{SCHEME}://{self.bootstrap}/{self.topic}"

    def options(self) -> dict[str, str]:
        """Spark Kafka source options: the topic from its first offset, the client's settings."""
        out = {"kafka.bootstrap.servers": self.bootstrap, "subscribe": self.topic,
               "startingOffsets": "earliest"}
        out.update((f"kafka.{key}", value) for key, value in self.client_settings)
        return out


def is_kafka(path: str) -> bool:
    return path.startswith(f"{SCHEME}://")


def parse(text: str) -> KafkaInput:
    """``kafka://HOST:PORT[,HOST:PORT...]/TOPIC[?setting=value&...]``, or InputError saying why not."""
    url = urlparse(text)
    topic = url.path.strip("/")
    if url.scheme != SCHEME or not url.netloc or not _TOPIC.fullmatch(topic):
        raise InputError(f"{text}: expected kafka://HOST:PORT[,HOST:PORT...]/TOPIC")
    for server in url.netloc.split(","):
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit():
            raise InputError(f"{text}: {server!r} is not HOST:PORT")
    return KafkaInput(url.netloc, topic, tuple(parse_qsl(url.query)))


def one_input(paths: list[str]) -> KafkaInput:
    """The one topic a run reads: a topic cannot be mixed with files or other topics."""
    if len(paths) != 1:
        raise InputError("give one kafka:// topic per run, without other paths")
    return parse(paths[0])


def rows(messages):
    """Kafka records (Spark's key/value/... columns) → capture rows of the newest schema."""
    from pyspark.sql import functions as F
    parsed = messages.select(F.from_json(F.col("value").cast("string"), spark_schema(for_json=True),
                                         {"mode": "PERMISSIVE"}).alias("row")).select("row.*")
    for name in _TIME_COLUMNS:
        parsed = parsed.withColumn(name, F.col(name).cast("timestamp"))
    return parsed.where(F.col("capture_version").isNotNull())      # not a capture row: left out


def read(spark, paths: list[str]):
    """(Inputs, raw capture rows) of the topic as it is now: earliest to latest offsets."""
    source = one_input(paths)
    reader = spark.read.format("kafka").options(**source.options()).option("endingOffsets", "latest")
    raw = rows(reader.load())
    if raw.isEmpty():
        raise InputError(f"{source.uri} holds no capture rows")
    return Inputs((source.uri,), "kafka"), raw


def read_stream(spark, location: str):
    """Capture rows as a stream: from the earliest offset the first time, then where the
    checkpoint says; at most MAX_ROWS_PER_TRIGGER per micro-batch."""
    source = parse(location)
    reader = (spark.readStream.format("kafka").options(**source.options())
              .option("maxOffsetsPerTrigger", MAX_ROWS_PER_TRIGGER))
    return rows(reader.load())
