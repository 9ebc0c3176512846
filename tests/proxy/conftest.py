"""Fixtures for the tests that run kproxy in front of a real broker and watch its log.

- ``kproxy_log``: kproxy's log records; fails the test if kproxy or asyncio logged an error;
- ``start_proxy``: kproxies in front of ``kafka_cluster``, stopped after the test;
- ``topic``: a one-partition topic per test module;
- ``client_bytes``: every byte kproxy forwards to clients, for the leak scans;
- ``tls_cluster``: a TLS-only node, one per session (``cluster3``, the three-node cluster, is
  in ``tests/conftest.py``: the pipeline's failover test uses it too);
- ``node_ids``, ``workers_proxy``, ``workers_topic``: ``kproxy run --workers 2`` and a topic
  through it, one per module.

A module that defines a fixture of the same name (``test_proxy_e2e``'s ``proxy``) uses its own.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator

import pytest

from kproxy.embedded import KAFKA_4_VERSION, LIGHT_BROKER_JVM_ARGS, KafkaCluster
from kproxy.protocol.connection import Connection
from kproxy.proxy.relay import Relay
from tests.proxy.harness import ProxyThread, Workers
from tests.proxy.wire import WitnessClient, create_topic


@pytest.fixture
def start_proxy(kafka_cluster, kproxy_log):
    """``start_proxy(**settings)``: a running kproxy in front of ``kafka_cluster`` (or ``upstream``)."""
    with contextlib.ExitStack() as stack:
        def start(**settings) -> ProxyThread:
            settings.setdefault("upstream", kafka_cluster.bootstrap_servers)
            settings.setdefault("shutdown_timeout", 5.0)
            return stack.enter_context(ProxyThread(**settings))     # every port chosen by the OS
        yield start


@pytest.fixture
def kproxy_log(caplog):
    """kproxy's log records; the test fails if kproxy or asyncio logged an error.

    ``start_proxy`` depends on this fixture, so it is torn down after the proxies stop and
    also sees what their shutdown logged (``caplog.records`` holds the current phase only).
    """
    caplog.set_level(logging.INFO, logger="kproxy")
    yield caplog
    records = caplog.get_records("setup") + caplog.get_records("call") + caplog.records
    errors = [r for r in records if r.levelno >= logging.ERROR
              and (r.name.startswith("kproxy") or r.name == "asyncio")]
    assert not errors, "errors logged: " + "; ".join(
        f"{r.name}: {r.getMessage()} {r.exc_info[1]!r}" if r.exc_info else f"{r.name}: {r.getMessage()}"
        for r in errors)


@pytest.fixture(scope="module")
def topic(kafka_cluster) -> str:
    """A one-partition topic for long-polls (``start_long_poll`` fetches at its end)."""
    return create_topic(kafka_cluster.bootstrap_servers)


@pytest.fixture
def client_bytes(monkeypatch):
    """Every byte kproxy forwards to clients (what relay_broker hands the relay to write, and
    what of held answers it passes before they are complete)."""
    seen = []
    original = Connection.relay_broker

    def recording(self, data):
        events, out = original(self, data)
        seen.extend(bytes(chunk) for chunk in out)
        return events, out

    def passing(self, piece):                 # a held answer's records, passed as they come
        seen.append(bytes(piece))
        return passed(self, piece)

    monkeypatch.setattr(Connection, "relay_broker", recording)
    passed = Relay._pass
    monkeypatch.setattr(Relay, "_pass", passing)
    return seen



@pytest.fixture(scope="session")
def tls_cluster(require_kafka, pki) -> Iterator[KafkaCluster]:
    """One node whose CLIENT listener is TLS only and requires a client certificate."""
    require_kafka(KAFKA_4_VERSION)
    extra = {
        "listener.security.protocol.map": "CLIENT:SSL,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "listener.name.client.ssl.keystore.type": "PEM",
        "listener.name.client.ssl.keystore.location": str(pki.server.chain),
        "listener.name.client.ssl.truststore.type": "PEM",
        "listener.name.client.ssl.truststore.location": str(pki.ca),
        "listener.name.client.ssl.client.auth": "required",
    }
    with KafkaCluster(extra_config=extra, jvm_args=LIGHT_BROKER_JVM_ARGS) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def node_ids(kafka_cluster) -> list[int]:
    return [node.node_id for node in kafka_cluster.nodes]


@pytest.fixture(scope="module")
def workers_proxy(kafka_cluster, node_ids, tmp_path_factory):
    with Workers(kafka_cluster.bootstrap_servers, node_ids, tmp_path_factory.mktemp("workers")) as workers:
        yield workers
    assert workers.returncode == 0, workers.log_text()


@pytest.fixture(scope="module")
def workers_topic(workers_proxy) -> str:
    name = f"workers-{uuid.uuid4().hex[:8]}"
    with WitnessClient(workers_proxy.bootstrap) as client:
        client.create(name)
    return name
