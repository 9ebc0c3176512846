"""Names for topic ids no relayed answer named: kproxy asks its broker.

Kafka 4 clients name topics by id in Fetch (v13+) and Produce (v13); only a Metadata
answer maps an id to its name. A sidecar sees its own broker's traffic alone, so it may
relay a client's Fetch without ever relaying the Metadata answer that named its topics,
and its observers would then know the topic only by its id.

``TopicNameLookup`` is an observer (fed after the bytes are forwarded: the client never
waits for it). It learns names from the Metadata answers it sees, and for an id it has
no name for it asks a broker itself: a Metadata v12 request by topic id, on a connection
of kproxy's own (``OwnRequests.ask``). Each name learned that way goes to every
observer's ``topic_named(topic_id, name)`` hook. Pairs observed before the answer keep
the id (capture rows still queued for the writer thread take the name).

Bounded: one question in flight, a question at most every ``QUESTION_INTERVAL_S``
naming at most ``IDS_PER_QUESTION`` ids, at most ``WAITING_IDS`` ids waiting, names kept
in an LRU of ``KNOWN_IDS``; an id the broker does not know (or a question that failed)
is not asked about again for ``RETRY_AFTER_S``. A broker that wants SASL before any
request refuses the question: ids then stay ids.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable

from ..protocol import OpaqueBody, Struct, new_body
from ..protocol.api_keys import ApiKey
from ..protocol.events import RequestReceived, ResponseReceived
from ..observers.contract import Interest
from .log_budget import LogBudget
from .own_requests import _ASK_FAILURES, OwnRequests, _failure
from .relay import notify_hook

log = logging.getLogger("kproxy.server")

METADATA_KEY, FETCH_KEY, PRODUCE_KEY = map(int, (ApiKey.METADATA, ApiKey.FETCH, ApiKey.PRODUCE))
# Fetch v13+ and Produce v13+ name topics by id (KIP-516; Produce: KIP-1140).
BY_TOPIC_ID_VERSION = 13
# Metadata v12 is the first that takes topic ids in the request (Kafka 3.1+, KRaft brokers).
LOOKUP_METADATA_VERSION = 12
# One question a second naming up to 100 ids: at most 100 ids asked per second, whatever
# clients send (a cluster rarely holds more topics than a client reads at once).
QUESTION_INTERVAL_S = 1.0
IDS_PER_QUESTION = 100
# Ids waiting for the next question; more are dropped (seen again, they are asked later).
WAITING_IDS = 1_000
# id -> name kept, least recently used dropped first (Kafka ids are 16 bytes, names <= 249).
KNOWN_IDS = 10_000
# An id the broker did not name (deleted topic, no permission, failed question) is asked
# about again only after this; kept for at most KNOWN_IDS ids.
RETRY_AFTER_S = 30.0
# A failed question is logged once per interval (a SASL-only broker refuses every one).
FAILURE_LOG_INTERVAL_S = 300.0


class TopicNameLookup:
    """The observer described in the module docstring. ``observers``: who hears
    ``topic_named`` (the proxy's list; it may include this one)."""

    def __init__(self, own_requests: OwnRequests, observers: list):
        self.own_requests = own_requests
        self.observers = observers
        self.names: OrderedDict[bytes, str] = OrderedDict()      # topic id -> name (LRU)
        self._retry_at: OrderedDict[bytes, float] = OrderedDict()  # id not named -> when to ask again
        self._waiting: dict[bytes, None] = {}                   # ordered set
        self._asking: asyncio.Task | None = None
        self._next_question = float("-inf")
        self._failure_log = LogBudget(FAILURE_LOG_INTERVAL_S, 1)
        self.questions = 0               # questions asked (tests and debugging)
        self.interest = Interest(frozenset({FETCH_KEY, PRODUCE_KEY, METADATA_KEY}))

    # ------------------------------------------------------------ observer (event loop)

    def __call__(self, info, events: Iterable) -> None:
        for event in events:
            cls = event.__class__
            if cls is RequestReceived:
                if event.api_version >= BY_TOPIC_ID_VERSION and event.api_key in (FETCH_KEY, PRODUCE_KEY) \
                        and not event.streamed:
                    self._request(event)
            elif cls is ResponseReceived and event.request_event.api_key == METADATA_KEY \
                    and not event.streamed:
                response = event.partial
                if response is not None and response.body.__class__ is not OpaqueBody:
                    for topic in response.body.topics or ():
                        if topic.name and any(topic.__dict__.get("topic_id") or b""):
                            self._learn(topic.topic_id, topic.name)
        if self._waiting and (self._asking is None or self._asking.done()):
            self._asking = asyncio.get_running_loop().create_task(self._ask_waiting())

    def _request(self, event: RequestReceived) -> None:
        tally = event.tally                      # read from the frame (``protocol.tally``)
        if tally is not None:
            ids = [key for key, _ in tally.topics] if event.api_key == FETCH_KEY else \
                [topic.topic_id for topic in tally.topics]
        else:
            request = event.partial
            if request is None or request.body.__class__ is OpaqueBody:
                return
            body = request.body
            ids = [topic.topic_id for topic in (body.topics if event.api_key == FETCH_KEY else body.topic_data) or ()]
        for topic_id in ids:
            if topic_id in self.names:
                self.names.move_to_end(topic_id)
            elif topic_id not in self._waiting and any(topic_id) and self._may_ask(topic_id) \
                    and len(self._waiting) < WAITING_IDS:
                self._waiting[topic_id] = None

    def _may_ask(self, topic_id: bytes) -> bool:
        retry_at = self._retry_at.get(topic_id)
        if retry_at is None:
            return True
        if time.monotonic() < retry_at:
            return False
        del self._retry_at[topic_id]
        return True

    def _learn(self, topic_id: bytes, name: str) -> bool:
        """Remember a name; True when it is news."""
        known = self.names.get(topic_id)
        self.names[topic_id] = name
        self.names.move_to_end(topic_id)
        if len(self.names) > KNOWN_IDS:
            self.names.popitem(last=False)
        self._retry_at.pop(topic_id, None)
        self._waiting.pop(topic_id, None)
        return known != name

    def _not_named(self, topic_id: bytes) -> None:
        self._retry_at[topic_id] = time.monotonic() + RETRY_AFTER_S
        self._retry_at.move_to_end(topic_id)
        if len(self._retry_at) > KNOWN_IDS:
            self._retry_at.popitem(last=False)

    # ------------------------------------------------------------ asking

    async def _ask_waiting(self) -> None:
        """Ask until nothing waits, one question at a time and one per interval."""
        while self._waiting:
            delay = self._next_question - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            ids = list(self._waiting)[:IDS_PER_QUESTION]
            for topic_id in ids:
                del self._waiting[topic_id]
            named = await self._ask(ids)
            for topic_id in ids:
                name = named.get(topic_id)
                if name is None:
                    self._not_named(topic_id)
                elif self._learn(topic_id, name):
                    notify_hook(self.observers, "topic_named", topic_id, name)

    async def _ask(self, ids: list[bytes]) -> dict[bytes, str]:
        """The names a broker gives for ``ids`` (those it knows); {} when none answers."""
        version = LOOKUP_METADATA_VERSION
        body = new_body("request", METADATA_KEY, version, allow_auto_topic_creation=False,
                        topics=[Struct(topic_id=topic_id, name=None) for topic_id in ids])
        errors = []
        self.questions += 1
        self._next_question = time.monotonic() + QUESTION_INTERVAL_S
        for host, port in self.own_requests.candidates():
            try:
                response = await asyncio.wait_for(
                    self.own_requests.ask(host, port, METADATA_KEY, version, body),
                    self.own_requests.config.connect_timeout)
            except _ASK_FAILURES as exc:
                errors.append(_failure(host, port, exc))
                continue
            return {t.topic_id: t.name for t in response.body.topics or ()
                    if t.error_code == 0 and t.name}
        unlogged = self._failure_log.admit("lookup")
        if unlogged is not None:
            log.warning("cannot ask the cluster for the names of topic ids clients used (%s): "
                        "they are shown as ids (not logged again within %gs%s)",
                        "; ".join(errors) or "no upstream address known", FAILURE_LOG_INTERVAL_S,
                        f"; {unlogged} earlier failures were not logged" if unlogged else "")
        return {}

    async def stop(self) -> None:
        """Cancel a question under way (the proxy is stopping)."""
        task, self._asking = self._asking, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
