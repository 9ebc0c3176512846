"""What the answers kproxy holds become: broker addresses rewritten to kproxy's (Metadata,
FindCoordinator, DescribeCluster, KIP-951 endpoints, the KRaft RPCs), nodes kproxy does not
serve withheld, and ApiVersions capped to what kproxy decodes (with the client telemetry
kproxy offers added). Which nodes are served at which addresses is the directory's.
"""

from __future__ import annotations

import functools
from typing import Callable

from ..config import Config
from ..protocol import DecodeError, decode_response, encode_response
from ..protocol.api_keys import ApiKey
from ..protocol.events import ResponseReceived
from . import telemetry_offer
from .directory import BrokerDirectory
from .relay import RewriteFailed
from .rewrite import (ENDPOINTS_ONLY_KEYS, cap_api_versions, carries_addresses, node_addresses,
                      rewrite_addresses, withhold_nodes)

CORRELATION_ID_BYTES = 4          # a response frame's first field (ApiVersions' header is always v0)
CONTROLLER_ENDPOINT_TYPE = 2      # DescribeCluster's EndpointType for "list the controllers"
# Responses whose addresses are KRaft controller (quorum) listeners, not brokers': Vote,
# BeginQuorumEpoch, EndQuorumEpoch, DescribeQuorum, FetchSnapshot, UpdateRaftVoter. In
# combined mode a controller shares its node id with a broker, so learning from them would
# re-point that broker's listener at the controller port. They are rewritten, not learnt.
CONTROLLER_ADDRESS_KEYS = frozenset({ApiKey.VOTE, ApiKey.BEGIN_QUORUM_EPOCH, ApiKey.END_QUORUM_EPOCH,
                                     ApiKey.DESCRIBE_QUORUM, ApiKey.FETCH_SNAPSHOT, ApiKey.UPDATE_RAFT_VOTER})
# (API, version) pairs whose hold decision is remembered: a client may send any of 2^32,
# so the table is bounded; the pairs in use are a few dozen.
HOLD_ANSWERS_CACHED = 4096
# Capped ApiVersions answers remembered, by request version and bytes after the correlation
# id: a broker gives every client the same answer, and decoding its ~80 entries and
# encoding them again took ~1.3 ms of the event loop each (10 clients pipelining
# ApiVersions without reading made every other client wait seconds). A broker per
# version per distinct answer: a few dozen at most in a cluster; bounded all the same.
API_VERSIONS_ANSWERS_CACHED = 256
_UNCACHED = object()


class AnswerRewriter:
    """``hold`` and ``transform`` for every connection's tracker (``Connection``)."""

    def __init__(self, config: Config, directory: BrokerDirectory,
                 offer: telemetry_offer.TelemetryAnswers | None,
                 brokers_listed: Callable[[set[int]], None]):
        """``offer``: the client telemetry kproxy offers (None: off); ``brokers_listed(node
        ids)``: told what a Metadata answer listed (every broker there is)."""
        self.config = config
        self.directory = directory
        self.telemetry_offer = offer
        self._brokers_listed = brokers_listed
        # Asked for every answer. Clients use a few (API, version) pairs, but may send any.
        self.hold = functools.lru_cache(HOLD_ANSWERS_CACHED)(self._holds)
        # (version, answer after its correlation id) -> its rewritten rest, or None: unchanged
        self._api_versions_answers: dict[tuple[int, bytes], bytes | None] = {}

    def _holds(self, api_key: int, api_version: int) -> bool:
        """Whether answers to this (API, version) are held for ``transform`` (``hold``, cached)."""
        return carries_addresses(api_key, api_version) or (
            api_key == ApiKey.API_VERSIONS and (self.config.cap_api_versions or self.telemetry_offer is not None))

    def transform(self, event: ResponseReceived) -> bytes | None:
        """Rewrite addresses (and cap ApiVersions) in a held response; None keeps it as is."""
        api_key, version = event.api_key, event.api_version
        if api_key == ApiKey.API_VERSIONS and (self.config.cap_api_versions or self.telemetry_offer is not None):
            return self._capped_api_versions(event)
        return self._rewritten(event)

    def _capped_api_versions(self, event: ResponseReceived) -> bytes | None:
        """``transform`` for ApiVersions: the same answer is capped once, then remembered.

        Capped in a decode of its own: observers see every copy as the broker sent it
        (``event.frame``), the first one included."""
        frame = event.frame
        version = event.api_version
        offer = self.telemetry_offer
        # With the telemetry offer, whether 71/72 are added depends on the client too.
        key = (version, bytes(frame[CORRELATION_ID_BYTES:]),
               None if offer is None else telemetry_offer.denied(telemetry_offer.software_of(event.request_event)))
        rest = self._api_versions_answers.get(key, _UNCACHED)
        if rest is _UNCACHED:
            rest = None
            try:
                response = decode_response(frame, ApiKey.API_VERSIONS, version)
            except DecodeError:
                response = None              # not capped, as a failed decode never was
            changed = response is not None and self.config.cap_api_versions and cap_api_versions(response)
            if response is not None and offer is not None:
                changed = offer.add_to(event, response) or changed
            if changed:
                try:
                    rest = bytes(encode_response(response, ApiKey.API_VERSIONS, version)[CORRELATION_ID_BYTES:])
                except (ValueError, TypeError, OverflowError) as exc:
                    raise RewriteFailed(f"re-encoding ApiVersions v{version}: {exc}") from None
            if len(self._api_versions_answers) >= API_VERSIONS_ANSWERS_CACHED:
                self._api_versions_answers.clear()
            self._api_versions_answers[key] = rest
        return None if rest is None else bytes(frame[:CORRELATION_ID_BYTES]) + rest

    def _rewritten(self, event: ResponseReceived) -> bytes | None:
        api_key, version = event.api_key, event.api_version
        directory = self.directory
        if api_key in ENDPOINTS_ONLY_KEYS and not directory.withheld:
            # With every listener bound only the endpoints could change (withholding also
            # touches partitions' leader hints): none, nothing to do, no whole decode. A Produce
            # answer with a tally has no tagged fields, so no endpoints (``protocol.tally``).
            if event.tally is not None:
                return None
            partial = event.partial
            if partial is not None and not partial.is_opaque and not partial.body.node_endpoints:
                return None
        response = event.response
        if response is None or response.is_opaque:
            if carries_addresses(api_key, version):
                raise RewriteFailed(f"{event.request_event.api_name} v{version}: "
                                    f"{event.decode_error or 'unknown version'}")
            return None
        changed = False
        if api_key == ApiKey.METADATA:
            self._brokers_listed({n for n, _, _ in node_addresses(api_key, version, response.body)})
        controllers = api_key in CONTROLLER_ADDRESS_KEYS or (
            api_key == ApiKey.DESCRIBE_CLUSTER
            and getattr(response.body, "endpoint_type", None) == CONTROLLER_ENDPOINT_TYPE)
        mapper = directory.advertise_controller if controllers else directory.advertise
        directory.begin_answer()
        changed = rewrite_addresses(api_key, version, response, mapper) or changed
        # Unbound listeners are brokers'; nodes the directory refused are either.
        unserved = directory.left_out(controllers)
        if unserved:
            changed = withhold_nodes(api_key, version, response, unserved) or changed
        if not changed:
            return None
        try:
            return encode_response(response, api_key, version)
        except (ValueError, TypeError, OverflowError) as exc:
            raise RewriteFailed(f"re-encoding {event.request_event.api_name} v{version}: {exc}") from None
