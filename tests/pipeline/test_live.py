"""Real traffic → kproxy capture → ``kproxy analyze``, checked against the same rows in plain Python.

Apache Kafka 3.9.2 (it still accepts the versions Kafka 4.0 removed), real
clients through kproxy with capture on (Parquet and JSONL): a confluent-kafka
producer, a classic consumer group that rebalances when a second member joins
mid-run (half the records are produced after it joined), and kafka-python pinned
to Kafka 0.10's protocol (Produce v2, removed by KIP-896). Capture stops before
the consumers leave, so the group went through exactly the two generations the
test caused.
"""

from __future__ import annotations

import time
import uuid

import pyarrow.dataset as ds
import pytest

from kproxy.observers.capture import Capture, CaptureConfig
from kproxy.pipeline import Options, analyze, load_capture, tables
from kproxy.pipeline.tables import PERCENTILE_ACCURACY
from kproxy.protocol import is_removed
from tests.pipeline import reference as ref
from tests.proxy.harness import ProxyThread

pytestmark = [pytest.mark.broker, pytest.mark.timeout(300),
              pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning")]

PRODUCED = 300
LEGACY_PRODUCED = 10
GROUP_TIMEOUT_S = 60
COMMIT_SETTLE_S = 1.0       # two auto-commit intervals after the last record was read
POLL_WAIT_S = 0.2           # how long a poll waits when the last round brought nothing


def _poll_until(consumers, done, timeout=GROUP_TIMEOUT_S):
    """Poll every consumer in turn (each must poll to take part in a rebalance) until ``done()``.

    One record per consumer per round. A poll waits only after a round that brought nothing:
    otherwise a member with nothing left would cost a whole wait per record of the other."""
    got = {id(c): [] for c in consumers}
    deadline = time.monotonic() + timeout
    wait = POLL_WAIT_S
    while not done(got):
        assert time.monotonic() < deadline, "consumer group did not settle"
        news = False
        for c in consumers:
            m = c.poll(wait)
            if m is not None and m.error() is None:
                got[id(c)].append(m.value())
                news = True
        wait = 0 if news else POLL_WAIT_S
    return got


@pytest.fixture(scope="module")
def live_capture(kafka3_cluster, tmp_path_factory):
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from kafka import KafkaProducer

    directory = tmp_path_factory.mktemp("live-capture")
    topic, group = f"live-{uuid.uuid4().hex[:8]}", f"live-group-{uuid.uuid4().hex[:6]}"
    capture = Capture(instance_name="kproxy-live-test")
    with ProxyThread(observers=[capture], upstream=kafka3_cluster.bootstrap_servers) as proxy:
        capture.start(CaptureConfig(directory=str(directory), formats=("parquet", "jsonl")))
        admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)

        producer = Producer({"bootstrap.servers": proxy.bootstrap, "client.id": "live-producer",
                             "linger.ms": 5})

        def produce(numbers):
            for i in numbers:
                producer.produce(topic, key=b"%d" % i, value=b"value-%d" % i)
            assert producer.flush(30) == 0

        produce(range(PRODUCED // 2))
        legacy = KafkaProducer(bootstrap_servers=proxy.bootstrap, client_id="legacy-producer",
                               api_version=(0, 10))
        for i in range(LEGACY_PRODUCED):
            legacy.send(topic, value=b"legacy-%d" % i).get(30)
        legacy.close()

        common = {"bootstrap.servers": proxy.bootstrap, "group.id": group,
                  "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                  "heartbeat.interval.ms": 500, "enable.auto.commit": True,
                  "auto.commit.interval.ms": 500}
        first = Consumer({**common, "client.id": "live-consumer-a"})
        first.subscribe([topic])
        alone = _poll_until([first], lambda g: len(g[id(first)]) >= 50)
        second = Consumer({**common, "client.id": "live-consumer-b"})
        second.subscribe([topic])
        joined = _poll_until([first, second],
                             lambda g: len(second.assignment()) > 0 and len(first.assignment()) > 0)
        # The second half is produced once both members hold a partition (its keys land on
        # both), so each reads new records whatever the first had read and committed before.
        produce(range(PRODUCED // 2, PRODUCED))
        # Both members fetch what is left: until every record was read, the second member's too.
        before = sum(map(len, alone.values())) + sum(map(len, joined.values()))
        _poll_until([first, second],
                    lambda g: len(joined[id(second)]) + len(g[id(second)]) > 0
                    and before + sum(map(len, g.values())) >= PRODUCED + LEGACY_PRODUCED)
        settle = time.monotonic() + COMMIT_SETTLE_S
        _poll_until([first, second], lambda g: time.monotonic() >= settle)
        status = capture.stop()
        first.close()
        second.close()
        producer.flush(5)
    rows = ds.dataset(sorted(map(str, directory.glob("*.parquet"))), format="parquet").to_table().to_pylist()
    return directory, rows, topic, group, status


@pytest.fixture(scope="module")
def analysed(spark, live_capture, tmp_path_factory):
    directory = live_capture[0]
    parquet = analyze(spark, [str(directory)], str(tmp_path_factory.mktemp("live-parquet")),
                      Options(window_seconds=10, report=False))
    _, jsonl = load_capture(spark, [str(directory)], fmt="jsonl")
    return parquet, jsonl


def _rows(result, name):
    import pyarrow.parquet as pq
    return pq.read_table(result.tables[name]).to_pylist()


def test_capture_saw_the_traffic(live_capture):
    _, rows, topic, group, status = live_capture
    assert status["counters"]["dropped"] == 0 and status["counters"]["row_errors"] == 0
    assert {r["proxy_instance"] for r in rows} == {"kproxy-live-test"}
    produced = sum(r["record_count"] or 0 for r in rows if ref.stored_produce(r))
    assert produced == PRODUCED + LEGACY_PRODUCED


def test_parquet_and_jsonl_give_the_same_tables(spark, analysed):
    """The JSONL files of the same capture, read by Spark, give the tables the Parquet run wrote."""
    parquet, jsonl = analysed
    assert jsonl.count() == parquet.summary["pairs"]
    key = lambda r: repr(sorted(r.items()))  # noqa: E731
    for name, make in (("api_latency", tables.api_latency), ("clients", tables.clients),
                       ("topic_clients", tables.topic_clients), ("rebalances", tables.rebalances),
                       ("client_inventory", tables.client_inventory), ("connections", tables.connections)):
        from_jsonl = [r.asDict(recursive=True) for r in make(jsonl).collect()]
        from_parquet = [r.asDict(recursive=True) for r in spark.read.parquet(parquet.tables[name]).collect()]
        assert sorted(map(key, from_jsonl)) == sorted(map(key, from_parquet)), name


def test_per_api_figures_match_the_rows(live_capture, analysed):
    rows = live_capture[1]
    parquet, _ = analysed
    expected = ref.api_latency(rows)
    got = {(r["api_name"], r["api_key"], r["api_version"]): r for r in _rows(parquet, "api_latency")}
    assert set(got) == set(expected)
    for key, e in expected.items():
        for column in ("requests", "answered", "long_polls", "request_bytes", "response_bytes", "error_pairs"):
            assert got[key][column] == e[column], (key, column)
        ref.assert_percentile(e["latencies"], 0.99, got[key]["latency_p99_ms"], PERCENTILE_ACCURACY)
        ref.assert_percentile(e["latencies"], 0.5, got[key]["latency_p50_ms"], PERCENTILE_ACCURACY)
    assert parquet.summary["pairs"] == len(rows)


def test_rebalance_the_test_caused_is_counted(live_capture, analysed):
    rows, group = live_capture[1], live_capture[3]
    parquet, _ = analysed
    generations = sorted(g for (grp, g) in ref.generations(rows) if grp == group)
    assert len(generations) == 2                      # formed with one member, rebalanced for the second
    rebalances = [r for r in _rows(parquet, "rebalances") if r["group_id"] == group]
    assert sorted(r["generation"] for r in rebalances) == generations
    by_generation = {r["generation"]: r for r in rebalances}
    assert by_generation[generations[0]]["members"] == 1
    assert by_generation[generations[1]]["members"] == 2
    assert all(r["completed"] is not None and r["duration_s"] >= 0 for r in rebalances)
    groups = {r["group_id"]: r for r in _rows(parquet, "groups")}
    assert groups[group]["rebalances"] == 2 and groups[group]["members_seen"] == 2
    assert set(groups[group]["client_ids"]) >= {"live-consumer-a", "live-consumer-b"}


def test_old_protocol_client_is_flagged_for_kafka_4(live_capture, analysed):
    rows = live_capture[1]
    parquet, _ = analysed
    readiness = _rows(parquet, "upgrade_readiness")
    assert {(r["client_id"], r["api_name"], r["api_version"]): r["requests"] for r in readiness} == \
        dict(ref.removed_pairs(rows, is_removed))
    assert any(r["client_id"] == "legacy-producer" and r["api_name"] == "Produce" and r["api_version"] <= 2
               for r in readiness)
    assert not any(r["client_id"] == "live-producer" for r in readiness)


def test_topic_map_and_inventory(live_capture, analysed):
    rows, topic = live_capture[1], live_capture[2]
    parquet, _ = analysed
    flows = {(r["role"], r["client_id"]): r for r in _rows(parquet, "topic_clients") if r["topic"] == topic}
    assert flows[("producer", "live-producer")]["records"] == PRODUCED
    assert flows[("producer", "legacy-producer")]["records"] == LEGACY_PRODUCED
    consumed = sum(r["records"] for (role, _), r in flows.items() if role == "consumer")
    assert consumed == sum(t["record_count"] for r in rows if r["api_name"] == "Fetch"
                           for t in (r["topic_records"] or []) if t["topic"] == topic)
    assert consumed >= PRODUCED + LEGACY_PRODUCED
    topics = {r["topic"]: r for r in _rows(parquet, "topics")}
    assert set(topics[topic]["producers"]) == {"live-producer", "legacy-producer"}
    assert {"live-consumer-a", "live-consumer-b"} <= set(topics[topic]["consumers"])
    inventory = _rows(parquet, "client_inventory")
    software = {r["client_id"]: r["client_software_name"] for r in inventory}
    assert software["live-producer"] == "confluent-kafka-python"
    assert software["legacy-producer"] == "unknown"     # api_version pinned: no ApiVersions sent
