"""A broker listener kproxy cannot bind: clients are never handed its address.

The port is taken before kproxy needs it (bound by the test itself, so nothing
races for it). Until kproxy can bind it, the node is left out of every response,
``/readyz`` is 503 with the reason, a metric counts the attempts and the log says
it once; once the port frees, kproxy binds it and clients carry on.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import struct
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kproxy import config as config_module
from kproxy.observers.metrics import Metrics
from kproxy.protocol.connection import Connection
from kproxy.proxy import listeners as listeners_module
from kproxy.proxy.rewrite import LEADER_NOT_AVAILABLE, NO_NODE
from kproxy.proxy.listeners import BIND_RETRY_MAX_S
from kproxy.proxy.server import Proxy
from tests.proxy.harness import ProxyThread, http_status, wait_for
from tests.proxy.wire import METADATA, RawClient, create_topic

RESPONSE_TIMEOUT_S = 30.0         # a broker answer, or a client's retry, on a busy 2-core machine
RETRIES_SEEN = 3                  # failed binds to see before checking that the log said it once
MESSAGES = 20
UNSERVED_LOG = "cannot listen for node"


def occupy_port() -> socket.socket:
    """A listening socket on a port the OS picked: taken for as long as the test keeps it."""
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(1)
    return blocker


def scrape(proxy: ProxyThread) -> dict[tuple[str, tuple], float]:
    _, text = http_status(proxy.admin_url + "/metrics")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def bind_failures(proxy: ProxyThread, node_id: int) -> float:
    return scrape(proxy).get(("kproxy_listener_bind_failures_total",
                              (("listener", f"broker-{node_id}"), ("reason", "address_in_use"))), 0.0)


def unbound_gauge(proxy: ProxyThread) -> float:
    return scrape(proxy)[("kproxy_broker_listeners_unbound", ())]


# ---------------------------------------------------------------- without a broker


def test_port_base_zero_means_chosen_by_the_os_in_gateway_mode_only():
    config = config_module.build({"upstream": "h:1", "listen": "127.0.0.1:0", "broker_port_base": 0})
    assert Proxy(config).port_for(3) == 0                   # nothing bound yet: nothing to advertise
    with pytest.raises(config_module.ConfigError, match="sibling sidecars disagree"):
        config_module.build({"upstream": "h:1", "mode": "sidecar", "broker_port_base": 0})
    with pytest.raises(config_module.ConfigError, match="0 lets the OS choose"):
        config_module.build({"upstream": "h:1", "listen": "127.0.0.1:0"})


def test_failures_are_counted_each_time_and_logged_once_per_cause(monkeypatch, caplog):
    """Bind errors as an unprivileged user or a vanished address would see them."""
    causes = iter([errno.EACCES, errno.EACCES, errno.EADDRNOTAVAIL, errno.EACCES])

    def refuse(self, host, port):
        code = next(causes, errno.EACCES)
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(listeners_module, "BIND_RETRY_FIRST_S", 0.01)
    monkeypatch.setattr(listeners_module, "BIND_RETRY_MAX_S", 0.01)
    metrics = Metrics()
    config = config_module.build({"upstream": "127.0.0.1:1", "listen": "127.0.0.1:0",
                                  "broker_port_rule": "map", "broker_port_map": {1: 443}})
    proxy = Proxy(config, [metrics])
    caplog.set_level(logging.INFO, logger="kproxy")

    def failures(reason: str) -> float:
        return metrics.registry.get_sample_value(
            "kproxy_listener_bind_failures_total", {"listener": "broker-1", "reason": reason}) or 0.0

    async def run() -> list[str]:
        monkeypatch.setattr(listeners_module.Listeners, "bind", refuse)
        for _ in range(3):                                  # three Metadata responses name it
            assert proxy.advertise(1, "10.0.0.1", 9092) == ("127.0.0.1", 443)
        assert failures("permission_denied") == 1           # then the retry task is in charge
        while failures("permission_denied") < 4:
            await asyncio.sleep(0.01)
        reasons = proxy.unbound_reasons()
        await proxy.stop()
        return reasons

    reasons = asyncio.run(run())
    warned = [r.getMessage() for r in caplog.records if UNSERVED_LOG in r.getMessage()]
    assert len(warned) == 2, warned                        # EACCES once, EADDRNOTAVAIL once
    assert "Permission denied" in warned[0] and "Cannot assign requested address" in warned[1]
    assert failures("address_not_available") == 1
    assert len(reasons) == 1 and reasons[0].startswith("broker-1: cannot listen on 127.0.0.1:443: ")


def test_a_freed_port_is_bound_and_advertised(caplog):
    """Real sockets, no broker: the retry picks the port up once its holder lets go."""
    blocker = occupy_port()
    port = blocker.getsockname()[1]
    config = config_module.build({"upstream": "127.0.0.1:1", "listen": "127.0.0.1:0",
                                  "broker_port_rule": "map", "broker_port_map": {7: port}})
    proxy = Proxy(config)
    caplog.set_level(logging.INFO, logger="kproxy")

    async def run():
        await proxy.start()
        proxy.advertise(7, "10.0.0.7", 9092)
        assert 7 in proxy.unbound and proxy.broker_addresses() == {}
        assert "Address already in use" in proxy.unbound_reasons()[0]
        blocker.close()
        deadline = time.monotonic() + BIND_RETRY_MAX_S + RESPONSE_TIMEOUT_S
        while proxy.unbound and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        addresses = proxy.broker_addresses()
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass                                            # it accepts connections
        await proxy.stop()
        return addresses

    try:
        assert asyncio.run(run()) == {7: ("127.0.0.1", port)}
    finally:
        blocker.close()
    assert any(f"listening for node 7 on 127.0.0.1:{port} after" in r.getMessage()
               for r in caplog.records)


# ---------------------------------------------------------------- a real broker and client


@pytest.fixture
def sent_to_clients(monkeypatch):
    """Bytes kproxy forwards to clients, each with whether a broker listener was unbound then."""
    seen: list[tuple[bool, bytes]] = []
    original = Connection.relay_broker
    proxies: list[Proxy] = []

    def recording(self, data):
        events, out = original(self, data)
        unbound = any(p.unbound for p in proxies)          # on kproxy's loop: consistent with out
        seen.extend((unbound, bytes(chunk)) for chunk in out)
        return events, out

    monkeypatch.setattr(Connection, "relay_broker", recording)
    return seen, proxies


@pytest.mark.broker
@pytest.mark.timeout(240)
def test_occupied_broker_port_is_withheld_until_it_frees(kafka_cluster, kproxy_log, sent_to_clients):
    from confluent_kafka import Consumer, Producer

    seen, proxies = sent_to_clients
    [node] = kafka_cluster.nodes
    topic = create_topic(kafka_cluster.bootstrap_servers)
    blocker = occupy_port()
    port = blocker.getsockname()[1]
    withheld = b"127.0.0.1" + struct.pack(">i", port)
    try:
        with ProxyThread(upstream=kafka_cluster.bootstrap_servers, broker_port_rule="map",
                         broker_port_map={node.node_id: port}, shutdown_timeout=5.0) as proxy:
            proxies.append(proxy.runtime.proxy)
            delivered = []
            producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "all",
                                 "message.timeout.ms": 120_000})
            for i in range(MESSAGES):
                producer.produce(topic, value=b"m%d" % i,
                                 on_delivery=lambda err, msg: delivered.append(err))
            producer.poll(0)
            wait_for(lambda: bind_failures(proxy, node.node_id) >= RETRIES_SEEN, RESPONSE_TIMEOUT_S,
                     f"{RETRIES_SEEN} failed binds")

            # Meanwhile: not ready, and why; the gauge; nothing delivered, nothing failed.
            status, text = http_status(proxy.admin_url + "/readyz")
            assert status == 503
            assert text.startswith(f"broker-{node.node_id}: cannot listen on 127.0.0.1:{port}: "
                                   f"Address already in use"), text
            assert unbound_gauge(proxy) == 1
            producer.poll(1.0)
            assert delivered == [] and len(producer) == MESSAGES

            # What a client is told: no broker, no leader (retriable), never the unserved port.
            client = RawClient(proxy.bootstrap)
            body = client.roundtrip(METADATA, 12, topics=None).body
            client.close()
            assert body.brokers == [] and body.controller_id == NO_NODE
            [partition] = next(t for t in body.topics if t.name == topic).partitions
            assert (partition.leader_id, partition.error_code) == (NO_NODE, LEADER_NOT_AVAILABLE)

            # The log said it once, however many responses and retries since.
            warned = [r for r in kproxy_log.records if UNSERVED_LOG in r.getMessage()]
            assert len(warned) == 1 and warned[0].levelno == logging.WARNING, warned
            assert f"127.0.0.1:{port}: Address already in use" in warned[0].getMessage()

            blocker.close()
            wait_for(lambda: http_status(proxy.admin_url + "/readyz")[0] == 200,
                     BIND_RETRY_MAX_S + RESPONSE_TIMEOUT_S, "/readyz to turn 200 once the port is free")
            assert producer.flush(RESPONSE_TIMEOUT_S) == 0
            assert delivered == [None] * MESSAGES
            assert proxy.served_broker_addresses() == {("127.0.0.1", port)}
            assert unbound_gauge(proxy) == 0

            consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": f"g-{topic}",
                                 "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
            consumer.subscribe([topic])
            got = set()
            deadline = time.monotonic() + 2 * RESPONSE_TIMEOUT_S
            while len(got) < MESSAGES and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None:
                    got.add(msg.value())
            consumer.close()
            assert got == {b"m%d" % i for i in range(MESSAGES)}
    finally:
        blocker.close()

    while_unbound = b"".join(chunk for unbound, chunk in seen if unbound)
    after = b"".join(chunk for unbound, chunk in seen if not unbound)
    assert while_unbound, "no response reached a client while the port was taken"
    assert withheld not in while_unbound, "an unserved address was handed to a client"
    assert withheld in after                                # positive control: advertised once bound
    upstream = node.host.encode() + struct.pack(">i", node.port)
    assert upstream not in while_unbound + after
