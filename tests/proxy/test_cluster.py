"""kproxy in front of real Kafka deployments: a three-broker cluster, TLS, SASL.

- Gateway: one kproxy before a three-node KRaft cluster; producer and consumer
  keep going while a partition's leader broker is restarted, follow the leader
  through kproxy (its listener is retired and reopened with the broker), and
  lose nothing.
- Sidecar: one kproxy beside each broker, each advertising every node by rule;
  clients bootstrapped at one sidecar reach all partitions through the others.
- TLS on both sides (mutual towards the broker), hostname verification that
  fails closed, optional client certificates.
- SASL PLAIN and SCRAM-SHA-512 pass through untouched, including the raw
  tokens of SaslHandshake v0; a wrong password is an ordinary client error.

In every case clients must see only kproxy's addresses, never a broker's.
Each group of tests starts its own brokers (class-scoped, so at most one
group's JVMs run at a time on this shared machine).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from kproxy.embedded import KafkaCluster
from kproxy.protocol import Struct, decode_response
from kproxy.protocol.events import RequestReceived, ResponseReceived
from tests.proxy.certs import PKI
from tests.proxy.cluster import (ADMIN_TIMEOUT_S, CONSUME_TIMEOUT_S, LEADER_MOVE_TIMEOUT_S, SHUTDOWN_TIMEOUT_S,
                                 api_trace, assert_no_upstream_address, create_topic, leads_again, port_free_on,
                                 stop_partition_0_leader, topic_name, upstream_addresses)
from tests.proxy.harness import (GROUP_TIMEOUTS, PASSWORD, SCRAM_USER, ConfluentTraffic, ProxyThread, free_ports,
                                 http_status, sasl_config, ssl_config, wait_for)
from tests.proxy.wire import METADATA, RawClient, api_versions_ok, framed

pytestmark = [pytest.mark.broker, pytest.mark.timeout(300)]

PROGRESS = 100                    # messages that must get through in each phase of the restart
DESCRIBE_QUORUM = 55


@pytest.fixture(autouse=True)
def no_errors_logged(kproxy_log):
    """Every test here fails if kproxy or asyncio logged an error (see ``kproxy_log``)."""
    yield


# ---------------------------------------------------------------- helpers


def broker_addresses(metadata) -> set[tuple[str, int]]:
    return {(b.host, b.port) for b in metadata.brokers.values()}


def round_trip(config: dict, topic: str, count: int = 20) -> None:
    """Produce ``count`` messages with acks=all and consume them all back in a group."""
    from confluent_kafka import Producer

    failures = []
    producer = Producer({**config, "acks": "all"})
    for i in range(count):
        # Keyed, so the messages spread over every partition (and so every broker) the same
        # way each run: keyless ones stick to one partition at a time (librdkafka's sticky
        # partitioner), which left a sidecar idle in some runs.
        producer.produce(topic, key=f"k{i}".encode(), value=f"m{i}".encode(),
                         on_delivery=lambda err, msg: err and failures.append(err))
    assert producer.flush(ADMIN_TIMEOUT_S) == 0 and not failures
    consume(config, topic, {f"m{i}".encode() for i in range(count)})


def consume(config: dict, topic: str, expected: set[bytes]) -> None:
    from confluent_kafka import Consumer
    consumer = Consumer({**config, "group.id": f"g-{topic}", "auto.offset.reset": "earliest",
                         **GROUP_TIMEOUTS})
    consumer.subscribe([topic])
    got: set[bytes] = set()
    deadline = time.monotonic() + CONSUME_TIMEOUT_S
    try:
        while not expected <= got and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.add(msg.value())
    finally:
        consumer.close()
    assert expected <= got, f"{len(expected - got)} of {len(expected)} messages never consumed"


# ---------------------------------------------------------------- three brokers

def led_topic(admin, topic: str):
    """Metadata for ``topic`` once it lists every partition with a leader, else None."""
    metadata = admin.list_topics(topic, timeout=ADMIN_TIMEOUT_S)
    described = metadata.topics.get(topic)
    if described is None or described.error is not None or not described.partitions:
        return None
    return metadata if all(p.leader >= 0 for p in described.partitions.values()) else None


def mapped_gateway(cluster: KafkaCluster, observers=(), **settings) -> ProxyThread:
    """A gateway kproxy before ``cluster`` (to be started with ``with``), a free port mapped
    to each node; ``.advertised``: the broker addresses it hands out."""
    ports = dict(zip([n.node_id for n in cluster.nodes], free_ports(len(cluster.nodes))))
    proxy = ProxyThread(observers=observers, upstream=cluster.bootstrap_servers, broker_port_rule="map",
                        broker_port_map=ports, shutdown_timeout=SHUTDOWN_TIMEOUT_S, **settings)
    proxy.advertised = {("127.0.0.1", p) for p in ports.values()}
    return proxy


def listener_names(proxy: ProxyThread) -> set[str]:
    async def names():
        return set(proxy.runtime.proxy.listeners)
    return proxy.call(names())


class TestThreeBrokers:

    def test_gateway_follows_the_leader_across_a_broker_restart(self, cluster3, client_bytes):
        from confluent_kafka.admin import AdminClient

        trace, observe = api_trace()
        with mapped_gateway(cluster3, [observe]) as proxy:
            advertised = proxy.advertised
            admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
            topic = topic_name("restart")
            create_topic(admin, topic, partitions=6, replication=3, **{"min.insync.replicas": "2"})
            assert broker_addresses(admin.list_topics(timeout=ADMIN_TIMEOUT_S)) == advertised
            all_listeners = {"bootstrap", "broker-1", "broker-2", "broker-3"}
            wait_for(lambda: listener_names(proxy) == all_listeners, ADMIN_TIMEOUT_S,
                     "one listener per broker")

            traffic = ConfluentTraffic(proxy.bootstrap, topic, CONSUME_TIMEOUT_S)
            traffic.start()
            traffic.wait_for_progress(PROGRESS, "before the restart")

            leader = stop_partition_0_leader(cluster3, admin, topic)
            traffic.wait_for_progress(PROGRESS, f"while node {leader} is down")
            wait_for(lambda: len(admin.list_topics(timeout=ADMIN_TIMEOUT_S).brokers) == 2
                     and f"broker-{leader}" not in listener_names(proxy),
                     ADMIN_TIMEOUT_S, f"node {leader}'s listener to be retired with it")

            cluster3.start_node(leader)
            wait_for(lambda: len(admin.list_topics(timeout=ADMIN_TIMEOUT_S).brokers) == 3
                     and listener_names(proxy) == all_listeners,
                     ADMIN_TIMEOUT_S, f"node {leader} and its listener to come back")

            # Hand leadership back to the restarted broker (it is partition 0's preferred
            # replica) once it is in sync again: clients must find it at its new listener.
            wait_for(lambda: leads_again(admin, topic, 6, leader), LEADER_MOVE_TIMEOUT_S,
                     f"node {leader} to lead again")
            returned = time.monotonic()
            traffic.wait_for_progress(PROGRESS, f"after node {leader} leads again")
            traffic.finish()

            assert not traffic.delivery_errors
            assert traffic.delivered == set(range(traffic.produced)), "a message was not acknowledged"
            assert traffic.delivered <= traffic.consumed
            assert any(listener == f"broker-{leader}" and isinstance(e, RequestReceived)
                       and e.api_key == 0 for t, listener, e in trace if t > returned), \
                "no Produce reached the restarted leader through its reopened listener"
        assert_no_upstream_address(client_bytes, upstream_addresses(cluster3), advertised)

    @pytest.mark.parametrize("rule", ["offset", "fixed"])
    def test_sidecars(self, cluster3, client_bytes, rule):
        """One kproxy per broker. ``offset``: all on 127.0.0.1, port = base + node id.
        ``fixed``: every sidecar on the same port, each on its own address (as pods are),
        advertised by the template ``127.0.0.1{node_id}``."""
        from confluent_kafka.admin import AdminClient

        nodes = cluster3.nodes
        settings = {}
        if rule == "offset":
            base = free_ports(len(nodes) + 1, consecutive=True)[0]
            for node in nodes:
                settings[node.node_id] = dict(listen=f"127.0.0.1:{base + node.node_id}",
                                              broker_port_base=base)
            advertised = {("127.0.0.1", base + n.node_id) for n in nodes}
        else:
            hosts = {n.node_id: f"127.0.0.1{n.node_id}" for n in nodes}
            port = port_free_on(hosts.values())
            for node in nodes:
                settings[node.node_id] = dict(listen=f"{hosts[node.node_id]}:{port}",
                                              advertised_host_template="127.0.0.1{node_id}")
            advertised = {(h, port) for h in hosts.values()}
        traces = {}
        with contextlib.ExitStack() as stack:
            sidecars = {}
            for node in nodes:
                traces[node.node_id], observe = api_trace()
                sidecars[node.node_id] = stack.enter_context(ProxyThread(
                    observers=[observe], mode="sidecar", upstream=f"{node.host}:{node.port}",
                    broker_port_rule=rule, shutdown_timeout=SHUTDOWN_TIMEOUT_S,
                    **settings[node.node_id]))
            config = {"bootstrap.servers": sidecars[nodes[0].node_id].bootstrap}

            admin = AdminClient(config)
            topic = topic_name(f"sidecar-{rule}")
            create_topic(admin, topic, partitions=6, replication=1)
            metadata = wait_for(lambda: led_topic(admin, topic), ADMIN_TIMEOUT_S,
                                "every partition of the new topic to have a leader")
            assert broker_addresses(metadata) == advertised
            leaders = {p.leader for p in metadata.topics[topic].partitions.values()}
            assert leaders == {n.node_id for n in nodes}, "partitions should be led by every broker"
            round_trip(config, topic, count=60)

            for node in nodes:               # each sidecar served Produce for its own partitions
                assert any(isinstance(e, RequestReceived) and e.api_key == 0
                           for _, _, e in traces[node.node_id]), f"sidecar {node.node_id} idle"
        assert_no_upstream_address(client_bytes, upstream_addresses(cluster3), advertised)


    def test_describe_quorum_leaves_broker_listeners_alone(self, cluster3, client_bytes):
        """DescribeQuorum lists the controllers' listeners under the same node ids as the
        brokers (combined mode): kproxy hides those addresses too, but must keep routing
        broker-<id> to the broker (it used to re-point it at the controller port)."""
        trace, observe = api_trace()
        with mapped_gateway(cluster3, [observe]) as proxy:
            advertised = proxy.advertised
            client = RawClient(proxy.bootstrap)
            client.roundtrip(METADATA, 12, topics=None)
            quorum = client.roundtrip(DESCRIBE_QUORUM, 2, topics=[Struct(
                topic_name="__cluster_metadata", partitions=[Struct(partition_index=0)])])
            client.close()
            listed = {(l.host, l.port) for node in quorum.body.nodes for l in node.listeners}
            assert listed == advertised
            for address in advertised:                # each broker listener still reaches a broker
                broker = RawClient(address)
                metadata = broker.roundtrip(METADATA, 12, topics=None)
                assert {(b.host, b.port) for b in metadata.body.brokers} == advertised
                broker.close()
        # The event's decoded ``response`` is the rewritten one; its frame is what the broker sent.
        [original] = [decode_response(e.frame, DESCRIBE_QUORUM, 2) for _, _, e in trace
                      if isinstance(e, ResponseReceived) and e.api_key == DESCRIBE_QUORUM]
        controllers = {(l.host, l.port) for node in original.body.nodes for l in node.listeners}
        assert len(controllers) == 3
        assert_no_upstream_address(client_bytes, [*upstream_addresses(cluster3), *controllers],
                                   advertised)


# ---------------------------------------------------------------- TLS

class Impostor:
    """A TLS server with a certificate the CA really signed, but for another name."""

    def __init__(self, identity):
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(identity.cert, identity.key)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.address = self.listener.getsockname()
        self.handshakes: list[str] = []         # "ok" or the error
        self.received = b""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while not self._stop.is_set():
            try:
                raw, _ = self.listener.accept()
            except socket.timeout:
                continue
            raw.settimeout(5)
            try:
                with self.context.wrap_socket(raw, server_side=True) as conn:
                    data = conn.recv(4096)       # the handshake ends with the first read
                    self.handshakes.append("ok")
                    self.received += data
            except (OSError, ssl.SSLError) as exc:
                self.handshakes.append(repr(exc))
                raw.close()

    def close(self):
        self._stop.set()
        self._thread.join(5)
        self.listener.close()


@pytest.fixture
def impostor(pki) -> Iterator[Impostor]:
    server = Impostor(pki.impostor)
    yield server
    server.close()


def tls_proxy(cluster: KafkaCluster, pki: PKI, observers=(), **tls_server) -> ProxyThread:
    return mapped_gateway(
        cluster, observers,
        tls_client={"ca_file": str(pki.ca), "cert_file": str(pki.client.cert),
                    "key_file": str(pki.client.key), "check_hostname": True},
        tls_server={"cert_file": str(pki.server.cert), "key_file": str(pki.server.key), **tls_server})


def tls_answer(proxy: ProxyThread, pki: PKI, identity=None) -> bytes | str:
    """Send ApiVersions v0 over Python's TLS (presenting ``identity`` if given); the bytes
    kproxy answered (empty if it closed), or the TLS error that ended the connection."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    if identity is not None:
        context.load_cert_chain(identity.cert, identity.key)
    host, port = proxy.runtime.proxy.bootstrap_address
    raw = socket.create_connection((host, port), timeout=ADMIN_TIMEOUT_S)
    try:
        with context.wrap_socket(raw, server_hostname=host) as conn:
            # TLS 1.3 clients finish their handshake before the server checks their
            # certificate: a refusal shows on the first read.
            conn.sendall(framed(b"\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff"))
            answer = conn.recv(4096)
            while 4 <= len(answer) < 4 + int.from_bytes(answer[:4], "big"):   # one whole frame
                more = conn.recv(4096)
                if not more:
                    break
                answer += more
            return answer
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as exc:
        return repr(exc)


class TestTLS:

    def test_tls_on_both_sides(self, tls_cluster, pki, client_bytes):
        """TLS from the client to kproxy and mutual TLS from kproxy to the broker; kproxy
        still decodes everything, and rewrites addresses inside the encrypted streams."""
        trace, observe = api_trace()
        with tls_proxy(tls_cluster, pki, observers=[observe]) as proxy:
            from confluent_kafka.admin import AdminClient
            config = ssl_config(proxy, pki)
            metadata = AdminClient(config).list_topics(timeout=ADMIN_TIMEOUT_S)
            assert broker_addresses(metadata) == proxy.advertised
            round_trip(config, topic_name("tls"))
        apis = {e.api_key for _, _, e in trace if isinstance(e, ResponseReceived)
                and e.decode_error is None}
        assert {0, 1, 3, 10} <= apis               # Produce, Fetch, Metadata, FindCoordinator
        assert_no_upstream_address(client_bytes, upstream_addresses(tls_cluster), proxy.advertised)

    def test_hostname_mismatch_fails_closed(self, pki, impostor, caplog):
        """A broker whose CA-signed certificate names another host: kproxy refuses it and
        closes the client; with hostname checks off the same server is accepted (control)."""
        caplog.set_level(logging.INFO, logger="kproxy")
        def proxy_to_impostor(check_hostname: bool) -> ProxyThread:
            return ProxyThread(upstream=f"{impostor.address[0]}:{impostor.address[1]}",
                               tls_client={"ca_file": str(pki.ca), "check_hostname": check_hostname},
                               shutdown_timeout=SHUTDOWN_TIMEOUT_S)

        with proxy_to_impostor(check_hostname=True) as proxy:
            for _ in range(2):                  # the second client proves kproxy stayed up
                client = RawClient(proxy.bootstrap)
                client.send(b"\x00\x00\x00\x0a" + b"\x00" * 10)
                elapsed, received = client.wait_closed()
                assert received == 0
            assert http_status(proxy.admin_url + "/healthz")[0] == 200
        refusals = [r.getMessage() for r in caplog.records if "upstream unreachable" in r.getMessage()]
        assert len(refusals) == 1 and "mismatch" in refusals[0], refusals   # the same cause: once a minute
        assert impostor.received == b"", "bytes reached a server that failed verification"

        with proxy_to_impostor(check_hostname=False) as proxy:
            client = RawClient(proxy.bootstrap)
            # An ApiVersions v0 header: all zeros would be a Produce v0 cut before its acks,
            # which kproxy refuses to forward (it cannot tell whether it is answered).
            client.send(b"\x00\x00\x00\x0a\x00\x12" + b"\x00" * 8)
            wait_for(lambda: impostor.received, ADMIN_TIMEOUT_S, "the control connection's bytes")
            client.close()

    def test_untrusted_broker_certificate_fails_closed(self, tls_cluster, pki, caplog):
        caplog.set_level(logging.INFO, logger="kproxy")
        with ProxyThread(upstream=tls_cluster.bootstrap_servers, shutdown_timeout=SHUTDOWN_TIMEOUT_S,
                         tls_client={"ca_file": str(pki.other_ca)}) as proxy:
            client = RawClient(proxy.bootstrap)
            client.send(b"\x00\x00\x00\x0a" + b"\x00" * 10)
            _, received = client.wait_closed()
            assert received == 0
            assert http_status(proxy.admin_url + "/healthz")[0] == 200
        assert any("upstream unreachable" in r.getMessage() and "certificate verify failed"
                   in r.getMessage() for r in caplog.records)

    def test_client_certificates_required(self, tls_cluster, pki):
        with tls_proxy(tls_cluster, pki, client_ca_file=str(pki.ca)) as proxy:
            for identity in (None, pki.stranger):          # no certificate; an unknown CA's
                answer = tls_answer(proxy, pki, identity)
                assert answer == b"" or isinstance(answer, str), "kproxy served an unknown client"
            answer = tls_answer(proxy, pki, pki.client)                      # control
            assert isinstance(answer, bytes) and answer[4:8] == b"\x00\x00\x00\x01"
            config = ssl_config(proxy, pki, **{"ssl.certificate.location": str(pki.client.cert),
                                               "ssl.key.location": str(pki.client.key)})
            round_trip(config, topic_name("mtls"))


# ---------------------------------------------------------------- SASL

@pytest.fixture
def sasl_proxy(sasl_cluster) -> Iterator[ProxyThread]:
    trace, observe = api_trace()
    with mapped_gateway(sasl_cluster, [observe]) as proxy:
        proxy.trace = trace
        yield proxy


SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
SASL_AUTHENTICATION_FAILED = 58


class TestSASL:

    @pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
    def test_authenticates_through_kproxy(self, sasl_cluster, sasl_proxy, client_bytes, mechanism):
        from confluent_kafka.admin import AdminClient
        config = sasl_config(sasl_proxy, mechanism)
        assert broker_addresses(AdminClient(config).list_topics(timeout=ADMIN_TIMEOUT_S)) == \
            sasl_proxy.advertised
        round_trip(config, topic_name(f"sasl-{mechanism.lower()}"))
        auth = [e for _, _, e in sasl_proxy.trace
                if isinstance(e, ResponseReceived) and e.api_key == SASL_AUTHENTICATE]
        assert auth and all(e.response.body.error_code == 0 for e in auth)
        # SCRAM's server signature covers the client's nonce: a single altered byte and
        # the client would have refused the broker. Passing through means untouched.
        assert_no_upstream_address(client_bytes, upstream_addresses(sasl_cluster), sasl_proxy.advertised)

    @pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
    def test_wrong_password_is_a_clean_client_error(self, sasl_proxy, mechanism):
        from confluent_kafka import KafkaError, Producer
        errors = []
        producer = Producer({**sasl_config(sasl_proxy, mechanism, password="not-it"),
                             "error_cb": errors.append})
        deadline = time.monotonic() + ADMIN_TIMEOUT_S
        while not any(e.code() == KafkaError._AUTHENTICATION for e in errors):
            assert time.monotonic() < deadline, f"no authentication error, got {errors}"
            producer.poll(0.2)
        del producer
        answers = [e.response.body.error_code for _, _, e in sasl_proxy.trace
                   if isinstance(e, ResponseReceived) and e.api_key == SASL_AUTHENTICATE]
        assert SASL_AUTHENTICATION_FAILED in answers      # the broker's verdict, passed on
        assert http_status(sasl_proxy.admin_url + "/healthz")[0] == 200
        round_trip(sasl_config(sasl_proxy, mechanism), topic_name("sasl-after"))   # still serving

    def test_sasl_handshake_v0_raw_tokens(self, sasl_proxy):
        """SaslHandshake v0: the PLAIN token goes without a Kafka header; kproxy passes it
        and the answer, then decodes and rewrites the Metadata that follows."""
        client = RawClient(sasl_proxy.bootstrap)
        api_versions_ok(client)
        handshake = client.roundtrip(SASL_HANDSHAKE, 0, mechanism="PLAIN")
        assert handshake.body.error_code == 0
        client.send(framed(f"\0{SCRAM_USER}\0{PASSWORD}".encode()))
        size, = struct.unpack(">i", client._recv_exactly(4))
        client._recv_exactly(size)               # the broker's (empty) raw answer
        metadata = client.roundtrip(METADATA, 12, topics=None)
        assert {(b.host, b.port) for b in metadata.body.brokers} == sasl_proxy.advertised
        client.close()
