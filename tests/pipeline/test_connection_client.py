"""One connection that changes its client software mid-way, through every surface that names it.

Kafka takes a connection's latest accepted ApiVersions v3+ as its client software
(``kproxy.protocol.client_software``). A raw client on one connection through a real
kproxy to a real Kafka names ``first-sw``, sends a request, names ``second-sw``, sends
one, then sends an ApiVersions whose name the broker refuses (INVALID_REQUEST), and one
more request. Every surface must say ``second-sw``: the metric, the capture rows after it
(a row carries its connection's software as of its pair), ``kproxy capture stats``, the
live page's client inventory, and the pipeline's per-connection table and inventory.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from kproxy.observers.capture import Capture, CaptureConfig
from kproxy.observers.capture.cli import compute_stats
from kproxy.pipeline import load_capture, tables
from tests.observers.metrics import sample, scrape
from tests.proxy.harness import ProxyThread
from tests.proxy.wire import API_VERSIONS, METADATA, RawClient

pytestmark = [pytest.mark.timeout(300)]

TOKEN = "connection-client-test-token-0123456789"
CLIENT_ID = "switcher"
FIRST, SECOND = ("first-sw", "1.0"), ("second-sw", "2.0")
REFUSED_NAME = "not a name!"          # Kafka's pattern is [a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?
INVALID_REQUEST = 42
METADATA_VERSION = 12


def name_software(client: RawClient, name: str, version: str) -> int:
    response = client.roundtrip(API_VERSIONS, 3, client_software_name=name, client_software_version=version)
    return response.body.error_code


def live_overview(proxy) -> dict:
    request = urllib.request.Request(proxy.admin_url + "/live/overview",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def switched(kafka_cluster, tmp_path_factory):
    """(capture directory, metrics while open, live inventory while open)."""
    directory = tmp_path_factory.mktemp("connection-client")
    capture = Capture(instance_name="connection-client-test")
    with ProxyThread(observers=[capture], upstream=kafka_cluster.bootstrap_servers,
                     admin_token=TOKEN) as proxy:
        capture.start(CaptureConfig(directory=str(directory), formats=("jsonl",)))
        client = RawClient(proxy.bootstrap, client_id=CLIENT_ID)
        try:
            assert name_software(client, *FIRST) == 0
            client.roundtrip(METADATA, METADATA_VERSION, topics=[])
            assert name_software(client, *SECOND) == 0
            client.roundtrip(METADATA, METADATA_VERSION, topics=[])
            assert name_software(client, REFUSED_NAME, "3.0") == INVALID_REQUEST
            client.roundtrip(METADATA, METADATA_VERSION, topics=[])
            metrics = scrape(proxy)
            inventory = [g for g in live_overview(proxy)["inventory"] if g["client_id"] == CLIENT_ID]
        finally:
            client.close()
        capture.stop()
    return directory, metrics, inventory


def rows_of(directory) -> list[dict]:
    rows = [json.loads(line) for f in sorted(directory.glob("*.jsonl")) for line in f.read_text().splitlines()]
    return [r for r in rows if r["client_id"] == CLIENT_ID]


def test_the_metric_counts_the_connection_under_its_latest_software(switched):
    _, metrics, _ = switched
    software = lambda name, version: sample(metrics, "kproxy_client_software_connections",
                                            client_software_name=name, client_software_version=version)
    assert software(*SECOND) == 1
    assert software(*FIRST) == 0
    assert software(REFUSED_NAME, "3.0") == 0


def test_capture_rows_carry_the_software_as_of_their_pair(switched):
    directory, _, _ = switched
    rows = rows_of(directory)
    assert [(r["api_name"], r["client_software_name"], r["client_software_version"]) for r in rows] == [
        ("ApiVersions", *FIRST), ("Metadata", *FIRST),
        ("ApiVersions", *SECOND), ("Metadata", *SECOND),
        ("ApiVersions", *SECOND), ("Metadata", *SECOND)]       # the refused name is nobody's


def test_capture_stats_count_the_connection_under_its_latest_software(switched):
    directory, _, _ = switched
    inventory = compute_stats(rows_of(directory))["client_software"]
    assert [(e["name"], e["version"], e["connections"], e["client_ids"]) for e in inventory] == [
        (*SECOND, 1, [CLIENT_ID])]


def test_the_live_inventory_shows_the_latest_software(switched):
    _, _, inventory = switched
    assert [(g["software_name"], g["software_version"], g["open"]) for g in inventory] == [(*SECOND, 1)]


def test_the_pipeline_gives_the_connection_its_latest_software(spark, switched):
    directory, _, _ = switched
    _, pairs = load_capture(spark, [str(directory)])
    mine = pairs.where(pairs.client_id == CLIENT_ID)
    connections = [(r["client_software_name"], r["client_software_version"])
                   for r in tables.per_connection(mine).collect()]
    assert connections == [SECOND]
    inventory = [(r["client_software_name"], r["client_software_version"], r["connections"])
                 for r in tables.client_inventory(mine).collect()]
    assert inventory == [(*SECOND, 1)]
