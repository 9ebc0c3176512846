"""Every (API, version, request|response) in the schema: encode → decode → re-encode is identical."""

import pytest
from hypothesis import given, settings, strategies as st

from kproxy.protocol import (Request, Response, decode_request, decode_response,
                             encode_request, encode_response, schema)
from tests.protocol.samples import every_message, sample_body

MESSAGES = list(every_message())


def roundtrip(kind, api_key, version, body, correlation_id=123):
    if kind == "request":
        frame = encode_request(Request(api_key, version, correlation_id, "client-ü", body))
        decoded = decode_request(frame)
        assert (decoded.api_key, decoded.api_version, decoded.correlation_id) == (api_key, version, correlation_id)
        header_v0 = schema.request_header_version(api_key, version) == 0
        assert decoded.client_id == (None if header_v0 else "client-ü")
        again = encode_request(decoded)
    else:
        frame = encode_response(Response(correlation_id, body), api_key, version)
        decoded = decode_response(frame, api_key, version)
        assert decoded.correlation_id == correlation_id
        again = encode_response(decoded, api_key, version)
    assert not decoded.is_opaque
    assert again == frame
    return decoded


def test_schema_covers_every_api_from_kafka_0_8_to_4_x():
    assert len(schema.REQUESTS) >= 95
    assert schema.version_range(0) == (0, 13)      # Produce v0-2 came back from the 3.9 line
    assert schema.version_range(1)[0] == 0          # Fetch v0
    assert schema.version_range(4) == (0, 7)        # LeaderAndIsr: 3.x only
    assert schema.api_name(74) == "ListConfigResources"
    assert len(MESSAGES) > 700


@pytest.mark.parametrize("kind,api_key,version", MESSAGES,
                         ids=[f"{schema.api_name(k)}-{kind}-v{v}" for kind, k, v in MESSAGES])
def test_every_message_version_round_trips(kind, api_key, version):
    body = sample_body(kind, api_key, version)
    decoded = roundtrip(kind, api_key, version, body)
    assert decoded.body == body


@pytest.mark.parametrize("kind,api_key,version", MESSAGES[::7])
def test_defaults_round_trip(kind, api_key, version):
    from kproxy.protocol import new_body
    body = new_body(kind, api_key, version)
    assert roundtrip(kind, api_key, version, body).body == body


COMMON = [("request", 0), ("response", 0), ("request", 1), ("response", 1), ("request", 3),
          ("response", 3), ("response", 10), ("request", 11), ("response", 18), ("response", 60),
          ("request", 8), ("response", 9), ("request", 2)]


@settings(max_examples=300, deadline=None)
@given(which=st.sampled_from(COMMON), seed=st.integers(0, 2**32), width=st.integers(0, 3),
       version_pick=st.floats(0, 1))
def test_common_apis_round_trip_with_random_values(which, seed, width, version_pick):
    kind, api_key = which
    lo, hi = schema.version_range(api_key)
    version = lo + int(version_pick * (hi - lo))
    body = sample_body(kind, api_key, version, seed=seed, width=width)
    assert roundtrip(kind, api_key, version, body).body == body


def test_trailing_bytes_after_the_body_are_kept_like_kafka_ignores_them():
    """librdkafka 2.16's all-topics Metadata v13 request carries 3 stray bytes after the body
    (captured through kproxy); Kafka's broker ignores them, so the codec must not refuse it."""
    frame = bytes.fromhex("0003000d00000003000772646b61666b610000000000010000")
    request = decode_request(frame)
    assert request.client_id == "rdkafka" and request.body.topics is None
    assert len(request.trailing) == 3
    assert encode_request(request) == frame
