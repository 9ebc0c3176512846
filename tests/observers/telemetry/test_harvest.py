"""The harvest's bounds, fed real frames through the codec and the tracker: the instance cap,
terminating pushes and quiet clients retiring their series, refused pushes not kept."""

from __future__ import annotations

import dataclasses
import uuid

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Gauge, Metric, MetricsData, NumberDataPoint

from kproxy.observers.metrics import Metrics
from kproxy.observers.telemetry import STALE_PUSH_INTERVALS, ClientTelemetry
from kproxy.protocol import Uuid
from tests.observers.metrics import Client, Clock, samples

CAP = 50
QUEUE = "org.apache.kafka.producer.record.queue.time.avg"


def payload(value: float, node: int = 1) -> bytes:
    data = MetricsData()
    metrics = data.resource_metrics.add().scope_metrics.add().metrics
    metrics.append(Metric(name=QUEUE, gauge=Gauge(data_points=[NumberDataPoint(as_double=value)])))
    metrics.append(Metric(name="org.apache.kafka.producer.node.request.latency.avg", gauge=Gauge(data_points=[
        NumberDataPoint(as_double=value / 2, attributes=[KeyValue(key="node.id", value=AnyValue(int_value=node))])])))
    return data.SerializeToString()


class Both:
    """The observers a running kproxy would call, in its order."""

    def __init__(self, *observers):
        self.observers = observers

    def __call__(self, info, events):
        events = list(events)
        for o in self.observers:
            o(info, events)

    def connection_opened(self, info):
        for o in self.observers:
            o.connection_opened(info)

    def connection_closed(self, info, reason=""):
        for o in self.observers:
            o.connection_closed(info, reason=reason)


def push(client: Client, instance: uuid.UUID, value: float, terminating=False, error=0, compression=0, data=None):
    if compression == 4:
        import zstandard
        data = zstandard.ZstdCompressor().compress(payload(value))
    client.call("PushTelemetry", 0, dict(client_instance_id=Uuid(instance.bytes), subscription_id=1,
                                         terminating=terminating, compression_type=compression,
                                         metrics=data if data is not None else payload(value)),
                dict(error_code=error))


def setup():
    clock = Clock()
    telemetry = ClientTelemetry(CAP, clock=clock)
    metrics = Metrics(telemetry=telemetry, client_id_label=True)
    return clock, telemetry, metrics, Client(Both(metrics, telemetry), clock)


def test_200_invented_instances_stay_within_the_cap():
    clock, telemetry, metrics, client = setup()
    instances = [uuid.uuid4() for _ in range(200)]
    for i, instance in enumerate(instances):
        push(client, instance, float(i), compression=4 if i % 2 else 0)
    values = samples(metrics, "kproxy_client_metric")
    assert len({dict(k)["client_instance_id"] for k in values}) == CAP
    assert len(values) == 2 * CAP
    assert samples(metrics, "kproxy_client_telemetry_clients") == {(): CAP}
    pushes = samples(metrics, "kproxy_client_telemetry_pushes_total")
    assert pushes == {(("outcome", "harvested"),): CAP, (("outcome", "over_cap"),): 200 - CAP,
                      (("outcome", "refused"),): 0, (("outcome", "undecodable"),): 0}
    first = str(Uuid(instances[0].bytes))
    assert values[(("attributes", ""), ("client_id", "app"), ("client_instance_id", first),
                   ("client_software_name", "unknown"), ("client_software_version", "unknown"),
                   ("name", QUEUE))] == 0.0
    # A terminating push frees a place at once; quiet instances free theirs after some intervals.
    push(client, instances[0], 1.0, terminating=True)
    push(client, instances[-1], 7.0)
    ids = {dict(k)["client_instance_id"] for k in samples(metrics, "kproxy_client_metric")}
    assert first not in ids and str(Uuid(instances[-1].bytes)) in ids and len(ids) == CAP
    clock.now += STALE_PUSH_INTERVALS * 300.0 + 1
    assert samples(metrics, "kproxy_client_metric") == {}
    assert samples(metrics, "kproxy_client_telemetry_clients") == {(): 0}


def test_refused_and_undecodable_pushes_are_counted_not_kept():
    _, telemetry, metrics, client = setup()
    push(client, uuid.uuid4(), 1.0, error=76)                   # UNKNOWN_SUBSCRIPTION_ID: the broker did not take it
    push(client, uuid.uuid4(), 1.0, data=b"\x0a\xff\xff")       # not OTLP
    push(client, uuid.uuid4(), 1.0, compression=3, data=b"not lz4")
    assert samples(metrics, "kproxy_client_metric") == {}
    pushes = samples(metrics, "kproxy_client_telemetry_pushes_total")
    assert pushes[(("outcome", "refused"),)] == 1 and pushes[(("outcome", "undecodable"),)] == 2


def test_split_takes_the_same_clients_produce_latency_between_pushes():
    clock, telemetry, metrics, client = setup()
    instance = uuid.uuid4()
    push(client, instance, 30.0)
    for wait in (0.008, 0.010, 0.012):                          # kproxy measures 10 ms on average
        client.call("Produce", 9, dict(acks=1, timeout_ms=1000, topic_data=[]), dict(responses=[]), wait=wait)
    push(client, instance, 30.0)
    split = telemetry.instances()[0].split
    assert (split.queue, split.request) == (30.0, 15.0)          # node.request.latency.avg is value / 2
    assert abs(split.broker - 10.0) < 1e-6 and abs(split.network - 5.0) < 1e-6
    labels = (("client_id", "app"), ("client_instance_id", str(Uuid(instance.bytes))),
              ("client_software_name", "unknown"), ("client_software_version", "unknown"))
    assert samples(metrics, "kproxy_client_record_queue_seconds") == {labels: 0.030}
    assert abs(samples(metrics, "kproxy_client_broker_latency_seconds")[labels] - 0.010) < 1e-9


def test_series_join_the_connections_software_and_principal():
    clock = Clock()
    telemetry = ClientTelemetry(CAP, clock=clock)
    metrics = Metrics(telemetry=telemetry, client_id_label=True, principal_label=True)
    client = Client(Both(metrics, telemetry), clock)
    client.info = dataclasses.replace(client.info, principal="CN=orders,O=Example")
    telemetry.connection_opened(client.info)
    client.call("ApiVersions", 3, dict(client_software_name="apache-kafka-java", client_software_version="4.4.0"),
                dict(error_code=0, api_keys=[]))
    instance = uuid.uuid4()
    push(client, instance, 12.5)
    labels = {dict(k)["name"]: dict(k) for k in samples(metrics, "kproxy_client_metric")}[QUEUE]
    assert labels == {"client_instance_id": str(Uuid(instance.bytes)), "client_id": "app",
                      "client_software_name": "apache-kafka-java", "client_software_version": "4.4.0",
                      "principal": "CN=orders,O=Example", "name": QUEUE, "attributes": ""}
    row, = telemetry.inventory()
    assert (row["software_name"], row["principal"], row["pushes"]) == ("apache-kafka-java", "CN=orders,O=Example", 1)
