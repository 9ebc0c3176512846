"""protocol.failover: per-partition answers from real frames, and one client's failovers.

Bodies are encoded to frames and read back both whole and skimmed (what the live
observer reads), so the fields the failover rules need must survive skimming.
"""

from __future__ import annotations

import pytest

from kproxy.protocol import Struct, Uuid, decode_response, encode_response
from kproxy.protocol.failover import (RECOVERED_BY_HINT, RECOVERED_BY_METADATA, RECOVERED_BY_RETRY,
                                      ClientKey, FailoverTracker, LeaderBook, PartitionAnswer,
                                      partition_answers)
from kproxy.protocol.messages import Response, new_body
from kproxy.protocol.skim import skim_response

NOT_LEADER, FENCED = 6, 74
TOPIC_ID = Uuid(bytes(range(1, 17)))
CLIENT = ClientKey("producer-1", "apache-kafka-java", "4.3.1", "alice", "127.0.0.1")


def read_back(api_key: int, version: int, body) -> list:
    frame = encode_response(Response(7, body), api_key, version)
    whole = decode_response(frame, api_key, version).body
    partial = skim_response(frame, api_key, version).body if api_key in (0, 1) else whole
    return [whole, partial]


def produce_body(version: int, partitions, topic="orders"):
    parts = []
    for index, error, leader in partitions:
        fields = dict(index=index, error_code=error, base_offset=-1, log_append_time_ms=-1,
                      log_start_offset=-1, record_errors=[], error_message=None)
        if leader is not None:
            fields["current_leader"] = Struct(leader_id=leader[0], leader_epoch=leader[1])
        parts.append(Struct(**fields))
    named = dict(name=topic) if version < 13 else dict(topic_id=TOPIC_ID)
    return new_body("response", 0, version, responses=[Struct(**named, partition_responses=parts)])


@pytest.mark.parametrize("version", [9, 10, 12, 13])
def test_produce_answers_with_the_kip_951_hint_whole_and_skimmed(version):
    body = produce_body(version, [(0, NOT_LEADER, (2, 7)), (1, 0, None)])
    names = {str(TOPIC_ID): "orders"}
    for read in read_back(0, version, body):
        found = partition_answers(0, read, names)
        hinted = (2, 7) if version >= 10 else (None, None)        # CurrentLeader: v10+
        assert found == [PartitionAnswer("orders", 0, "NOT_LEADER_OR_FOLLOWER", *hinted),
                         PartitionAnswer("orders", 1, "NONE", None, None)]


def test_fetch_and_metadata_answers():
    fetch = new_body("response", 1, 16, responses=[Struct(
        topic_id=TOPIC_ID, partitions=[Struct(
            partition_index=3, error_code=FENCED, high_watermark=-1, last_stable_offset=-1,
            log_start_offset=-1, aborted_transactions=None, preferred_read_replica=-1, records=None,
            current_leader=Struct(leader_id=1, leader_epoch=9))])])
    names: dict[str, str] = {}
    metadata = new_body("response", 3, 12, topics=[Struct(
        error_code=0, name="orders", topic_id=TOPIC_ID, is_internal=False, topic_authorized_operations=0,
        partitions=[Struct(error_code=0, partition_index=3, leader_id=1, leader_epoch=9, replica_nodes=[1, 2],
                           isr_nodes=[1, 2], offline_replicas=[])])])
    (whole,) = read_back(3, 12, metadata)[:1]
    assert partition_answers(3, whole, names) == [PartitionAnswer("orders", 3, "NONE", 1, 9)]
    assert names == {str(TOPIC_ID): "orders"}                 # learnt: Fetch v13+ names topics by id
    for read in read_back(1, 16, fetch):
        assert partition_answers(1, read, names) == [PartitionAnswer("orders", 3, "FENCED_LEADER_EPOCH", 1, 9)]


def answer(error: str, partition: int = 0, hint=None) -> PartitionAnswer:
    return PartitionAnswer("orders", partition, error, *(hint or (None, None)))


def test_a_client_that_follows_the_hint():
    tracker = FailoverTracker()
    assert tracker.answer(CLIENT, "Produce", 1, 10.0, 10.01, [answer("NONE")]) == []
    assert tracker.answer(CLIENT, "Produce", 1, 11.0, 11.01, [answer("NOT_LEADER_OR_FOLLOWER", hint=(2, 5))]) == []
    # Another partition led by node 2 succeeding ends nothing.
    assert tracker.answer(CLIENT, "Produce", 2, 11.02, 11.03, [answer("NONE", partition=1)]) == []
    assert tracker.pending == 1
    (failover,) = tracker.answer(CLIENT, "Produce", 2, 11.05, 11.09, [answer("NONE")])
    assert (failover.old_leader, failover.new_leader, failover.failed_requests) == (1, 2, 1)
    assert failover.errors == (("NOT_LEADER_OR_FOLLOWER", 1),)
    assert (failover.hint_leader, failover.hint_epoch, failover.metadata_requests) == (2, 5, 0)
    assert failover.recovered_by == RECOVERED_BY_HINT
    assert failover.recovery_seconds == pytest.approx(0.09)
    assert tracker.pending == 0


def test_a_client_that_needs_metadata_and_retries_several_times():
    tracker = FailoverTracker()
    tracker.answer(CLIENT, "Produce", 1, 1.0, 1.1, [answer("NOT_LEADER_OR_FOLLOWER")])
    tracker.answer(CLIENT, "Produce", 1, 1.2, 1.3, [answer("NOT_LEADER_OR_FOLLOWER")])
    tracker.answer(CLIENT, "Produce", 1, 1.4, 1.5, [answer("FENCED_LEADER_EPOCH")])
    tracker.metadata(CLIENT, 1.6)
    other = CLIENT._replace(client_id="someone-else")
    assert tracker.answer(other, "Produce", 3, 1.65, 1.66, [answer("NONE")]) == []   # not this client's
    tracker.answer(CLIENT, "Produce", 3, 1.7, 1.8, [answer("REQUEST_TIMED_OUT")])     # counted, not an end
    (failover,) = tracker.answer(CLIENT, "Produce", 3, 1.9, 2.0, [answer("NONE")])
    assert failover.failed_requests == 4 and failover.metadata_requests == 1
    assert failover.errors == (("NOT_LEADER_OR_FOLLOWER", 2), ("FENCED_LEADER_EPOCH", 1), ("REQUEST_TIMED_OUT", 1))
    assert failover.recovered_by == RECOVERED_BY_METADATA
    assert failover.recovery_seconds == pytest.approx(1.0)


def test_a_hint_not_followed_and_no_metadata_is_a_retry():
    tracker = FailoverTracker()
    tracker.answer(CLIENT, "Fetch", 1, 1.0, 1.1, [answer("NOT_LEADER_OR_FOLLOWER", hint=(2, 5))])
    (failover,) = tracker.answer(CLIENT, "Fetch", 1, 1.5, 1.6, [answer("NONE")])   # back where it was
    assert failover.recovered_by == RECOVERED_BY_RETRY and failover.api == "Fetch"


def test_the_leader_book_names_changes_by_epoch():
    book = LeaderBook()
    assert book.learn([PartitionAnswer("t", 0, "NONE", 1, 4)], 1.0, "metadata") == []
    assert book.learn([PartitionAnswer("t", 0, "NONE", 1, 4)], 2.0, "metadata") == []
    (change,) = book.learn([PartitionAnswer("t", 0, "NOT_LEADER_OR_FOLLOWER", 2, 5)], 3.0, "hint")
    assert (change.old_leader, change.new_leader, change.epoch, change.source) == (1, 2, 5, "hint")
    assert book.learn([PartitionAnswer("t", 0, "NONE", 1, 4)], 4.0, "metadata") == []    # stale: older epoch
    assert book.learn([PartitionAnswer("t", 0, "NONE", 2, 5)], 5.0, "metadata") == []
