"""Real clients through kproxy: change only the bootstrap address, and everything works.

Each broker (Kafka 4.4.0, Kafka 3.9.2, Tansu) advertises its REAL address; a kproxy
in gateway mode sits in front of it, and every client is given nothing but kproxy's
bootstrap address. For every client we prove:

- the work gets done (topics, produce with every codec, idempotence, transactions,
  classic and KIP-848 groups, admin calls) and every message sent arrives exactly once:
  the consumed (key, value) multiset equals what was sent, no (partition, offset) is
  delivered twice, and the log holds exactly as many records as were sent (so no
  producer retry wrote a duplicate);
- the client's own view of the cluster (metadata brokers, DescribeCluster, group
  coordinator) lists only kproxy addresses;
- no upstream ``host:port`` (any listener of the broker) appears in any byte kproxy sent
  to a client, and every request and response decoded cleanly (including librdkafka's
  all-topics Metadata request, whose 3 stray trailing bytes the codec keeps).

Kafka 4.4.0's Java tools run from kafka-tools 4.3.1 (see ``TOOLS_VERSION_FALLBACK``).
KIP-848 consumers cannot set ``session.timeout.ms`` (both librdkafka and the Java client
refuse it: the broker owns it); every classic consumer uses 6000 ms.

One kproxy per broker, shared by the whole session; the byte recording and event log are
reset before each test, so each test's checks cover only its own traffic.
"""

from __future__ import annotations

import asyncio
import re
import struct
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pytest

from kproxy.embedded import KafkaCluster, TansuBroker, run_tool
from kproxy.protocol.connection import Connection
from kproxy.protocol.events import MalformedFrame, RequestReceived, ResponseReceived
from kproxy.protocol.records import iter_batches
from tests.proxy.harness import ProxyThread, free_ports, kafka_python_group_consumer, wait_for

pytestmark = pytest.mark.broker

LOOPBACK = "127.0.0.1"
# Deadlines, not sleeps: on 2 shared cores a group join or a JVM start can take many seconds.
DEADLINE_S = 90.0
TOOL_TIMEOUT_S = 180.0
SESSION_TIMEOUT_MS = 6000
# Only where the broker's end offsets cannot be trusted (Tansu): after the expected count,
# keep polling until this long passes with nothing new, so a duplicate would still show.
QUIET_S = 2.0
POLL_WAIT_S = 0.5           # how long ck_consume's polls wait for a message
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"



# -- what kproxy sends to clients, and what it decoded ------------------------------------


class Traffic:
    """Bytes kproxy forwarded to clients (per connection) and a summary of decoded events.

    Filled from kproxy's event-loop threads, read from the test thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[int, tuple[Connection, bytearray]] = {}
        self.api_versions: dict[str, set[int]] = {}
        self.produce_codecs: set[str] = set()
        self.problems: list[str] = []

    def reset(self) -> None:
        with self._lock:
            self._streams.clear()
            self.api_versions = {}
            self.produce_codecs = set()
            self.problems = []

    def record_bytes(self, conn: Connection, chunks: Iterable) -> None:
        with self._lock:
            entry = self._streams.get(id(conn))
            if entry is None or entry[0] is not conn:
                entry = self._streams[id(conn)] = (conn, bytearray())
            for chunk in chunks:
                entry[1].extend(chunk)

    def streams(self) -> list[bytes]:
        with self._lock:
            return [bytes(stream) for _, stream in self._streams.values()]

    def observe(self, info, events) -> None:
        """A kproxy observer: decode every request and response, as a client would."""
        for event in events:
            if isinstance(event, RequestReceived):
                error = event.decode_error
                with self._lock:
                    self.api_versions.setdefault(event.api_name, set()).add(event.api_version)
                    if error is not None:
                        self.problems.append(f"request {event!r}: {error}")
                if event.api_key == 0 and error is None and not event.request.is_opaque:
                    codecs = _produce_codecs(event.request.body)
                    with self._lock:
                        self.produce_codecs |= codecs
            elif isinstance(event, ResponseReceived):
                error = event.decode_error
                if error is not None:
                    with self._lock:
                        self.problems.append(f"response {event!r}: {error}")
            elif isinstance(event, MalformedFrame):
                with self._lock:
                    self.problems.append(repr(event))


def _produce_codecs(body) -> set[str]:
    codecs = set()
    for topic in body.topic_data:
        for partition in topic.partition_data:
            codecs.update(batch.compression for batch in iter_batches(partition.records))
    return codecs


@pytest.fixture(scope="session")
def traffic() -> Iterator[Traffic]:
    recorder = Traffic()
    original = Connection.relay_broker

    def recording(self, data):
        events, out = original(self, data)
        recorder.record_bytes(self, out)
        return events, out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Connection, "relay_broker", recording)
        yield recorder


@pytest.fixture(autouse=True)
def _fresh_traffic(traffic: Traffic) -> None:
    traffic.reset()


# -- one kproxy per broker ----------------------------------------------------------------


@dataclass
class Target:
    """A broker with its kproxy: what clients may see, and what they must never see."""

    name: str
    proxy: ProxyThread
    node_ids: list[int]
    advertised: set[tuple[str, int]]             # kproxy's per-broker addresses
    upstream: set[tuple[str, int]]               # every address the broker listens on
    tools: object = None                         # Kafka tool classes (Kafka targets only)
    # Tansu answers ListOffsets(latest) with the last batch's base offset + 1, not the log
    # end (checked directly, without kproxy): log sizes and "at end" checks are skipped.
    end_offsets_reliable: bool = True
    cluster: KafkaCluster | None = None

    @property
    def bootstrap(self) -> str:
        return self.proxy.bootstrap


def _kafka_listeners(cluster: KafkaCluster) -> set[tuple[str, int]]:
    """Every listener (CLIENT, INTERNAL, CONTROLLER) of every node, from server.properties."""
    addresses = set()
    for node in cluster.nodes:
        addresses.add((node.host, node.port))
        properties = (cluster.workdir / f"node-{node.node_id}" / "server.properties").read_text()
        for line in properties.splitlines():
            if line.startswith("listeners="):
                for listener in line.split("=", 1)[1].split(","):
                    host, port = listener.split("://", 1)[1].rsplit(":", 1)
                    addresses.add((host, int(port)))
    return addresses


def _start_proxy(traffic: Traffic, upstream_bootstrap: str, node_ids: list[int]) -> tuple[ProxyThread, set]:
    ports = free_ports(len(node_ids))
    proxy = ProxyThread(observers=[traffic.observe], upstream=upstream_bootstrap,
                        broker_port_rule="map", broker_port_map=dict(zip(node_ids, ports)))
    return proxy, {(LOOPBACK, port) for port in ports}


def _kafka_target(cluster: KafkaCluster, traffic: Traffic) -> Iterator[Target]:
    node_ids = [node.node_id for node in cluster.nodes]
    proxy, advertised = _start_proxy(traffic, cluster.bootstrap_servers, node_ids)
    with proxy:
        yield Target("kafka-" + cluster.version, proxy, node_ids, advertised,
                     _kafka_listeners(cluster), tools=cluster.tools, cluster=cluster)


@pytest.fixture(scope="session")
def kafka4(kafka_cluster: KafkaCluster, traffic: Traffic) -> Iterator[Target]:
    yield from _kafka_target(kafka_cluster, traffic)


@pytest.fixture(scope="session")
def kafka3(kafka3_cluster: KafkaCluster, traffic: Traffic) -> Iterator[Target]:
    yield from _kafka_target(kafka3_cluster, traffic)


@pytest.fixture(scope="session")
def tansu(tansu_broker: TansuBroker, traffic: Traffic) -> Iterator[Target]:
    node_ids = [broker.node_id for broker in tansu_broker.metadata_brokers()]
    proxy, advertised = _start_proxy(traffic, tansu_broker.bootstrap_servers, node_ids)
    with proxy:
        yield Target("tansu", proxy, node_ids, advertised, {(LOOPBACK, tansu_broker.port)},
                     end_offsets_reliable=False)


# -- the checks every test ends with ------------------------------------------------------


def assert_kproxy_view(target: Target, addresses: Iterable[tuple[str, int]], what: str) -> None:
    """A client's own view (metadata, DescribeCluster, coordinator) shows only kproxy."""
    seen = {(host, int(port)) for host, port in addresses}
    assert seen, f"{what}: the client lists no broker at all"
    assert seen <= target.advertised, f"{what}: {sorted(seen - target.advertised)} are not kproxy addresses"


def assert_no_upstream_address(target: Target, traffic: Traffic) -> None:
    """No upstream host:port in any byte sent to clients; the rewritten addresses are there.

    Addresses are searched as Kafka encodes them (host string followed by an int32 port,
    or a uint16 port as in DescribeQuorum) and as text (``host:port`` in error messages).
    """
    streams = traffic.streams()
    assert streams, "kproxy sent nothing to any client"
    for stream in streams:
        for host, port in target.upstream:
            for needle in (host.encode() + struct.pack(">i", port), host.encode() + struct.pack(">H", port),
                           f"{host}:{port}".encode()):
                assert needle not in stream, f"{target.name}: upstream {host}:{port} leaked to a client ({needle!r})"
    # Positive control: kproxy's own addresses did reach the clients.
    rewritten = [host.encode() + struct.pack(">i", port) for host, port in target.advertised]
    assert any(needle in stream for stream in streams for needle in rewritten), \
        f"{target.name}: no kproxy broker address was sent to any client"
    assert not traffic.problems, f"kproxy could not decode real client traffic: {traffic.problems[:5]}"


def assert_exactly_once(sent: Iterable, received: Iterable[tuple], log_records: int | None = None) -> None:
    """``received``: (partition, offset, key, value); every message sent arrived once.

    ``log_records``: records the log holds (sum over partitions of end - start offsets),
    equal to the number sent unless control records (transactions) take offsets.
    """
    sent = Counter(sent)
    received = list(received)
    positions = Counter((partition, offset) for partition, offset, _, _ in received)
    duplicates = [position for position, count in positions.items() if count > 1]
    assert not duplicates, f"delivered twice: {duplicates[:5]}"
    got = Counter((key, value) for _, _, key, value in received)
    missing, extra = sent - got, got - sent
    assert not missing and not extra, \
        f"missing {len(missing)} e.g. {list(missing)[:3]}; extra {len(extra)} e.g. {list(extra)[:3]}"
    if log_records is not None:
        assert log_records == sum(sent.values()), f"the log holds {log_records} records, {sum(sent.values())} were sent"


def messages(prefix: str, n: int) -> list[tuple[bytes, bytes]]:
    """Keyed messages with a compressible value (so compression actually does something)."""
    return [(f"{prefix}-k{i}".encode(), f"{prefix}-value-{i}-".encode() + b"x" * 200) for i in range(n)]


# -- confluent-kafka helpers ----------------------------------------------------------------


def ck_create_topic(target: Target, topic: str, partitions: int = 3, config: dict | None = None) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": target.bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})], operation_timeout=30)
    futures[topic].result(DEADLINE_S)
    # Wait until the new topic has leaders: the first produce then needs no retry.
    wait_for(lambda: _ck_leaders_ready(admin, topic, partitions), DEADLINE_S, f"leaders of {topic}")


def _ck_leaders_ready(admin, topic: str, partitions: int) -> bool:
    metadata = admin.list_topics(topic, timeout=10).topics.get(topic)
    return (metadata is not None and metadata.error is None and len(metadata.partitions) == partitions
            and all(p.leader >= 0 for p in metadata.partitions.values()))


def ck_produce(target: Target, topic: str, sent: list[tuple[bytes, bytes]], **config) -> None:
    from confluent_kafka import Producer

    errors = []
    producer = Producer({"bootstrap.servers": target.bootstrap, "linger.ms": 5, **config})
    for key, value in sent:
        producer.produce(topic, key=key, value=value,
                         on_delivery=lambda err, msg: errors.append(err) if err is not None else None)
        producer.poll(0)
    assert producer.flush(DEADLINE_S) == 0, "messages still queued after the deadline"
    assert not errors, f"delivery failed: {errors[:3]}"
    assert_kproxy_view(target, _ck_brokers(producer.list_topics(timeout=10)), "producer metadata")


def _ck_brokers(metadata) -> set[tuple[str, int]]:
    return {(b.host, b.port) for b in metadata.brokers.values()}


class QuietSpell:
    """True once ``QUIET_S`` passed without news (see ``QUIET_S``)."""

    def __init__(self) -> None:
        self.since = time.monotonic()

    def __call__(self, news: bool) -> bool:
        now = time.monotonic()
        if news:
            self.since = now
        return now - self.since >= QUIET_S


def ck_consume(consumers: list, expected: int, timeout: float = DEADLINE_S, to_end: bool = True) -> list[tuple]:
    """Poll (round-robin over ``consumers``) until ``expected`` messages arrived and each
    consumer's positions reached the end of what it was assigned (``to_end``), or else
    nothing more arrived for ``QUIET_S``."""
    received = []
    deadline = time.monotonic() + timeout
    quiet = QuietSpell()
    wait = POLL_WAIT_S
    while True:
        before = len(received)
        for consumer in consumers:
            msg = consumer.poll(wait)
            if msg is None:
                continue
            assert msg.error() is None, f"consumer error: {msg.error()}"
            received.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
        news = len(received) > before
        # Wait in a poll only after a round that brought nothing: a consumer with nothing
        # left would otherwise cost a whole wait per message of the others.
        wait = 0 if news else POLL_WAIT_S
        if len(received) >= expected and (all(_ck_at_end(c) for c in consumers) if to_end else quiet(news)):
            return received
        if time.monotonic() > deadline:
            pytest.fail(f"consumed {len(received)} of {expected} messages in {timeout:.0f} s")


def _ck_at_end(consumer) -> bool:
    assigned = consumer.assignment()
    for position in consumer.position(assigned):
        _, high = consumer.get_watermark_offsets(position, cached=True) or (None, None)
        if high is None or position.offset < 0 or position.offset < high:
            # cached watermarks can lag; ask the broker before deciding "not at end"
            low, high = consumer.get_watermark_offsets(position, timeout=10)
            if position.offset != high and not (position.offset < 0 and high == low):
                return False
    return True


def ck_log_records(target: Target, topic: str, partitions: int) -> int:
    """How many records ``topic``'s log holds, asked by a consumer that fetches nothing: a
    reading consumer's ListOffsets waits behind its own Fetch long-poll (the broker answers
    one request per connection at a time), half a second per partition."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": target.bootstrap, "group.id": unique("ck-log")})
    try:
        total = 0
        for partition in range(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            total += high - low
    finally:
        consumer.close()
    return total


def ck_assigned_consumer(target: Target, topic: str, partitions: int, **config):
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": target.bootstrap, "group.id": unique("ck-assign"),
                         "enable.auto.commit": False, "session.timeout.ms": SESSION_TIMEOUT_MS, **config})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    return consumer


def ck_read_back_exactly_once(target: Target, topic: str, sent, partitions: int) -> None:
    """Read ``topic`` from its beginning (an assigned consumer): exactly ``sent``, once each."""
    consumer = ck_assigned_consumer(target, topic, partitions)
    try:
        received = ck_consume([consumer], len(sent))
        assert_exactly_once(sent, received, ck_log_records(target, topic, partitions))
    finally:
        consumer.close()


# -- 1. Kafka's Java tools ----------------------------------------------------------------


def _tool(target: Target, main_class: str, *args: str, input: str | None = None) -> str:
    result = run_tool(target.cluster, main_class, *args, input=input, timeout=TOOL_TIMEOUT_S)
    return result.stdout


def test_java_tools(kafka4: Target, traffic: Traffic) -> None:
    tools, bootstrap = kafka4.tools, kafka4.bootstrap
    topic, group = unique("java"), unique("java-g848")

    _tool(kafka4, tools.topics, "--bootstrap-server", bootstrap, "--create", "--topic", topic,
          "--partitions", "3", "--replication-factor", "1")
    described = _tool(kafka4, tools.topics, "--bootstrap-server", bootstrap, "--describe", "--topic", topic)
    assert "PartitionCount: 3" in described, described
    assert len(re.findall(r"Leader: (\d+)", described)) == 3, described

    lines = [f"{topic}-line-{i}" for i in range(300)]
    _tool(kafka4, tools.console_producer, "--bootstrap-server", bootstrap, "--topic", topic,
          "--command-property", "acks=all", input="\n".join(lines) + "\n")

    # One KIP-848 group: the console consumer with group.protocol=consumer.
    consumed = _tool(kafka4, tools.console_consumer, "--bootstrap-server", bootstrap, "--topic", topic,
                     "--group", group, "--from-beginning", "--max-messages", str(len(lines)),
                     "--timeout-ms", str(int(DEADLINE_S * 1000)),
                     "--command-property", "group.protocol=consumer")
    got = [line for line in consumed.splitlines() if line.startswith(f"{topic}-line-")]
    assert Counter(got) == Counter(lines)
    assert "ConsumerGroupHeartbeat" in traffic.api_versions, "the console consumer did not use KIP-848"

    # The group's committed offsets: every message consumed, and the log holds exactly 300.
    offsets = _tool(kafka4, tools.consumer_groups, "--bootstrap-server", bootstrap,
                    "--describe", "--group", group, "--offsets")
    rows = [line.split() for line in offsets.splitlines() if line.split()[:1] == [group]]
    assert len(rows) == 3, offsets
    header = next(line.split() for line in offsets.splitlines() if line.split()[:1] == ["GROUP"])
    current, end, lag = (header.index(c) for c in ("CURRENT-OFFSET", "LOG-END-OFFSET", "LAG"))
    assert sum(int(row[current]) for row in rows) == len(lines), offsets
    assert sum(int(row[end]) for row in rows) == len(lines), offsets
    assert all(row[lag] == "0" for row in rows), offsets

    # The tool's view of the coordinator: a kproxy address.
    state = _tool(kafka4, tools.consumer_groups, "--bootstrap-server", bootstrap,
                  "--describe", "--group", group, "--state")
    coordinators = re.findall(r"(\d+\.\d+\.\d+\.\d+):(\d+)\s+\((\d+)\)", state)
    assert coordinators, state
    assert_kproxy_view(kafka4, [(host, int(port)) for host, port, _ in coordinators],
                       "kafka-consumer-groups coordinator")

    # ProducerPerformance writes 20k zstd records with acks=all; ConsumerPerformance reads them back.
    perf_topic, records = unique("java-perf"), 20000
    produced = _tool(kafka4, tools.producer_perf, "--bootstrap-server", bootstrap, "--topic", perf_topic,
                     "--num-records", str(records), "--record-size", "200", "--throughput", "-1",
                     "--command-property", "compression.type=zstd", "acks=all")
    sent = re.findall(r"^(\d+) records sent", produced, re.MULTILINE)
    assert sent and int(sent[-1]) == records, produced
    assert "zstd" in traffic.produce_codecs

    read = _tool(kafka4, tools.consumer_perf, "--bootstrap-server", bootstrap, "--topic", perf_topic,
                 "--num-records", str(records), "--timeout", str(int(DEADLINE_S * 1000)),
                 "--group", unique("java-perf-g"),
                 "--command-property", f"session.timeout.ms={SESSION_TIMEOUT_MS}")
    table = [line for line in read.splitlines() if "," in line]
    header = [column.strip() for column in next(line for line in table if "nMsg" in line).split(",")]
    values = [column.strip() for column in table[-1].split(",")]
    assert int(values[header.index("data.consumed.in.nMsg")]) == records, read

    # The log holds exactly 20000: no retry wrote a duplicate.
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("java-check")})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(perf_topic, 0), timeout=10)
    finally:
        consumer.close()
    assert high - low == records
    assert_no_upstream_address(kafka4, traffic)


# -- 2. confluent-kafka (librdkafka) ------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_confluent_codec(kafka4: Target, traffic: Traffic, codec: str) -> None:
    topic = unique(f"ck-{codec}")
    ck_create_topic(kafka4, topic)
    sent = messages(topic, 300)
    ck_produce(kafka4, topic, sent, **{"compression.type": codec})
    assert codec in traffic.produce_codecs, f"produced with {traffic.produce_codecs}, not {codec}"

    ck_read_back_exactly_once(kafka4, topic, sent, 3)
    assert_no_upstream_address(kafka4, traffic)


def test_confluent_idempotent_producer(kafka4: Target, traffic: Traffic) -> None:
    topic = unique("ck-idem")
    ck_create_topic(kafka4, topic)
    sent = messages(topic, 1000)
    ck_produce(kafka4, topic, sent, **{"enable.idempotence": True, "acks": "all", "compression.type": "lz4",
                                       "max.in.flight.requests.per.connection": 5})
    assert "InitProducerId" in traffic.api_versions

    ck_read_back_exactly_once(kafka4, topic, sent, 3)
    assert_no_upstream_address(kafka4, traffic)


def test_confluent_transactions(kafka4: Target, traffic: Traffic) -> None:
    from confluent_kafka import Producer

    topic = unique("ck-txn")
    ck_create_topic(kafka4, topic)
    first, aborted, second = messages(f"{topic}-c1", 100), messages(f"{topic}-ab", 50), messages(f"{topic}-c2", 100)

    producer = Producer({"bootstrap.servers": kafka4.bootstrap, "transactional.id": unique("ck-txn-id"),
                         "linger.ms": 5, "compression.type": "zstd"})
    producer.init_transactions(DEADLINE_S)
    for batch, commit in ((first, True), (aborted, False), (second, True)):
        producer.begin_transaction()
        for key, value in batch:
            producer.produce(topic, key=key, value=value)
        assert producer.flush(DEADLINE_S) == 0
        if commit:
            producer.commit_transaction(DEADLINE_S)
        else:
            producer.abort_transaction(DEADLINE_S)
    assert_kproxy_view(kafka4, _ck_brokers(producer.list_topics(timeout=10)), "transactional producer metadata")
    assert {"InitProducerId", "AddPartitionsToTxn", "EndTxn"} <= set(traffic.api_versions)

    committed = ck_assigned_consumer(kafka4, topic, 3, **{"isolation.level": "read_committed"})
    uncommitted = ck_assigned_consumer(kafka4, topic, 3, **{"isolation.level": "read_uncommitted"})
    try:
        assert_exactly_once(first + second, ck_consume([committed], len(first) + len(second)))
        # The aborted messages were really written: a read_uncommitted consumer sees them.
        assert_exactly_once(first + aborted + second, ck_consume([uncommitted], len(first + aborted + second)))
    finally:
        committed.close()
        uncommitted.close()
    assert_no_upstream_address(kafka4, traffic)


def _ck_group_consumers(target: Target, topic: str, group: str, protocol: str, count: int) -> list:
    from confluent_kafka import Consumer

    config = {"bootstrap.servers": target.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
              "group.protocol": protocol, "enable.auto.commit": False}
    if protocol == "classic":
        # KIP-848 consumers may not set it: their session timeout is the broker's.
        config["session.timeout.ms"] = SESSION_TIMEOUT_MS
    consumers = [Consumer(config) for _ in range(count)]
    for consumer in consumers:
        consumer.subscribe([topic])
    return consumers


def _ck_wait_assigned(consumers: list, partitions: int) -> None:
    """Poll until the group has settled with every partition assigned to some member."""
    def settled():
        for consumer in consumers:
            msg = consumer.poll(0.2)
            assert msg is None, f"a message arrived before anything was produced: {msg}"
        sizes = [len(consumer.assignment()) for consumer in consumers]
        return sum(sizes) == partitions and all(sizes)
    wait_for(settled, DEADLINE_S, f"{len(consumers)} consumers to share {partitions} partitions")


def _ck_describe_group(target: Target, admin, group: str):
    description = admin.describe_consumer_groups([group])[group].result(DEADLINE_S)
    coordinator = description.coordinator
    assert_kproxy_view(target, [(coordinator.host, coordinator.port)], "describe_consumer_groups coordinator")
    return description


@pytest.mark.parametrize("protocol", ["consumer", "classic"])
def test_confluent_consumer_group(kafka4: Target, traffic: Traffic, protocol: str) -> None:
    """Two members in one group (KIP-848 or classic) share the partitions, consume, commit."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    topic, group = unique(f"ck-group-{protocol}"), unique(f"ck-g-{protocol}")
    ck_create_topic(kafka4, topic, partitions=4)
    consumers = _ck_group_consumers(kafka4, topic, group, protocol, 2)
    try:
        # Join first, produce second: no rebalance can replay messages, so exactly once holds.
        _ck_wait_assigned(consumers, 4)
        sent = messages(topic, 400)
        ck_produce(kafka4, topic, sent)
        received = ck_consume(consumers, len(sent))
        assert_exactly_once(sent, received, ck_log_records(kafka4, topic, 4))
        for consumer in consumers:
            consumer.commit(asynchronous=False)
        admin = AdminClient({"bootstrap.servers": kafka4.bootstrap})
        description = _ck_describe_group(kafka4, admin, group)
        assert len(description.members) == 2
        offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(DEADLINE_S)
        assert sum(tp.offset for tp in offsets.topic_partitions) == len(sent)
    finally:
        for consumer in consumers:
            consumer.close()
    if protocol == "consumer":
        assert "ConsumerGroupHeartbeat" in traffic.api_versions
    else:
        assert {"JoinGroup", "SyncGroup", "Heartbeat"} <= set(traffic.api_versions)
    assert_no_upstream_address(kafka4, traffic)


def test_confluent_admin(kafka4: Target, traffic: Traffic) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec

    admin = AdminClient({"bootstrap.servers": kafka4.bootstrap})
    cluster = admin.describe_cluster(request_timeout=30).result(DEADLINE_S)
    assert_kproxy_view(kafka4, [(node.host, node.port) for node in cluster.nodes], "describe_cluster")
    assert_kproxy_view(kafka4, [(cluster.controller.host, cluster.controller.port)], "describe_cluster controller")
    assert_kproxy_view(kafka4, _ck_brokers(admin.list_topics(timeout=10)), "admin metadata")

    topic, group = unique("ck-admin"), unique("ck-admin-g")
    ck_create_topic(kafka4, topic, partitions=2, config={"retention.ms": "3600000"})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(DEADLINE_S)
    assert configs["retention.ms"].value == "3600000"

    sent = messages(topic, 200)
    ck_produce(kafka4, topic, sent)
    latest = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest() for p in range(2)})
    ends = {tp.partition: future.result(DEADLINE_S).offset for tp, future in latest.items()}
    assert sum(ends.values()) == len(sent)

    # A classic group consumes everything and commits; the admin sees the commits.
    consumer = _ck_group_consumers(kafka4, topic, group, "classic", 1)[0]
    try:
        received = ck_consume([consumer], len(sent))
        assert_exactly_once(sent, received, sum(ends.values()))
        consumer.commit(asynchronous=False)
        _ck_describe_group(kafka4, admin, group)
    finally:
        consumer.close()
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(DEADLINE_S)
    assert {tp.partition: tp.offset for tp in offsets.topic_partitions} == ends

    # delete_records moves partition 0's start; a fresh consumer sees only what is left.
    cut = ends[0] // 2
    deleted = admin.delete_records([TopicPartition(topic, 0, cut)])
    for future in deleted.values():
        assert future.result(DEADLINE_S).low_watermark == cut
    earliest = admin.list_offsets({TopicPartition(topic, 0): OffsetSpec.earliest()})
    assert next(iter(earliest.values())).result(DEADLINE_S).offset == cut
    remaining = [(p, o, k, v) for p, o, k, v in received if p != 0 or o >= cut]
    reader = ck_assigned_consumer(kafka4, topic, 2)
    try:
        again = ck_consume([reader], len(remaining))
        assert sorted(again) == sorted(remaining)
    finally:
        reader.close()
    # (librdkafka's describe_cluster is a Metadata request, not DescribeCluster.)
    assert {"DescribeConfigs", "ListOffsets", "OffsetFetch", "DeleteRecords", "DescribeGroups"} \
        <= set(traffic.api_versions)
    assert_no_upstream_address(kafka4, traffic)


# -- 3. kafka-python -----------------------------------------------------------------------


def kp_create_topic(target: Target, topic: str, partitions: int = 3, **client) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=target.bootstrap, **client)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
        wait_for(lambda: _kp_leaders_ready(admin, topic, partitions), DEADLINE_S, f"leaders of {topic}")
    finally:
        admin.close()


def _kp_leaders_ready(admin, topic: str, partitions: int) -> bool:
    described = admin.describe_topics([topic])
    return (len(described) == 1 and described[0]["error_code"] == 0
            and len(described[0]["partitions"]) == partitions
            and all(p.get("leader_id", p.get("leader", -1)) >= 0 for p in described[0]["partitions"]))


def kp_produce(target: Target, topic: str, sent: list[tuple[bytes, bytes]], **config) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=target.bootstrap, linger_ms=5, **config)
    try:
        futures = [producer.send(topic, key=key, value=value) for key, value in sent]
        producer.flush(DEADLINE_S)
        for future in futures:
            future.get(DEADLINE_S)
        assert_kproxy_view(target, _kp_brokers(producer._metadata), "kafka-python producer metadata")
    finally:
        producer.close(DEADLINE_S)


def _kp_brokers(cluster) -> set[tuple[str, int]]:
    return {(broker.host, broker.port) for broker in cluster.brokers()}


def kp_consume(consumer, expected: int, timeout: float = DEADLINE_S, to_end: bool = True) -> list[tuple]:
    """Like ``ck_consume``, for one kafka-python consumer."""
    received = []
    deadline = time.monotonic() + timeout
    quiet = QuietSpell()
    while True:
        before = len(received)
        for records in consumer.poll(timeout_ms=500).values():
            received.extend((r.partition, r.offset, r.key, r.value) for r in records)
        news = len(received) > before
        if len(received) >= expected and not to_end:
            if quiet(news):
                return received
        elif len(received) >= expected:
            assignment = consumer.assignment()
            ends = consumer.end_offsets(list(assignment))
            if all(consumer.position(tp) == ends[tp] for tp in assignment):
                return received
        if time.monotonic() > deadline:
            pytest.fail(f"consumed {len(received)} of {expected} messages in {timeout:.0f} s")


def kp_log_records(consumer, topic: str, partitions: int) -> int:
    from kafka import TopicPartition

    tps = [TopicPartition(topic, p) for p in range(partitions)]
    ends, starts = consumer.end_offsets(tps), consumer.beginning_offsets(tps)
    return sum(ends[tp] - starts[tp] for tp in tps)


def kp_assigned_consumer(target: Target, topic: str, partitions: int, **config):
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=target.bootstrap, enable_auto_commit=False, **config)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    return consumer


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_codec(kafka4: Target, traffic: Traffic, codec: str) -> None:
    topic = unique(f"kp-{codec}")
    kp_create_topic(kafka4, topic)
    sent = messages(topic, 300)
    kp_produce(kafka4, topic, sent, compression_type=None if codec == "none" else codec)
    assert codec in traffic.produce_codecs, f"produced with {traffic.produce_codecs}, not {codec}"

    consumer = kp_assigned_consumer(kafka4, topic, 3)
    try:
        assert_exactly_once(sent, kp_consume(consumer, len(sent)), kp_log_records(consumer, topic, 3))
    finally:
        consumer.close()
    assert_no_upstream_address(kafka4, traffic)


def _kp_group_round_trip(target: Target, traffic: Traffic, prefix: str, **client) -> str:
    """Create, produce, consume in a classic group, check the coordinator and commits."""
    from kafka import TopicPartition

    topic, group = unique(prefix), unique(f"{prefix}-g")
    kp_create_topic(target, topic, **client)
    sent = messages(topic, 300)
    kp_produce(target, topic, sent, compression_type="gzip", acks="all", **client)

    consumer = kafka_python_group_consumer(target.bootstrap, topic, group, enable_auto_commit=False, **client)
    try:
        received = kp_consume(consumer, len(sent), to_end=target.end_offsets_reliable)
        log_records = kp_log_records(consumer, topic, 3) if target.end_offsets_reliable else None
        assert_exactly_once(sent, received, log_records)
        consumer.commit()
        committed = sum(consumer.committed(TopicPartition(topic, p)) or 0 for p in range(3))
        assert committed == len(sent)
        cluster = consumer._client.cluster
        assert_kproxy_view(target, _kp_brokers(cluster), "kafka-python consumer metadata")
        coordinator_id = consumer._coordinator.coordinator_id
        coordinator = cluster.broker_metadata(coordinator_id)
        assert coordinator is not None, f"no address for coordinator {coordinator_id}"
        assert_kproxy_view(target, [(coordinator.host, coordinator.port)], "kafka-python group coordinator")
    finally:
        consumer.close()
    return topic


def test_kafka_python_group_and_admin(kafka4: Target, traffic: Traffic) -> None:
    from kafka import KafkaAdminClient, TopicPartition
    from kafka.admin import ConfigResource, ConfigResourceType

    topic = _kp_group_round_trip(kafka4, traffic, "kp-group")

    admin = KafkaAdminClient(bootstrap_servers=kafka4.bootstrap)
    try:
        cluster = admin.describe_cluster()
        assert_kproxy_view(kafka4, [(b["host"], b["port"]) for b in cluster["brokers"]],
                           "kafka-python describe_cluster")

        configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all")
        topic_configs = next(iter(configs.values()))[topic]
        assert "retention.ms" in topic_configs, configs

        # The KRaft quorum's nodes: their listeners are rewritten like any broker address.
        quorum = admin.describe_metadata_quorum()
        listeners = [(l["host"], l["port"]) for node in quorum["nodes"] for l in node["listeners"]]
        assert_kproxy_view(kafka4, listeners, "kafka-python describe_metadata_quorum listeners")

        tp = TopicPartition(topic, 0)
        start = kp_assigned_consumer(kafka4, topic, 3)
        try:
            end = start.end_offsets([tp])[tp]
            cut = end // 2
            admin.delete_records({tp: cut})
            assert start.beginning_offsets([tp])[tp] == cut
        finally:
            start.close()
    finally:
        admin.close()
    assert {"DescribeCluster", "DescribeConfigs", "DeleteRecords", "DescribeQuorum"} <= set(traffic.api_versions)
    assert_no_upstream_address(kafka4, traffic)


def test_kafka_python_old_protocol_versions(kafka4: Target, traffic: Traffic) -> None:
    """api_version=(2, 5, 0): the request versions a 2.5-era client sends still work."""
    _kp_group_round_trip(kafka4, traffic, "kp-old", api_version=(2, 5, 0))
    used = traffic.api_versions
    assert max(used["Produce"]) <= 8 and max(used["Fetch"]) <= 11 and max(used["Metadata"]) <= 9, used
    assert_no_upstream_address(kafka4, traffic)


# -- 4. aiokafka ---------------------------------------------------------------------------


def test_aiokafka_codecs_and_group(kafka4: Target, traffic: Traffic) -> None:
    import aiokafka.codec
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    codecs = ["gzip", "lz4"] + (["zstd"] if aiokafka.codec.has_zstd() else [])
    topic, group = unique("aio"), unique("aio-g")
    kp_create_topic(kafka4, topic)
    sent = {codec: messages(f"{topic}-{codec}", 100) for codec in codecs}

    async def run() -> tuple[list[tuple], int]:
        for codec, batch in sent.items():
            producer = AIOKafkaProducer(bootstrap_servers=kafka4.bootstrap, compression_type=codec,
                                        acks="all", linger_ms=5)
            await producer.start()
            try:
                futures = [await producer.send(topic, key=key, value=value) for key, value in batch]
                await producer.flush()
                for future in futures:
                    await asyncio.wait_for(future, DEADLINE_S)
                assert_kproxy_view(kafka4, _kp_brokers(producer.client.cluster), "aiokafka producer metadata")
            finally:
                await producer.stop()

        consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka4.bootstrap, group_id=group,
                                    auto_offset_reset="earliest", enable_auto_commit=False,
                                    session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=1000)
        await consumer.start()
        try:
            expected = sum(len(batch) for batch in sent.values())
            received = []
            deadline = time.monotonic() + DEADLINE_S
            while True:
                batches = await consumer.getmany(timeout_ms=500)
                for records in batches.values():
                    received.extend((r.partition, r.offset, r.key, r.value) for r in records)
                if len(received) >= expected:
                    assignment = list(consumer.assignment())
                    ends = await consumer.end_offsets(assignment)
                    positions = [await consumer.position(tp) for tp in assignment]
                    if positions == [ends[tp] for tp in assignment]:
                        break
                assert time.monotonic() < deadline, f"consumed {len(received)} of {expected}"
            await consumer.commit()
            tps = sorted(consumer.assignment())
            ends, starts = await consumer.end_offsets(tps), await consumer.beginning_offsets(tps)
            cluster = consumer._client.cluster
            assert_kproxy_view(kafka4, _kp_brokers(cluster), "aiokafka consumer metadata")
            coordinator = cluster.broker_metadata(consumer._coordinator.coordinator_id)
            assert_kproxy_view(kafka4, [(coordinator.host, coordinator.port)], "aiokafka group coordinator")
            return received, sum(ends[tp] - starts[tp] for tp in tps)
        finally:
            await consumer.stop()

    received, log_records = asyncio.run(asyncio.wait_for(run(), 2 * DEADLINE_S))
    assert_exactly_once([m for batch in sent.values() for m in batch], received, log_records)
    assert set(codecs) <= traffic.produce_codecs, traffic.produce_codecs
    assert_no_upstream_address(kafka4, traffic)


# -- 5. the core cases against Kafka 3.9.2 and Tansu ----------------------------------------


@pytest.fixture(params=["kafka3", "tansu"])
def other_broker(request) -> Target:
    return request.getfixturevalue(request.param)


def test_core_confluent(other_broker: Target, traffic: Traffic) -> None:
    """Create, produce (lz4), consume in a classic group, metadata view, no leak."""
    from confluent_kafka.admin import AdminClient

    target = other_broker
    topic, group = unique("ck-core"), unique("ck-core-g")
    ck_create_topic(target, topic)
    sent = messages(topic, 300)
    ck_produce(target, topic, sent, **{"compression.type": "lz4", "acks": "all"})
    consumer = _ck_group_consumers(target, topic, group, "classic", 1)[0]
    try:
        received = ck_consume([consumer], len(sent), to_end=target.end_offsets_reliable)
        log_records = ck_log_records(target, topic, 3) if target.end_offsets_reliable else None
        assert_exactly_once(sent, received, log_records)
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    admin = AdminClient({"bootstrap.servers": target.bootstrap})
    assert_kproxy_view(target, _ck_brokers(admin.list_topics(timeout=10)), "admin metadata")
    _ck_describe_group(target, admin, group)
    assert_no_upstream_address(target, traffic)


def test_core_kafka_python(other_broker: Target, traffic: Traffic) -> None:
    _kp_group_round_trip(other_broker, traffic, "kp-core")
    assert_no_upstream_address(other_broker, traffic)


# -- controls: the checks above can fail ----------------------------------------------------


def test_leak_check_catches_an_unrewritten_address(kafka4: Target, traffic: Traffic) -> None:
    """Through a plain relay (no rewriting), the broker's real address reaches the client:
    ``assert_no_upstream_address`` must notice. Guards against a recorder that sees nothing."""
    from kproxy.embedded import metadata_brokers
    from kproxy.proxy.relay import start_relay

    broker = kafka4.cluster.nodes[0]
    server = kafka4.proxy.call(start_relay((LOOPBACK, 0), (broker.host, broker.port)))
    port = server.sockets[0].getsockname()[1]                  # chosen by the OS
    try:
        listed = metadata_brokers(LOOPBACK, port)
    finally:
        async def close():
            server.close()
            await server.wait_closed()
        kafka4.proxy.call(close())
    assert {(b.host, b.port) for b in listed} == {(broker.host, broker.port)}
    with pytest.raises(AssertionError, match="leaked to a client"):
        assert_no_upstream_address(kafka4, traffic)


