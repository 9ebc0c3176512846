"""The Failovers observer: what each leadership change cost each client, live.

Fed after the bytes are forwarded, on the event loop. It looks only at answers of
Produce, Fetch and Metadata (and at the ApiVersions and SASL pairs that say who a
connection is); everything else passes with one set lookup. A Produce or Fetch
answer is read from its skimmed body (``protocol.skim`` keeps each partition's
index, error code and KIP-951 leader hint), which the metrics decode anyway, so
following failovers costs a walk over the answer's partitions; an answer with no
error, only its tally (``protocol.tally``), which the metrics read anyway.

The rules are ``protocol.failover``'s (shared with ``kproxy analyze``): a client is
its client id, software, principal and host, all its connections together. Each
failover ended is kept for the live page (the last ``RECENT_FAILOVERS``), logged
at INFO on ``kproxy.failover``, and handed to ``on_failover`` (the recovery-time
histogram, ``kproxy_failover_recovery_seconds``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Callable

from ..protocol.client_software import software_named
from ..protocol.events import ResponseReceived
from ..protocol.failover import (FETCH_KEY, METADATA_KEY, PRODUCE_KEY, ClientKey, Failover,
                                 FailoverTracker, LeaderBook, any_error, partition_answers)
from ..protocol.api_keys import ApiKey
from ..protocol.sasl import SaslPrincipal
from .contract import Interest

log = logging.getLogger("kproxy.failover")

API_VERSIONS = int(ApiKey.API_VERSIONS)       # a plain int: compared per event
WHO_APIS = frozenset({API_VERSIONS, int(ApiKey.SASL_HANDSHAKE), int(ApiKey.SASL_AUTHENTICATE)})
LOOKED_AT = frozenset({PRODUCE_KEY, FETCH_KEY, METADATA_KEY}) | WHO_APIS
_API_NAMES = {PRODUCE_KEY: "Produce", FETCH_KEY: "Fetch"}
# Failovers and leader changes the live page shows (newest first): a rolling restart of a
# large cluster moves thousands of leaders; the page shows the latest, the metric counts all.
RECENT_FAILOVERS = 200
RECENT_LEADER_CHANGES = 200
# Topic ids remembered from Metadata answers, to name topics in Produce/Fetch v13+ answers.
MAX_TOPIC_IDS = 100_000


class _Conn:
    __slots__ = ("client_id", "software", "principal", "sasl", "key")

    def __init__(self, principal: str | None):
        self.client_id: str | None = None
        self.software: tuple[str | None, str | None] = (None, None)
        self.principal = principal
        self.sasl: SaslPrincipal | None = None
        self.key: ClientKey | None = None          # made again when who it is changes


class Failovers:
    """The failover observer; ``recent()`` for the live page."""

    def __init__(self, on_failover: Callable[[Failover], None] | None = None):
        self.tracker = FailoverTracker()
        self.leaders = LeaderBook()
        self.on_failover = on_failover
        self.ended = 0
        self._recent: deque = deque(maxlen=RECENT_FAILOVERS)
        self._changes: deque = deque(maxlen=RECENT_LEADER_CHANGES)
        self._conns: dict[int, _Conn] = {}
        self._names: dict[str, str] = {}
        self._wall_offset = time.time() - time.monotonic()
        self.interest = Interest(frozenset(map(int, LOOKED_AT)))

    def __call__(self, info, events) -> None:
        for event in events:
            if event.__class__ is not ResponseReceived:
                continue
            key = event.request_event.api_key
            if key in LOOKED_AT:
                self._answer(info, key, event)

    def connection_closed(self, info, reason: str | None = None, in_flight: int | None = None) -> None:
        self._conns.pop(info.id, None)

    # ------------------------------------------------------------ per answer

    def _conn(self, info) -> _Conn:
        conn = self._conns.get(info.id)
        if conn is None:
            conn = self._conns[info.id] = _Conn(getattr(info, "principal", None))
        return conn

    def _answer(self, info, key: int, event: ResponseReceived) -> None:
        conn = self._conn(info)
        request = event.request_event
        if key in WHO_APIS:
            self._learn(conn, key, event)
            return
        if conn.client_id is None:             # read once: a connection keeps its client id
            decoded = request.request if key == METADATA_KEY else (request.tally or request.partial)
            if decoded is not None and decoded.client_id is not None:
                conn.client_id, conn.key = decoded.client_id, None
        client = conn.key or self._key(conn, info)
        offset = self._wall_offset
        if key == METADATA_KEY:
            response = event.response
            if response is None or response.is_opaque:
                return
            if len(self._names) > MAX_TOPIC_IDS:
                self._names.clear()
            answers = partition_answers(key, response.body, self._names)
            self._changes.extend(self.leaders.learn(answers, event.time + offset, "metadata"))
            self.tracker.metadata(client, event.time + offset)
            return
        tally = event.tally                      # Produce, Fetch: error codes read from the frame
        if tally is not None and not tally.errors and not self.tracker.failing(client):
            return                               # the common case: nothing failed, nothing pending
        response = event.partial
        if response is None or response.is_opaque:
            return
        if not self.tracker.failing(client) and not any_error(key, response.body):
            return
        answers = partition_answers(key, response.body, self._names)
        if not answers:
            return
        self._changes.extend(self.leaders.learn((a for a in answers if a.leader_id is not None),
                                                event.time + offset, "hint"))
        for failover in self.tracker.answer(client, _API_NAMES[key], info.node_id, request.time + offset,
                                            event.time + offset, answers):
            self._ended(failover)

    def _key(self, conn: _Conn, info) -> ClientKey:
        conn.key = ClientKey(conn.client_id, conn.software[0], conn.software[1], conn.principal,
                             info.client[0])
        return conn.key

    def _learn(self, conn: _Conn, key: int, event: ResponseReceived) -> None:
        if key == API_VERSIONS:
            software = software_named(event)
            if software is not None:
                conn.software, conn.key = (software.name, software.version), None
            return
        request, answer = event.request_event.request, event.response
        if request is None or answer is None or request.is_opaque or answer.is_opaque:
            return
        if conn.sasl is None:
            conn.sasl = SaslPrincipal()
        if conn.sasl.observe(key, request.body, answer.body):
            conn.principal, conn.key = conn.sasl.principal, None

    def _ended(self, failover: Failover) -> None:
        self.ended += 1
        self._recent.append(failover)
        log.info("failover: client %r (%s %s) %s %s-%d: leader %s -> %s, recovered in %.3f s "
                 "after %d failed requests (%s), by %s",
                 failover.client.client_id, failover.client.software_name or "unknown software",
                 failover.client.software_version or "", failover.api, failover.topic,
                 failover.partition, failover.old_leader, failover.new_leader,
                 failover.recovery_seconds, failover.failed_requests,
                 ", ".join(f"{name} x{n}" for name, n in failover.errors), failover.recovered_by)
        if self.on_failover is not None:
            self.on_failover(failover)

    # ------------------------------------------------------------ the live page

    def recent(self) -> dict:
        """The latest failovers and leader changes, newest first (JSON-able)."""
        return {"failovers": [f.as_dict() for f in reversed(self._recent)],
                "leader_changes": [c._asdict() for c in reversed(self._changes)],
                "ended": self.ended, "failing_now": self.tracker.pending}
