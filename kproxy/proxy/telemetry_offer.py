"""kproxy offering client telemetry (KIP-714) itself, for brokers that do not.

With the ``telemetry_offer`` table enabled and a broker whose ApiVersions answers lack
GetTelemetrySubscriptions (71) and PushTelemetry (72), kproxy adds both (v0) to the
ApiVersions answers it relays and answers those requests itself (one of the
``local_requests.LocalAnswers``): never forwarded, so the broker never sees an API it did
not announce. Clients then push
to kproxy, whose harvest (``observers.telemetry``, on with ``client_telemetry``) exports
what they push. A broker that offers them itself keeps them: kproxy only relays.

The subscription: the configured metric name prefixes and push interval, for clients whose
"software/version" (ApiVersions v3+) matches one of ``clients`` (glob patterns); others get
an empty subscription (they push nothing). librdkafka 2.5.0-2.5.2 assert-crash on a
subscription naming none of their metrics: they are not offered telemetry at all.
"""

from __future__ import annotations

import re
import uuid
from fnmatch import fnmatchcase

from ..protocol import Response, Struct, Uuid, encode_response, new_body
from ..protocol.client_software import ClientSoftware, software_named
from ..protocol.client_telemetry import GET_TELEMETRY_SUBSCRIPTIONS_KEY, PUSH_TELEMETRY_KEY, TELEMETRY_KEYS
from ..protocol.events import RequestReceived, ResponseReceived
from ..protocol.records import CODEC_NAMES
from ..protocol.schema import UNSUPPORTED_VERSION      # also the answer to a denied client that asks anyway
from ..protocol.api_keys import ApiKey
from ..telemetry_settings import TelemetryOffer    # its settings, parsed by the config

_API_VERSIONS = int(ApiKey.API_VERSIONS)   # a plain int: compared per event
# What a client may send per push: Kafka's default telemetry.max.bytes.
TELEMETRY_MAX_BYTES = 1024 * 1024
# Codecs kproxy inflates, most compact first (the client takes the first it supports).
ACCEPTED_CODECS = tuple(CODEC_NAMES.index(name) for name in ("zstd", "lz4", "gzip", "snappy"))
# librdkafka versions that crash (an assertion) on a subscription naming none of their metrics.
DENIED_LIBRDKAFKA = ((2, 5, 0), (2, 5, 2))
_RDKAFKA_VERSION = re.compile(r"(?:^|rdkafka-)(\d+)\.(\d+)\.(\d+)")


def denied(software: ClientSoftware | None) -> bool:
    """librdkafka 2.5.0-2.5.2, by name or as the engine of a wrapper (``2.5.1-rdkafka-2.5.1``)."""
    if software is None:
        return False
    if software.name != "librdkafka" and "rdkafka-" not in software.version:
        return False
    match = _RDKAFKA_VERSION.search(software.version)
    if match is None:
        return False
    version = tuple(int(part) for part in match.groups())
    return DENIED_LIBRDKAFKA[0] <= version <= DENIED_LIBRDKAFKA[1]


def software_of(request: RequestReceived) -> ClientSoftware | None:
    decoded = request.request
    if decoded is None or decoded.is_opaque or request.api_version < 3:
        return None
    name = getattr(decoded.body, "client_software_name", None)
    return ClientSoftware(name, getattr(decoded.body, "client_software_version", "") or "") if name else None


class TelemetryAnswers:
    """The offer at work: the ApiVersions additions, the local answers (``LocalAnswers``),
    and (as an observer) each connection's client software, which picks the subscription."""

    def __init__(self, offer: TelemetryOffer):
        self.offer = offer
        self.broker_offers: bool | None = None    # None until an ApiVersions answer said
        self._software: dict[int, ClientSoftware] = {}

    # ------------------------------------------------------------ ApiVersions

    def add_to(self, event: ResponseReceived, response: Response) -> bool:
        """Add 71/72 v0 to a (decoded) ApiVersions answer the broker gave without them;
        True if changed. Denied clients are not offered them."""
        body = response.body
        if response.is_opaque or getattr(body, "error_code", 1) or not hasattr(body, "api_keys"):
            return False
        keys = {entry.api_key for entry in body.api_keys}
        self.broker_offers = TELEMETRY_KEYS <= keys
        if self.broker_offers or denied(software_of(event.request_event)):
            return False
        for api_key in sorted(TELEMETRY_KEYS - keys):
            body.api_keys.append(Struct(api_key=api_key, min_version=0, max_version=0))
        return True

    # ------------------------------------------------------------ LocalAnswers

    def answers(self, api_key: int) -> bool:
        return api_key in TELEMETRY_KEYS and self.broker_offers is False

    def takes(self, info, request: RequestReceived) -> bool:
        return True                               # every request of the APIs it answers

    def answer(self, info, request: RequestReceived) -> bytes:
        software = self._software.get(info.id) if info is not None else None
        api_key, version = request.api_key, request.api_version
        decoded = request.request
        if api_key == GET_TELEMETRY_SUBSCRIPTIONS_KEY:
            body = new_body("response", api_key, version)
            if denied(software):
                body.error_code = UNSUPPORTED_VERSION
            else:
                asked = decoded.body.client_instance_id if decoded is not None and not decoded.is_opaque else None
                body.client_instance_id = asked if asked and any(asked) else Uuid(uuid.uuid4().bytes)
                body.subscription_id = self.offer.subscription_id
                body.accepted_compression_types = list(ACCEPTED_CODECS)
                body.push_interval_ms = self.offer.push_interval_ms
                body.telemetry_max_bytes = TELEMETRY_MAX_BYTES
                body.delta_temporality = False        # cumulative sums: the latest value is the total
                body.requested_metrics = list(self.offer.metrics) if self._matches(software) else []
        else:
            body = new_body("response", PUSH_TELEMETRY_KEY, version)
        return encode_response(Response(request.correlation_id, body), api_key, version)

    def _matches(self, software: ClientSoftware | None) -> bool:
        text = f"{software.name}/{software.version}" if software is not None else "unknown/unknown"
        return any(fnmatchcase(text, pattern) for pattern in self.offer.clients)

    # ------------------------------------------------------------ observer

    def __call__(self, info, events) -> None:
        for event in events:
            if event.__class__ is ResponseReceived and event.request_event.api_key == _API_VERSIONS:
                named = software_named(event)
                if named is not None:
                    self._software[info.id] = named

    def connection_closed(self, info, reason=None, in_flight=None) -> None:
        self._software.pop(info.id, None)
