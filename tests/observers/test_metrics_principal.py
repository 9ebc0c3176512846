"""Requests and bytes per principal: SASL users named by their exchange, certificate subjects."""

import dataclasses

from prometheus_client import generate_latest

from kproxy.observers.metrics import Metrics
from tests.observers.metrics import Client, Clock, samples, value

REQUESTS = "kproxy_principal_requests_total"


def authenticate(client, user, password=b"pw", mechanism="PLAIN", accept=True):
    client.call("SaslHandshake", 1, dict(mechanism=mechanism), dict(error_code=0, mechanisms=[mechanism]))
    client.call("SaslAuthenticate", 2, dict(auth_bytes=b"\0" + user.encode() + b"\0" + password),
                dict(error_code=0 if accept else 58, auth_bytes=b""))


def test_requests_after_a_sasl_exchange_count_under_the_user():
    m, clock = Metrics(principal_label=True), Clock()
    client = Client(m, clock)
    client.call("ApiVersions", 3)
    authenticate(client, "dave", b"do-not-keep")
    client.call("Metadata", 12, dict(topics=None), dict(brokers=[], topics=[]))
    assert value(m, REQUESTS, principal="ANONYMOUS", api="ApiVersions") == 1
    assert value(m, REQUESTS, principal="ANONYMOUS", api="SaslAuthenticate") == 1
    assert value(m, REQUESTS, principal="dave", api="Metadata") == 1
    assert value(m, "kproxy_principal_request_bytes_total", principal="dave", api="Metadata") > 0
    assert value(m, "kproxy_principal_response_bytes_total", principal="dave", api="Metadata") > 0
    assert b"do-not-keep" not in generate_latest(m.registry)


def test_a_refused_password_names_nobody():
    m, clock = Metrics(principal_label=True), Clock()
    client = Client(m, clock)
    authenticate(client, "mallory", accept=False)
    client.call("Metadata", 12, dict(topics=None), dict(brokers=[], topics=[]))
    assert value(m, REQUESTS, principal="ANONYMOUS", api="Metadata") == 1
    assert not any(dict(labels)["principal"] == "mallory" for labels in samples(m, REQUESTS))


def test_a_client_certificate_subject_is_the_principal():
    m, clock = Metrics(principal_label=True), Clock()
    client = Client(m, clock)
    client.info = dataclasses.replace(client.info, principal="CN=svc-orders,O=Example")
    client.call("Metadata", 12, dict(topics=None), dict(brokers=[], topics=[]))
    assert value(m, REQUESTS, principal="CN=svc-orders,O=Example", api="Metadata") == 1


def test_principal_labels_stay_bounded_under_invented_users():
    cap = 3
    m, clock = Metrics(principal_label=True, label_cap=cap), Clock()
    for i in range(40):
        client = Client(m, clock)
        authenticate(client, f"invented-{i}")
        client.call("Metadata", 12, dict(topics=None), dict(brokers=[], topics=[]))
        client.close()
    series = samples(m, REQUESTS)
    assert len({dict(labels)["principal"] for labels in series}) <= cap + 1
    assert sum(v for labels, v in series.items() if dict(labels)["api"] == "Metadata") == 40
    assert not m.principals.by_connection                               # closed connections leave no state


def test_without_the_opt_in_there_is_no_principal_metric():
    m, clock = Metrics(), Clock()
    authenticate(Client(m, clock), "erin")
    assert REQUESTS not in generate_latest(m.registry).decode()
