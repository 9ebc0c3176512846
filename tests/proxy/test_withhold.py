"""Withholding brokers kproxy cannot serve, on decoded responses (no sockets)."""

import pytest

from kproxy.protocol import Response, Struct, decode_response, encode_response, new_body, schema
from kproxy.proxy.rewrite import (ADDRESS_BEARING, COORDINATOR_NOT_AVAILABLE, LEADER_NOT_AVAILABLE,
                                  NO_NODE, WITHHOLDERS, node_addresses, withhold_nodes)
from tests.protocol.samples import sample_body

CONTROLLER_ONLY = {52, 53, 54, 55, 59, 82}     # KRaft quorum APIs: controller addresses, no listener


def round_trip(body, api_key, version):
    return decode_response(encode_response(Response(7, body), api_key, version), api_key, version)


def test_every_broker_address_response_can_be_withheld():
    assert set(WITHHOLDERS) == set(ADDRESS_BEARING) - CONTROLLER_ONLY


CASES = [(key, v) for key in sorted(WITHHOLDERS)
         for v in range(max(ADDRESS_BEARING[key][0], schema.RESPONSES[key].versions[0]),
                        schema.RESPONSES[key].versions[1] + 1)]


@pytest.mark.parametrize("api_key,version", CASES)
def test_withheld_node_leaves_every_version_and_the_rest_stays(api_key, version):
    for seed in range(40):
        decoded = round_trip(sample_body("response", api_key, version, seed=seed, width=2),
                             api_key, version)
        before = node_addresses(api_key, version, decoded.body)
        if not before:
            continue
        unserved = {before[0][0]}
        assert withhold_nodes(api_key, version, decoded, unserved)
        after = node_addresses(api_key, version, round_trip(decoded.body, api_key, version).body)
        assert after == [entry for entry in before if entry[0] not in unserved]
        return
    pytest.fail("no sample carried an address")


def test_nothing_changes_when_every_node_is_served():
    body = new_body("response", 3, 12, controller_id=1, brokers=[
        Struct(node_id=1, host="kproxy", port=19091, rack=None)])
    decoded = round_trip(body, 3, 12)
    frame = encode_response(decoded, 3, 12)
    assert not withhold_nodes(3, 12, decoded, {7})
    assert not withhold_nodes(3, 12, decoded, set())
    assert encode_response(decoded, 3, 12) == frame


def metadata(version: int):
    partition = dict(replica_nodes=[1, 2], isr_nodes=[1, 2], offline_replicas=[])
    if version >= 7:
        partition["leader_epoch"] = 4
    return new_body("response", 3, version, controller_id=2, cluster_id="c", brokers=[
        Struct(node_id=1, host="kproxy", port=19091, rack=None),
        Struct(node_id=2, host="kproxy", port=19092, rack=None)], topics=[
        Struct(
            error_code=0, name="t", topic_id=bytes(16), is_internal=False, topic_authorized_operations=0,
            partitions=[Struct(error_code=0, partition_index=0, leader_id=2, **partition),
                        Struct(error_code=0, partition_index=1, leader_id=1, **partition)])])


def test_metadata_drops_the_broker_and_its_leaderships():
    decoded = round_trip(metadata(12), 3, 12)
    assert withhold_nodes(3, 12, decoded, {2})
    body = round_trip(decoded.body, 3, 12).body
    assert [(b.node_id, b.port) for b in body.brokers] == [(1, 19091)]
    assert body.controller_id == 1                         # another served broker
    led_by_2, led_by_1 = body.topics[0].partitions
    assert (led_by_2.leader_id, led_by_2.error_code, led_by_2.leader_epoch) == \
        (NO_NODE, LEADER_NOT_AVAILABLE, 4)
    assert (led_by_1.leader_id, led_by_1.error_code) == (1, 0)
    assert led_by_2.replica_nodes == [1, 2]                 # ids only: no address in them


def test_metadata_with_no_broker_served_has_no_controller():
    decoded = round_trip(metadata(12), 3, 12)
    assert withhold_nodes(3, 12, decoded, {1, 2})
    body = round_trip(decoded.body, 3, 12).body
    assert body.brokers == [] and body.controller_id == NO_NODE
    assert {p.leader_id for p in body.topics[0].partitions} == {NO_NODE}


@pytest.mark.parametrize("version", [0, 3])
def test_old_find_coordinator_becomes_not_available(version):
    fields = {"error_message": None} if version >= 1 else {}
    decoded = round_trip(new_body("response", 10, version, error_code=0, node_id=2,
                                  host="kproxy", port=19092, **fields), 10, version)
    assert withhold_nodes(10, version, decoded, {2})
    body = round_trip(decoded.body, 10, version).body
    assert (body.error_code, body.node_id, body.host, body.port) == \
        (COORDINATOR_NOT_AVAILABLE, NO_NODE, "", NO_NODE)


def test_batched_find_coordinator_withholds_per_key():
    decoded = round_trip(new_body("response", 10, 4, coordinators=[
        Struct(key="g1", node_id=1, host="kproxy", port=19091, error_code=0, error_message=None),
        Struct(key="g2", node_id=2, host="kproxy", port=19092, error_code=0, error_message=None)]),
        10, 4)
    assert withhold_nodes(10, 4, decoded, {2})
    g1, g2 = round_trip(decoded.body, 10, 4).body.coordinators
    assert (g1.node_id, g1.port, g1.error_code) == (1, 19091, 0)
    assert (g2.node_id, g2.host, g2.error_code) == (NO_NODE, "", COORDINATOR_NOT_AVAILABLE)


def test_describe_cluster_drops_the_broker():
    decoded = round_trip(new_body("response", 60, 1, controller_id=2, brokers=[
        Struct(broker_id=1, host="kproxy", port=19091, rack=None),
        Struct(broker_id=2, host="kproxy", port=19092, rack=None)]), 60, 1)
    assert withhold_nodes(60, 1, decoded, {2})
    body = round_trip(decoded.body, 60, 1).body
    assert [b.broker_id for b in body.brokers] == [1] and body.controller_id == 1


def test_produce_leader_hint_naming_the_node_is_cleared():
    partition = Struct(
        index=0, error_code=6, base_offset=-1, log_append_time_ms=-1, log_start_offset=-1,
        record_errors=[], error_message=None, current_leader=Struct(leader_id=2, leader_epoch=5))
    body = new_body("response", 0, 11, responses=[Struct(name="t", partition_responses=[partition])],
                    node_endpoints=[Struct(node_id=2, host="kproxy", port=19092, rack=None)])
    decoded = round_trip(body, 0, 11)
    assert withhold_nodes(0, 11, decoded, {2})
    out = encode_response(decoded, 0, 11)
    body = decode_response(out, 0, 11).body
    assert body.node_endpoints == []
    leader = body.responses[0].partition_responses[0].current_leader
    assert (leader.leader_id, leader.leader_epoch) == (NO_NODE, NO_NODE)
    assert body.responses[0].partition_responses[0].error_code == 6   # NOT_LEADER stays: clients refresh
