"""Client inventory, deprecated requests and consumer group metrics, fed real frames.

Each simulated client has its own tracked connection (as in the proxy: one
``Connection`` and one ``ConnectionInfo`` per TCP connection); the clock is
shared, so durations are exact.
"""

import pytest
from prometheus_client import generate_latest

from kproxy.observers import metrics as metrics_module
from kproxy.observers.metrics import Metrics
from kproxy.protocol import API_KEYS, Struct, is_removed
from tests.observers.metrics import Client, Clock, samples, value


SOFTWARE = "kproxy_client_software_connections"


# ---------------------------------------------------------------- client inventory

def test_connections_move_from_unknown_to_the_software_they_name():
    m, clock = Metrics(), Clock()
    a, b = Client(m, clock), Client(m, clock)
    assert value(m, SOFTWARE, client_software_name="unknown", client_software_version="unknown") == 2
    a.call("ApiVersions", 3, dict(client_software_name="librdkafka", client_software_version="2.5.0"))
    assert value(m, SOFTWARE, client_software_name="librdkafka", client_software_version="2.5.0") == 1
    assert value(m, SOFTWARE, client_software_name="unknown", client_software_version="unknown") == 1
    # The broker refuses a malformed name (INVALID_REQUEST): not counted as that software.
    b.call("ApiVersions", 3, dict(client_software_name="-bad name-", client_software_version="1"),
           dict(error_code=42))
    assert value(m, SOFTWARE, client_software_name="-bad name-", client_software_version="1") == 0
    # A later ApiVersions v0 (no name) leaves what the connection said before.
    a.call("ApiVersions", 0)
    assert value(m, SOFTWARE, client_software_name="librdkafka", client_software_version="2.5.0") == 1
    a.close()
    b.close()
    assert sum(samples(m, SOFTWARE).values()) == 0


def test_inventory_stays_bounded_when_clients_invent_software_names():
    cap = 5
    m, clock = Metrics(label_cap=cap), Clock()
    clients = [Client(m, clock) for _ in range(60)]
    for i, client in enumerate(clients):
        client.call("ApiVersions", 3, dict(client_software_name=f"made-up-{i}" + "x" * 200,
                                          client_software_version=str(i)))
    series = samples(m, SOFTWARE)
    names = {dict(labels)["client_software_name"] for labels in series}
    assert len(series) <= cap + 2                        # + "unknown" and "other"
    assert "other" in names and all(len(name) <= metrics_module.SOFTWARE_LABEL_MAX_CHARS for name in names)
    assert sum(series.values()) == 60                    # every open connection counted once
    assert value(m, SOFTWARE, client_software_name="other", client_software_version="other") == 60 - cap


def test_requests_at_versions_kafka_4_removed_are_counted_with_the_software():
    assert is_removed(API_KEYS["Produce"], 2) and not is_removed(API_KEYS["Produce"], 9)
    m, clock = Metrics(), Clock()
    old, anonymous = Client(m, clock), Client(m, clock)
    old.call("ApiVersions", 3, dict(client_software_name="legacy-lib", client_software_version="0.9"))
    topic_data = [Struct(name="t", partition_data=[Struct(index=0, records=None)])]
    for _ in range(3):
        old.call("Produce", 2, dict(acks=1, timeout_ms=1000, topic_data=topic_data))
    old.call("Produce", 9, dict(acks=1, timeout_ms=1000, topic_data=topic_data))
    anonymous.call("ListOffsets", 0, dict(replica_id=-1, topics=[]))
    assert is_removed(API_KEYS["ListOffsets"], 0)
    assert value(m, "kproxy_deprecated_requests_total", api="Produce", version="2",
                 client_software_name="legacy-lib") == 3
    assert value(m, "kproxy_deprecated_requests_total", api="ListOffsets", version="0",
                 client_software_name="unknown") == 1
    assert sum(samples(m, "kproxy_deprecated_requests_total").values()) == 4   # Produce v9 is not


# ---------------------------------------------------------------- consumer groups

def join_round(clients, group, generation, clock, join_wait=0.2, sync_wait=0.05):
    """A classic round: every member sends JoinGroup, the first is leader, all SyncGroup."""
    ids = [f"member-{i}" for i in range(len(clients))]
    for client, member in zip(clients, ids):
        client.send("JoinGroup", 7, group_id=group, member_id=member, protocol_type="consumer")
    for i, (client, member) in enumerate(zip(clients, ids)):
        members = [Struct(member_id=x, group_instance_id=None, metadata=b"") for x in ids] if i == 0 else []
        client.answer(join_wait if i == 0 else 0.0, generation_id=generation, protocol_name="range",
                      leader=ids[0], member_id=member, members=members)
    for client, member in zip(clients, ids):
        client.call("SyncGroup", 5, dict(group_id=group, generation_id=generation, member_id=member),
                    dict(assignment=b""), wait=sync_wait)


def test_a_second_member_joining_is_a_rebalance_with_its_duration():
    m, clock = Metrics(), Clock()
    first, second = Client(m, clock), Client(m, clock)
    join_round([first], "orders", 1, clock)
    assert value(m, "kproxy_group_rebalances_total", protocol="classic") == 1
    assert value(m, "kproxy_group_members") == 1
    join_round([first, second], "orders", 2, clock, join_wait=1.5, sync_wait=0.25)
    assert value(m, "kproxy_group_rebalances_total", protocol="classic") == 2
    assert value(m, "kproxy_group_members") == 2
    assert value(m, "kproxy_group_rebalance_seconds_count") == 2
    # Round 2: join answered after 1.5 s, then two SyncGroups of 0.25 s each.
    assert value(m, "kproxy_group_rebalance_seconds_sum") == pytest.approx((0.2 + 0.05) + (1.5 + 0.5))
    # A heartbeat in a settled group changes nothing.
    first.call("Heartbeat", 4, dict(group_id="orders", generation_id=2, member_id="member-0"))
    assert value(m, "kproxy_group_rebalances_total", protocol="classic") == 2
    first.call("LeaveGroup", 4, dict(group_id="orders", members=[Struct(member_id="member-1",
                                                                         group_instance_id=None)]))
    assert value(m, "kproxy_group_members") == 1


def test_rejoin_errors_are_counted_per_group_only_when_asked():
    for labelled in (False, True):
        m, clock = Metrics(group_label=labelled), Clock()
        member = Client(m, clock)
        join_round([member], "payments", 1, clock)
        member.call("Heartbeat", 4, dict(group_id="payments", generation_id=1, member_id="member-0"),
                    dict(error_code=27))                 # REBALANCE_IN_PROGRESS
        member.call("SyncGroup", 5, dict(group_id="payments", generation_id=1, member_id="member-0"),
                    dict(error_code=22))                 # ILLEGAL_GENERATION
        member.call("Heartbeat", 4, dict(group_id="payments", generation_id=1, member_id="member-0"),
                    dict(error_code=15))                 # COORDINATOR_NOT_AVAILABLE: not a rejoin
        group = dict(group="payments") if labelled else {}
        assert value(m, "kproxy_group_rejoin_errors_total", api="Heartbeat",
                     error="REBALANCE_IN_PROGRESS", **group) == 1
        assert value(m, "kproxy_group_rejoin_errors_total", api="SyncGroup",
                     error="ILLEGAL_GENERATION", **group) == 1
        assert sum(samples(m, "kproxy_group_rejoin_errors_total").values()) == 2
        assert value(m, "kproxy_group_rebalances_total", protocol="classic", **group) == 1
        assert value(m, "kproxy_group_members", **group) == 1


def test_kip848_epoch_bumps_count_once_per_group_epoch():
    m, clock = Metrics(group_label=True), Clock()
    a, b = Client(m, clock), Client(m, clock)

    def beat(client, member, sent, granted, error=0):
        client.call("ConsumerGroupHeartbeat", 0,
                    dict(group_id="g848", member_id=member, member_epoch=sent, rebalance_timeout_ms=30000,
                         subscribed_topic_names=["t"], topic_partitions=[]),
                    dict(member_id=member, member_epoch=granted, error_code=error, heartbeat_interval_ms=5000))

    beat(a, "A", 0, 1)                  # A joins: epoch 1
    beat(a, "A", 1, 1)                  # steady
    beat(b, "B", 0, 2)                  # B joins: the group moves to epoch 2
    beat(a, "A", 1, 2)                  # A catches up: the same bump, not another
    beat(a, "A", 2, 2)
    assert value(m, "kproxy_group_rebalances_total", group="g848", protocol="consumer") == 2
    assert value(m, "kproxy_group_members", group="g848") == 2
    beat(b, "B", 2, 0, error=110)       # FENCED_MEMBER_EPOCH: must rejoin
    assert value(m, "kproxy_group_rejoin_errors_total", group="g848", api="ConsumerGroupHeartbeat",
                 error="FENCED_MEMBER_EPOCH") == 1
    beat(b, "B", -1, -1)                # B leaves
    assert value(m, "kproxy_group_members", group="g848") == 1
    clock.now += metrics_module.MEMBER_STALE_SECONDS + 1
    beat(b, "C", 0, 3)                  # A went quiet long ago; C is new
    assert value(m, "kproxy_group_members", group="g848") == 1


def test_group_labels_and_state_stay_bounded_under_invented_group_names(monkeypatch):
    monkeypatch.setattr(metrics_module, "MAX_TRACKED_GROUPS", 20)
    cap = 5
    m, clock = Metrics(group_label=True, label_cap=cap), Clock()
    client = Client(m, clock)
    for i in range(200):
        join_round([client], f"invented-{i}", 1, clock)
        client.call("Heartbeat", 4, dict(group_id=f"invented-{i}", generation_id=1, member_id="member-0"),
                    dict(error_code=25))              # UNKNOWN_MEMBER_ID
    assert len(m._groups) == 20                       # the most recent ones only
    for name in ("kproxy_group_rebalances_total", "kproxy_group_rejoin_errors_total",
                 "kproxy_group_rebalance_seconds_count", "kproxy_group_members"):
        series = samples(m, name)
        groups = {dict(labels)["group"] for labels in series}
        assert len(groups) <= cap + 1 and len(series) <= cap + 1, name
    assert value(m, "kproxy_group_rebalances_total", group="other", protocol="classic") == 200 - cap
    # The 20 tracked groups are the last ones: all past the cap; the labelled five were evicted.
    assert samples(m, "kproxy_group_members") == {(("group", "other"),): 20}
    # Groups gone quiet leave the state (and the members gauge) at the next scrape.
    clock.now += metrics_module.GROUP_IDLE_SECONDS + 1
    client.call("Heartbeat", 4, dict(group_id="invented-0", generation_id=1, member_id="member-0"))
    generate_latest(m.registry)
    assert list(m._groups) == ["invented-0"]


def test_without_the_group_label_group_metrics_are_totals():
    m, clock = Metrics(), Clock()
    a, b = Client(m, clock), Client(m, clock)
    join_round([a], "one", 1, clock)
    join_round([b], "two", 4, clock)
    assert value(m, "kproxy_group_rebalances_total", protocol="classic") == 2
    assert value(m, "kproxy_group_members") == 2
    assert all("group" not in dict(labels) for labels in samples(m, "kproxy_group_rebalances_total"))
