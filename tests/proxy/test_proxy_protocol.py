"""PROXY protocol: kproxy behind a load balancer that says who the client is.

The balancer is a small TCP relay written here (on 127.0.0.1) that prepends a v1 or v2
header claiming a documentation address (203.0.113.7, never connected to) to each
connection it passes to kproxy. kproxy runs as a sidecar in front of the real embedded
broker, advertising the balancer's port, so every connection a real client makes goes
through the balancer. The claimed address must be what kproxy reports: the connection log
line (with the balancer beside it), capture rows and the live page's inventory. A client
reaching kproxy without a header, and a header from a peer outside the trusted networks,
are refused with a counted reason. PROXY + TLS: the header first, then the handshake.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time
import urllib.request
import uuid

import pytest
import uvloop

from kproxy.protocol.proxy_header import MISSING, UNTRUSTED_PEER, WRONG_VERSION
from tests.observers.captures import read_jsonl
from tests.observers.metrics import sample, scrape, scrape_until
from tests.protocol.proxy_headers import v1, v2
from tests.proxy.harness import KproxyProcess, ProxyThread, free_port, ssl_config, wait_for
from tests.proxy.wire import RawClient, api_versions_ok, create_topic

CLAIMED_HOST = "203.0.113.7"       # TEST-NET-3: only ever data in a header
CLAIMED_PORTS = itertools.count(40000)
TOKEN = "proxy-protocol-test-token-0123456789"
CLIENT_TIMEOUT_S = 60.0
RECORDS = 20
TLS_ALERT = b"\x15"                # a TLS record of content type alert


class Balancer:
    """A PROXY-protocol-sending TCP relay on 127.0.0.1: each accepted connection gets a
    connection to ``target`` that starts with ``header(claimed address)``."""

    def __init__(self, header=v2):
        self.header = header
        self.target: tuple[str, int] | None = None
        self.claimed: list[tuple[str, int]] = []
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="balancer")
        self._thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self.loop).result(10)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader, writer):
        claimed = (CLAIMED_HOST, next(CLAIMED_PORTS))
        self.claimed.append(claimed)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        up_writer.write(self.header(claimed, ("127.0.0.1", self.port)))

        async def pump(src, dst):
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    def close(self):
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


@pytest.fixture(params=["uvloop", "asyncio"])
def event_loop_kind(request, monkeypatch):
    """kproxy runs on uvloop; the header reader and start_tls are checked on asyncio's loop too."""
    if request.param == "asyncio":
        monkeypatch.setattr(uvloop, "new_event_loop", asyncio.new_event_loop)
    return request.param


def sidecar_behind(balancer: Balancer, kafka_cluster, tmp_path, **settings) -> ProxyThread:
    """A kproxy sidecar that advertises the balancer's port for its broker."""
    node = kafka_cluster.nodes[0]
    proxy = ProxyThread(upstream=f"{node.host}:{node.port}", mode="sidecar", broker_port_rule="map",
                        broker_port_map={node.node_id: balancer.port},
                        advertised_host_template="127.0.0.1", admin_token=TOKEN,
                        capture={"directory": str(tmp_path), "formats": ["jsonl"]},
                        capture_autostart=True, shutdown_timeout=5.0, **settings)
    return proxy


def produce_and_consume(config: dict, topic: str) -> None:
    from confluent_kafka import Consumer, Producer
    producer = Producer({**config, "acks": "all"})
    for i in range(RECORDS):
        producer.produce(topic, value=b"%d" % i)
    assert producer.flush(CLIENT_TIMEOUT_S) == 0
    consumer = Consumer({**config, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got = []
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    try:
        while len(got) < RECORDS and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(int(msg.value()))
    finally:
        consumer.close()
    assert sorted(got) == list(range(RECORDS))


def overview(proxy: ProxyThread) -> dict:
    request = urllib.request.Request(proxy.admin_url + "/live/overview",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.loads(r.read())


def open_lines(kproxy_log) -> list[str]:
    return [r.getMessage() for r in kproxy_log.records if " open client=" in r.getMessage()]


@pytest.mark.parametrize("version,header", [("v1", v1), ("v2", v2), ("any", v1)])
def test_the_claimed_client_address_is_reported_everywhere(version, header, kafka_cluster, kproxy_log, tmp_path):
    topic = create_topic(kafka_cluster.bootstrap_servers)
    balancer = Balancer(header)
    try:
        with sidecar_behind(balancer, kafka_cluster, tmp_path, proxy_protocol=version) as proxy:
            balancer.target = proxy.runtime.proxy.bootstrap_address
            produce_and_consume({"bootstrap.servers": f"127.0.0.1:{balancer.port}"}, topic)
            inventory = overview(proxy)["inventory"]
            samples = scrape(proxy)
    finally:
        balancer.close()
    assert balancer.claimed, "no connection went through the balancer"
    claimed_ports = {port for _, port in balancer.claimed}
    # The log line: the claimed client, and the balancer it came through.
    lines = open_lines(kproxy_log)
    assert lines and all(f"client={CLAIMED_HOST}:" in line and " via=127.0.0.1:" in line for line in lines), lines
    # Capture rows.
    rows = read_jsonl(tmp_path)
    assert {r["api_name"] for r in rows} >= {"Produce", "Fetch", "Metadata"}
    assert {r["client_host"] for r in rows} == {CLAIMED_HOST}
    assert {r["client_port"] for r in rows} <= claimed_ports
    # The live page's client inventory.
    assert {entry["address"] for entry in inventory} == {CLAIMED_HOST}
    # Nothing was refused.
    assert sum(v for (name, _), v in samples.items() if name == "kproxy_proxy_protocol_refused_total") == 0


def test_a_client_without_a_header_is_refused_and_counted(kafka_cluster, kproxy_log, tmp_path):
    balancer = Balancer()
    try:
        with sidecar_behind(balancer, kafka_cluster, tmp_path, proxy_protocol="v2") as proxy:
            balancer.target = proxy.runtime.proxy.bootstrap_address
            direct = RawClient(proxy.bootstrap)          # straight to kproxy: no balancer, no header
            direct.send_request(18, 3, client_software_name="t", client_software_version="1")
            direct.wait_closed()
            direct.close()
            # A balancer speaking v1 to a v2 listener: named as such.
            wrong = socket.create_connection(proxy.runtime.proxy.bootstrap_address)
            wrong.sendall(v1((CLAIMED_HOST, 40000)))
            try:
                assert wrong.recv(1) == b""
            except ConnectionResetError:         # closed with the rest of the line unread
                pass
            wrong.close()
            samples = scrape_until(
                lambda m: sample(m, "kproxy_proxy_protocol_refused_total", reason=WRONG_VERSION) >= 1,
                "the wrong-version refusal to be counted", proxy)
            # The balancer's connections still work beside them.
            through = RawClient(("127.0.0.1", balancer.port))
            api_versions_ok(through)
            through.close()
    finally:
        balancer.close()
    assert sample(samples, "kproxy_proxy_protocol_refused_total", reason=MISSING) == 1
    assert sample(samples, "kproxy_connections_closed_total", listener="sidecar", reason="proxy_protocol") == 2
    warnings = [r.getMessage() for r in kproxy_log.records if r.name == "kproxy.proxy_protocol"]
    assert any("no PROXY protocol header" in w and "refusing a connection from 127.0.0.1:" in w
               for w in warnings), warnings
    assert any("v1 header, but this listener takes v2 (proxy_protocol)" in w for w in warnings), warnings


def test_a_header_from_an_untrusted_peer_is_refused(kafka_cluster, kproxy_log, tmp_path):
    balancer = Balancer()
    try:
        with sidecar_behind(balancer, kafka_cluster, tmp_path, proxy_protocol="any",
                            proxy_protocol_trusted_cidrs="10.0.0.0/8,2001:db8::/32") as proxy:
            balancer.target = proxy.runtime.proxy.bootstrap_address
            client = RawClient(("127.0.0.1", balancer.port))
            client.send_request(18, 3, client_software_name="t", client_software_version="1")
            client.wait_closed()
            client.close()
            samples = scrape_until(
                lambda m: sample(m, "kproxy_proxy_protocol_refused_total", reason=UNTRUSTED_PEER) >= 1,
                "the untrusted peer's refusal to be counted", proxy)
    finally:
        balancer.close()
    assert not open_lines(kproxy_log)
    assert any("127.0.0.1 may not send a PROXY protocol header" in r.getMessage()
               and "proxy_protocol_trusted_cidrs" in r.getMessage() for r in kproxy_log.records)
    assert sample(samples, "kproxy_proxy_protocol_refused_total", reason=MISSING) == 0


@pytest.mark.parametrize("header", [v1, v2])
def test_header_and_first_request_in_one_segment_and_a_header_byte_at_a_time(header, event_loop_kind,
                                                                            kafka_cluster, tmp_path):
    """The reader takes exactly the header: a Kafka request in the same segment is relayed
    whole, and a header dribbled a byte at a time is read as well."""
    balancer = Balancer()        # only for its port, which the sidecar advertises
    try:
        with sidecar_behind(balancer, kafka_cluster, tmp_path, proxy_protocol="any") as proxy:
            address = proxy.runtime.proxy.bootstrap_address
            together = RawClient(address)
            send = together.send
            together.send = lambda data: send(header((CLAIMED_HOST, 41000)) + data)   # one segment
            api_versions_ok(together)
            together.send = send
            api_versions_ok(together)                                 # and the next request, plain
            together.close()
            dribbled = RawClient(address)
            for byte in header((CLAIMED_HOST, 41001)):
                dribbled.send(bytes([byte]))
                time.sleep(0.002)
            api_versions_ok(dribbled)
            dribbled.close()
            wait_for(lambda: sum(e["open"] + e["closed"] for e in overview(proxy)["inventory"]) >= 2,
                     10, "both connections in the live page's inventory")
            addresses = {e["address"] for e in overview(proxy)["inventory"]}
    finally:
        balancer.close()
    assert addresses == {CLAIMED_HOST}


def test_proxy_protocol_then_tls(event_loop_kind, kafka_cluster, kproxy_log, pki, tmp_path):
    topic = create_topic(kafka_cluster.bootstrap_servers)
    balancer = Balancer(v2)
    try:
        with sidecar_behind(balancer, kafka_cluster, tmp_path, proxy_protocol="v2",
                            tls_server={"cert_file": str(pki.server.chain), "key_file": str(pki.server.key)}) as proxy:
            balancer.target = proxy.runtime.proxy.bootstrap_address
            config = ssl_config(proxy, pki)
            config["bootstrap.servers"] = f"127.0.0.1:{balancer.port}"
            produce_and_consume(config, topic)
            # Plain Kafka through the balancer on a TLS listener: the header is taken, the
            # handshake fails and is counted as such.
            client = RawClient(("127.0.0.1", balancer.port))
            client.send_request(18, 3, client_software_name="t", client_software_version="1")
            assert client.sock.recv(1) == TLS_ALERT       # the handshake's answer: an alert
            client.close()
            samples = scrape_until(lambda m: sum(v for (name, _), v in m.items()
                                                 if name == "kproxy_tls_handshake_failures_total") >= 1,
                                   "the failed handshake to be counted", proxy)
    finally:
        balancer.close()
    lines = open_lines(kproxy_log)
    assert lines and all(f"client={CLAIMED_HOST}:" in line for line in lines), lines
    assert {r["client_host"] for r in read_jsonl(tmp_path)} == {CLAIMED_HOST}
    assert sum(v for (name, _), v in samples.items() if name == "kproxy_tls_handshake_failures_total") >= 1
    assert sum(v for (name, _), v in samples.items() if name == "kproxy_proxy_protocol_refused_total") == 0


def test_workers_read_the_header_too(kafka_cluster, tmp_path):
    """``kproxy run --workers 2``: every worker's listener takes the header (the setting
    reaches the workers), and refuses a client without one."""
    topic = create_topic(kafka_cluster.bootstrap_servers)
    node = kafka_cluster.nodes[0]
    listen = free_port()                 # workers share one fixed port (SO_REUSEPORT)
    balancer = Balancer(v1)
    balancer.target = ("127.0.0.1", listen)
    try:
        with KproxyProcess(tmp_path, upstream=f"{node.host}:{node.port}", mode="sidecar", workers=2,
                           listen=f"127.0.0.1:{listen}",
                           broker_port_rule="map", broker_port_map={node.node_id: balancer.port},
                           advertised_host_template="127.0.0.1", proxy_protocol="v1",
                           shutdown_timeout=10) as kproxy:
            produce_and_consume({"bootstrap.servers": f"127.0.0.1:{balancer.port}"}, topic)
            direct = RawClient(kproxy.bootstrap)
            direct.send_request(18, 3, client_software_name="t", client_software_version="1")
            direct.wait_closed()
            direct.close()
            samples = scrape_until(
                lambda m: sample(m, "kproxy_proxy_protocol_refused_total", reason=MISSING) >= 1,
                "the refusal to be counted", kproxy)
            log = kproxy.log_text()
    finally:
        balancer.close()
    opened = [line for line in log.splitlines() if " open client=" in line]
    assert opened and all(f"client={CLAIMED_HOST}:" in line and " via=127.0.0.1:" in line for line in opened)
    assert sample(samples, "kproxy_connections_closed_total", listener="sidecar", reason="proxy_protocol") >= 1


def test_gateway_broker_listeners_take_the_header_and_a_local_header_is_the_balancer(kafka_cluster, kproxy_log):
    """Gateway mode: the per-broker listeners kproxy opens read the header as the bootstrap
    does; a v2 LOCAL header (a balancer's own health check) leaves the peer as the client."""
    with ProxyThread(upstream=kafka_cluster.bootstrap_servers, proxy_protocol="v2") as proxy:
        bootstrap = RawClient(proxy.bootstrap)
        bootstrap.send(v2((CLAIMED_HOST, 42000)))
        metadata = bootstrap.roundtrip(3, 12, topics=None, allow_auto_topic_creation=False,
                                       include_topic_authorized_operations=False)
        bootstrap.close()
        brokers = [(b.host, b.port) for b in metadata.body.brokers]
        assert brokers and set(brokers) == proxy.served_broker_addresses()
        broker = RawClient(brokers[0])
        broker.send(v2((CLAIMED_HOST, 42001)))
        api_versions_ok(broker)
        broker.close()
        unheaded = RawClient(brokers[0])
        unheaded.send_request(18, 3, client_software_name="t", client_software_version="1")
        unheaded.wait_closed()
        unheaded.close()
        check = RawClient(proxy.bootstrap)
        check.send(v2((CLAIMED_HOST, 42002), local=True))
        api_versions_ok(check)
        check.close()
        samples = scrape_until(
            lambda m: sample(m, "kproxy_proxy_protocol_refused_total", reason=MISSING) >= 1,
            "the refusal on the broker listener to be counted", proxy)
    listener = f"broker-{metadata.body.brokers[0].node_id}"
    assert sample(samples, "kproxy_connections_closed_total", listener=listener, reason="proxy_protocol") == 1
    lines = open_lines(kproxy_log)
    assert any(f"client={CLAIMED_HOST}:42000 via=127.0.0.1:" in line and "listener=bootstrap" in line for line in lines)
    assert any(f"client={CLAIMED_HOST}:42001 via=127.0.0.1:" in line and f"listener={listener}" in line
               for line in lines)
    local = [line for line in lines if f"client=127.0.0.1:{check.port} " in line]
    assert local and "via=" not in local[0], lines


def test_a_header_not_complete_in_time_and_a_bare_health_check(kafka_cluster, kproxy_log, monkeypatch):
    """A peer that sends part of a header and stops is closed at the header's deadline
    (counted as timeout, logged); one that connects and closes (a TCP health check) is
    counted as closed, not logged as a warning."""
    from kproxy.proxy import proxy_protocol
    monkeypatch.setattr(proxy_protocol, "PROXY_HEADER_TIMEOUT_S", 0.5)
    with ProxyThread(upstream=kafka_cluster.bootstrap_servers, proxy_protocol="any") as proxy:
        stalled = RawClient(proxy.bootstrap)
        stalled.send(v2((CLAIMED_HOST, 43000))[:20])
        seconds, received = stalled.wait_closed()
        stalled.close()
        health = socket.create_connection(proxy.runtime.proxy.bootstrap_address)
        health.close()
        samples = scrape_until(lambda m: sample(m, "kproxy_proxy_protocol_refused_total", reason="closed") >= 1,
                               "the health check to be counted", proxy)
    assert received == 0 and seconds < 5
    assert sample(samples, "kproxy_proxy_protocol_refused_total", reason="timeout") == 1
    warnings = [r.getMessage() for r in kproxy_log.records if r.name == "kproxy.proxy_protocol"
                and r.levelname == "WARNING"]
    assert len(warnings) == 1 and "no complete PROXY protocol header within 0.5s" in warnings[0], warnings
