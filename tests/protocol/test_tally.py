"""Produce tallies (``protocol.tally``) against the strict reader, for every Produce version.

Two promises: a frame that gets a tally decodes (whole and partially), and the tally holds
what the decoded body holds (each partition's records and topic, the client id and acks;
the answer's error codes in walk order and throttle time); and the common frame (no tagged
fields) gets one.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from kproxy.protocol import (DecodeError, Request, Response, Struct, decode_request, decode_response,
                             encode_request, encode_response, new_body, schema)
from kproxy.protocol.connection import Connection
from kproxy.protocol.tally import NEWEST_LAYOUT, PRODUCE, tally_request, tally_response
from kproxy.protocol.walk import error_codes
from tests.protocol.mutations import mutate
from tests.protocol.samples import sample_body

REQUEST, RESPONSE = schema.REQUESTS[PRODUCE], schema.RESPONSES[PRODUCE]
VERSIONS = range(REQUEST.versions[0], REQUEST.versions[1] + 1)
SETTINGS = settings(max_examples=40, deadline=None)
# The layout the tally readers follow (field names in order, per struct): a schema that
# changes Produce must be taught to them first.
LAYOUT = {
    ("request", None): ("transactional_id", "acks", "timeout_ms", "topic_data"),
    ("request", "TopicProduceData"): ("name", "topic_id", "partition_data"),
    ("request", "PartitionProduceData"): ("index", "records"),
    ("response", None): ("responses", "throttle_time_ms", "node_endpoints"),
    ("response", "TopicProduceResponse"): ("name", "topic_id", "partition_responses"),
    ("response", "PartitionProduceResponse"): ("index", "error_code", "base_offset", "log_append_time_ms",
                                               "log_start_offset", "record_errors", "error_message",
                                               "current_leader"),
    ("response", "BatchIndexAndErrorMessage"): ("batch_index", "batch_index_error_message"),
}
TAGGED = {"node_endpoints", "current_leader"}


def test_the_readers_follow_the_schemas_produce_layout():
    assert REQUEST.versions == RESPONSE.versions and REQUEST.versions[1] <= NEWEST_LAYOUT
    for (kind, struct_name), names in LAYOUT.items():
        spec = REQUEST if kind == "request" else RESPONSE
        rows = spec.fields if struct_name is None else spec.structs[struct_name]
        assert tuple(f.name for f in rows) == names
        assert {f.name for f in rows if f.tagged} <= TAGGED
    for v in VERSIONS:
        assert schema.request_header_version(PRODUCE, v) == (2 if REQUEST.is_flexible(v) else 1)
        assert schema.response_header_version(PRODUCE, v) == (1 if RESPONSE.is_flexible(v) else 0)


def untagged(body: Struct) -> Struct:
    """``body`` without tagged fields (as most answers are: no leader moved)."""
    if "node_endpoints" in body.__dict__:
        body.node_endpoints = []
    for topic in body.__dict__.get("responses") or ():
        for partition in topic.partition_responses:
            partition.__dict__.pop("current_leader", None)
    return body


def request_frame(version: int, body: Struct) -> bytes:
    return encode_request(Request(PRODUCE, version, 7, "tally-test", body))


def response_frame(version: int, body: Struct) -> bytes:
    return encode_response(Response(7, body), PRODUCE, version)


def assert_request_tally(frame, version: int) -> bool:
    """The tally of ``frame`` agrees with its decoding; False when it has none."""
    tally = tally_request(frame)
    if tally is None:
        return False
    whole = decode_request(frame)
    assert (tally.client_id, tally.acks) == (whole.client_id, whole.body.acks)
    expected = [(None if version >= 13 else t.name, t.topic_id if version >= 13 else None,
                 [None if p.records is None else bytes(p.records) for p in t.partition_data])
                for t in whole.body.topic_data]
    got = [(t.name, t.topic_id, [None if r is None else bytes(r) for r in t.records]) for t in tally.topics]
    assert got == expected
    return True


def assert_response_tally(frame, version: int) -> bool:
    tally = tally_response(frame, version)
    if tally is None:
        return False
    whole = decode_response(frame, PRODUCE, version)
    assert tally.throttle_time_ms == whole.body.__dict__.get("throttle_time_ms")
    assert tally.errors == error_codes("response", PRODUCE, version, whole.body)
    assert not whole.body.__dict__.get("node_endpoints")
    return True


@pytest.mark.parametrize("version", VERSIONS)
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), width=st.integers(0, 3))
def test_untagged_produce_pairs_are_tallied_as_decoded(version, seed, width):
    request = sample_body("request", PRODUCE, version, seed=seed, width=width)
    response = untagged(sample_body("response", PRODUCE, version, seed=seed, width=width))
    assert assert_request_tally(request_frame(version, request), version)
    assert assert_response_tally(response_frame(version, response), version)


@pytest.mark.parametrize("version", [v for v in VERSIONS if "node_endpoints" in sample_body("response", PRODUCE, v).__dict__])
def test_tagged_answers_are_left_to_the_partial_decode(version):
    body = sample_body("response", PRODUCE, version, width=2)
    assert body.node_endpoints                       # samples fill every field
    assert tally_response(response_frame(version, body), version) is None
    hint = new_body("response", PRODUCE, version, responses=[Struct(name="t", partition_responses=[
        Struct(index=0, error_code=6, current_leader=Struct(leader_id=2, leader_epoch=5))])])
    frame = response_frame(version, hint)            # a leader hint alone
    assert decode_response(frame, PRODUCE, version).body.responses[0].partition_responses[0].current_leader.leader_id == 2
    assert tally_response(frame, version) is None


CORPUS = [(kind, v, request_frame(v, sample_body(kind, PRODUCE, v, seed=seed)) if kind == "request"
           else response_frame(v, untagged(sample_body(kind, PRODUCE, v, seed=seed))))
          for kind in ("request", "response") for v in VERSIONS for seed in range(2)]


@settings(max_examples=800, deadline=None)
@given(index=st.integers(0, len(CORPUS) - 1), seed=st.integers(0, 2**32 - 1), rounds=st.integers(1, 4),
       as_view=st.booleans())
def test_a_mutated_frame_with_a_tally_decodes_to_it(index, seed, rounds, as_view):
    kind, version, frame = CORPUS[index]
    mutant = mutate(random.Random(seed), frame, rounds)
    data = memoryview(mutant) if as_view else mutant
    try:
        if kind == "request":
            assert_request_tally(data, version)
        else:
            assert_response_tally(data, version)
    except DecodeError:
        pytest.fail(f"a {kind} v{version} frame with a tally does not decode: {mutant.hex()}")


def test_events_tally_produce_only_and_once():
    version = 9
    request = request_frame(version, sample_body("request", PRODUCE, version))
    answer = response_frame(version, untagged(sample_body("response", PRODUCE, version)))
    conn = Connection()
    asked, = conn.receive_client(len(request).to_bytes(4, "big") + request)
    if not asked.expects_response:
        pytest.skip("acks=0 sample")
    answered, = conn.receive_broker(len(answer).to_bytes(4, "big") + answer)
    assert asked.tally is asked.tally and asked.tally.client_id == "tally-test"
    assert answered.tally is answered.tally and answered.tally.errors == \
        error_codes("response", PRODUCE, version, answered.response.body)
    heartbeat = encode_request(Request(12, 4, 8, "x", sample_body("request", 12, 4)))
    other, = conn.receive_client(len(heartbeat).to_bytes(4, "big") + heartbeat)
    assert other.tally is None
