"""Passive harvest against a real broker that offers KIP-714 (a receiver plugin compiled in
the fixture): what kproxy exports, captures and shows is what the broker received, push by
push, from librdkafka (confluent-kafka) and Kafka's Java client."""

from __future__ import annotations

import base64
import concurrent.futures
import json
import math
import urllib.request
import uuid

import confluent_kafka
import pytest
from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData

from kproxy.embedded.kafka import run_tool
from kproxy.observers.capture import CaptureConfig
from tests.observers.metrics import scrape, scrape_until, unique
from tests.proxy.harness import ProxyThread
from tests.proxy.wire import create_topic

pytestmark = pytest.mark.broker

WAIT_S = 60.0
# A producer whose records wait this long in its own queue (linger.ms) before a request
# takes them: the latency split must show it as the client's queue share.
LINGER_MS = 500
SPLIT = ("kproxy_client_record_queue_seconds", "kproxy_client_request_latency_seconds",
         "kproxy_client_broker_latency_seconds")


def points(payload: bytes) -> dict[tuple[str, str], float]:
    """What the plugin received, as (metric name, attributes) -> value (the test's own reading)."""
    data = MetricsData()
    data.ParseFromString(payload)
    out = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                kind = metric.WhichOneof("data")
                for p in getattr(metric, kind).data_points:
                    attributes = ",".join(f"{a.key}={getattr(a.value, a.value.WhichOneof('value'))}"
                                          for a in sorted(p.attributes, key=lambda a: a.key))
                    out[(metric.name, attributes)] = float(getattr(p, p.WhichOneof("value")))
    return out


def comparable(values: dict) -> dict:
    """NaN (Java's average of nothing yet) compares equal to NaN here."""
    return {k: "NaN" if math.isnan(v) else v for k, v in values.items()}


def kafka_uuid(text: str) -> uuid.UUID:
    return uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=="))


def exported(samples, client_id: str) -> dict[str, dict]:
    """kproxy_client_metric series of one client_id, per client instance id."""
    out: dict[str, dict] = {}
    for (name, labels), v in samples.items():
        labels = dict(labels)
        if name == "kproxy_client_metric" and labels.get("client_id") == client_id:
            out.setdefault(labels["client_instance_id"], {})[(labels["name"], labels["attributes"])] = v
    return out


def overview(proxy) -> dict:
    request = urllib.request.Request(proxy.admin_url + "/live/overview",
                                     headers={"Authorization": "Bearer telemetry-test-token"})
    with urllib.request.urlopen(request, timeout=10) as r:
        return json.loads(r.read())


def test_librdkafka_pushes_are_exported_as_the_broker_received_them(telemetry_cluster):
    cluster, receiver = telemetry_cluster
    client_id = unique("pusher")
    with ProxyThread(upstream=cluster.bootstrap_servers, client_telemetry=True, metrics_client_id_label=True,
                     admin_token="telemetry-test-token") as proxy:
        topic = create_topic(proxy.bootstrap)
        producer = confluent_kafka.Producer({"bootstrap.servers": proxy.bootstrap, "client.id": client_id})

        def produce():
            producer.produce(topic, b"x" * 100)
            producer.poll(0.05)

        def same_as_broker(samples) -> bool:
            mine = exported(samples, client_id)
            if len(mine) != 1:
                return False
            (instance, values), = mine.items()
            pushes = receiver.pushes(kafka_uuid(instance))
            return len(pushes) >= 3 and comparable(values) == comparable(points(pushes[-1].payload))

        samples = scrape_until(same_as_broker, "the exported values to equal the broker's last push",
                               proxy, timeout=WAIT_S, poll=produce)
        (instance, values), = exported(samples, client_id).items()
        labels = dict(next(labels for (name, labels) in samples
                           if name == "kproxy_client_metric" and dict(labels)["client_instance_id"] == instance))
        assert labels["client_software_name"] == "confluent-kafka-python"
        assert any(name.startswith("org.apache.kafka.producer.") for name, _ in values)

        producer.flush(10)
        del producer                                        # terminating push: its series go
        scrape_until(lambda s: not exported(s, client_id), "the terminated client's series to go", proxy,
                     timeout=WAIT_S)
        harvested = scrape(proxy)[("kproxy_client_telemetry_pushes_total", (("outcome", "harvested"),))]
        pushes = receiver.pushes(kafka_uuid(instance))
        assert pushes[-1].terminating
        assert harvested >= len(pushes)                     # every one of them (and the admin client's)


def split_of(samples, client_id: str) -> dict[str, float]:
    return {name: v for (name, labels), v in samples.items()
            if name in SPLIT and dict(labels).get("client_id") == client_id}


def test_java_producer_latency_split_and_pushes_captured_push_by_push(telemetry_cluster, tmp_path):
    """A Java producer whose records wait LINGER_MS in its queue: the split shows that as the
    client's share, beside the broker's as kproxy measured it; capture keeps every push."""
    cluster, receiver = telemetry_cluster
    client_id = unique("java-pusher")
    with ProxyThread(upstream=cluster.bootstrap_servers, client_telemetry=True, metrics_client_id_label=True,
                     admin_token="telemetry-test-token") as proxy:
        topic = create_topic(proxy.bootstrap)
        proxy.runtime.capture.start(CaptureConfig(directory=str(tmp_path), formats=("jsonl",)))
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            run = pool.submit(run_tool, cluster, cluster.tools.producer_perf, "--topic", topic,
                              "--num-records", "2400", "--record-size", "100", "--throughput", "300",
                              "--producer-props", f"bootstrap.servers={proxy.bootstrap}", f"client.id={client_id}",
                              f"linger.ms={LINGER_MS}", "batch.size=1000000")

            def queue_share(samples) -> bool:
                split = split_of(samples, client_id)
                return (len(split) == 3 and split[SPLIT[0]] >= LINGER_MS / 2000
                        and split[SPLIT[0]] > split[SPLIT[2]]) or run.done()
            samples = scrape_until(queue_share, "a latency split with the queue share", proxy, timeout=WAIT_S)
            split = split_of(samples, client_id)
            assert len(split) == 3, f"the producer ended before a split was seen: {run.result()}"
            assert split[SPLIT[0]] >= LINGER_MS / 2000 and split[SPLIT[0]] > split[SPLIT[2]], split
            row, = [r for r in overview(proxy)["client_telemetry"] if r["client_id"] == client_id]
            assert row["software_name"] == "apache-kafka-java"
            assert row["latency_split_ms"]["queue"] > row["latency_split_ms"]["broker"]
            run.result()
        proxy.runtime.capture.stop()                      # drains its queue
    rows = [json.loads(line) for path in sorted(tmp_path.glob("*.jsonl")) for line in path.read_text().splitlines()]
    pushed = [r for r in rows if r["api_name"] == "PushTelemetry" and r["client_id"] == client_id]
    assert len(pushed) >= 2
    instance = pushed[0]["client_instance_id"]
    assert {r["client_instance_id"] for r in pushed} == {instance}
    assert {r["client_software_name"] for r in pushed} == {"apache-kafka-java"}
    received = receiver.pushes(kafka_uuid(instance))
    assert [comparable({(m["name"], m["attributes"]): m["value"] for m in r["telemetry_metrics"]})
            for r in pushed] == [comparable(points(p.payload)) for p in received]
    assert received[-1].terminating and pushed[-1]["request"]["terminating"]


def test_with_the_offer_on_a_broker_that_offers_telemetry_still_gets_the_pushes(telemetry_cluster):
    """kproxy offers KIP-714 only where the broker does not: here the broker's plugin receives."""
    cluster, receiver = telemetry_cluster
    client_id = unique("broker-offers")
    with ProxyThread(upstream=cluster.bootstrap_servers, client_telemetry=True, metrics_client_id_label=True,
                     telemetry_offer={"enabled": True, "push_interval_ms": 100_000}) as proxy:
        topic = create_topic(proxy.bootstrap)
        producer = confluent_kafka.Producer({"bootstrap.servers": proxy.bootstrap, "client.id": client_id})

        def produce():
            producer.produce(topic, b"x" * 100)
            producer.poll(0.05)

        def broker_received(samples) -> bool:
            mine = exported(samples, client_id)
            return len(mine) == 1 and len(receiver.pushes(kafka_uuid(next(iter(mine))))) >= 2
        scrape_until(broker_received, "the broker's plugin to receive the pushes", proxy, timeout=WAIT_S,
                     poll=produce)
        assert proxy.runtime.proxy.telemetry_offer.broker_offers is True
        producer.flush(10)
        del producer
