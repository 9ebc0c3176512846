"""The broker directory without sockets: port rules, advertised addresses, nodes served
and left out, withheld nodes, Metadata's broker list, SNI names and routes.

Everything here is the pure part of the proxy (``kproxy.proxy.directory``): configs are
built as the real loader builds them, and listener events are told to the directory
as ``Proxy`` tells them. No socket is opened, no event loop runs.
"""

from __future__ import annotations

import logging

import pytest

from kproxy import config as config_module
from kproxy.certs.sni import BOOTSTRAP
from kproxy.proxy.directory import (LEFT_OUT_LOG_NODES_PER_INTERVAL, NO_PORT, BrokerDirectory,
                                    Refusal)

LISTEN_PORT = 9092                # a configured port; nothing is bound in these tests
SNI_PORT = 9443
SNI_DOMAIN = "kafka.example.com"
TEMPLATE = f"broker-{{node_id}}.{SNI_DOMAIN}"
BOOTSTRAP_NAME = f"bootstrap.{SNI_DOMAIN}"


def directory(opened: list | None = None, **settings) -> BrokerDirectory:
    config = config_module.build({"upstream": "kafka:9092", "listen": f"127.0.0.1:{LISTEN_PORT}", **settings})
    return BrokerDirectory(config, (opened if opened is not None else []).append)


def sni_directory(pki, **settings) -> BrokerDirectory:
    return directory(routing="sni", listen=f"127.0.0.1:{SNI_PORT}", sni_host_template=TEMPLATE,
                     sni_bootstrap_host=BOOTSTRAP_NAME,
                     tls_server={"cert_file": str(pki.sni.cert), "key_file": str(pki.sni.key)}, **settings)


# ---------------------------------------------------------------- port rules


@pytest.mark.parametrize("node_id", [0, 1, 7, 1000])
def test_offset_rule_adds_the_node_id_to_the_base(node_id):
    assert directory().port_for(node_id) == LISTEN_PORT + 1 + node_id          # base: listen + 1
    assert directory(broker_port_base=20000).port_for(node_id) == 20000 + node_id


def test_sequential_rule_hands_out_ports_in_discovery_order():
    d = directory(broker_port_rule="sequential", broker_port_base=30000)
    assert d.port_for(42, assign=False) == 30000
    assert d.broker_ports == {}                         # asking without assigning gives none
    assert [d.port_for(n) for n in (42, 3, 1000)] == [30000, 30001, 30002]
    assert d.port_for(3) == 30001                       # stable once given
    assert d.port_for(5, assign=False) == 30003


def test_map_rule_maps_listed_nodes_and_offsets_the_rest():
    d = directory(broker_port_rule="map", broker_port_map="1=31001,2=31777", broker_port_base=40000)
    assert (d.port_for(1), d.port_for(2), d.port_for(3)) == (31001, 31777, 40003)


def test_fixed_rule_is_the_listen_port_for_every_node():
    d = directory(mode="sidecar", broker_port_rule="fixed")
    assert {d.port_for(n) for n in (0, 1, 99)} == {LISTEN_PORT}


def test_base_zero_advertises_the_port_each_listener_was_bound_to():
    opened: list[int] = []
    d = directory(opened, listen="127.0.0.1:0", broker_port_base=0)
    assert d.advertise(3, "10.0.0.3", 9092) == ("127.0.0.1", 0)     # asked for, not bound yet
    assert opened == [3]
    d.listener_bound(3, 45123)
    assert d.port_for(3) == 45123
    assert d.advertise(3, "10.0.0.3", 9092) == ("127.0.0.1", 45123)
    assert d.broker_addresses() == {3: ("127.0.0.1", 45123)}
    d.listener_closed(3)
    assert d.port_for(3) == 0 and d.broker_addresses() == {}


# ---------------------------------------------------------------- the gateway's mapper


def test_gateway_learns_upstreams_and_asks_for_a_listener_per_node():
    opened: list[int] = []
    d = directory(opened, advertised_host="kafka.public")
    assert d.advertise(1, "b1", 9092) == ("kafka.public", LISTEN_PORT + 2)
    assert d.advertise(2, "b2", 9092) == ("kafka.public", LISTEN_PORT + 3)
    assert d.advertise(1, "b1-moved", 9093) == ("kafka.public", LISTEN_PORT + 2)
    assert d.upstream_of == {1: ("b1-moved", 9093), 2: ("b2", 9092)}
    assert opened == [1, 2, 1]           # asked each time: opening is idempotent on the listener side
    assert d.served_nodes == {1, 2}


def test_max_brokers_leaves_further_nodes_out_and_logs_within_a_budget(caplog):
    d = directory(max_brokers=2)
    d.begin_answer()
    with caplog.at_level(logging.WARNING, logger="kproxy.server"):
        addresses = [d.advertise(n, f"b{n}", 9092) for n in range(10)]
    assert addresses[:2] == [("127.0.0.1", LISTEN_PORT + 1), ("127.0.0.1", LISTEN_PORT + 2)]
    assert all(port == NO_PORT for _, port in addresses[2:])
    assert d.left_out(controllers=False) == set(range(2, 10))
    assert d.upstream_of.keys() == {0, 1}               # nothing learnt for nodes left out
    lines = [r for r in caplog.records if "left out" in r.getMessage()]
    assert len(lines) == LEFT_OUT_LOG_NODES_PER_INTERVAL
    assert "max_brokers (2)" in lines[0].getMessage()
    d.begin_answer()
    assert d.left_out(controllers=False) == set()       # per answer


def test_a_metadata_answer_frees_the_places_of_brokers_gone():
    d = directory(max_brokers=2)
    d.advertise(1, "b1", 9092)
    d.advertise(2, "b2", 9092)
    assert d.advertise(3, "b3", 9092)[1] == NO_PORT
    assert d.brokers_listed(set()) == set()             # an error answer says nothing
    assert d.served_nodes == {1, 2}
    assert d.brokers_listed({2, 3}) == {1}
    assert d.upstream_of == {2: ("b2", 9092)} and d.served_nodes == {2}
    assert d.advertise(3, "b3", 9092) == ("127.0.0.1", LISTEN_PORT + 4)


def test_a_port_outside_the_range_leaves_the_node_out(caplog):
    d = directory(broker_port_base=65000)
    with caplog.at_level(logging.WARNING, logger="kproxy.server"):
        assert d.advertise(535, "b", 9092) == ("127.0.0.1", 65535)
        assert d.advertise(536, "b", 9092)[1] == NO_PORT
    assert 536 not in d.served_nodes
    assert "outside 1-65535" in caplog.text


def test_withheld_nodes_are_left_out_of_brokers_answers_only():
    d = directory()
    d.advertise(1, "b1", 9092)
    d.listener_failed(1)
    d.begin_answer()
    assert d.left_out(controllers=False) == {1}
    assert d.left_out(controllers=True) == set()
    d.listener_bound(1, LISTEN_PORT + 2)
    assert d.left_out(controllers=False) == set()


def test_controllers_get_the_address_of_their_node_bound_as_a_broker_or_none():
    d = directory()
    d.begin_answer()
    assert d.advertise_controller(5, "c5", 9093)[1] == NO_PORT
    assert d.left_out(controllers=True) == {5}
    assert d.upstream_of == {}                          # a controller teaches nothing
    d.advertise(5, "b5", 9092)
    d.listener_bound(5, LISTEN_PORT + 6)
    d.begin_answer()
    assert d.advertise_controller(5, "c5", 9093) == ("127.0.0.1", LISTEN_PORT + 6)
    assert d.upstream_of == {5: ("b5", 9092)} and d.left_out(controllers=True) == set()


# ---------------------------------------------------------------- sidecars


@pytest.mark.parametrize("template,host,expected", [
    ("{host}", "broker-1.internal", "broker-1.internal"),
    ("kafka-{node_id}.example.com", "10.0.0.1", "kafka-1.example.com"),
    ("{host}.ext.example.com", "b1", "b1.ext.example.com"),
])
def test_sidecar_advertises_every_node_by_the_template_and_opens_nothing(template, host, expected):
    opened: list[int] = []
    d = directory(opened, mode="sidecar", advertised_host_template=template, broker_port_base=19000)
    assert d.advertise(1, host, 9092) == (expected, 19001)
    assert opened == [] and d.upstream_of == {}
    assert d.advertise_controller(1, host, 9093) == (expected, 19001)   # sidecars: as brokers
    assert d.brokers_listed({2}) == set() and d.served_nodes == set()


# ---------------------------------------------------------------- SNI routing


def test_sni_names_and_routes_map_one_to_one(pki):
    d = sni_directory(pki)
    d.listen_port = 40443                               # as bound
    for node_id in (0, 1, 7, 123456):
        host, port = d.advertise(node_id, f"b{node_id}", 9092)
        assert (host, port) == (f"broker-{node_id}.{SNI_DOMAIN}", 40443)
        assert d.check_server_name(host).route == node_id
    assert d.check_server_name(BOOTSTRAP_NAME).route == BOOTSTRAP
    assert d.check_server_name(BOOTSTRAP_NAME.upper()).route == BOOTSTRAP


@pytest.mark.parametrize("name,refusal", [
    (None, Refusal.NO_NAME),
    ("", Refusal.NO_NAME),
    ("kafka.example.org", Refusal.UNKNOWN_NAME),
    (f"broker-x.{SNI_DOMAIN}", Refusal.UNKNOWN_NAME),
    (f"broker-01.{SNI_DOMAIN}", Refusal.UNKNOWN_NAME),      # not what the template makes for 1
])
def test_names_no_node_has_are_refused(pki, name, refusal):
    check = sni_directory(pki).check_server_name(name)
    assert check.refusal is refusal and check.said


def test_a_gateway_serves_by_name_only_the_nodes_it_learnt(pki):
    d = sni_directory(pki)
    assert d.unserved(3) and not d.unserved(BOOTSTRAP)
    d.advertise(3, "b3", 9092)
    assert not d.unserved(3)
    assert d.brokers_listed({1}) == {3}
    assert d.unserved(3)
    assert d.unserved_refusal("x", 3).refusal is Refusal.UNKNOWN_NODE


def test_a_sidecar_refuses_other_nodes_names_once_it_knows_its_own(pki):
    d = sni_directory(pki, mode="sidecar", upstream="10.0.0.1:9092")
    assert d.check_server_name(f"broker-2.{SNI_DOMAIN}").refusal is None
    d.advertise(2, "10.0.0.2", 9092)
    assert d.local_node is None
    d.advertise(1, "10.0.0.1", 9092)
    assert d.local_node == 1
    assert d.check_server_name(f"broker-2.{SNI_DOMAIN}").refusal is Refusal.OTHER_NODE
    assert d.check_server_name(f"broker-1.{SNI_DOMAIN}").refusal is None
    assert d.check_server_name(BOOTSTRAP_NAME).refusal is None
    assert not d.unserved(2)                            # a sidecar's names all reach its broker


def test_names_the_certificate_does_not_cover_are_warned_about_once(pki, caplog):
    d = sni_directory(pki)
    d.certificate_names = ["other.example.net"]
    with caplog.at_level(logging.WARNING, logger="kproxy.server"):
        d.advertise(1, "b1", 9092)
        d.advertise(1, "b1", 9092)
        d.advertise(2, "b2", 9092)
    warned = [r.getMessage() for r in caplog.records if "not valid for" in r.getMessage()]
    assert len(warned) == 2 and f"broker-1.{SNI_DOMAIN}" in warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kproxy.server"):
        d.certificate_changed([f"*.{SNI_DOMAIN}"])
    assert "not valid for" not in caplog.text         # the bootstrap and both nodes' names covered
    with caplog.at_level(logging.WARNING, logger="kproxy.server"):
        d.certificate_changed(["other.example.net"])
    assert caplog.text.count("not valid for") == 3      # bootstrap, 1, 2: each name checked again
