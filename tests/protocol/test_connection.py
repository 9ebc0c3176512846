"""The connection tracker: framing, pairing, acks=0, SASL v0 raw tokens, limits, timing."""

import struct

import pytest
from hypothesis import given, settings, strategies as st

from kproxy.protocol import Struct, encode_response
from kproxy.protocol.connection import Connection
from kproxy.protocol.errors import FrameTooLarge, ProtocolViolation, UnpairedResponse, UntrackableRequest
from kproxy.protocol.events import MalformedFrame, RequestReceived, ResponseReceived, SaslTokenPassed
from tests.protocol.frames import (PADDED_BUT_ACCEPTED, REFUSED_BY_THE_BROKER, FakeClock, framed, produce, produce_v9,
                                   request_bytes, response_bytes)


def test_pairs_pipelined_requests_in_order_and_times_them():
    clock = FakeClock()
    conn = Connection(clock=clock)
    events = conn.receive_client(request_bytes(3, 12, 1, topics=None) + request_bytes(18, 3, 2))
    assert [type(e) for e in events] == [RequestReceived, RequestReceived]
    assert conn.in_flight == 2
    clock.now += 0.25
    [first] = conn.receive_broker(response_bytes(3, 12, 1, cluster_id="c"))
    clock.now += 0.5
    [second] = conn.receive_broker(response_bytes(18, 3, 2))
    assert (first.api_key, first.correlation_id, first.latency) == (3, 1, 0.25)
    assert first.response.body.cluster_id == "c"
    assert (second.api_key, second.api_version, second.latency) == (18, 3, 0.75)
    assert conn.in_flight == 0


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(1, 400), min_size=1, max_size=30))
def test_any_chunking_gives_the_same_events(cuts):
    client = b"".join(request_bytes(3, v, i, topics=None) for i, v in enumerate(range(1, 13)))
    broker = b"".join(response_bytes(3, v, i) for i, v in enumerate(range(1, 13)))
    conn = Connection()
    seen = []
    for stream, feed in ((client, conn.receive_client), (broker, conn.receive_broker)):
        pos = 0
        for cut in cuts * 20:
            if pos >= len(stream):
                break
            seen += feed(stream[pos:pos + cut])
            pos += cut
        seen += feed(stream[pos:])
    requests = [e for e in seen if isinstance(e, RequestReceived)]
    responses = [e for e in seen if isinstance(e, ResponseReceived)]
    assert [r.correlation_id for r in requests] == list(range(12))
    assert [(r.correlation_id, r.api_version) for r in responses] == [(i, v) for i, v in enumerate(range(1, 13))]
    assert all(r.response is not None and r.decode_error is None for r in responses)
    assert conn.buffered == 0


@pytest.mark.parametrize("version", [3, 7, 9, 11, 13])
def test_produce_acks_zero_expects_no_response(version):
    conn = Connection()
    [fire_and_forget] = conn.receive_client(produce(version, 1, acks=0))
    [acked] = conn.receive_client(produce(version, 2, acks=-1))
    assert not fire_and_forget.expects_response and acked.expects_response
    assert conn.in_flight == 1
    [resp] = conn.receive_broker(response_bytes(0, version, 2))
    assert resp.request_event is acked


def test_a_response_not_for_the_oldest_request_raises():
    """The broker answers in order: skipping a request means kproxy and the broker disagree
    about what is answered, and pairing by a later match could forward addresses unrewritten."""
    conn = Connection()
    conn.receive_client(request_bytes(18, 3, 1) + request_bytes(18, 3, 2))
    with pytest.raises(UnpairedResponse, match="correlation id 2, but the oldest unanswered "
                                              "request is .*correlation_id=1"):
        conn.receive_broker(response_bytes(18, 3, 2))
    with pytest.raises(UnpairedResponse, match="no request awaits"):
        Connection().receive_broker(response_bytes(18, 3, 99))
    with pytest.raises(UnpairedResponse, match="too short"):
        Connection().receive_broker(framed(b"\x00\x01"))


@pytest.mark.parametrize("fields", PADDED_BUT_ACCEPTED.values(), ids=PADDED_BUT_ACCEPTED.keys())
def test_produce_acks_is_read_the_way_the_broker_reads_it(fields):
    conn = Connection()
    [quiet] = conn.receive_client(produce_v9(1, acks=0, **fields))
    [acked] = conn.receive_client(produce_v9(2, acks=1, **fields))
    assert not quiet.expects_response and acked.expects_response and conn.in_flight == 1


@pytest.mark.parametrize("fields", REFUSED_BY_THE_BROKER.values(), ids=REFUSED_BY_THE_BROKER.keys())
def test_produce_the_broker_refuses_is_untrackable(fields):
    frame = produce_v9(1, acks=0, **fields)
    with pytest.raises(UntrackableRequest, match="cannot tell"):
        Connection().receive_client(frame)


def test_produce_of_an_unknown_version_is_untrackable():
    frame = framed(struct.pack(">hhih", 0, 99, 1, 1) + b"c" + b"\x00" * 20)
    with pytest.raises(UntrackableRequest, match="Produce v99 is unknown"):
        Connection().receive_client(frame)
    assert issubclass(UntrackableRequest, ProtocolViolation) and issubclass(FrameTooLarge, ProtocolViolation)


def test_issue_10_same_correlation_id_after_a_padded_acks_0_produce():
    """The reproduction from issue 10: Produce acks=0 with tagged count 80 00, then Metadata
    with the same correlation id; the Metadata answer must be held and rewritten."""
    conn = Connection(hold=lambda k, v: k == 3, transform=lambda e: b"\x00\x00\x00\x07REWRITTEN")
    conn.receive_client(produce_v9(7, acks=0, header_tags=b"\x80\x00") + request_bytes(3, 12, 7, topics=None))
    answer = response_bytes(3, 12, 7, brokers=[Struct(node_id=1, host="broker.internal", port=9092, rack=None)])
    out = []
    for pos in range(0, len(answer), 5):                 # the answer spans reads
        events, chunks = conn.relay_broker(answer[pos:pos + 5])
        out += chunks
    assert b"".join(bytes(c) for c in out) == framed(b"\x00\x00\x00\x07REWRITTEN")
    assert events[0].api_key == 3 and conn.in_flight == 0


def test_relay_broker_keeps_a_frame_start_until_its_correlation_id_is_in():
    conn = Connection()
    conn.receive_client(request_bytes(18, 3, 1))
    answer = response_bytes(18, 3, 1)
    assert conn.relay_broker(answer[:6]) == ([], [])      # size and half a correlation id
    events, out = conn.relay_broker(answer[6:9])
    assert events == [] and b"".join(bytes(c) for c in out) == answer[:9]
    events, out = conn.relay_broker(answer[9:])
    assert len(events) == 1 and b"".join(bytes(c) for c in out) == answer[9:]


def test_relay_broker_refuses_an_unpaired_response_before_passing_any_of_it():
    conn = Connection(hold=lambda k, v: k == 3, transform=lambda e: None)
    conn.receive_client(request_bytes(18, 3, 1))
    stray = response_bytes(3, 12, 2, brokers=[Struct(node_id=1, host="broker.internal", port=9092, rack=None)])
    assert conn.relay_broker(stray[:7]) == ([], [])
    with pytest.raises(UnpairedResponse):
        conn.relay_broker(stray[7:20])


def sasl_v0_handshake(conn, mechanism):
    conn.receive_client(request_bytes(17, 0, 1, mechanism=mechanism))
    [resp] = conn.receive_broker(response_bytes(17, 0, 1, error_code=0, mechanisms=[mechanism]))
    assert resp.response.body.error_code == 0
    assert conn.in_raw_sasl


@pytest.mark.parametrize("mechanism,rounds", [("PLAIN", 1), ("SCRAM-SHA-256", 2), ("SCRAM-SHA-512", 2)])
def test_sasl_v0_raw_tokens_pass_opaque_then_kafka_resumes(mechanism, rounds):
    conn = Connection()
    sasl_v0_handshake(conn, mechanism)
    secret = b"\x00user\x00hunter2"
    for _ in range(rounds):
        [token] = conn.receive_client(framed(secret))
        assert isinstance(token, SaslTokenPassed) and token.size == len(secret) + 4
        assert not hasattr(token, "frame")          # the token's bytes are not kept anywhere
        [answer] = conn.receive_broker(framed(b"server-token"))
        assert isinstance(answer, SaslTokenPassed) and answer.direction == "broker"
    assert not conn.in_raw_sasl
    [meta] = conn.receive_client(request_bytes(3, 12, 2, topics=None))
    assert isinstance(meta, RequestReceived) and meta.request.body.topics is None


def test_sasl_v0_unknown_mechanism_ends_at_first_real_request():
    conn = Connection()
    sasl_v0_handshake(conn, "GSSAPI")
    for token in (b"\x60\x82kerberos-ish", b"\x05\x04more"):
        assert isinstance(conn.receive_client(framed(token))[0], SaslTokenPassed)
        assert isinstance(conn.receive_broker(framed(b"reply"))[0], SaslTokenPassed)
    [meta] = conn.receive_client(request_bytes(3, 9, 5, topics=None))
    assert isinstance(meta, RequestReceived) and not conn.in_raw_sasl


def test_sasl_v0_unknown_mechanism_ends_at_a_request_header_even_if_its_body_is_odd():
    conn = Connection()
    sasl_v0_handshake(conn, "GSSAPI")
    # Metadata v12 whose header tagged-field count is padded (80 00): the broker takes it,
    # kproxy's strict codec does not.
    odd_metadata = framed(struct.pack(">hhih", 3, 12, 5, 4) + b"test" + b"\x80\x00" + b"\x00\x00\x00\x00")
    [meta] = conn.receive_client(odd_metadata)
    assert isinstance(meta, RequestReceived) and meta.request is None and not conn.in_raw_sasl


def test_failed_sasl_handshake_stays_in_kafka_mode():
    conn = Connection()
    conn.receive_client(request_bytes(17, 0, 1, mechanism="NOPE"))
    conn.receive_broker(response_bytes(17, 0, 1, error_code=33, mechanisms=["PLAIN"]))
    assert not conn.in_raw_sasl


def test_oversized_and_negative_frames_are_refused():
    conn = Connection(max_frame_size=1024)
    with pytest.raises(FrameTooLarge, match="2000 bytes"):
        conn.receive_client(struct.pack(">i", 2000))
    with pytest.raises(FrameTooLarge):
        Connection().receive_broker(struct.pack(">i", -5))


def test_garbage_request_is_reported_not_raised():
    conn = Connection()
    [short] = conn.receive_client(framed(b"\x00\x03"))
    assert isinstance(short, MalformedFrame)
    [bad] = conn.receive_client(framed(b"\x00\x03\x00\x0c\x00\x00\x00\x07\xff\xfe"))
    assert isinstance(bad, RequestReceived) and bad.request is None
    assert "client_id" in str(bad.decode_error) or "truncated" in str(bad.decode_error)


def test_unknown_api_version_is_opaque_but_paired():
    conn = Connection()
    frame = framed(struct.pack(">hhih", 3, 99, 42, 2) + b"me" + b"\x01\x02\x03")
    [req] = conn.receive_client(frame)
    assert req.request.is_opaque and req.request.client_id == "me"
    [resp] = conn.receive_broker(framed(struct.pack(">i", 42) + b"future"))
    assert resp.response.is_opaque and resp.response.body.data == b"future"


def test_api_versions_unsupported_version_fallback():
    """A broker answers too-new ApiVersions with header v0 and a v0 body carrying error 35."""
    conn = Connection()
    conn.receive_client(framed(struct.pack(">hhih", 18, 5, 7, 1) + b"c" + b"\x00\x00"))
    body_v0 = struct.pack(">hi", 35, 1) + struct.pack(">hhh", 18, 0, 3)
    [resp] = conn.receive_broker(framed(struct.pack(">i", 7) + body_v0))
    decoded = resp.response
    assert decoded.body.error_code == 35 and decoded.body_version == 0
    assert decoded.body.api_keys[0].max_version == 3
    from kproxy.protocol import encode_response
    assert encode_response(decoded, 18, 5) == bytes(resp.frame)


def relay_stream(cuts, hold_keys, transform_to=None):
    """Requests for several APIs, their responses chunked by ``cuts``; returns (output, expected)."""
    plan = [(3, 12), (1, 12), (18, 3), (3, 9), (1, 11), (10, 3), (18, 3), (3, 12)]
    client = b"".join(request_bytes(k, v, i) for i, (k, v) in enumerate(plan))
    responses = [response_bytes(k, v, i) for i, (k, v) in enumerate(plan)]
    broker = b"".join(responses)

    def transform(event):
        if transform_to is None:
            return None
        return struct.pack(">i", event.correlation_id) + transform_to

    conn = Connection(hold=lambda k, v: k in hold_keys, transform=transform)
    conn.receive_client(client)
    out, pos, i = [], 0, 0
    while pos < len(broker):
        cut = cuts[i % len(cuts)]
        events, chunks = conn.relay_broker(broker[pos:pos + cut])
        out += chunks
        pos += cut
        i += 1
    expected = b"".join(
        framed(struct.pack(">i", i) + transform_to) if (k in hold_keys and transform_to is not None) else r
        for i, ((k, _), r) in enumerate(zip(plan, responses)))
    return b"".join(bytes(c) for c in out), expected, conn


@settings(max_examples=150, deadline=None)
@given(cuts=st.lists(st.integers(1, 300), min_size=1, max_size=12),
       hold_keys=st.sets(st.sampled_from([1, 3, 10, 18])),
       replace=st.booleans())
def test_relay_broker_forwards_every_byte_and_replaces_only_held_frames(cuts, hold_keys, replace):
    output, expected, conn = relay_stream(cuts, hold_keys, b"REWRITTEN" if replace else None)
    assert output == expected
    assert conn.in_flight == 0


def test_relay_broker_passes_unheld_bytes_before_the_frame_completes():
    conn = Connection(hold=lambda k, v: k == 3, transform=lambda e: None)
    conn.receive_client(request_bytes(1, 12, 1) + request_bytes(3, 12, 2))
    fetch, meta = response_bytes(1, 12, 1), response_bytes(3, 12, 2)
    events, out = conn.relay_broker(fetch[:10])
    assert events == [] and b"".join(out) == fetch[:10]        # cut-through: no waiting for the rest
    events, out = conn.relay_broker(fetch[10:] + meta[:8])
    assert len(events) == 1 and b"".join(out) == fetch[10:]    # the Metadata response is held back
    events, out = conn.relay_broker(meta[8:])
    assert b"".join(out) == meta and events[0].api_key == 3


def test_relay_broker_without_holds_returns_the_chunk_itself():
    conn = Connection()
    conn.receive_client(request_bytes(18, 3, 1))
    chunk = response_bytes(18, 3, 1)
    events, out = conn.relay_broker(chunk)
    assert out[0] is chunk and len(events) == 1


def test_large_held_frames_pass_unchanged_without_copying_the_payload():
    from kproxy.protocol.framer import ZERO_COPY_FRAME_BYTES
    from kproxy.protocol.record_encoder import build_batch
    from kproxy.protocol.records import Record

    batch = build_batch([Record(0, 0, None, b"x" * (2 * ZERO_COPY_FRAME_BYTES), ())], "none")
    fetch = response_bytes(1, 16, 1, responses=[Struct(partitions=[
        Struct(partition_index=0, records=batch)])])
    conn = Connection(hold=lambda k, v: k == 1, transform=lambda e: None)
    conn.receive_client(request_bytes(1, 16, 1))
    out = []
    for pos in range(0, len(fetch), 50_000):              # arrives in pieces, held until complete
        out += conn.relay_broker(fetch[pos:pos + 50_000])[1]
    assert b"".join(bytes(c) for c in out) == fetch
    assert any(isinstance(c, memoryview) and len(c) >= 2 * ZERO_COPY_FRAME_BYTES for c in out)
