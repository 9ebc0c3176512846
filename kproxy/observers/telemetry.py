"""Client telemetry (KIP-714) harvested from the pushes kproxy relays, joined to the wire.

Clients push their own metrics (record queue time, request latency as they measure
it...) to the broker; kproxy decodes each PushTelemetry request the broker accepted
(error 0: the broker's plugin got the same numbers) and keeps, per client instance
id, the latest value of every data point, joined to what kproxy knows of the
connection: client_id, client software (ApiVersions v3+), principal, address.

For the latency split, each producer's Produce latency as kproxy measured it is summed
per (client host, client_id) between two pushes of an instance with that key: the
client's queue time and request latency, and the broker's part, over one window.

Bounded: at most ``cap`` instances are tracked (later ones are counted, not kept), at
most ``MAX_POINTS_PER_INSTANCE`` data points each. An instance leaves when it pushes
with ``terminating`` set, or when it has not pushed for ``STALE_PUSH_INTERVALS`` push
intervals (as the subscription answer it got said; ``DEFAULT_PUSH_INTERVAL_S`` when
kproxy did not see it): its series go with it. Metrics are defined in
``metrics.py``; this module only keeps the values they are read from.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from ..protocol import DecodeError
from ..protocol.client_software import ClientSoftware, software_named
from ..protocol.client_telemetry import (GET_TELEMETRY_SUBSCRIPTIONS_KEY, PUSH_TELEMETRY_KEY,
                                         ClientMetric, LatencySplit, client_latencies, decode_push)
from ..protocol.events import RequestReceived, ResponseReceived
from ..protocol.api_keys import SASL_KEYS as _SASL_KEYS, ApiKey
from ..protocol.sasl import SaslPrincipal
from .capture.filters import header_client_id

# Plain ints: compared per event (see api_keys.py).
_PRODUCE, _API_VERSIONS = int(ApiKey.PRODUCE), int(ApiKey.API_VERSIONS)
# Kafka's default push interval (ClientMetrics interval.ms: 5 minutes).
DEFAULT_PUSH_INTERVAL_S = 300.0
# An instance not heard from for this many push intervals has gone (a client pushes every
# interval, retrying a failed push at the next one).
STALE_PUSH_INTERVALS = 3
# Data points kept per instance: a producer pushes ~10, a consumer of many partitions
# per-partition metrics; past this a push's further points are not kept.
MAX_POINTS_PER_INSTANCE = 1000
# Push outcomes counted (kproxy_client_telemetry_pushes_total{outcome}), all exported at zero.
OUTCOMES = ("harvested", "refused", "undecodable", "over_cap")
# (host, client_id) windows of Produce latency kept for the split, least recently used dropped.
MAX_LATENCY_WINDOWS = 10_000


@dataclass(slots=True)
class _Window:
    """Produce latencies kproxy measured for one (host, client_id) since the last push."""
    total: float = 0.0
    count: int = 0


@dataclass(slots=True)
class ClientInstance:
    """One client instance id and what it last pushed."""
    instance_id: str
    client_id: str | None
    software: ClientSoftware | None
    principal: str | None
    host: str
    first_push: float                     # wall clock
    last_push: float
    pushes: int = 0
    push_interval_s: float = DEFAULT_PUSH_INTERVAL_S
    values: dict[tuple[str, tuple], ClientMetric] = field(default_factory=dict)
    split: LatencySplit | None = None     # producers only

    def gone(self, now: float) -> bool:
        return now - self.last_push > STALE_PUSH_INTERVALS * self.push_interval_s


class _Connection:
    __slots__ = ("software", "sasl", "principal")

    def __init__(self, principal: str | None):
        self.software: ClientSoftware | None = None
        self.sasl: SaslPrincipal | None = None
        self.principal = principal


class ClientTelemetry:
    """The harvest observer. ``instances()`` for the metrics and the live page."""

    def __init__(self, cap: int, clock=time.time):
        self.cap = cap
        self._clock = clock
        self._instances: dict[str, ClientInstance] = {}
        self._intervals: dict[str, float] = {}          # instance id -> push interval its subscription said
        self._connections: dict[int, _Connection] = {}
        self._windows: dict[tuple[str, str | None], _Window] = {}
        self.outcomes: Counter = Counter({outcome: 0 for outcome in OUTCOMES})
        self.retired = 0

    # ------------------------------------------------------------ hooks (event loop)

    def connection_opened(self, info) -> None:
        self._connections[info.id] = _Connection(info.principal)

    def connection_closed(self, info, reason=None, in_flight=None) -> None:
        self._connections.pop(info.id, None)

    def __call__(self, info, events) -> None:
        for event in events:
            if event.__class__ is not ResponseReceived:
                continue
            key = event.request_event.api_key
            if key == _PRODUCE:
                if not self._windows:
                    continue
                window = self._windows.get((info.client[0], header_client_id(event.request_event.frame)))
                if window is not None:                  # a client that pushes: its window runs
                    window.total += event.latency
                    window.count += 1
            elif key == PUSH_TELEMETRY_KEY:
                self._pushed(info, event)
            elif key == GET_TELEMETRY_SUBSCRIPTIONS_KEY:
                self._subscribed(event)
            elif key == _API_VERSIONS:
                named = software_named(event)
                connection = self._connections.get(info.id)
                if named is not None and connection is not None:
                    connection.software = named
            elif key in _SASL_KEYS:
                self._sasl(info, event)

    def _sasl(self, info, event: ResponseReceived) -> None:
        connection = self._connections.get(info.id)
        request, response = event.request_event.request, event.response
        if connection is None or request is None or response is None or request.is_opaque:
            return
        if connection.sasl is None:
            connection.sasl = SaslPrincipal()
        if connection.sasl.observe(event.api_key, request.body, response.body):
            connection.principal = connection.sasl.principal

    def _subscribed(self, event: ResponseReceived) -> None:
        response = event.response
        if response is None or response.is_opaque or response.body.error_code:
            return
        body = response.body
        if len(self._intervals) >= 4 * self.cap:        # ids of clients that never pushed
            self._intervals.clear()
        self._intervals[str(body.client_instance_id)] = max(body.push_interval_ms, 1) / 1000.0

    def _pushed(self, info, event: ResponseReceived) -> None:
        response, request = event.response, event.request_event.request
        if response is None or request is None or request.is_opaque or response.is_opaque:
            self.outcomes["undecodable"] += 1
            return
        if response.body.error_code:
            self.outcomes["refused"] += 1            # the broker did not take it: neither does kproxy
            return
        body = request.body
        instance_id = str(body.client_instance_id)
        instance = self._instances.get(instance_id)
        if instance is None and len(self._instances) >= self.cap:
            self._retire_stale(self._clock())
            if len(self._instances) >= self.cap:
                self.outcomes["over_cap"] += 1
                return
        try:
            push = decode_push(body.compression_type, body.metrics)
        except DecodeError:
            self.outcomes["undecodable"] += 1
            return
        self.outcomes["harvested"] += 1
        now = self._clock()
        connection = self._connections.get(info.id)
        client_id = header_client_id(event.request_event.frame)
        if instance is None:
            instance = self._instances[instance_id] = ClientInstance(
                instance_id, client_id, None, None, info.client[0], now, now)
        instance.client_id = client_id
        instance.host = info.client[0]
        if connection is not None:
            instance.software = connection.software or instance.software
            instance.principal = connection.principal
        instance.last_push = now
        instance.pushes += 1
        instance.push_interval_s = self._intervals.get(instance_id, instance.push_interval_s)
        values = instance.values
        for metric in push.metrics:
            key = (metric.name, metric.attributes)
            if key in values or len(values) < MAX_POINTS_PER_INSTANCE:
                values[key] = metric
        self._split(instance, push.metrics)
        if body.terminating:
            self._retire(instance_id)

    def _split(self, instance: ClientInstance, metrics) -> None:
        queue, request = client_latencies(metrics)
        key = (instance.host, instance.client_id)
        window = self._windows.get(key)
        if window is None:
            if len(self._windows) >= MAX_LATENCY_WINDOWS:
                self._windows.pop(next(iter(self._windows)))
            window = self._windows[key] = _Window()
        broker = window.total / window.count * 1000.0 if window.count else None
        window.total, window.count = 0.0, 0
        if queue is not None or request is not None:
            instance.split = LatencySplit(queue, request, broker)

    # ------------------------------------------------------------ readers

    def _retire(self, instance_id: str) -> None:
        instance = self._instances.pop(instance_id, None)
        self._intervals.pop(instance_id, None)
        if instance is not None:
            self.retired += 1
            key = (instance.host, instance.client_id)
            if not any((i.host, i.client_id) == key for i in self._instances.values()):
                self._windows.pop(key, None)

    def _retire_stale(self, now: float) -> None:
        for instance_id in [i.instance_id for i in self._instances.values() if i.gone(now)]:
            self._retire(instance_id)

    def instances(self) -> list[ClientInstance]:
        """The instances still pushing (the stale ones are let go here)."""
        self._retire_stale(self._clock())
        return list(self._instances.values())

    def inventory(self) -> list[dict]:
        """The live page's rows: one per client instance."""
        out = []
        for i in self.instances():
            split = i.split
            out.append({
                "client_instance_id": i.instance_id, "client_id": i.client_id, "address": i.host,
                "software_name": i.software.name if i.software else None,
                "software_version": i.software.version if i.software else None,
                "principal": i.principal, "pushes": i.pushes, "last_push": i.last_push,
                "push_interval_s": i.push_interval_s, "metrics": len(i.values),
                "latency_split_ms": None if split is None else {
                    "queue": split.queue, "request": split.request, "broker": split.broker,
                    "network": split.network},
            })
        out.sort(key=lambda row: (row["client_id"] or "", row["client_instance_id"]))
        return out
