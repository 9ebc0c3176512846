"""Misconfigured clients are told what is wrong: TLS or HTTP on a plaintext Kafka listener.

Live: the real ``openssl s_client`` and Python's HTTP client against kproxy in
front of a real broker; the client's own output, kproxy's log line and its
``kproxy_connections_closed_total{reason}`` must all name the mistake.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import urllib.error
import urllib.request

import pytest

from kproxy.observers.metrics import CLOSE_REASONS, close_reason_label
from kproxy.protocol.connection import WRONG_PROTOCOLS, Connection, WrongProtocol
from kproxy.proxy.relay import ConnectionInfo
from kproxy.proxy.server import MisconfigurationLog
from tests.observers.test_metrics_insight_live import wait_for
from tests.observers.test_metrics_live import sample
from tests.proxy.harness import ProxyThread

CLOSED = "kproxy_connections_closed_total"
OPENSSL_TIMEOUT_S = 30.0


def reason_of(data: bytes, direction="client") -> str:
    try:
        (Connection().receive_client if direction == "client" else Connection().receive_broker)(data)
    except WrongProtocol as exc:
        return str(exc)
    raise AssertionError("not recognised")


@pytest.mark.parametrize("cause", list(WRONG_PROTOCOLS))
def test_each_cause_has_its_own_bounded_close_reason(cause):
    data = {"tls_on_plaintext_listener": bytes.fromhex("160301020001"), "http_on_kafka_port": b"GET / HTTP/1.1",
            "upstream_speaks_tls": bytes.fromhex("15030300020228"), "upstream_speaks_http": b"HTTP/1.0 200"}[cause]
    direction = "client" if cause in ("tls_on_plaintext_listener", "http_on_kafka_port") else "broker"
    assert close_reason_label(reason_of(data, direction)) == cause and cause in CLOSE_REASONS
    assert close_reason_label("client frame of 2000 bytes (maximum 1000)") == "frame_too_large"


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
        log.connection_closed(info("10.0.0.1"), reason="client closed")
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
    m = wait_for(lambda m: sample(m, CLOSED, listener="bootstrap", reason="tls_on_plaintext_listener") == 1,
                 "the close counted with its reason", proxy)
    assert sample(m, CLOSED, listener="bootstrap", reason="frame_too_large") == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("TLS handshake on a plaintext listener" in w and "security.protocol" in w for w in warnings), warnings


def test_http_on_the_kafka_port_gets_a_400_that_says_so(proxy, caplog):
    caplog.set_level(logging.INFO)
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(f"http://{proxy.bootstrap}/metrics", timeout=10)
    assert raised.value.code == 400 and b"Kafka listener" in raised.value.read()
    wait_for(lambda m: sample(m, CLOSED, listener="bootstrap", reason="http_on_kafka_port") == 1,
             "the close counted with its reason", proxy)
    assert any("HTTP on the Kafka port" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
