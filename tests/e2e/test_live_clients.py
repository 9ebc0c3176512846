"""Live capture: real clients → kproxy's relay → Apache Kafka, every frame decoded.

The offline twin of ``tests/protocol/test_golden.py``: the same client runs as
``tools/capture_golden.py`` (create topics, produce a few messages with every
compression codec, consume them in a group, describe the cluster), captured
here and now through the relay and checked with the same assertions. A new
client or broker release that sends something the codec cannot decode, or
re-encode byte for byte, fails here before it reaches the golden files.

Brokers: 4.4.0 for librdkafka, kafka-python (negotiated and pinned to 2.5)
and aiokafka; 3.9.2 for kafka-python pinned to 0.10.0 and 0.9, which produce
legacy magic 1 / magic 0 message sets that the broker converts, and serves
back down-converted. The session ``kafka_cluster`` advertises its own
address, so clients would bypass a relay after their first Metadata; this
module starts its own nodes that advertise the relay (one KRaft start each,
~5-10 s) and shares them between tests.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from kproxy.embedded import KAFKA_3_VERSION, KAFKA_4_VERSION, LIGHT_BROKER_JVM_ARGS, KafkaCluster
from tests.protocol.golden import (BROKER_RANGES, PRODUCE, api_versions_ranges, check_addresses, check_client_ids,
                                   check_produce_topics, check_records, check_unanswered, decode_pairs)

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.capture_golden import (CODECS, LEGACY_CODECS, ProxiedBroker,  # noqa: E402
                                  Scenario, capture, run_aiokafka, run_kafka_python,
                                  run_librdkafka, scenarios)

pytestmark = [
    pytest.mark.broker,
    pytest.mark.timeout(240),
    # kafka-python's bundled schemas use importlib.resources' legacy API.
    pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning"),
]

_MAGIC0_CODECS = next(s.codecs for s in scenarios() if s.magic == 0)   # lz4 needs xxhash

SCENARIOS = {
    "librdkafka": dict(broker_version=KAFKA_4_VERSION, client="librdkafka", run=run_librdkafka),
    "kafka-python": dict(broker_version=KAFKA_4_VERSION, client="kafka-python",
                         run=run_kafka_python),
    "kafka-python-api2.5": dict(broker_version=KAFKA_4_VERSION, client="kafka-python",
                                run=run_kafka_python, options={"api_version": (2, 5)}),
    "aiokafka": dict(broker_version=KAFKA_4_VERSION, client="aiokafka", run=run_aiokafka),
    "kafka-python-magic1": dict(broker_version=KAFKA_3_VERSION, client="kafka-python",
                                run=run_kafka_python, codecs=LEGACY_CODECS, magic=1,
                                headers=False, options={"api_version": (0, 10, 0)}),
    "kafka-python-magic0": dict(broker_version=KAFKA_3_VERSION, client="kafka-python",
                                run=run_kafka_python, codecs=_MAGIC0_CODECS, magic=0,
                                headers=False, options={"api_version": (0, 9)}),
}


@pytest.fixture(scope="module")
def proxied_broker(require_kafka) -> Iterator:
    """``proxied_broker(version)``: a node of that version behind the relay, started once
    (its own: it advertises the relay, which forwards bytes unchanged)."""
    started: dict[str, ProxiedBroker] = {}

    def get(version: str) -> ProxiedBroker:
        if version not in started:
            require_kafka(version)
            broker = ProxiedBroker(version, partial(KafkaCluster, jvm_args=LIGHT_BROKER_JVM_ARGS))
            broker.__enter__()
            started[version] = broker
        return started[version]

    yield get
    for broker in started.values():
        broker.__exit__(None, None, None)


@pytest.mark.parametrize("name", SCENARIOS)
def test_live_client_frames_decode_and_records_match(proxied_broker, name):
    scenario = Scenario(f"{name}-live", **SCENARIOS[name])
    broker = proxied_broker(scenario.broker_version)
    header, pairs = capture(broker, scenario)             # raises if the relay saw a bad frame

    decoded = decode_pairs(pairs)                         # nothing opaque, byte-identical
    check_unanswered(decoded)
    assert check_addresses(header, decoded) > 0           # Metadata lists the relay
    check_client_ids(header, decoded)
    check_produce_topics(header, decoded)
    stats = check_records(header, decoded)                # records == messages sent, per codec
    magic = scenario.magic
    assert stats[f"produce magic {magic}"].keys() == set(scenario.codecs)
    assert stats[f"fetch magic {magic}"].keys() == set(scenario.codecs)
    if magic == 2:
        assert set(scenario.codecs) == set(CODECS)

    for reported in api_versions_ranges(decoded):
        for key, expected in BROKER_RANGES[scenario.broker_version].items():
            assert reported[key] == expected
    assert any(d.api_key == PRODUCE for d in decoded)
