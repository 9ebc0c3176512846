"""Configuration: precedence, file formats, and one clear line per bad key."""

import socket
import subprocess
import sys

import pytest

from kproxy import config as cfg


def test_flags_beat_env_beat_file(tmp_path):
    f = tmp_path / "kproxy.toml"
    f.write_text('upstream = "file:9092"\nlisten = "0.0.0.0:9092"\nmax_connections = 5\n')
    c = cfg.load(f, environ={"KPROXY_MAX_CONNECTIONS": "7", "KPROXY_LISTEN": "127.0.0.1:19092"},
                 overrides={"listen": "127.0.0.1:29092"})
    assert c.upstreams == (("file", 9092),)
    assert c.max_connections == 7                 # env over file
    assert c.listen == ("127.0.0.1", 29092)       # flag over env
    assert c.port_base == 29093                   # default: listen port + 1


def test_yaml_file_with_sidecar_template(tmp_path):
    f = tmp_path / "kproxy.yaml"
    f.write_text("upstream: [localhost:9092]\nmode: sidecar\nbroker_port_rule: fixed\n"
                 "advertised_host_template: 'kafka-{node_id}.kproxy.svc'\ncap_api_versions: false\n")
    c = cfg.load(f, environ={})
    assert c.mode == "sidecar" and not c.cap_api_versions
    assert c.advertised_host_template.format(node_id=3, host="x") == "kafka-3.kproxy.svc"


@pytest.mark.parametrize("settings,message", [
    ({}, "upstream: required"),
    ({"upstream": "nohost"}, "upstream: expected HOST:PORT"),
    ({"upstream": "h:99999"}, "upstream: port must be 0-65535"),
    ({"upstream": "h:1", "mode": "mesh"}, "mode: must be one of gateway, sidecar"),
    ({"upstream": "h:1", "max_connections": "lots"}, "max_connections: expected int"),
    ({"upstream": "h:1", "max_frame_size": 0}, "max_frame_size: must be positive"),
    ({"upstream": "h:1", "broker_port_rule": "map"}, "broker_port_map: required"),
    ({"upstream": "h:1", "mode": "sidecar", "broker_port_rule": "sequential"}, "broker_port_rule: 'sequential'"),
    ({"upstream": "h:1", "advertised_host_template": "{pod}"}, "advertised_host_template"),
    ({"upstream": "h:1", "listen": "127.0.0.1:0"}, "broker_port_base: required"),
    ({"upstream": "h:1", "cap_api_versions": "maybe"}, "cap_api_versions: expected true or false"),
    ({"upstream": "h:1", "colour": "blue"}, "colour: unknown setting"),
    ({"upstream": "h:1", "instance_name": " "}, "instance_name: must not be empty"),
    ({"upstream": "h:1", "tls_server": {"cert_file": "/nope.pem", "key_file": "/nope.key"}},
     "tls_server.cert_file: no such file"),
    ({"upstream": "h:1", "audit": {"path": "/a.jsonl", "rotate_bytes": 10}}, "audit.rotate_bytes: at least"),
    ({"upstream": "h:1", "audit": {"path": "/a.jsonl", "keep": "some"}}, "audit.keep: expected a whole number"),
    ({"upstream": "h:1", "audit": {"file": "/a.jsonl"}}, "audit.file: unknown setting"),
    ({"upstream": "h:1", "audit": {"path": "/a.jsonl"}, "audit_file": "/b.jsonl"}, "audit_file: set it or"),
    ({"upstream": "h:1", "audit_file": " "}, "audit_file: expected a file path"),
])
def test_bad_settings_name_the_key(settings, message):
    with pytest.raises(cfg.ConfigError, match=message.replace("(", r"\(")):
        cfg.build(settings)


def test_audit_from_file_env_and_flag(tmp_path):
    path = tmp_path / "kproxy.toml"
    path.write_text('upstream = "h:1"\n[audit]\npath = "/var/log/kproxy/audit.jsonl"\nrotate_bytes = 1048576\n'
                    'keep = 5\nlog = false\n')
    audit = cfg.load(path, environ={}).audit
    assert (audit.path, audit.rotate_bytes, audit.keep, audit.log) == ("/var/log/kproxy/audit.jsonl", 1048576, 5, False)
    env = cfg.load(environ={"KPROXY_UPSTREAM": "h:1", "KPROXY_AUDIT_FILE": "/tmp/a.jsonl"}).audit
    assert (env.path, env.rotate_bytes, env.log) == ("/tmp/a.jsonl", 64 * 1024 * 1024, True)
    flag = cfg.load(environ={"KPROXY_UPSTREAM": "h:1"}, overrides={"audit_file": "/tmp/f.jsonl"}).audit
    assert flag.path == "/tmp/f.jsonl"
    default = cfg.load(environ={"KPROXY_UPSTREAM": "h:1"}).audit
    assert default.path is None and default.log and default.enabled


def test_cli_prints_one_line_and_exits_2(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('upstream = "h:1"\nidle_timeout = -3\n')
    result = subprocess.run([sys.executable, "-m", "kproxy", "run", "--config", str(bad)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["kproxy: config error: idle_timeout: must not be negative, got -3.0"]


def test_instance_name_defaults_to_the_host_name_and_reaches_capture():
    from kproxy.cli import RUN_FLAGS
    from kproxy.runtime import Runtime

    assert cfg.build({"upstream": "h:1"}).instance_name == socket.gethostname()
    c = cfg.load(environ={"KPROXY_UPSTREAM": "h:1", "KPROXY_INSTANCE_NAME": "sidecar-from-env"})
    assert c.instance_name == "sidecar-from-env"
    c = cfg.load(environ={"KPROXY_UPSTREAM": "h:1", "KPROXY_INSTANCE_NAME": "sidecar-from-env"},
                 overrides={"instance_name": "sidecar-from-flag"})
    assert c.instance_name == "sidecar-from-flag"
    assert RUN_FLAGS["--instance-name"][0] == "instance_name"
    assert Runtime(c).capture.instance_name == "sidecar-from-flag"
