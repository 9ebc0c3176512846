"""A per-topic byte counter moves an id's bytes to the name once known (``observers.topic_bytes``),
within the metrics' label cap."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from kproxy.observers.metrics import BoundedLabel
from kproxy.observers.topic_bytes import TopicBytes
from kproxy.protocol import Uuid

CAP = 2


def values(registry: CollectorRegistry) -> dict[str, float]:
    return {s.labels["topic"]: s.value for f in registry.collect() for s in f.samples
            if s.name == "t_bytes_total"}


def test_an_ids_bytes_move_to_its_name_and_free_the_ids_label_slot():
    registry = CollectorRegistry()
    counts = TopicBytes(Counter("t_bytes", "", ["topic"], registry=registry), BoundedLabel(CAP))
    first, second = Uuid(b"\x01" * 16), Uuid(b"\x02" * 16)
    counts.add_by_id(first, 10)
    counts.add_by_id(first, 5)
    counts.add_by_id(second, 7)                  # the cap is full: both ids hold a slot
    counts.add("else", 1)
    assert values(registry) == {str(first): 15, str(second): 7, "other": 1}
    counts.named(first, "orders")                # the id's slot goes to the name
    assert values(registry) == {"orders": 15, str(second): 7, "other": 1}
    counts.named(first, "orders")                # told twice: nothing more moves
    counts.add("orders", 3)
    assert values(registry) == {"orders": 18, str(second): 7, "other": 1}


def test_an_id_past_the_cap_is_counted_as_other_and_stays_there():
    registry = CollectorRegistry()
    counts = TopicBytes(Counter("t_bytes", "", ["topic"], registry=registry), BoundedLabel(1))
    counts.add("a", 1)
    late = Uuid(b"\x03" * 16)
    counts.add_by_id(late, 4)
    counts.named(late, "b")
    assert values(registry) == {"a": 1, "other": 4}
