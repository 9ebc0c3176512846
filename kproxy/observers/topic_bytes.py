"""A per-topic byte counter whose series moves from a topic's id to its name once known.

Kafka 4 clients name topics by id (Fetch v13+, Produce v13). Until kproxy learns an id's
name (a Metadata answer it relays, or its own question: ``proxy.topic_names``), bytes are
counted under the id; when the name comes, what was counted under the id is added to
the name's series and the id's series is removed (its label slot freed), so one topic is
one series, as capture rows and the live page already show it. The name's series then
rises by that much at once: a ``rate()`` over that moment counts it in one step.

The ids counted so are those the label cap let in (each holds a slot of it); bytes of an
id past the cap go to ``other`` and stay there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:                     # the counters themselves are defined in metrics.py
    from prometheus_client import Counter

OVERFLOW_LABEL = "other"              # what a BoundedLabel gives past its cap


class TopicBytes:
    """``counter`` (one ``topic`` label) fed by name, or by id until ``named``; ``label`` is
    the metrics' BoundedLabel (its ``forget`` frees an id's slot)."""

    def __init__(self, counter: Counter, label):
        self.counter = counter
        self.label = label
        self._by_id: dict = {}                   # topic id -> [its label, bytes counted under it]

    def add(self, name: str, nbytes: int) -> None:
        self.counter.labels(self.label(name)).inc(nbytes)

    def add_by_id(self, topic_id, nbytes: int) -> None:
        """Bytes of a topic known only by its id so far."""
        entry = self._by_id.get(topic_id)
        if entry is None:
            label = self.label(str(topic_id))
            if label == OVERFLOW_LABEL:
                self.counter.labels(label).inc(nbytes)
                return
            entry = self._by_id[topic_id] = [label, 0]
        entry[1] += nbytes
        self.counter.labels(entry[0]).inc(nbytes)

    def named(self, topic_id, name: str) -> None:
        """The id's name is known: its bytes move to the name's series."""
        entry = self._by_id.pop(topic_id, None)
        if entry is None:
            return
        label, nbytes = entry
        self.counter.remove(label)
        self.label.forget(label)
        self.counter.labels(self.label(name)).inc(nbytes)
