"""The metrics read from Produce tallies (``protocol.tally``) are the metrics read from the
partial decode: the same Produce traffic, of every version, common and unusual frames
(leader hints, record errors, throttles, null records, topics by id, frames cut short),
exports the same /metrics with tallies as without them."""

from __future__ import annotations

import random

import pytest
from prometheus_client import generate_latest

from kproxy.observers.metrics import Metrics
from kproxy.protocol import Request, Response, Struct, encode_request, encode_response, new_body, schema
from kproxy.protocol import connection as connection_module
from kproxy.protocol.connection import Connection
from kproxy.protocol.record_encoder import build_batch
from kproxy.protocol.records import Record
from kproxy.protocol.tally import PRODUCE
from tests.protocol.frames import framed
from tests.protocol.samples import sample_body
from tests.protocol.test_tally import untagged

VERSIONS = range(schema.REQUESTS[PRODUCE].versions[0], schema.REQUESTS[PRODUCE].versions[1] + 1)
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
    return pairs


def exposition(pairs, monkeypatch, tallies: bool) -> bytes:
    with monkeypatch.context() as patch:
        if not tallies:
            patch.setattr(connection_module, "tally_request", lambda frame: None)
            patch.setattr(connection_module, "tally_response", lambda frame, version: None)
        metrics = Metrics(client_id_label=True, topic_label=True)
        ticks = iter(range(10**9))
        conn = Connection(clock=lambda: next(ticks) * 0.0007)
        for ask, reply in pairs:
            metrics(None, conn.receive_client(ask))
            metrics(None, conn.receive_broker(reply))
    text = generate_latest(metrics.registry)
    return b"\n".join(line for line in text.splitlines()
                      if not (line.split()[2] if line.startswith(b"#") else line).startswith((b"process_", b"python_")))


@pytest.mark.parametrize("seed", [1, 2])
def test_produce_metrics_from_tallies_are_those_from_partial_decodes(seed, monkeypatch):
    pairs = traffic(seed)
    with_tallies = exposition(pairs, monkeypatch, tallies=True)
    assert with_tallies == exposition(pairs, monkeypatch, tallies=False)
    assert b'kproxy_produced_records_total' in with_tallies and b'kproxy_topic_produced_bytes_total{topic=' in with_tallies
    assert b'kproxy_decode_failures_total{direction="response"}' in with_tallies


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
    assert asked == len(pairs) and len(pairs) // 2 < answered < len(pairs)
