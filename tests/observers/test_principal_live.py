"""Who is it: a SASL user through kproxy, against a real broker with PLAIN and SCRAM enabled.

The broker decides who the client is; kproxy must name the same user on its
metrics and capture rows, and no byte of the password (nor its base64 or hex
spelling) may appear in the metrics, the log or the capture files.
"""

from __future__ import annotations

import base64
import glob
import logging
import os
import urllib.request
import uuid

import pytest

from kproxy.observers.capture import CaptureConfig
from tests.observers.captures import read_jsonl, read_parquet
from tests.observers.metrics import sample, scrape_until
from tests.proxy.harness import PASSWORD, SCRAM_USER, ProxyThread, sasl_config, ssl_config

pytestmark = pytest.mark.broker


def spellings(secret: bytes) -> list[bytes]:
    """The password as it could leak: raw, hex, and base64 at each of the three alignments it
    can have inside a longer base64 text (only the characters the secret alone decides)."""
    out = [secret, secret.hex().encode()]
    for shift in range(3):
        data = b"\0" * shift + secret
        out.append(base64.b64encode(data)[4 if shift else 0:len(data) // 3 * 4])
    return out


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_sasl_user_is_the_principal_and_the_password_is_nowhere(sasl_cluster, tmp_path, caplog, mechanism):
    from confluent_kafka import Producer

    caplog.set_level(logging.DEBUG)
    topic = f"principal-{uuid.uuid4().hex[:8]}"
    with ProxyThread(upstream=sasl_cluster.bootstrap_servers, metrics_principal_label=True) as proxy:
        capture = proxy.runtime.capture
        capture.start(CaptureConfig(directory=str(tmp_path), formats=("jsonl", "parquet", "pcapng")))
        producer = Producer({**sasl_config(proxy, mechanism), "linger.ms": 0})
        for i in range(5):
            producer.produce(topic, b"v%d" % i)
        assert producer.flush(30) == 0
        m = scrape_until(lambda m: sample(m, "kproxy_principal_requests_total", principal=SCRAM_USER,
                                      api="Produce") >= 1, "Produce under the SASL user", proxy)
        del producer
        with urllib.request.urlopen(proxy.admin_url + "/metrics", timeout=10) as r:
            metrics_text = r.read()
        status = capture.stop()
    assert status["counters"]["dropped"] == 0
    # Before authenticating, the client is anonymous (ApiVersions, SaslHandshake).
    assert sample(m, "kproxy_principal_requests_total", principal="ANONYMOUS", api="SaslHandshake") >= 1
    assert sample(m, "kproxy_principal_request_bytes_total", principal=SCRAM_USER, api="Produce") > 0

    rows = read_jsonl(tmp_path)
    produce = [r for r in rows if r["api_name"] == "Produce"]
    assert produce and {r["principal"] for r in produce} == {SCRAM_USER}
    assert {r["principal"] for r in read_parquet(tmp_path).to_pylist() if r["api_name"] == "Produce"} == {SCRAM_USER}
    assert all(r["principal"] is None for r in rows if r["api_name"] in ("ApiVersions", "SaslHandshake"))

    files = b""
    for path in glob.glob(os.path.join(str(tmp_path), "*")):
        with open(path, "rb") as f:
            files += f.read()
    log_text = "\n".join(record.getMessage() for record in caplog.records).encode()
    for where, blob in (("metrics", metrics_text), ("log", log_text), ("capture files", files)):
        for leak in spellings(PASSWORD.encode()):
            assert leak not in blob, f"the password ({leak!r}) is in the {where}"


def test_client_certificate_subject_is_the_principal(kafka_cluster, pki):
    from confluent_kafka import Producer

    tls = {"cert_file": str(pki.server.cert), "key_file": str(pki.server.key), "client_ca_file": str(pki.ca)}
    with ProxyThread(upstream=kafka_cluster.bootstrap_servers, tls_server=tls,
                     metrics_principal_label=True) as proxy:
        producer = Producer({**ssl_config(proxy, pki), "ssl.certificate.location": str(pki.client.cert),
                             "ssl.key.location": str(pki.client.key)})
        producer.produce(f"mtls-principal-{uuid.uuid4().hex[:8]}", b"v")
        assert producer.flush(30) == 0
        # The subject make_pki gave the client certificate, as Kafka would name it.
        m = scrape_until(lambda m: sample(m, "kproxy_principal_requests_total", principal="CN=client",
                                      api="Produce") == 1, "Produce under the certificate subject", proxy)
        assert sample(m, "kproxy_principal_requests_total", principal="ANONYMOUS", api="Produce") == 0
        del producer
