"""Golden frames from real clients and real brokers, decoded offline.

``tests/data/golden/*.jsonl.gz`` hold every request/response pair that Kafka's
Java tools, librdkafka, kafka-python and aiokafka exchanged with Apache Kafka
4.4.0 and 3.9.2 through kproxy's relay (see the README there, and
``tools/capture_golden.py`` to regenerate). Here, with no broker:

* every frame decodes (nothing opaque), against its request's key and version
  for responses, and re-encodes to the same bytes;
* the decoded values mean what the capture says they mean (advertised broker
  address, the broker's version ranges, client ids, topics);
* the records in Produce requests and Fetch responses are exactly the messages
  the header line says were sent, with the codec and magic used.

``decode_pairs`` and the ``check_*`` helpers are in ``tests/protocol/golden.py``, since
``tests/e2e/test_live_clients.py`` uses them on live captures too.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

from kproxy.protocol import DecodeError, api_name, is_known
from kproxy.protocol.records import iter_batches
from tests.protocol.golden import (API_VERSIONS, BROKER_RANGES, CREATE_TOPICS, FETCH, FIND_COORDINATOR, METADATA,
                                   PRODUCE, Decoded, api_versions_ranges, check_addresses, check_client_ids,
                                   check_produce_topics, check_records, check_unanswered, collect_records,
                                   decode_pairs)

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "data" / "golden"
GOLDEN_FILES = sorted(GOLDEN_DIR.glob("*.jsonl.gz"))

UNSUPPORTED_VERSION = 35


# The scenarios the capture tool writes; a missing file is a failure, not a skip.
EXPECTED_SCENARIOS = {
    "java-kafka4.4.0", "librdkafka-kafka4.4.0", "kafka-python-kafka4.4.0",
    "kafka-python-api2.5-kafka4.4.0", "aiokafka-kafka4.4.0",
    "java-kafka3.9.2", "librdkafka-kafka3.9.2",
    "kafka-python-magic1-kafka3.9.2", "kafka-python-magic0-kafka3.9.2",
    "probe-kafka3.9.2",
}
CODECS = {"none", "gzip", "snappy", "lz4", "zstd"}


# --------------------------------------------------------------------------- helpers

@dataclass
class Capture:
    name: str
    header: dict
    pairs: list[dict]


def load_capture(path: Path) -> Capture:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    header, pairs = lines[0], lines[1:]
    assert header.get("kind") == "header", f"{path.name}: first line is not a header"
    return Capture(path.name.removesuffix(".jsonl.gz"), header, pairs)


# --------------------------------------------------------------------------- tests

@lru_cache(maxsize=None)
def _loaded(path: Path) -> tuple[Capture, list[Decoded]]:
    capture = load_capture(path)
    return capture, decode_pairs(capture.pairs)


def _ids(paths):
    return [p.name.removesuffix(".jsonl.gz") for p in paths]


def _with_records(path: Path) -> bool:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return bool(json.loads(f.readline())["topics"])


# Every capture; and those of clients that produced and consumed (not the probe).
golden = pytest.mark.parametrize("path", GOLDEN_FILES, ids=_ids(GOLDEN_FILES))
CLIENT_FILES = [p for p in GOLDEN_FILES if _with_records(p)]
golden_clients = pytest.mark.parametrize("path", CLIENT_FILES, ids=_ids(CLIENT_FILES))


def test_every_scenario_was_captured():
    assert {p.name.removesuffix(".jsonl.gz") for p in GOLDEN_FILES} >= EXPECTED_SCENARIOS


def test_golden_data_stays_small():
    total = sum(p.stat().st_size for p in GOLDEN_FILES)
    assert total < 400_000, f"golden captures take {total} bytes"


@golden
def test_header_describes_the_capture(path):
    capture = load_capture(path)
    h = capture.header
    assert h["scenario"] == capture.name
    assert capture.name.startswith(h["client"] + "-")
    assert h["broker_version"] in BROKER_RANGES
    assert h["pairs"] == len(capture.pairs)
    if h["client"] == "probe":              # hand-written ApiVersions requests, no records
        assert not h["topics"]
        return
    assert h["topics"] and all(t["codec"] in CODECS and t["messages"] for t in h["topics"])
    codecs = {t["codec"] for t in h["topics"]}
    if h["topics"][0]["magic"] == 2:
        assert codecs == CODECS
    else:                                   # magic 0/1 have no zstd
        assert codecs == CODECS - {"zstd"}


@golden
def test_every_frame_decodes_and_round_trips(path):
    capture, decoded = _loaded(path)
    assert len(decoded) == len(capture.pairs) > (1 if capture.header["client"] == "probe" else 10)
    assert any(d.response is not None for d in decoded)
    check_unanswered(decoded)


@golden_clients
def test_broker_addresses_are_the_advertised_relay(path):
    capture, decoded = _loaded(path)
    assert any(d.api_key == METADATA for d in decoded)
    assert check_addresses(capture.header, decoded) > 0


@golden
def test_api_versions_report_what_the_broker_supports(path):
    capture, decoded = _loaded(path)
    broker_ranges = BROKER_RANGES[capture.header["broker_version"]]
    ranges = api_versions_ranges(decoded)
    if not any(d.api_key == API_VERSIONS for d in decoded):
        pytest.skip("this client never asked (it was told the broker version)")
    assert ranges, "no successful ApiVersions response"
    for reported in ranges:
        for key, expected in broker_ranges.items():
            assert reported[key] == expected, f"{api_name(key)}: {reported[key]} != {expected}"
        # Every advertised API the codec knows at its max version (newer ones would be opaque).
        unknown = {k: r for k, r in reported.items() if not is_known(k, r[1])}
        assert not unknown, f"advertised but not decodable: {unknown}"


@golden
def test_unsupported_api_versions_answers_decode_as_v0(path):
    # Clients that ask with a newer ApiVersions than the broker knows get error 35 at v0.
    _, decoded = _loaded(path)
    for d in decoded:
        if d.api_key == API_VERSIONS and d.response is not None and d.response.body.error_code:
            assert d.response.body.error_code == UNSUPPORTED_VERSION
            assert d.response.body_version == 0
            assert d.response.header_version == 0


def test_api_versions_fallback_from_a_real_broker():
    """ApiVersions v5 to 3.9.2: error 35, header v0, v0 body listing only ApiVersions' range."""
    capture, decoded = _loaded(GOLDEN_DIR / "probe-kafka3.9.2.jsonl.gz")
    first, second = decoded
    assert (first.api_version, second.api_version) == (5, 4)
    assert first.request.body.client_software_name == "kproxy-golden-probe"
    assert first.request.body.node_id == -1 and first.request.body.cluster_id is None
    body = first.response.body
    assert (body.error_code, first.response.body_version, first.response.header_version) == \
        (UNSUPPORTED_VERSION, 0, 0)
    assert [(k.api_key, k.min_version, k.max_version) for k in body.api_keys] == \
        [(API_VERSIONS, *BROKER_RANGES["3.9.2"][API_VERSIONS])]
    assert second.response.body.error_code == 0
    assert second.response.body_version == 4 and second.response.header_version == 0
    assert api_versions_ranges(decoded)[0][PRODUCE] == BROKER_RANGES["3.9.2"][PRODUCE]


@golden
def test_client_ids_are_the_clients_names(path):
    capture, decoded = _loaded(path)
    check_client_ids(capture.header, decoded)


@golden_clients
def test_produce_requests_name_the_topics_produced_to(path):
    capture, decoded = _loaded(path)
    check_produce_topics(capture.header, decoded)


@golden_clients
def test_records_are_the_messages_sent(path):
    capture, decoded = _loaded(path)
    stats = check_records(capture.header, decoded)
    magic = capture.header["topics"][0]["magic"]
    assert stats[f"produce magic {magic}"]


def test_legacy_magic_0_and_1_were_captured():
    magics = set()
    for path in GOLDEN_FILES:
        capture, decoded = _loaded(path)
        for records in collect_records(decoded).values():
            magics.update((kind, b.magic, b.compression)
                          for kind, batches in (("produce", records.produce_batches),
                                                ("fetch", records.fetch_batches))
                          for _, b in batches)
    for magic in (0, 1):
        for codec in ("none", "gzip", "snappy"):
            assert ("produce", magic, codec) in magics
            assert ("fetch", magic, codec) in magics
    assert ("produce", 1, "lz4") in magics


def test_api_coverage():
    """The captures exercise the APIs a proxy sees most, at old and new versions."""
    seen = defaultdict(set)
    for path in GOLDEN_FILES:
        _, decoded = _loaded(path)
        for d in decoded:
            seen[d.api_key].add(d.api_version)
    for key in (PRODUCE, FETCH, METADATA, API_VERSIONS, FIND_COORDINATOR, CREATE_TOPICS,
                2, 8, 9, 11, 12, 13, 14, 15, 16, 22, 32, 60, 68, 69, 75):   # noqa: E501 - api keys
        assert seen.get(key), f"{api_name(key)} never captured"
    assert {1, 2, 13}.issubset(seen[PRODUCE])
    assert {1, 2, 18}.issubset(seen[FETCH])


def test_a_corrupted_record_is_caught():
    """The record checks are not vacuous: one flipped byte in a batch fails its CRC."""
    _, decoded = _loaded(GOLDEN_DIR / "librdkafka-kafka4.4.0.jsonl.gz")
    produce = next(d for d in decoded if d.api_key == PRODUCE)
    records = bytes(produce.request.body.topic_data[0].partition_data[0].records)
    batch = next(iter(iter_batches(records)))
    batch.verify_crc()
    corrupted = bytearray(records)
    corrupted[-3] ^= 0x01
    with pytest.raises(DecodeError, match="CRC"):
        next(iter(iter_batches(bytes(corrupted)))).verify_crc()
