"""SNI routing: the whole cluster behind one TLS port, a host name per node.

- Names: the template and the bootstrap name map one to one onto node ids (a name is
  accepted only if the template makes exactly it); bad templates and settings fail at
  start with one line naming the key.
- Refusals, without a broker: a server name kproxy does not serve, or none, ends the
  handshake with ``unrecognized_name``; a log line within a budget, a metric for each.
- Live, a real three-node Kafka cluster behind one kproxy port: kafka-python,
  confluent-kafka (librdkafka) and Kafka's Java client produce and consume through it,
  the names resolved to 127.0.0.1 by each client's own means (see ``HostsFile``); a
  partition's leader is restarted and handed back while all three keep working, and
  each follows it by name;
  mutual TLS to kproxy with TLS to the broker; sidecars, one per broker, on one port.
  No upstream address reaches a client (the leak scan of ``test_cluster``).
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
import concurrent.futures
import contextlib
import dataclasses
from contextlib import contextmanager
from pathlib import Path

import pytest

from kproxy import config as config_module
from kproxy.embedded import recv_exactly
from kproxy.protocol import decode_response
from kproxy.protocol.events import RequestReceived
from kproxy.proxy.server import Proxy
from kproxy.certs.sni import BOOTSTRAP, WIDEST_NODE_ID, NodeNames
from tests.background_tool import BackgroundTool
from tests.proxy.addresses import REWRITE_CASES
from tests.proxy.certs import SNI_DOMAIN
from tests.proxy.client_hello import client_hello, room_for_name
from tests.proxy.cluster import (
    ADMIN_TIMEOUT_S, CONSUME_TIMEOUT_S, LEADER_MOVE_TIMEOUT_S, SHUTDOWN_TIMEOUT_S, api_trace,
    assert_no_upstream_address, create_topic, leads_again, port_free_on, stop_partition_0_leader,
    topic_name, upstream_addresses)
from tests.observers.metrics import sample, scrape
from tests.proxy.harness import GROUP_TIMEOUTS, ProxyThread, Traffic, kafka_python_group_consumer, wait_for
from tests.proxy.wire import (API_VERSIONS, API_VERSIONS_FIELDS, FETCH, FETCH_VERSION, RESPONSE_TIMEOUT_S,
                              close_reasons, create_topic as create_one_partition_topic, fetch_fields,
                              relay_count, relay_states, request_frame)

TEMPLATE = f"broker-{{node_id}}.{SNI_DOMAIN}"
BOOTSTRAP_NAME = f"bootstrap.{SNI_DOMAIN}"
HANDSHAKE_TIMEOUT_S = 10.0
TOOL_TIMEOUT_S = 180.0            # a JVM start, a group join and a read on 2 shared cores
CLIENT_TIMEOUT_S = 90.0           # each client's produce-and-consume, as in test_cluster
PROGRESS = 50                     # messages that must get through in each phase of the move
PRODUCE_INTERVAL_S = 0.01
JAVA_IDLE_EXIT_S = 20.0           # a bound: the console consumer exits after this long with nothing new


@pytest.fixture(autouse=True)
def no_errors_logged(kproxy_log):
    """Every test here fails if kproxy or asyncio logged an error (see ``kproxy_log``)."""
    yield


# ---------------------------------------------------------------- names

@pytest.fixture
def names() -> NodeNames:
    return NodeNames.parse(TEMPLATE, BOOTSTRAP_NAME)


@pytest.mark.parametrize("node_id", [0, 1, 7, 1000, WIDEST_NODE_ID])
def test_a_node_name_routes_back_to_its_node(names, node_id):
    assert names.route(names.name_of(node_id)) == node_id


def test_bootstrap_name_routes_to_bootstrap(names):
    assert names.route(BOOTSTRAP_NAME) == BOOTSTRAP
    assert names.route(BOOTSTRAP_NAME.upper() + ".") == BOOTSTRAP    # DNS: case and the root dot


@pytest.mark.parametrize("server_name", [
    None, "", f"broker-01.{SNI_DOMAIN}",          # one name per node: no leading zeros
    f"broker-.{SNI_DOMAIN}", f"broker-x.{SNI_DOMAIN}", f"broker--1.{SNI_DOMAIN}",
    f"broker-1.{SNI_DOMAIN}.evil.example", f"xbroker-1.{SNI_DOMAIN}",
    f"broker-{WIDEST_NODE_ID + 1}.{SNI_DOMAIN}", f"broker-١.{SNI_DOMAIN}",   # Arabic-Indic one
    "broker-1.other.example", "127.0.0.1",
])
def test_other_names_route_nowhere(names, server_name):
    assert names.route(server_name) is None


def test_names_ignore_case_and_a_final_dot(names):
    assert names.route(f"BROKER-3.{SNI_DOMAIN.upper()}.") == 3
    assert NodeNames.parse(TEMPLATE.upper(), BOOTSTRAP_NAME.upper()).route(f"broker-3.{SNI_DOMAIN}") == 3


@pytest.mark.parametrize("template, bootstrap, message", [
    ("broker.kafka.example", "b.kafka.example", "must hold {node_id} exactly once"),
    ("b-{node_id}-{node_id}.kafka.example", "b.kafka.example", "must hold {node_id} exactly once"),
    ("b-{node_id}-{host}.kafka.example", "b.kafka.example", "must hold {node_id} exactly once"),
    ("b-{node_id:03}.kafka.example", "b.kafka.example", "without a format spec"),
    ("b-{node_id.kafka.example", "b.kafka.example", "expected '}'"),
    ("broker-{node_id}", "b.kafka.example", "needs a dot"),
    ("b_{node_id}.kafka.example", "b.kafka.example", "a DNS label is"),
    ("{node_id}.0.0", "b.kafka.example", "looks like an IP address"),
    ("b-{node_id}." + "x" * 250, "b.kafka.example", "longer than 253"),
    ("b-{node_id}.kafka.example", "bootstrap", "needs a dot"),
    ("b-{node_id}.kafka.example", "b-1.kafka.example", "also a broker name"),
])
def test_bad_names_are_refused_with_the_reason(template, bootstrap, message):
    with pytest.raises(ValueError, match=".*".join(map(_escape, message.split("*")))):
        NodeNames.parse(template, bootstrap)


def _escape(text: str) -> str:
    import re
    return re.escape(text)


# ---------------------------------------------------------------- config

def _sni_settings(pki, **overrides) -> dict:
    settings = {"upstream": "kafka:9092", "routing": "sni", "sni_host_template": TEMPLATE,
                "sni_bootstrap_host": BOOTSTRAP_NAME,
                "tls_server": {"cert_file": str(pki.sni.cert), "key_file": str(pki.sni.key)}}
    settings.update(overrides)
    return {k: v for k, v in settings.items() if v is not None}


def test_config_accepts_sni_in_both_modes(pki):
    gateway = config_module.build(_sni_settings(pki))
    assert gateway.sni_names.route(f"broker-2.{SNI_DOMAIN}") == 2
    sidecar = config_module.build(_sni_settings(pki, mode="sidecar", listen="10.0.0.1:9093"))
    assert sidecar.sni_names.bootstrap == BOOTSTRAP_NAME
    assert config_module.build({"upstream": "kafka:9092"}).sni_names is None      # default: ports


@pytest.mark.parametrize("overrides, message", [
    ({"tls_server": None}, "routing: 'sni' reads the server name from the TLS handshake"),
    ({"routing": "names"}, "routing: must be one of ports, sni"),
    ({"sni_host_template": None}, "sni_host_template: required when routing is 'sni'"),
    ({"sni_bootstrap_host": None}, "sni_bootstrap_host: required when routing is 'sni'"),
    ({"sni_host_template": "broker.kafka.example"}, "sni_host_template: template 'broker.kafka.example' "
                                                    "must hold {node_id} exactly once"),
    ({"sni_bootstrap_host": "localhost"}, "sni_bootstrap_host: bootstrap name 'localhost' needs a dot"),
    ({"sni_bootstrap_host": f"broker-9.{SNI_DOMAIN}"}, "sni_bootstrap_host: .* is also a broker name"),
    ({"broker_port_base": 0}, "broker_port_rule/base/map: not used with routing = 'sni'"),
    ({"broker_port_rule": "map", "broker_port_map": "1=9101"}, "not used with routing = 'sni'"),
    ({"advertised_host": "kafka.example"}, "advertised_host/advertised_host_template: not used"),
    ({"mode": "sidecar", "listen": "127.0.0.1:0"}, "listen: a sidecar with routing = 'sni'"),
    ({"routing": "ports"}, "sni_host_template: only used with routing = 'sni'"),
])
def test_config_errors_name_the_key(pki, overrides, message):
    with pytest.raises(config_module.ConfigError, match=message.replace("{", r"\{").replace("(", r"\(")):
        config_module.build(_sni_settings(pki, **overrides))


def test_cli_flags_and_env_reach_the_config(pki):
    settings = _sni_settings(pki)
    env = config_module.from_env({"KPROXY_ROUTING": "sni", "KPROXY_SNI_HOST_TEMPLATE": TEMPLATE,
                                  "KPROXY_SNI_BOOTSTRAP_HOST": BOOTSTRAP_NAME})
    config = config_module.build({"upstream": "kafka:9092", "tls_server": settings["tls_server"]}, env)
    assert (config.routing, config.sni_host_template, config.sni_bootstrap_host) == \
        ("sni", TEMPLATE, BOOTSTRAP_NAME)
    from kproxy.cli import RUN_FLAGS
    assert {"routing", "sni_host_template", "sni_bootstrap_host"} <= {k for k, _ in RUN_FLAGS.values()}


# ---------------------------------------------------------------- without a broker

def sni_tls_server(pki, **extra) -> dict:
    return {"cert_file": str(pki.sni.cert), "key_file": str(pki.sni.key), **extra}


def test_a_new_node_gets_its_name_with_no_new_listener(pki):
    """The cluster grows: node 7 is advertised by the template on the one port, its
    upstream learnt, and no listener opened; every node keeps its own name."""
    config = config_module.build({"upstream": "kafka:9092", "routing": "sni", "listen": "127.0.0.1:9443",
                                  "sni_host_template": TEMPLATE, "sni_bootstrap_host": BOOTSTRAP_NAME,
                                  "tls_server": sni_tls_server(pki)})
    proxy = Proxy(config)
    for node_id in (1, 2, 7):
        assert proxy.advertise(node_id, f"10.0.0.{node_id}", 9092) == (f"broker-{node_id}.{SNI_DOMAIN}", 9443)
    assert proxy.advertise_controller(2, "10.0.0.2", 9093) == (f"broker-2.{SNI_DOMAIN}", 9443)
    assert proxy.upstream_of == {1: ("10.0.0.1", 9092), 2: ("10.0.0.2", 9092), 7: ("10.0.0.7", 9092)}
    assert proxy.listeners == {} and proxy.unbound == {}


@pytest.mark.parametrize("api_key,version", REWRITE_CASES)
def test_every_address_bearing_response_names_each_node_by_its_own_name(pki, api_key, version):
    """Every version of every response that carries addresses (Metadata, FindCoordinator,
    DescribeCluster, KIP-951 NodeEndpoints, ShareFetch, the KRaft RPCs...), through the
    SNI mapper the proxy uses: each node id gets the name that routes back to that id.
    Controllers' addresses get a name only as brokers kproxy serves (combined mode): the
    brokers of their node ids are learnt first here."""
    from kproxy.protocol import Response, decode_response, encode_response
    from kproxy.proxy.rewrite import node_addresses, rewrite_addresses
    from kproxy.proxy.answer_rewriting import CONTROLLER_ADDRESS_KEYS
    from tests.protocol.samples import sample_body

    proxy = Proxy(config_module.build({
        "upstream": "kafka:9092", "routing": "sni", "listen": "127.0.0.1:9443",
        "sni_host_template": TEMPLATE, "sni_bootstrap_host": BOOTSTRAP_NAME,
        "tls_server": sni_tls_server(pki)}))
    mapper = proxy.advertise_controller if api_key in CONTROLLER_ADDRESS_KEYS else proxy.advertise
    for seed in range(40):
        body = sample_body("response", api_key, version, seed=seed, width=2)
        decoded = decode_response(encode_response(Response(9, body), api_key, version), api_key, version)
        before = node_addresses(api_key, version, decoded.body)
        if mapper == proxy.advertise_controller:
            for node_id, host, port in before:
                proxy.advertise(node_id, host, port)
        rewrite_addresses(api_key, version, decoded, mapper)
        out = encode_response(decoded, api_key, version)
        after = node_addresses(api_key, version, decode_response(out, api_key, version).body)
        assert [n for n, _, _ in after] == [n for n, _, _ in before]
        assert all((host, port) == (name_of(n), 9443) for n, host, port in after)
        assert all(proxy.sni_names.route(host) == n for n, host, _ in after if n >= 0)
        if before:
            return
    pytest.fail("no sample carried an address")


def test_a_sidecar_that_knows_its_node_refuses_other_nodes_names(pki):
    """Until Metadata lists a node at the sidecar's upstream address any broker name is
    served (by the local broker); from then on only its own and the bootstrap name."""
    proxy = Proxy(config_module.build({
        "upstream": "10.0.0.1:9092", "mode": "sidecar", "routing": "sni", "listen": "10.0.0.1:9443",
        "sni_host_template": TEMPLATE, "sni_bootstrap_host": BOOTSTRAP_NAME,
        "tls_server": sni_tls_server(pki)}))

    class Handshake:          # what the callback gets: the connection's SSLObject
        pass
    assert proxy.sni.on_server_name(Handshake(), name_of(2), None) is None
    proxy.advertise(2, "10.0.0.2", 9092)
    assert proxy.local_node is None                     # node 2 is not this sidecar's broker
    proxy.advertise(1, "10.0.0.1", 9092)
    assert proxy.local_node == 1
    refused = Handshake()
    assert proxy.sni.on_server_name(refused, name_of(2), None) == ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME
    assert not hasattr(refused, "kproxy_route")
    for name, route in ((name_of(1), 1), (BOOTSTRAP_NAME, BOOTSTRAP)):
        served = Handshake()
        assert proxy.sni.on_server_name(served, name, None) is None and served.kproxy_route == route


def handshake(address: tuple[str, int], pki, server_name: str | None) -> str:
    """"ok" once a handshake sending ``server_name`` as SNI completes, else its error."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    if server_name is None:
        context.check_hostname = False          # no name, so nothing to check it against
    raw = socket.create_connection(address, timeout=HANDSHAKE_TIMEOUT_S)
    try:
        with context.wrap_socket(raw, server_hostname=server_name):
            return "ok"
    except (ssl.SSLError, ConnectionResetError) as exc:
        return repr(exc)
    finally:
        raw.close()


def metric(admin_url: str, name: str) -> dict[str, float]:
    """label text -> value of one kproxy metric family on /metrics."""
    text = urllib.request.urlopen(admin_url + "/metrics", timeout=HANDSHAKE_TIMEOUT_S).read().decode()
    return {line.split(" ")[0][len(name):]: float(line.split(" ")[1])
            for line in text.splitlines() if line.startswith(name + "{") or line.startswith(name + " ")}


def test_unknown_or_missing_server_names_are_refused(pki, caplog):
    """In the handshake, before kproxy's certificate is sent or a broker is reached (here
    there is none): one log line per name per interval, a metric for each refusal."""
    caplog.set_level(logging.INFO, logger="kproxy")
    with ProxyThread(upstream="127.0.0.1:1", routing="sni", sni_host_template=TEMPLATE,
                     sni_bootstrap_host=BOOTSTRAP_NAME, tls_server=sni_tls_server(pki)) as proxy:
        address = proxy.runtime.proxy.bootstrap_address
        unknown = f"kafka.{SNI_DOMAIN}"              # the wildcard covers it; kproxy does not serve it
        for _ in range(3):
            assert handshake(address, pki, unknown) != "ok"
        assert handshake(address, pki, f"broker-01.{SNI_DOMAIN}") != "ok"
        assert handshake(address, pki, None) != "ok"
        # Control: names kproxy serves complete the handshake (the broker behind them is
        # unreachable); so does a broker name while kproxy has yet to ask the cluster whether
        # it has the node (it cannot: refused after the handshake, see test_sni_cluster).
        assert handshake(address, pki, f"broker-1.{SNI_DOMAIN}") == "ok"
        assert handshake(address, pki, BOOTSTRAP_NAME.upper()) == "ok"
        refused = wait_for(lambda: (lambda m: m if m['{reason="unknown_node"}'] else None)(
            metric(proxy.admin_url, "kproxy_sni_refused_total")), HANDSHAKE_TIMEOUT_S, "the refusal")
        assert refused == {'{reason="unknown_name"}': 4.0, '{reason="no_name"}': 1.0,
                           '{reason="other_node"}': 0.0, '{reason="unknown_node"}': 1.0}
        # An SNI refusal is said once, as such: not also as a failed TLS handshake.
        assert not any(metric(proxy.admin_url, "kproxy_tls_handshake_failures_total").values())
    assert not [r for r in caplog.records if "TLS handshake with a client failed" in r.getMessage()]
    lines = [r.getMessage() for r in caplog.records if "refusing a TLS connection" in r.getMessage()]
    assert len(lines) == 4, lines                    # the same name again is not logged
    assert f"server name '{unknown}' is neither the bootstrap name '{BOOTSTRAP_NAME}'" in lines[0]
    assert "no server name (SNI) was sent" in lines[2]
    assert f"server name 'broker-1.{SNI_DOMAIN}' names node 1, which kproxy does not serve" in lines[3]


# ---------------------------------------------------------------- live, one broker: made-up nodes, half-close

UNSERVED_HANDSHAKES = 2_000          # the default suite's run; the soak's is SOAK_UNSERVED_HANDSHAKES
SOAK_UNSERVED_HANDSHAKES = 10_000
HANDSHAKE_THREADS = 8                # clients handshaking at once
FIRST_MADE_UP_NODE = 1000            # broker-1000... : nodes the one-node cluster does not have
LONG_POLL_MS = 20_000                # a Fetch the broker holds: far longer than closing takes


@contextmanager
def tls_to(address: tuple[str, int], pki, server_name: str) -> Iterator[ssl.SSLSocket]:
    context = ssl.create_default_context(cafile=str(pki.ca))
    raw = socket.create_connection(address, timeout=RESPONSE_TIMEOUT_S)
    with context.wrap_socket(raw, server_hostname=server_name) as tls:
        yield tls


def tls_request(tls: ssl.SSLSocket, api_key: int, version: int, correlation_id: int, **fields) -> None:
    tls.sendall(request_frame(api_key, version, correlation_id, **fields))


def tls_response(tls: ssl.SSLSocket, api_key: int, version: int):
    size, = struct.unpack(">i", recv_exactly(tls, 4))
    return decode_response(recv_exactly(tls, size), api_key, version)


def api_versions_answered(address, pki, server_name: str) -> bool:
    with tls_to(address, pki, server_name) as tls:
        tls_request(tls, API_VERSIONS, 3, 1, **API_VERSIONS_FIELDS)
        return tls_response(tls, API_VERSIONS, 3).body.error_code == 0


@pytest.fixture
def sni_gateway(kafka_cluster, pki, kproxy_log):
    """An SNI kproxy in front of the session's one-node Kafka."""
    with ProxyThread(upstream=kafka_cluster.bootstrap_servers, routing="sni", sni_host_template=TEMPLATE,
                     sni_bootstrap_host=BOOTSTRAP_NAME, tls_server=sni_tls_server(pki),
                     shutdown_timeout=5.0) as proxy:
        yield proxy


def made_up_nodes_leave_metrics_flat(sni_gateway, kafka_cluster, pki, count: int) -> None:
    address = sni_gateway.runtime.proxy.bootstrap_address
    node = kafka_cluster.nodes[0].node_id
    # Every series a served connection makes, made once (opened, closed by the client).
    for name in (BOOTSTRAP_NAME, name_of(node)):
        assert api_versions_answered(address, pki, name)
    wait_for(lambda: not relay_count(sni_gateway), RESPONSE_TIMEOUT_S, "the served connections to close")
    before = scrape(sni_gateway)
    with concurrent.futures.ThreadPoolExecutor(HANDSHAKE_THREADS) as pool:
        outcomes = list(pool.map(lambda i: handshake(address, pki, name_of(FIRST_MADE_UP_NODE + i)),
                                 range(count)))
    wait_for(lambda: not relay_count(sni_gateway), RESPONSE_TIMEOUT_S, "the connections to close")
    grown = set(scrape(sni_gateway)) - set(before)
    assert not grown, f"{len(grown)} new series, e.g. {sorted(grown)[:5]}"
    after = wait_for(lambda: (lambda m: m if sample(m, "kproxy_sni_refused_total", reason="unknown_node")
                              >= count else None)(scrape(sni_gateway)),
                     RESPONSE_TIMEOUT_S, "every handshake to be counted as refused")
    assert set(after) == set(before), sorted(set(after) ^ set(before))[:10]
    assert sample(after, "kproxy_sni_refused_total", reason="unknown_node") == count
    # Those that completed the handshake (kproxy had to ask the cluster first) were closed
    # without a connection counted, the others refused in it.
    assert sample(after, "kproxy_connections_opened_total", listener="bootstrap") == \
        sample(before, "kproxy_connections_opened_total", listener="bootstrap")
    assert outcomes.count("ok") < count, "every made-up name completed its handshake"
    assert api_versions_answered(address, pki, name_of(node))        # still served


def test_names_of_nodes_the_cluster_lacks_are_refused_and_grow_no_series(sni_gateway, kafka_cluster, pki):
    """``broker-1000...`` on a one-node cluster: each refused (counted as ``unknown_node``),
    no ``listener`` label per name: the set of /metrics series does not change."""
    made_up_nodes_leave_metrics_flat(sni_gateway, kafka_cluster, pki, UNSERVED_HANDSHAKES)


@pytest.mark.soak
def test_soak_names_of_nodes_the_cluster_lacks(sni_gateway, kafka_cluster, pki):
    made_up_nodes_leave_metrics_flat(sni_gateway, kafka_cluster, pki, SOAK_UNSERVED_HANDSHAKES)


def test_a_tls_client_that_half_closes_is_closed_without_asyncio_warnings(sni_gateway, kafka_cluster, pki,
                                                                         kproxy_log):
    """asyncio's TLS transport cannot stay open for writing after the client's close_notify
    (it closes whatever ``eof_received`` returns, and warns if it returns True): kproxy
    closes the connection there, its long-poll unanswered, without the warning."""
    topic = create_one_partition_topic(kafka_cluster.bootstrap_servers)
    address = sni_gateway.runtime.proxy.bootstrap_address
    with tls_to(address, pki, name_of(kafka_cluster.nodes[0].node_id)) as tls:
        tls_request(tls, API_VERSIONS, 3, 1, **API_VERSIONS_FIELDS)
        assert tls_response(tls, API_VERSIONS, 3).body.error_code == 0
        tls_request(tls, FETCH, FETCH_VERSION, 2, **fetch_fields(topic, 0, max_wait_ms=LONG_POLL_MS))
        wait_for(lambda: any(s.in_flight for s in relay_states(sni_gateway)), RESPONSE_TIMEOUT_S,
                 "the long-poll to be in flight")
        started = time.monotonic()
        tls.unwrap()                    # close_notify; returns on kproxy's own close_notify
        assert time.monotonic() - started < LONG_POLL_MS / 1000, "closed only when the poll ended"
    wait_for(lambda: not relay_count(sni_gateway), RESPONSE_TIMEOUT_S, "the connection to close")
    assert any("reason=client closed" in line for line in close_reasons(kproxy_log)), \
        close_reasons(kproxy_log)
    warnings = [r.getMessage() for r in kproxy_log.records if r.name == "asyncio"]
    assert not warnings, warnings


# ---------------------------------------------------------------- live: how clients resolve

class HostsFile:
    """The SNI names, resolved to loopback addresses by each client's own means.

    - Java: ``-Djdk.net.hosts.file`` (Java 17 resolves from that file alone);
    - librdkafka (confluent-kafka) resolves with the C library, which reads /etc/hosts,
      and confluent-kafka offers no resolver hook: its client runs in a child process
      with a private mount namespace (``unshare --mount``) where this file is bind-mounted
      over /etc/hosts; the machine's own file is untouched;
    - kafka-python: ``socket.getaddrinfo`` patched in this process for these names only.
    """

    def __init__(self, directory: Path, addresses: dict[str, str]):
        self.addresses = addresses                     # name -> IP address
        self.path = directory / "hosts"
        lines = [f"{ip} {name}" for name, ip in addresses.items()]
        lines += ["127.0.0.1 localhost", f"127.0.0.1 {socket.gethostname()}"]   # Java asks for both
        self.path.write_text("\n".join(lines) + "\n")

    def java_args(self) -> tuple[str, ...]:
        from kproxy.embedded.kafka import TOOL_JVM_ARGS
        return (*TOOL_JVM_ARGS, f"-Djdk.net.hosts.file={self.path}")

    def run_with_hosts(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
        """Run ``argv`` where /etc/hosts is this file (a mount namespace of its own)."""
        script = 'mount --bind "$0" /etc/hosts && exec "$@"'
        return subprocess.run(["unshare", "--mount", "sh", "-c", script, str(self.path), *argv],
                              capture_output=True, text=True, timeout=timeout)

    @contextmanager
    def in_this_process(self) -> Iterator[None]:
        original = socket.getaddrinfo

        def getaddrinfo(host, *args, **kwargs):
            name = host.decode() if isinstance(host, bytes) else host
            return original(self.addresses.get(str(name).lower().rstrip("."), host), *args, **kwargs)

        socket.getaddrinfo = getaddrinfo
        try:
            yield
        finally:
            socket.getaddrinfo = original


def mount_namespaces_available() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0


# The confluent-kafka client, run by HostsFile.run_with_hosts: produce, consume in a group,
# report what it saw as JSON on its last line.
CONFLUENT_SCRIPT = textwrap.dedent("""
    import json, sys, time
    from confluent_kafka import Consumer, Producer
    args = json.loads(sys.argv[1])
    common = {"bootstrap.servers": args["bootstrap"], "security.protocol": "SSL",
              "ssl.ca.location": args["ca"], "ssl.endpoint.identification.algorithm": "https"}
    failures = []
    producer = Producer({**common, "acks": "all"})
    for i in range(args["count"]):
        producer.produce(args["topic"], value=f"ck-{i}".encode(),
                         on_delivery=lambda err, msg: err and failures.append(str(err)))
    left = producer.flush(args["timeout"])
    brokers = sorted([b.host, b.port] for b in producer.list_topics(timeout=args["timeout"]).brokers.values())
    consumer = Consumer({**common, "group.id": "ck-" + args["topic"], "auto.offset.reset": "earliest",
                         **args["group"]})
    consumer.subscribe([args["topic"]])
    got, deadline = set(), time.monotonic() + args["timeout"]
    while len(got) < args["count"] and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None and msg.value().startswith(b"ck-"):
            got.add(msg.value().decode())
    consumer.close()
    print(json.dumps({"unflushed": left, "failures": failures, "consumed": sorted(got),
                      "brokers": brokers}))
""")

# The same client producing (acks=all, idempotent) until a stop file appears, then
# consuming until it has every message it got acknowledged back: run beside a leader move.
CONFLUENT_TRAFFIC_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    from confluent_kafka import Consumer, Producer
    args = json.loads(sys.argv[1])
    common = {"bootstrap.servers": args["bootstrap"], "security.protocol": "SSL",
              "ssl.ca.location": args["ca"], "ssl.endpoint.identification.algorithm": "https"}
    delivered, failures, produced = set(), [], 0
    def on_delivery(err, msg):
        if err is None:
            delivered.add(msg.value().decode())
        else:
            failures.append(str(err))
    producer = Producer({**common, "acks": "all", "enable.idempotence": True, "linger.ms": 5})
    while not os.path.exists(args["stop_file"]):
        producer.produce(args["topic"], value=f"ck-{produced}".encode(), on_delivery=on_delivery)
        produced += 1
        producer.poll(args["interval"])
    left = producer.flush(args["timeout"])
    consumer = Consumer({**common, "group.id": "ck-" + args["topic"], "auto.offset.reset": "earliest",
                         **args["group"]})
    consumer.subscribe([args["topic"]])
    got, deadline = set(), time.monotonic() + args["timeout"]
    while not delivered <= got and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None and msg.value().startswith(b"ck-"):
            got.add(msg.value().decode())
    consumer.close()
    print(json.dumps({"produced": produced, "delivered": len(delivered), "unflushed": left,
                      "failures": failures[:5], "not_consumed": len(delivered - got)}))
""")


# ---------------------------------------------------------------- live: one port, three brokers

def name_of(node_id: int) -> str:
    return TEMPLATE.format(node_id=node_id)


def sni_proxy(cluster, pki, observers=(), tls_client=None, **tls_server) -> ProxyThread:
    return ProxyThread(observers=observers, upstream=cluster.bootstrap_servers, routing="sni",
                       sni_host_template=TEMPLATE, sni_bootstrap_host=BOOTSTRAP_NAME,
                       shutdown_timeout=SHUTDOWN_TIMEOUT_S, tls_client=tls_client,
                       tls_server=sni_tls_server(pki, **tls_server))


def cluster_hosts(directory: Path, node_ids, ip: str = "127.0.0.1") -> HostsFile:
    return HostsFile(directory, {BOOTSTRAP_NAME: ip, f"kafka.{SNI_DOMAIN}": ip,
                                 **{name_of(n): ip for n in node_ids}})


def kp_ssl(pki, identity=None) -> dict:
    settings = {"security_protocol": "SSL", "ssl_cafile": str(pki.ca), "ssl_check_hostname": True}
    if identity is not None:
        settings.update(ssl_certfile=str(identity.cert), ssl_keyfile=str(identity.key))
    return settings


def kp_round_trip(bootstrap: str, topic: str, prefix: str, count: int, **ssl_settings) -> set:
    """kafka-python: produce ``count`` with acks=all, consume them in a group; the
    brokers its metadata lists."""
    from kafka import KafkaProducer
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, **ssl_settings)
    try:
        futures = [producer.send(topic, f"{prefix}-{i}".encode()) for i in range(count)]
        producer.flush(CLIENT_TIMEOUT_S)
        for future in futures:
            future.get(CLIENT_TIMEOUT_S)
        brokers = {(b.host, b.port) for b in producer._metadata.brokers()}
    finally:
        producer.close(CLIENT_TIMEOUT_S)
    consumer = kafka_python_group_consumer(bootstrap, topic, f"kp-{topic}-{prefix}", **ssl_settings)
    wanted = {f"{prefix}-{i}".encode() for i in range(count)}
    got: set[bytes] = set()
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    try:
        while not wanted <= got and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.update(r.value for r in records)
    finally:
        consumer.close()
    assert wanted <= got, f"kafka-python consumed {len(wanted & got)} of {count}"
    return brokers


def java_fetch(event) -> bool:
    """A Fetch request from Kafka's Java console consumer."""
    return (isinstance(event, RequestReceived) and event.api_key == 1 and event.request is not None
            and (event.request.client_id or "").startswith("console-consumer"))


def java_properties(directory: Path, pki) -> Path:
    """The Java client's settings: TLS with the test CA (PEM), the tests' group timeouts."""
    path = directory / "java-client.properties"
    path.write_text(f"security.protocol=SSL\nssl.truststore.type=PEM\nssl.truststore.location={pki.ca}\n"
                    + "".join(f"{key}={value}\n" for key, value in GROUP_TIMEOUTS.items()))
    return path


def led(admin, topic: str, partitions: int) -> bool:
    described = admin.list_topics(topic, timeout=ADMIN_TIMEOUT_S).topics.get(topic)
    return (described is not None and described.error is None and len(described.partitions) == partitions
            and all(p.leader >= 0 for p in described.partitions.values()))


def produce_clients(trace) -> set[str]:
    """client ids whose Produce requests reached a node by its name (listener broker-<id>)."""
    return {e.request.client_id for _, listener, e in trace
            if listener.startswith("broker-") and isinstance(e, RequestReceived) and e.api_key == 0
            and e.request is not None}


@pytest.mark.broker
@pytest.mark.timeout(600)
class TestOnePortThreeBrokers:

    def test_three_clients_produce_and_consume_through_one_port(self, cluster3, pki, client_bytes,
                                                                 tmp_path):
        from confluent_kafka.admin import AdminClient
        from kproxy.embedded import run_tool

        ids = [n.node_id for n in cluster3.nodes]
        hosts = cluster_hosts(tmp_path, ids)
        # Test control (topic, leaders) goes straight to the cluster; the clients under test
        # get nothing but the bootstrap name and kproxy's one port.
        admin = AdminClient({"bootstrap.servers": cluster3.bootstrap_servers})
        topic = topic_name("sni")
        create_topic(admin, topic, partitions=6, replication=3)
        wait_for(lambda: led(admin, topic, 6), ADMIN_TIMEOUT_S, "leaders for every partition")
        trace, observe = api_trace()
        with sni_proxy(cluster3, pki, [observe]) as proxy:
            port = proxy.runtime.proxy.bootstrap_address[1]
            bootstrap = f"{BOOTSTRAP_NAME}:{port}"
            advertised = {(name_of(n), port) for n in ids}

            with hosts.in_this_process():
                seen = kp_round_trip(bootstrap, topic, "kp", 60, **kp_ssl(pki))
            assert seen == advertised

            if not mount_namespaces_available():
                pytest.fail("confluent-kafka's part needs `unshare --mount` (a private /etc/hosts)",
                            pytrace=False)
            args = {"bootstrap": bootstrap, "topic": topic, "count": 60, "ca": str(pki.ca),
                    "timeout": CLIENT_TIMEOUT_S, "group": GROUP_TIMEOUTS}
            ran = hosts.run_with_hosts([sys.executable, "-c", CONFLUENT_SCRIPT, json.dumps(args)],
                                       timeout=CLIENT_TIMEOUT_S * 3)
            assert ran.returncode == 0, ran.stderr[-3000:]
            report = json.loads(ran.stdout.strip().splitlines()[-1])
            assert report["unflushed"] == 0 and not report["failures"], report
            assert set(report["consumed"]) == {f"ck-{i}" for i in range(60)}
            assert {tuple(b) for b in report["brokers"]} == advertised

            properties = java_properties(tmp_path, pki)
            lines = [f"java-{i}" for i in range(100)]
            run_tool(cluster3, cluster3.tools.console_producer, "--bootstrap-server", bootstrap,
                     "--topic", topic, "--command-config", str(properties), "--command-property",
                     "acks=all", input="\n".join(lines) + "\n", jvm_args=hosts.java_args(),
                     timeout=TOOL_TIMEOUT_S)
            consumed = run_tool(cluster3, cluster3.tools.console_consumer, "--bootstrap-server",
                                bootstrap, "--topic", topic, "--group", f"java-{topic}",
                                "--from-beginning", "--max-messages", str(60 + 60 + 100),
                                "--timeout-ms", str(int(CLIENT_TIMEOUT_S * 1000)),
                                "--command-config", str(properties), jvm_args=hosts.java_args(),
                                timeout=TOOL_TIMEOUT_S).stdout.splitlines()
            assert set(lines) <= set(consumed) and len(consumed) == 220, consumed[-5:]

            # Each client reached every node by its name, on the one listener.
            assert {"bootstrap", *(f"broker-{n}" for n in ids)} <= {l for _, l, _ in trace}
            producers = produce_clients(trace)
            assert any(c.startswith("kafka-python") for c in producers), producers
            assert "rdkafka" in producers and "console-producer" in producers, producers
            assert set(proxy.runtime.proxy.listeners) == {"bootstrap"}

            # A name kproxy does not serve (the wildcard certificate covers it) is refused.
            assert handshake(("127.0.0.1", port), pki, f"kafka.{SNI_DOMAIN}") != "ok"
            assert metric(proxy.admin_url, "kproxy_sni_refused_total")['{reason="unknown_name"}'] == 1
        assert_no_upstream_address(client_bytes, upstream_addresses(cluster3), advertised)

    # Soak only (23 s, three clients and a node restart): the default suite proves routing
    # by name to every node (test_three_clients_produce_and_consume_through_one_port) and
    # clients following a leader across a node restart (test_cluster.py, gateway mode).
    @pytest.mark.soak
    def test_clients_follow_a_leader_move_by_name(self, cluster3, pki, client_bytes, tmp_path):
        """kafka-python and confluent-kafka keep producing (acks=all, idempotent) and
        consuming, and Kafka's Java console consumer keeps consuming, while partition 0's
        leader is stopped, restarted and made leader again: each finds every new leader at
        that node's name, on the same port, and nothing is lost."""
        from confluent_kafka.admin import AdminClient

        ids = [n.node_id for n in cluster3.nodes]
        hosts = cluster_hosts(tmp_path, ids)
        admin = AdminClient({"bootstrap.servers": cluster3.bootstrap_servers})     # test control
        topic = topic_name("sni-move")
        create_topic(admin, topic, partitions=3, replication=3, **{"min.insync.replicas": "2"})
        wait_for(lambda: led(admin, topic, 3), ADMIN_TIMEOUT_S, "leaders for every partition")
        trace, observe = api_trace()
        with sni_proxy(cluster3, pki, [observe]) as proxy, hosts.in_this_process():
            port = proxy.runtime.proxy.bootstrap_address[1]
            advertised = {(name_of(n), port) for n in ids}
            traffic = KafkaPythonTraffic(f"{BOOTSTRAP_NAME}:{port}", topic, kp_ssl(pki))
            traffic.start()
            if not mount_namespaces_available():
                pytest.fail("confluent-kafka's part needs `unshare --mount` (a private /etc/hosts)",
                            pytrace=False)
            stop_file = tmp_path / "stop-confluent"
            args = {"bootstrap": f"{BOOTSTRAP_NAME}:{port}", "topic": topic, "ca": str(pki.ca),
                    "stop_file": str(stop_file), "interval": PRODUCE_INTERVAL_S,
                    "timeout": CONSUME_TIMEOUT_S, "group": GROUP_TIMEOUTS}
            pool = concurrent.futures.ThreadPoolExecutor(1)
            confluent = pool.submit(
                hosts.run_with_hosts, [sys.executable, "-c", CONFLUENT_TRAFFIC_SCRIPT, json.dumps(args)],
                timeout=TOOL_TIMEOUT_S * 3)
            # The Java consumer reads until it has every record both producers delivered (its
            # idle timeout only bounds it).
            with BackgroundTool(
                cluster3, cluster3.tools.console_consumer, "--bootstrap-server",
                f"{BOOTSTRAP_NAME}:{port}", "--topic", topic, "--group", f"java-{topic}",
                "--from-beginning", "--timeout-ms", str(int(JAVA_IDLE_EXIT_S * 1000)),
                "--command-config", str(java_properties(tmp_path, pki)),
                jvm_args=hosts.java_args()) as java:     # stopped however the test ends
                try:
                    traffic.wait_for_progress(PROGRESS, "before the move")
                    # Its JVM start, TLS set-up and group join: the tool's own budget, not a consumer's.
                    wait_for(lambda: any(java_fetch(e) for _, _, e in list(trace)), TOOL_TIMEOUT_S,
                             "the Java consumer to fetch")
                    leader = stop_partition_0_leader(cluster3, admin, topic)
                    traffic.wait_for_progress(PROGRESS, f"while node {leader} is down")
                    cluster3.start_node(leader)
                    wait_for(lambda: leads_again(admin, topic, 3, leader), LEADER_MOVE_TIMEOUT_S,
                             f"node {leader} to lead again")
                    returned = time.monotonic()
                    traffic.wait_for_progress(PROGRESS, f"after node {leader} leads again")
                finally:
                    stop_file.touch()
                    traffic.finish()
                ran = confluent.result(TOOL_TIMEOUT_S * 3)
                assert ran.returncode == 0, ran.stderr[-3000:]
                report = json.loads(ran.stdout.strip().splitlines()[-1])
                assert report["delivered"] == report["produced"] > 0 and not report["failures"], report
                assert report["unflushed"] == 0 and report["not_consumed"] == 0, report
                pool.shutdown()
                java.wait_until(lambda lines: {str(n) for n in traffic.delivered} <= set(lines)
                                and len({v for v in lines if v.startswith("ck-")}) >= report["delivered"],
                                TOOL_TIMEOUT_S, "the Java consumer to read every delivered record")
                read = set(java.stop())
                assert len({v for v in read if v.startswith("ck-")}) == report["delivered"]
            assert not traffic.delivery_errors, traffic.delivery_errors[:3]
            assert traffic.delivered == set(range(traffic.produced)), "a message was not acknowledged"
            assert traffic.delivered <= traffic.read_back
            producers = produce_clients([(t, l, e) for t, l, e in trace
                                         if t > returned and l == f"broker-{leader}"])
            assert any(c.startswith("kafka-python") for c in producers) and "rdkafka" in producers, \
                f"Produce reached node {leader} by its name after it led again only from {producers}"
            assert any(l == f"broker-{leader}" and java_fetch(e) for t, l, e in trace if t > returned), \
                f"the Java consumer did not fetch from node {leader} by its name after it led again"
            assert set(proxy.runtime.proxy.listeners) == {"bootstrap"}
        assert_no_upstream_address(client_bytes, upstream_addresses(cluster3), advertised)


class KafkaPythonTraffic(Traffic):
    """``Traffic`` with kafka-python clients; ``finish`` reads the topic back with a fresh consumer."""

    def __init__(self, bootstrap: str, topic: str, ssl_settings: dict):
        super().__init__(bootstrap, topic, CONSUME_TIMEOUT_S)
        self.ssl = ssl_settings
        self.read_back: set[int] = set()

    def _produce(self):
        from kafka import KafkaProducer
        producer = KafkaProducer(bootstrap_servers=self.bootstrap, acks="all", linger_ms=5,
                                 enable_idempotence=True, **self.ssl)
        try:
            while self.producing():
                number = self.next_number()
                future = producer.send(self.topic, str(number).encode())
                future.add_callback(lambda _meta, n=number: self.acknowledged(n))
                future.add_errback(self.failed)
                time.sleep(PRODUCE_INTERVAL_S)
            producer.flush(self.timeout)
        finally:
            producer.close(self.timeout)

    def _consume(self):
        consumer = kafka_python_group_consumer(self.bootstrap, self.topic, f"g-{self.topic}", **self.ssl)
        try:
            while self.consuming():
                for records in consumer.poll(timeout_ms=200).values():   # not confluent's ck-<n>
                    self.consumed.update(int(r.value) for r in records if r.value.isdigit())
        finally:
            consumer.close()

    def finish(self) -> None:
        """Stop both clients, then read the topic from its beginning with a fresh consumer
        (``read_back``) until it holds every acknowledged message.

        A fresh reader, not the long-running group member: on a loaded machine that one's
        client loop can be starved for seconds at a time (missed heartbeats, rebalances),
        which says nothing about kproxy. The wait lasts as long as the reader makes
        progress, and fails after ``timeout`` without any.
        """
        from kafka import KafkaConsumer, TopicPartition
        self.stop_producing()
        self.stop_consuming()
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None,
                                 enable_auto_commit=False, **self.ssl)
        try:
            partitions = wait_for(lambda: consumer.partitions_for_topic(self.topic), self.timeout,
                                  f"{self.topic}'s partitions")
            consumer.assign([TopicPartition(self.topic, p) for p in sorted(partitions)])
            consumer.seek_to_beginning()
            progressed = time.monotonic()
            while not self.delivered <= self.read_back:
                assert time.monotonic() - progressed < self.timeout, (
                    f"the fresh reader got no message for {self.timeout:g}s; "
                    f"{len(self.delivered - self.read_back)} acknowledged ones unread")
                for records in consumer.poll(timeout_ms=500).values():
                    numbers = {int(r.value) for r in records if r.value.isdigit()}
                    if not numbers <= self.read_back:
                        progressed = time.monotonic()
                    self.read_back |= numbers
        finally:
            consumer.close()


def api_versions_answer(address: tuple[str, int], pki, server_name: str, identity=None) -> bytes | str:
    """ApiVersions v0 over TLS with SNI (and a client certificate if given): the bytes
    kproxy answered (empty if it closed), or the TLS error that ended the connection."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    if identity is not None:
        context.load_cert_chain(identity.cert, identity.key)
    raw = socket.create_connection(address, timeout=HANDSHAKE_TIMEOUT_S)
    try:
        with context.wrap_socket(raw, server_hostname=server_name) as conn:
            conn.sendall(b"\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff")
            return conn.recv(4)           # TLS 1.3: a refused client certificate shows here
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as exc:
        return repr(exc)
    finally:
        raw.close()


@pytest.mark.broker
@pytest.mark.timeout(300)
class TestMutualTLS:

    def test_client_certificates_and_tls_to_the_broker(self, tls_cluster, pki, client_bytes, tmp_path):
        """Clients must present a certificate to kproxy's SNI port; kproxy presents its own
        to a broker that requires one (mutual TLS on both legs), still routing by name."""
        ids = [n.node_id for n in tls_cluster.nodes]
        hosts = cluster_hosts(tmp_path, ids)
        upstream_tls = {"ca_file": str(pki.ca), "cert_file": str(pki.client.cert),
                        "key_file": str(pki.client.key), "check_hostname": True}
        with sni_proxy(tls_cluster, pki, tls_client=upstream_tls, client_ca_file=str(pki.ca)) as proxy:
            port = proxy.runtime.proxy.bootstrap_address[1]
            address = ("127.0.0.1", port)
            for identity in (None, pki.stranger):          # no certificate; an unknown CA's
                answer = api_versions_answer(address, pki, BOOTSTRAP_NAME, identity)
                assert answer == b"" or isinstance(answer, str), "kproxy served an unknown client"
            # Control. No Metadata has passed through this kproxy yet: for the broker's name
            # it asks the cluster itself where that node is (as a second replica behind one
            # load balancer, or a restarted kproxy, must when a client names a node first).
            for name in (BOOTSTRAP_NAME, name_of(ids[0])):
                answer = api_versions_answer(address, pki, name, pki.client)
                assert isinstance(answer, bytes) and len(answer) == 4, answer   # a size prefix
            advertised = {(name_of(n), port) for n in ids}
            with hosts.in_this_process():
                seen = kp_round_trip(f"{BOOTSTRAP_NAME}:{port}", topic_name("sni-mtls"), "mtls", 30,
                                     **kp_ssl(pki, pki.client))
            assert seen == advertised
        assert_no_upstream_address(client_bytes, upstream_addresses(tls_cluster), advertised)


@pytest.mark.broker
@pytest.mark.timeout(300)
class TestSidecars:

    def test_one_sidecar_per_broker_all_on_one_port(self, cluster3, pki, client_bytes, tmp_path):
        """Each broker's sidecar on its own address and the same port (as pods are); every
        node advertised by name at that port; DNS (here the hosts mapping) sends each name
        to its node's sidecar, which checks the name and reaches its own broker."""
        from confluent_kafka.admin import AdminClient

        nodes = cluster3.nodes
        ip = {n.node_id: f"127.0.0.1{n.node_id}" for n in nodes}
        port = port_free_on(ip.values())
        hosts = HostsFile(tmp_path, {BOOTSTRAP_NAME: ip[nodes[0].node_id],
                                     **{name_of(n): address for n, address in ip.items()}})
        admin = AdminClient({"bootstrap.servers": cluster3.bootstrap_servers})     # test control
        topic = topic_name("sni-sidecar")
        create_topic(admin, topic, partitions=6, replication=1)
        wait_for(lambda: led(admin, topic, 6), ADMIN_TIMEOUT_S, "leaders for every partition")
        leaders = {p.leader for p in admin.list_topics(topic).topics[topic].partitions.values()}
        assert leaders == set(ip), "partitions should be led by every broker"
        traces = {}
        sidecars = {}
        with contextlib.ExitStack() as stack:
            for node in nodes:
                traces[node.node_id], observe = api_trace()
                sidecars[node.node_id] = stack.enter_context(ProxyThread(
                    observers=[observe], mode="sidecar", upstream=f"{node.host}:{node.port}",
                    listen=f"{ip[node.node_id]}:{port}", routing="sni", sni_host_template=TEMPLATE,
                    sni_bootstrap_host=BOOTSTRAP_NAME, tls_server=sni_tls_server(pki),
                    shutdown_timeout=SHUTDOWN_TIMEOUT_S))
            advertised = {(name_of(n), port) for n in ip}
            with hosts.in_this_process():
                seen = kp_round_trip(f"{BOOTSTRAP_NAME}:{port}", topic, "sidecar", 60, **kp_ssl(pki))
            assert seen == advertised
            for node_id, trace in traces.items():        # each sidecar served its own partitions
                assert any(isinstance(e, RequestReceived) and e.api_key == 0 for _, _, e in trace), \
                    f"sidecar {node_id} saw no Produce"
            first = nodes[0].node_id
            assert handshake((ip[first], port), pki, f"kafka.{SNI_DOMAIN}") != "ok"
            # The bootstrap sidecar has seen Metadata list its broker at its upstream address:
            # another node's name sent to it (DNS pointing at the wrong pod) is refused, not
            # served by the wrong broker.
            other = nodes[1].node_id
            assert handshake((ip[first], port), pki, name_of(other)) != "ok"
            assert handshake((ip[first], port), pki, name_of(first)) == "ok"        # control
            refused = metric(sidecars[first].admin_url, "kproxy_sni_refused_total")
            assert refused['{reason="other_node"}'] == 1 and refused['{reason="unknown_name"}'] == 1
        assert_no_upstream_address(client_bytes, upstream_addresses(cluster3), advertised)


@pytest.mark.parametrize("certificate, name, covered", [
    (["*.kafka.example.com"], "broker-1.kafka.example.com", True),
    (["*.kafka.example.com"], "BOOTSTRAP.kafka.example.com", True),
    (["*.kafka.example.com"], "a.b.kafka.example.com", False),       # one label only
    (["*.kafka.example.com"], "kafka.example.com", False),
    (["broker-1.kafka.example.com", "bootstrap.kafka.example.com"], "broker-1.kafka.example.com", True),
    (["broker-1.kafka.example.com"], "broker-2.kafka.example.com", False),
    ([], "broker-1.kafka.example.com", False),
])
def test_certificate_coverage_as_clients_check_it(certificate, name, covered):
    from kproxy.certs.sni import certificate_covers
    assert certificate_covers(certificate, name) is covered


def test_a_certificate_that_misses_an_advertised_name_is_logged_once(pki, caplog):
    """kproxy's server certificate for 127.0.0.1/localhost cannot serve SNI names: said
    at start for the bootstrap name, and once per node name when first advertised."""
    caplog.set_level(logging.INFO, logger="kproxy")
    config = config_module.build({"upstream": "kafka:9092", "routing": "sni", "listen": "127.0.0.1:9443",
                                  "sni_host_template": TEMPLATE, "sni_bootstrap_host": BOOTSTRAP_NAME,
                                  "tls_server": {"cert_file": str(pki.server.cert),
                                                 "key_file": str(pki.server.key)}})
    proxy = Proxy(config)
    for _ in range(3):
        proxy.advertise(2, "10.0.0.2", 9092)
    warnings = [r.getMessage() for r in caplog.records if "is not valid for" in r.getMessage()]
    assert len(warnings) == 1 and f"not valid for broker-2.{SNI_DOMAIN}" in warnings[0]
    assert "certificate names localhost" in warnings[0] and f"wildcard *.{SNI_DOMAIN}" in warnings[0]
    caplog.clear()
    good = Proxy(dataclasses.replace(config, tls_server=config_module.TLSServer(**sni_tls_server(pki))))
    good.advertise(2, "10.0.0.2", 9092)
    assert not [r for r in caplog.records if "is not valid for" in r.getMessage()]


# ---------------------------------------------------------------- server names no TLS library sends

ALERT_RECORD_BYTES = 7       # record header (5) + alert level and description


def raw_hello_outcome(address: tuple[str, int], server_name: bytes) -> bytes:
    """Send a ClientHello naming ``server_name`` as is; kproxy's first answer (an alert
    record, if it refuses), read until it is whole or kproxy closes."""
    with socket.create_connection(address, timeout=HANDSHAKE_TIMEOUT_S) as raw:
        raw.sendall(client_hello(server_name))
        answer = b""
        while len(answer) < ALERT_RECORD_BYTES:
            try:
                chunk = raw.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            answer += chunk
        return answer


def hostile_server_names() -> dict[str, bytes]:
    longest = room_for_name()
    label = b"a" * 63 + b"."
    return {
        "64 KiB": (label * (longest // len(label) + 1))[:longest],
        "256 bytes": (label * 5)[:256],
        "not ASCII": "bröker-1.".encode() + SNI_DOMAIN.encode(),
        "bytes not UTF-8": b"\xff\xfe\x80." + SNI_DOMAIN.encode(),
        "a line break": b"bootstrap.\nkproxy: fake log line " + SNI_DOMAIN.encode(),
        "a NUL": b"bootstrap\x00." + SNI_DOMAIN.encode(),
        "empty": b"",
    }


# TLS alerts a refused hello may get: unrecognized_name (kproxy's SNI callback, or OpenSSL's
# own length check), internal_error (Python's ssl on a name that is not ASCII).
ALERT = 21
REFUSING_ALERTS = {ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME, ssl.ALERT_DESCRIPTION_INTERNAL_ERROR}
MAX_LOGGED_NAME = 600       # a DNS name's 253 characters, repr-escaped: never the 64 KiB


def test_server_names_no_tls_library_sends_are_refused_in_the_handshake(pki, caplog):
    """A ClientHello whose server name is 64 KiB (as long as a ClientHello can carry), 256
    bytes, not ASCII, not UTF-8, holds a line break or a NUL, or is empty: each refused with
    a TLS alert and counted (an SNI refusal, or a failed handshake where OpenSSL refuses the
    name first), no traceback on stderr (Python's ssl reports a name that is not ASCII as an
    unraisable error), no long name or raw line break in the log, kproxy still serving."""
    caplog.set_level(logging.INFO)
    unraisable = []
    old_hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        with ProxyThread(upstream="127.0.0.1:1", routing="sni", sni_host_template=TEMPLATE,
                         sni_bootstrap_host=BOOTSTRAP_NAME, tls_server=sni_tls_server(pki)) as proxy:
            address = proxy.runtime.proxy.bootstrap_address
            names = hostile_server_names()
            answers = {what: raw_hello_outcome(address, name) for what, name in names.items()}
            assert handshake(address, pki, BOOTSTRAP_NAME) == "ok"       # still serving
            refused = metric(proxy.admin_url, "kproxy_sni_refused_total")
            failures = metric(proxy.admin_url, "kproxy_tls_handshake_failures_total")
    finally:
        sys.unraisablehook = old_hook
    assert not unraisable, [repr(u.exc_value)[:200] for u in unraisable]
    for what, answer in answers.items():       # one fatal alert: level 2, then its description
        assert answer[:1] == bytes([ALERT]) and answer[5] == 2 and answer[6] in REFUSING_ALERTS, (what, answer)
    assert sum(refused.values()) + sum(failures.values()) == len(names), (refused, failures)
    assert refused['{reason="unknown_name"}'] >= 3 and refused['{reason="no_name"}'] == 1, refused
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("kproxy")]
    assert max(len(line) for line in lines) < MAX_LOGGED_NAME + 300
    assert not [line for line in lines if "\n" in line]


def test_a_server_name_not_ascii_on_a_tls_listener_without_sni_routing_is_one_counted_failure(pki, caplog):
    """Without SNI routing the name does not matter to kproxy, but Python's ssl still fails
    the handshake: counted once as a failed handshake, no traceback on stderr."""
    caplog.set_level(logging.INFO)
    unraisable = []
    old_hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        with ProxyThread(upstream="127.0.0.1:1", tls_server=sni_tls_server(pki)) as proxy:
            address = proxy.runtime.proxy.bootstrap_address
            answer = raw_hello_outcome(address, "bröker.".encode() + SNI_DOMAIN.encode())
            failures = metric(proxy.admin_url, "kproxy_tls_handshake_failures_total")
    finally:
        sys.unraisablehook = old_hook
    assert not unraisable, [repr(u.exc_value)[:200] for u in unraisable]
    assert answer[:1] == bytes([ALERT]) and answer[6] in REFUSING_ALERTS, answer
    assert failures['{reason="other"}'] == 1 and sum(failures.values()) == 1, failures
