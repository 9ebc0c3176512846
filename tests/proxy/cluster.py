"""What the tests of kproxy before real Kafka clusters share: timeouts, topics, leaders, addresses, ports."""

from __future__ import annotations

import contextlib
import socket
import struct
import time
import uuid
from collections.abc import Callable, Iterable

from kproxy.embedded import KafkaCluster
from tests.proxy.harness import wait_for

ADMIN_TIMEOUT_S = 30.0
CONSUME_TIMEOUT_S = 90.0          # a group join after a coordinator moved can take a while
LEADER_MOVE_TIMEOUT_S = 60.0
SHUTDOWN_TIMEOUT_S = 5.0          # kproxy's, so a leftover client connection cannot stall a test


def topic_name(kind: str) -> str:
    return f"kp-{kind}-{uuid.uuid4().hex[:8]}"


def assert_no_upstream_address(chunks: list[bytes], upstreams: Iterable[tuple[str, int]],
                               advertised: Iterable[tuple[str, int]]) -> None:
    """No broker address in what kproxy sent clients; every kproxy address is there."""
    stream = b"".join(chunks)
    for host, port in upstreams:
        for encoded in (struct.pack(">i", port), struct.pack(">H", port)):
            assert host.encode() + encoded not in stream, f"upstream {host}:{port} leaked"
    for host, port in advertised:
        assert host.encode() + struct.pack(">i", port) in stream, f"{host}:{port} never advertised"


def upstream_addresses(cluster: KafkaCluster) -> list[tuple[str, int]]:
    internal = [(h, int(p)) for h, _, p in
                (a.rpartition(":") for a in cluster.internal_bootstrap_servers.split(","))]
    return [(n.host, n.port) for n in cluster.nodes] + internal


def create_topic(admin, topic: str, partitions: int, replication: int, **config: str) -> None:
    from confluent_kafka.admin import NewTopic
    new = NewTopic(topic, num_partitions=partitions, replication_factor=replication, config=config)
    admin.create_topics([new])[topic].result(ADMIN_TIMEOUT_S)


def api_trace() -> tuple[list, Callable]:
    """An observer recording (monotonic time, listener, event) for every event."""
    seen: list = []

    def observe(info, events):
        now = time.monotonic()
        seen.extend((now, info.listener, e) for e in events)
    return seen, observe


def partition_leader(admin, topic: str, partition: int) -> int:
    metadata = admin.list_topics(topic, timeout=ADMIN_TIMEOUT_S)
    return metadata.topics[topic].partitions[partition].leader


def stop_partition_0_leader(cluster: KafkaCluster, admin, topic: str) -> int:
    """Stop the node that leads ``topic``'s partition 0; return its id once another leads."""
    leader = partition_leader(admin, topic, 0)
    cluster.stop_node(leader)
    wait_for(lambda: partition_leader(admin, topic, 0) not in (leader, -1),
             LEADER_MOVE_TIMEOUT_S, "partition 0 to get a new leader")
    return leader


def leads_again(admin, topic: str, partitions: int, leader: int) -> bool:
    """Ask for every partition's preferred leader; whether ``leader`` (partition 0's
    preferred replica) leads partition 0 again. The election fails until it is back in
    sync: poll this."""
    from confluent_kafka import ElectionType, TopicPartition
    with contextlib.suppress(Exception):
        admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, p) for p in range(partitions)]
                            ).result(ADMIN_TIMEOUT_S)
    return partition_leader(admin, topic, 0) == leader


def port_free_on(hosts: Iterable[str]) -> int:
    """A port free on every one of several loopback addresses."""
    hosts = list(hosts)
    for _ in range(100):
        with contextlib.ExitStack() as stack:
            first = stack.enter_context(socket.socket())
            first.bind((hosts[0], 0))
            port = first.getsockname()[1]
            try:
                for host in hosts[1:]:
                    stack.enter_context(socket.socket()).bind((host, port))
            except OSError:
                continue
            return port
    raise AssertionError("no port free on all of " + ", ".join(hosts))
