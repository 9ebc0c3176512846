"""Capture started and stopped through a running kproxy's admin listener, with real traffic."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.proxy.harness import ProxyThread, free_port

pytestmark = pytest.mark.broker



def call(url: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def test_capture_over_the_admin_listener(kafka_cluster, tmp_path):
    from kafka import KafkaProducer

    capture_dir = tmp_path / "capture"
    with ProxyThread(upstream=kafka_cluster.bootstrap_servers, broker_port_rule="map",
                     broker_port_map={n.node_id: free_port() for n in kafka_cluster.nodes},
                     capture={"directory": str(capture_dir), "formats": "jsonl,parquet"}) as proxy:
        admin = proxy.admin_url
        assert call(admin + "/capture")[1]["state"] == "off"
        status, body = call(admin + "/capture/start", {"formats": ["jsonl", "parquet", "pcapng"],
                                                       "filter": {"apis": ["Produce", "Metadata"]}})
        assert status == 200 and body["active"], body
        assert call(admin + "/capture/start", {})[0] == 409            # already running
        producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, client_id="admin-cap")
        topic = f"adm-{uuid.uuid4().hex[:6]}"
        for i in range(10):
            producer.send(topic, value=b"m%d" % i)
        producer.flush()
        producer.close()
        status, body = call(admin + "/capture/stop", {})
        assert status == 200 and not body["active"]
        with urllib.request.urlopen(admin + "/metrics", timeout=10) as r:
            metrics = r.read().decode()
        assert call(admin + "/capture/start", {"formats": ["pdf"]})[0] == 400
    files = sorted(Path(capture_dir).iterdir())
    assert {f.suffix for f in files} == {".jsonl", ".parquet", ".pcapng"}
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in files)
    rows = [json.loads(line) for f in files if f.suffix == ".jsonl" for line in f.read_text().splitlines()]
    assert rows and {r["api_name"] for r in rows} <= {"Produce", "Metadata"}
    assert any(r["api_name"] == "Produce" and topic in r["topics"] for r in rows)
    written = [line for line in metrics.splitlines() if line.startswith("kproxy_capture_rows_written_total ")]
    assert written and float(written[0].split()[1]) >= len(rows) > 0
