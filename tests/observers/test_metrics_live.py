"""Metrics from a running kproxy with real clients, a real broker and a real Prometheus.

The client's own accounting (librdkafka's statistics) is the independent
witness: what it says it sent must be what kproxy counted.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
import uuid

import pytest

from kproxy.embedded.kafka import run_tool
from tests.observers.metrics import sample, scrape
from tests.proxy.harness import ProxyThread, free_port

pytestmark = pytest.mark.broker

SETTLE_TIMEOUT_S = 30.0


@pytest.fixture
def proxy(kafka_cluster):
    with ProxyThread(upstream=kafka_cluster.bootstrap_servers) as p:     # every port bound first
        yield p


def client_totals(stats: list[str]) -> dict:
    """Requests by type and bytes, summed over every broker connection librdkafka had."""
    last = json.loads(stats[-1])
    totals = {"tx": 0, "txbytes": 0, "rx": 0, "rxbytes": 0, "req": {}}
    for broker in last["brokers"].values():
        for key in ("tx", "txbytes", "rx", "rxbytes"):
            totals[key] += broker[key]
        for api, count in broker["req"].items():
            totals["req"][api] = totals["req"].get(api, 0) + count
    return totals


def settled_stats(producer, stats: list[str]) -> dict:
    """Wait until two statistics snapshots agree on bytes: nothing is in flight any more."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    previous = None
    while time.monotonic() < deadline:
        producer.poll(0.3)
        if len(stats) >= 2:
            current = client_totals(stats)
            if previous is not None and (current["txbytes"], current["rxbytes"]) == \
                    (previous["txbytes"], previous["rxbytes"]):
                return current
            previous = current
    raise AssertionError("client statistics never settled")


def test_produce_requests_equal_what_librdkafka_counted(proxy):
    from confluent_kafka import Producer

    stats: list[str] = []
    topic = f"m-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "client.id": "metrics-witness",
                         "linger.ms": 0, "acks": "all", "statistics.interval.ms": 100,
                         "stats_cb": stats.append, "topic.metadata.refresh.interval.ms": 600000})
    for i in range(25):
        producer.produce(topic, key=str(i), value=b"x" * (100 * i))
        assert producer.flush(30) == 0              # one Produce request per message
    seen = settled_stats(producer, stats)
    m = scrape(proxy)
    # librdkafka forgets its bootstrap connection's statistics once it knows the brokers,
    # so only the per-broker requests (all Produce requests) are comparable here.
    assert seen["req"]["Produce"] >= 25
    assert sample(m, "kproxy_requests_total", api="Produce") == seen["req"]["Produce"]
    assert sample(m, "kproxy_request_latency_seconds_count", api="Produce") == seen["req"]["Produce"]
    assert sample(m, "kproxy_produced_records_total") == 25
    assert sample(m, "kproxy_produce_batches_total", compression="none") == 25


def test_bytes_and_counts_equal_what_a_raw_client_moved(proxy):
    """A socket-level witness: exactly the bytes written and read, exactly the requests sent."""
    from kproxy.protocol import Request, Struct, decode_response, encode_request, new_body
    from kproxy.protocol.record_encoder import build_batch
    from kproxy.protocol.records import Record

    host, port = proxy.bootstrap.rsplit(":", 1)
    topic = f"raw-{uuid.uuid4().hex[:8]}"
    frames = [(18, 3, new_body("request", 18, 3, client_software_name="raw", client_software_version="1")),
              (3, 12, new_body("request", 3, 12, topics=[Struct(name=topic)],
                                   allow_auto_topic_creation=True))]
    for i in range(6):
        batch = build_batch([Record(0, 1_700_000_000_000 + i, None, b"v" * 50, ())], "none")
        frames.append((0, 9, new_body("request", 0, 9, acks=1, timeout_ms=5000, topic_data=[
            Struct(name=topic, partition_data=[Struct(index=0, records=batch)])])))
    sent = received = 0
    answered = {}
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        for correlation_id, (api_key, version, body) in enumerate(frames):
            payload = encode_request(Request(api_key, version, correlation_id, "raw-witness", body))
            data = len(payload).to_bytes(4, "big") + payload
            sock.sendall(data)
            sent += len(data)
            size = int.from_bytes(_read_exactly(sock, 4), "big")
            frame = _read_exactly(sock, size)
            received += 4 + size
            answered[api_key] = answered.get(api_key, 0) + 1
            response = decode_response(frame, api_key, version)
            assert response.correlation_id == correlation_id
            if api_key == 3:                         # let auto-creation finish before producing
                time.sleep(1.0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:               # the close is counted when kproxy sees it
        m = scrape(proxy)
        if sample(m, "kproxy_connections_closed_total", listener="bootstrap", reason="client_closed"):
            break
        time.sleep(0.1)
    assert sample(m, "kproxy_client_received_bytes_total") == sent
    assert sample(m, "kproxy_upstream_sent_bytes_total") == sent
    assert sample(m, "kproxy_client_sent_bytes_total") == received
    assert sample(m, "kproxy_requests_total", api="Produce") == answered[0] == 6
    assert sample(m, "kproxy_requests_total", api="Metadata") == 1
    assert sample(m, "kproxy_request_versions_total", api="ApiVersions", version="3") == 1
    assert sample(m, "kproxy_request_bytes_total", api="Produce") + \
        sample(m, "kproxy_request_bytes_total", api="Metadata") + \
        sample(m, "kproxy_request_bytes_total", api="ApiVersions") == sent
    assert sample(m, "kproxy_connections_opened_total", listener="bootstrap") == 1
    assert sample(m, "kproxy_connections_open", listener="bootstrap") == 0


def _read_exactly(sock, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed early")
        data += chunk
    return data


def test_a_low_client_quota_shows_up_as_throttle(kafka_cluster, proxy):
    from confluent_kafka import Producer

    client_id = f"throttled-{uuid.uuid4().hex[:6]}"
    run_tool(kafka_cluster, "kafka.admin.ConfigCommand", "--bootstrap-server",
             kafka_cluster.bootstrap_servers, "--alter", "--add-config", "producer_byte_rate=4096",
             "--entity-type", "clients", "--entity-name", client_id)
    topic = f"q-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "client.id": client_id,
                         "linger.ms": 0, "acks": 1})
    deadline = time.monotonic() + 60
    throttled = 0.0
    while time.monotonic() < deadline and throttled == 0:
        for _ in range(5):
            producer.produce(topic, value=b"q" * 20_000)
        producer.flush(30)
        throttled = sample(scrape(proxy), "kproxy_throttled_responses_total", api="Produce")
    m = scrape(proxy)
    assert throttled > 0
    assert sample(m, "kproxy_throttle_time_seconds_sum", api="Produce") > 0
    assert sample(m, "kproxy_throttle_time_seconds_count", api="Produce") >= throttled


# Long enough for a rate over several one-second scrapes; was 8 s, and 5 still gives a
# four-second window of four or five samples.
PRODUCE_FOR_S = 5
SCRAPED_WITHIN_S = 30       # Prometheus scrapes every second; a loaded machine delays it


def test_prometheus_scrapes_kproxy_and_promql_sees_the_rate(proxy, tmp_path):
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.fail("prometheus is not installed (scripts/setup.sh installs Debian's package)")
    from confluent_kafka import Producer

    admin = urllib.parse.urlparse(proxy.admin_url).netloc
    port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"scrape_configs:\n  - job_name: kproxy\n    static_configs:\n      - targets: ['{admin}']\n")
    server = subprocess.Popen(
        [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    api = f"http://127.0.0.1:{port}/api/v1/query"

    def query(promql: str, at: float | None = None) -> list:
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        with urllib.request.urlopen(api + "?" + urllib.parse.urlencode(params), timeout=10) as r:
            return json.load(r)["data"]["result"]

    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if query('up{job="kproxy"} == 1'):
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("Prometheus never scraped kproxy")
        topic = f"p-{uuid.uuid4().hex[:8]}"
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 0, "acks": 1})
        producer.produce(topic, value=b"warm-up")
        producer.flush(30)
        before = sample(scrape(proxy), "kproxy_requests_total", api="Produce")
        start = time.time()
        sent = 0
        while time.time() - start < PRODUCE_FOR_S:     # ~10 Produce requests per second
            producer.produce(topic, value=b"tick")
            producer.flush(10)
            sent += 1
            time.sleep(0.1)
        end = time.time()
        produced = sample(scrape(proxy), "kproxy_requests_total", api="Produce") - before
        assert produced >= sent
        # Until a scrape after the last request has landed (one a second).
        deadline = time.monotonic() + SCRAPED_WITHIN_S
        while True:
            total = query('kproxy_requests_total{api="Produce"}')
            if (total and float(total[0]["value"][1]) == before + produced) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert total and float(total[0]["value"][1]) == before + produced, total
        window = int(end - start) - 1
        rate = float(query(f'rate(kproxy_requests_total{{api="Produce"}}[{window}s])', at=end)[0]["value"][1])
        expected = produced / (end - start)
        assert 0.6 * expected < rate < 1.5 * expected, (rate, expected)
    finally:
        server.terminate()
        server.wait(10)


def test_promtool_accepts_a_running_kproxys_exposition(proxy):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed (scripts/setup.sh installs Debian's prometheus package)")
    with urllib.request.urlopen(proxy.admin_url + "/metrics", timeout=10) as r:
        text = r.read()
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
