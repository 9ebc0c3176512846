"""Shared fixtures: real brokers, started once per test session and reused.

Broker fixtures fail, not skip, when Java or Maven is missing: a suite that quietly skips
its end-to-end tests looks green while proving nothing. Set KPROXY_SKIP_BROKER_TESTS=1 to
skip every test that needs a broker on purpose (a quick run, a machine without Java).
Tests that use a broker fixture get the ``broker`` marker automatically, so
``pytest -m "not broker"`` selects the rest. Tests marked ``soak`` run only with
``--soak-seconds N`` (tests/soak.py); otherwise they are deselected.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import pytest

from kproxy.embedded import (
    KAFKA_3_VERSION,
    KAFKA_4_VERSION,
    LIGHT_BROKER_JVM_ARGS,
    EmbeddedBrokerError,
    KafkaCluster,
    TansuBroker,
    missing_prerequisites,
    tansu_executable,
)
from tests.proxy.certs import PKI, make_pki, openssl_available
from tests.proxy.harness import PASSWORD, SCRAM_USER
from tests.soak import SOAK_OPTION, SOAK_TIMEOUT_MARGIN_S

SKIP_BROKER_TESTS_ENV = "KPROXY_SKIP_BROKER_TESTS"

BROKER_FIXTURES = frozenset({"kafka_cluster", "kafka3_cluster", "tansu_broker", "make_kafka_cluster", "require_kafka",
                             "s3_server"})


def _skip_if_requested() -> None:
    if os.environ.get(SKIP_BROKER_TESTS_ENV) == "1":
        pytest.skip(f"broker tests skipped ({SKIP_BROKER_TESTS_ENV}=1)")


def _unavailable(reason: str) -> NoReturn:
    pytest.fail(f"{reason}; set {SKIP_BROKER_TESTS_ENV}=1 to skip broker tests", pytrace=False)


def _require_kafka(version: str) -> None:
    _skip_if_requested()
    missing = missing_prerequisites(version)
    if missing:
        _unavailable(f"Kafka {version} cannot run on this machine: missing {', '.join(missing)}")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(SOAK_OPTION, type=float, default=0.0, metavar="SECONDS",
                     help="run the tests marked soak, each for about this long "
                          "(default 0: they are deselected); see tests/soak.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    soak_seconds = config.getoption(SOAK_OPTION)
    soaks = [item for item in items if item.get_closest_marker("soak")]
    if soaks and not soak_seconds:
        config.hook.pytest_deselected(items=soaks)
        items[:] = [item for item in items if not item.get_closest_marker("soak")]
    for item in soaks:
        item.add_marker(pytest.mark.timeout(soak_seconds + SOAK_TIMEOUT_MARGIN_S))
    for item in items:
        if BROKER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.broker)
        if "browser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.browser)
    # The session's one browser (sync Playwright) keeps an event loop running in the main
    # thread from its first use to the session's end, where asyncio.run() cannot run: the
    # tests that use it go last (in their collected order).
    items[:] = ([i for i in items if "browser" not in getattr(i, "fixturenames", ())]
                + [i for i in items if "browser" in getattr(i, "fixturenames", ())])


@pytest.fixture
def soak_seconds(request) -> float:
    """How long a soak test runs (``--soak-seconds``; it is deselected without one)."""
    return request.config.getoption(SOAK_OPTION)


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for the session: Debian's ``chromium`` driven by Playwright
    (``executable_path``, so Playwright downloads no browser of its own)."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("no `chromium` on PATH (Debian package chromium; scripts/setup.sh installs it)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="session")
def require_kafka() -> Callable[[str], None]:
    """``require_kafka(version)`` fails (or skips, see module doc) unless that version can run.

    For fixtures of other scopes that build their own ``KafkaCluster``.
    """
    return _require_kafka


# KIP-848 groups move partitions only on members' heartbeats, which the broker paces (5 s by
# default): a member that joins waits up to two intervals for its share. One second lets the
# session broker's groups settle in a second or two; clients cannot set it themselves.
KIP848_HEARTBEAT_SETTINGS = {"group.consumer.min.heartbeat.interval.ms": 1000,
                             "group.consumer.heartbeat.interval.ms": 1000}


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[KafkaCluster]:
    """One combined Kafka node of the newest 4.x release (KIP-848 heartbeats every second)."""
    _require_kafka(KAFKA_4_VERSION)
    with KafkaCluster(version=KAFKA_4_VERSION, jvm_args=LIGHT_BROKER_JVM_ARGS,
                      extra_config=KIP848_HEARTBEAT_SETTINGS) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def kafka3_cluster() -> Iterator[KafkaCluster]:
    """One combined Kafka node of the 3.x line (old protocol versions, no KIP-848 default)."""
    _require_kafka(KAFKA_3_VERSION)
    with KafkaCluster(version=KAFKA_3_VERSION, jvm_args=LIGHT_BROKER_JVM_ARGS) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def s3_server():
    """s3proxy (``kproxy.embedded.s3proxy``), a real S3-compatible server over a temporary directory."""
    _skip_if_requested()
    from kproxy.embedded.s3proxy import S3Proxy
    try:
        server = S3Proxy()
        server.start()
    except EmbeddedBrokerError as exc:
        _unavailable(str(exc))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tansu_broker() -> Iterator[TansuBroker]:
    """An in-memory Tansu broker (fresh per session: it never forgets anything)."""
    _skip_if_requested()
    try:
        tansu_executable()
    except EmbeddedBrokerError as exc:
        _unavailable(str(exc))
    with TansuBroker() as broker:
        yield broker


@pytest.fixture
def make_kafka_cluster() -> Iterator[Callable[..., KafkaCluster]]:
    """Factory for a started ``KafkaCluster(**kwargs)`` (light JVM flags unless ``jvm_args``
    says otherwise); all are stopped after the test."""
    clusters: list[KafkaCluster] = []

    def make(**kwargs: Any) -> KafkaCluster:
        _require_kafka(kwargs.get("version", KAFKA_4_VERSION))
        cluster = KafkaCluster(**{"jvm_args": LIGHT_BROKER_JVM_ARGS, **kwargs})
        clusters.append(cluster)
        cluster.start()
        return cluster

    yield make
    for cluster in reversed(clusters):
        cluster.stop()


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> PKI:
    """One set of test certificates for the session (the TLS brokers trust its CA)."""
    if not openssl_available():
        pytest.fail("the openssl command is needed to make test certificates", pytrace=False)
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def cluster3(require_kafka) -> Iterator[KafkaCluster]:
    """Three combined nodes (tests that stop a node or move a leader restore it before they end)."""
    require_kafka(KAFKA_4_VERSION)
    with KafkaCluster(3, jvm_args=LIGHT_BROKER_JVM_ARGS) as cluster:
        yield cluster


def sasl_cluster_settings() -> dict[str, Any]:
    """``KafkaCluster`` arguments of ``sasl_cluster`` (for a fixture that adds settings).

    With an authorizer (kafka-acls asks for the ACLs first, and a broker without one refuses
    that): alice is a super user, and so is the unauthenticated inter-broker and controller
    traffic of this one node, so every test that signs in as alice may do anything."""
    extra = {
        "listener.security.protocol.map": "CLIENT:SASL_PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
        "listener.name.client.sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
        "listener.name.client.plain.sasl.jaas.config":
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'user_{SCRAM_USER}="{PASSWORD}";',
        "listener.name.client.scram-sha-512.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": f"User:{SCRAM_USER};User:ANONYMOUS",
    }
    scram = f"SCRAM-SHA-512=[name={SCRAM_USER},password={PASSWORD}]"
    return {"extra_config": extra, "format_args": ["--add-scram", scram], "jvm_args": LIGHT_BROKER_JVM_ARGS}


@pytest.fixture(scope="session")
def sasl_cluster(require_kafka) -> Iterator[KafkaCluster]:
    """One node with SASL_PLAINTEXT on CLIENT: PLAIN (JAAS users) and SCRAM-SHA-512, and ACLs
    (alice a super user)."""
    require_kafka(KAFKA_4_VERSION)
    with KafkaCluster(**sasl_cluster_settings()) as cluster:
        yield cluster
