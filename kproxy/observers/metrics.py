"""Prometheus metrics: every metric kproxy exports is defined here, and only here.

An observer fed decoded events (after the bytes are forwarded). Naming
follows Prometheus conventions: ``kproxy_`` prefix, base units (seconds,
bytes), ``_total`` counters, sent and received as separate metrics. Label
cardinality is bounded by construction: ``api`` is one of Kafka's ~95 API
names (unknown keys fold into ``unknown``), ``version`` one of the versions the
schema defines for that API (any other fold into ``unknown``), ``error`` one of Kafka's error
names, ``listener`` one per broker, ``reason`` a fixed set; the opt-in
``client_id`` and ``topic`` labels keep the first N values seen and fold the
rest into ``other``. So do the client software name/version (always on: the
client's own words) and the opt-in ``group`` and ``principal`` labels; consumer
group state is kept for a bounded number of groups, the least recently active
evicted. Consumer lag is summed at scrape time from each connection's last
Fetch positions and answers (partition headers only), dropped when it closes.

Per-API series exist only for APIs seen, plus ``PREINITIALIZED_APIS``. What
every pair updates (requests, latency, sizes, bytes, throttle, batches) is kept
as plain numbers on the event loop, with no lock or label lookup per update,
and turned into metric families by collectors when a scrape asks, possibly from
another thread (see ``_histogram_sample``). Rarely updated metrics stay
prometheus-client objects.
"""

from __future__ import annotations

import errno
import platform
from bisect import bisect_left
from collections import OrderedDict
from typing import Iterable

from prometheus_client import (CollectorRegistry, Counter, Gauge, GCCollector, Histogram,
                               PlatformCollector, ProcessCollector, disable_created_metrics)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from .. import __version__
from ..protocol import API_KEYS, SCHEMA_SOURCES, OpaqueBody, api_name, error_name, is_removed, schema
from ..protocol.events import MalformedFrame, RequestReceived, ResponseReceived, SaslTokenPassed
from ..protocol.client_software import software_named
from ..protocol.pair_fields import PAIR_FIELDS, pair_fields
from ..protocol.records import CODEC_NAMES, count_batches
from ..protocol.api_keys import SASL_KEYS as _SASL_KEYS, ApiKey
from ..protocol.sasl import SaslPrincipal
from ..protocol.walk import error_codes, error_walker
from ..protocol.tls_failures import HANDSHAKE_FAILURES
from ..protocol.proxy_header import REFUSAL_REASONS as PROXY_HEADER_REFUSALS
from .contract import CloseCause, CloseKind
from .topic_bytes import TopicBytes

# Request-to-response time: sub-millisecond local answers up to Fetch/JoinGroup waits.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Frame sizes: a heartbeat (~100 B) to the 100 MiB frame limit, x4 per bucket.
SIZE_BUCKETS = tuple(64 * 4 ** i for i in range(12))
# Broker quotas throttle in milliseconds to tens of seconds.
THROTTLE_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# APIs whose series exist from the first scrape, before any client has used them: every client
# calls them, so dashboards and alerts have series to rate() from the start. Every other API's
# series appear when it is first seen (pre-creating all ~95 made a fresh scrape ~7,400 series).
PREINITIALIZED_APIS = ("ApiVersions", "Metadata", "Produce", "Fetch")
LONG_POLL_APIS = ("Fetch", "ShareFetch")     # answered empty after max.wait.ms: kept apart
# Unknown API keys (all counted as "unknown") remembered for a quick lookup; past this, looked up anew.
MAX_CACHED_API_KEYS = 1024
DEFAULT_LABEL_CAP = 100   # distinct client_id / topic values before folding into "other"
# Rebalances: a few hundred milliseconds for a small group up to max.poll.interval.ms (5 min).
REBALANCE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# Failover recovery: a client following a KIP-951 hint recovers in tens of milliseconds, one
# that waits for Metadata in hundreds, one that waits out retry.backoff or a node's
# session timeout in seconds to tens of seconds.
FAILOVER_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# Version label of requests at versions the schema does not define for their API: a client may
# send any of 65,536, and a series (and cached count) each would grow /metrics without bound.
UNDEFINED_VERSION_LABEL = "unknown"
# Client software names/versions are whatever the client sends (Kafka sets no length limit):
# label values are cut to this many characters.
SOFTWARE_LABEL_MAX_CHARS = 64
# Kafka's name for a client that has not authenticated (no SASL, no client certificate).
ANONYMOUS = "ANONYMOUS"
# A connection that has not named its software (no ApiVersions v3+ yet, or an older client).
UNKNOWN_SOFTWARE = "unknown"
# Consumer groups whose rebalance state is kept; past this the least recently active is dropped
# (its counters stay; its members leave the members gauge).
MAX_TRACKED_GROUPS = 10_000
# A group kproxy has seen nothing of for this long has no member talking through it any more
# (members heartbeat every few seconds): dropped at the next scrape.
GROUP_IDLE_SECONDS = 300.0
# A KIP-848 member not heard from for this long has left (session.timeout.ms defaults to 45 s).
MEMBER_STALE_SECONDS = 120.0
# KIP-848 member ids remembered per group (the members gauge counts at most this many).
MAX_MEMBERS_PER_GROUP = 10_000

# Compared per event: plain int globals (an ApiKey attribute lookup costs ~4 global
# reads, and an int compares with an int faster than with an IntEnum member).
FETCH_KEYS = frozenset(map(int, (ApiKey.FETCH, ApiKey.SHARE_FETCH)))   # long-poll until data or max.wait.ms
_FETCH, _METADATA, _PRODUCE, _API_VERSIONS = map(int, (ApiKey.FETCH, ApiKey.METADATA, ApiKey.PRODUCE,
                                                       ApiKey.API_VERSIONS))
_JOIN_GROUP, _SYNC_GROUP, _LEAVE_GROUP = map(int, (ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.LEAVE_GROUP))
FETCH_BY_TOPIC_ID = 13    # Fetch v13+ names topics by id, not name
READ_COMMITTED = 1        # Fetch isolation_level: the consumer reads only up to the last stable offset
# Fetch positions kept per connection (consumer lag). A broker leads a few thousand partitions
# at most in practice; past this a connection's new partitions are not tracked.
MAX_LAG_PARTITIONS_PER_CONNECTION = 100_000
# Topic id -> name pairs learnt from Metadata answers (Fetch v13+ names topics by id only).
MAX_TOPIC_IDS = 100_000
# Member heartbeats of the KIP-848 style protocols (response member_epoch) -> protocol label.
EPOCH_HEARTBEATS = {API_KEYS[name]: protocol for name, protocol in (
    ("ConsumerGroupHeartbeat", "consumer"), ("ShareGroupHeartbeat", "share"),
    ("StreamsGroupHeartbeat", "streams")) if name in API_KEYS}
# APIs a member calls within a generation or epoch (the shared pair-field table says which carry
# one): their errors below mean "rejoin the group".
GENERATION_APIS = frozenset(API_KEYS[name] for name, columns in PAIR_FIELDS.items()
                            if "generation" in columns and name in API_KEYS)
GROUP_RESPONSE_KEYS = GENERATION_APIS | {_LEAVE_GROUP}
REJOIN_ERRORS = ("REBALANCE_IN_PROGRESS", "UNKNOWN_MEMBER_ID", "ILLEGAL_GENERATION",
                 "FENCED_MEMBER_EPOCH")
REJOIN_ERROR_CODES = frozenset(code for code, name in schema.ERROR_NAMES.items() if name in REJOIN_ERRORS)
CLOSE_REASONS = tuple(kind.label for kind in CloseKind)


# Why a broker listener could not be bound (errno -> reason label; anything else is "other").
BIND_FAILURE_REASONS = {errno.EADDRINUSE: "address_in_use", errno.EACCES: "permission_denied",
                        errno.EADDRNOTAVAIL: "address_not_available"}


def bind_failure_label(error: OSError) -> str:
    return BIND_FAILURE_REASONS.get(error.errno, "other")


TLS_RELOAD_OUTCOMES = ("success", "failure")

# Why SNI routing refused a handshake: a name it does not serve, no name at all, (a
# sidecar) another node's name, or (a gateway) a broker name of a node the cluster does not
# have: one label for all such nodes, so names a client makes up cannot grow /metrics.
SNI_REFUSAL_REASONS = ("unknown_name", "no_name", "other_node", "unknown_node")


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

    def forget(self, value: str) -> None:
        """``value`` is no longer a label (its series was removed): its slot is free."""
        self.seen.discard(value)


class _Histogram:
    """A histogram as plain numbers: a count per bucket (not cumulative; the last is +Inf) and
    the sum. Only the event loop writes; a scrape reads a copy (see ``_ApiCollector``)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1     # le: a value on a bound is in it
        self.sum += value


class _ApiSeries:
    """One API's per-pair metrics as plain numbers (no lock, no label lookup per update),
    published by ``_ApiCollector`` at scrape time."""

    __slots__ = ("name", "requests", "request_bytes", "response_bytes", "throttled", "opaque",
                 "latency", "long_poll", "request_size", "response_size", "throttle")

    def __init__(self, name: str):
        self.name = name
        self.requests = self.request_bytes = self.response_bytes = self.throttled = self.opaque = 0
        self.latency = _Histogram(LATENCY_BUCKETS)
        self.long_poll = _Histogram(LATENCY_BUCKETS) if name in LONG_POLL_APIS else None
        self.request_size = _Histogram(SIZE_BUCKETS)
        self.response_size = _Histogram(SIZE_BUCKETS)
        self.throttle = _Histogram(THROTTLE_BUCKETS)


class _VersionCount:
    """Requests of one API version, as a plain number (``_VersionCollector`` publishes it), and
    what every pair of that version looks up, found once: its API's series, its error walker.
    ``api_version`` None: every version the schema does not define for the API, together."""

    __slots__ = ("api", "version", "removed", "count", "series", "walker")

    def __init__(self, series: _ApiSeries, api_key: int, api_version: int | None):
        self.api = series.name
        self.count = 0
        self.series = series
        if api_version is None:   # Kafka 4.0 removed defined versions only; no body decodes
            self.version, self.removed, self.walker = UNDEFINED_VERSION_LABEL, False, None
            return
        self.version = str(api_version)
        self.removed = is_removed(api_key, api_version)      # Kafka 4.0 rejects it
        self.walker = error_walker("response", api_key, api_version)


class _BatchTotals:
    """Record batches seen in one direction (Produce requests or Fetch responses), as plain numbers."""

    __slots__ = ("records", "bytes", "batches")

    def __init__(self):
        self.records = self.bytes = 0
        self.batches = dict.fromkeys(CODEC_NAMES, 0)


def _by_reason(name: str, documentation: str, reasons, registry) -> Counter:
    """A counter labelled ``reason`` from a fixed set, every reason exported from the start
    at zero (alerts and dashboards can rate() a reason before it first happens)."""
    counter = Counter(name, documentation, ["reason"], registry=registry)
    for reason in reasons:
        counter.labels(reason)
    return counter


class _ListenerMetrics:
    """The listeners' families: connections accepted, open and closed; refusals (TLS
    handshakes, SNI routing, PROXY protocol headers); broker listeners that cannot bind;
    TLS reloads and certificate expiry. Fed by the lifecycle hooks, never per pair."""

    def __init__(self, r: CollectorRegistry, unbound_listeners=None):
        self.connections_open = Gauge("kproxy_connections_open", "Client connections open now",
                                      ["listener"], registry=r)
        self.connections_opened = Counter("kproxy_connections_opened_total",
                                          "Client connections accepted", ["listener"], registry=r)
        self.connections_closed = Counter("kproxy_connections_closed_total",
                                          "Client connections closed, by reason",
                                          ["listener", "reason"], registry=r)
        self.tls_handshake_failures = _by_reason(
            "kproxy_tls_handshake_failures_total",
            "Client TLS handshakes that failed, by cause (plaintext or HTTP on a TLS listener, "
            "certificate problems, no common protocol)", HANDSHAKE_FAILURES, r)
        self.listener_bind_failures = Counter(
            "kproxy_listener_bind_failures_total",
            "Failed attempts to bind a broker listener (its node is withheld from clients meanwhile)",
            ["listener", "reason"], registry=r)
        self.sni_refusals = _by_reason(
            "kproxy_sni_refused_total",
            "TLS handshakes refused by SNI routing: a server name that is no advertised name, "
            "none, (a sidecar) another node's, or a node the cluster does not have",
            SNI_REFUSAL_REASONS, r)
        self.proxy_header_refusals = _by_reason(
            "kproxy_proxy_protocol_refused_total",
            "Connections refused on a PROXY protocol listener: a peer outside the trusted networks, "
            "no header, one of another version, malformed, too long, not complete in time, or "
            "closed before it was", PROXY_HEADER_REFUSALS, r)
        # TLS files reloaded while running (proxy/tls_reload.py), per side: "server" (what
        # clients see), "client" (what brokers see). Series for a side appear with its first
        # certificate, both outcomes at zero.
        self.tls_reloads = Counter(
            "kproxy_tls_reloads_total",
            "Reloads of changed TLS files (or on SIGHUP), by side and outcome; a failure keeps "
            "the certificate in use", ["side", "outcome"], registry=r)
        self.tls_certificate_expiry = Gauge(
            "kproxy_tls_certificate_expiry_timestamp_seconds",
            "When the certificate kproxy presents expires (Unix time), by side; alert well ahead",
            ["side"], registry=r)
        unbound = Gauge("kproxy_broker_listeners_unbound",
                        "Broker listeners kproxy cannot bind now (their nodes are withheld from clients)",
                        registry=r)
        unbound.set_function(unbound_listeners or (lambda: 0))
        self._expiry_sides: set[str] = set()            # sides with an expiry series

    def connection_refused(self, listener: str, reason: CloseCause) -> None:
        """Accepted, then closed before it was proxied (upstream unreachable, limits, shutdown)."""
        self.connections_opened.labels(listener).inc()
        self.connections_closed.labels(listener, reason.label).inc()

    def tls_handshake_failed(self, cause: str) -> None:
        self.tls_handshake_failures.labels(cause if cause in HANDSHAKE_FAILURES else "other").inc()

    def listener_bind_failed(self, listener: str, error: OSError) -> None:
        self.listener_bind_failures.labels(listener, bind_failure_label(error)).inc()

    def sni_refused(self, reason: str) -> None:
        self.sni_refusals.labels(reason).inc()

    def proxy_header_refused(self, listener: str, reason: str) -> None:
        """A PROXY protocol listener closed a connection for its header (or the lack of one)."""
        self.proxy_header_refusals.labels(reason if reason in PROXY_HEADER_REFUSALS else "malformed").inc()
        self.connections_opened.labels(listener).inc()
        self.connections_closed.labels(listener, CloseKind.PROXY_PROTOCOL.label).inc()

    def tls_certificate_loaded(self, side: str, not_after: float | None) -> None:
        for outcome in TLS_RELOAD_OUTCOMES:
            self.tls_reloads.labels(side, outcome)
        if not_after is not None:
            self.tls_certificate_expiry.labels(side).set(not_after)
            self._expiry_sides.add(side)
        elif side in self._expiry_sides:        # now a CA alone: nothing of kproxy's own expires
            self.tls_certificate_expiry.remove(side)
            self._expiry_sides.discard(side)

    def tls_reloaded(self, side: str, outcome: str) -> None:
        self.tls_reloads.labels(side, outcome).inc()


class _GroupMetrics:
    """Consumer groups from the wire: rebalances (classic generations, KIP-848 epochs), the
    classic rebalance time, rejoin errors, and members now (at scrape time). The group
    label is opt-in; without it, totals. Fed by group APIs' requests and answers only."""

    def __init__(self, r: CollectorRegistry, group_label: bool, label_cap: int):
        group = ["group"] if group_label else []
        self.group_label = BoundedLabel(label_cap) if group_label else None
        self.group_rebalances = Counter(
            "kproxy_group_rebalances_total",
            "Group rebalances: new generations in JoinGroup answers, member epoch bumps (KIP-848)",
            group + ["protocol"], registry=r)
        self.group_rebalance_seconds = Histogram(
            "kproxy_group_rebalance_seconds",
            "Classic rebalance time: first JoinGroup request of a round to the last SyncGroup answer",
            group, buckets=REBALANCE_BUCKETS, registry=r)
        self.group_rejoin_errors = Counter(
            "kproxy_group_rejoin_errors_total",
            "Answers to group members with an error that makes them rejoin the group",
            group + ["api", "error"], registry=r)
        self.by_id: OrderedDict[str, _GroupState] = OrderedDict()   # least recently active first
        self._now = 0.0                                               # latest group event time
        r.register(_GroupMembersCollector(self))

    def _group(self, group_id: str, now: float) -> "_GroupState":
        """The state of a group, marked most recently active (created, evicting the least, if new)."""
        self._now = now
        groups = self.by_id
        state = groups.get(group_id)
        if state is None:
            if len(groups) >= MAX_TRACKED_GROUPS:
                groups.popitem(last=False)
            label = self.group_label(group_id) if self.group_label is not None else None
            state = groups[group_id] = _GroupState(label)
        else:
            groups.move_to_end(group_id)
        state.seen = now
        return state

    def join_requested(self, body, now: float) -> None:
        """A JoinGroup request: the first one since the group settled starts a round."""
        group_id = getattr(body, "group_id", None)
        if group_id:
            state = self._group(group_id, now)
            if state.round_start is None:
                state.round_start = now

    def _group_labels(self, state: "_GroupState", *labels: str) -> tuple:
        return (state.label, *labels) if state.label is not None else labels

    def answered(self, event: ResponseReceived, api: str, body, codes: list[int]) -> None:
        request = event.request_event.request
        if request is None or request.is_opaque:
            return
        fields = pair_fields(event.api_key, request.body, body)
        group_id = fields["group_id"]
        if not group_id:
            return
        state = self._group(group_id, event.time)
        for code in set(codes) & REJOIN_ERROR_CODES if codes else ():
            self.group_rejoin_errors.labels(*self._group_labels(state, api, error_name(code))).inc()
        if getattr(body, "error_code", 0):
            return
        key = event.api_key
        if key == _JOIN_GROUP:
            self._joined(state, body, fields["generation"], event.request_event.time)
        elif key == _SYNC_GROUP:
            if fields["generation"] == state.generation and state.round_start is not None:
                state.synced += 1
                if state.expected and state.synced >= state.expected:   # the last member synced
                    histogram = self.group_rebalance_seconds
                    if state.label is not None:
                        histogram = histogram.labels(state.label)
                    histogram.observe(max(0.0, event.time - state.round_start))
                    state.round_start = None
        elif key == _LEAVE_GROUP:
            leaving = getattr(request.body, "members", None)
            state.classic_members = max(0, state.classic_members - (len(leaving) if leaving else 1))
        elif key in EPOCH_HEARTBEATS:
            self._epoch_heartbeat(state, EPOCH_HEARTBEATS[key], request.body, body, fields["member_id"],
                                  event.time)

    def _joined(self, state: "_GroupState", body, generation, requested: float) -> None:
        if generation is None:
            return
        if generation != state.generation:       # a new round (or a group made anew)
            state.generation, state.synced, state.expected = generation, 0, 0
            if state.round_start is None:
                state.round_start = requested
            self.group_rebalances.labels(*self._group_labels(state, "classic")).inc()
        elif state.expected and state.synced >= state.expected:
            state.round_start = None             # a rejoin the coordinator answered without a round
        members = getattr(body, "members", None)
        if members and body.leader == body.member_id:       # only the leader learns the members
            state.expected = state.classic_members = len(members)

    def _epoch_heartbeat(self, state: "_GroupState", protocol: str, request_body, body,
                         member_id, now: float) -> None:
        sent = getattr(request_body, "member_epoch", 0)
        granted = getattr(body, "member_epoch", -1)
        members = state.members
        if sent < 0:                             # -1 leaving, -2 a static member leaving
            members.pop(member_id, None)
            return
        if member_id and (member_id in members or len(members) < MAX_MEMBERS_PER_GROUP):
            members[member_id] = now
        if granted > sent and granted > state.epoch:    # the group moved to a new epoch
            state.epoch = granted
            self.group_rebalances.labels(*self._group_labels(state, protocol)).inc()

    def group_members(self) -> dict:
        """Members per group label (None without the group label), dropping what went quiet."""
        now = self._now
        out: dict = {}
        for group_id, state in list(self.by_id.items()):
            if now - state.seen > GROUP_IDLE_SECONDS:
                del self.by_id[group_id]
                continue
            members = state.members
            for member_id, seen in list(members.items()):
                if now - seen > MEMBER_STALE_SECONDS:
                    del members[member_id]
            out[state.label] = out.get(state.label, 0) + state.classic_members + len(members)
        return out


class _SoftwareMetrics:
    """The client inventory: connections open now by the software the client named
    (ApiVersions v3+, accepted by the broker), and requests at removed versions by it."""

    def __init__(self, r: CollectorRegistry, label_cap: int):
        self.software_connections = Gauge(
            "kproxy_client_software_connections",
            "Client connections open now, by the software the client named in ApiVersions v3+ (capped)",
            ["client_software_name", "client_software_version"], registry=r)
        self.deprecated_requests = Counter(
            "kproxy_deprecated_requests_total",
            "Requests at versions Kafka 4.0 removed (KIP-896): these clients must upgrade first",
            ["api", "version", "client_software_name"], registry=r)
        self._software_pair = BoundedLabel(label_cap)     # "name\0version" pairs
        self._software_name = BoundedLabel(label_cap)
        self._unknown_software = self.software_connections.labels(UNKNOWN_SOFTWARE, UNKNOWN_SOFTWARE)
        self.by_connection: dict[int, tuple[str, object]] = {}   # connection id -> (name label, gauge child)

    def opened(self, info) -> None:
        """A new connection counts under ``unknown`` until it names its software."""
        self.by_connection[info.id] = (UNKNOWN_SOFTWARE, self._unknown_software)
        self._unknown_software.inc()

    def closed(self, info) -> None:
        software = self.by_connection.pop(info.id, None)
        if software is not None:
            software[1].dec()

    def name_of(self, info) -> str:
        """The software name label of a connection (``unknown`` until it names one)."""
        software = self.by_connection.get(info.id) if info is not None else None
        return software[0] if software is not None else UNKNOWN_SOFTWARE

    def named(self, event: ResponseReceived, info, body) -> None:
        """Move the connection from ``unknown`` (or what it named before) to the software an
        accepted ApiVersions v3+ names (``client_software.software_named``: Kafka's rule)."""
        current = self.by_connection.get(info.id) if info is not None else None
        if current is None:
            return
        named = software_named(event)
        if named is None:
            return
        name = named.name[:SOFTWARE_LABEL_MAX_CHARS]
        version = named.version[:SOFTWARE_LABEL_MAX_CHARS]
        if self._software_pair(f"{name}\0{version}") == "other":
            name_label, child = "other", self.software_connections.labels("other", "other")
        else:
            name_label = self._software_name(name)
            child = self.software_connections.labels(name, version)
        if child is current[1]:
            return
        current[1].dec()
        child.inc()
        self.by_connection[info.id] = (name_label, child)


def _register_process(r: CollectorRegistry, in_flight) -> None:
    """The process's own families (CPU, memory, GC), kproxy's build, requests in flight."""
    ProcessCollector(registry=r)
    PlatformCollector(registry=r)
    GCCollector(registry=r)
    r.register(_InFlightCollector(in_flight or (lambda: 0)))
    build = Gauge("kproxy_build_info", "kproxy version and the Kafka schema it decodes",
                  ["version", "python", "kafka_schema"], registry=r)
    build.labels(__version__, platform.python_version(), "+".join(SCHEMA_SOURCES)).set(1)


def _register_readers(r: CollectorRegistry, traffic, capture, audit, telemetry, policy,
                      client_id_label: bool, principal_label: bool) -> None:
    """Families read at scrape time from other parts of kproxy, nothing on the hot path:
    the connections' byte totals, the capture, the audit trail, the client telemetry
    harvest, the policy observer (each only when there is one)."""
    r.register(_TrafficCollector(traffic or (lambda: {})))
    if capture is not None:
        r.register(_CaptureCollector(capture))
    if audit is not None:
        r.register(_AuditCollector(audit))
    if telemetry is not None:
        r.register(_ClientTelemetryCollector(telemetry, client_id_label, principal_label))
    if policy is not None:
        r.register(_PolicyCollector(policy))


class _PairMetrics:
    """What every request/response pair updates, by API (``_ApiSeries``) and by API version
    (``_VersionCount``): plain numbers on the event loop, published by collectors at scrape
    time; and the rarer families beside them: errors in answers, frames that did not decode
    or were streamed, SASL v0 raw tokens."""

    def __init__(self, r: CollectorRegistry):
        # (api key, version) -> its request count, published at scrape time (every request adds
        # one); (api key, None) -> the count of the versions the schema does not define for it.
        self.versions: dict[tuple[int, int | None], _VersionCount] = {}
        r.register(_VersionCollector(self.versions))
        self.apis: dict[int, _ApiSeries] = {}        # api key -> its series (unknown keys share one)
        self.api_series: dict[str, _ApiSeries] = {}  # label value -> series, in the order first seen
        r.register(_ApiCollector(self.api_series))
        self.errors = Counter("kproxy_response_errors_total",
                              "Non-zero error codes in responses (top level and per partition/resource)",
                              ["api", "error"], registry=r)
        self.decode_failures = Counter("kproxy_decode_failures_total",
                                       "Frames that failed to decode, by direction", ["direction"],
                                       registry=r)
        self.frames_streamed = Counter(
            "kproxy_frames_streamed_total",
            "Large frames passed on as they arrived, not kept whole (their bodies were not decoded)",
            ["direction"], registry=r)
        self.sasl_tokens = Counter("kproxy_sasl_raw_tokens_total",
                                   "SASL v0 raw tokens passed through (never decoded)", ["direction"],
                                   registry=r)
        for name in PREINITIALIZED_APIS:
            self.series(API_KEYS[name])
        self._error_children: dict[tuple[str, int], object] = {}   # (api, error code) -> child
        self.undecoded = {d: self.decode_failures.labels(d) for d in ("request", "response")}
        self.streamed = {d: self.frames_streamed.labels(d) for d in ("request", "response")}

    def series(self, api_key: int) -> _ApiSeries:
        series = self.apis.get(api_key)
        if series is None:
            name = api_name(api_key) if api_key in schema.API_NAMES else "unknown"
            series = self.api_series.get(name)
            if series is None:
                series = self.api_series[name] = _ApiSeries(name)
            if api_key in schema.API_NAMES or len(self.apis) < MAX_CACHED_API_KEYS:
                self.apis[api_key] = series
        return series

    def version(self, api_key: int, api_version: int) -> _VersionCount | None:
        """The count of requests of an API version (made on its first request); None for API
        keys Kafka does not define (not counted by version, and never cached: any of 65,536).
        Versions the schema does not define share one count per API, cached under None."""
        version = self.versions.get((api_key, api_version))
        if version is None and api_key in schema.API_NAMES:
            if not schema.REQUESTS[api_key].has_version(api_version):
                api_version = None            # looked up anew each time: any of 65,536
                version = self.versions.get((api_key, None))
            if version is None:
                version = self.versions[(api_key, api_version)] = _VersionCount(
                    self.series(api_key), api_key, api_version)
        return version

    def error_child(self, api: str, code: int):
        """The kproxy_response_errors_total child of (API, error code), looked up once.
        Kept on prometheus-client: healthy traffic has no errors, so it is off the per-pair path."""
        key = (api, code)
        child = self._error_children.get(key)
        if child is None:
            child = self._error_children[key] = self.errors.labels(api, error_name(code))
        return child


class _RecordMetrics:
    """Records, batch bytes and batches by codec in Produce requests and Fetch answers, from
    batch headers only (nothing is decompressed); by topic too when the topic label is on."""

    def __init__(self, r: CollectorRegistry):
        self.produced, self.fetched = _BatchTotals(), _BatchTotals()
        r.register(_BatchCollector(self.produced, self.fetched))

    def produce(self, body, topics: "_TopicMetrics") -> None:
        for topic in body.topic_data:
            for partition in topic.partition_data:
                nbytes = self.count(partition.records, self.produced)
                if topics.label is not None and nbytes:
                    topics.count(topics.produced, topic, nbytes)

    def produce_tally(self, tally, topics: "_TopicMetrics") -> None:
        """As ``produce``, from a Produce request's tally."""
        produced, labelled = self.produced, topics.label is not None
        for topic in tally.topics:
            for records in topic.records:
                nbytes = self.count(records, produced)
                if labelled and nbytes:
                    topics.count_topic(topics.produced, topic.name, topic.topic_id, nbytes)

    def fetch_tally(self, tally, topics: "_TopicMetrics") -> int:
        """As ``fetch``, from a Fetch answer's tally."""
        fetched, labelled = self.fetched, topics.label is not None
        total = 0
        for topic in tally.topics:
            for partition in topic.partitions:
                nbytes = self.count(partition.records, fetched)
                total += nbytes
                if labelled and nbytes:
                    topics.count_topic(topics.fetched, topic.name, topic.topic_id, nbytes)
        return total

    def fetch(self, body, topics: "_TopicMetrics") -> int:
        """A Fetch (or ShareFetch) answer's records; returns their bytes (0: an empty long poll)."""
        total = 0
        for topic in body.__dict__.get("responses") or ():      # as getattr, without its AttributeError
            for partition in topic.partitions:
                nbytes = self.count(partition.records, self.fetched)
                total += nbytes
                if topics.label is not None and nbytes:
                    topics.count(topics.fetched, topic, nbytes)
        return total

    @staticmethod
    def count(records, totals: _BatchTotals) -> int:
        """Batch headers only: no decompression. Returns the bytes of complete batches
        (garbage records are the broker's business: counted what was readable)."""
        if not records:
            return 0
        nbytes, count = count_batches(records, totals.batches)
        totals.records += count
        totals.bytes += nbytes
        return nbytes


class _TopicMetrics:
    """Topics: record batch bytes produced and fetched by topic (the opt-in topic label,
    capped), and the names of topic ids (Fetch v13+ names topics by id only), learnt from
    Metadata answers and kproxy's own lookups (``topic_named``)."""

    def __init__(self, r: CollectorRegistry, topic_label: bool, label_cap: int):
        self.label = BoundedLabel(label_cap) if topic_label else None
        if topic_label:
            self.produced_bytes = Counter("kproxy_topic_produced_bytes_total",
                                          "Record batch bytes produced, by topic (opt-in, capped)",
                                          ["topic"], registry=r)
            self.fetched_bytes = Counter("kproxy_topic_fetched_bytes_total",
                                         "Record batch bytes fetched, by topic (opt-in, capped)",
                                         ["topic"], registry=r)
            # By id until the name is known, then moved to the name (topic_bytes.py).
            self.produced = TopicBytes(self.produced_bytes, self.label)
            self.fetched = TopicBytes(self.fetched_bytes, self.label)
        self.names: dict = {}                    # topic id (Uuid) -> name

    def name_of(self, topic) -> str:
        """A topic's name; Fetch v13+ and others name it by id, resolved from what was learnt."""
        name = getattr(topic, "name", None) or getattr(topic, "topic", None)
        if name:
            return name
        topic_id = getattr(topic, "topic_id", None)
        if topic_id is None:
            return ""
        return self.names.get(topic_id) or str(topic_id)

    def name_of_key(self, key) -> str:
        """As ``name_of``, for a topic given by its name or id (a tally's)."""
        if key.__class__ is str:
            return key
        return self.names.get(key) or str(key)

    def count(self, counts: TopicBytes, topic, nbytes: int) -> None:
        """Bytes of a topic (a decoded struct) under its name, or under its id until the name is known."""
        name = getattr(topic, "name", None) or getattr(topic, "topic", None)
        self.count_topic(counts, name, None if name else getattr(topic, "topic_id", None), nbytes)

    def count_topic(self, counts: TopicBytes, name: str | None, topic_id, nbytes: int) -> None:
        """As ``count``, for a topic given by ``name`` or else ``topic_id``."""
        if name:
            topic_id = None
        if topic_id is not None:
            name = self.names.get(topic_id)
            if not name:
                counts.add_by_id(topic_id, nbytes)
                return
        counts.add(name or "", nbytes)

    def named(self, topic_id, name: str) -> None:
        """An id's name is known: remembered, and bytes counted under the id move to it."""
        if topic_id in self.names or len(self.names) < MAX_TOPIC_IDS:
            self.names[topic_id] = name
        if self.label is not None:
            self.produced.named(topic_id, name)
            self.fetched.named(topic_id, name)

    def learn(self, body) -> None:
        """The topic ids a Metadata answer names."""
        for topic in getattr(body, "topics", None) or ():
            topic_id, name = getattr(topic, "topic_id", None), getattr(topic, "name", None)
            if name and topic_id and any(topic_id) and topic_id not in self.names \
                    and len(self.names) < MAX_TOPIC_IDS:
                self.named(topic_id, name)


class _FailoverMetrics:
    """What a leader change cost each client (``observers/failover.py`` tells): recovery
    time by client software (its name capped like the inventory's)."""

    def __init__(self, r: CollectorRegistry, software: _SoftwareMetrics):
        self.software = software
        self.failover_recovery = Histogram(
            "kproxy_failover_recovery_seconds",
            "Time a client took to get through a partition leader change: its first request "
            "failed with a leadership error to its first answer without error, by client software",
            ["software"], buckets=FAILOVER_BUCKETS, registry=r)

    def recovered(self, failover) -> None:
        name = (failover.client.software_name or UNKNOWN_SOFTWARE)[:SOFTWARE_LABEL_MAX_CHARS]
        self.failover_recovery.labels(self.software._software_name(name)).observe(failover.recovery_seconds)


class _PrincipalMetrics:
    """Who is it (opt-in): requests and bytes by principal (SASL user, or client certificate
    subject; capped) and API. A connection counts under the user a SASL exchange the broker
    accepted names, from then on."""

    def __init__(self, r: CollectorRegistry, label_cap: int):
        self.label = BoundedLabel(label_cap)
        by = ["principal", "api"]
        self.principal_requests = Counter(
            "kproxy_principal_requests_total",
            "Requests by authenticated principal and API (opt-in, capped)", by, registry=r)
        self.principal_request_bytes = Counter(
            "kproxy_principal_request_bytes_total",
            "Request bytes by authenticated principal and API (opt-in, capped)", by, registry=r)
        self.principal_response_bytes = Counter(
            "kproxy_principal_response_bytes_total",
            "Response bytes by authenticated principal and API (opt-in, capped)", by, registry=r)
        # connection id -> [principal label, SaslPrincipal or None, {api key: children}]
        self.by_connection: dict[int, list] = {}

    def _state(self, info) -> list:
        state = self.by_connection.get(info.id)
        if state is None:
            principal = info.principal if getattr(info, "principal", None) else ANONYMOUS
            state = self.by_connection[info.id] = [self.label(principal), None, {}]
        return state

    def children(self, info, api_key: int, api: str) -> tuple:
        """The (requests, request bytes, response bytes) children of a connection's principal
        for one API, looked up once per connection and API."""
        state = self._state(info)
        children = state[2].get(api_key)
        if children is None:
            label = state[0]
            children = state[2][api_key] = (self.principal_requests.labels(label, api),
                                            self.principal_request_bytes.labels(label, api),
                                            self.principal_response_bytes.labels(label, api))
        return children

    def sasl_answered(self, event: ResponseReceived, info, body) -> None:
        """SaslHandshake / SaslAuthenticate: once the broker accepts the exchange, the
        connection's later requests count under the user it named."""
        request = event.request_event.request
        if request is None or request.is_opaque:
            return
        state = self._state(info)
        if state[1] is None:
            state[1] = SaslPrincipal()
        if state[1].observe(event.api_key, request.body, body):
            state[0], state[2] = self.label(state[1].principal), {}

    def closed(self, info) -> None:
        self.by_connection.pop(info.id, None)


class _LagMetrics:
    """Consumer lag from the wire: per connection, the offsets its Fetches ask for and the
    partition ends the answers give (partition headers only), summed at scrape time by
    client_id and topic (each where its opt-in label is on); dropped when it closes."""

    def __init__(self, r: CollectorRegistry, client_id_label: BoundedLabel | None, topics: _TopicMetrics):
        self.client_id_label = client_id_label
        self.topics = topics
        self.positions: dict[int, _FetchPositions] = {}     # connection id -> its consumer's
        r.register(_ConsumerLagCollector(self))

    def fetch_answered(self, event: ResponseReceived, info, body) -> None:
        """A consumer's Fetch and its answer: remember, per partition, the offset asked for and
        the partition's end. Partition headers only (the records are never looked at).

        Incremental fetch sessions (KIP-227) name only partitions whose position changed, and
        answer only partitions with news: the rest keep what the connection last said.
        """
        # Fields of some versions only are read from the structs' dicts: getattr's default for
        # a missing attribute costs an AttributeError made and caught, on every Fetch.
        request = event.request_event.partial
        if request is None or request.is_opaque or body.__dict__.get("error_code", 0):    # v7+
            return
        wanted = request.body
        fields = wanted.__dict__
        replica = fields.get("replica_state")                            # v15+
        if (replica.replica_id if replica is not None else fields.get("replica_id", -1)) >= 0:
            return                               # a follower broker replicating, not a consumer
        conn_id = info.id if info is not None else 0
        state = self.positions.get(conn_id)
        if state is None:
            client = self.client_id_label(request.client_id) if self.client_id_label is not None else None
            state = self.positions[conn_id] = _FetchPositions(client)
        partitions = state.partitions
        by = "topic" if event.api_version < FETCH_BY_TOPIC_ID else "topic_id"
        if fields.get("session_epoch", -1) <= 0:      # a full fetch: it lists every partition
            partitions.clear()
        for topic in fields.get("forgotten_topics_data") or ():
            key = getattr(topic, by)
            for index in topic.partitions:
                partitions.pop((key, index), None)
        topic_label = self.topics.label
        for topic in wanted.topics:
            key = getattr(topic, by)
            label = None
            for partition in topic.partitions:
                entry = partitions.get((key, partition.partition))
                if entry is not None:
                    entry[0] = partition.fetch_offset
                elif len(partitions) < MAX_LAG_PARTITIONS_PER_CONNECTION:
                    if topic_label is not None and label is None:
                        label = topic_label(self.topics.name_of(topic))
                    partitions[(key, partition.partition)] = [partition.fetch_offset, -1, label]
        committed = fields.get("isolation_level", 0) == READ_COMMITTED
        for topic in body.responses:
            key = getattr(topic, by)
            for partition in topic.partitions:
                entry = partitions.get((key, partition.partition_index))
                if entry is None or partition.error_code:
                    continue
                end = partition.last_stable_offset if committed else partition.high_watermark
                if end >= 0:                     # v0-3 have no last stable offset (-1)
                    entry[1] = end
                elif committed and partition.high_watermark >= 0:
                    entry[1] = partition.high_watermark

    def fetch_tallied(self, event: ResponseReceived, info, asked, answer) -> None:
        """As ``fetch_answered``, from the Fetch request's and answer's tallies (``protocol.tally``)."""
        if answer.error_code or asked.replica_id >= 0:
            return                               # a follower broker replicating, not a consumer
        conn_id = info.id if info is not None else 0
        state = self.positions.get(conn_id)
        if state is None:
            client = self.client_id_label(asked.client_id) if self.client_id_label is not None else None
            state = self.positions[conn_id] = _FetchPositions(client)
        partitions = state.partitions
        if asked.session_epoch <= 0:             # a full fetch: it lists every partition
            partitions.clear()
        for key, indexes in asked.forgotten:
            for index in indexes:
                partitions.pop((key, index), None)
        topic_label = self.topics.label
        for key, wanted in asked.topics:
            label = None
            for index, offset in wanted:
                entry = partitions.get((key, index))
                if entry is not None:
                    entry[0] = offset
                elif len(partitions) < MAX_LAG_PARTITIONS_PER_CONNECTION:
                    if topic_label is not None and label is None:
                        label = topic_label(self.topics.name_of_key(key))
                    partitions[(key, index)] = [offset, -1, label]
        committed = asked.isolation_level == READ_COMMITTED
        by_name = event.api_version < FETCH_BY_TOPIC_ID
        for topic in answer.topics:
            key = topic.name if by_name else topic.topic_id
            for partition in topic.partitions:
                entry = partitions.get((key, partition.index))
                if entry is None or partition.error_code:
                    continue
                end = partition.last_stable_offset if committed else partition.high_watermark
                if end >= 0:                     # v0-3 have no last stable offset (-1)
                    entry[1] = end
                elif committed and partition.high_watermark >= 0:
                    entry[1] = partition.high_watermark

    def topic_named(self, topic_id, name: str) -> None:
        """Partitions consumers fetched by ``topic_id`` get its name as their topic label."""
        if self.topics.label is None:
            return
        label = None
        for state in self.positions.values():
            for (key, _), entry in state.partitions.items():
                if key == topic_id:
                    entry[2] = label = label or self.topics.label(name)

    def consumer_lags(self) -> dict:
        """Records behind, summed per (client_id label, topic label); None where a label is off."""
        out: dict = {}
        for state in list(self.positions.values()):
            client = state.client
            for offset, end, topic in list(state.partitions.values()):
                if end >= 0:
                    key = (client, topic)
                    out[key] = out.get(key, 0) + max(0, end - offset)
        return out

    def closed(self, info) -> None:
        self.positions.pop(info.id, None)


class Metrics:
    """The metrics observer. Call it with (connection info, events); scrape ``registry``.

    It reads each pair once and hands what it finds to the parts that own the families:
    ``pairs`` (per API and version), ``records``, ``topics``, ``software`` (the client
    inventory), ``groups``, ``principals`` (opt-in), ``lag``; ``listener_metrics`` and
    ``failovers`` hear lifecycle hooks only."""

    def __init__(self, client_id_label: bool = False, topic_label: bool = False,
                 label_cap: int = DEFAULT_LABEL_CAP, in_flight=None, traffic=None, capture=None,
                 unbound_listeners=None, group_label: bool = False, consumer_lag: bool = True,
                 principal_label: bool = False, audit=None, telemetry=None, policy=None):
        """``in_flight()``, ``traffic()`` and ``unbound_listeners()`` are read at scrape time
        (nothing on the hot path): traffic returns cumulative byte totals keyed like
        ``TRAFFIC_COUNTERS``; ``capture`` is the capture observer whose counters are exported.
        ``consumer_lag=False`` leaves the lag out (the metrics benchmark's baseline); ``audit``
        is the audit observer whose event counts are exported; ``telemetry`` the client
        telemetry harvest (``observers.telemetry``) whose clients' metrics are exported;
        ``policy`` the policy observer whose violations and refusals are."""
        # No "_created" series: one more per counter and histogram child, and nothing on the
        # dashboard or in the alerts reads them. Process-wide in prometheus-client; set here,
        # where kproxy's registry is made, so that every exposition of it goes without them.
        disable_created_metrics()
        r = self.registry = CollectorRegistry(auto_describe=True)
        # Parts in the order their families appear in the exposition.
        _register_process(r, in_flight)
        self.pairs = _PairMetrics(r)
        self.records = _RecordMetrics(r)
        self.listener_metrics = _ListenerMetrics(r, unbound_listeners)
        _register_readers(r, traffic, capture, audit, telemetry, policy, client_id_label, principal_label)
        self.client_id_label = BoundedLabel(label_cap) if client_id_label else None
        if client_id_label:
            self.client_requests = Counter("kproxy_client_requests_total",
                                           "Requests by client_id (opt-in, capped)", ["client_id"],
                                           registry=r)
        self.topics = _TopicMetrics(r, topic_label, label_cap)
        self.software = _SoftwareMetrics(r, label_cap)
        self.failovers = _FailoverMetrics(r, self.software)
        self.groups = _GroupMetrics(r, group_label, label_cap)
        self._groups = self.groups.by_id                  # the same table (tests look at it)
        self.principals = _PrincipalMetrics(r, label_cap) if principal_label else None
        self.lag = _LagMetrics(r, self.client_id_label, self.topics) if consumer_lag else None
        # Looked up per pair: the per-API part's tables and lookups, one attribute load nearer.
        pairs = self.pairs
        self._versions, self._version, self._series = pairs.versions, pairs.version, pairs.series

    # ------------------------------------------------------------ events

    def __call__(self, info, events: Iterable) -> None:
        for event in events:
            cls = event.__class__
            if cls is ResponseReceived:
                self._response(event, info)
            elif cls is RequestReceived:
                self._request(event, info)
            elif cls is SaslTokenPassed:
                self.pairs.sasl_tokens.labels(event.direction).inc()
            elif cls is MalformedFrame:
                self.pairs.undecoded["request" if event.direction == "client" else "response"].inc()

    def _request(self, event: RequestReceived, info) -> None:
        api_key = event.api_key
        version = self._version(api_key, event.api_version)
        series = version.series if version is not None else self._series(api_key)
        size = event.size
        series.requests += 1
        series.request_bytes += size
        series.request_size.observe(size)
        if self.principals is not None and info is not None:
            children = self.principals.children(info, api_key, series.name)
            children[0].inc()
            children[1].inc(size)
        if version is not None:
            version.count += 1
            if version.removed:               # from the header alone: no decoding needed
                software = self.software
                software.deprecated_requests.labels(series.name, version.version, software.name_of(info)).inc()
        if event.streamed:                    # no body: nothing more to count
            self.pairs.streamed["request"].inc()
            return
        tally = event.tally                   # Produce, Fetch: read from the frame, nothing decoded
        if tally is not None:
            if self.client_id_label is not None:
                self.client_requests.labels(self.client_id_label(tally.client_id)).inc()
            if api_key == _PRODUCE:
                self.records.produce_tally(tally, self.topics)
            return
        request = event.partial               # Produce (unusual frames): only topics and records decoded
        if request is None:
            self.pairs.undecoded["request"].inc()
            return
        if request.body.__class__ is OpaqueBody:      # request.is_opaque, without a property call
            series.opaque += 1
            return
        if self.client_id_label is not None:
            self.client_requests.labels(self.client_id_label(request.client_id)).inc()
        if event.api_key == _JOIN_GROUP:
            self.groups.join_requested(request.body, event.time)
        if event.api_key == _PRODUCE:
            self.records.produce(request.body, self.topics)

    def _response(self, event: ResponseReceived, info) -> None:
        request = event.request_event
        api_key, api_version = request.api_key, request.api_version
        # Found by its request, or (a version the schema does not define) its API's shared count,
        # whose walker is None: no walker is looked up, nor cached, per undefined version.
        # None: an API Kafka does not define.
        version = self._versions.get((api_key, api_version)) or self._version(api_key, api_version)
        series = version.series if version is not None else self._series(api_key)
        size = event.size
        series.response_size.observe(size)
        series.response_bytes += size
        if self.principals is not None and info is not None:
            self.principals.children(info, api_key, series.name)[2].inc(size)
        latency = event.time - request.time   # event.latency, without a property call per pair
        if event.streamed:
            self.pairs.streamed["response"].inc()
            series.latency.observe(latency)
            return
        tally = event.tally                   # Produce, Fetch: what is read below, read from the frame
        if tally is not None:
            if api_key == _PRODUCE:
                self._produce_answer(series, tally, latency)
                return
            asked = request.tally             # the consumer lag reads the Fetch request too
            if asked is not None:
                self._fetch_answer(event, info, series, asked, tally, latency)
                return
        response = event.partial              # Produce, Fetch: only the fields read below decoded
        if response is None:
            self.pairs.undecoded["response"].inc()
            series.latency.observe(latency)
            return
        body = response.body
        if body.__class__ is OpaqueBody:      # response.is_opaque, without a property call
            series.latency.observe(latency)
            return
        fetched = 0
        if api_key in FETCH_KEYS:
            fetched = self.records.fetch(body, self.topics)
            if api_key == _FETCH and self.lag is not None:
                self.lag.fetch_answered(event, info, body)
        elif api_key == _METADATA:
            self.topics.learn(body)
        elif api_key in _SASL_KEYS \
                and self.principals is not None and info is not None:
            self.principals.sasl_answered(event, info, body)
        if series.long_poll is not None and fetched == 0:
            series.long_poll.observe(latency)
        else:
            series.latency.observe(latency)
        throttle_ms = body.__dict__.get("throttle_time_ms")
        if throttle_ms is not None:
            series.throttle.observe(throttle_ms / 1000.0)
            if throttle_ms > 0:
                series.throttled += 1
        body_version = api_version if response.body_version is None else response.body_version
        if version is not None and body_version == api_version:
            codes: list[int] = []
            if version.walker is not None:    # error_codes with the walker found once per version
                version.walker(body, codes)
        else:
            codes = error_codes("response", api_key, body_version, body)
        for code in codes:
            self.pairs.error_child(series.name, code).inc()
        if api_key in GROUP_RESPONSE_KEYS:
            self.groups.answered(event, series.name, body, codes)
        elif api_key == _API_VERSIONS:
            self.software.named(event, info, body)

    def _produce_answer(self, series: _ApiSeries, tally, latency: float) -> None:
        """A Produce answer's tally: as ``_response`` counts its partial body (no long poll,
        no group or software to follow)."""
        series.latency.observe(latency)
        throttle_ms = tally.throttle_time_ms
        if throttle_ms is not None:
            series.throttle.observe(throttle_ms / 1000.0)
            if throttle_ms > 0:
                series.throttled += 1
        for code in tally.errors:
            self.pairs.error_child(series.name, code).inc()

    def _fetch_answer(self, event: ResponseReceived, info, series: _ApiSeries, asked, tally,
                      latency: float) -> None:
        """A Fetch request's and answer's tallies: as ``_response`` counts their partial bodies."""
        fetched = self.records.fetch_tally(tally, self.topics)
        if self.lag is not None:
            self.lag.fetch_tallied(event, info, asked, tally)
        if fetched == 0:
            series.long_poll.observe(latency)
        else:
            series.latency.observe(latency)
        throttle_ms = tally.throttle_time_ms
        if throttle_ms is not None:
            series.throttle.observe(throttle_ms / 1000.0)
            if throttle_ms > 0:
                series.throttled += 1
        for code in tally.errors:
            self.pairs.error_child(series.name, code).inc()

    # ------------------------------------------------------------ hooks (see ``contract.Hook``)

    def failover_recovered(self, failover) -> None:
        """A ``protocol.failover.Failover`` ended (the failover observer's hook)."""
        self.failovers.recovered(failover)

    def topic_named(self, topic_id, name: str) -> None:
        """kproxy asked the broker for a topic id's name (``proxy.topic_names``). Partitions
        consumers fetched by that id before get the name as their lag label."""
        self.topics.named(topic_id, name)
        if self.lag is not None:
            self.lag.topic_named(topic_id, name)

    def connection_opened(self, info) -> None:
        self.listener_metrics.connections_opened.labels(info.listener).inc()
        self.listener_metrics.connections_open.labels(info.listener).inc()
        self.software.opened(info)

    def connection_closed(self, info, reason: CloseCause, in_flight: int = 0) -> None:
        self.listener_metrics.connections_open.labels(info.listener).dec()
        self.software.closed(info)
        if self.lag is not None:
            self.lag.closed(info)
        if self.principals is not None:
            self.principals.closed(info)
        self.listener_metrics.connections_closed.labels(info.listener, reason.label).inc()

    # Listener-side hooks: counted by the listener families (``_ListenerMetrics``).

    def connection_refused(self, listener: str, reason: CloseCause) -> None:
        """Accepted, then closed before it was proxied (upstream unreachable, limits, shutdown)."""
        self.listener_metrics.connection_refused(listener, reason)

    def tls_handshake_failed(self, cause: str) -> None:
        self.listener_metrics.tls_handshake_failed(cause)

    def listener_bind_failed(self, listener: str, error: OSError) -> None:
        self.listener_metrics.listener_bind_failed(listener, error)

    def sni_refused(self, reason: str) -> None:
        self.listener_metrics.sni_refused(reason)

    def proxy_header_refused(self, listener: str, reason: str) -> None:
        """A PROXY protocol listener closed a connection for its header (or the lack of one)."""
        self.listener_metrics.proxy_header_refused(listener, reason)

    def tls_certificate_loaded(self, side: str, not_after: float | None) -> None:
        self.listener_metrics.tls_certificate_loaded(side, not_after)

    def tls_reloaded(self, side: str, outcome: str) -> None:
        self.listener_metrics.tls_reloaded(side, outcome)


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
    "rows_shipped": ("kproxy_capture_rows_shipped_total", "Capture rows the capture.kafka cluster acknowledged"),
    "ship_dropped": ("kproxy_capture_ship_dropped_total",
                     "Capture rows dropped because the Kafka producer's queue was full"),
    "ship_failed": ("kproxy_capture_ship_failed_total",
                    "Capture rows the capture.kafka cluster did not acknowledge (errors, or at stop)"),
    "files_uploaded": ("kproxy_capture_files_uploaded_total", "Closed capture files the capture.s3 store took"),
    "uploaded_bytes": ("kproxy_capture_uploaded_bytes_total", "Bytes of capture files uploaded to capture.s3"),
    "upload_failed": ("kproxy_capture_upload_failed_total",
                      "Closed capture files not uploaded (refused, unreachable, deleted first, or at stop)"),
    "upload_dropped": ("kproxy_capture_upload_dropped_total",
                       "Closed capture files not queued for upload because queue_max_files were waiting"),
    "decompression_refused": ("kproxy_capture_decompression_refused_total",
                              "Compressed batches capture did not inflate past its bound (likely bombs)"),
}


class _GroupState:
    """What kproxy knows of one consumer group's current round and members."""

    __slots__ = ("label", "seen", "generation", "round_start", "expected", "synced",
                 "classic_members", "epoch", "members")

    def __init__(self, label: str | None):
        self.label = label
        self.seen = 0.0
        self.generation: int | None = None   # classic: the last generation a JoinGroup answer gave
        self.round_start: float | None = None   # first JoinGroup request of the open round
        self.expected = 0                    # members of that generation (the leader's answer says)
        self.synced = 0                      # SyncGroup answers of that generation so far
        self.classic_members = 0
        self.epoch = -1                      # KIP-848: the highest member epoch granted
        self.members: dict[str, float] = {}  # KIP-848 member id -> last heartbeat answered


class _FetchPositions:
    """One connection's consumer: its client_id label, and per (topic name or id, partition)
    ``[fetch offset, partition end (-1 until answered), topic label]``."""

    __slots__ = ("client", "partitions")

    def __init__(self, client: str | None):
        self.client = client
        self.partitions: dict[tuple, list] = {}


class _ConsumerLagCollector:
    """kproxy_consumer_lag_records, summed from the connections' fetch positions at scrape time."""

    NAME = "kproxy_consumer_lag_records"
    HELP = ("Records between what consumers fetch and the partition end (high watermark; last stable "
            "offset for read_committed), summed over the partitions they fetch through kproxy")

    def __init__(self, lag: _LagMetrics):
        self.lag = lag

    def collect(self):
        m = self.lag
        with_client, with_topic = m.client_id_label is not None, m.topics.label is not None
        labels = ["client_id"] * with_client + ["topic"] * with_topic
        family = GaugeMetricFamily(self.NAME, self.HELP, labels=labels)
        lags = m.consumer_lags()
        if labels:
            for (client, topic), lag in lags.items():
                family.add_metric([client] * with_client + [topic] * with_topic, lag)
        else:
            family.add_metric([], sum(lags.values()))
        yield family

    def describe(self):
        return [GaugeMetricFamily(self.NAME, self.HELP)]


class _GroupMembersCollector:
    """kproxy_group_members, counted from the group state at scrape time."""

    NAME, HELP = "kproxy_group_members", "Group members now: the last classic generation plus KIP-848 members heartbeating"

    def __init__(self, groups: _GroupMetrics):
        self.metrics = groups

    def collect(self):
        labelled = self.metrics.group_label is not None
        family = GaugeMetricFamily(self.NAME, self.HELP, labels=["group"] if labelled else [])
        counts = self.metrics.group_members()
        if labelled:
            for label, count in counts.items():
                family.add_metric([label], count)
        else:
            family.add_metric([], sum(counts.values()))
        yield family

    def describe(self):
        return [GaugeMetricFamily(self.NAME, self.HELP)]


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


class _AuditCollector:
    """The audit trail's counts: events by API and outcome (a series per pair seen: ~25
    audited APIs x 4 outcomes, most never used), events dropped, file write failures."""

    EVENTS = ("kproxy_audit_events", "Audit events (cluster changes) by API and outcome "
              "(ok, error, partial: some resources failed, unanswered)")
    DROPPED = ("kproxy_audit_events_dropped", "Audit items dropped because the audit queue was full")
    WRITE_ERRORS = ("kproxy_audit_write_errors", "Audit events the audit file could not take "
                    "(they still went to the kproxy.audit log)")

    def __init__(self, audit):
        self.audit = audit

    def collect(self):
        family = CounterMetricFamily(*self.EVENTS, labels=["api", "outcome"])
        for (api, outcome), count in self.audit.events.copy().items():
            family.add_metric([api, outcome], count)
        yield family
        counters = self.audit.counters()
        yield CounterMetricFamily(*self.DROPPED, value=counters["dropped"])
        yield CounterMetricFamily(*self.WRITE_ERRORS, value=counters["write_errors"])

    def describe(self):
        return [CounterMetricFamily(*self.EVENTS), CounterMetricFamily(*self.DROPPED),
                CounterMetricFamily(*self.WRITE_ERRORS)]


# Client telemetry (KIP-714): what each client instance last pushed, and the latency split.
TELEMETRY_SPLIT_METRICS = (
    ("queue", "kproxy_client_record_queue_seconds",
     "Producer record queue time (average) the client last reported, per client instance"),
    ("request", "kproxy_client_request_latency_seconds",
     "Produce request latency (average) the client last reported, per client instance"),
    ("broker", "kproxy_client_broker_latency_seconds",
     "Produce latency kproxy measured for the same client (host, client_id) over the same push window"),
)


class _ClientTelemetryCollector:
    """Read at scrape time from the harvest: a series per pushed data point of every tracked
    client instance (their number is capped by the harvest; a client that terminates or goes
    quiet takes its series with it), labelled by what kproxy knows of the client."""

    def __init__(self, telemetry, client_id_label: bool, principal_label: bool):
        self.telemetry = telemetry
        self.joins = ["client_software_name", "client_software_version"]
        self.joins += ["client_id"] if client_id_label else []
        self.joins += ["principal"] if principal_label else []

    def _labels(self, instance) -> list[str]:
        software = instance.software
        values = [software.name[:SOFTWARE_LABEL_MAX_CHARS] if software else UNKNOWN_SOFTWARE,
                  software.version[:SOFTWARE_LABEL_MAX_CHARS] if software else UNKNOWN_SOFTWARE]
        if "client_id" in self.joins:
            values.append(instance.client_id or "")
        if "principal" in self.joins:
            values.append(instance.principal or ANONYMOUS)
        return [instance.instance_id, *values]

    def _families(self):
        by = ["client_instance_id", *self.joins]
        value = GaugeMetricFamily("kproxy_client_metric",
                                  "The latest value of each metric a client pushed (KIP-714), by client "
                                  "instance, metric name and the point's attributes (opt-in, capped)",
                                  labels=[*by, "name", "attributes"])
        splits = [GaugeMetricFamily(name, doc, labels=by) for _, name, doc in TELEMETRY_SPLIT_METRICS]
        pushes = CounterMetricFamily("kproxy_client_telemetry_pushes",
                                     "PushTelemetry requests relayed, by what kproxy did with them: "
                                     "harvested, refused (by the broker), undecodable, over_cap "
                                     "(more client instances than the label cap)", labels=["outcome"])
        clients = GaugeMetricFamily("kproxy_client_telemetry_clients",
                                    "Client instances whose pushed metrics kproxy exports now")
        return value, splits, pushes, clients

    def collect(self):
        value, splits, pushes, clients = self._families()
        instances = self.telemetry.instances()
        for instance in instances:
            labels = self._labels(instance)
            for metric in list(instance.values.values()):
                value.add_metric([*labels, metric.name, metric.attributes_text], metric.value)
            split = instance.split
            if split is not None:
                for (part, _, _), family in zip(TELEMETRY_SPLIT_METRICS, splits):
                    ms = getattr(split, part)
                    if ms is not None:
                        family.add_metric(labels, ms / 1000.0)
        for outcome, count in self.telemetry.outcomes.items():
            pushes.add_metric([outcome], count)
        clients.add_metric([], len(instances))
        yield value
        yield from splits
        yield pushes
        yield clients

    def describe(self):
        value, splits, pushes, clients = self._families()
        return [value, *splits, pushes, clients]


class _PolicyCollector:
    """Policy rules: requests breaking each rule, by violator (client id and client software,
    capped at the label cap: "other" past it), and requests refused by enforced rules (a
    series per enforced rule, from 0)."""

    VIOLATIONS = ("kproxy_policy_violations", "Requests breaking a policy rule, by rule and violator "
                  "(client_id, client software); dry run and enforced alike")
    REFUSED = ("kproxy_policy_refused", "Requests kproxy answered itself with an error because they "
               "break an enforced policy rule (never forwarded)")

    def __init__(self, policy):
        self.policy = policy

    def collect(self):
        family = CounterMetricFamily(*self.VIOLATIONS, labels=["rule", "client_id", "client_software"])
        for (rule, client_id, software), violator in list(self.policy.violators.items()):
            family.add_metric([rule, client_id, software], violator.count)
        yield family
        refused = CounterMetricFamily(*self.REFUSED, labels=["rule"])
        for rule, count in self.policy.refused.copy().items():
            refused.add_metric([rule], count)
        yield refused

    def describe(self):
        return [CounterMetricFamily(*self.VIOLATIONS), CounterMetricFamily(*self.REFUSED)]


class _InFlightCollector:
    """kproxy_requests_in_flight, read from the live connections at scrape time."""

    def __init__(self, read):
        self.read = read

    def collect(self):
        yield GaugeMetricFamily("kproxy_requests_in_flight",
                                "Requests sent upstream and not yet answered", value=self.read())

    def describe(self):
        return [GaugeMetricFamily("kproxy_requests_in_flight", "Requests sent upstream and not yet answered")]


# The per-API metrics the hot path keeps as plain numbers: (_ApiSeries attribute, name, help).
API_COUNTERS = (
    ("requests", "kproxy_requests_total", "Requests seen, by API"),
    ("request_bytes", "kproxy_request_bytes_total", "Request bytes, by API"),
    ("response_bytes", "kproxy_response_bytes_total", "Response bytes, by API"),
    ("throttled", "kproxy_throttled_responses_total", "Responses with throttle_time_ms > 0, by API"),
    ("opaque", "kproxy_opaque_requests_total",
     "Requests whose API key or version kproxy cannot decode (forwarded as is)"),
)
API_HISTOGRAMS = (
    ("latency", "kproxy_request_latency_seconds",
     "Request to response time, by API (empty long-poll Fetches excluded)"),
    ("long_poll", "kproxy_fetch_long_poll_seconds",
     "Fetch/ShareFetch answered with no records: time spent waiting"),
    ("request_size", "kproxy_request_size_bytes", "Request frame sizes, by API"),
    ("response_size", "kproxy_response_size_bytes", "Response frame sizes, by API"),
    ("throttle", "kproxy_throttle_time_seconds", "throttle_time_ms of every response that carries it, by API"),
)
# Bucket bounds -> their "le" label values, spelt as prometheus-client spells them.
_LE = {bounds: [floatToGoString(b) for b in bounds] + ["+Inf"]
       for bounds in (LATENCY_BUCKETS, SIZE_BUCKETS, THROTTLE_BUCKETS)}


def _histogram_sample(histogram: _Histogram) -> tuple[list, float]:
    """Cumulative (le, count) buckets and the sum of a histogram the event loop keeps writing.

    Scrapes render in a worker thread while the loop observes, without a lock: only the loop
    writes, and under the GIL reading an int or copying a list is atomic. Each bucket is read
    once (one copy) and the count is the +Inf bucket of those reads, so buckets are cumulative
    and agree with the count whatever the loop does meanwhile; the sum, read just after, may
    differ by an observation or two (the next scrape catches up: it only grows)."""
    counts = list(histogram.counts)
    total = histogram.sum
    cumulative, running = [], 0
    for le, count in zip(_LE[histogram.bounds], counts):
        running += count
        cumulative.append((le, running))
    return cumulative, total


class _ApiCollector:
    """The per-API counters and histograms, from each API's plain numbers at scrape time."""

    def __init__(self, series: dict):
        self.series = series          # label value -> _ApiSeries; the loop adds new APIs

    def collect(self):
        every = tuple(self.series.values())    # one C call under the GIL: no "changed size" race
        for attribute, name, help_text in API_COUNTERS:
            family = CounterMetricFamily(name, help_text, labels=["api"])
            for series in every:
                family.add_metric([series.name], getattr(series, attribute))
            yield family
        for attribute, name, help_text in API_HISTOGRAMS:
            family = HistogramMetricFamily(name, help_text, labels=["api"])
            for series in every:
                histogram = getattr(series, attribute)
                if histogram is not None:
                    family.add_metric([series.name], *_histogram_sample(histogram))
            yield family

    def describe(self):
        return [CounterMetricFamily(name, help_text) for _, name, help_text in API_COUNTERS] + \
            [HistogramMetricFamily(name, help_text) for _, name, help_text in API_HISTOGRAMS]


class _VersionCollector:
    """kproxy_request_versions_total, from the plain counts at scrape time."""

    NAME, HELP = "kproxy_request_versions_total", "Requests by API and version (which client versions are in use)"

    def __init__(self, versions: dict):
        self.versions = versions      # (api key, version or None) -> _VersionCount; the loop adds new ones

    def collect(self):
        family = CounterMetricFamily(self.NAME, self.HELP, labels=["api", "version"])
        for entry in tuple(self.versions.values()):     # one C call under the GIL
            family.add_metric([entry.api, entry.version], entry.count)
        yield family

    def describe(self):
        return [CounterMetricFamily(self.NAME, self.HELP)]


# Record batch totals: (metric name stem, help of records, bytes, batches) per direction.
BATCH_COUNTERS = (
    ("kproxy_produced", "kproxy_produce_batches_total", "Records in Produce requests (from batch headers)",
     "Record batch bytes in Produce requests", "Record batches in Produce requests, by compression codec"),
    ("kproxy_fetched", "kproxy_fetch_batches_total", "Records in Fetch responses (from batch headers)",
     "Record batch bytes in Fetch responses", "Record batches in Fetch responses, by compression codec"),
)


class _BatchCollector:
    """Records, batch bytes and batches by codec of Produce requests and Fetch responses."""

    def __init__(self, produced: _BatchTotals, fetched: _BatchTotals):
        self.totals = (produced, fetched)

    def collect(self):
        for totals, (stem, batches_name, records_help, bytes_help, batches_help) in zip(
                self.totals, BATCH_COUNTERS):
            yield CounterMetricFamily(f"{stem}_records_total", records_help, value=totals.records)
            yield CounterMetricFamily(f"{stem}_bytes_total", bytes_help, value=totals.bytes)
            family = CounterMetricFamily(batches_name, batches_help, labels=["compression"])
            for codec, count in totals.batches.copy().items():
                family.add_metric([codec], count)
            yield family

    def describe(self):
        return [CounterMetricFamily(name, help_text)
                for stem, batches_name, records_help, bytes_help, batches_help in BATCH_COUNTERS
                for name, help_text in ((f"{stem}_records_total", records_help),
                                        (f"{stem}_bytes_total", bytes_help), (batches_name, batches_help))]


# ---------------------------------------------------------------- several worker processes
#
# ``kproxy run --workers N``: each worker exports the metrics above for its own connections;
# the supervisor's /metrics is their merge, by this one rule:
# - counters, histograms (buckets, _sum, _count) and summaries: summed per label set;
# - gauges: summed per label set (they count things: connections, requests in flight, lag),
#   except ``MAX_MERGED_GAUGES``, which state a fact every worker sees alike: the highest wins,
#   and ``MIN_MERGED_GAUGES`` (a certificate's expiry): the lowest wins;
# - the process's own families (``PER_PROCESS_PREFIXES``: CPU, memory, file descriptors,
#   the interpreter's GC) and any family of unknown type: one series per worker, labelled
#   ``worker="<index>"``, never added up.
# A worker that dies and is restarted starts from zero; what it had counted at its last scrape
# is kept (``ExpositionMerger.retire``), so the summed counters never go backwards.

MAX_MERGED_GAUGES = frozenset({
    "kproxy_build_info",                    # 1 per version: the same in every worker
    "kproxy_capture_active",                # 1 while capturing: every worker captures, or none
    "kproxy_broker_listeners_unbound",      # every worker tries to bind the same ports
    "kproxy_group_members",                 # each worker sees a group's generation whole (or less)
    # What a client instance last pushed: the same numbers on whichever worker carried its pushes.
    "kproxy_client_metric", "kproxy_client_record_queue_seconds", "kproxy_client_request_latency_seconds",
    "kproxy_client_broker_latency_seconds",
})
# Gauges where the lowest value across workers is the fact to alert on: each worker reloads
# its certificate itself, and the one that still serves the oldest expires first.
MIN_MERGED_GAUGES = frozenset({
    "kproxy_tls_certificate_expiry_timestamp_seconds",
})
PER_PROCESS_PREFIXES = ("process_", "python_")
WORKER_LABEL = "worker"
_SUMMED_TYPES = frozenset({"counter", "histogram", "summary", "gaugehistogram"})


def _merge_kind(family) -> str:
    """'count' (summed, kept when a worker is replaced), 'sum', 'max', 'min' or 'per_worker' for
    one metric family (the rule above)."""
    if family.name.startswith(PER_PROCESS_PREFIXES):
        return "per_worker"
    if family.type in _SUMMED_TYPES:
        return "count"
    if family.type in ("gauge", "info", "stateset"):
        if family.name in MIN_MERGED_GAUGES:
            return "min"
        return "max" if family.name in MAX_MERGED_GAUGES or family.type != "gauge" else "sum"
    return "per_worker"


class ExpositionMerger:
    """Merges workers' text expositions into one, by the rule above (see ``merge``)."""

    def __init__(self):
        import threading
        self._lock = threading.Lock()         # merge runs off the event loop; retire on it
        # Counted by workers that have since been replaced: (family, sample, labels) -> value.
        self._retired: dict[tuple, float] = {}
        self._last: dict[tuple[int, int], list] = {}      # worker -> its last parsed families
        self._gone: set[tuple[int, int]] = set()          # retired workers: late answers are ignored

    @staticmethod
    def parse(text: str) -> list:
        from prometheus_client.parser import text_string_to_metric_families
        return list(text_string_to_metric_families(text))

    def retire(self, worker: tuple[int, int]) -> None:
        """``worker`` (index, pid) was replaced by a fresh process: keep what it counted, as of its
        last scrape; an answer of it that a scrape in flight still brings is ignored."""
        with self._lock:
            self._retire(worker)

    def _retire(self, worker: tuple[int, int]) -> None:
        self._gone.add(worker)
        for family in self._last.pop(worker, []):
            if _merge_kind(family) != "count":
                continue
            for s in family.samples:
                key = (family.name, s.name, tuple(sorted(s.labels.items())))
                self._retired[key] = self._retired.get(key, 0.0) + s.value

    def merge(self, expositions: dict[tuple[int, int], str]) -> bytes:
        """worker (index, pid) -> its exposition text (Prometheus text format) -> the merged text."""
        with self._lock:
            return self._merge(expositions)

    def _merge(self, expositions: dict[tuple[int, int], str]) -> bytes:
        from prometheus_client.core import Metric
        from prometheus_client.exposition import generate_latest
        families: dict[str, Metric] = {}
        values: dict[str, dict[tuple, list]] = {}    # family -> (sample, labels) -> [labels, value]
        for worker, text in sorted(expositions.items()):
            if worker in self._gone:
                continue
            parsed = self.parse(text)
            self._last[worker] = parsed
            for family in parsed:
                kind = _merge_kind(family)
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(family.name, family.documentation,
                                                            family.type, family.unit)
                    values[family.name] = {}
                series = values[family.name]
                for s in family.samples:
                    labels = dict(s.labels)
                    if kind == "per_worker":
                        labels[WORKER_LABEL] = str(worker[0])
                    key = (s.name, tuple(sorted(labels.items())))
                    entry = series.get(key)
                    if entry is None:
                        series[key] = [labels, s.value]
                    elif kind == "max":
                        entry[1] = max(entry[1], s.value)
                    elif kind == "min":
                        entry[1] = min(entry[1], s.value)
                    else:
                        entry[1] += s.value
        for (name, sample, labels), value in self._retired.items():
            series = values.get(name)
            if series is None:                   # no live worker exports it now: still counted
                continue
            key = (sample, labels)
            if key in series:
                series[key][1] += value
            else:
                series[key] = [dict(labels), value]
        for name, family in families.items():
            for (sample, _), (labels, value) in values[name].items():
                family.add_sample(sample, labels, value)

        class _Merged:
            def collect(self):
                return list(families.values())
        return generate_latest(_Merged())


class SupervisorMetrics:
    """The supervisor's own series, added to the merged exposition of its workers."""

    def __init__(self, workers: int):
        self.registry = r = CollectorRegistry(auto_describe=True)
        Gauge("kproxy_workers", "Worker processes configured (kproxy run --workers)",
              registry=r).set(workers)
        self.workers_up = Gauge("kproxy_workers_up", "Worker processes running and answering now",
                                registry=r)
        self.restarts = Counter("kproxy_worker_restarts_total",
                                "Worker processes that died unexpectedly and were started again",
                                registry=r)
        self.scrape_failures = Counter(
            "kproxy_worker_scrape_failures_total",
            "Scrapes in which a worker did not answer (its last exposition was used)", registry=r)
