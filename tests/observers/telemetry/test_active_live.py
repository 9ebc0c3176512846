"""kproxy offering client telemetry itself (``telemetry_offer``) in front of a stock broker
(which offers no KIP-714): clients see 71/72, push to kproxy, and the broker never sees them."""

from __future__ import annotations

import collections
import concurrent.futures
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import confluent_kafka
import pytest

from kproxy.embedded.kafka import run_tool
from kproxy.protocol import Uuid, new_body
from kproxy.observers.capture.filters import header_client_id
from kproxy.protocol.client_telemetry import decode_push
from kproxy.protocol.events import ResponseReceived
from kproxy.proxy import telemetry_offer
from kproxy.proxy.local_requests import LocalRequest
from kproxy.proxy.relay import Relay
from tests.observers.metrics import scrape_until, unique
from tests.proxy.harness import ProxyThread
from tests.proxy.wire import WitnessClient, create_topic

pytestmark = pytest.mark.broker

WAIT_S = 60.0
OFFER = {"enabled": True, "push_interval_ms": 500, "metrics": ["org.apache.kafka.producer."]}
TELEMETRY_KEYS = {71, 72}


@pytest.fixture
def to_broker(monkeypatch):
    """Every byte kproxy sends a broker, per connection (what the relay's split forwards)."""
    sent: dict[int, bytearray] = collections.defaultdict(bytearray)
    original = Relay._to_broker

    def recording(self, pieces):
        for piece in pieces:
            if piece.__class__ is not LocalRequest:
                sent[id(self)] += bytes(piece)
        return original(self, pieces)

    monkeypatch.setattr(Relay, "_to_broker", recording)
    return sent


def api_keys_sent(sent) -> collections.Counter:
    keys = collections.Counter()
    for stream in sent.values():
        pos = 0
        while pos + 6 <= len(stream):
            size, api_key = struct.unpack_from(">ih", stream, pos)
            keys[api_key] += 1
            pos += 4 + size
    return keys


def series(samples, client_id: str) -> dict:
    return {dict(labels)["name"]: v for (name, labels), v in samples.items()
            if name == "kproxy_client_metric" and dict(labels).get("client_id") == client_id}


def test_clients_push_to_kproxy_and_the_broker_never_sees_telemetry(kafka_cluster, to_broker):
    librdkafka_id, java_id = unique("offered-rd"), unique("offered-java")
    pushed = collections.defaultdict(list)           # client_id -> metric names of each push kproxy took

    def pushes(info, events):
        for e in events:
            if e.__class__ is ResponseReceived and e.api_key == 72 and not e.response.body.error_code:
                body = e.request_event.request.body
                pushed[header_client_id(e.request_event.frame)].append(
                    {m.name for m in decode_push(body.compression_type, body.metrics).metrics})

    with ProxyThread([pushes], upstream=kafka_cluster.bootstrap_servers, client_telemetry=True,
                     metrics_client_id_label=True, telemetry_offer=OFFER) as proxy:
        topic = create_topic(proxy.bootstrap)
        producer = confluent_kafka.Producer({"bootstrap.servers": proxy.bootstrap, "client.id": librdkafka_id})
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            java = pool.submit(run_tool, kafka_cluster, kafka_cluster.tools.producer_perf, "--topic", topic,
                               "--num-records", "1200", "--record-size", "100", "--throughput", "300",
                               "--producer-props", f"bootstrap.servers={proxy.bootstrap}", f"client.id={java_id}")

            def produce():
                producer.produce(topic, b"x" * 100)
                producer.poll(0.05)

            def librdkafka_exported(samples) -> bool:
                return "org.apache.kafka.producer.record.queue.time.avg" in series(samples, librdkafka_id)
            scrape_until(librdkafka_exported, "librdkafka's pushes exported", proxy, timeout=WAIT_S, poll=produce)
            java.result()
        producer.flush(10)
        del producer
    assert pushed[java_id] and all(names and all(n.startswith("org.apache.kafka.producer.") for n in names)
                                   for names in pushed[java_id][:-1]), pushed[java_id]
    keys = api_keys_sent(to_broker)
    assert keys[0] > 0 and keys[18] > 0                   # Produce and ApiVersions went on
    assert not TELEMETRY_KEYS & set(keys), keys


def test_a_denied_librdkafka_is_not_offered_telemetry_and_its_connection_goes_on(kafka_cluster, to_broker):
    with ProxyThread(upstream=kafka_cluster.bootstrap_servers, telemetry_offer=OFFER) as proxy:
        offered = {}
        for version in ("2.5.1", "2.5.3"):
            with WitnessClient(proxy.bootstrap) as client:
                body = client.request(18, 3, new_body("request", 18, 3, client_software_name="librdkafka",
                                                      client_software_version=version))
                offered[version] = TELEMETRY_KEYS <= {k.api_key for k in body.api_keys}
                asked = client.request(71, 0, new_body("request", 71, 0, client_instance_id=Uuid(bytes(16))))
                metadata = client.request(3, 12, new_body("request", 3, 12, topics=[]))
                assert metadata.brokers                   # the connection works on
                if version == "2.5.1":
                    assert asked.error_code == 35         # asked anyway: no subscription
                else:
                    assert asked.error_code == 0 and asked.requested_metrics == OFFER["metrics"]
                    assert any(asked.client_instance_id) and asked.push_interval_ms == 500
        assert offered == {"2.5.1": False, "2.5.3": True}
    assert not TELEMETRY_KEYS & set(api_keys_sent(to_broker))


def test_clients_no_pattern_matches_get_an_empty_subscription(kafka_cluster):
    offer = dict(OFFER, clients=["apache-kafka-java/*"])
    with ProxyThread(upstream=kafka_cluster.bootstrap_servers, telemetry_offer=offer) as proxy:
        with WitnessClient(proxy.bootstrap) as client:
            client.request(18, 3, new_body("request", 18, 3, client_software_name="librdkafka",
                                           client_software_version="2.16.0"))
            asked = client.request(71, 0, new_body("request", 71, 0, client_instance_id=Uuid(bytes(16))))
            assert asked.error_code == 0 and asked.requested_metrics == []


def test_the_live_page_lists_the_pushing_client(browser, kafka_cluster, tmp_path):
    from tests.proxy.live_page import TOKEN, open_page
    client_id = unique("on-the-page")
    with ProxyThread(upstream=kafka_cluster.bootstrap_servers, admin_token=TOKEN, client_telemetry=True,
                     telemetry_offer=OFFER) as proxy:
        topic = create_topic(proxy.bootstrap)
        page = open_page(browser, proxy)
        producer = confluent_kafka.Producer({"bootstrap.servers": proxy.bootstrap, "client.id": client_id})
        try:
            row = page.locator("#telemetry tbody tr", has_text=client_id)
            deadline = time.monotonic() + WAIT_S
            while not (row.count() and row.first.locator("td").nth(7).text_content() != "–"):
                assert time.monotonic() < deadline, "no telemetry row with a split on the page"
                producer.produce(topic, b"x" * 100)
                producer.poll(0.2)
            cells = row.first.locator("td").all_text_contents()
            assert cells[1] == client_id and cells[3].startswith("confluent-kafka-python ")
            assert int(cells[4]) >= 1 and float(cells[7]) > 0           # pushes; the client's request latency
            page.screenshot(path=str(tmp_path / "telemetry.png"))
        finally:
            producer.flush(10)
            page.close()


# confluent-kafka 2.5.0 bundles librdkafka 2.5.0, of the line that aborts on a subscription
# naming none of its metrics; scripts/setup.sh (test profile) installs it beside the venv.
OLD_RDKAFKA_DIR = Path(os.environ.get("KPROXY_CACHE_DIR", Path.home() / ".cache" / "kproxy")) / "confluent-kafka-2.5.0"
OLD_RDKAFKA_RECORDS = 20
OLD_RDKAFKA_PRODUCER = """
import sys, time
import confluent_kafka
bootstrap, topic, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "client.id": "old-rdkafka"})
delivered = []
for _ in range(n):
    producer.produce(topic, b"x" * 100, on_delivery=lambda err, msg: delivered.append(err is None))
    producer.poll(0.1)
producer.flush(20)
time.sleep(3)                      # several push intervals: a subscription would be used by now
producer.poll(0.1)
print(confluent_kafka.libversion()[0], sum(delivered))
"""


@pytest.mark.parametrize("denied", [True, False], ids=["denied", "offered-anyway"])
def test_a_real_librdkafka_2_5_0_is_kept_from_the_subscription_that_crashes_it(kafka_cluster, monkeypatch,
                                                                                denied):
    """The deny list is what keeps it alive: offered anyway (the list emptied for the test),
    the same client aborts (librdkafka's assertion, SIGABRT) once it has a subscription."""
    assert (OLD_RDKAFKA_DIR / "confluent_kafka").is_dir(), f"{OLD_RDKAFKA_DIR}: run scripts/setup.sh test"
    if not denied:
        monkeypatch.setattr(telemetry_offer, "DENIED_LIBRDKAFKA", ((9, 9, 9), (9, 9, 9)))
    offer = dict(OFFER, metrics=["org.apache.kafka.none-of-its-metrics."])
    with ProxyThread(upstream=kafka_cluster.bootstrap_servers, telemetry_offer=offer) as proxy:
        topic = create_topic(proxy.bootstrap)
        run = subprocess.run([sys.executable, "-c", OLD_RDKAFKA_PRODUCER, proxy.bootstrap, topic,
                              str(OLD_RDKAFKA_RECORDS)], env=dict(os.environ, PYTHONPATH=str(OLD_RDKAFKA_DIR)),
                             capture_output=True, text=True, timeout=120)
    if denied:
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.split() == ["2.5.0", str(OLD_RDKAFKA_RECORDS)], run.stdout
    else:
        assert run.returncode == -signal.SIGABRT, (run.returncode, run.stderr[-2000:])
