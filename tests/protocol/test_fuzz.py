"""Fuzzing the codec: whatever the bytes, decoding raises DecodeError or succeeds, and a
frame that decodes re-encodes to exactly the same bytes.

Two kinds of input: random bytes (with and without a plausible request header),
and valid frames for every message version in the schema, mutated (bit flips,
truncation, insertions, deletions, int16/int32 length fields set to huge or
negative values, over-long and out-of-range varints spliced in). Hypothesis
explores and shrinks (~2000 examples); a seeded plain loop does 20k mutations
cheaply.

Any other exception, from decoding or from re-encoding what decoded, and any
re-encoding that differs from the input, is a codec bug.
"""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from kproxy.protocol import (DecodeError, Request, Response, decode_request, decode_response,
                             encode_request, encode_response, schema)
from kproxy.protocol.record_encoder import _uvarint  # a tagged-field block: uvarint count, tag, size
from tests.protocol.mutations import mutate
from tests.protocol.samples import every_message, sample_body
from tests.soak import run_for

KNOWN_KEYS = sorted(schema.REQUESTS)
FUZZ_SETTINGS = dict(deadline=None, database=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ------------------------------------------------------------ the property

def check_request(frame) -> bool:
    """Decode a request frame; True if it decoded (and then re-encoded identically)."""
    try:
        request = decode_request(frame)
    except DecodeError:
        return False
    again = encode_request(request)
    assert again == bytes(frame), f"request re-encodes differently: {bytes(frame).hex()}"
    return True


def check_response(frame, api_key: int, api_version: int) -> bool:
    try:
        response = decode_response(frame, api_key, api_version)
    except DecodeError:
        return False
    again = encode_response(response, api_key, api_version)
    assert again == bytes(frame), \
        f"response ({api_key}, v{api_version}) re-encodes differently: {bytes(frame).hex()}"
    return True


# ------------------------------------------------------------ corpus of valid frames

def _corpus():
    frames = []
    for i, (kind, api_key, version) in enumerate(every_message()):
        body = sample_body(kind, api_key, version, seed=i, width=1)
        if kind == "request":
            frames.append((kind, api_key, version,
                           encode_request(Request(api_key, version, i, "fuzz", body))))
        else:
            frames.append((kind, api_key, version,
                           encode_response(Response(i, body), api_key, version)))
    return frames


CORPUS = _corpus()


def test_corpus_covers_every_message_and_decodes():
    assert len(CORPUS) == len(list(every_message()))
    for kind, api_key, version, frame in CORPUS:
        if kind == "request":
            assert check_request(frame)
        else:
            assert check_response(frame, api_key, version)


# ------------------------------------------------------------ mutations

def check_mutant(rng: random.Random, kind, api_key, version, frame) -> bool:
    if kind == "request":
        return check_request(frame)
    if rng.random() < 0.2:
        # The connection tracker could pair a response with the wrong request.
        lo, hi = schema.RESPONSES[api_key].versions
        version = rng.randint(lo, hi + 1)
    return check_response(frame, api_key, version)


# ------------------------------------------------------------ hypothesis

request_headers = st.builds(
    lambda key, version, corr, cid: (key.to_bytes(2, "big", signed=True)
                                     + version.to_bytes(2, "big", signed=True)
                                     + corr.to_bytes(4, "big", signed=True) + cid),
    st.one_of(st.sampled_from(KNOWN_KEYS), st.integers(-32768, 32767)),
    st.integers(-1, 20),
    st.integers(-2**31, 2**31 - 1),
    st.sampled_from([b"", b"\xff\xff", b"\x00\x00", b"\x00\x01x", b"\x00\x05", b"\xff\xfe"]),
)


@settings(max_examples=300, **FUZZ_SETTINGS)
@given(frame=st.binary(max_size=300))
@example(frame=b"")
@example(frame=b"\x00\x12\x00\x03\x00\x00\x00\x01")
def test_random_bytes_as_request(frame):
    check_request(frame)


@settings(max_examples=300, **FUZZ_SETTINGS)
@given(header=request_headers, body=st.binary(max_size=300), as_view=st.booleans())
def test_random_body_behind_plausible_request_header(header, body, as_view):
    frame = header + body
    check_request(memoryview(frame) if as_view else frame)


@settings(max_examples=300, **FUZZ_SETTINGS)
@given(api_key=st.one_of(st.sampled_from(KNOWN_KEYS), st.integers(-32768, 32767)),
       api_version=st.integers(-2, 20), frame=st.binary(max_size=300), as_view=st.booleans())
@example(api_key=18, api_version=3, frame=b"\x00\x00\x00\x01\x00\x23", as_view=False)
def test_random_bytes_as_response(api_key, api_version, frame, as_view):
    check_response(memoryview(frame) if as_view else frame, api_key, api_version)


@settings(max_examples=800, **FUZZ_SETTINGS)
@given(index=st.integers(0, len(CORPUS) - 1), seed=st.integers(0, 2**32 - 1),
       rounds=st.integers(1, 4), as_view=st.booleans())
def test_mutated_valid_frames(index, seed, rounds, as_view):
    kind, api_key, version, frame = CORPUS[index]
    rng = random.Random(seed)
    mutant = mutate(rng, frame, rounds)
    check_mutant(rng, kind, api_key, version, memoryview(mutant) if as_view else mutant)


def _flexible_default_frames():
    """Frames of default-valued flexible bodies: their last byte is the body's empty tag block."""
    from kproxy.protocol import new_body
    frames = []
    for kind, api_key, version in every_message():
        spec = schema.REQUESTS[api_key] if kind == "request" else schema.RESPONSES[api_key]
        if not spec.is_flexible(version):
            continue
        body = new_body(kind, api_key, version)
        if kind == "request":
            frame = encode_request(Request(api_key, version, 1, "fuzz", body))
        else:
            frame = encode_response(Response(1, body), api_key, version)
        assert frame[-1] == 0
        frames.append((kind, api_key, version, frame))
    return frames


FLEXIBLE_DEFAULTS = _flexible_default_frames()

tag_numbers = st.one_of(st.integers(0, 4), st.sampled_from([127, 128, 2**31, 2**32 - 1, 2**32]),
                        st.integers(0, 2**35 - 1))
tag_entries = st.lists(st.tuples(tag_numbers, st.binary(max_size=24), st.integers(-1, 1)), max_size=4)


@settings(max_examples=300, **FUZZ_SETTINGS)
@given(index=st.integers(0, len(FLEXIBLE_DEFAULTS) - 1), entries=tag_entries)
@example(index=0, entries=[(2**32, b"", 0)])   # once decoded, then failed to re-encode (see below)
@example(index=0, entries=[(2**32 - 1, b"", 0), (0, b"\x00", 0)])
def test_random_tagged_field_blocks(index, entries):
    """Known and unknown tags with random payloads (and sizes a little off) in a body's tag block."""
    kind, api_key, version, frame = FLEXIBLE_DEFAULTS[index]
    block = bytearray(_uvarint(len(entries)))
    for tag, payload, size_error in entries:
        block += _uvarint(tag) + _uvarint(max(0, len(payload) + size_error)) + payload
    mutant = frame[:-1] + bytes(block)
    if kind == "request":
        check_request(mutant)
    else:
        check_response(mutant, api_key, version)


# ------------------------------------------------------------ plain seeded loop

LOOP_MUTATIONS = 20_000


def mutation_loop(seed: int, count: int) -> int:
    """``count`` mutants of the corpus from ``seed``, without hypothesis overhead; fails with
    every failure collected (and the seed, to replay them); returns how many decoded."""
    rng = random.Random(seed)
    failures = []
    decoded = 0
    for n in range(count):
        kind, api_key, version, frame = CORPUS[n % len(CORPUS)]
        mutant = mutate(rng, frame, rng.randint(1, 3))
        try:
            decoded += check_mutant(rng, kind, api_key, version, mutant)
        except Exception as exc:      # noqa: BLE001 - anything but DecodeError is the finding
            failures.append((schema.api_name(api_key), kind, version,
                             f"{type(exc).__name__}: {exc}"[:160], mutant.hex()[:200]))
    assert not failures, f"{len(failures)} of {count} mutants (seed {seed:#x}) broke the codec; " \
        "first: " + "\n".join(map(str, failures[:5]))
    return decoded


def test_seeded_mutation_loop():
    """20k mutations; collects every failure before reporting."""
    decoded = mutation_loop(0x6B70726F78, LOOP_MUTATIONS)
    # The mutants must not all be rejected outright, or the loop tests nothing past the header.
    assert decoded > LOOP_MUTATIONS // 50


@pytest.mark.soak
def test_soak_codec(soak_seconds):
    """The mutation loop from fresh seeds, and the hypothesis properties above batch after
    batch, for ``--soak-seconds`` in all (half each)."""
    deadline = time.monotonic() + soak_seconds / 2
    loops = 0
    while loops == 0 or time.monotonic() < deadline:
        assert mutation_loop(random.getrandbits(64), LOOP_MUTATIONS) > LOOP_MUTATIONS // 50
        loops += 1
    properties = (test_random_bytes_as_request, test_random_body_behind_plausible_request_header,
                  test_random_bytes_as_response, test_mutated_valid_frames, test_random_tagged_field_blocks)
    batches = run_for(soak_seconds / 2, lambda: [test() for test in properties])
    print(f"codec soak: {loops * LOOP_MUTATIONS:,} mutants, {batches} batches of the properties")


# ------------------------------------------------------------ found by fuzzing

@pytest.mark.parametrize("frame", [
    # Heartbeat v4 request, default body, one unknown tagged field numbered 2**32
    # (5-byte varint 80 80 80 80 10, size 0) in the body's tagged-field block.
    "000c000400000001000163" "00" "01000000000100" "01" "8080808010" "00",
])
def test_tag_number_beyond_32_bits_is_a_decode_error(frame):
    """Found by fuzzing: 5-byte varints up to 2**35-1 used to decode, so an unknown tag >= 2**32
    decoded and then could not be re-encoded. Kafka's varints are 32-bit: DecodeError now."""
    frame = bytes.fromhex(frame)
    check_request(frame)
    with pytest.raises(DecodeError, match="32 bits"):
        decode_request(frame)
