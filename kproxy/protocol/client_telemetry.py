"""What clients push about themselves (KIP-714), decoded: sans-I/O.

A client asks for a subscription (GetTelemetrySubscriptions, API 71) and then
pushes (PushTelemetry, API 72) the metrics it names, as an OTLP ``MetricsData``
protobuf compressed with a codec from the subscription's accepted list (Kafka's
codec ids, as in record batches). ``decode_push`` turns a push's payload into
``ClientMetric`` values: one per data point, the value as a float, the point's
attributes (``node.id``, ``topic``...) as sorted text pairs. Metric names are the
client's own, ``org.apache.kafka.producer.record.queue.time.avg`` and the like;
the latency split reads the three below.

Gauge and sum points are kept; histogram and summary points (neither Kafka's
Java client nor librdkafka sends them) are counted by ``decode_push`` as skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from .api_keys import ApiKey
from .errors import DecodeError
from .records import decompress

# Plain ints: compared per pair on the observers' path (see api_keys.py).
GET_TELEMETRY_SUBSCRIPTIONS_KEY = int(ApiKey.GET_TELEMETRY_SUBSCRIPTIONS)
PUSH_TELEMETRY_KEY = int(ApiKey.PUSH_TELEMETRY)
TELEMETRY_KEYS = frozenset({GET_TELEMETRY_SUBSCRIPTIONS_KEY, PUSH_TELEMETRY_KEY})
# A push inflates to at most this: the broker's default telemetry_max_bytes is 1 MiB
# (compressed); OTLP from one client is a few KiB (a producer: ~1.5 KiB, 10 metrics).
MAX_PUSH_BYTES = 4 * 1024 * 1024

# The names the latency split reads (milliseconds, as the clients report them).
RECORD_QUEUE_TIME_AVG = "org.apache.kafka.producer.record.queue.time.avg"
REQUEST_LATENCY_AVG = "org.apache.kafka.producer.request.latency.avg"
NODE_REQUEST_LATENCY_AVG = "org.apache.kafka.producer.node.request.latency.avg"


class ClientMetric(NamedTuple):
    """One data point a client pushed (a tuple: a push makes one per point, ~3x cheaper than
    a frozen dataclass)."""
    name: str
    attributes: tuple[tuple[str, str], ...]     # sorted (key, value as text)
    value: float
    kind: str                                   # "gauge" or "sum"
    time_unix_nano: int

    @property
    def attributes_text(self) -> str:
        """``node.id=1,topic=orders``: one label value, stable for the same attributes."""
        return ",".join(f"{k}={v}" for k, v in self.attributes)


@dataclass(frozen=True, slots=True)
class Push:
    metrics: tuple[ClientMetric, ...]
    skipped: int                                # histogram/summary points, not kept


def _any_value(value) -> str:
    kind = value.WhichOneof("value")
    return "" if kind is None else str(getattr(value, kind))


def decode_push(compression_type: int, payload, limit: int = MAX_PUSH_BYTES) -> Push:
    """A PushTelemetry request's ``metrics`` bytes → its data points. Raises DecodeError."""
    from google.protobuf.message import DecodeError as ProtobufError   # (imported on first push)
    from opentelemetry.proto.metrics.v1.metrics_pb2 import MetricsData

    raw = decompress(compression_type, payload, limit)
    data = MetricsData()
    try:
        data.ParseFromString(raw)
    except ProtobufError as exc:
        raise DecodeError(f"telemetry payload is not OTLP MetricsData: {exc}") from None
    out: list[ClientMetric] = []
    skipped = 0
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                kind = metric.WhichOneof("data")
                if kind not in ("gauge", "sum"):
                    skipped += len(getattr(metric, kind).data_points) if kind else 0
                    continue
                for point in getattr(metric, kind).data_points:
                    which = point.WhichOneof("value")
                    if which is None:
                        continue
                    attributes = tuple(sorted((a.key, _any_value(a.value)) for a in point.attributes))
                    out.append(ClientMetric(metric.name, attributes, float(getattr(point, which)),
                                            kind, point.time_unix_nano))
    return Push(tuple(out), skipped)


@dataclass(frozen=True, slots=True)
class LatencySplit:
    """Where a producer's time goes, in milliseconds: ``queue`` (records waiting in the
    client before a request takes them), ``request`` (request sent to answer, as the client
    measures it), ``broker`` (request to answer as kproxy measured it, the same client's
    Produce requests in the same window; None without any). ``request - broker`` is the
    network and kproxy."""
    queue: float | None
    request: float | None
    broker: float | None

    @property
    def network(self) -> float | None:
        if self.request is None or self.broker is None:
            return None
        return max(self.request - self.broker, 0.0)


def client_latencies(metrics) -> tuple[float | None, float | None]:
    """(record queue time, request latency) in ms from one push's points: the client-level
    ``request.latency.avg`` when the client reports a non-zero one, else the mean of its
    per-node ``node.request.latency.avg`` (librdkafka reports latency per node)."""
    queue = request = None
    nodes = []
    for m in metrics:
        if m.name == RECORD_QUEUE_TIME_AVG:
            queue = m.value
        elif m.name == REQUEST_LATENCY_AVG:
            request = m.value
        elif m.name == NODE_REQUEST_LATENCY_AVG:
            nodes.append(m.value)
    if not request and nodes:
        request = sum(nodes) / len(nodes)
    return queue, request
