"""Which observers a batch of events goes to: those whose ``Interest`` (observers.contract)
takes its API, and those that declare none (they take everything).

Found once per API key and kept until an interest changes (``Interest.generation``): per
batch, a key and a dict lookup instead of a call to each observer that would look at the
events and ignore them (a capture that is off, the live view with no page open, the audit
trail for APIs it does not record).
"""

from __future__ import annotations

from ..observers.contract import Interest, Observer
from ..protocol.events import RequestReceived, ResponseReceived

# Routes kept per listener: Kafka defines under 100 API keys; a client may send any of
# 65,536, whose routes are then found again each time rather than kept without bound.
MAX_ROUTED_KEYS = 128


class EventRoutes:
    """The event-taking observers of one listener (``takes_events`` not False), routed by API."""

    def __init__(self, observers: list[Observer]):
        self.given = list(observers)         # as given: a listener's list may grow before use
        self.observers = [o for o in observers if getattr(o, "takes_events", True)]
        self._interests = [getattr(o, "interest", None) for o in self.observers]
        self._by_key: dict[int | None, list[Observer]] = {}
        self._generation = Interest.generation

    def to(self, events: list) -> list[Observer]:
        """The observers that take ``events`` (a non-empty batch, in order)."""
        if len(events) == 1:                 # nearly always: one request, or one answer
            event = events[0]
            cls = event.__class__
            key = (event.request_event.api_key if cls is ResponseReceived
                   else event.api_key if cls is RequestReceived else None)
        else:
            key = _api_key(events[0])
            for event in events:
                if _api_key(event) != key:
                    key = None               # a mix: every observer, each ignores what it wants not
                    break
        if self._generation != Interest.generation:
            self._by_key.clear()
            self._generation = Interest.generation
        targets = self._by_key.get(key)
        if targets is None:
            targets = [observer for observer, interest in zip(self.observers, self._interests)
                       if interest is None or interest.wants(key)]
            if len(self._by_key) < MAX_ROUTED_KEYS:
                self._by_key[key] = targets
        return targets


def _api_key(event) -> int | None:
    cls = event.__class__
    if cls is ResponseReceived:
        return event.request_event.api_key
    if cls is RequestReceived:
        return event.api_key
    return None                              # SASL tokens, malformed frames
