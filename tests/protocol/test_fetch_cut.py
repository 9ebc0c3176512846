"""A held Fetch answer's records pass as they arrive (``fetch_cut``), the rest once checked:
what the client gets is the answer, byte for byte, or a closed connection, never an address
the rewrite would have changed."""

import uuid

import pytest
from hypothesis import given, settings, strategies as st

from kproxy.protocol import Struct
from kproxy.protocol.connection import Connection, PassedAnswerChanged
from kproxy.protocol.fetch_cut import FENCED_LEADER_EPOCH, HOLD_WHOLE, NOT_LEADER_OR_FOLLOWER, FetchCut

from tests.protocol.frames import request_bytes, response_bytes

RECORDS = 100 * 1024          # per partition: well above the size assembled in a buffer of its own


def fetch_answer(version: int, partitions: list[dict], node_endpoints=(), topics: int = 1) -> bytes:
    """A Fetch answer: ``topics`` topics, each with ``partitions`` (fields over the defaults)."""
    def topic(t):
        parts = [Struct(**{"partition_index": i, "error_code": 0, "high_watermark": 10, "last_stable_offset": 10,
                           "log_start_offset": 0, "aborted_transactions": [], "preferred_read_replica": -1,
                           "records": bytes([65 + i]) * RECORDS, **p}) for i, p in enumerate(partitions)]
        named = {"topic": f"t{t}"} if version < 13 else {"topic_id": uuid.UUID(int=t + 1).bytes}
        return Struct(**named, partitions=parts)
    since_16 = {"node_endpoints": list(node_endpoints)} if version >= 16 else {}
    return response_bytes(1, version, 7, throttle_time_ms=0, error_code=0, session_id=0,
                          responses=[topic(t) for t in range(topics)], **since_16)


def endpoint(node_id=2, host="broker-2.internal"):
    return Struct(node_id=node_id, host=host, port=9092, rack=None)


def feed(answer: bytes, cuts: list[int], transform=None, version: int = 16):
    """The answer read in place in pieces of ``cuts``; per read what was forwarded."""
    conn = Connection(assemble=lambda size, start: (bytearray(size + 5), 3),
                      hold=lambda key, version: key == 1, transform=transform)
    conn.receive_client(request_bytes(1, version, 7, max_wait_ms=500, min_bytes=1, max_bytes=1 << 20))
    per_read, events, pos, i = [], [], 0, 0
    while pos < len(answer):
        n = min(cuts[i % len(cuts)], len(answer) - pos)
        i += 1
        room = conn.room("broker")
        if room is not None:
            n = min(n, len(room))
            room[:n] = answer[pos:pos + n]
            data = room[:n]
        else:
            data = answer[pos:pos + n]
        pos += n
        new, out = conn.relay_broker(data)
        events += new
        per_read.append(b"".join(bytes(chunk) for chunk in out))
    assert conn.buffered == 0 and not conn.passing()
    return per_read, events


@settings(max_examples=25, deadline=None)
@given(cuts=st.lists(st.one_of(st.integers(1, 40), st.integers(1000, 150_000)), min_size=1, max_size=8)
       .filter(lambda cuts: sum(cuts) >= 2000 * len(cuts)),
       version=st.sampled_from([12, 13, 16, 18]), partitions=st.integers(1, 3), topics=st.integers(1, 2))
def test_what_passes_early_and_what_follows_is_the_answer_exactly(cuts, version, partitions, topics):
    answer = fetch_answer(version, [{}] * partitions, topics=topics)
    per_read, events = feed(answer, cuts, version=version)
    assert b"".join(per_read) == answer
    assert [bytes(e.frame) for e in events] == [answer[4:]]          # observers get it whole
    # Everything up to the end of the last records passed before the answer was complete.
    last_records = answer.rindex(bytes([65 + partitions - 1]) * RECORDS) + RECORDS
    assert len(b"".join(per_read[:-1])) >= min(last_records, len(answer) - len(per_read[-1])) \
        or len(per_read) == 1


def test_the_records_pass_as_they_arrive_the_tail_once_complete():
    answer = fetch_answer(16, [{}])
    transformed = []
    per_read, _ = feed(answer, [64 * 1024], transform=transformed.append)
    assert all(len(out) == 64 * 1024 for out in per_read[1:-1])        # each read passed at once
    assert b"".join(per_read) == answer and len(per_read[-1]) < 64 * 1024
    # Its tail has no tagged field at all: nothing to rewrite, no decode before the last write.
    assert not transformed
    feed(fetch_answer(16, [{}, {"snapshot_id": Struct(end_offset=1, epoch=1)}]), [64 * 1024],
         transform=transformed.append)
    assert len(transformed) == 1                                       # a tagged field: checked


@pytest.mark.parametrize("error", [NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH])
def test_an_answer_naming_a_new_leader_is_held_whole_and_rewritten(error):
    answer = fetch_answer(16, [{}, {"error_code": error, "records": b"",
                                    "current_leader": Struct(leader_id=2, leader_epoch=5)}],
                          node_endpoints=[endpoint()])
    rewritten = fetch_answer(16, [{}, {"error_code": error, "records": b"",
                                       "current_leader": Struct(leader_id=2, leader_epoch=5)}],
                             node_endpoints=[endpoint(host="kproxy")])
    per_read, _ = feed(answer, [64 * 1024], transform=lambda event: rewritten[4:])
    assert not any(per_read[:-1])                                     # nothing before the check
    assert per_read[-1] == rewritten


def test_a_leader_hint_in_an_earlier_partition_holds_the_answer_whole():
    answer = fetch_answer(16, [{"current_leader": Struct(leader_id=2, leader_epoch=5)}, {}])
    per_read, _ = feed(answer, [64 * 1024])
    assert not any(per_read[:-1]) and per_read[-1] == answer


def test_addresses_without_a_partition_error_close_the_connection_unleaked():
    """A broker that sends node endpoints with no partition naming a new leader (Kafka does not):
    the records passed, the addresses never do."""
    answer = fetch_answer(16, [{}], node_endpoints=[endpoint()])
    rewritten = fetch_answer(16, [{}], node_endpoints=[endpoint(host="kproxy")])
    with pytest.raises(PassedAnswerChanged):
        feed(answer, [64 * 1024], transform=lambda event: rewritten[4:])


def test_a_rewrite_of_the_held_tail_alone_and_of_its_length_passes():
    """A transform that keeps the length and changes only what was held is applied."""
    answer = fetch_answer(16, [{}], node_endpoints=[endpoint(host="broker-2")])
    rewritten = fetch_answer(16, [{}], node_endpoints=[endpoint(host="kproxy-2")])
    per_read, _ = feed(answer, [64 * 1024], transform=lambda event: rewritten[4:])
    assert b"".join(per_read) == rewritten


def test_unexpected_layouts_are_held_whole():
    buffer = bytearray(fetch_answer(16, []))                    # no partitions: nothing to pass
    assert FetchCut(buffer, 0, len(buffer), 16).advance(len(buffer)) == HOLD_WHOLE
    answer = bytearray(fetch_answer(16, [{}]))
    answer[4 + 4 + 1 + 10] = 0                                  # the topic array said null
    assert FetchCut(answer, 0, len(answer), 16).advance(len(answer)) == HOLD_WHOLE
    assert FetchCut(answer, 0, len(answer) - RECORDS, 16).advance(len(answer)) == HOLD_WHOLE  # records past the end


def test_undecided_until_the_last_partition_header_arrives():
    answer = bytes(fetch_answer(16, [{}, {}]))
    walk = FetchCut(answer, 0, len(answer), 16)
    second = answer.index(b"B" * 100)
    assert walk.advance(second - 200) is None                   # the second partition's header not in
    assert walk.advance(second) == second + RECORDS
