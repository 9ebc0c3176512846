"""A TLS-terminated session is captured as readable plaintext (what no wire capture can show)."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from kproxy.observers.capture import Capture, CaptureConfig
from tests.proxy.certs import make_pki, openssl_available
from tests.proxy.harness import ProxyThread

pytestmark = pytest.mark.broker


def test_tls_session_is_captured_in_plaintext(kafka_cluster, tmp_path):
    if not openssl_available():
        pytest.fail("openssl is needed to make test certificates")
    from confluent_kafka import Producer

    pki = make_pki(tmp_path / "pki")
    capture = Capture()
    capture_dir = tmp_path / "capture"
    capture.start(CaptureConfig(directory=str(capture_dir), formats=("jsonl", "pcapng")))
    topic = f"secret-plans-{uuid.uuid4().hex[:6]}"
    with ProxyThread(observers=[capture], upstream=kafka_cluster.bootstrap_servers,
                     tls_server={"cert_file": str(pki.server.cert), "key_file": str(pki.server.key)}) as proxy:
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "security.protocol": "SSL",
                             "ssl.ca.location": str(pki.ca),
                             "ssl.endpoint.identification.algorithm": "https",
                             "client.id": "tls-client"})
        for i in range(5):
            producer.produce(topic, value=b"v%d" % i)
        assert producer.flush(30) == 0
    capture.stop()

    files = sorted(Path(capture_dir).iterdir())
    rows = [json.loads(line) for f in files if f.suffix == ".jsonl" for line in f.read_text().splitlines()]
    produce = [r for r in rows if r["api_name"] == "Produce"]
    assert produce and all(topic in r["topics"] and r["client_id"] == "tls-client" for r in produce)
    assert sum(r["record_count"] or 0 for r in produce) == 5
    pcap = next(f for f in files if f.suffix == ".pcapng")
    assert topic.encode() in pcap.read_bytes()          # plaintext, although the client spoke TLS
    tshark = shutil.which("tshark")
    if tshark is None:
        pytest.fail("tshark is not installed (scripts/setup.sh installs it)")
    broker_port = kafka_cluster.nodes[0].port
    out = subprocess.run([tshark, "-r", str(pcap), "-d", f"tcp.port=={broker_port},kafka", "-Y", "kafka",
                          "-T", "fields", "-e", "kafka.api_key"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    api_keys = {line.split(",")[0] for line in out.stdout.split()}
    assert {"0", "3", "18"} <= api_keys                   # Produce, Metadata, ApiVersions dissected
