"""What a broker names in its answers cannot exhaust kproxy, nor make it hand out an address
it does not serve: a stand-in broker (no real one names 3,000 nodes on demand) answering
Metadata, FindCoordinator and DescribeCluster with the nodes each test picks.

Before ``max_brokers`` and the port check, one Metadata answer naming 30,000 nodes took
every file descriptor kproxy had (a listener each), and a node whose port by the offset
rule fell outside 1-65535 (node 70,000, or a negative id) ended the client's connection
with an internal error and a traceback.
"""

from __future__ import annotations

import logging

import pytest

from kproxy.protocol import Response, Struct, encode_response, new_body
from kproxy.proxy.rewrite import node_addresses
from tests.proxy.harness import ProxyThread, free_ports, open_fds
from tests.proxy.wire import (DESCRIBE_CLUSTER, FIND_COORDINATOR, METADATA, RawClient, StandInBroker,
                             answer_naming)

DESCRIBE_QUORUM = 55
COORDINATOR_NOT_AVAILABLE = 15


def brokers_answer(nodes: list[int], coordinator: int | None = None):
    """A stand-in's answers naming ``nodes`` (FindCoordinator: ``coordinator``)."""
    return lambda request: answer_naming(request, nodes, coordinator)


def served(proxy: ProxyThread, response, api_key: int, version: int) -> list[tuple[int, str, int]]:
    """The nodes an answer names, each checked to be at an address kproxy serves."""
    named = node_addresses(api_key, version, response.body)
    serving = proxy.served_broker_addresses()
    assert all((host, port) in serving for _, host, port in named), (named, serving)
    return named


def test_an_answer_naming_more_nodes_than_max_brokers_gets_that_many_served(kproxy_log):
    nodes = list(range(1, 301))
    with StandInBroker(brokers_answer(nodes, coordinator=500)) as broker, \
            ProxyThread(upstream=broker.address, max_brokers=40) as proxy:
        before = open_fds()
        client = RawClient(proxy.bootstrap)
        metadata = client.roundtrip(METADATA, 12, topics=None)
        listed = served(proxy, metadata, METADATA, 12)
        assert sorted(n for n, _, _ in listed) == nodes[:40]
        assert len(proxy.runtime.proxy.bound_ports) == 40
        assert open_fds() - before <= 40 + 5           # a listener each, the client's connections
        # A coordinator beyond the limit: not available, as while a coordinator moves.
        found = client.roundtrip(FIND_COORDINATOR, 4, key_type=0, coordinator_keys=["group"])
        coordinator, = found.body.coordinators
        assert (coordinator.node_id, coordinator.error_code) == (-1, COORDINATOR_NOT_AVAILABLE)
        assert "broker-500" not in repr(found.body)
        # One it serves already stays served.
        described = client.roundtrip(DESCRIBE_CLUSTER, 1)
        assert len(served(proxy, described, DESCRIBE_CLUSTER, 1)) == 40
        client.close()
    assert not broker.failures
    left_out = [r.getMessage() for r in kproxy_log.records if "left out" in r.getMessage()]
    assert left_out and all("max_brokers (40)" in line for line in left_out)
    assert len(left_out) <= 4, left_out                  # within the log budget, not one per node


def test_brokers_replaced_over_time_never_use_up_max_brokers(kproxy_log):
    nodes = [1, 2, 3]
    with StandInBroker(lambda request: brokers_answer(nodes)(request)) as broker, \
            ProxyThread(upstream=broker.address, max_brokers=3) as proxy:
        client = RawClient(proxy.bootstrap)
        for generation in range(4):                      # every broker replaced, four times
            nodes[:] = [10 * generation + n for n in (1, 2, 3)]
            listed = served(proxy, client.roundtrip(METADATA, 12, topics=None), METADATA, 12)
            assert sorted(n for n, _, _ in listed) == nodes
            assert set(proxy.runtime.proxy.bound_ports) == set(nodes)
        client.close()
    assert not any("left out" in r.getMessage() for r in kproxy_log.records)


@pytest.mark.parametrize("odd", [70_000, 2**31 - 1, "below"])
def test_a_node_with_no_port_by_the_rule_is_left_out_not_an_internal_error(kproxy_log, odd):
    """The offset rule gives node N port base + N: past 65,535 (or below 1) there is none."""
    base = free_ports(2, consecutive=True)[0] - 1        # nodes 1 and 2's ports are free
    odd = -base - 10 if odd == "below" else odd
    with StandInBroker(brokers_answer([1, odd, 2])) as broker, \
            ProxyThread(upstream=broker.address, broker_port_base=base) as proxy:
        client = RawClient(proxy.bootstrap)
        metadata = client.roundtrip(METADATA, 12, topics=None)
        listed = served(proxy, metadata, METADATA, 12)
        assert {n for n, _, _ in listed} <= {1, 2} and 1 in {n for n, _, _ in listed}
        assert metadata.body.controller_id in (1, 2)
        client.close()
    warnings = [r.getMessage() for r in kproxy_log.records
                if r.levelno == logging.WARNING and f"node {odd} " in r.getMessage()]
    assert warnings and "outside 1-65535" in warnings[0] and "broker_port_map" in warnings[0]


def test_controllers_that_are_no_broker_kproxy_serves_are_left_out(kproxy_log):
    """DescribeCluster for controllers (KIP-919) and DescribeQuorum name controllers: one
    sharing its node id with a broker kproxy serves (combined mode) keeps that broker's
    address, one that is a controller alone (which kproxy never listens for) is dropped
    from DescribeCluster and given port 0 in DescribeQuorum, which only reports."""
    controllers = [1, 3000]

    def answer(request):
        key, version = request.api_key, request.api_version
        if key == DESCRIBE_CLUSTER:
            body = new_body("response", key, version, cluster_id="standin", controller_id=1, endpoint_type=2,
                            brokers=[Struct(broker_id=n, host=f"controller-{n}.internal", port=9093, rack=None)
                                     for n in controllers])
        elif key == DESCRIBE_QUORUM:
            body = new_body("response", key, version, nodes=[Struct(node_id=n, listeners=[Struct(
                name="CONTROLLER", host=f"controller-{n}.internal", port=9093)]) for n in controllers])
        else:
            return brokers_answer([1, 2])(request)
        return encode_response(Response(request.correlation_id, body), key, version)

    with StandInBroker(answer) as broker, ProxyThread(upstream=broker.address) as proxy:
        client = RawClient(proxy.bootstrap)
        client.roundtrip(METADATA, 12, topics=None)                      # brokers 1 and 2 served
        described = client.roundtrip(DESCRIBE_CLUSTER, 1, endpoint_type=2)
        assert [n for n, _, _ in served(proxy, described, DESCRIBE_CLUSTER, 1)] == [1]
        quorum = client.roundtrip(DESCRIBE_QUORUM, 2)
        ports = {node.node_id: [listener.port for listener in node.listeners] for node in quorum.body.nodes}
        assert ports[3000] == [0] and ports[1] == [proxy.runtime.proxy.bound_ports[1]]
        assert "controller-" not in repr(described.body) + repr(quorum.body)
        client.close()
    assert not broker.failures
    assert any("node 3000 is left out" in r.getMessage() for r in kproxy_log.records)
