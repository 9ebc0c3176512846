"""Partial decoding (``skim``) against whole decoding, for every Produce and Fetch version.

Two promises: every field a partial body has, it has with the whole body's value
(and the error codes and records the metrics read are all there); and a frame the
partial reader accepts, the whole reader accepts (so ``partial`` is None exactly
when ``request``/``response`` is).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from kproxy.protocol import (DecodeError, Request, Response, Struct, decode_request, decode_response,
                             encode_request, encode_response, schema)
from kproxy.protocol.connection import Connection
from kproxy.protocol.record_encoder import build_batch
from kproxy.protocol.records import Record, count_batches, iter_batches, CODEC_NAMES
from kproxy.protocol.skim import SKIMMED, skim_request, skim_response
from kproxy.protocol.walk import error_codes
from tests.protocol.mutations import mutate
from tests.protocol.samples import every_message, sample_body
from tests.soak import run_for

SKIMMED_MESSAGES = [(kind, key, v) for kind, key, v in every_message() if (kind, key) in SKIMMED]
SETTINGS = settings(max_examples=60, deadline=None)


def frame_of(kind: str, api_key: int, version: int, body: Struct) -> bytes:
    if kind == "request":
        return encode_request(Request(api_key, version, 9, "skim-test", body))
    return encode_response(Response(9, body), api_key, version)


def decoded(kind: str, api_key: int, version: int, frame):
    """(whole, partial), or DecodeError raised by either."""
    if kind == "request":
        return decode_request(frame), skim_request(frame)
    return decode_response(frame, api_key, version), skim_response(frame, api_key, version)


def assert_part_of(partial, whole, path="body") -> None:
    """Every field of ``partial`` is in ``whole`` with the same value (structs recursively)."""
    if isinstance(partial, Struct):
        assert isinstance(whole, Struct), path
        for name, value in partial.fields().items():
            assert name in whole.__dict__, f"{path}.{name} is not in the whole body"
            assert_part_of(value, whole.__dict__[name], f"{path}.{name}")
    elif isinstance(partial, list):
        assert isinstance(whole, list) and len(partial) == len(whole), path
        for i, (a, b) in enumerate(zip(partial, whole)):
            assert_part_of(a, b, f"{path}[{i}]")
    elif isinstance(partial, memoryview):
        assert bytes(partial) == bytes(whole), path
    else:
        assert partial == whole, path


def kept_names(body: Struct) -> set[str]:
    names = set()
    for name, value in body.fields().items():
        names.add(name)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, Struct):
                names |= kept_names(item)
    return names


def test_every_produce_and_fetch_version_is_covered():
    versions = {(kind, key): set() for kind, key in SKIMMED}
    for kind, key, v in SKIMMED_MESSAGES:
        versions[kind, key].add(v)
    for (kind, key), seen in versions.items():
        spec = (schema.REQUESTS if kind == "request" else schema.RESPONSES)[key]
        assert seen == set(range(spec.versions[0], spec.versions[1] + 1))


@pytest.mark.parametrize("kind,api_key,version", SKIMMED_MESSAGES)
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), width=st.integers(0, 3))
def test_partial_body_agrees_with_the_whole_body(kind, api_key, version, seed, width):
    frame = frame_of(kind, api_key, version, sample_body(kind, api_key, version, seed=seed, width=width))
    whole, partial = decoded(kind, api_key, version, frame)
    assert (partial.correlation_id, partial.header_version, partial.trailing) == \
        (whole.correlation_id, whole.header_version, whole.trailing)
    if kind == "request":
        assert partial.client_id == whole.client_id
    else:
        assert partial.body_version == whole.body_version
    assert_part_of(partial.body, whole.body)
    assert sorted(error_codes(kind, api_key, version, partial.body)) == \
        sorted(error_codes(kind, api_key, version, whole.body))
    assert SKIMMED[kind, api_key] & kept_names(whole.body) <= kept_names(partial.body)


# Fields of each message nobody reads, which a partial body must leave out (where the version has them).
UNREAD = {("request", 0): {"transactional_id", "timeout_ms", "index"},   # acks: policy rules read it
          ("response", 0): {"base_offset", "log_append_time_ms", "log_start_offset", "record_errors",
                            "error_message"},
          ("request", 1): {"min_bytes", "session_id", "current_leader_epoch",    # max_wait_ms, max_bytes: policy
                           "last_fetched_epoch", "log_start_offset", "partition_max_bytes", "rack_id"},
          ("response", 1): {"session_id", "log_start_offset", "aborted_transactions", "preferred_read_replica"},
          ("response", 18): {"api_keys", "api_key"}}     # (its tagged fields are decoded whole)


@pytest.mark.parametrize("kind,api_key,version", SKIMMED_MESSAGES)
def test_partial_bodies_leave_out_what_nobody_reads(kind, api_key, version):
    whole, partial = decoded(kind, api_key, version,
                             frame_of(kind, api_key, version, sample_body(kind, api_key, version, width=2)))
    unread = UNREAD[kind, api_key] & kept_names(whole.body)
    assert not unread & kept_names(partial.body)


CORPUS = [(kind, key, v, frame_of(kind, key, v, sample_body(kind, key, v, seed=seed, width=2)))
          for kind, key, v in SKIMMED_MESSAGES for seed in range(2)]


@settings(max_examples=600, deadline=None)
@given(index=st.integers(0, len(CORPUS) - 1), seed=st.integers(0, 2**32 - 1), rounds=st.integers(1, 4),
       as_view=st.booleans())
def test_a_frame_the_partial_reader_accepts_decodes_whole(index, seed, rounds, as_view):
    kind, api_key, version, frame = CORPUS[index]
    mutant = mutate(random.Random(seed), frame, rounds)
    data = memoryview(mutant) if as_view else mutant
    skim = skim_request if kind == "request" else (lambda f: skim_response(f, api_key, version))
    try:
        partial = skim(data)
    except DecodeError:
        return                                   # stricter than the whole reader is allowed
    whole = decode_request(data) if kind == "request" else decode_response(data, api_key, version)
    assert_part_of(partial.body, whole.body)


def test_events_fall_back_to_whole_decoding_and_agree_on_failure():
    """``partial`` of an event is None exactly when ``request``/``response`` is."""
    rng = random.Random(12)
    checked = failed = 0
    for kind, api_key, version, frame in CORPUS:
        if kind != "request":
            continue
        for _ in range(30):
            mutant = mutate(rng, frame, 1)
            if len(mutant) < 8 or mutant[:4] != frame[:4]:
                continue
            try:
                events = Connection().receive_client(len(mutant).to_bytes(4, "big") + mutant)
            except DecodeError:
                continue                         # the tracker refuses what the broker cannot pair
            if len(events) != 1 or not hasattr(events[0], "partial"):
                continue                         # a malformed frame event: no body to decode
            partial = events[0].partial
            assert (partial is None) == (events[0].request is None)
            checked += 1
            failed += partial is None
    assert checked > 100 and 0 < failed < checked


def batches(rng: random.Random) -> bytes:
    out = b""
    for i in range(rng.randint(0, 4)):
        codec = rng.choice(["none", "gzip", "lz4", "zstd", "snappy"])
        magic = rng.choice([2, 2, 2, 1, 0])
        records = [Record(0, 1_700_000_000_000, b"k", rng.randbytes(rng.randint(0, 50)), ())
                   for _ in range(rng.randint(1, 5))]
        out += build_batch(records, codec if magic == 2 or codec in ("none", "gzip", "snappy", "lz4") else "none",
                           magic=magic, base_offset=10 * i)
    return out


def walked(data) -> tuple[int, int, dict]:
    """What the metrics counted by walking ``iter_batches`` before ``count_batches``."""
    nbytes = count = 0
    by_codec = dict.fromkeys(CODEC_NAMES, 0)
    try:
        for batch in iter_batches(data):
            nbytes += batch.size_bytes
            by_codec[batch.compression] += 1
            count += batch.record_count or 0
    except DecodeError:
        pass
    return nbytes, count, by_codec


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rounds=st.integers(0, 3))
def test_count_batches_counts_what_walking_the_batches_counts(seed, rounds):
    rng = random.Random(seed)
    data = batches(rng)
    if rounds and data:
        data = mutate(rng, data, rounds)
    by_codec = dict.fromkeys(CODEC_NAMES, 0)
    nbytes, count = count_batches(memoryview(data), by_codec)
    assert (nbytes, count, by_codec) == walked(data)


def test_decode_error_of_produce_and_fetch_needs_no_whole_decode(monkeypatch):
    """kproxy's decode-failure log asks every event's ``decode_error``: for Produce and Fetch
    the partial decode answers it (the whole decoders are never called), as it answers for
    the metrics."""
    import kproxy.protocol.events as events_module

    def whole(*args):
        raise AssertionError("decoded whole")

    monkeypatch.setattr(events_module, "decode_request", whole)
    monkeypatch.setattr(events_module, "decode_response", whole)
    for kind, api_key, version, frame in CORPUS:
        if kind != "request" or (api_key == 0 and decode_request(frame).body.acks == 0):
            continue
        conn = Connection()
        requests = conn.receive_client(len(frame).to_bytes(4, "big") + frame)
        answer = frame_of("response", api_key, version, sample_body("response", api_key, version))
        responses = conn.receive_broker(len(answer).to_bytes(4, "big") + answer)
        assert [e.decode_error for e in requests + responses] == [None, None]


def _uvarint_reference(buf, pos):
    """Kafka's unsigned varint read plainly: the first byte under 0x80 ends it (not a 0 after
    others), at most 5 bytes, at most 32 bits."""
    for length in range(1, 6):
        last = buf[pos + length - 1]                     # IndexError when cut short
        if last < 0x80:
            if last == 0 and length > 1:
                raise DecodeError("non-minimal varint")
            value = sum((buf[pos + i] & 0x7F) << (7 * i) for i in range(length))
            if value > 0xFFFFFFFF:
                raise DecodeError("varint above 32 bits")
            return value, pos + length
    raise DecodeError("varint longer than 5 bytes")


@settings(max_examples=3000, deadline=None)
@given(data=st.one_of(st.binary(min_size=1, max_size=3), st.binary(min_size=1, max_size=7)))
def test_unrolled_varints_read_as_the_loop_does(data):
    from kproxy.protocol._codec import read_uvarint

    def outcome(read):
        try:
            return read(data, 0)
        except (DecodeError, IndexError) as exc:
            return type(exc)
    assert outcome(read_uvarint) == outcome(_uvarint_reference)


@pytest.mark.soak
def test_soak_partial_decoding(soak_seconds):
    """The mutation property above, batch after batch, for ``--soak-seconds``."""
    batches = run_for(soak_seconds, test_a_frame_the_partial_reader_accepts_decodes_whole)
    print(f"partial decoding soak: {batches} batches")
