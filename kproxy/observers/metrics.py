"""Prometheus metrics: every metric kproxy exports is defined here, and only here.

An observer fed decoded events (after the bytes are forwarded). Naming
follows Prometheus conventions: ``kproxy_`` prefix, base units (seconds,
bytes), ``_total`` counters, sent and received as separate metrics. Label
cardinality is bounded by construction: ``api`` is one of Kafka's ~95 API
names (unknown keys fold into ``unknown``), ``error`` one of Kafka's error
names, ``listener`` one per broker, ``reason`` a fixed set; the opt-in
``client_id`` and ``topic`` labels keep the first N values seen and fold the
rest into ``other``.
"""

from __future__ import annotations

import errno
import platform
from typing import Iterable

from prometheus_client import (CollectorRegistry, Counter, Gauge, GCCollector, Histogram,
                               PlatformCollector, ProcessCollector)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .. import __version__
from ..protocol import SCHEMA_SOURCES, api_name, error_name, schema
from ..protocol.connection import (MalformedFrame, RequestReceived, ResponseReceived,
                                   SaslTokenPassed)
from ..protocol import DecodeError
from ..protocol.records import CODEC_NAMES, iter_batches
from ..protocol.walk import error_codes

# Request-to-response time: sub-millisecond local answers up to Fetch/JoinGroup waits.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Frame sizes: a heartbeat (~100 B) to the 100 MiB frame limit, x4 per bucket.
SIZE_BUCKETS = tuple(64 * 4 ** i for i in range(12))
# Broker quotas throttle in milliseconds to tens of seconds.
THROTTLE_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
DEFAULT_LABEL_CAP = 100   # distinct client_id / topic values before folding into "other"

FETCH_KEYS = (1, 78)      # Fetch, ShareFetch: long-poll until data or max.wait.ms
PRODUCE_KEY = 0
CLOSE_REASONS = ("client_closed", "broker_closed", "frame_too_large", "rewrite_failed",
                 "idle_timeout", "shutdown", "socket_error", "upstream_unreachable",
                 "max_connections", "other")


# Why a broker listener could not be bound (errno -> reason label; anything else is "other").
BIND_FAILURE_REASONS = {errno.EADDRINUSE: "address_in_use", errno.EACCES: "permission_denied",
                        errno.EADDRNOTAVAIL: "address_not_available"}


def bind_failure_label(error: OSError) -> str:
    return BIND_FAILURE_REASONS.get(error.errno, "other")


def close_reason_label(reason: str) -> str:
    """Fold a free-text close reason into the fixed set (bounded label values)."""
    text = reason.lower()
    for needle, label in (("client closed", "client_closed"), ("broker closed", "broker_closed"),
                          ("frame of", "frame_too_large"), ("rewrite failed", "rewrite_failed"),
                          ("idle", "idle_timeout"), ("shutting down", "shutdown"),
                          ("unreachable", "upstream_unreachable"),
                          ("max_connections", "max_connections"), ("socket error", "socket_error")):
        if needle in text:
            return label
    return "other"


class BoundedLabel:
    """Keeps the first ``cap`` distinct values; everything after is "other"."""

    def __init__(self, cap: int):
        self.cap = cap
        self.seen: set[str] = set()

    def __call__(self, value: str | None) -> str:
        value = value or ""
        if value in self.seen:
            return value
        if len(self.seen) < self.cap:
            self.seen.add(value)
            return value
        return "other"


class _ApiSeries:
    """The label children of one API, looked up once (``.labels()`` is slow on the hot path)."""

    __slots__ = ("requests", "latency", "long_poll", "request_size", "response_size",
                 "request_bytes", "response_bytes", "throttle", "throttled", "opaque", "name")

    def __init__(self, m: "Metrics", name: str):
        self.name = name
        self.requests = m.requests.labels(name)
        self.latency = m.latency.labels(name)
        self.long_poll = m.fetch_long_poll.labels(name) if name in ("Fetch", "ShareFetch") else None
        self.request_size = m.request_size.labels(name)
        self.response_size = m.response_size.labels(name)
        self.request_bytes = m.request_bytes.labels(name)
        self.response_bytes = m.response_bytes.labels(name)
        self.throttle = m.throttle.labels(name)
        self.throttled = m.throttled.labels(name)
        self.opaque = m.opaque_requests.labels(name)


class Metrics:
    """The metrics observer. Call it with (connection info, events); scrape ``registry``."""

    def __init__(self, client_id_label: bool = False, topic_label: bool = False,
                 label_cap: int = DEFAULT_LABEL_CAP, in_flight=None, traffic=None, capture=None,
                 unbound_listeners=None):
        """``in_flight()``, ``traffic()`` and ``unbound_listeners()`` are read at scrape time
        (nothing on the hot path): traffic returns cumulative byte totals keyed like
        ``TRAFFIC_COUNTERS``; ``capture`` is the capture observer whose counters are exported."""
        r = self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self._in_flight = in_flight or (lambda: 0)
        r.register(_InFlightCollector(lambda: self._in_flight()))

        build = Gauge("kproxy_build_info", "kproxy version and the Kafka schema it decodes",
                      ["version", "python", "kafka_schema"], registry=r)
        build.labels(__version__, platform.python_version(), "+".join(SCHEMA_SOURCES)).set(1)

        api = ["api"]
        self.requests = Counter("kproxy_requests_total", "Requests seen, by API", api, registry=r)
        self.request_versions = Counter("kproxy_request_versions_total",
                                        "Requests by API and version (which client versions are in use)",
                                        ["api", "version"], registry=r)
        self.latency = Histogram("kproxy_request_latency_seconds",
                                 "Request to response time, by API (empty long-poll Fetches excluded)",
                                 api, buckets=LATENCY_BUCKETS, registry=r)
        self.fetch_long_poll = Histogram("kproxy_fetch_long_poll_seconds",
                                         "Fetch/ShareFetch answered with no records: time spent waiting",
                                         api, buckets=LATENCY_BUCKETS, registry=r)
        self.request_size = Histogram("kproxy_request_size_bytes", "Request frame sizes, by API",
                                      api, buckets=SIZE_BUCKETS, registry=r)
        self.response_size = Histogram("kproxy_response_size_bytes", "Response frame sizes, by API",
                                       api, buckets=SIZE_BUCKETS, registry=r)
        self.request_bytes = Counter("kproxy_request_bytes_total", "Request bytes, by API", api,
                                     registry=r)
        self.response_bytes = Counter("kproxy_response_bytes_total", "Response bytes, by API", api,
                                      registry=r)
        self.throttle = Histogram("kproxy_throttle_time_seconds",
                                  "throttle_time_ms of every response that carries it, by API",
                                  api, buckets=THROTTLE_BUCKETS, registry=r)
        self.throttled = Counter("kproxy_throttled_responses_total",
                                 "Responses with throttle_time_ms > 0, by API", api, registry=r)
        self.errors = Counter("kproxy_response_errors_total",
                              "Non-zero error codes in responses (top level and per partition/resource)",
                              ["api", "error"], registry=r)
        self.opaque_requests = Counter("kproxy_opaque_requests_total",
                                       "Requests whose API key or version kproxy cannot decode (forwarded as is)",
                                       api, registry=r)
        self.decode_failures = Counter("kproxy_decode_failures_total",
                                       "Frames that failed to decode, by direction", ["direction"],
                                       registry=r)
        self.sasl_tokens = Counter("kproxy_sasl_raw_tokens_total",
                                   "SASL v0 raw tokens passed through (never decoded)", ["direction"],
                                   registry=r)

        self.produced_records = Counter("kproxy_produced_records_total",
                                        "Records in Produce requests (from batch headers)", registry=r)
        self.produced_bytes = Counter("kproxy_produced_bytes_total",
                                      "Record batch bytes in Produce requests", registry=r)
        self.fetched_records = Counter("kproxy_fetched_records_total",
                                       "Records in Fetch responses (from batch headers)", registry=r)
        self.fetched_bytes = Counter("kproxy_fetched_bytes_total",
                                     "Record batch bytes in Fetch responses", registry=r)
        self.produce_batches = Counter("kproxy_produce_batches_total",
                                       "Record batches in Produce requests, by compression codec",
                                       ["compression"], registry=r)
        self.fetch_batches = Counter("kproxy_fetch_batches_total",
                                     "Record batches in Fetch responses, by compression codec",
                                     ["compression"], registry=r)

        self.connections_open = Gauge("kproxy_connections_open", "Client connections open now",
                                      ["listener"], registry=r)
        self.connections_opened = Counter("kproxy_connections_opened_total",
                                          "Client connections accepted", ["listener"], registry=r)
        self.connections_closed = Counter("kproxy_connections_closed_total",
                                          "Client connections closed, by reason",
                                          ["listener", "reason"], registry=r)
        self.listener_bind_failures = Counter(
            "kproxy_listener_bind_failures_total",
            "Failed attempts to bind a broker listener (its node is withheld from clients meanwhile)",
            ["listener", "reason"], registry=r)
        unbound = Gauge("kproxy_broker_listeners_unbound",
                        "Broker listeners kproxy cannot bind now (their nodes are withheld from clients)",
                        registry=r)
        unbound.set_function(unbound_listeners or (lambda: 0))
        self._traffic = traffic or (lambda: {})
        r.register(_TrafficCollector(lambda: self._traffic()))
        self._capture = capture
        if capture is not None:
            r.register(_CaptureCollector(capture))

        self.client_id_label = BoundedLabel(label_cap) if client_id_label else None
        self.topic_label = BoundedLabel(label_cap) if topic_label else None
        if client_id_label:
            self.client_requests = Counter("kproxy_client_requests_total",
                                           "Requests by client_id (opt-in, capped)", ["client_id"],
                                           registry=r)
        if topic_label:
            self.topic_produced_bytes = Counter("kproxy_topic_produced_bytes_total",
                                                "Record batch bytes produced, by topic (opt-in, capped)",
                                                ["topic"], registry=r)
            self.topic_fetched_bytes = Counter("kproxy_topic_fetched_bytes_total",
                                               "Record batch bytes fetched, by topic (opt-in, capped)",
                                               ["topic"], registry=r)

        self._apis: dict[int, _ApiSeries] = {}
        for key in schema.API_NAMES:                 # known label sets exported as zeros
            self._series(key)
        self._decode_failures = {d: self.decode_failures.labels(d) for d in ("request", "response")}
        self._versions: dict[tuple[int, int], object] = {}   # (api key, version) -> child
        self._codec_children = {     # label children by codec, looked up once
            id(counter): {codec: counter.labels(codec) for codec in CODEC_NAMES}
            for counter in (self.produce_batches, self.fetch_batches)}

    def _series(self, api_key: int) -> _ApiSeries:
        series = self._apis.get(api_key)
        if series is None:
            name = api_name(api_key) if api_key in schema.API_NAMES else "unknown"
            series = _ApiSeries(self, name)
            if api_key in schema.API_NAMES or len(self._apis) < 1024:
                self._apis[api_key] = series
        return series

    # ------------------------------------------------------------ events

    def __call__(self, info, events: Iterable) -> None:
        for event in events:
            if isinstance(event, ResponseReceived):
                self._response(event)
            elif isinstance(event, RequestReceived):
                self._request(event)
            elif isinstance(event, SaslTokenPassed):
                self.sasl_tokens.labels(event.direction).inc()
            elif isinstance(event, MalformedFrame):
                self._decode_failures["request" if event.direction == "client" else "response"].inc()

    def _request(self, event: RequestReceived) -> None:
        series = self._series(event.api_key)
        series.requests.inc()
        series.request_size.observe(event.size)
        series.request_bytes.inc(event.size)
        if event.api_key in schema.API_NAMES:
            key = (event.api_key, event.api_version)
            child = self._versions.get(key)
            if child is None:
                child = self._versions[key] = self.request_versions.labels(series.name, str(event.api_version))
            child.inc()
        request = event.request
        if request is None:
            self._decode_failures["request"].inc()
            return
        if request.is_opaque:
            series.opaque.inc()
            return
        if self.client_id_label is not None:
            self.client_requests.labels(self.client_id_label(request.client_id)).inc()
        if event.api_key == PRODUCE_KEY:
            for topic in request.body.topic_data:
                for partition in topic.partition_data:
                    nbytes = self._count_batches(partition.records, self.produce_batches,
                                                 self.produced_records)
                    self.produced_bytes.inc(nbytes)
                    if self.topic_label is not None and nbytes:
                        self.topic_produced_bytes.labels(self.topic_label(_topic_name(topic))).inc(nbytes)

    def _response(self, event: ResponseReceived) -> None:
        series = self._series(event.api_key)
        series.response_size.observe(event.size)
        series.response_bytes.inc(event.size)
        response = event.response
        if response is None:
            self._decode_failures["response"].inc()
            series.latency.observe(event.latency)
            return
        if response.is_opaque:
            series.latency.observe(event.latency)
            return
        body = response.body
        fetched = 0
        if event.api_key in FETCH_KEYS:
            fetched = self._fetched(body)
        if series.long_poll is not None and fetched == 0:
            series.long_poll.observe(event.latency)
        else:
            series.latency.observe(event.latency)
        throttle_ms = getattr(body, "throttle_time_ms", None)
        if throttle_ms is not None:
            series.throttle.observe(throttle_ms / 1000.0)
            if throttle_ms > 0:
                series.throttled.inc()
        for code in error_codes("response", event.api_key, response.body_version or event.api_version, body):
            self.errors.labels(series.name, error_name(code)).inc()

    def _fetched(self, body) -> int:
        total = 0
        for topic in getattr(body, "responses", None) or ():
            for partition in topic.partitions:
                nbytes = self._count_batches(partition.records, self.fetch_batches,
                                             self.fetched_records)
                total += nbytes
                if self.topic_label is not None and nbytes:
                    self.topic_fetched_bytes.labels(self.topic_label(_topic_name(topic))).inc(nbytes)
        if total:
            self.fetched_bytes.inc(total)
        return total

    def _count_batches(self, records, batches: Counter, record_counter: Counter) -> int:
        """Batch headers only: no decompression. Returns the bytes of complete batches."""
        if not records:
            return 0
        nbytes = count = 0
        children = self._codec_children[id(batches)]
        try:
            for batch in iter_batches(records):
                nbytes += batch.size_bytes
                children[batch.compression].inc()
                count += batch.record_count or 0
        except DecodeError:
            pass        # garbage records are the broker's business; counted what was readable
        if count:
            record_counter.inc(count)
        return nbytes

    # ------------------------------------------------------------ connections

    def connection_opened(self, info) -> None:
        self.connections_opened.labels(info.listener).inc()
        self.connections_open.labels(info.listener).inc()

    def connection_closed(self, info, reason: str = "", in_flight: int = 0) -> None:
        self.connections_open.labels(info.listener).dec()
        self.connections_closed.labels(info.listener, close_reason_label(reason)).inc()

    def connection_refused(self, listener: str, reason: str) -> None:
        """Accepted, then closed before it was proxied (upstream unreachable, limits, shutdown)."""
        self.connections_opened.labels(listener).inc()
        self.connections_closed.labels(listener, close_reason_label(reason)).inc()

    def listener_bind_failed(self, listener: str, error: OSError) -> None:
        self.listener_bind_failures.labels(listener, bind_failure_label(error)).inc()


def _topic_name(topic) -> str:
    name = getattr(topic, "name", None) or getattr(topic, "topic", None)
    if name:
        return name
    topic_id = getattr(topic, "topic_id", None)
    return str(topic_id) if topic_id is not None else ""


# name -> (help, key in the traffic() dict)
TRAFFIC_COUNTERS = {
    "kproxy_client_received_bytes": ("Bytes received from clients", "from_client"),
    "kproxy_client_sent_bytes": ("Bytes sent to clients", "to_client"),
    "kproxy_upstream_received_bytes": ("Bytes received from brokers", "from_broker"),
    "kproxy_upstream_sent_bytes": ("Bytes sent to brokers", "to_broker"),
}
# capture counter -> (metric name, help)
CAPTURE_COUNTERS = {
    "enqueued": ("kproxy_capture_events_total", "Events accepted into the capture queue"),
    "dropped": ("kproxy_capture_events_dropped_total", "Events dropped because the capture queue was full"),
    "filtered": ("kproxy_capture_events_filtered_total", "Events left out by capture filters or sampling"),
    "rows_written": ("kproxy_capture_rows_written_total", "Request/response rows written (JSONL/Parquet)"),
    "packets_written": ("kproxy_capture_packets_written_total", "Packets written to pcapng"),
    "bytes_written": ("kproxy_capture_written_bytes_total", "Bytes written to capture files"),
    "write_errors": ("kproxy_capture_write_errors_total", "Capture write failures (each turns capture off)"),
    "files_deleted": ("kproxy_capture_files_deleted_total", "Capture files deleted by the disk cap"),
    "decompression_refused": ("kproxy_capture_decompression_refused_total",
                              "Compressed batches capture did not inflate past its bound (likely bombs)"),
}


class _TrafficCollector:
    """Byte totals, summed from the live connections (plus closed ones) at scrape time."""

    def __init__(self, read):
        self.read = read

    def collect(self):
        totals = self.read()
        for name, (help_text, key) in TRAFFIC_COUNTERS.items():
            yield CounterMetricFamily(name, help_text, value=totals.get(key, 0))

    def describe(self):
        return [CounterMetricFamily(name, help_text) for name, (help_text, _) in TRAFFIC_COUNTERS.items()]


class _CaptureCollector:
    def __init__(self, capture):
        self.capture = capture

    def collect(self):
        counters = self.capture.counters()
        for key, (name, help_text) in CAPTURE_COUNTERS.items():
            yield CounterMetricFamily(name.removesuffix("_total"), help_text, value=counters.get(key, 0))
        yield GaugeMetricFamily("kproxy_capture_active", "1 while a capture is running",
                                value=1 if self.capture.active else 0)

    def describe(self):
        return [CounterMetricFamily(n.removesuffix("_total"), h) for n, h in CAPTURE_COUNTERS.values()] + \
            [GaugeMetricFamily("kproxy_capture_active", "1 while a capture is running")]


class _InFlightCollector:
    """kproxy_requests_in_flight, read from the live connections at scrape time."""

    def __init__(self, read):
        self.read = read

    def collect(self):
        yield GaugeMetricFamily("kproxy_requests_in_flight",
                                "Requests sent upstream and not yet answered", value=self.read())

    def describe(self):
        return [GaugeMetricFamily("kproxy_requests_in_flight", "Requests sent upstream and not yet answered")]
