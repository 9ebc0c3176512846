"""How hard kproxy asks its broker for topic names (``proxy.topic_names``), with a stand-in
for the broker's answers: one question in flight, a bounded number of ids per question and
a pause between questions, ids the broker does not name not asked again at once, names
handed to the observers' ``topic_named`` hook once."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from kproxy.protocol import Request, Struct, Uuid, encode_request, new_body
from kproxy.protocol.events import RequestReceived
from kproxy.proxy import topic_names
from kproxy.proxy.topic_names import IDS_PER_QUESTION, TopicNameLookup

QUESTION_INTERVAL_S = 0.1            # shortened for the test (the default is 1 s)
SLACK_S = 0.02             # without the pause, questions come 0.01 s apart (the stand-in's answer time)


def fetch_by_id(ids: list[Uuid]) -> RequestReceived:
    partition = Struct(partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                       log_start_offset=-1, partition_max_bytes=1 << 20)
    body = new_body("request", 1, 13, topics=[Struct(topic_id=i, partitions=[partition]) for i in ids])
    frame = encode_request(Request(1, 13, 7, "c", body))
    return RequestReceived(frame, 1, 13, 7, time.monotonic(), True)


class StandInBroker:
    """Answers Metadata by id: names the ids in ``known``; records each question."""

    def __init__(self, known: dict[Uuid, str]):
        self.known = known
        self.questions: list[tuple[float, list[Uuid]]] = []
        self.in_flight = self.most_in_flight = 0
        self.config = SimpleNamespace(connect_timeout=5.0)

    def candidates(self):
        return [("127.0.0.1", 1)]

    async def ask(self, host, port, api_key, version, body):
        assert (api_key, version) == (3, 12) and body.allow_auto_topic_creation is False
        ids = [t.topic_id for t in body.topics]
        self.questions.append((time.monotonic(), ids))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        topics = [Struct(topic_id=i, name=self.known.get(i), error_code=0 if i in self.known else 100)
                  for i in ids]
        return SimpleNamespace(body=Struct(topics=topics))


def test_questions_are_bounded_and_names_reach_the_observers(monkeypatch):
    monkeypatch.setattr(topic_names, "QUESTION_INTERVAL_S", QUESTION_INTERVAL_S)
    ids = [Uuid(i.to_bytes(16, "big")) for i in range(1, 2 * IDS_PER_QUESTION + 51)]
    broker = StandInBroker({i: f"topic-{int.from_bytes(i, 'big')}" for i in ids[::2]})
    heard: list[tuple[Uuid, str]] = []

    class Listener:
        def topic_named(self, topic_id, name):
            heard.append((topic_id, name))

    async def scenario():
        lookup = TopicNameLookup(broker, [Listener()])
        lookup(None, [fetch_by_id(ids[:IDS_PER_QUESTION]), fetch_by_id(ids[IDS_PER_QUESTION:])])
        lookup(None, [fetch_by_id(ids)])                  # asked already or waiting: no more
        await lookup._asking
        lookup(None, [fetch_by_id(ids)])                  # named, or not named just now: not asked
        assert lookup._asking.done() or not lookup._waiting
        await lookup.stop()
        return lookup

    lookup = asyncio.run(scenario())
    asked = [i for _, question in broker.questions for i in question]
    assert sorted(asked) == sorted(ids)                     # each id asked about once
    assert [len(q) for _, q in broker.questions] == [100, 100, 50]
    starts = [t for t, _ in broker.questions]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    # The stand-in reads the clock a moment after the lookup did: SLACK_S for that moment.
    assert all(gap >= QUESTION_INTERVAL_S - SLACK_S for gap in gaps), gaps
    assert broker.most_in_flight == 1
    assert sorted(heard) == sorted(broker.known.items())    # each name heard once
    assert lookup.names == {i: n for i, n in broker.known.items()}
