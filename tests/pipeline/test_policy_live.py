"""A policy dry run: real clients through kproxy, the live metric, and ``kproxy analyze --policy``.

Kafka 3.9 (it still takes the versions Kafka 4.0 removed) and four producers, each
breaking at most one rule: an acks=1 producer, kafka-python pinned to Kafka 0.10's protocol,
a client without a client id of its own (librdkafka's default), and a compliant one. The live metric must flag exactly the
three that break a rule, and ``kproxy analyze`` over the capture of the same run must find
the same violations, counted the same. The whole ``kproxy analyze`` run (every table, the
report) is the soak variant's: the default suite builds the policy table alone.
"""

from __future__ import annotations

import json
import uuid

import pytest

from kproxy.observers.capture import Capture, CaptureConfig
from kproxy.pipeline import Options, analyze
from kproxy.pipeline.policy import policy_violations
from kproxy.pipeline.report import render
from kproxy.pipeline.source import resolve_inputs
from kproxy.policy import load_policy
from tests.observers.metrics import scrape
from tests.proxy.harness import ProxyThread

pytestmark = [pytest.mark.broker, pytest.mark.timeout(300),
              pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning")]

RULES = """
[rules.acks-all]
check = "acks_all"

[rules.kafka4-ready]
check = "removed_api_versions"

[rules.named]
check = "client_id"
pattern = "^svc-"

[rules.compressed]
check = "compressed"
"""
RECORDS = 5
# librdkafka sends a batch uncompressed when compressing would not make it smaller: values
# this long and repetitive always shrink.
VALUE = b"policy " * 100


def _confluent(bootstrap: str, topic: str, **settings) -> None:
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, **settings})
    for i in range(RECORDS):
        producer.produce(topic, VALUE + b"%d" % i, partition=0)
    assert producer.flush(30) == 0


@pytest.fixture(scope="module")
def dry_run(kafka3_cluster, tmp_path_factory):
    """Four producers through kproxy with a dry-run policy: (rules file, capture directory,
    the live metric's violations {(rule, client_id, client_software): requests})."""
    from confluent_kafka.admin import AdminClient, NewTopic
    from kafka import KafkaProducer

    tmp_path = tmp_path_factory.mktemp("policy")
    rules = tmp_path / "policy.toml"
    rules.write_text(RULES)
    topic = f"policy-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka3_cluster.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)   # directly: the admin client is unnamed
    capture = Capture(instance_name="kproxy-policy-test")
    directory = tmp_path / "capture"
    with ProxyThread(observers=[capture], upstream=kafka3_cluster.bootstrap_servers,
                     policy_file=str(rules)) as proxy:
        capture.start(CaptureConfig(directory=str(directory), formats=("jsonl",)))
        _confluent(proxy.bootstrap, topic, **{"client.id": "svc-good", "acks": "all",
                                              "compression.type": "zstd"})
        _confluent(proxy.bootstrap, topic, **{"client.id": "svc-acks1", "acks": "1",
                                              "compression.type": "lz4"})
        # No client.id of its own: librdkafka's default, "rdkafka", which the pattern refuses.
        _confluent(proxy.bootstrap, topic, **{"acks": "all", "compression.type": "zstd"})
        legacy = KafkaProducer(bootstrap_servers=proxy.bootstrap, client_id="svc-legacy",
                               api_version=(0, 10), acks="all", compression_type="gzip")
        for i in range(RECORDS):
            legacy.send(topic, value=VALUE + b"%d" % i, partition=0).get(30)
        legacy.close()
        status = capture.stop()
        live = {(dict(labels)["rule"], dict(labels)["client_id"], dict(labels)["client_software"]): value
                for (name, labels), value in scrape(proxy).items() if name == "kproxy_policy_violations_total"}
    assert status["counters"]["dropped"] == 0
    return rules, directory, live


def test_dry_run_flags_exactly_the_clients_that_break_a_rule(dry_run):
    _, _, live = dry_run
    assert {(rule, client) for rule, client, _ in live} == {
        ("acks-all", "svc-acks1"), ("kafka4-ready", "svc-legacy"), ("named", "rdkafka")}
    assert all(software.startswith("confluent-kafka-python ")
               for rule, _, software in live if rule != "kafka4-ready")
    acks = next(v for (rule, _, _), v in live.items() if rule == "acks-all")
    assert 1 <= acks <= RECORDS                   # its Produce requests (batches may join records)


def test_the_capture_judged_after_the_fact_finds_the_same_violations(dry_run, spark):
    rules, directory, live = dry_run
    table = policy_violations(spark, resolve_inputs([str(directory)]), load_policy(rules)).collect()
    found = {(r["rule"], r["client_id"], r["client_software"]): r["violations"] for r in table}
    assert found == live
    legacy = next(r.asDict() for r in table if r["rule"] == "kafka4-ready")
    assert "removed in Kafka 4.0" in legacy["example_reason"] and not legacy["enforced"]
    # The report's section, from those rows (as analyze hands them over).
    page = render({"policy_violations": [r.asDict() for r in table]},
                  {"policy": {"file": str(rules), "rules": ["acks-all"], "violations": sum(live.values())}},
                  plots=None)
    assert 'id="policy"' in page and "svc-acks1" in page and "removed in Kafka 4.0" in page


@pytest.mark.soak
def test_kproxy_analyze_with_a_policy_writes_the_table_summary_and_report(dry_run, spark, tmp_path):
    import pyarrow.parquet as pq
    rules, directory, live = dry_run
    result = analyze(spark, [str(directory)], str(tmp_path / "out"),
                     Options(window_seconds=10, policy=load_policy(rules)))
    table = pq.read_table(result.tables["policy_violations"]).to_pylist()
    assert {(r["rule"], r["client_id"], r["client_software"]): r["violations"] for r in table} == live
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["policy"]["violations"] == sum(live.values())
    assert "svc-acks1" in (tmp_path / "out" / "report.html").read_text()
