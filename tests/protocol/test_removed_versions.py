"""The request versions Kafka 4.0 removed (KIP-896), as the generated schema knows them.

Each spot check below was verified against the message definitions in the
kafka-clients 3.9.2 and 4.4.0 jars (and 4.0.0 where the text says so);
tests/test_generated_schema.py recomputes the whole table from the jars.
"""

import pytest

from kproxy.protocol import API_KEYS, is_known, is_removed, removed_versions
from kproxy.protocol.schema import REMOVED_VERSIONS


@pytest.mark.parametrize("api, removed", [
    ("Produce", (0, 2)),            # 3.9.2: 0-11, 4.4.0: 3-13
    ("Fetch", (0, 3)),              # 0-17 -> 4-18
    ("ListOffsets", (0, 0)),        # 0-9 -> 1-11
    ("OffsetCommit", (0, 1)),       # 0-9 -> 2-10
    ("OffsetFetch", (0, 0)),        # 0-9 -> 1-10
    ("CreateTopics", (0, 1)),       # 0-7 -> 2-7
    ("DescribeConfigs", (0, 0)),    # 0-4 -> 1-4
    ("LeaderAndIsr", (0, 7)),       # ZooKeeper-only: 4.4.0 defines no versions at all
    ("ControlledShutdown", (0, 3)),
])
def test_versions_kafka_4_removed(api, removed):
    api_key = API_KEYS[api]
    assert removed_versions(api_key) == removed
    lo, hi = removed
    assert is_removed(api_key, lo) and is_removed(api_key, hi)
    assert not is_removed(api_key, hi + 1)


@pytest.mark.parametrize("api, version", [
    ("ApiVersions", 0),     # never removed: clients need it before they know what the broker speaks
    ("Metadata", 0),        # KIP-896's draft listed Metadata 0-3; Kafka 4.0 shipped keeping 0-13
    ("JoinGroup", 0),       # 4.0.0 dropped 0-1, 4.0.1 restored them (KAFKA-19444); 4.4.0 has 0-9
    ("ShareGroupHeartbeat", 0),  # v0 was early access (unstable in 3.9), never a released version
    ("Produce", 3),         # the new baseline
])
def test_versions_kafka_4_kept(api, version):
    api_key = API_KEYS[api]
    assert not is_removed(api_key, version)
    if api != "Produce":
        assert removed_versions(api_key) is None


def test_unknown_api_key_has_nothing_removed():
    assert removed_versions(9999) is None
    assert not is_removed(9999, 0)


def test_removed_versions_are_still_decoded():
    # kproxy must keep decoding what old clients send, or it could not count them.
    for api_key, (lo, hi) in REMOVED_VERSIONS.items():
        for version in range(lo, hi + 1):
            assert is_known(api_key, version), (api_key, version)
