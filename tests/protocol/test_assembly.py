"""Large frames assembled in a buffer of their own (``Connection(assemble=...)``): reads that
land in place (``room``), bytes copied in, or no assembly at all give the same frames, the
same events and the same bytes forwarded."""

import struct

from hypothesis import given, settings, strategies as st

from kproxy.protocol import Struct
from kproxy.protocol.connection import Connection
from kproxy.protocol.framer import ZERO_COPY_FRAME_BYTES

from tests.protocol.frames import request_bytes, response_bytes

BIG = ZERO_COPY_FRAME_BYTES * 3 // 2


def client_stream() -> bytes:
    """Requests: large Produces (v9, records as opaque bytes) between small Metadata requests."""
    out = b""
    for cid in range(1, 7):
        if cid % 2:
            out += request_bytes(0, 9, cid, acks=-1, transactional_id=None, timeout_ms=1000,
                                 topic_data=[Struct(name="t", partition_data=[
                                     Struct(index=0, records=bytes([cid]) * (BIG + cid))])])
        else:
            out += request_bytes(3, 12, cid, topics=None)
    return out


def broker_stream() -> bytes:
    """The answers: Produce answers are small, Metadata answers are padded to large frames
    with a large cluster id."""
    out = b""
    for cid in range(1, 7):
        if cid % 2:
            out += response_bytes(0, 9, cid, responses=[])
        else:
            out += response_bytes(3, 12, cid, cluster_id="c" * (BIG + cid))
    return out


def run(cuts: list[int], mode: str) -> tuple[list, list, bytes]:
    """Feed both streams in reads cut at ``cuts``: ``none`` (no assembly), ``copy`` (assembled,
    bytes handed over as reads), ``in_place`` (assembled, reads landing in ``room``); the
    buffers given are longer than the frames, as reused ones may be."""
    conn = Connection(assemble=None if mode == "none" else (lambda size, start: (bytearray(size + 7), 0)),
                      hold=lambda key, version: key == 3)
    events, forwarded = [], b""
    for direction, stream in (("client", client_stream()), ("broker", broker_stream())):
        pos, i = 0, 0
        while pos < len(stream):
            n = min(cuts[i % len(cuts)], len(stream) - pos)
            i += 1
            room = conn.room(direction) if mode == "in_place" else None
            if room is not None:
                n = min(n, len(room))
                room[:n] = stream[pos:pos + n]
                data = room[:n]
            else:
                data = stream[pos:pos + n]
            pos += n
            if direction == "client":
                events += conn.receive_client(data)
            else:
                new, out = conn.relay_broker(data)
                events += new
                forwarded += b"".join(bytes(chunk) for chunk in out)
    assert conn.buffered == 0 and conn.holding("client")[1] == conn.holding("broker")[1] == 0
    frames = [bytes(e.frame) for e in events]
    summary = [(type(e).__name__, e.api_key, e.correlation_id) for e in events]
    return frames, summary, forwarded


@settings(max_examples=30, deadline=None)
@given(cuts=st.lists(st.one_of(st.integers(1, 9), st.integers(1000, 3 * ZERO_COPY_FRAME_BYTES)),
                     min_size=1, max_size=12).filter(lambda cuts: sum(cuts) >= 1000 * len(cuts) // 2))
def test_assembled_frames_are_the_frames_gathered_otherwise(cuts):
    expected = run(cuts, "none")
    assert expected[2] == broker_stream()                   # nothing rewritten: all forwarded
    assert run(cuts, "copy") == expected
    assert run(cuts, "in_place") == expected


def test_a_read_in_place_is_not_copied_and_the_frame_is_its_buffer():
    conn = Connection(assemble=lambda size, start: (bytearray(size), 0))
    stream = client_stream()
    first = struct.unpack_from(">i", stream)[0] + 4
    conn.receive_client(stream[:100])                       # the first large frame begins
    assert conn.room("client") is not None and conn.holding("client")[1] == first - 100
    room = conn.room("client")
    room[:first - 100] = stream[100:first]
    [event] = conn.receive_client(room[:first - 100])
    assert event.frame.obj is room.obj                      # the frame is the buffer read into
    assert bytes(event.frame) == stream[4:first]
    assert conn.room("client") is None and conn.holding("client")[1] == 0


def test_assembly_refused_gathers_the_frame_as_it_comes():
    asked = []
    conn = Connection(assemble=lambda size, start: asked.append(size))
    stream = client_stream()
    conn.receive_client(stream[:100])
    assert asked == [struct.unpack_from(">i", stream)[0] + 4]
    assert conn.room("client") is None and conn.holding("client")[1] == 0 and conn.buffered == 100


def test_a_large_frame_gathered_a_little_per_read_keeps_no_read_buffer_alive():
    """Gathered (not assembled) pieces that are small views of a big read buffer are copied:
    a view keeps its whole buffer alive, so a client dribbling its frame could otherwise
    hold a read buffer (1 MiB in the relay) per few bytes it sent. Pieces that fill most
    of their buffer stay views (nothing copied)."""
    import sys

    frame = client_stream()
    size, = struct.unpack_from(">i", frame)
    first = frame[:4 + size]
    connection = Connection()                      # no assemble: large frames are gathered
    pieces = 8
    step = len(first) // pieces
    buffers = []
    for i in range(pieces - 1):
        buffer = bytearray(64 * step)              # the read landed in a much bigger buffer
        buffer[:step] = first[i * step:(i + 1) * step]
        assert connection.receive_client(memoryview(buffer)[:step]) == []
        buffers.append(buffer)
    del buffer
    buffers.append(bytearray(1))                   # referred to by the list alone
    assert len({sys.getrefcount(b) for b in buffers}) == 1      # so are the read buffers
    whole = bytearray(first[(pieces - 1) * step:])
    events = connection.receive_client(memoryview(whole))       # a view of its own buffer: kept
    assert [bytes(e.frame) for e in events] == [first[4:]]
