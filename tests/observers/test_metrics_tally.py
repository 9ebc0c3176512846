"""The metrics read from tallies (``protocol.tally``) are the metrics read from the partial
decode: the same Produce and Fetch traffic, of every version, common and unusual frames
(leader hints, record errors, throttles, null records, topics by id, frames cut short;
consumers' positions over incremental sessions, read_committed, followers), exports the
same /metrics with tallies as without them."""

from __future__ import annotations

import random

import pytest
from prometheus_client import generate_latest

from kproxy.observers.metrics import Metrics
from kproxy.protocol import Request, Response, Struct, encode_request, encode_response, new_body, schema
from kproxy.protocol import events as events_module
from kproxy.protocol.connection import Connection
from kproxy.protocol.record_encoder import build_batch
from kproxy.protocol.records import Record
from kproxy.protocol import Uuid
from kproxy.protocol.tally import FETCH, PRODUCE
from tests.protocol.frames import framed
from tests.protocol.samples import sample_body
from tests.protocol.test_tally import untagged

VERSIONS = range(schema.REQUESTS[PRODUCE].versions[0], schema.REQUESTS[PRODUCE].versions[1] + 1)
FETCH_VERSIONS = range(schema.REQUESTS[FETCH].versions[0], schema.REQUESTS[FETCH].versions[1] + 1)
TOPIC_IDS = [Uuid(bytes([n]) * 16) for n in (1, 2)]
PAIRS_PER_VERSION = 12


def traffic(seed: int) -> list[tuple[bytes, bytes]]:
    """(request, answer) frames of every Produce version: sample bodies with real record batches,
    most answers without tagged fields (as brokers send them), some with, a few cut short."""
    rng = random.Random(seed)
    batches = [build_batch([Record(i, 1_700_000_000_000, b"k", b"v" * rng.randint(0, 300), ())
                            for i in range(rng.randint(1, 9))], codec) for codec in ("none", "gzip", "zstd")]
    pairs = []
    for version in VERSIONS:
        for n in range(PAIRS_PER_VERSION):
            request = sample_body("request", PRODUCE, version, seed=seed * 1000 + n, width=rng.randint(0, 3))
            request.acks = -1                            # answered
            for topic in request.topic_data:
                for partition in topic.partition_data:
                    partition.records = rng.choice(batches + [None])
            answer = sample_body("response", PRODUCE, version, seed=seed * 1000 + n, width=rng.randint(0, 3))
            if rng.random() < 0.7:
                answer = untagged(answer)
            ask = encode_request(Request(PRODUCE, version, n, rng.choice(["app-1", "app-2", None]), request))
            reply = encode_response(Response(n, answer), PRODUCE, version)
            if rng.random() < 0.1:
                reply = reply[:rng.randint(4, len(reply) - 1)]     # an answer cut short
            pairs.append((framed(ask), framed(reply)))
    for version in FETCH_VERSIONS:
        for n in range(PAIRS_PER_VERSION):
            pairs.append(fetch_pair(rng, version, n, batches))
    return pairs


def fetch_pair(rng: random.Random, version: int, n: int, batches: list) -> tuple[bytes, bytes]:
    """A consumer's Fetch (sometimes a follower's, sometimes a random sample) and its answer,
    over two topics of three partitions, so that positions and ends meet in the lag."""
    by_id = version >= 13

    def topic(i: int, **fields) -> Struct:
        return Struct(**({"topic_id": TOPIC_IDS[i]} if by_id else {"topic": f"t{i}"}), **fields)

    if rng.random() < 0.15:
        request = sample_body("request", FETCH, version, seed=n, width=rng.randint(0, 2))
        answer = sample_body("response", FETCH, version, seed=n, width=rng.randint(0, 2))
    else:
        fields = dict(replica_id=rng.choice([-1, -1, -1, 2]), isolation_level=rng.choice([0, 1]),
                      session_epoch=rng.choice([-1, 0, 1, 5]), topics=[
                          topic(i, partitions=[Struct(partition=p, fetch_offset=rng.randint(0, 900))
                                               for p in range(3) if rng.random() < 0.8]) for i in (0, 1)],
                      forgotten_topics_data=[topic(1, partitions=[rng.randrange(3)])] if rng.random() < 0.3 else [])
        if version >= 15 and fields.pop("replica_id") >= 0:
            fields["replica_state"] = Struct(replica_id=2, replica_epoch=1)
        request = new_body("request", FETCH, version, **{k: v for k, v in fields.items()
                                                        if k in new_body("request", FETCH, version).__dict__})
        answer = new_body("response", FETCH, version, **{k: v for k, v in dict(
            throttle_time_ms=rng.choice([0, 0, 30]), error_code=rng.choice([0, 0, 0, 1]), responses=[
                topic(i, partitions=[Struct(partition_index=p, error_code=rng.choice([0, 0, 0, 6]),
                                            high_watermark=rng.choice([-1, rng.randint(0, 2000)]),
                                            last_stable_offset=rng.choice([-1, rng.randint(0, 2000)]),
                                            records=rng.choice(batches + [None]))
                                     for p in range(3) if rng.random() < 0.8]) for i in (0, 1)]).items()
            if k in new_body("response", FETCH, version).__dict__})
    if rng.random() < 0.7:
        answer = untagged(answer)
    ask = encode_request(Request(FETCH, version, 1000 + n, rng.choice(["c-1", "c-2"]), request))
    reply = encode_response(Response(1000 + n, answer), FETCH, version)
    return framed(ask), framed(reply)


def exposition(pairs, monkeypatch, tallies: bool) -> bytes:
    with monkeypatch.context() as patch:
        if not tallies:
            patch.setattr(events_module, "tally_request", lambda frame: None)
            patch.setattr(events_module, "tally_response", lambda frame, key, version: None)
        metrics = Metrics(client_id_label=True, topic_label=True)
        metrics.topics.named(TOPIC_IDS[0], "named-by-metadata")     # the other stays an id
        ticks = iter(range(10**9))
        conn = Connection(clock=lambda: next(ticks) * 0.0007)
        lags = []                                # the lag after each pair (the gauge is read at scrape time)
        for ask, reply in pairs:
            metrics(None, conn.receive_client(ask))
            metrics(None, conn.receive_broker(reply))
            lags.append(metrics.lag.consumer_lags())
    text = generate_latest(metrics.registry)
    return repr(lags).encode() + b"\n".join(line for line in text.splitlines()
                      if not (line.split()[2] if line.startswith(b"#") else line).startswith((b"process_", b"python_")))


@pytest.mark.parametrize("seed", [1, 2])
def test_metrics_from_tallies_are_those_from_partial_decodes(seed, monkeypatch):
    pairs = traffic(seed)
    with_tallies = exposition(pairs, monkeypatch, tallies=True)
    assert with_tallies == exposition(pairs, monkeypatch, tallies=False)
    assert b'kproxy_produced_records_total' in with_tallies and b'kproxy_topic_produced_bytes_total{topic=' in with_tallies
    assert b'kproxy_decode_failures_total{direction="response"}' in with_tallies
    assert b'kproxy_fetched_records_total' in with_tallies and b'topic_fetched_bytes_total{topic=' in with_tallies
    lags = [line for line in with_tallies.splitlines() if line.startswith(b"kproxy_consumer_lag_records{")]
    assert any(not line.endswith(b" 0.0") for line in lags)


def test_the_traffic_is_mostly_tallied():
    """The comparison above is between two paths: most of its pairs take the tally's."""
    asked = answered = 0
    conn = Connection()
    pairs = traffic(1)
    for ask, reply in pairs:
        request, = conn.receive_client(ask)
        response, = conn.receive_broker(reply)
        asked += request.tally is not None
        answered += response.tally is not None
    assert len(pairs) * 0.8 < asked < len(pairs) and len(pairs) // 2 < answered < len(pairs)
