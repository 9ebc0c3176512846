"""Consumer lag read from Fetch pairs: offsets asked for against the partition ends answered.

Real frames through a real tracker (the ``Client`` of test_metrics_insight); the
offsets and ends are chosen here, so every expected lag is plain arithmetic.
"""

from prometheus_client import generate_latest

from kproxy.observers import metrics as metrics_module
from kproxy.observers.metrics import Metrics
from kproxy.protocol import Struct, Uuid, encode_request, new_body, Request
from tests.observers.metrics import Client, Clock, samples, value
from tests.protocol.frames import framed

LAG = "kproxy_consumer_lag_records"


class Consumer(Client):
    """A client whose requests carry a client_id of its choosing."""

    def __init__(self, metrics, clock, client_id="app"):
        super().__init__(metrics, clock)
        self.client_id = client_id

    def send(self, api, version, **fields):
        from kproxy.protocol import API_KEYS
        api_key = API_KEYS[api]
        self.pending = (api_key, version, next(self.correlation))
        frame = encode_request(Request(api_key, version, self.pending[2], self.client_id,
                                       new_body("request", api_key, version, **fields)))
        self.metrics(self.info, self.conn.receive_client(framed(frame)))

    def fetch(self, offsets, ends, version=12, session_epoch=-1, isolation_level=0, forgotten=(),
              lso=None, replica_id=-1, errors=None):
        """Fetch ``{(topic, partition): offset}``, answered with ``{(topic, partition): hw}``."""
        name = "topic" if version < 13 else "topic_id"
        request = dict(
            replica_id=replica_id, isolation_level=isolation_level, session_epoch=session_epoch,
            topics=[Struct(**{name: topic}, partitions=[
                Struct(partition=p, fetch_offset=o) for (t, p), o in offsets.items() if t == topic])
                for topic in dict.fromkeys(t for t, _ in offsets)],
            forgotten_topics_data=[Struct(**{name: t}, partitions=[p]) for t, p in forgotten])
        if version >= 15:
            request.pop("replica_id")
            request["replica_state"] = Struct(replica_id=replica_id, replica_epoch=-1)
        response = dict(responses=[Struct(**{name: topic}, partitions=[
            Struct(partition_index=p, high_watermark=hw, error_code=(errors or {}).get((t, p), 0),
                   last_stable_offset=(lso or {}).get((t, p), -1), records=None)
            for (t, p), hw in ends.items() if t == topic])
            for topic in dict.fromkeys(t for t, _ in ends)])
        self.call("Fetch", version, request, response)


def test_lag_is_the_partition_end_minus_the_offset_fetched():
    m, clock = Metrics(), Clock()
    consumer = Consumer(m, clock)
    assert value(m, LAG) == 0                            # exported before any fetch
    consumer.fetch({("orders", 0): 40, ("orders", 1): 7}, {("orders", 0): 100, ("orders", 1): 7})
    assert value(m, LAG) == 60
    # A consumer that never commits is behind all the same: only Fetch is read.
    consumer.fetch({("orders", 0): 90, ("orders", 1): 7}, {("orders", 0): 100, ("orders", 1): 12})
    assert value(m, LAG) == 10 + 5
    consumer.close()
    assert value(m, LAG) == 0                            # a closed connection fetches nothing


def test_incremental_sessions_keep_what_the_request_left_out():
    m, clock = Metrics(), Clock()
    consumer = Consumer(m, clock)
    consumer.fetch({("t", 0): 10, ("t", 1): 20}, {("t", 0): 30, ("t", 1): 20}, session_epoch=0)
    assert value(m, LAG) == 20
    # Epoch 1: only t-0 moved; the answer names only t-1, whose end grew.
    consumer.fetch({("t", 0): 25}, {("t", 1): 26}, session_epoch=1)
    assert value(m, LAG) == (30 - 25) + (26 - 20)
    # t-1 forgotten: it leaves the sum.
    consumer.fetch({}, {}, session_epoch=2, forgotten=[("t", 1)])
    assert value(m, LAG) == 5
    # A full fetch (epoch -1) lists everything it fetches: t-0 is gone, t-2 new.
    consumer.fetch({("t", 2): 0}, {("t", 2): 3})
    assert value(m, LAG) == 3


def test_read_committed_counts_to_the_last_stable_offset():
    m, clock = Metrics(), Clock()
    consumer = Consumer(m, clock)
    consumer.fetch({("tx", 0): 10}, {("tx", 0): 50}, isolation_level=1, lso={("tx", 0): 30})
    assert value(m, LAG) == 20
    other = Consumer(m, clock)
    other.fetch({("tx", 0): 10}, {("tx", 0): 50}, lso={("tx", 0): 30})     # read_uncommitted
    assert value(m, LAG) == 20 + 40


def test_followers_errors_and_unanswered_partitions_add_nothing():
    m, clock = Metrics(), Clock()
    consumer = Consumer(m, clock)
    consumer.fetch({("t", 0): 0}, {("t", 0): 1000}, replica_id=2)           # a replica fetcher
    topic_id = Uuid(bytes(range(16)))
    consumer.fetch({(topic_id, 0): 0}, {(topic_id, 0): 1000}, version=15, replica_id=3)
    consumer.fetch({("t", 1): 5}, {("t", 1): -1}, errors={("t", 1): 1})     # OFFSET_OUT_OF_RANGE
    consumer.fetch({("t", 2): 5}, {})                                       # no answer for it yet
    assert value(m, LAG) == 0


def test_fetch_by_topic_id_is_labelled_with_the_name_metadata_gave():
    m, clock = Metrics(topic_label=True, client_id_label=True), Clock()
    consumer = Consumer(m, clock, client_id="billing")
    topic_id = Uuid(bytes(range(1, 17)))
    consumer.call("Metadata", 12, dict(topics=None), dict(
        brokers=[], topics=[Struct(name="invoices", topic_id=topic_id, error_code=0, partitions=[])]))
    consumer.fetch({(topic_id, 0): 3}, {(topic_id, 0): 10}, version=16)
    assert value(m, LAG, client_id="billing", topic="invoices") == 7


def test_lag_labels_stay_bounded_when_clients_invent_ids_and_topics():
    cap = 4
    m, clock = Metrics(topic_label=True, client_id_label=True, label_cap=cap), Clock()
    for i in range(50):
        Consumer(m, clock, client_id=f"invented-{i}").fetch(
            {(f"topic-{i}", 0): 0}, {(f"topic-{i}", 0): 2})
    series = samples(m, LAG)
    assert len({dict(labels)["client_id"] for labels in series}) <= cap + 1
    assert len({dict(labels)["topic"] for labels in series}) <= cap + 1
    assert sum(series.values()) == 100                   # folded, not lost
    assert value(m, LAG, client_id="other", topic="other") == 2 * (50 - cap)


def test_state_per_connection_is_capped(monkeypatch):
    monkeypatch.setattr(metrics_module, "MAX_LAG_PARTITIONS_PER_CONNECTION", 3)
    m, clock = Metrics(), Clock()
    consumer = Consumer(m, clock)
    consumer.fetch({("t", p): 0 for p in range(10)}, {("t", p): 1 for p in range(10)})
    assert value(m, LAG) == 3
    generate_latest(m.registry)


def test_lag_can_be_left_out():
    m, clock = Metrics(consumer_lag=False), Clock()
    Consumer(m, clock).fetch({("t", 0): 0}, {("t", 0): 5})
    assert LAG not in generate_latest(m.registry).decode()
