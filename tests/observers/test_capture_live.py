"""Capture live traffic: real clients → kproxy (Capture as an observer) → Apache Kafka.

Every request/response pair the proxy saw is one JSONL row and one Parquet
row, and tshark reads the pcapng back with the same correlation ids, API
keys and (for the versions it dissects) topic names. A confluent-kafka
consumer group (classic and KIP-848) fills the schema version 2 columns.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from kproxy.observers.capture import Capture, CaptureConfig
from kproxy.protocol.events import RequestReceived, ResponseReceived
from tests.observers.captures import files, read_jsonl, read_parquet, tshark
from tests.proxy.harness import ProxyThread, kafka_python_group_consumer

pytestmark = [
    pytest.mark.broker,
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning"),
]



def test_capture_real_client_traffic(kafka_cluster, tmp_path):
    from kafka import KafkaProducer

    capture = Capture()
    closed = []                   # (connection id, requests in flight): what the relay's close hook said

    class CloseWatcher:
        def __call__(self, info, events):
            pass

        def connection_closed(self, info, reason=None, in_flight=None):
            closed.append((info.id, in_flight))

    capture.start(CaptureConfig(directory=str(tmp_path), formats=("jsonl", "parquet", "pcapng")))
    pairs = []                    # what the proxy itself saw: (connection, correlation id, api key, outcome)
    requests, responses = [], []  # (client port, correlation id, api key), answered or not

    def record(info, events):
        for e in events:
            if isinstance(e, ResponseReceived):
                pairs.append((info.id, e.correlation_id, e.api_key, "response"))
                responses.append((info.client[1], e.correlation_id, e.api_key))
            elif isinstance(e, RequestReceived):
                requests.append((info.client[1], e.correlation_id, e.api_key))
                if not e.expects_response:
                    pairs.append((info.id, e.correlation_id, e.api_key, "no_response"))

    nodes = kafka_cluster.nodes
    topic = f"cap-{uuid.uuid4().hex[:8]}"
    with ProxyThread(observers=[record, capture, CloseWatcher()],
                     upstream=kafka_cluster.bootstrap_servers) as proxy:
        common = dict(bootstrap_servers=proxy.bootstrap, api_version=(2, 5, 0))
        producer = KafkaProducer(client_id="cap-producer", acks=1, linger_ms=5, **common)
        for i in range(50):
            producer.send(topic, key=b"k%d" % i, value=b"v%d" % i)
        producer.flush()
        producer.close()
        fire_and_forget = KafkaProducer(client_id="cap-acks0", acks=0, **common)
        for i in range(5):
            fire_and_forget.send(topic, value=b"acks0-%d" % i).get(10)
        fire_and_forget.flush()
        fire_and_forget.close()
        consumer = kafka_python_group_consumer(proxy.bootstrap, topic, f"g-{topic}", client_id="cap-consumer",
                                               consumer_timeout_ms=4000, api_version=common["api_version"])
        # Until all 55 came (the 4 s without records is the bound); a duplicate written by
        # a retry would show in the captured Produce record count checked below.
        got = []
        for m in consumer:
            got.append(m.value)
            if len(got) == 55:
                break
        consumer.close()
    status = capture.stop()
    assert len(got) == 55
    assert status["counters"]["dropped"] == 0 and status["counters"]["row_errors"] == 0

    rows = read_jsonl(tmp_path)
    table = read_parquet(tmp_path)
    unanswered = sum(n for _, n in closed)
    assert len(rows) == table.num_rows == len(pairs) + unanswered > 20
    key = lambda r: (r["connection_id"], r["correlation_id"], r["api_key"], r["outcome"])  # noqa: E731
    answered = [key(r) for r in rows if r["outcome"] != "unanswered"]
    assert sorted(answered) == sorted(pairs)
    assert sorted(key(r) for r in table.to_pylist() if r["outcome"] != "unanswered") == sorted(pairs)
    assert sum(r["outcome"] == "unanswered" for r in rows) == unanswered
    assert {r["client_id"] for r in rows} >= {"cap-producer", "cap-acks0", "cap-consumer"}
    assert sum(r["outcome"] == "no_response" for r in rows) >= 5
    produced = sum(r["record_count"] or 0 for r in rows if r["api_name"] == "Produce")
    assert produced == 55
    assert all(r["decode_error"] is None for r in rows)
    assert {r["proxy_instance"] for r in rows} == {capture.instance_name}
    assert all(r["connection_start"] is not None and r["connection_start"] <= r["time"] for r in rows)

    # tshark: every request (a consumer's last long-poll Fetch included) and every response.
    broker_ports = {n.port for n in nodes}
    expected_requests = sorted(requests)
    assert expected_requests == sorted((r["client_port"], r["correlation_id"], r["api_key"]) for r in rows)
    expected_responses = sorted(responses)
    assert expected_responses == sorted((r["client_port"], r["correlation_id"], r["api_key"])
                                        for r in rows if r["outcome"] == "response")
    seen_requests, seen_responses, topics_by_pdu = [], [], {}
    for pcap in files(tmp_path, "pcapng"):
        for port in broker_ports:
            for src, dst, corr, api_key, topics in tshark(
                    pcap, "tcp.srcport", "tcp.dstport", "kafka.correlation_id", "kafka.api_key",
                    "kafka.topic_name", decode_port=port):
                src, dst = int(src), int(dst)
                if dst in broker_ports:
                    seen_requests.append((src, int(corr), int(api_key)))
                    topics_by_pdu[(src, int(corr))] = {t for t in topics.split(",") if t}
                else:
                    seen_responses.append((dst, int(corr), int(api_key)))
    assert sorted(seen_requests) == expected_requests
    assert sorted(seen_responses) == expected_responses
    # Each stream ends with FIN from both sides.
    fins = sum(len(tshark(p, "frame.number", display="tcp.flags.fin == 1")) for p in files(tmp_path, "pcapng"))
    assert fins == 2 * len(closed) > 0
    # Topic names tshark dissects from requests (kafka-python 2.5 uses Produce v8, Metadata v9,
    # versions Debian's tshark 4.0 dissects in full) agree with the decoded JSONL bodies.
    checked = 0
    for r in rows:
        if r["api_name"] == "Produce":
            names = {t["name"] for t in r["request"]["topic_data"]}
        elif r["api_name"] == "Metadata" and r["request"]["topics"]:
            names = {t["name"] for t in r["request"]["topics"]}
        else:
            continue
        assert topics_by_pdu[(r["client_port"], r["correlation_id"])] == names == {topic}
        checked += 1
    assert checked >= 3


def _poll_until(consumer, done, timeout_s=60.0):
    got = []
    deadline = time.monotonic() + timeout_s
    while not done(got) and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None and not msg.error():
            got.append(msg.value())
    return got


def test_capture_v2_columns_from_real_consumer_groups(kafka_cluster, tmp_path):
    """librdkafka through kproxy: a classic group (JoinGroup/SyncGroup/Heartbeat/OffsetCommit)
    and a KIP-848 group (ConsumerGroupHeartbeat); the instance name comes from the config."""
    import confluent_kafka
    from confluent_kafka import Consumer, Producer

    heartbeats = threading.Event()

    def watch(info, events):
        if any(isinstance(e, ResponseReceived) and e.api_key == 12 for e in events):    # Heartbeat
            heartbeats.set()

    topic = f"cap2-{uuid.uuid4().hex[:8]}"
    classic, kip848 = f"classic-{topic}", f"kip848-{topic}"
    with ProxyThread(observers=[watch], upstream=kafka_cluster.bootstrap_servers, instance_name="cap-live-7") as proxy:
        capture = proxy.runtime.capture
        capture.start(CaptureConfig(directory=str(tmp_path), formats=("jsonl", "parquet")))
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "client.id": "v2-producer"})
        for i in range(10):
            producer.produce(topic, value=b"v%d" % i)
        assert producer.flush(30) == 0
        common = {"bootstrap.servers": proxy.bootstrap, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False}
        consumer = Consumer({**common, "group.id": classic, "client.id": "v2-classic",
                             "session.timeout.ms": 6000, "heartbeat.interval.ms": 200})
        consumer.subscribe([topic])
        got = _poll_until(consumer, lambda got: len(got) >= 10 and heartbeats.is_set())
        consumer.commit(asynchronous=False)
        consumer.close()
        assert len(got) == 10 and heartbeats.is_set()
        consumer = Consumer({**common, "group.id": kip848, "client.id": "v2-kip848", "group.protocol": "consumer"})
        consumer.subscribe([topic])
        assert len(_poll_until(consumer, lambda got: len(got) >= 10)) == 10
        consumer.commit(asynchronous=False)
        consumer.close()
        status = capture.stop()
    assert status["counters"]["dropped"] == 0 and status["counters"]["row_errors"] == 0

    rows = read_jsonl(tmp_path)
    table = read_parquet(tmp_path).to_pylist()
    assert len(rows) == len(table) > 20
    assert {r["proxy_instance"] for r in rows} == {"cap-live-7"} == {r["proxy_instance"] for r in table}
    assert all(r["connection_start"] is not None and r["connection_start"] <= r["time"] for r in table)
    # What librdkafka sends in ApiVersions v3+, as the library itself reports its versions.
    software = ("confluent-kafka-python",
                f"{confluent_kafka.__version__}-rdkafka-{confluent_kafka.libversion()[0]}")
    ours = [r for r in rows if r["client_id"] in ("v2-producer", "v2-classic", "v2-kip848")]
    assert {r["client_id"] for r in ours} == {"v2-producer", "v2-classic", "v2-kip848"}
    assert {(r["client_software_name"], r["client_software_version"]) for r in ours} == {software}
    assert any(r["api_name"] == "ApiVersions" and r["api_version"] >= 3 for r in ours)

    # Classic group: the member id and generation of the JoinGroup that succeeded are on
    # every later SyncGroup, Heartbeat and OffsetCommit of that member.
    group_rows = [r for r in table if r["group_id"] == classic]
    joined = [r for r in group_rows if r["api_name"] == "JoinGroup" and not r["errors"]]
    assert len(joined) == 1 and joined[0]["generation"] >= 1 and joined[0]["member_id"]
    member, generation = joined[0]["member_id"], joined[0]["generation"]
    for api in ("SyncGroup", "Heartbeat", "OffsetCommit"):
        answered = [r for r in group_rows if r["api_name"] == api and r["outcome"] == "response"]
        assert answered, api
        assert {(r["member_id"], r["generation"]) for r in answered} == {(member, generation)}, api
    assert any(r["api_name"] == "OffsetFetch" for r in group_rows)
    assert any(r["api_name"] == "LeaveGroup" and r["member_id"] == member for r in group_rows)

    # KIP-848 group: one member id; epochs from the broker's answers, at least 1 once joined.
    beats = [r for r in table if r["api_name"] == "ConsumerGroupHeartbeat" and r["outcome"] == "response"]
    assert beats and {r["group_id"] for r in beats} == {kip848}
    assert len({r["member_id"] for r in beats}) == 1 and None not in {r["member_id"] for r in beats}
    assert max(r["generation"] or 0 for r in beats) >= 1
    commits = [r for r in table if r["api_name"] == "OffsetCommit" and r["group_id"] == kip848]
    assert commits and {r["member_id"] for r in commits} == {beats[0]["member_id"]}
