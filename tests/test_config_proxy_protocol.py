"""The PROXY protocol settings: from file, env and flags, parsed once into typed values."""

import ipaddress

import pytest

from kproxy import cli
from kproxy import config as cfg


def test_off_by_default_and_trusting_this_host_only():
    c = cfg.build({"upstream": "h:1"})
    assert c.proxy_protocol == "off" and c.proxy_protocol_versions == frozenset()
    assert c.proxy_protocol_trusted_cidrs == (ipaddress.ip_network("127.0.0.0/8"),
                                              ipaddress.ip_network("::1/128"))


@pytest.mark.parametrize("value,versions", [("v1", {1}), ("v2", {2}), ("any", {1, 2}), ("V2", {2}),
                                            ("off", set()), (False, set())])
def test_versions(value, versions):
    assert cfg.build({"upstream": "h:1", "proxy_protocol": value}).proxy_protocol_versions == versions


def test_env_and_file(tmp_path):
    f = tmp_path / "kproxy.yaml"
    f.write_text("upstream: h:1\nproxy_protocol: v1\nproxy_protocol_trusted_cidrs: [10.0.0.0/8, 192.0.2.7]\n")
    c = cfg.load(f, environ={})
    assert c.proxy_protocol == "v1"
    assert c.proxy_protocol_trusted_cidrs == (ipaddress.ip_network("10.0.0.0/8"),
                                              ipaddress.ip_network("192.0.2.7/32"))
    c = cfg.load(f, environ={"KPROXY_PROXY_PROTOCOL": "v2",
                             "KPROXY_PROXY_PROTOCOL_TRUSTED_CIDRS": "10.1.0.0/16, 2001:db8::/32"})
    assert c.proxy_protocol == "v2"
    assert c.proxy_protocol_trusted_cidrs == (ipaddress.ip_network("10.1.0.0/16"),
                                              ipaddress.ip_network("2001:db8::/32"))
    toml = tmp_path / "kproxy.toml"
    toml.write_text('upstream = "h:1"\nproxy_protocol = "off"\n')   # YAML's bare off is a boolean; TOML's a string
    assert cfg.load(toml, environ={}).proxy_protocol == "off"


def test_flags_reach_the_config(monkeypatch):
    seen = {}

    def load(path, overrides):
        seen.update(overrides)
        raise cfg.ConfigError("stop here")
    monkeypatch.setattr(cfg, "load", load)
    assert cli.main(["run", "--upstream", "h:1", "--proxy-protocol", "v2",
                     "--proxy-protocol-trusted-cidrs", "10.0.0.0/8"]) == 2
    assert seen["proxy_protocol"] == "v2" and seen["proxy_protocol_trusted_cidrs"] == "10.0.0.0/8"
    assert cfg.build(seen).proxy_protocol_trusted_cidrs == (ipaddress.ip_network("10.0.0.0/8"),)


@pytest.mark.parametrize("settings,message", [
    ({"proxy_protocol": "v3"}, "proxy_protocol: must be one of off, v1, v2, any, got 'v3'"),
    ({"proxy_protocol": "v2", "proxy_protocol_trusted_cidrs": "10.0.0.1/8"},
     "proxy_protocol_trusted_cidrs: 10.0.0.1/8 has host bits set"),
    ({"proxy_protocol": "v2", "proxy_protocol_trusted_cidrs": "lb.example.com"},
     "proxy_protocol_trusted_cidrs: 'lb.example.com' does not appear to be an IPv4 or IPv6 network"),
    ({"proxy_protocol": "v2", "proxy_protocol_trusted_cidrs": " , "},
     "proxy_protocol_trusted_cidrs: empty, so every connection would be refused"),
    ({"proxy_protocol_trusted_cidrs": "10.0.0.0/8"},
     "proxy_protocol_trusted_cidrs: only used with proxy_protocol = v1, v2 or any"),
    ({"proxy_protocol": "v2", "proxy_protocol_trusted_cidrs": 10}, "proxy_protocol_trusted_cidrs: expected a list"),
])
def test_bad_settings_name_the_key(settings, message):
    with pytest.raises(cfg.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        cfg.build({"upstream": "h:1", **settings})
