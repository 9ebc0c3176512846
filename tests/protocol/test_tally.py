"""Produce and Fetch tallies (``protocol.tally``) against the strict reader, for every version.

Two promises: a frame that gets a tally decodes (whole and partially), and the tally holds
what the decoded body holds (Produce: each partition's records and topic, the client id and
acks; the answer's error codes in walk order and throttle time. Fetch: the consumer's
positions, session and isolation; the answer's partition headers and records); and the
common frame (no tagged fields) gets one.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from kproxy.protocol import (DecodeError, Request, Response, Struct, decode_request, decode_response,
                             encode_request, encode_response, new_body, schema)
from kproxy.protocol.connection import Connection
from kproxy.protocol.tally import (FETCH, FETCH_NEWEST_LAYOUT, PRODUCE, PRODUCE_NEWEST_LAYOUT, tally_request,
                                   tally_response)
from kproxy.protocol.walk import error_codes
from tests.protocol.mutations import mutate
from tests.protocol.samples import sample_body
from tests.soak import run_for

NEWEST = {PRODUCE: PRODUCE_NEWEST_LAYOUT, FETCH: FETCH_NEWEST_LAYOUT}
MESSAGES = [(key, v) for key in (PRODUCE, FETCH)
            for v in range(schema.REQUESTS[key].versions[0], schema.REQUESTS[key].versions[1] + 1)]
SETTINGS = settings(max_examples=25, deadline=None)
# The layout the tally readers follow (field names in order, per struct): a schema that
# changes Produce or Fetch must be taught to them first.
LAYOUT = {
    ("request", PRODUCE, None): ("transactional_id", "acks", "timeout_ms", "topic_data"),
    ("request", PRODUCE, "TopicProduceData"): ("name", "topic_id", "partition_data"),
    ("request", PRODUCE, "PartitionProduceData"): ("index", "records"),
    ("response", PRODUCE, None): ("responses", "throttle_time_ms", "node_endpoints"),
    ("response", PRODUCE, "TopicProduceResponse"): ("name", "topic_id", "partition_responses"),
    ("response", PRODUCE, "PartitionProduceResponse"): (
        "index", "error_code", "base_offset", "log_append_time_ms", "log_start_offset", "record_errors",
        "error_message", "current_leader"),
    ("response", PRODUCE, "BatchIndexAndErrorMessage"): ("batch_index", "batch_index_error_message"),
    ("request", FETCH, None): ("cluster_id", "replica_id", "replica_state", "max_wait_ms", "min_bytes", "max_bytes",
                               "isolation_level", "session_id", "session_epoch", "topics",
                               "forgotten_topics_data", "rack_id"),
    ("request", FETCH, "FetchTopic"): ("topic", "topic_id", "partitions"),
    ("request", FETCH, "FetchPartition"): ("partition", "current_leader_epoch", "fetch_offset", "last_fetched_epoch",
                                           "log_start_offset", "partition_max_bytes", "replica_directory_id",
                                           "high_watermark"),
    ("request", FETCH, "ForgottenTopic"): ("topic", "topic_id", "partitions"),
    ("response", FETCH, None): ("throttle_time_ms", "error_code", "session_id", "responses", "node_endpoints"),
    ("response", FETCH, "FetchableTopicResponse"): ("topic", "topic_id", "partitions"),
    ("response", FETCH, "PartitionData"): ("partition_index", "error_code", "high_watermark", "last_stable_offset",
                                           "log_start_offset", "diverging_epoch", "current_leader", "snapshot_id",
                                           "aborted_transactions", "preferred_read_replica", "records"),
    ("response", FETCH, "AbortedTransaction"): ("producer_id", "first_offset"),
}
TAGGED = {"node_endpoints", "current_leader", "cluster_id", "replica_state", "replica_directory_id",
          "high_watermark", "diverging_epoch", "snapshot_id"}


def test_the_readers_follow_the_schemas_layouts():
    for key, newest in NEWEST.items():
        assert schema.REQUESTS[key].versions == schema.RESPONSES[key].versions
        assert schema.REQUESTS[key].versions[1] <= newest
    for (kind, key, struct_name), names in LAYOUT.items():
        spec = (schema.REQUESTS if kind == "request" else schema.RESPONSES)[key]
        rows = spec.fields if struct_name is None else spec.structs[struct_name]
        assert tuple(f.name for f in rows) == names
        assert {f.name for f in rows if f.tagged} <= TAGGED
    for key, v in MESSAGES:
        assert schema.request_header_version(key, v) == (2 if schema.REQUESTS[key].is_flexible(v) else 1)
        assert schema.response_header_version(key, v) == (1 if schema.RESPONSES[key].is_flexible(v) else 0)


def untagged(body: Struct) -> Struct:
    """``body`` without tagged fields (as most are: no leader moved, a consumer asking)."""
    fields = body.__dict__
    for name in ("node_endpoints",):
        if name in fields:
            fields[name] = []
    for name in ("cluster_id", "replica_state"):
        fields.pop(name, None)
    for topic in (fields.get("responses") or fields.get("topics") or ()):
        for partition in (topic.__dict__.get("partition_responses") or topic.__dict__.get("partitions") or ()):
            for name in ("current_leader", "diverging_epoch", "snapshot_id", "replica_directory_id",
                         "high_watermark"):
                if name == "high_watermark" and "fetch_offset" not in partition.__dict__:
                    continue                 # an answer's high watermark is no tagged field
                partition.__dict__.pop(name, None)
    return body


# Records sizes around the compact length's byte boundaries (1, 2 and 3 bytes).
RECORDS_SIZES = (0, 1, 125, 126, 127, 128, 300, 16382, 16383, 16384, 70_000)


def sized(body: Struct, rng: random.Random) -> Struct:
    """``body`` with records of sizes around the length encodings' boundaries."""
    fields = body.__dict__
    for topic in (fields.get("topic_data") or fields.get("responses") or ()):
        for partition in (topic.__dict__.get("partition_data") or topic.__dict__.get("partitions") or ()):
            if partition.__dict__.get("records") is not None:
                partition.records = bytes(rng.choice(RECORDS_SIZES))
    return body


def request_frame(key: int, version: int, body: Struct) -> bytes:
    return encode_request(Request(key, version, 7, "tally-test", body))


def response_frame(key: int, version: int, body: Struct) -> bytes:
    return encode_response(Response(7, body), key, version)


def _records(value):
    return None if value is None else bytes(value)


def assert_request_tally(frame, key: int, version: int) -> bool:
    """The tally of ``frame`` agrees with its decoding; False when it has none."""
    tally = tally_request(frame)
    if tally is None:
        return False
    whole = decode_request(frame)
    key, version = whole.api_key, whole.api_version          # the frame's own (a mutant's may differ)
    body = whole.body.__dict__
    assert tally.client_id == whole.client_id
    if key == PRODUCE:
        assert tally.acks == body["acks"]
        expected = [(None if version >= 13 else t.name, t.topic_id if version >= 13 else None,
                     [_records(p.records) for p in t.partition_data]) for t in body["topic_data"]]
        assert [(t.name, t.topic_id, [_records(r) for r in t.records]) for t in tally.topics] == expected
        return True
    by = "topic" if version < 13 else "topic_id"
    replica = body.get("replica_state")
    assert tally.replica_id == (replica.replica_id if replica is not None else body.get("replica_id", -1))
    assert (tally.isolation_level, tally.session_epoch) == (body.get("isolation_level", 0),
                                                            body.get("session_epoch", -1))
    assert tally.topics == [(getattr(t, by), [(p.partition, p.fetch_offset) for p in t.partitions])
                            for t in body["topics"]]
    assert tally.forgotten == [(getattr(t, by), list(t.partitions)) for t in body.get("forgotten_topics_data") or ()]
    return True


def assert_response_tally(frame, key: int, version: int) -> bool:
    tally = tally_response(frame, key, version)
    if tally is None:
        return False
    whole = decode_response(frame, key, version)
    body = whole.body.__dict__
    assert tally.throttle_time_ms == body.get("throttle_time_ms")
    assert tally.errors == error_codes("response", key, version, whole.body)
    assert not body.get("node_endpoints")
    if key == FETCH:
        assert tally.error_code == body.get("error_code", 0)
        expected = [(None if version >= 13 else t.topic, t.topic_id if version >= 13 else None,
                     [(p.partition_index, p.error_code, p.high_watermark, p.__dict__.get("last_stable_offset", -1),
                       _records(p.records)) for p in t.partitions]) for t in body["responses"]]
        assert [(t.name, t.topic_id, [(*p[:4], _records(p.records)) for p in t.partitions])
                for t in tally.topics] == expected
    return True


@pytest.mark.parametrize("key,version", MESSAGES)
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), width=st.integers(0, 3))
def test_untagged_pairs_are_tallied_as_decoded(key, version, seed, width):
    rng = random.Random(seed)
    request = sized(untagged(sample_body("request", key, version, seed=seed, width=width)), rng)
    response = sized(untagged(sample_body("response", key, version, seed=seed, width=width)), rng)
    assert assert_request_tally(request_frame(key, version, request), key, version)
    assert assert_response_tally(response_frame(key, version, response), key, version)


@pytest.mark.parametrize("key,version", [(k, v) for k, v in MESSAGES
                                         if "node_endpoints" in sample_body("response", k, v).__dict__])
def test_tagged_answers_are_left_to_the_partial_decode(key, version):
    body = sample_body("response", key, version, width=2)
    assert body.node_endpoints                       # samples fill every field
    assert tally_response(response_frame(key, version, body), key, version) is None
    partition = Struct(index=0, error_code=6, current_leader=Struct(leader_id=2, leader_epoch=5)) \
        if key == PRODUCE else Struct(partition_index=0, error_code=6,
                                      current_leader=Struct(leader_id=2, leader_epoch=5))
    topics = [Struct(name="t", topic="t", partition_responses=[partition], partitions=[partition])]
    frame = response_frame(key, version, new_body("response", key, version, responses=topics))   # a leader hint alone
    assert error_codes("response", key, version, decode_response(frame, key, version).body) == [6]
    assert tally_response(frame, key, version) is None


def test_a_followers_fetch_is_left_to_the_partial_decode():
    body = new_body("request", FETCH, 15, replica_state=Struct(replica_id=3, replica_epoch=9), topics=[])
    assert tally_request(request_frame(FETCH, 15, body)) is None
    body = new_body("request", FETCH, 14, replica_id=3, topics=[])
    assert tally_request(request_frame(FETCH, 14, body)).replica_id == 3


_SIZES = random.Random(5)
CORPUS = [(kind, key, v, request_frame(key, v, sized(untagged(sample_body(kind, key, v, seed=seed)), _SIZES))
           if kind == "request" else response_frame(key, v, sized(untagged(sample_body(kind, key, v, seed=seed)), _SIZES)))
          for kind in ("request", "response") for key, v in MESSAGES for seed in range(3)]


@settings(max_examples=500, deadline=None)
@given(index=st.integers(0, len(CORPUS) - 1), seed=st.integers(0, 2**32 - 1), rounds=st.integers(1, 4),
       as_view=st.booleans())
def test_a_mutated_frame_with_a_tally_decodes_to_it(index, seed, rounds, as_view):
    kind, key, version, frame = CORPUS[index]
    mutant = mutate(random.Random(seed), frame, rounds)
    data = memoryview(mutant) if as_view else mutant
    try:
        if kind == "request":
            assert_request_tally(data, key, version)
        else:
            assert_response_tally(data, key, version)
    except DecodeError:
        pytest.fail(f"a {kind} v{version} frame with a tally does not decode: {mutant.hex()}")


def test_events_tally_produce_and_fetch_only_and_once():
    conn = Connection()
    for key, version in ((PRODUCE, 9), (FETCH, 13)):
        body = sample_body("request", key, version)
        if key == PRODUCE:
            body.acks = -1
        request = request_frame(key, version, untagged(body))
        answer = response_frame(key, version, untagged(sample_body("response", key, version)))
        asked, = conn.receive_client(len(request).to_bytes(4, "big") + request)
        answered, = conn.receive_broker(len(answer).to_bytes(4, "big") + answer)
        assert asked.tally is asked.tally and asked.tally.client_id == "tally-test"
        assert answered.tally is answered.tally and answered.tally.errors == \
            error_codes("response", key, version, answered.response.body)
    heartbeat = encode_request(Request(12, 4, 8, "x", sample_body("request", 12, 4)))
    other, = conn.receive_client(len(heartbeat).to_bytes(4, "big") + heartbeat)
    assert other.tally is None


@pytest.mark.soak
def test_soak_tallies(soak_seconds):
    """The mutation property above, batch after batch, for ``--soak-seconds``."""
    batches = run_for(soak_seconds, test_a_mutated_frame_with_a_tally_decodes_to_it)
    print(f"tally soak: {batches} batches")
