"""Capture rows shipped to a Kafka topic: many kproxies, one dataset.

``KafkaTarget`` is the operator's ``capture.kafka`` table: a cluster reached
directly (never through the kproxy that captures, which would capture its own
shipping), a topic, batching and security. ``KafkaSink`` runs in the capture's
writer thread beside the file sinks: each row becomes one JSON message (the
Parquet columns of ``SCHEMA.md``, times as ISO 8601 UTC, as a JSONL line
without bodies) keyed by ``proxy_instance``, so one instance's rows stay in
order within a partition.

Why librdkafka (confluent-kafka, the ``ship`` extra): it batches, compresses,
retries and de-duplicates retries (idempotence) in its own threads, with a
bounded queue; none of that is worth writing again. Kept optional because most
kproxies write files only.

What is counted, each on the capture (written by the writer thread only:
delivery reports are served by its ``poll`` and ``flush`` calls):

- ``rows_shipped``: rows the cluster acknowledged (acks=all): these are safe
  whatever happens to this kproxy afterwards.
- ``ship_dropped``: rows refused because the producer's queue was full (the
  cluster is slow or away); the writer never waits for the cluster.
- ``ship_failed``: rows the cluster did not take: a delivery error, or still
  unacknowledged when the capture stopped and ``flush_timeout_seconds`` ran out.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from .jsonl import json_form

log = logging.getLogger("kproxy.capture")

COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")
SECURITY_PROTOCOLS = ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# Kafka's own rule for topic names (kafka.common.internals.Topic).
TOPIC_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,249}")
BOOTSTRAP_PATTERN = re.compile(r"[^\s,/]+:\d{1,5}(,[^\s,/]+:\d{1,5})*")
# Rows wait this long to fill a batch: a sidecar's capture is a trickle, and one
# compressed batch per 200 ms costs the cluster little and the reader little lag.
DEFAULT_LINGER_MS = 200
# The producer's queue (rows and bytes): past either, rows are dropped and counted.
# About a minute of a busy sidecar's rows (~1 KiB of JSON each) while the cluster is away.
DEFAULT_QUEUE_ROWS = 100_000
DEFAULT_QUEUE_BYTES = 64 * 1024 * 1024
# When the capture stops (kproxy shutting down), rows still queued get this long to be
# acknowledged; inside the capture's own stop timeout (30 s) and Kubernetes' 30 s grace.
DEFAULT_FLUSH_TIMEOUT_S = 10.0
# Bounds: beyond these a value is a typo (the queue's memory is kproxy's).
MAX_LINGER_MS = 60_000
MAX_QUEUE_ROWS = 10_000_000
MAX_QUEUE_BYTES = 1024 ** 3
MAX_FLUSH_TIMEOUT_S = 300.0
# librdkafka counts its queue in KiB.
_KIB = 1024


@dataclass(frozen=True)
class KafkaTarget:
    """Where capture rows are shipped: ``capture.kafka`` (config file or KPROXY_CAPTURE only)."""

    bootstrap: str
    topic: str
    compression: str = "zstd"
    linger_ms: int = DEFAULT_LINGER_MS
    queue_max_rows: int = DEFAULT_QUEUE_ROWS
    queue_max_bytes: int = DEFAULT_QUEUE_BYTES
    flush_timeout_seconds: float = DEFAULT_FLUSH_TIMEOUT_S
    security_protocol: str = "plaintext"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password_file: str | None = None     # the password is read at start, never kept in settings
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, key: str = "capture.kafka") -> None:
        if not isinstance(self.bootstrap, str) or not BOOTSTRAP_PATTERN.fullmatch(self.bootstrap):
            raise ValueError(f"{key}.bootstrap: expected HOST:PORT[,HOST:PORT...], got {self.bootstrap!r}")
        if not isinstance(self.topic, str) or not TOPIC_PATTERN.fullmatch(self.topic) \
                or self.topic in (".", ".."):
            raise ValueError(f"{key}.topic: 1-249 letters, digits, '.', '_' or '-', got {self.topic!r}")
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"{key}.compression: one of {', '.join(COMPRESSIONS)}, got {self.compression!r}")
        for name, lowest, highest in (("linger_ms", 0, MAX_LINGER_MS), ("queue_max_rows", 1, MAX_QUEUE_ROWS),
                                      ("queue_max_bytes", _KIB, MAX_QUEUE_BYTES),
                                      ("flush_timeout_seconds", 0, MAX_FLUSH_TIMEOUT_S)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not lowest <= value <= highest:
                raise ValueError(f"{key}.{name}: expected a number from {lowest} to {highest}, got {value!r}")
        if self.security_protocol not in SECURITY_PROTOCOLS:
            raise ValueError(f"{key}.security_protocol: one of {', '.join(SECURITY_PROTOCOLS)}, "
                             f"got {self.security_protocol!r}")
        sasl = self.security_protocol.startswith("sasl")
        if sasl and (self.sasl_mechanism not in SASL_MECHANISMS or not self.sasl_username
                     or not self.sasl_password_file):
            raise ValueError(f"{key}: security_protocol {self.security_protocol} needs sasl_mechanism "
                             f"({', '.join(SASL_MECHANISMS)}), sasl_username and sasl_password_file")
        if not sasl and any((self.sasl_mechanism, self.sasl_username, self.sasl_password_file)):
            raise ValueError(f"{key}: sasl_* settings need security_protocol sasl_plaintext or sasl_ssl")
        tls = self.security_protocol.endswith("ssl")
        if not tls and any((self.ca_file, self.cert_file, self.key_file)):
            raise ValueError(f"{key}: ca_file, cert_file and key_file need security_protocol ssl or sasl_ssl")
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError(f"{key}: cert_file and key_file go together")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], key: str = "capture.kafka") -> "KafkaTarget":
        from ...spelling import check_table
        check_table(data, {f.name for f in fields(cls)}, key)
        for required in ("bootstrap", "topic"):
            if not data.get(required):
                raise ValueError(f"{key}.{required}: required")
        values = {name: value for name, value in data.items() if value is not None}
        if "security_protocol" in values:
            values["security_protocol"] = str(values["security_protocol"]).lower()
        if "sasl_mechanism" in values:
            values["sasl_mechanism"] = str(values["sasl_mechanism"]).upper()
        for name in ("linger_ms", "queue_max_rows", "queue_max_bytes"):
            if isinstance(values.get(name), str) and values[name].strip().isdigit():
                values[name] = int(values[name])
        if isinstance(values.get("flush_timeout_seconds"), str):
            try:
                values["flush_timeout_seconds"] = float(values["flush_timeout_seconds"])
            except ValueError:
                pass                                   # validate() names it
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def producer_settings(self) -> dict[str, Any]:
        """librdkafka settings: acknowledged by every in-sync replica, retries without duplicates."""
        settings: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "client.id": "kproxy-capture",
            "acks": "all",
            "enable.idempotence": True,
            "compression.type": self.compression,
            "linger.ms": self.linger_ms,
            "queue.buffering.max.messages": self.queue_max_rows,
            "queue.buffering.max.kbytes": max(self.queue_max_bytes // _KIB, 1),
            "security.protocol": self.security_protocol,
        }
        if self.sasl_mechanism:
            with open(self.sasl_password_file, encoding="utf-8") as f:
                password = f.read().strip()
            settings.update({"sasl.mechanism": self.sasl_mechanism, "sasl.username": self.sasl_username,
                             "sasl.password": password})
        for name, setting in (("ca_file", "ssl.ca.location"), ("cert_file", "ssl.certificate.location"),
                              ("key_file", "ssl.key.location")):
            if getattr(self, name):
                settings[setting] = getattr(self, name)
        return settings


def row_message(row: dict) -> bytes:
    """A row as a message value: its JSONL form without the decoded bodies."""
    out = json_form(row)
    out.pop("request", None)
    out.pop("response", None)
    return json.dumps(out, ensure_ascii=True, separators=(",", ":"), default=str).encode()


class KafkaSink:
    """The capture's Kafka producer, driven by the writer thread (``write``, ``tick``, ``close``)."""

    ext = "kafka"                 # how the writer's status names this sink
    path = None                   # no file: status shows the topic instead

    def __init__(self, target: KafkaTarget, counters):
        self.target = target
        self.counters = counters
        self.producer = None

    def open(self) -> None:
        """Create the producer (in the caller's thread, so a missing library fails start())."""
        try:
            from confluent_kafka import Producer
        except ImportError:
            raise OSError("capture.kafka needs confluent-kafka: pip install 'kproxy-kafka[ship]'") from None
        try:
            self.producer = Producer(self.target.producer_settings(), logger=log)
        except Exception as exc:          # noqa: BLE001 - KafkaException for a setting librdkafka refuses
            raise OSError(f"capture.kafka: {exc}") from None
        self.path = f"kafka://{self.target.bootstrap}/{self.target.topic}"

    def write(self, row: dict) -> None:
        value = row_message(row)
        key = (row.get("proxy_instance") or "").encode()
        try:
            self.producer.produce(self.target.topic, value, key, on_delivery=self._delivered)
        except BufferError:
            self.counters.ship_dropped += 1
        self.producer.poll(0)

    def _delivered(self, error, message) -> None:
        if error is None:
            self.counters.rows_shipped += 1
            return
        self.counters.ship_failed += 1
        if self.counters.ship_failed == 1:
            log.warning("capture: rows not delivered to %s (counted in ship_failed; logged once): %s",
                        self.target.topic, error)

    def tick(self, now: float) -> None:
        self.producer.poll(0)

    def flush(self) -> None:
        """No-op: librdkafka sends batches on its own (linger_ms)."""

    def close(self) -> None:
        """Wait up to flush_timeout_seconds for every queued row; count the rest as failed."""
        producer, self.producer = self.producer, None
        if producer is None:
            return
        left = producer.flush(self.target.flush_timeout_seconds)
        if left:
            self.counters.ship_failed += left
            log.warning("capture: %d rows not acknowledged by %s within %gs of stopping",
                        left, self.target.topic, self.target.flush_timeout_seconds)

    def abandon(self) -> None:
        """After a disk error in another sink: still deliver what is queued."""
        try:
            self.close()
        except Exception:                 # noqa: BLE001 - stopping anyway
            self.producer = None
