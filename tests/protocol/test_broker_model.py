"""The tracker's pairing against a small reference model of what a Kafka 4.4 broker does.

The model reads each request the way the broker's Java code does (written here in the
shape of Kafka's own readers, independently of ``kproxy.protocol.connection``): it
answers, stays silent (Produce acks=0), or closes the connection. Hypothesis builds
request streams with padded and random varints, acks=0, unknown versions and garbage,
lets the model answer them, and feeds both byte streams to the tracker interleaved in
reads of arbitrary sizes. The tracker must pair every answer with the request the model
answered, hold every address-bearing answer until it is whole, refuse (raise) exactly
where the broker would refuse a Produce before its acks, and never pass a byte of a
response that answers nothing.

The model's rules were checked against a real 4.4 broker; tests/proxy/test_wire_hardening.py
keeps the cases that decide them.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from kproxy.protocol import Request, encode_request, new_body
from kproxy.protocol.connection import Connection
from kproxy.protocol.errors import ProtocolViolation, UnpairedResponse, UntrackableRequest
from kproxy.protocol.events import ResponseReceived
from tests.protocol.frames import framed, uvarint
from tests.soak import run_for

METADATA, PRODUCE, API_VERSIONS = 3, 0, 18
HELD = METADATA                   # the address-bearing API of these streams
MARKER = b"REWRITTEN"             # what the stand-in rewrite turns a held answer into

# What the model broker does with one request.
ANSWER = "answer"
SILENT = "silent"                 # Produce acks=0
REFUSED_BEFORE_ACKS = "refused before acks"    # the tracker must refuse it too
CLOSE = "close"                   # the broker closes; the tracker cannot know, must not refuse
UNKNOWN_REST = "unknown rest"     # topics the model does not parse: the stream ends here
WHATEVER = "whatever"             # version 4.4 removed: the broker closes, refusing is fine too


class JavaRefuses(Exception):
    """Where the broker's parser throws (it then closes the connection)."""


def java_int(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


class Accessor:
    """The broker's ByteBufferAccessor over one request."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def get(self) -> int:
        if self.pos >= len(self.data):
            raise JavaRefuses("buffer underflow")
        self.pos += 1
        return self.data[self.pos - 1]

    def read_short(self) -> int:
        value = self.get() << 8 | self.get()
        return value - (1 << 16) if value >= 1 << 15 else value

    def read_int(self) -> int:
        return java_int(self.get() << 24 | self.get() << 16 | self.get() << 8 | self.get())

    def read_unsigned_varint(self) -> int:
        # ByteUtils.readUnsignedVarint, in its loop form: continuation bytes while the high
        # bit is set, too long once seven bits more would pass 28; the last byte's bits
        # shift past bit 31 and are lost (a Java int).
        value, shift = 0, 0
        while True:
            b = self.get()
            if not b & 0x80:
                return java_int(value | b << shift)
            value |= (b & 0x7F) << shift
            shift += 7
            if shift > 28:
                raise JavaRefuses("varint too long")

    def read_string(self, length: int) -> None:
        if length > self.remaining():
            raise JavaRefuses("string past the end")
        self.pos += length

    def read_nullable_string(self, compact: bool) -> None:
        length = java_int(self.read_unsigned_varint() - 1) if compact else self.read_short()
        if length < 0:
            return
        if length > 0x7FFF:
            raise JavaRefuses("string too long")
        self.read_string(length)

    def read_tagged_fields(self) -> None:
        count = self.read_unsigned_varint()
        if count < 0 or count > self.remaining() or count > 10_000:
            raise JavaRefuses("bad tagged field count")
        for _ in range(count):
            self.read_unsigned_varint()
            size = self.read_unsigned_varint()
            if size < 0 or size > self.remaining():
                raise JavaRefuses("bad tagged field size")
            self.pos += size


# The 4.4 broker's versions for the APIs in these streams, and their first flexible version.
SUPPORTED = {PRODUCE: (3, 13), METADATA: (0, 13), API_VERSIONS: (0, 4)}
FIRST_FLEXIBLE = {PRODUCE: 9, METADATA: 9, API_VERSIONS: 3}
KPROXY_PRODUCE_VERSIONS = (0, 13)


def broker_outcome(frame: bytes) -> str:
    """What the model broker does with one request frame (size prefix excluded)."""
    if len(frame) < 8:
        return CLOSE
    acc = Accessor(frame)
    api_key, version = acc.read_short(), acc.read_short()
    acc.read_int()
    if api_key == PRODUCE and not KPROXY_PRODUCE_VERSIONS[0] <= version <= KPROXY_PRODUCE_VERSIONS[1]:
        return REFUSED_BEFORE_ACKS          # a version kproxy cannot read: it refuses, 4.4 closes
    if api_key not in SUPPORTED:
        return CLOSE
    lo, hi = SUPPORTED[api_key]
    if not lo <= version <= hi:
        if api_key == API_VERSIONS and version > hi:
            return ANSWER                   # answered in v0 with UNSUPPORTED_VERSION
        return WHATEVER if api_key == PRODUCE else CLOSE
    flexible = version >= FIRST_FLEXIBLE[api_key]
    try:
        acc.read_nullable_string(compact=False)                  # client_id
        if flexible:
            acc.read_tagged_fields()
        if api_key != PRODUCE:
            return ANSWER                   # the bodies generated below are valid
        acc.read_nullable_string(compact=flexible)                # transactional_id
        acks = acc.read_short()
    except JavaRefuses:
        return CLOSE if api_key != PRODUCE else REFUSED_BEFORE_ACKS
    try:
        acc.read_int()                                            # timeout_ms
        topics = java_int(acc.read_unsigned_varint() - 1) if flexible else acc.read_int()
        if topics < 0:
            return CLOSE
        if topics > 0:
            return UNKNOWN_REST
        if flexible:
            acc.read_tagged_fields()
    except JavaRefuses:
        return CLOSE
    return SILENT if acks == 0 else ANSWER


# ---------------------------------------------------------------- streams

@st.composite
def varints(draw, value: int) -> bytes:
    """``value`` encoded minimally or padded up to five bytes, or (one in twenty) random bytes."""
    if draw(st.integers(0, 19)) == 0:
        return draw(st.binary(min_size=1, max_size=6))
    return uvarint(value, draw(st.integers(0, 5 - len(uvarint(value)))))


@st.composite
def tagged_fields(draw) -> bytes:
    fields = draw(st.lists(st.binary(max_size=3), max_size=2))
    out = draw(varints(len(fields)))
    for i, data in enumerate(fields):
        out += draw(varints(i)) + draw(varints(len(data))) + data
    return out


@st.composite
def produce_frames(draw) -> bytes:
    version = draw(st.sampled_from([3, 5, 8, 9, 9, 11, 12, 13, 13, 13, 13, 2, 14]))
    flexible = version >= 9
    correlation_id = draw(st.integers(0, 3))
    client_id = draw(st.sampled_from([b"", b"app", None]))
    out = struct.pack(">hhi", PRODUCE, version, correlation_id)
    out += struct.pack(">h", -1) if client_id is None else struct.pack(">h", len(client_id)) + client_id
    if flexible:
        out += draw(tagged_fields())
    if version >= 3:
        transactional_id = draw(st.sampled_from([None, b"tx"]))
        if flexible:
            out += draw(varints(0 if transactional_id is None else len(transactional_id) + 1))
        else:
            out += struct.pack(">h", -1 if transactional_id is None else len(transactional_id))
        out += transactional_id or b""
    out += struct.pack(">h", draw(st.sampled_from([0, 0, 1, -1, 2])))
    rest = struct.pack(">i", 1000)
    rest += draw(varints(1)) + draw(tagged_fields()) if flexible else struct.pack(">i", 0)
    rest += draw(st.sampled_from([b"", b"", b"junk", b"records" * 20]))   # long ones get streamed
    if draw(st.integers(0, 9)) == 0:                       # cut anywhere
        return framed((out + rest)[:draw(st.integers(0, len(out) + len(rest)))])
    return framed(out + rest)


@st.composite
def other_frames(draw) -> bytes:
    kind = draw(st.sampled_from(["metadata"] * 3 + ["padded metadata"] * 3 + ["api versions"] * 3
                                + ["future api versions", "unknown api", "short"]))
    correlation_id = draw(st.integers(0, 3))
    if kind in ("metadata", "padded metadata"):
        version = draw(st.sampled_from([1, 9, 12, 13]))
        payload = encode_request(Request(METADATA, version, correlation_id, "app",
                                         new_body("request", METADATA, version, topics=None)))
        if kind == "padded metadata" and version >= 9:     # header tagged count 00 -> 80 00
            at = 8 + 2 + 3
            payload = payload[:at] + b"\x80" + payload[at:]
        return framed(payload)
    if kind == "api versions":
        return framed(encode_request(Request(API_VERSIONS, 3, correlation_id, "app",
                                             new_body("request", API_VERSIONS, 3))))
    if kind == "future api versions":
        return framed(struct.pack(">hhih", API_VERSIONS, 77, correlation_id, 1) + b"a\x00")
    if kind == "unknown api":
        return framed(struct.pack(">hhih", 999, 0, correlation_id, 1) + b"a")
    return framed(draw(st.binary(max_size=7)))


def stray_response(correlation_id: int) -> bytes:
    return framed(struct.pack(">i", correlation_id) + b"answers nothing")


def transform(event: ResponseReceived) -> bytes:
    return struct.pack(">i", event.correlation_id) + MARKER


def response_for(frame: bytes, body: bytes) -> bytes:
    return framed(frame[4:8] + body)


def expected_output(frame: bytes, response: bytes) -> bytes:
    if struct.unpack_from(">h", frame)[0] == HELD:
        return framed(response[4:8] + MARKER)
    return response


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(st.one_of(produce_frames(), other_frames()), min_size=1, max_size=8),
       bodies=st.lists(st.one_of(st.binary(max_size=40), st.binary(min_size=200, max_size=400)),
                       min_size=8, max_size=8),
       reads=st.lists(st.tuples(st.booleans(), st.one_of(st.integers(1, 12), st.integers(1, 3000))),
                      max_size=40),
       stray_at=st.sampled_from([None] * 12 + [0, 1, 2, 3, 5, 8]),
       stream=st.sampled_from([None, 24, 64, 200]))
def test_tracker_pairs_as_the_broker_answers(requests, bodies, reads, stray_at, stream):
    """``stream``: frames this big and up are streamed (kproxy's is 16 MiB; small here so
    that these streams have some), which must change nothing of the pairing."""
    frames = [r[4:] for r in requests]
    # The model broker, request by request, until it closes.
    outcomes = []
    for frame in frames:
        outcomes.append(broker_outcome(frame))
        if outcomes[-1] not in (ANSWER, SILENT):
            break
    answered = [i for i, outcome in enumerate(outcomes) if outcome == ANSWER]
    event(f"broker: {len(answered)} answered, {outcomes.count(SILENT)} silent, then {outcomes[-1]}")
    # Its byte stream: each answer becomes available once its request has reached the tracker.
    client = b"".join(requests)
    request_ends = [sum(map(len, requests[:i + 1])) for i in range(len(requests))]
    responses = [(request_ends[i], response_for(frames[i], bodies[n])) for n, i in enumerate(answered)]
    expected = [expected_output(frames[i], r) for i, (_, r) in zip(answered, responses)]
    sizes = [len(r) for _, r in responses]
    pending_cids = {struct.unpack_from(">i", frames[i], 4)[0] for i in answered}
    stray_start = None
    if stray_at is not None:
        stray_at = min(stray_at, len(responses))
        after = responses[stray_at - 1][0] if stray_at else 0
        stray_cid = next(c for c in range(100, 200) if c not in pending_cids)
        responses.insert(stray_at, (after, stray_response(stray_cid)))
        stray_start = sum(len(r) for _, r in responses[:stray_at])
        expected = expected[:stray_at]           # nothing of the stray answer may pass, nor after it
    broker = b"".join(r for _, r in responses)
    broker_ready = []                            # broker bytes available once the client sent this much
    total = 0
    for ready_at, response in responses:
        total += len(response)
        broker_ready.append((ready_at, total))

    # Where a tracker fed one frame at a time first refuses a request.
    first_refused = None
    probe = Connection()
    for i, frame in enumerate(requests):
        try:
            probe.receive_client(frame)
        except UntrackableRequest:
            first_refused = i
            break
    stop = len(outcomes) - 1 if outcomes[-1] not in (ANSWER, SILENT) else None
    if stop is not None and first_refused is not None:
        assert first_refused >= stop, f"refused request {first_refused}, which the broker handles"
    if stop is not None and outcomes[stop] == REFUSED_BEFORE_ACKS:
        assert first_refused == stop, "the broker refuses this Produce before acks; the tracker did not"
    elif stop is not None and outcomes[stop] != WHATEVER:
        assert first_refused != stop, f"the broker reads acks of request {stop}; the tracker refused it"
    if stop is None:
        assert first_refused is None

    conn = Connection(hold=lambda key, version: key == HELD, transform=transform,
                      stream_frame_bytes=stream)
    forwarded = bytearray()
    paired = []
    sent = received = 0
    want = b"".join(expected)

    # The broker side keeps an answer's start until its correlation id is in, a held answer
    # whole, and of any other only what is under the streaming threshold.
    held_answers = [len(r) for i, (_, r) in zip(answered, responses) if frames[i][:2] == b"\0\3"]
    broker_bound = max([8, *held_answers, (stream or 1 << 30) + 3])

    def available() -> int:
        return max((end for ready_at, end in broker_ready if ready_at <= sent), default=0)

    def step(from_client: bool, size: int) -> None:
        nonlocal sent, received
        if from_client and sent < len(client):
            chunk = client[sent:sent + size]
            sent += len(chunk)
            conn.receive_client(chunk)
        elif available() > received:
            chunk = broker[received:min(available(), received + size)]
            received += len(chunk)
            events, out = conn.relay_broker(chunk)
            forwarded.extend(b"".join(bytes(c) for c in out))
            paired.extend(e for e in events if isinstance(e, ResponseReceived))
            assert conn.buffered - conn.client_partial <= broker_bound, "kept an answer it streams"
            assert want.startswith(bytes(forwarded)), "forwarded bytes that the client must not see"

    try:
        for from_client, size in reads:
            step(from_client, size)
        while sent < len(client) or received < available():
            step(sent < len(client), 1 << 20)
    except UnpairedResponse:
        event("tracker refused a response")
        assert stray_at is not None, "refused an answer the broker gave in order"
        assert received >= stray_start + 8, "refused before the stray answer's correlation id came"
        assert want.startswith(bytes(forwarded))
        return
    except UntrackableRequest:
        event("tracker refused a request")
        assert first_refused is not None and sent >= request_ends[first_refused]
        assert want.startswith(bytes(forwarded))
        return
    except ProtocolViolation as exc:                         # pragma: no cover - a bug
        raise AssertionError(f"unexpected {exc!r}") from None
    assert first_refused is None, "the tracker took a request it refuses when fed alone"
    assert stray_at is None, "a response that answers nothing was passed on"
    assert bytes(forwarded) == want
    assert [(frames[i] if not e.request_event.streamed else frames[i][:len(e.request_event.frame)],
             len(frames[i]) + 4) for e, i in zip(paired, answered)] == \
        [(bytes(e.request_event.frame), e.request_event.size) for e in paired]
    assert [e.size for e in paired] == sizes
    for e in paired:
        assert not (e.streamed and e.api_key == HELD), "an address-bearing answer was streamed"
        if stream is not None and e.size >= stream + 4 and e.api_key != HELD:
            assert e.streamed
    event(f"streamed: {sum(e.streamed for e in paired)} answers, "
          f"{sum(e.request_event.streamed for e in paired)} requests")


@pytest.mark.soak
def test_soak_tracker_pairs_as_the_broker_answers(soak_seconds):
    """The property above, batch after batch of new streams, for ``--soak-seconds``."""
    batches = run_for(soak_seconds, test_tracker_pairs_as_the_broker_answers)
    print(f"tracker soak: {batches} batches of the broker model")
