"""``kproxy analyze``'s failovers, leader_changes and audit tables tell what the live observers
told from the same pairs: one client's connections to two brokers, fed to the capture, the
failover observer and the audit trail at once, then the capture analysed."""

from __future__ import annotations

import json

import pytest

from kproxy.observers.audit import Audit, AuditConfig
from kproxy.observers.capture import Capture, CaptureConfig
from kproxy.observers.failover import Failovers
from kproxy.pipeline import failovers as failover_tables
from kproxy.pipeline.audit import audit
from kproxy.pipeline.load import load_capture
from kproxy.protocol import Struct, Uuid
from tests.observers.captures import Link, produce_answer, produce_request

NOT_LEADER = 6
TOPIC_EXISTS = 36
NO_ID = Uuid(bytes(16))
PRODUCE_V = 10             # KIP-951 hints from v10


def metadata_answer(leaders):
    return dict(brokers=[Struct(node_id=n, host="127.0.0.1", port=9092 + n, rack=None) for n in (1, 2)],
                cluster_id="c", controller_id=1, topics=[Struct(
                    error_code=0, name="orders", is_internal=False, topic_authorized_operations=0,
                    partitions=[Struct(error_code=0, partition_index=p, leader_id=leader, leader_epoch=epoch,
                                       replica_nodes=[1, 2], isr_nodes=[1, 2], offline_replicas=[])
                                for p, (leader, epoch) in enumerate(leaders)])])


def create_topics(names):
    return dict(topics=[Struct(name=n, num_partitions=1, replication_factor=1, assignments=[], configs=[])
                        for n in names], timeout_ms=30000, validate_only=False)


def created(results):
    return dict(topics=[Struct(name=n, topic_id=NO_ID, error_code=e, error_message=None, num_partitions=1,
                               replication_factor=1, configs=[]) for n, e in results])


def test_analyze_tells_the_failovers_and_audit_events_the_live_observers_told(spark, tmp_path):
    capture = Capture()
    capture.start(CaptureConfig(directory=str(tmp_path / "capture"), formats=("parquet",)))
    live = Failovers()
    trail = Audit(AuditConfig(path=str(tmp_path / "audit.jsonl"), log=False), "kproxy-test")
    trail.start()
    node1 = Link(capture, live, trail, conn_id=1, node_id=1, client=("127.0.0.1", 40001))
    node2 = Link(capture, live, trail, conn_id=2, node_id=2, client=("127.0.0.1", 40002))
    admin = Link(capture, live, trail, conn_id=3, client=("10.0.0.9", 50000))

    metadata = dict(topics=[Struct(name="orders", topic_id=NO_ID)], allow_auto_topic_creation=False,
                    include_topic_authorized_operations=False)
    node1.exchange(3, 12, 1, metadata, metadata_answer([(1, 4), (2, 4)]))
    node1.exchange(0, PRODUCE_V, 2, produce_request(partition=0), produce_answer(0))
    # Partition 0 moves to node 2: the answer hints at it, the client goes there at once.
    node1.exchange(0, PRODUCE_V, 3, produce_request(partition=0), produce_answer(0, NOT_LEADER, (2, 5)))
    node2.exchange(0, PRODUCE_V, 4, produce_request(partition=1), produce_answer(1))     # ends nothing
    node2.exchange(0, PRODUCE_V, 5, produce_request(partition=0), produce_answer(0))
    # Partition 1 moves to node 1 with no hint: two failures, a Metadata round trip, then node 1.
    node2.exchange(0, PRODUCE_V, 6, produce_request(partition=1), produce_answer(1, NOT_LEADER))
    node2.exchange(0, PRODUCE_V, 7, produce_request(partition=1), produce_answer(1, NOT_LEADER))
    node1.exchange(3, 12, 8, metadata, metadata_answer([(2, 5), (1, 5)]))
    node1.exchange(0, PRODUCE_V, 9, produce_request(partition=1), produce_answer(1))

    admin.exchange(19, 7, 1, create_topics(["<b>evil</b>"]), created([("<b>evil</b>", 0)]), client_id="ops")
    admin.exchange(19, 7, 2, create_topics(["<b>evil</b>", "new"]),
                   created([("<b>evil</b>", TOPIC_EXISTS), ("new", 0)]), client_id="ops")
    admin.exchange(20, 6, 3, dict(topics=[Struct(name="new", topic_id=NO_ID)], timeout_ms=30000),
                   dict(responses=[Struct(name="new", topic_id=NO_ID, error_code=0, error_message=None)]),
                   client_id="ops")
    commit = dict(group_id="g", generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
                  topics=[Struct(name="orders", partitions=[Struct(
                      partition_index=0, committed_offset=0, committed_leader_epoch=-1,
                      committed_metadata=None)])])
    answer = dict(topics=[Struct(name="orders", partitions=[Struct(partition_index=0, error_code=0)])])
    admin.exchange(8, 8, 4, commit, answer, client_id="ops")                             # a reset: audited
    node1.exchange(8, 8, 10, dict(commit, generation_id_or_member_epoch=3, member_id="m-1"), answer)  # not
    for link in (node1, node2, admin):
        link.close(capture)
        trail.connection_closed(link.info)
    capture.stop()
    trail.stop()

    told = list(reversed(live.recent()["failovers"]))
    assert [(f["topic"], f["partition"], f["old_leader"], f["new_leader"], f["failed_requests"],
             f["recovered_by"], f["hint_leader"], f["metadata_requests"]) for f in told] == [
        ("orders", 0, 1, 2, 1, "hint", 2, 0), ("orders", 1, 2, 1, 2, "metadata", None, 1)]
    assert live.recent()["leader_changes"][-1]["new_leader"] == 2           # the hint named it first

    _, pairs = load_capture(spark, [str(tmp_path / "capture")])
    table = failover_tables.failovers(pairs).collect()
    assert [(r.client_id, r.client_host, r.topic, r.partition, r.old_leader, r.new_leader, r.failed_requests,
             r.errors, r.error_counts, r.recovered_by, r.hint_leader, r.metadata_requests) for r in table] == [
        ("app-1", "127.0.0.1", f["topic"], f["partition"], f["old_leader"], f["new_leader"],
         f["failed_requests"], list(f["errors"]), list(f["errors"].values()), f["recovered_by"],
         f["hint_leader"], f["metadata_requests"]) for f in told]
    for row, f in zip(table, told):          # the capture's clock and the observer's: microseconds apart
        assert row.recovery_seconds == pytest.approx(f["recovery_seconds"], abs=0.002)
    changes = failover_tables.leader_changes(pairs).collect()
    assert sorted((r.partition, r.old_leader, r.new_leader, r.epoch) for r in changes) == [(0, 1, 2, 5), (1, 2, 1, 5)]

    events = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    rows = audit(pairs).collect()
    assert [(r.api, r.correlation_id, r.client_address, r.client_id, r.principal, r.outcome) for r in rows] == [
        (e["api"], e["correlation_id"], e["client_address"], e["client_id"], e["principal"], e["outcome"])
        for e in events]
    assert [(r.api, r.outcome, r.topics) for r in rows] == [
        ("CreateTopics", "ok", ["<b>evil</b>"]), ("CreateTopics", "partial", ["<b>evil</b>", "new"]),
        ("DeleteTopics", "ok", ["new"]), ("OffsetCommit", "ok", ["orders"])]
