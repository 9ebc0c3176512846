"""The start-up block for each way kproxy can be set up: listeners, what clients are told,
TLS, the admin token and capture (its lines as ``kproxy run`` logs them: tests/test_cli.py)."""

from __future__ import annotations

import shutil

import pytest

from kproxy import config as cfg
from kproxy.startup_log import Bound, lines


def block(settings: dict, **bound) -> dict[str, str]:
    c = cfg.build({"upstream": "kafka-0:9092,kafka-1:9092", **settings})
    found = lines(c, Bound(**{"bootstrap": c.listen, "admin": c.admin_listen, "probes": c.probe_listen,
                              "capture_active": False, **bound}))
    return {"head": found[0], **{line[2:19].strip(): line[19:] for line in found[1:]}}


@pytest.fixture
def pem_files(tmp_path, pki):
    """The test PKI's server certificate, key and CA under fixed names (config loading
    checks what TLS files hold)."""
    for name, source in (("cert.pem", pki.server.cert), ("key.pem", pki.server.key), ("ca.pem", pki.ca)):
        shutil.copyfile(source, tmp_path / name)
    return tmp_path


def test_a_gateway_behind_a_load_balancer_name():
    b = block({"listen": "0.0.0.0:9092", "advertised_host": "kafka.example.com", "probe_listen": "0.0.0.0:9645"})
    assert "gateway mode, routing a port per broker (ports), upstream kafka-0:9092,kafka-1:9092" in b["head"]
    assert b["kafka bootstrap"] == "0.0.0.0:9092 (clients told kafka.example.com:9092)"
    assert b["kafka brokers"].startswith("port 9093 + node id on 0.0.0.0, told kafka.example.com")
    assert b["admin"].startswith("http://127.0.0.1:9644 (") and b["admin"].endswith(
        "no admin token (capture control and live data refused)")
    assert b["probes"] == "http://0.0.0.0:9645 (/healthz, /readyz)"
    assert b["TLS"] == "clients off; brokers off"
    assert b["capture"] == "off; cannot be started (no capture_root)"


def test_ports_the_os_picks_are_shown_as_bound():
    b = block({"listen": "127.0.0.1:0", "broker_port_base": 0, "admin_listen": "127.0.0.1:0"},
              bootstrap=("127.0.0.1", 40001), admin=("127.0.0.1", 40002))
    assert b["kafka bootstrap"] == "127.0.0.1:40001 (clients told 127.0.0.1:40001)"
    assert b["kafka brokers"].startswith("a port the OS picks per node")
    assert b["admin"].startswith("http://127.0.0.1:40002 (")


def test_a_port_map_and_ipv6():
    b = block({"listen": "[::1]:9092", "broker_port_rule": "map", "broker_port_map": "1=9201,0=9200",
               "admin_listen": "off"})
    assert b["kafka bootstrap"] == "[::1]:9092 (clients told [::1]:9092)"
    assert b["kafka brokers"].startswith("ports by node 0=9200, 1=9201")
    assert b["admin"] == "off (admin_listen)"


def test_a_sidecar():
    b = block({"mode": "sidecar", "listen": "0.0.0.0:9093", "broker_port_rule": "fixed",
               "advertised_host_template": "kafka-{node_id}.kafka.svc"})
    assert "sidecar mode, routing ports (fixed rule)" in b["head"]
    assert b["kafka brokers"].startswith("advertised as kafka-{node_id}.kafka.svc at port 9093 (the listen port)")
    assert "serves its own broker (kafka-0:9092)" in b["kafka brokers"]


def test_sni_routing_tls_on_both_sides_token_and_capture(pem_files):
    d = pem_files
    b = block({"listen": "0.0.0.0:9092", "routing": "sni", "sni_host_template": "b-{node_id}.kafka.example.com",
               "sni_bootstrap_host": "bootstrap.kafka.example.com", "admin_token": "t" * 32,
               "tls_server": {"cert_file": str(d / "cert.pem"), "key_file": str(d / "key.pem"),
                              "client_ca_file": str(d / "ca.pem")},
               "tls_client": {"ca_file": str(d / "ca.pem")},
               "capture": {"directory": str(d / "captures"), "formats": ["parquet"]}})
    assert "routing by TLS server name (sni)" in b["head"]
    assert b["kafka bootstrap"] == "0.0.0.0:9092 (clients told bootstrap.kafka.example.com:9092)"
    assert b["kafka brokers"] == ("by TLS server name on port 9092: b-{node_id}.kafka.example.com "
                                  "(bootstrap name bootstrap.kafka.example.com)")
    assert b["TLS"] == (f"clients on (certificate {d / 'cert.pem'}; client certificates required, CA "
                        f"{d / 'ca.pem'}); brokers on (CA {d / 'ca.pem'}); files re-read when they "
                        f"change and on SIGHUP")
    assert b["admin"].endswith("admin token set")
    assert b["capture"] == f"off; POST /capture/start on the admin listener writes under {d / 'captures'}"


def test_a_capture_started_at_start(tmp_path):
    b = block({"capture": {"directory": str(tmp_path), "formats": ["jsonl", "parquet"]},
               "capture_autostart": True}, capture_active=True)
    assert b["capture"] == f"on (capture_autostart) into {tmp_path}, formats jsonl,parquet"


def test_a_policy_file(tmp_path):
    assert block({})["policy"] == "off"
    rules = tmp_path / "policy.toml"
    rules.write_text('[rules.acks]\ncheck = "acks_all"\nenforce = true\n\n[rules.named]\ncheck = "client_id"\n')
    assert block({"policy_file": str(rules)})["policy"] == (
        f"2 rules from {rules}; enforced: acks (the rest a dry run)")
