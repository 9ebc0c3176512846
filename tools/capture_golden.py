#!/usr/bin/env python
"""Capture golden Kafka frames: real clients talking to real brokers through kproxy's relay.

Run by developers, not by CI (it starts JVMs and takes a few minutes)::

    .venv/bin/python tools/capture_golden.py                 # every scenario
    .venv/bin/python tools/capture_golden.py --only librdkafka-kafka4.4.0
    .venv/bin/python tools/capture_golden.py --list

For each broker version a one-node KRaft cluster (``kproxy.embedded.kafka``) is
started that ADVERTISES the relay's address, and the relay
(``kproxy.proxy.relay.start_relay``) is put in front of it, so every client
connection (bootstrap and after Metadata) goes through the relay. An observer
records every request frame with its response frame. Each scenario is one
client library doing: create topics (admin), produce a few small messages to
one topic per compression codec, consume them all in a consumer group
(session.timeout.ms=6000), and describe cluster / list offsets / describe
configs where the client can. Clients: Kafka's Java tools (``run_tool``; on
4.4.0 a second console consumer joins with the KIP-848 protocol),
librdkafka (confluent-kafka), kafka-python (negotiated, pinned to 2.5, and
pinned to 0.10.0 / 0.9 against 3.9.2 for legacy magic 1 / 0 message sets)
and aiokafka; plus a hand-written ApiVersions probe (a version the broker does
not know, then one it does). The magic 0 scenario needs the optional
``xxhash`` module (kafka-python's LZ4 for Kafka 0.8/0.9).

Output: ``tests/data/golden/<client>-<scenario>.jsonl.gz``. The first line is
a header (``"kind": "header"``) with the client and broker versions and the
exact messages sent per topic (codec, magic, keys, values, headers); every
other line is one pair ``{"api_key", "api_version", "request": hex,
"response": hex | null, ...}`` in the order the requests were sent. The
offline test ``tests/protocol/test_golden.py`` decodes them all.

The frames are real, so they differ from one run to the next (timestamps,
ids, ports); the scenarios, topics and messages are fixed.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gzip
import json
import logging
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kproxy.embedded import recv_exactly  # noqa: E402
from kproxy.embedded._support import free_port  # noqa: E402
from kproxy.protocol._codec import write_uvarint  # noqa: E402
from kproxy.protocol.events import (MalformedFrame, RequestReceived,  # noqa: E402
                                    ResponseReceived, SaslTokenPassed)

OUT_DIR = ROOT / "tests" / "data" / "golden"
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
LEGACY_CODECS = ("none", "gzip", "snappy", "lz4")     # magic 0/1 have no zstd
MESSAGES_PER_TOPIC = 4
SESSION_TIMEOUT_MS = 6000
CONSUME_TIMEOUT_S = 60.0
SETTLE_S = 0.5          # let the relay hand the last frames of closed connections to the observer

log = logging.getLogger("capture_golden")


# --------------------------------------------------------------------------- recording

class Recorder:
    """A relay observer: every request with its response, in the order requests were sent.

    Called from the relay's event-loop thread; ``take()`` from the main thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._seq = 0
        self._pairs: dict[int, dict] = {}          # seq -> pair
        self._open: dict[int, int] = {}            # id(RequestReceived) -> seq
        self._conns: dict[int, int] = {}           # relay connection id -> 1, 2, ... per take
        self.anomalies: list[str] = []

    def __call__(self, info, events) -> None:
        with self._lock:
            conn = self._conns.setdefault(info.id, len(self._conns) + 1)
            for event in events:
                if isinstance(event, RequestReceived):
                    seq = self._seq = self._seq + 1
                    self._pairs[seq] = {
                        "api_key": event.api_key, "api_version": event.api_version,
                        "request": bytes(event.frame).hex(), "response": None,
                        "conn": conn, "expects_response": event.expects_response,
                    }
                    if event.expects_response:
                        self._open[id(event)] = seq
                elif isinstance(event, ResponseReceived):
                    seq = self._open.pop(id(event.request_event), None)
                    if seq is None:
                        self.anomalies.append(f"conn {conn}: response to a request not seen: {event!r}")
                        continue
                    self._pairs[seq]["response"] = bytes(event.frame).hex()
                elif isinstance(event, (MalformedFrame, SaslTokenPassed)):
                    self.anomalies.append(f"conn {conn}: {event!r}")

    def take(self) -> tuple[list[dict], list[str]]:
        """Everything recorded since the last take (unanswered requests have response null)."""
        with self._lock:
            pairs = [self._pairs[seq] for seq in sorted(self._pairs)]
            anomalies = self.anomalies
            self._reset()
        return pairs, anomalies


class RelayThread:
    """kproxy's relay on its own event loop in a background thread."""

    def __init__(self, listen_port: int, observers: list) -> None:
        self.listen = ("127.0.0.1", listen_port)
        self.observers = observers
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="relay", daemon=True)
        self._server = None

    def start(self, upstream: tuple[str, int]) -> None:
        from kproxy.proxy.relay import start_relay
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(
            start_relay(self.listen, upstream, observers=self.observers), self._loop)
        self._server = future.result(timeout=10)

    def stop(self) -> None:
        async def close():
            self._server.close()
            # Connections left open (clients are closed by now, but a broker keeps some)
            # are cancelled so the loop can stop cleanly.
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._thread.is_alive():
            if self._server is not None:
                asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self._loop.close()

    @property
    def bootstrap(self) -> str:
        return f"{self.listen[0]}:{self.listen[1]}"


class ProxiedBroker:
    """A one-node Kafka cluster advertising a relay, and the relay in front of it."""

    def __init__(self, version: str, cluster_factory: Callable | None = None) -> None:
        from kproxy.embedded.kafka import KafkaCluster
        self.version = version
        self.port = free_port()
        self.recorder = Recorder()
        factory = cluster_factory or KafkaCluster
        self.cluster = factory(1, version=version,
                               advertised=lambda node_id, port: f"127.0.0.1:{self.port}")
        self.relay = RelayThread(self.port, [self.recorder])

    def __enter__(self) -> ProxiedBroker:
        self.cluster.start()
        try:
            node = self.cluster.nodes[0]
            self.relay.start((node.host, node.port))
        except BaseException:
            self.cluster.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.relay.stop()
        finally:
            self.cluster.stop()

    @property
    def bootstrap(self) -> str:
        return self.relay.bootstrap

    @property
    def node_id(self) -> int:
        return self.cluster.nodes[0].node_id


# --------------------------------------------------------------------------- messages

@dataclass
class TopicPlan:
    topic: str
    codec: str
    magic: int
    messages: list[dict]          # {"key": str|None, "value": str|None, "headers": [[str, str|None]]}


@dataclass
class Scenario:
    name: str                     # file stem: <client>-<scenario>
    client: str                   # client name, prefix of every client_id
    broker_version: str
    run: Callable[[ProxiedBroker, "Scenario"], dict]
    codecs: tuple[str, ...] = CODECS
    magic: int = 2
    headers: bool = True
    null_key: bool = True
    options: dict = field(default_factory=dict)
    plans: list[TopicPlan] = field(default_factory=list)
    client_ids: dict[str, str] = field(default_factory=dict)   # client_id -> note ("" if configured)

    def client_id(self, role: str) -> str:
        """The client_id configured for one role: the client's name, a dash, the role."""
        client_id = f"{self.client}-{role}"
        self.client_ids.setdefault(client_id, "")
        return client_id

    @property
    def slug(self) -> str:
        return self.name.replace(".", "")

    @property
    def group(self) -> str:
        return f"golden-{self.slug}"

    def plan(self) -> list[TopicPlan]:
        if not self.plans:
            self.plans = [TopicPlan(f"golden-{self.slug}-{codec}", codec, self.magic,
                                    make_messages(self.client, codec, self.headers, self.null_key))
                          for codec in self.codecs]
        return self.plans


def make_messages(client: str, codec: str, headers: bool = True, null_key: bool = True,
                  count: int = MESSAGES_PER_TOPIC) -> list[dict]:
    """Small, fixed messages: a null key on message 1, two headers each where supported."""
    messages = []
    for i in range(count):
        messages.append({
            "key": None if (null_key and i == 1) else f"{client}-{codec}-key-{i}",
            "value": f"{client} {codec} message {i}: " + "golden " * (i + 2),
            "headers": [["idx", str(i)], ["codec", codec]] if headers else [],
        })
    return messages


def _b(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _received(key, value, headers=()) -> dict:
    def s(b):
        return None if b is None else (b.decode() if isinstance(b, (bytes, bytearray)) else str(b))
    return {"key": s(key), "value": s(value), "headers": [[k, s(v)] for k, v in (headers or [])]}


def _check_consumed(scenario: Scenario, consumed: dict[str, list[dict]]) -> None:
    for plan in scenario.plan():
        got = consumed.get(plan.topic, [])
        if got != plan.messages:
            raise AssertionError(f"{scenario.name}: consumed from {plan.topic}:\n{got}\n"
                                 f"expected:\n{plan.messages}")


# --------------------------------------------------------------------------- librdkafka

def run_librdkafka(broker: ProxiedBroker, scenario: Scenario) -> dict:
    import confluent_kafka
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import (AdminClient, ConfigResource, NewTopic, OffsetSpec,
                                       ResourceType)
    plans = scenario.plan()
    topics = [p.topic for p in plans]
    admin = AdminClient({"bootstrap.servers": broker.bootstrap,
                         "client.id": scenario.client_id("admin")})
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in topics],
                                      operation_timeout=30).values():
        future.result()

    for plan in plans:
        producer = Producer({"bootstrap.servers": broker.bootstrap,
                             "client.id": scenario.client_id(f"producer-{plan.codec}"),
                             "compression.type": plan.codec, "linger.ms": 50,
                             # One idempotent producer: InitProducerId and sequenced batches.
                             "enable.idempotence": plan.codec == "zstd"})
        for m in plan.messages:
            producer.produce(plan.topic, key=_b(m["key"]), value=_b(m["value"]),
                             headers=[(k, _b(v)) for k, v in m["headers"]])
        if producer.flush(30) != 0:
            raise RuntimeError(f"librdkafka: messages to {plan.topic} not delivered")

    consumer = Consumer({"bootstrap.servers": broker.bootstrap,
                         "client.id": scenario.client_id("consumer"),
                         "group.id": scenario.group, "auto.offset.reset": "earliest",
                         "session.timeout.ms": SESSION_TIMEOUT_MS, "enable.auto.commit": False,
                         **scenario.options.get("consumer", {})})
    consumer.subscribe(topics)
    consumed: dict[str, list[dict]] = {}
    wanted = sum(len(p.messages) for p in plans)
    deadline = time.monotonic() + CONSUME_TIMEOUT_S
    while sum(map(len, consumed.values())) < wanted and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            raise RuntimeError(f"librdkafka consumer: {msg.error()}")
        consumed.setdefault(msg.topic(), []).append(
            _received(msg.key(), msg.value(), msg.headers()))
    consumer.commit(asynchronous=False)
    consumer.get_watermark_offsets(TopicPartition(topics[0], 0), timeout=10)
    consumer.close()
    _check_consumed(scenario, consumed)

    admin.describe_cluster(request_timeout=10).result()
    for future in admin.describe_topics(confluent_kafka.TopicCollection(topics),
                                        request_timeout=10).values():
        future.result()
    for future in admin.list_offsets({TopicPartition(t, 0): OffsetSpec.latest() for t in topics},
                                     request_timeout=10).values():
        future.result()
    for future in admin.describe_configs([ConfigResource(ResourceType.TOPIC, topics[0]),
                                          ConfigResource(ResourceType.BROKER, str(broker.node_id))],
                                         request_timeout=10).values():
        future.result()
    admin.list_consumer_groups(request_timeout=10).result()
    for future in admin.describe_consumer_groups([scenario.group], request_timeout=10).values():
        future.result()
    return {"library": "confluent-kafka", "library_version": confluent_kafka.version()[0],
            "client_version": f"librdkafka {confluent_kafka.libversion()[0]}"}


# --------------------------------------------------------------------------- kafka-python

def run_kafka_python(broker: ProxiedBroker, scenario: Scenario) -> dict:
    import kafka
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, OffsetSpec
    plans = scenario.plan()
    topics = [p.topic for p in plans]
    api_version = scenario.options.get("api_version")
    legacy = api_version is not None and api_version < (0, 11)
    versioned = {"api_version": api_version} if api_version else {}

    # Topic creation needs CreateTopics (0.10.1+): the legacy scenarios create with a
    # negotiating admin client and keep the pinned old versions for produce and consume.
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap,
                             client_id=scenario.client_id("admin"),
                             **({} if legacy else versioned))
    admin.create_topics({t: {"num_partitions": 1, "replication_factor": 1} for t in topics},
                        wait_for_metadata=True)

    for plan in plans:
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap,
                                 client_id=scenario.client_id(f"producer-{plan.codec}"),
                                 compression_type=None if plan.codec == "none" else plan.codec,
                                 linger_ms=50, **versioned)
        for m in plan.messages:
            kwargs = {"headers": [(k, _b(v)) for k, v in m["headers"]]} if scenario.headers else {}
            producer.send(plan.topic, key=_b(m["key"]), value=_b(m["value"]), **kwargs)
        producer.flush(30)
        producer.close(timeout=10)

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap,
                             client_id=scenario.client_id("consumer"),
                             group_id=scenario.group, auto_offset_reset="earliest",
                             session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=1000,
                             enable_auto_commit=False, **versioned)
    consumer.subscribe(topics)
    consumed: dict[str, list[dict]] = {}
    wanted = sum(len(p.messages) for p in plans)
    deadline = time.monotonic() + CONSUME_TIMEOUT_S
    while sum(map(len, consumed.values())) < wanted and time.monotonic() < deadline:
        for tp, msgs in consumer.poll(timeout_ms=500).items():
            for msg in msgs:
                consumed.setdefault(tp.topic, []).append(
                    _received(msg.key, msg.value, msg.headers))
    consumer.commit()
    consumer.end_offsets([TopicPartition(t, 0) for t in topics])
    consumer.close()
    _check_consumed(scenario, consumed)

    if not legacy:
        admin.describe_cluster()
        admin.describe_topics(topics)
        admin.list_partition_offsets({TopicPartition(t, 0): OffsetSpec.LATEST for t in topics})
        admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topics[0]),
                                ConfigResource(ConfigResourceType.BROKER, str(broker.node_id))])
        admin.list_groups()
        admin.describe_groups([scenario.group])
        admin.list_group_offsets({scenario.group: None})
    admin.close()
    return {"library": "kafka-python", "library_version": kafka.__version__,
            "client_version": f"kafka-python {kafka.__version__}",
            "api_version": list(api_version) if api_version else None}


# --------------------------------------------------------------------------- aiokafka

def run_aiokafka(broker: ProxiedBroker, scenario: Scenario) -> dict:
    import aiokafka
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
    plans = scenario.plan()
    topics = [p.topic for p in plans]

    async def main() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap,
                                    client_id=scenario.client_id("admin"))
        await admin.start()
        try:
            await admin.create_topics([NewTopic(t, 1, 1) for t in topics])
            for plan in plans:
                producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap,
                                            client_id=scenario.client_id(f"producer-{plan.codec}"),
                                            compression_type=(None if plan.codec == "none"
                                                              else plan.codec),
                                            linger_ms=50)
                await producer.start()
                try:
                    futures = [await producer.send(plan.topic, key=_b(m["key"]),
                                                   value=_b(m["value"]),
                                                   headers=[(k, _b(v)) for k, v in m["headers"]])
                               for m in plan.messages]
                    await asyncio.gather(*futures)
                finally:
                    await producer.stop()

            consumer = AIOKafkaConsumer(*topics, bootstrap_servers=broker.bootstrap,
                                        client_id=scenario.client_id("consumer"),
                                        group_id=scenario.group,
                                        auto_offset_reset="earliest",
                                        session_timeout_ms=SESSION_TIMEOUT_MS,
                                        heartbeat_interval_ms=1000, enable_auto_commit=False)
            await consumer.start()
            consumed: dict[str, list[dict]] = {}
            try:
                wanted = sum(len(p.messages) for p in plans)
                deadline = time.monotonic() + CONSUME_TIMEOUT_S
                while sum(map(len, consumed.values())) < wanted and time.monotonic() < deadline:
                    for tp, msgs in (await consumer.getmany(timeout_ms=500)).items():
                        for msg in msgs:
                            consumed.setdefault(tp.topic, []).append(
                                _received(msg.key, msg.value, msg.headers))
                await consumer.commit()
                await consumer.end_offsets([TopicPartition(t, 0) for t in topics])
            finally:
                await consumer.stop()
            _check_consumed(scenario, consumed)

            await admin.describe_cluster()
            await admin.describe_topics(topics)
            await admin.describe_configs([
                ConfigResource(ConfigResourceType.TOPIC, topics[0]),
                ConfigResource(ConfigResourceType.BROKER, str(broker.node_id))])
            await admin.list_consumer_groups()
            await admin.describe_consumer_groups([scenario.group])
            await admin.list_consumer_group_offsets(scenario.group)
        finally:
            await admin.close()

    asyncio.run(main())
    return {"library": "aiokafka", "library_version": aiokafka.__version__,
            "client_version": f"aiokafka {aiokafka.__version__}"}


# --------------------------------------------------------------------------- Kafka's Java tools

def run_java(broker: ProxiedBroker, scenario: Scenario) -> dict:
    from kproxy.embedded.kafka import run_tool, tools_version
    cluster = broker.cluster
    tools = cluster.tools
    plans = scenario.plan()
    topics = [p.topic for p in plans]
    bootstrap = ("--bootstrap-server", broker.bootstrap)
    v4 = int(cluster.version.split(".")[0]) >= 4
    # 4.x renamed the console tools' options (the old names still work, with a warning on stdout).
    client_property = "--command-property" if v4 else "--producer-property"
    consumer_property = "--command-property" if v4 else "--consumer-property"
    reader_property = "--reader-property" if v4 else "--property"
    formatter_property = "--formatter-property" if v4 else "--property"
    with tempfile.TemporaryDirectory(prefix="golden-java-") as tmp:
        def config(name: str) -> str:
            path = Path(tmp) / f"{name}.properties"
            path.write_text(f"client.id={scenario.client_id(name)}\n")
            return str(path)

        for topic in topics:
            run_tool(cluster, tools.topics, *bootstrap, "--command-config", config("topics"),
                     "--create", "--topic", topic, "--partitions", "1", "--replication-factor", "1")
        for plan in plans:
            lines = []
            for m in plan.messages:
                headers = ",".join(f"{k}:{v}" for k, v in m["headers"])
                key = "<NULL>" if m["key"] is None else m["key"]
                lines.append(f"{headers}\t{key}\t{m['value']}")
            run_tool(cluster, tools.console_producer, *bootstrap, "--topic", plan.topic,
                     "--compression-codec", plan.codec,
                     client_property,
                     f"client.id={scenario.client_id(f'console-producer-{plan.codec}')}",
                     client_property, "linger.ms=50",
                     reader_property, "parse.key=true", reader_property, "parse.headers=true",
                     reader_property, "null.marker=<NULL>",
                     input="\n".join(lines) + "\n")
        wanted = sum(len(p.messages) for p in plans)

        def consume(group: str, *properties: str) -> None:
            result = run_tool(cluster, tools.console_consumer, *bootstrap,
                              "--include", f"golden-{scenario.slug}-.*", "--from-beginning",
                              "--max-messages", str(wanted), "--group", group,
                              "--timeout-ms", str(int(CONSUME_TIMEOUT_S * 1000)),
                              consumer_property, f"client.id={scenario.client_id('console-consumer')}",
                              *(arg for p in properties for arg in (consumer_property, p)),
                              formatter_property, "print.key=true",
                              formatter_property, "print.headers=true",
                              formatter_property, "null.literal=<NULL>")
            consumed: dict[str, list[dict]] = {}
            for line in result.stdout.splitlines():
                # headers, key, value; tab separated. The formatter cannot print the
                # topic (3.9 and 4.x), so a message is attributed to the topic it was sent to.
                try:
                    headers, key, value = line.split("\t", 2)
                except ValueError:
                    raise RuntimeError(f"console consumer printed {line!r}; "
                                       f"stderr:\n{result.stderr[-3000:]}") from None
                parsed = [] if headers == "NO_HEADERS" else [h.split(":", 1) for h in headers.split(",")]
                message = {"key": None if key == "<NULL>" else key, "value": value, "headers": parsed}
                topic = next((p.topic for p in plans if message in p.messages), "<unexpected>")
                consumed.setdefault(topic, []).append(message)
            _check_consumed(scenario, consumed)

        consume(scenario.group, f"session.timeout.ms={SESSION_TIMEOUT_MS}")
        if scenario.options.get("kip848_group"):
            # The KIP-848 consumer group protocol (ConsumerGroupHeartbeat); its session
            # timeout is the broker's (group.consumer.session.timeout.ms), not the client's.
            consume(f"{scenario.group}-kip848", "group.protocol=consumer")

        run_tool(cluster, tools.topics, *bootstrap, "--command-config", config("topics"),
                 "--describe", "--topic", topics[0])
        run_tool(cluster, tools.consumer_groups, *bootstrap, "--command-config", config("groups"),
                 "--describe", "--group", scenario.group)
        # GetOffsetShell sets its own client.id, whatever its --command-config says.
        run_tool(cluster, "org.apache.kafka.tools.GetOffsetShell", *bootstrap, "--topic", topics[0])
        scenario.client_ids["GetOffsetShell"] = "GetOffsetShell hard-codes its client.id"
        run_tool(cluster, "kafka.admin.ConfigCommand", *bootstrap,
                 "--command-config", config("configs"), "--describe", "--entity-type", "topics",
                 "--entity-name", topics[0])
    version = tools_version(cluster.version)
    return {"library": "kafka-tools", "library_version": version,
            "client_version": f"Apache Kafka Java client and tools {version}"}


# --------------------------------------------------------------------------- hand-written probe

def _compact_string(text: str) -> bytes:
    data = text.encode()
    length = bytearray()
    write_uvarint(len(data) + 1, length)
    return bytes(length) + data


def run_probe(broker: ProxiedBroker, scenario: Scenario) -> dict:
    """ApiVersions at a version the broker does not know, then at one it does.

    What a newer client does against an older broker (a 4.4 Java client and a
    3.9 broker): ask with its newest ApiVersions, get error 35 UNSUPPORTED_VERSION
    with a v0 body listing the broker's ranges, ask again. No Python client
    library sends an ApiVersions version newer than 3.9's, so the requests are
    written by hand (flexible request header v2, compact strings); the answers
    are the broker's own bytes.
    """
    import struct
    client_id = scenario.client_id("apiversions").encode()
    versions = scenario.options["api_versions"]
    with socket.create_connection(tuple(broker.bootstrap.rsplit(":", 1)), timeout=10) as sock:
        for correlation_id, version in enumerate(versions, start=1):
            frame = (struct.pack(">hhih", 18, version, correlation_id, len(client_id)) + client_id
                     + b"\x00"                                     # header tagged fields
                     + _compact_string("kproxy-golden-probe") + _compact_string("1.0")
                     # v5 (KIP-1242): cluster_id null, node_id -1, as a client sends
                     # before it knows the cluster.
                     + (b"\x00" + struct.pack(">i", -1) if version >= 5 else b"")
                     + b"\x00")                                    # body tagged fields
            sock.sendall(struct.pack(">i", len(frame)) + frame)
            size, = struct.unpack(">i", recv_exactly(sock, 4))
            answer = recv_exactly(sock, size)
            if struct.unpack_from(">i", answer)[0] != correlation_id:
                raise RuntimeError(f"probe: unexpected correlation id in {answer[:8].hex()}")
    return {"library": "tools/capture_golden.py", "library_version": "1",
            "client_version": "hand-written ApiVersions requests",
            "api_versions_sent": list(versions)}


# --------------------------------------------------------------------------- scenarios

K4 = "4.4.0"
K3 = "3.9.2"


def _has_xxhash() -> bool:
    try:
        import xxhash  # noqa: F401
    except ImportError:
        return False
    return True


def scenarios() -> list[Scenario]:
    # kafka-python writes magic 0 LZ4 (Kafka 0.8/0.9's frame with the broken header
    # checksum) only with the optional xxhash module.
    magic0_codecs = LEGACY_CODECS if _has_xxhash() else ("none", "gzip", "snappy")
    return [
        Scenario("java-kafka4.4.0", "java", K4, run_java, options={"kip848_group": True}),
        Scenario("librdkafka-kafka4.4.0", "librdkafka", K4, run_librdkafka),
        Scenario("kafka-python-kafka4.4.0", "kafka-python", K4, run_kafka_python),
        Scenario("kafka-python-api2.5-kafka4.4.0", "kafka-python", K4, run_kafka_python,
                 options={"api_version": (2, 5)}),
        Scenario("aiokafka-kafka4.4.0", "aiokafka", K4, run_aiokafka),
        Scenario("java-kafka3.9.2", "java", K3, run_java),
        Scenario("librdkafka-kafka3.9.2", "librdkafka", K3, run_librdkafka),
        Scenario("kafka-python-magic1-kafka3.9.2", "kafka-python", K3, run_kafka_python,
                 codecs=LEGACY_CODECS, magic=1, headers=False, options={"api_version": (0, 10, 0)}),
        Scenario("kafka-python-magic0-kafka3.9.2", "kafka-python", K3, run_kafka_python,
                 codecs=magic0_codecs, magic=0, headers=False, options={"api_version": (0, 9)}),
        # 3.9.2 knows ApiVersions v0-4; v5 is 4.4's newest (kproxy's codec decodes it).
        Scenario("probe-kafka3.9.2", "probe", K3, run_probe, codecs=(),
                 options={"api_versions": (5, 4)}),
    ]


def capture(broker: ProxiedBroker, scenario: Scenario) -> tuple[dict, list[dict]]:
    """Run one scenario through the relay; return its header and its pairs."""
    broker.recorder.take()                     # drop anything left from an earlier scenario
    started = time.monotonic()
    meta = scenario.run(broker, scenario)
    time.sleep(SETTLE_S)
    pairs, anomalies = broker.recorder.take()
    if anomalies:
        raise RuntimeError(f"{scenario.name}: relay saw anomalies: {anomalies[:5]}")
    header = {
        "kind": "header",
        "scenario": scenario.name,
        "client": scenario.client,
        **meta,
        "broker": "Apache Kafka",
        "broker_version": broker.version,
        "broker_node_id": broker.node_id,
        "advertised": broker.bootstrap,
        "captured": datetime.date.today().isoformat(),
        "python": sys.version.split()[0],
        "group": scenario.group,
        "options": scenario.options,
        "session_timeout_ms": SESSION_TIMEOUT_MS,
        "client_id_prefix": scenario.client,
        "client_ids": dict(sorted(scenario.client_ids.items())),
        "text_encoding": "utf-8",
        "topics": [{"topic": p.topic, "codec": p.codec, "magic": p.magic, "partition": 0,
                    "messages": p.messages} for p in scenario.plan()],
        "pairs": len(pairs),
        "seconds": round(time.monotonic() - started, 1),
    }
    return header, pairs


def write_capture(path: Path, header: dict, pairs: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(header, sort_keys=True)] + [json.dumps(p, sort_keys=True) for p in pairs]
    data = ("\n".join(lines) + "\n").encode()
    with open(path, "wb") as f:
        # mtime=0 and no file name: the same frames give the same file.
        with gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=9) as gz:
            gz.write(data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[],
                        help="scenario name (repeatable); default: all")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    for noisy in ("kafka", "aiokafka", "kproxy.relay"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    chosen = [s for s in scenarios() if not args.only or s.name in args.only]
    if args.list or not chosen:
        for s in scenarios():
            print(s.name)
        return 0 if chosen or args.list else 2
    if any(s.magic == 0 for s in chosen) and not _has_xxhash():
        parser.error("the magic 0 scenario needs the xxhash module for LZ4 (kafka-python writes "
                     "Kafka 0.8/0.9's LZ4 framing with it): pip install xxhash, or put it on "
                     "PYTHONPATH (pip install --target DIR xxhash)")
    for version in dict.fromkeys(s.broker_version for s in chosen):
        log.info("starting Apache Kafka %s behind the relay", version)
        with ProxiedBroker(version) as broker:
            for scenario in (s for s in chosen if s.broker_version == version):
                log.info("capturing %s", scenario.name)
                header, pairs = capture(broker, scenario)
                path = args.out / f"{scenario.name}.jsonl.gz"
                write_capture(path, header, pairs)
                log.info("wrote %s: %d pairs, %d bytes, %.1f s", path.relative_to(ROOT)
                         if path.is_relative_to(ROOT) else path, len(pairs), path.stat().st_size,
                         header["seconds"])
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
