"""Enforced policy rules against a real Kafka 4 broker and real clients.

kproxy answers a refused request itself, with the error a broker would give, and never
forwards it: confluent-kafka's delivery report shows INVALID_REQUIRED_ACKS for an acks=1
producer (and the topic stays empty), ``kafka-topics --create`` shows the policy error
for a badly named topic (which is not created); an acks=all producer and a well named
topic, on the same kproxy, see nothing.
"""

from __future__ import annotations

import json
import urllib.request
import uuid

import pytest

from tests.observers.metrics import scrape, sample
from tests.proxy.harness import ProxyThread
from kproxy.embedded.kafka import run_tool

pytestmark = [pytest.mark.broker, pytest.mark.timeout(240)]

RULES = """
[rules.acks-all]
check = "acks_all"
enforce = true

[rules.team-topics]
check = "topic_names"
pattern = "^team-"
enforce = true

[rules.named]
check = "client_id"
pattern = "^(svc-|adminclient-)"
"""
TOOL_TIMEOUT_S = 120
TOKEN = "policy-page-token"


def _produce(bootstrap: str, topic: str, acks: str, client_id: str, count: int = 3):
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, "client.id": client_id,
                         "enable.idempotence": False, "linger.ms": 0, "message.timeout.ms": 20000})
    reports = []
    for i in range(count):
        producer.produce(topic, b"v%d" % i, partition=0, on_delivery=lambda err, msg: reports.append(err))
    assert producer.flush(30) == 0
    return reports


def test_enforced_rules_answer_with_broker_errors(kafka_cluster, tmp_path):
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    rules = tmp_path / "policy.toml"
    rules.write_text(RULES)
    good, bad = f"team-{uuid.uuid4().hex[:8]}", f"misc-{uuid.uuid4().hex[:8]}"
    with ProxyThread(upstream=kafka_cluster.bootstrap_servers, policy_file=str(rules),
                     admin_token=TOKEN) as proxy:
        def topics_tool(*args, check=True):
            return run_tool(kafka_cluster, kafka_cluster.tools.topics, "--bootstrap-server", proxy.bootstrap,
                            *args, check=check, timeout=TOOL_TIMEOUT_S)

        topics_tool("--create", "--topic", good, "--partitions", "1", "--replication-factor", "1")
        refused = topics_tool("--create", "--topic", bad, "--partitions", "1", check=False)
        assert refused.returncode != 0
        assert "PolicyViolationException" in refused.stdout + refused.stderr
        assert "team-topics" in refused.stdout + refused.stderr       # kproxy's message names the rule

        rejected = _produce(proxy.bootstrap, good, "1", "svc-careless")
        assert [e.code() if e else None for e in rejected] == [KafkaError.INVALID_REQUIRED_ACKS] * 3
        accepted = _produce(proxy.bootstrap, good, "all", "svc-careful")
        assert accepted == [None, None, None]
        _pipelined_answers_keep_request_order(proxy.bootstrap, good)

        m = scrape(proxy)
        assert sample(m, "kproxy_policy_refused_total", rule="team-topics") == 1
        assert sample(m, "kproxy_policy_refused_total", rule="acks-all") >= 1
        # Refused requests are violations too; the dry-run rule flags only the unnamed tool.
        assert sample(m, "kproxy_policy_violations_total", rule="acks-all", client_id="svc-careless",
                      client_software="confluent-kafka-python " + _software_version(m)) >= 1
        violators = {(dict(labels)["rule"], dict(labels)["client_id"])
                     for name, labels in m if name == "kproxy_policy_violations_total"}
        assert ("acks-all", "svc-careful") not in violators
        assert {rule for rule, _ in violators} <= {"acks-all", "team-topics", "named"}

        # The live page's policy panel: each violator once, with its first request.
        request = urllib.request.Request(proxy.admin_url + "/live/policy",
                                         headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=30) as r:
            page = json.load(r)
        assert {r["name"]: (r["enforce"], r["refused"]) for r in page["rules"]} == {
            "acks-all": (True, sample(m, "kproxy_policy_refused_total", rule="acks-all")),
            "team-topics": (True, 1), "named": (False, 0)}
        careless = next(v for v in page["violators"] if v["client_id"] == "svc-careless")
        assert careless["rule"] == "acks-all" and careless["enforced"]
        assert careless["example"]["api"] == "Produce" and careless["example"]["reason"] == "acks=1"
        topic = next(v for v in page["violators"] if v["rule"] == "team-topics")
        assert topic["example"]["api"] == "CreateTopics" and bad in topic["example"]["reason"]

    # Never forwarded: the topic was not created, and only the acks=all records are in the log.
    listed = run_tool(kafka_cluster, kafka_cluster.tools.topics, "--bootstrap-server",
                      kafka_cluster.bootstrap_servers, "--list", timeout=TOOL_TIMEOUT_S).stdout.split()
    assert good in listed and bad not in listed
    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap_servers, "group.id": uuid.uuid4().hex})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(good, 0), timeout=30)
    finally:
        consumer.close()
    assert high - low == 3


def _pipelined_answers_keep_request_order(bootstrap: str, topic: str) -> None:
    """Refused requests pipelined between forwarded ones: every answer in request order
    (``RawClient`` checks each correlation id), the refusals kproxy's, none for acks=0."""
    from kproxy.protocol import Struct
    from kproxy.protocol.record_encoder import build_batch
    from kproxy.protocol.records import Record
    from tests.proxy.wire import RawClient, request_frame

    def produce(correlation_id: int, acks: int) -> bytes:
        batch = build_batch([Record(0, 0, b"k", b"pipelined", ())], "none")
        return request_frame(0, 9, correlation_id, header_client_id="svc-pipelining", acks=acks,
                             timeout_ms=5000, topic_data=[Struct(name=topic, partition_data=[
                                 Struct(index=0, records=batch)])])

    client = RawClient(bootstrap, client_id="svc-pipelining")
    try:
        client.send(b"".join((request_frame(3, 12, 1, topics=None), produce(2, 1),
                              request_frame(3, 12, 3, topics=None), produce(4, 0),
                              request_frame(3, 12, 5, topics=None))))
        client._pending = [(1, 3, 12), (2, 0, 9), (3, 3, 12), (5, 3, 12)]    # acks=0: no answer
        answers = [client.read_response() for _ in range(4)]
    finally:
        client.close()
    assert [a.correlation_id for a in answers] == [1, 2, 3, 5]
    refusal = answers[1].body.responses[0].partition_responses[0]
    assert refusal.error_code == 21 and "acks-all" in refusal.error_message     # INVALID_REQUIRED_ACKS
    assert all(a.body.brokers for a in answers[0::2])                           # the broker's own


def _software_version(m) -> str:
    """confluent-kafka-python's version as it names itself in ApiVersions (from the metrics)."""
    for name, labels in m:
        labels = dict(labels)
        if name == "kproxy_policy_violations_total" and labels.get("client_software", "").startswith(
                "confluent-kafka-python "):
            return labels["client_software"].split(" ", 1)[1]
    return "?"
