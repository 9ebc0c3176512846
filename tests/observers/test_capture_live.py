"""Capture live traffic: kafka-python → kproxy (Capture as an observer) → Apache Kafka.

Every request/response pair the proxy saw is one JSONL row and one Parquet
row, and tshark reads the pcapng back with the same correlation ids, API
keys and (for the versions it dissects) topic names.
"""

from __future__ import annotations

import uuid

import pytest

from kproxy.observers.capture import Capture, CaptureConfig
from kproxy.protocol.connection import RequestReceived, ResponseReceived
from tests.observers.test_capture import files, read_jsonl, read_parquet
from tests.observers.test_capture_pcapng import tshark
from tests.proxy.harness import ProxyThread, free_ports

pytestmark = [
    pytest.mark.broker,
    pytest.mark.timeout(180),
    pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning"),
]



def test_capture_real_client_traffic(kafka_cluster, tmp_path):
    from kafka import KafkaConsumer, KafkaProducer

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
    ports = free_ports(len(nodes))
    topic = f"cap-{uuid.uuid4().hex[:8]}"
    with ProxyThread(observers=[record, capture, CloseWatcher()], upstream=kafka_cluster.bootstrap_servers,
                     broker_port_rule="map",
                     broker_port_map={n.node_id: p for n, p in zip(nodes, ports)}) as proxy:
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
        consumer = KafkaConsumer(topic, client_id="cap-consumer", group_id=f"g-{topic}",
                                 auto_offset_reset="earliest", consumer_timeout_ms=4000,
                                 session_timeout_ms=6000, heartbeat_interval_ms=1000, **common)
        got = [m.value for m in consumer]
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
