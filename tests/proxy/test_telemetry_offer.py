"""The telemetry offer's rules without a broker: its settings, the librdkafka deny list."""

from __future__ import annotations

import pytest

from kproxy import config
from kproxy.protocol.client_software import ClientSoftware
from kproxy.proxy.telemetry_offer import TelemetryOffer, denied


@pytest.mark.parametrize("name,version,refused", [
    ("librdkafka", "2.5.0", True), ("librdkafka", "2.5.2", True), ("librdkafka", "2.5.3", False),
    ("librdkafka", "2.4.0", False), ("confluent-kafka-python", "2.5.0-rdkafka-2.5.0", True),
    ("confluent-kafka-python", "2.16.1-rdkafka-2.16.0", False), ("apache-kafka-java", "2.5.1", False),
])
def test_only_librdkafka_2_5_0_to_2_5_2_is_denied(name, version, refused):
    assert denied(ClientSoftware(name, version)) is refused


def test_settings_from_a_table_env_json_and_their_refusals(monkeypatch):
    assert config.build({"upstream": "127.0.0.1:9092"}).telemetry_offer == TelemetryOffer()
    assert not TelemetryOffer().enabled                       # off by default
    monkeypatch.setenv("KPROXY_TELEMETRY_OFFER", '{"enabled": true, "metrics": "a.,b.", "push_interval_ms": 1000}')
    offer = config.load(overrides={"upstream": "127.0.0.1:9092"}).telemetry_offer
    assert (offer.enabled, offer.metrics, offer.push_interval_ms, offer.clients) == (True, ("a.", "b."), 1000, ("*",))
    for table, message in (({"push_interval_ms": 5}, "push_interval_ms"), ({"enabld": True}, "unknown setting"),
                           ({"clients": [1]}, "clients"), ({"enabled": "yes"}, "enabled")):
        with pytest.raises(config.ConfigError, match=message):
            config.build({"upstream": "127.0.0.1:9092", "telemetry_offer": table})
    assert TelemetryOffer(metrics=("a.",)).subscription_id != TelemetryOffer(metrics=("b.",)).subscription_id
