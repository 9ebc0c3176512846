"""Misconfigured clients are told what is wrong: TLS or HTTP on a plaintext Kafka listener.

Live: the real ``openssl s_client`` and Python's HTTP client against kproxy in
front of a real broker; the client's own output, kproxy's log line and its
``kproxy_connections_closed_total{reason}`` must all name the mistake.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from kproxy.observers.contract import CLIENT_CLOSED, CloseCause, CloseKind
from kproxy.observers.metrics import CLOSE_REASONS
from kproxy.protocol.connection import Connection
from kproxy.protocol.sniff import WRONG_PROTOCOLS, WrongProtocol
from kproxy.observers.contract import ConnectionInfo
from kproxy.proxy.server import MisconfigurationLog
from tests.observers.metrics import sample, scrape_until
from tests.proxy.harness import ProxyThread

CLOSED = "kproxy_connections_closed_total"
OPENSSL_TIMEOUT_S = 30.0
# librdkafka reconnects with backoff; told by an alert it reports the failure on its first try.
LIBRDKAFKA_TOLD_WITHIN_S = 15.0


def reason_of(data: bytes, direction="client") -> CloseCause:
    try:
        (Connection().receive_client if direction == "client" else Connection().receive_broker)(data)
    except WrongProtocol as exc:
        return CloseCause.of_violation(exc)
    raise AssertionError("not recognised")


@pytest.mark.parametrize("cause", list(WRONG_PROTOCOLS))
def test_each_cause_has_its_own_bounded_close_reason(cause):
    data = {"tls_on_plaintext_listener": bytes.fromhex("160301020001"), "http_on_kafka_port": b"GET / HTTP/1.1",
            "upstream_speaks_tls": bytes.fromhex("15030300020228"), "upstream_speaks_http": b"HTTP/1.0 200"}[cause]
    direction = "client" if cause in ("tls_on_plaintext_listener", "http_on_kafka_port") else "broker"
    reason = reason_of(data, direction)
    assert reason.label == cause and cause in CLOSE_REASONS and reason.kind.misconfiguration
    assert str(reason).startswith(WRONG_PROTOCOLS[cause])
    assert {kind.label for kind in CloseKind if kind.misconfiguration} == set(WRONG_PROTOCOLS)


def test_misconfigurations_are_logged_once_per_cause_and_client_host(caplog):
    class Clock:
        now = 0.0

        def __call__(self):
            return self.now

    clock = Clock()
    log = MisconfigurationLog(clock)
    tls = reason_of(bytes.fromhex("160301020001"))
    info = lambda host: ConnectionInfo(1, (host, 5000), "bootstrap", ("127.0.0.1", 9092), None)  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="kproxy.server"):
        for _ in range(5):
            log.connection_closed(info("10.0.0.1"), reason=tls)
        log.connection_closed(info("10.0.0.2"), reason=tls)
        log.connection_closed(info("10.0.0.1"), reason=CLIENT_CLOSED)
        clock.now += 61
        log.connection_closed(info("10.0.0.1"), reason=tls)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and all("TLS handshake on a plaintext listener" in line for line in lines)
    assert "10.0.0.2" in lines[1] and "(4 earlier misconfigured connections were not logged)" in lines[1]
    assert "not logged" not in lines[2]


@pytest.fixture
def proxy(kafka_cluster):
    with ProxyThread(upstream=kafka_cluster.bootstrap_servers) as p:
        yield p


def test_openssl_s_client_on_a_plaintext_listener_is_told_and_counted(proxy, caplog):
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("the openssl command is needed for this test", pytrace=False)
    caplog.set_level(logging.INFO)
    done = subprocess.run([openssl, "s_client", "-connect", proxy.bootstrap, "-servername", "localhost"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=OPENSSL_TIMEOUT_S)
    # The client's TLS stack got kproxy's alert, as from a server refusing the handshake.
    assert done.returncode != 0 and "alert handshake failure" in done.stdout + done.stderr, done.stderr
    m = scrape_until(lambda m: sample(m, CLOSED, listener="bootstrap", reason="tls_on_plaintext_listener") == 1,
                 "the close counted with its reason", proxy)
    assert sample(m, CLOSED, listener="bootstrap", reason="frame_too_large") == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("TLS handshake on a plaintext listener" in w and "security.protocol" in w for w in warnings), warnings


def test_http_on_the_kafka_port_gets_a_400_that_says_so(proxy, caplog):
    caplog.set_level(logging.INFO)
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(f"http://{proxy.bootstrap}/metrics", timeout=10)
    assert raised.value.code == 400 and b"Kafka listener" in raised.value.read()
    scrape_until(lambda m: sample(m, CLOSED, listener="bootstrap", reason="http_on_kafka_port") == 1,
             "the close counted with its reason", proxy)
    assert any("HTTP on the Kafka port" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


# ---------------------------------------------------------------- on a TLS listener

def test_handshake_failures_are_named_from_openssl_and_the_first_byte():
    from kproxy.protocol.tls_failures import HANDSHAKE_FAILURES, handshake_failure
    assert handshake_failure("WRONG_VERSION_NUMBER", 0) == "plaintext_on_tls_listener"
    assert handshake_failure("WRONG_VERSION_NUMBER", 0x16) == "other"      # a TLS client gone wrong
    assert handshake_failure("HTTP_REQUEST", ord("G")) == "http_on_tls_listener"
    assert handshake_failure("PEER_DID_NOT_RETURN_A_CERTIFICATE", 0x16) == "no_client_certificate"
    assert handshake_failure("CERTIFICATE_VERIFY_FAILED", 0x16) == "client_certificate_rejected"
    assert handshake_failure(None, None) == "other" and set(HANDSHAKE_FAILURES) >= {"other"}


def test_failed_handshakes_on_a_tls_listener_are_logged_and_counted(tmp_path, caplog):
    import socket
    import ssl

    from tests.proxy.certs import make_pki
    from tests.observers.metrics import scrape

    pki = make_pki(tmp_path / "pki")
    caplog.set_level(logging.INFO)
    tls = {"cert_file": str(pki.server.cert), "key_file": str(pki.server.key), "client_ca_file": str(pki.ca)}
    # No broker needed: every one of these fails before kproxy connects upstream.
    with ProxyThread(upstream="127.0.0.1:9", tls_server=tls) as proxy:
        host, port = proxy.bootstrap.split(":")

        def send(data: bytes) -> bytes:
            with socket.create_connection((host, int(port)), timeout=10) as s:
                s.sendall(data)
                return s.recv(100)

        # Each client hears why, in its own terms, and at once: the TLS alert OpenSSL wrote.
        assert send(bytes.fromhex("0000000e0012000300000001000461707031"))[:1] == b"\x15"   # plaintext
        assert send(b"GET /metrics HTTP/1.1\r\nHost: kafka\r\n\r\n")[:1] == b"\x15"
        context = ssl.create_default_context(cafile=str(pki.ca))            # no client certificate
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            with pytest.raises(ssl.SSLError, match="(?i)certificate required|handshake failure"):
                with context.wrap_socket(raw, server_hostname="localhost") as s:
                    s.recv(100)                                              # TLS 1.3: refused after
        # librdkafka without a client certificate: told at once, in its own words.
        from confluent_kafka import Producer
        errors = []
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "security.protocol": "SSL",
                             "ssl.ca.location": str(pki.ca), "error_cb": errors.append})
        deadline = time.monotonic() + LIBRDKAFKA_TOLD_WITHIN_S
        while not any("certificate required" in e.str() for e in errors):
            assert time.monotonic() < deadline, f"librdkafka was not told: {[e.str() for e in errors]}"
            producer.poll(0.2)
        del producer
        counted = lambda m: {r: sample(m, "kproxy_tls_handshake_failures_total", reason=r)  # noqa: E731
                             for r in ("plaintext_on_tls_listener", "http_on_tls_listener",
                                       "no_client_certificate")}
        m = scrape_until(lambda m: all(v >= 1 for v in counted(m).values()), "each failure counted", proxy)
        assert counted(m)["plaintext_on_tls_listener"] == counted(m)["http_on_tls_listener"] == 1
        assert sample(m, "kproxy_tls_handshake_failures_total", reason="other") == 0
        assert scrape(proxy)  # still serving
    warnings = " | ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "plaintext Kafka on a TLS listener" in warnings and "security.protocol to SSL" in warnings
    assert "HTTP on the Kafka port (TLS listener)" in warnings
    assert "sent no certificate" in warnings


def test_a_java_client_without_a_certificate_is_told_why(require_kafka, tmp_path):
    """Kafka's Java client (the admin tool), refused for want of a certificate: it must fail
    with the TLS error, as against a broker requiring one, not retry disconnects until timeout."""
    from kproxy.embedded import KAFKA_4_VERSION
    from kproxy.embedded.kafka import run_tool, tool_classes
    from tests.proxy.certs import make_pki

    require_kafka(KAFKA_4_VERSION)
    pki = make_pki(tmp_path / "pki")
    tls = {"cert_file": str(pki.server.cert), "key_file": str(pki.server.key), "client_ca_file": str(pki.ca)}
    config = tmp_path / "client.properties"
    config.write_text(f"security.protocol=SSL\nssl.truststore.type=PEM\nssl.truststore.location={pki.ca}\n"
                      "default.api.timeout.ms=30000\nrequest.timeout.ms=10000\n")
    with ProxyThread(upstream="127.0.0.1:9", tls_server=tls) as proxy:
        done = run_tool(KAFKA_4_VERSION, tool_classes(KAFKA_4_VERSION).topics, "--bootstrap-server",
                        proxy.bootstrap, "--command-config", str(config), "--list", check=False, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode != 0 and "SslAuthenticationException" in output, output[-2000:]
