"""SNI routing: the whole cluster behind one TLS port, a host name per node.

- Names: the template and the bootstrap name map one to one onto node ids (a name is
  accepted only if the template makes exactly it); bad templates and settings fail at
  start with one line naming the key.
- Refusals, without a broker: a server name kproxy does not serve, or none, ends the
  handshake with ``unrecognized_name``; a log line within a budget, a metric for each.
- Live, a real three-node Kafka cluster behind one kproxy port: kafka-python,
  confluent-kafka (librdkafka) and Kafka's Java client produce and consume through it,
  the names resolved to 127.0.0.1 by each client's own means (see ``HostsFile``); a
  partition's leader is restarted and handed back, and clients follow it by name;
  mutual TLS to kproxy with TLS to the broker; sidecars, one per broker, on one port.
  No upstream address reaches a client (the leak scan of ``test_cluster``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import ssl
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kproxy import config as config_module
from kproxy.protocol import Struct
from kproxy.proxy.server import Proxy
from kproxy.proxy.sni import BOOTSTRAP, WIDEST_NODE_ID, NodeNames
from tests.proxy.certs import SNI_DOMAIN, make_pki, openssl_available
from tests.proxy.harness import ProxyThread

TEMPLATE = f"broker-{{node_id}}.{SNI_DOMAIN}"
BOOTSTRAP_NAME = f"bootstrap.{SNI_DOMAIN}"
HANDSHAKE_TIMEOUT_S = 10.0


# ---------------------------------------------------------------- names

@pytest.fixture
def names() -> NodeNames:
    return NodeNames.parse(TEMPLATE, BOOTSTRAP_NAME)


@pytest.mark.parametrize("node_id", [0, 1, 7, 1000, WIDEST_NODE_ID])
def test_a_node_name_routes_back_to_its_node(names, node_id):
    assert names.route(names.name_of(node_id)) == node_id


def test_bootstrap_name_routes_to_bootstrap(names):
    assert names.route(BOOTSTRAP_NAME) == BOOTSTRAP
    assert names.route(BOOTSTRAP_NAME.upper() + ".") == BOOTSTRAP    # DNS: case and the root dot


@pytest.mark.parametrize("server_name", [
    None, "", f"broker-01.{SNI_DOMAIN}",          # one name per node: no leading zeros
    f"broker-.{SNI_DOMAIN}", f"broker-x.{SNI_DOMAIN}", f"broker--1.{SNI_DOMAIN}",
    f"broker-1.{SNI_DOMAIN}.evil.example", f"xbroker-1.{SNI_DOMAIN}",
    f"broker-{WIDEST_NODE_ID + 1}.{SNI_DOMAIN}", f"broker-١.{SNI_DOMAIN}",   # Arabic-Indic one
    "broker-1.other.example", "127.0.0.1",
])
def test_other_names_route_nowhere(names, server_name):
    assert names.route(server_name) is None


def test_names_ignore_case_and_a_final_dot(names):
    assert names.route(f"BROKER-3.{SNI_DOMAIN.upper()}.") == 3
    assert NodeNames.parse(TEMPLATE.upper(), BOOTSTRAP_NAME.upper()).route(f"broker-3.{SNI_DOMAIN}") == 3


@pytest.mark.parametrize("template, bootstrap, message", [
    ("broker.kafka.example", "b.kafka.example", "must hold {node_id} exactly once"),
    ("b-{node_id}-{node_id}.kafka.example", "b.kafka.example", "must hold {node_id} exactly once"),
    ("b-{node_id}-{host}.kafka.example", "b.kafka.example", "must hold {node_id} exactly once"),
    ("b-{node_id:03}.kafka.example", "b.kafka.example", "without a format spec"),
    ("b-{node_id.kafka.example", "b.kafka.example", "expected '}'"),
    ("broker-{node_id}", "b.kafka.example", "needs a dot"),
    ("b_{node_id}.kafka.example", "b.kafka.example", "a DNS label is"),
    ("{node_id}.0.0", "b.kafka.example", "looks like an IP address"),
    ("b-{node_id}." + "x" * 250, "b.kafka.example", "longer than 253"),
    ("b-{node_id}.kafka.example", "bootstrap", "needs a dot"),
    ("b-{node_id}.kafka.example", "b-1.kafka.example", "also a broker name"),
])
def test_bad_names_are_refused_with_the_reason(template, bootstrap, message):
    with pytest.raises(ValueError, match=".*".join(map(_escape, message.split("*")))):
        NodeNames.parse(template, bootstrap)


def _escape(text: str) -> str:
    import re
    return re.escape(text)


# ---------------------------------------------------------------- config

def _sni_settings(tmp_path, **overrides) -> dict:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.touch()
    key.touch()
    settings = {"upstream": "kafka:9092", "routing": "sni", "sni_host_template": TEMPLATE,
                "sni_bootstrap_host": BOOTSTRAP_NAME,
                "tls_server": {"cert_file": str(cert), "key_file": str(key)}}
    settings.update(overrides)
    return {k: v for k, v in settings.items() if v is not None}


def test_config_accepts_sni_in_both_modes(tmp_path):
    gateway = config_module.build(_sni_settings(tmp_path))
    assert gateway.sni_names.route(f"broker-2.{SNI_DOMAIN}") == 2
    sidecar = config_module.build(_sni_settings(tmp_path, mode="sidecar", listen="10.0.0.1:9093"))
    assert sidecar.sni_names.bootstrap == BOOTSTRAP_NAME
    assert config_module.build({"upstream": "kafka:9092"}).sni_names is None      # default: ports


@pytest.mark.parametrize("overrides, message", [
    ({"tls_server": None}, "routing: 'sni' reads the server name from the TLS handshake"),
    ({"routing": "names"}, "routing: must be one of ports, sni"),
    ({"sni_host_template": None}, "sni_host_template: required when routing is 'sni'"),
    ({"sni_bootstrap_host": None}, "sni_bootstrap_host: required when routing is 'sni'"),
    ({"sni_host_template": "broker.kafka.example"}, "sni_host_template: template 'broker.kafka.example' "
                                                    "must hold {node_id} exactly once"),
    ({"sni_bootstrap_host": "localhost"}, "sni_bootstrap_host: bootstrap name 'localhost' needs a dot"),
    ({"sni_bootstrap_host": f"broker-9.{SNI_DOMAIN}"}, "sni_bootstrap_host: .* is also a broker name"),
    ({"broker_port_base": 0}, "broker_port_rule/base/map: not used with routing = 'sni'"),
    ({"broker_port_rule": "map", "broker_port_map": "1=9101"}, "not used with routing = 'sni'"),
    ({"advertised_host": "kafka.example"}, "advertised_host/advertised_host_template: not used"),
    ({"mode": "sidecar", "listen": "127.0.0.1:0"}, "listen: a sidecar with routing = 'sni'"),
    ({"routing": "ports"}, "sni_host_template: only used with routing = 'sni'"),
])
def test_config_errors_name_the_key(tmp_path, overrides, message):
    with pytest.raises(config_module.ConfigError, match=message.replace("{", r"\{").replace("(", r"\(")):
        config_module.build(_sni_settings(tmp_path, **overrides))


def test_cli_flags_and_env_reach_the_config(tmp_path):
    settings = _sni_settings(tmp_path)
    env = config_module.from_env({"KPROXY_ROUTING": "sni", "KPROXY_SNI_HOST_TEMPLATE": TEMPLATE,
                                  "KPROXY_SNI_BOOTSTRAP_HOST": BOOTSTRAP_NAME})
    config = config_module.build({"upstream": "kafka:9092", "tls_server": settings["tls_server"]}, env)
    assert (config.routing, config.sni_host_template, config.sni_bootstrap_host) == \
        ("sni", TEMPLATE, BOOTSTRAP_NAME)
    from kproxy.cli import RUN_FLAGS
    assert {"routing", "sni_host_template", "sni_bootstrap_host"} <= {k for k, _ in RUN_FLAGS.values()}


# ---------------------------------------------------------------- without a broker

@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    if not openssl_available():
        pytest.fail("the openssl command is needed to make test certificates", pytrace=False)
    return make_pki(tmp_path_factory.mktemp("pki"))


def sni_tls_server(pki, **extra) -> dict:
    return {"cert_file": str(pki.sni.cert), "key_file": str(pki.sni.key), **extra}


def test_a_new_node_gets_its_name_with_no_new_listener(pki):
    """The cluster grows: node 7 is advertised by the template on the one port, its
    upstream learnt, and no listener opened; every node keeps its own name."""
    config = config_module.build({"upstream": "kafka:9092", "routing": "sni", "listen": "127.0.0.1:9443",
                                  "sni_host_template": TEMPLATE, "sni_bootstrap_host": BOOTSTRAP_NAME,
                                  "tls_server": sni_tls_server(pki)})
    proxy = Proxy(config)
    for node_id in (1, 2, 7):
        assert proxy.advertise(node_id, f"10.0.0.{node_id}", 9092) == (f"broker-{node_id}.{SNI_DOMAIN}", 9443)
    assert proxy.advertise_controller(2, "10.0.0.2", 9093) == (f"broker-2.{SNI_DOMAIN}", 9443)
    assert proxy.upstream_of == {1: ("10.0.0.1", 9092), 2: ("10.0.0.2", 9092), 7: ("10.0.0.7", 9092)}
    assert proxy.listeners == {} and proxy.unbound == {}


def handshake(address: tuple[str, int], pki, server_name: str | None) -> str:
    """"ok" once a handshake sending ``server_name`` as SNI completes, else its error."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    if server_name is None:
        context.check_hostname = False          # no name, so nothing to check it against
    raw = socket.create_connection(address, timeout=HANDSHAKE_TIMEOUT_S)
    try:
        with context.wrap_socket(raw, server_hostname=server_name):
            return "ok"
    except (ssl.SSLError, ConnectionResetError) as exc:
        return repr(exc)
    finally:
        raw.close()


def metric(admin_url: str, name: str) -> dict[str, float]:
    """label text -> value of one kproxy metric family on /metrics."""
    text = urllib.request.urlopen(admin_url + "/metrics", timeout=HANDSHAKE_TIMEOUT_S).read().decode()
    return {line.split(" ")[0][len(name):]: float(line.split(" ")[1])
            for line in text.splitlines() if line.startswith(name + "{") or line.startswith(name + " ")}


def test_unknown_or_missing_server_names_are_refused(pki, caplog):
    """In the handshake, before kproxy's certificate is sent or a broker is reached (here
    there is none): one log line per name per interval, a metric for each refusal."""
    caplog.set_level(logging.INFO, logger="kproxy")
    with ProxyThread(upstream="127.0.0.1:1", routing="sni", sni_host_template=TEMPLATE,
                     sni_bootstrap_host=BOOTSTRAP_NAME, tls_server=sni_tls_server(pki)) as proxy:
        address = proxy.runtime.proxy.bootstrap_address
        unknown = f"kafka.{SNI_DOMAIN}"              # the wildcard covers it; kproxy does not serve it
        for _ in range(3):
            assert handshake(address, pki, unknown) != "ok"
        assert handshake(address, pki, f"broker-01.{SNI_DOMAIN}") != "ok"
        assert handshake(address, pki, None) != "ok"
        # Control: served names complete the handshake (the broker behind them is unreachable).
        assert handshake(address, pki, f"broker-1.{SNI_DOMAIN}") == "ok"
        assert handshake(address, pki, BOOTSTRAP_NAME.upper()) == "ok"
        refused = metric(proxy.admin_url, "kproxy_sni_refused_total")
        assert refused == {'{reason="unknown_name"}': 4.0, '{reason="no_name"}': 1.0}
    lines = [r.getMessage() for r in caplog.records if "refusing a TLS connection" in r.getMessage()]
    assert len(lines) == 3, lines                    # the same name again is not logged
    assert f"server name '{unknown}' is neither the bootstrap name '{BOOTSTRAP_NAME}'" in lines[0]
    assert "no server name (SNI) was sent" in lines[2]
