"""Large frames streamed through the tracker: only their header is kept, every byte still
passes, pairing is unchanged, and what observers get does not depend on how reads split."""

import struct

import pytest
from hypothesis import given, settings, strategies as st

from kproxy.protocol.connection import STREAM_HEAD_LIMIT, Connection
from kproxy.protocol.errors import UntrackableRequest
from kproxy.protocol.events import RequestReceived

from tests.protocol.frames import FakeClock, framed, produce, produce_v9, request_bytes, response_bytes, uvarint

STREAM = 512                  # the threshold in these tests: frames this big and up are streamed
BODY = bytes(range(256)) * 8  # 2 KiB of record-like payload


def big_produce(correlation_id, acks, version=9):
    """A Produce v9 with a long tail after acks (the records, as far as the tracker cares)."""
    return produce_v9(correlation_id, acks, rest=struct.pack(">i", 1000) + b"\x01\x00" + BODY)


def big_response(correlation_id):
    return framed(struct.pack(">i", correlation_id) + BODY)


def tracker(**kwargs):
    return Connection(stream_frame_bytes=STREAM, clock=kwargs.pop("clock", FakeClock()), **kwargs)


def feed_client(conn, data, cuts):
    events, held = [], 0
    pos = 0
    for cut in [*cuts, len(data)]:
        cut = min(max(cut, pos), len(data))
        if cut > pos:
            events += conn.receive_client(data[pos:cut])
            held = max(held, conn.client_partial)
            pos = cut
    return events, held


def feed_broker(conn, data, cuts):
    events, out, held = [], bytearray(), 0
    pos = 0
    for cut in [*cuts, len(data)]:
        cut = min(max(cut, pos), len(data))
        if cut > pos:
            got, chunks = conn.relay_broker(data[pos:cut])
            events += got
            out += b"".join(bytes(c) for c in chunks)
            held = max(held, conn.buffered)
            pos = cut
    return events, bytes(out), held


def describe(event):
    """What observers learn of an event, and nothing of how it arrived."""
    base = (type(event).__name__, event.api_key, event.api_version, event.correlation_id,
            event.size, event.streamed, bytes(event.frame))
    if isinstance(event, RequestReceived):
        return base + (event.expects_response,)
    return base


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(0, 3 * len(BODY)), max_size=20).map(sorted))
def test_streamed_requests_are_the_same_whatever_the_reads(cuts):
    stream = big_produce(1, acks=1) + request_bytes(18, 3, 2) + big_produce(3, acks=0) + big_produce(4, acks=-1)
    whole = [describe(e) for e in tracker().receive_client(stream)]
    conn = tracker()
    events, held = feed_client(conn, stream, cuts)
    assert [describe(e) for e in events] == whole
    assert [e.streamed for e in events] == [True, False, True, True]
    assert [e.correlation_id for e in events] == [1, 2, 3, 4]
    assert [e.expects_response for e in events] == [True, True, False, True]
    assert conn.in_flight == 3                        # the acks=0 Produce awaits nothing
    assert held < 64, "a streamed frame was kept"


def test_a_streamed_request_splits_at_every_boundary():
    frame = big_produce(7, acks=1)
    expected = describe(tracker().receive_client(frame)[0])
    for cut in range(1, len(frame)):
        conn = tracker()
        events, held = feed_client(conn, frame, [cut])
        assert [describe(e) for e in events] == [expected], cut
        assert held <= max(cut, 4 + len(expected[-2])) and held < 64, cut
        assert conn.client_partial == 0


def test_a_streamed_request_has_its_header_and_size_but_no_body():
    clock = FakeClock()
    conn = tracker(clock=clock)
    frame = big_produce(5, acks=1)
    [request] = conn.receive_client(frame)
    assert request.streamed and request.size == len(frame)
    assert (request.api_name, request.api_version, request.correlation_id) == ("Produce", 9, 5)
    assert request.request is None and request.decode_error is None    # streamed: not a decode error
    assert bytes(request.frame) == frame[4:4 + len(request.frame)]      # the header through acks
    assert struct.unpack_from(">h", request.frame, len(request.frame) - 2)[0] == 1
    clock.now += 0.5
    [response] = conn.receive_broker(response_bytes(0, 9, 5, responses=[]))
    assert not response.streamed and response.latency == 0.5 and response.response is not None


def test_acks_0_produce_streamed_then_the_next_answer_pairs():
    conn = tracker()
    stream = big_produce(1, acks=0) + request_bytes(3, 12, 2, topics=None)
    events, held = feed_client(conn, stream, range(0, len(stream), 100))
    assert [(e.streamed, e.expects_response) for e in events] == [(True, False), (False, True)]
    assert held < 64
    [answer] = conn.receive_broker(response_bytes(3, 12, 2, cluster_id="c"))
    assert answer.request_event is events[1]


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(0, 3 * len(BODY)), max_size=20).map(sorted))
def test_streamed_responses_pass_every_byte_and_keep_none(cuts):
    conn = tracker()
    conn.receive_client(request_bytes(18, 3, 1) + request_bytes(3, 12, 2, topics=None)
                        + request_bytes(18, 3, 3))
    answers = big_response(1) + big_response(2) + response_bytes(18, 3, 3)
    events, out, held = feed_broker(conn, answers, cuts)
    assert out == answers
    assert [(e.correlation_id, e.streamed, e.size) for e in events] == [
        (1, True, len(big_response(1))), (2, True, len(big_response(2))), (3, False, len(response_bytes(18, 3, 3)))]
    assert events[0].response is None and events[0].decode_error is None
    assert bytes(events[0].frame) == struct.pack(">i", 1)
    assert held < 64 and conn.buffered == 0 and conn.in_flight == 0


def test_a_streamed_response_splits_at_every_boundary():
    answer = big_response(9)
    for cut in range(1, len(answer)):
        conn = tracker()
        conn.receive_client(request_bytes(18, 3, 9))
        events, out, held = feed_broker(conn, answer, [cut])
        assert out == answer, cut
        assert [(e.streamed, e.size) for e in events] == [(True, len(answer))], cut
        assert held <= max(min(cut, 8), 8), cut


def test_held_responses_are_kept_whole_and_rewritten():
    conn = tracker(hold=lambda key, version: key == 3,
                   transform=lambda event: struct.pack(">i", event.correlation_id) + b"rewritten")
    conn.receive_client(request_bytes(3, 12, 1, topics=None))
    answer = big_response(1)
    events, out, held = feed_broker(conn, answer, range(0, len(answer), 100))
    assert out == framed(struct.pack(">i", 1) + b"rewritten")
    assert not events[0].streamed and bytes(events[0].frame) == answer[4:]
    assert held >= len(answer) - 100


@pytest.mark.parametrize("direction", ["request", "response"])
def test_observers_that_need_bodies_get_them_whole(direction):
    wanted = [True]
    conn = tracker(keep_bodies=lambda: wanted[0])
    if direction == "request":
        frame = big_produce(1, acks=1)
        events, held = feed_client(conn, frame, range(0, len(frame), 100))
    else:
        conn.receive_client(request_bytes(18, 3, 1))
        frame = big_response(1)
        events, _, held = feed_broker(conn, frame, range(0, len(frame), 100))
    assert not events[0].streamed and bytes(events[0].frame) == frame[4:]
    assert held >= len(frame) - 100
    wanted[0] = False                           # nobody needs them any more: the next is streamed
    if direction == "request":
        [event] = conn.receive_client(frame)
    else:
        conn.receive_client(request_bytes(18, 3, 1))
        [event], _ = conn.relay_broker(frame)
    assert event.streamed


def test_frames_below_the_threshold_and_sasl_handshakes_are_kept_whole():
    conn = tracker()
    small = produce(9, 1, acks=1)
    assert len(small) < STREAM
    [event] = conn.receive_client(small)
    assert not event.streamed and event.request is not None
    handshake = request_bytes(17, 0, 2, mechanism="PLAIN" + "x" * STREAM)
    [event] = conn.receive_client(handshake)
    assert not event.streamed and event.request.body.mechanism.startswith("PLAIN")


def test_a_header_that_runs_past_the_head_limit_is_kept_whole():
    tags = b"\x01\x00" + uvarint(STREAM_HEAD_LIMIT) + b"t" * STREAM_HEAD_LIMIT   # one 64 KiB tagged field
    frame = produce_v9(1, acks=1, header_tags=tags, rest=struct.pack(">i", 1000) + b"\x01\x00" + BODY)
    conn = tracker()
    events, held = feed_client(conn, frame, range(0, len(frame), 4096))
    assert not events[0].streamed and events[0].expects_response
    assert held >= len(frame) - 4096


def test_a_produce_the_broker_refuses_is_still_refused_when_complete():
    frame = produce_v9(1, acks=1, transactional_id=b"\x80\x80\x80\x80\x80\x01",
                       rest=struct.pack(">i", 1000) + b"\x01\x00" + BODY)
    conn = tracker()
    with pytest.raises(UntrackableRequest):
        feed_client(conn, frame, range(0, len(frame), 100))
