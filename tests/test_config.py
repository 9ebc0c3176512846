"""Configuration: precedence, file formats, and one clear line per bad key."""

import re
import socket
import subprocess
import sys
from pathlib import Path

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
    ({"upstream": "h:1", "capture": {"directory": "/tmp/c", "filter": {"client_id_regex": "(a)\\1"}}},
     "capture.filter.client_id_regex: invalid escape sequence"),
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
    assert result.stderr.strip().splitlines() == ["kproxy run: error: idle_timeout: must not be negative, got -3.0"]


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


# ---------------------------------------------------------------- what clients are told

@pytest.mark.parametrize("settings, message", [
    ({"listen": "0.0.0.0:9092"}, "advertised_host: listen is 0.0.0.0, which clients cannot connect to; "
                                 "set advertised_host (--advertised-host, KPROXY_ADVERTISED_HOST)"),
    ({"listen": "[::]:9092"}, "advertised_host: listen is ::,"),
    ({"listen": ":::9092"}, "advertised_host: listen is ::,"),
    ({"listen": "0.0.0.0:9092", "advertised_host": "0.0.0.0"}, "advertised_host: '0.0.0.0' is not an address"),
    ({"advertised_host": "[::]"}, "advertised_host: '[::]' is not an address"),
    ({"mode": "sidecar", "broker_port_rule": "fixed", "advertised_host_template": "0.0.0.0"},
     "advertised_host_template: '0.0.0.0' advertises 0.0.0.0"),
    ({"mode": "sidecar", "broker_port_rule": "fixed", "advertised_host_template": "::"},
     "advertised_host_template: '::' advertises ::"),
])
def test_a_wildcard_address_is_never_what_clients_are_told(settings, message):
    with pytest.raises(cfg.ConfigError, match=re.escape(message)):
        cfg.build({"upstream": "broker:9092", **settings})


@pytest.mark.parametrize("settings, told", [
    ({"listen": "0.0.0.0:9092", "advertised_host": "kafka.example.com"}, "kafka.example.com"),
    ({"listen": "[::]:9092", "advertised_host": "10.1.2.3"}, "10.1.2.3"),
    ({"listen": "127.0.0.1:9092"}, "127.0.0.1"),                    # the listen host, as before
])
def test_a_gateway_tells_clients_its_advertised_host(settings, told):
    assert cfg.build({"upstream": "broker:9092", **settings}).public_host == told


def test_a_sidecar_may_bind_every_interface_and_advertise_by_template():
    c = cfg.build({"upstream": "127.0.0.1:9092", "mode": "sidecar", "listen": "0.0.0.0:9093",
                   "broker_port_rule": "fixed", "advertised_host_template": "kafka-{node_id}.kafka.svc"})
    assert c.listen == ("0.0.0.0", 9093)
    assert c.advertised_host_template.format(node_id=2, host="x") == "kafka-2.kafka.svc"


# ---------------------------------------------------------------- one port, one listener

@pytest.mark.parametrize("settings, message", [
    ({"admin_listen": "127.0.0.1:9092"}, "admin_listen: 127.0.0.1:9092 overlaps listen (127.0.0.1:9092)"),
    ({"listen": "0.0.0.0:7000", "advertised_host": "k", "admin_listen": "127.0.0.1:7000"},
     "admin_listen: 127.0.0.1:7000 overlaps listen (0.0.0.0:7000)"),
    ({"probe_listen": "0.0.0.0:9644"}, "probe_listen: 0.0.0.0:9644 overlaps admin_listen (127.0.0.1:9644)"),
    ({"listen": "[::]:7000", "advertised_host": "k", "probe_listen": "127.0.0.1:7000"},
     "probe_listen: 127.0.0.1:7000 overlaps listen ([::]:7000)"),
    ({"broker_port_rule": "map", "broker_port_map": "1=9644,2=9102"},
     "broker_port_map (node 1): 127.0.0.1:9644 overlaps admin_listen (127.0.0.1:9644)"),
    ({"broker_port_rule": "map", "broker_port_map": "1=9101,2=9101"},
     "broker_port_map (node 2): 127.0.0.1:9101 overlaps broker_port_map (node 1)"),
])
def test_two_listeners_on_one_port_are_a_config_error(settings, message):
    with pytest.raises(cfg.ConfigError, match=re.escape(message)):
        cfg.build({"upstream": "broker:9092", **settings})


@pytest.mark.parametrize("settings", [
    {"listen": "127.0.0.1:0", "broker_port_base": 0, "admin_listen": "127.0.0.1:0", "probe_listen": "127.0.0.1:0"},
    {"listen": "127.0.0.1:7000", "admin_listen": "127.0.0.2:7000"},           # two addresses, one port each
    {"admin_listen": "off", "probe_listen": "127.0.0.1:9644"},                 # the admin port is not bound
])
def test_listeners_that_do_not_share_a_port_are_fine(settings):
    cfg.build({"upstream": "broker:9092", **settings})


# ---------------------------------------------------------------- misspellings and syntax errors

@pytest.mark.parametrize("settings, message", [
    ({"upstream": "h:1", "max_conections": 3}, "max_conections: unknown setting (did you mean max_connections?)"),
    ({"upstream": "h:1", "tls_client": {"ca_fle": "x"}}, "tls_client.ca_fle: unknown setting (did you mean ca_file?)"),
    ({"upstream": "h:1", "capture": {"directory": "/tmp/c", "formts": "jsonl"}},
     "capture.formts: unknown setting (did you mean formats?)"),
    ({"upstream": "h:1", "capture": {"directory": "/tmp/c", "filter": {"topic": ["t"]}}},
     "capture.filter.topic: unknown setting (did you mean topics?)"),
])
def test_a_misspelt_key_gets_a_suggestion(settings, message):
    with pytest.raises(cfg.ConfigError, match="^" + re.escape(message) + "$"):
        cfg.build(settings)


def test_a_key_like_no_setting_gets_no_suggestion():
    with pytest.raises(cfg.ConfigError, match=r"^colour: unknown setting$"):
        cfg.build({"upstream": "h:1", "colour": "blue"})


def test_a_misspelt_key_in_the_file_names_the_file(tmp_path):
    f = tmp_path / "kproxy.yaml"
    f.write_text("upstream: h:1\nadvertized_host: kafka.example.com\n")
    with pytest.raises(cfg.ConfigError) as error:
        cfg.load(f, environ={})
    assert str(error.value) == f"config file {f}: advertized_host: unknown setting (did you mean advertised_host?)"


@pytest.mark.parametrize("name, text, where", [
    ("kproxy.yaml", "upstream: h:1\nlisten: [127.0.0.1:9092\nmode: gateway\n", ", line 3, column "),
    ("kproxy.yml", "upstream: h:1\n\tmode: gateway\n", ", line 2, column 1"),
    ("kproxy.toml", 'upstream = "h:1"\nmode = gateway\n', "(at line 2, column 8)"),
])
def test_a_syntax_error_names_the_file_and_line(tmp_path, name, text, where):
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(cfg.ConfigError) as error:
        cfg.load(f, environ={})
    message = str(error.value)
    assert message.startswith(f"config file {f}") and where in message, message
    assert "<unicode string>" not in message


def test_unknown_kproxy_variables_get_a_warning_with_a_suggestion():
    environ = {"KPROXY_UPSTREM": "b:1", "KPROXY_LISTN": "x", "KPROXY_SOMETHING_ELSE": "1",
               "KPROXY_UPSTREAM": "b:1", "KPROXY_ADMIN_TOKEN": "t" * 32, "KPROXY_CACHE_DIR": "/tmp",
               "KPROXY_SKIP_BROKER_TESTS": "1", "OTHER_TOOL_UPSTREM": "x"}
    assert cfg.unknown_env(environ) == [
        "KPROXY_LISTN is not a kproxy setting and is ignored (did you mean KPROXY_LISTEN?)",
        "KPROXY_SOMETHING_ELSE is not a kproxy setting and is ignored",
        "KPROXY_UPSTREM is not a kproxy setting and is ignored (did you mean KPROXY_UPSTREAM?)",
    ]


# Where kproxy and its tests read a KPROXY_* variable by name (not a setting's, which
# config.from_env reads by prefix): environ[...], environ.get(...), getenv(...), *_ENV = "...".
ENV_READ = re.compile(r"""(?:environ(?:\.get)?\(\s*|environ\[\s*|getenv\(\s*|_ENV\s*=\s*)["'](KPROXY_[A-Z0-9_]+)["']""")


def test_every_kproxy_variable_read_by_name_is_a_setting_or_allowed():
    """So that no warning at start names a variable kproxy (or its test suite) uses."""
    root = Path(__file__).resolve().parents[1]
    read = {name for folder in ("kproxy", "tests", "benchmarks", "tools")
            for path in (root / folder).rglob("*.py") for name in ENV_READ.findall(path.read_text())}
    assert "KPROXY_CACHE_DIR" in read                       # the pattern finds what it should
    settings = {cfg.ENV_PREFIX + key.upper() for key in cfg.setting_names()}
    assert read - settings <= cfg.OTHER_ENV_VARS, read - settings - cfg.OTHER_ENV_VARS
