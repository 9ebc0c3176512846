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

The helpers (``load_capture``, ``decode_pairs``, ``check_*``) are also used by
``tests/e2e/test_live_clients.py`` on live captures.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pytest

from kproxy.protocol import (DecodeError, Request, Response, api_name, decode_request,
                             decode_response, encode_request, encode_response, is_known)
from kproxy.protocol.records import iter_batches

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "data" / "golden"
GOLDEN_FILES = sorted(GOLDEN_DIR.glob("*.jsonl.gz"))

PRODUCE, FETCH, METADATA, FIND_COORDINATOR, API_VERSIONS, CREATE_TOPICS = 0, 1, 3, 10, 18, 19
DESCRIBE_CLUSTER, DESCRIBE_TOPIC_PARTITIONS = 60, 75
UNSUPPORTED_VERSION = 35

# What each broker answered in ApiVersions, checked against the captures: 4.4.0
# still advertises Produce v0-2 although its message definitions (and KIP-896)
# start at v3; Fetch starts at v4 as KIP-896 says.
BROKER_RANGES = {
    "4.4.0": {PRODUCE: (0, 13), FETCH: (4, 18), METADATA: (0, 13), API_VERSIONS: (0, 5)},
    "3.9.2": {PRODUCE: (0, 11), FETCH: (0, 17), METADATA: (0, 12), API_VERSIONS: (0, 4)},
}

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


@dataclass
class Decoded:
    """One pair, decoded."""
    api_key: int
    api_version: int
    conn: int
    request_frame: bytes
    response_frame: bytes | None
    request: Request
    response: Response | None
    expects_response: bool = True


@dataclass
class RecordsSeen:
    """Records of one topic-partition, as they crossed the wire."""
    produced: list = field(default_factory=list)        # Record, in Produce order (accepted only)
    fetched: dict = field(default_factory=dict)         # offset -> Record
    produce_batches: list = field(default_factory=list)  # (api_version, RecordBatch)
    fetch_batches: list = field(default_factory=list)    # (api_version, RecordBatch)


def load_capture(path: Path) -> Capture:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    header, pairs = lines[0], lines[1:]
    assert header.get("kind") == "header", f"{path.name}: first line is not a header"
    return Capture(path.name.removesuffix(".jsonl.gz"), header, pairs)


def decode_pairs(pairs: list[dict]) -> list[Decoded]:
    """Decode every pair; fail on anything opaque, undecodable or not byte-identical."""
    decoded = []
    for i, pair in enumerate(pairs):
        key, version = pair["api_key"], pair["api_version"]
        where = f"pair {i} ({api_name(key)} v{version})"
        frame = bytes.fromhex(pair["request"])
        assert is_known(key, version), f"{where}: not in the schema"
        request = decode_request(frame)
        assert (request.api_key, request.api_version) == (key, version), where
        assert not request.is_opaque, f"{where}: request decoded as opaque"
        assert encode_request(request) == frame, f"{where}: request does not re-encode identically"
        response = response_frame = None
        if pair["response"] is not None:
            response_frame = bytes.fromhex(pair["response"])
            response = decode_response(response_frame, key, version)
            assert not response.is_opaque, f"{where}: response decoded as opaque"
            assert response.correlation_id == request.correlation_id, where
            assert encode_response(response, key, version) == response_frame, \
                f"{where}: response does not re-encode identically"
        decoded.append(Decoded(key, version, pair.get("conn", 0), frame, response_frame, request,
                               response, pair.get("expects_response", True)))
    return decoded


def topic_ids(decoded: list[Decoded]) -> dict[bytes, str]:
    """Topic id -> name, from every response that pairs them."""
    ids: dict[bytes, str] = {}
    for d in decoded:
        if d.response is None or d.api_key not in (METADATA, CREATE_TOPICS, DESCRIBE_TOPIC_PARTITIONS):
            continue
        for topic in d.response.body.topics:
            topic_id, name = getattr(topic, "topic_id", None), getattr(topic, "name", None)
            if topic_id is not None and name is not None and any(topic_id):
                ids[bytes(topic_id)] = name
    return ids


def _topic_name(item, ids: dict[bytes, str], field_name: str) -> str:
    if getattr(item, field_name, None) is not None:
        return getattr(item, field_name)
    return ids.get(bytes(item.topic_id), f"<unknown topic id {item.topic_id}>")


def fetch_magic(fetch_version: int) -> int:
    """The magic a broker down-converts to for an old Fetch (data stored as magic 2)."""
    return 0 if fetch_version <= 1 else 1 if fetch_version <= 3 else 2


def collect_records(decoded: list[Decoded]) -> dict[tuple[str, int], RecordsSeen]:
    """Every batch in Produce requests and Fetch responses, CRC-checked and decoded."""
    ids = topic_ids(decoded)
    seen: dict[tuple[str, int], RecordsSeen] = defaultdict(RecordsSeen)
    for d in decoded:
        if d.api_key == PRODUCE:
            accepted = set()
            if d.response is not None:
                for topic in d.response.body.responses:
                    name = _topic_name(topic, ids, "name")
                    for part in topic.partition_responses:
                        if part.error_code == 0:
                            accepted.add((name, part.index))
            for topic in d.request.body.topic_data:
                name = _topic_name(topic, ids, "name")
                for part in topic.partition_data:
                    tp = (name, part.index)
                    for batch in iter_batches(part.records):
                        batch.verify_crc()
                        records = batch.records(verify_crc=True)
                        seen[tp].produce_batches.append((d.api_version, batch))
                        if tp in accepted or (d.response is None and not d.expects_response):
                            seen[tp].produced.extend(records)
        elif d.api_key == FETCH and d.response is not None:
            for topic in d.response.body.responses:
                name = _topic_name(topic, ids, "topic")
                for part in topic.partitions:
                    if part.error_code != 0 or part.records is None:
                        continue
                    tp = (name, part.partition_index)
                    for batch in iter_batches(part.records):
                        batch.verify_crc()
                        seen[tp].fetch_batches.append((d.api_version, batch))
                        for record in batch.records(verify_crc=True):
                            previous = seen[tp].fetched.setdefault(record.offset, record)
                            assert (previous.key, previous.value, previous.headers) == \
                                (record.key, record.value, record.headers), \
                                f"{tp} offset {record.offset} fetched with different contents"
    return seen


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8")


def as_messages(records) -> list[dict]:
    """Records in the header's message form."""
    return [{"key": _text(r.key), "value": _text(r.value),
             "headers": [[k, _text(v)] for k, v in r.headers]} for r in records]


def check_records(header: dict, decoded: list[Decoded]) -> dict[str, Counter]:
    """Produce and Fetch records equal the messages sent, per topic, codec and magic."""
    seen = collect_records(decoded)
    stats: dict[str, Counter] = defaultdict(Counter)
    for plan in header["topics"]:
        tp = (plan["topic"], plan.get("partition", 0))
        where = f"{plan['topic']} ({plan['codec']}, magic {plan['magic']})"
        records = seen.get(tp)
        assert records is not None, f"{where}: no records crossed the wire"
        # Produce: what the client sent, in order, with its codec and magic.
        assert records.produce_batches, f"{where}: no Produce batches"
        for version, batch in records.produce_batches:
            assert batch.compression == plan["codec"], \
                f"{where}: Produce v{version} batch compressed with {batch.compression}"
            assert batch.magic == plan["magic"], f"{where}: Produce v{version} batch magic {batch.magic}"
        assert as_messages(records.produced) == plan["messages"], f"{where}: produced records differ"
        # Fetch: what the broker served, at the magic the Fetch version allows.
        assert records.fetch_batches, f"{where}: no Fetch batches"
        for version, batch in records.fetch_batches:
            assert batch.compression == plan["codec"], \
                f"{where}: Fetch v{version} batch compressed with {batch.compression}"
            assert batch.magic == fetch_magic(version), \
                f"{where}: Fetch v{version} batch magic {batch.magic}"
        offsets = sorted(records.fetched)
        assert offsets == list(range(len(plan["messages"]))), f"{where}: fetched offsets {offsets}"
        assert as_messages(records.fetched[o] for o in offsets) == plan["messages"], \
            f"{where}: fetched records differ"
        # CreateTime topics: the broker serves the producer's timestamps (none for magic 0).
        produced_ts = [r.timestamp for r in records.produced]
        assert [records.fetched[o].timestamp for o in offsets] == produced_ts, \
            f"{where}: fetched timestamps differ from produced ones"
        if plan["magic"] == 0:
            assert set(produced_ts) == {-1}
        else:
            assert all(ts > 1_600_000_000_000 for ts in produced_ts), f"{where}: {produced_ts}"
        for kind, batches in (("produce", records.produce_batches), ("fetch", records.fetch_batches)):
            for version, batch in batches:
                stats[f"{kind} magic {batch.magic}"][batch.compression] += 1
    return stats


def check_addresses(header: dict, decoded: list[Decoded]) -> int:
    """Every broker address in a response is the one the broker advertised (the relay's)."""
    host, port = header["advertised"].rsplit(":", 1)
    expected = (header["broker_node_id"], host, int(port))
    checked = 0
    for d in decoded:
        body = d.response.body if d.response is not None else None
        if body is None:
            continue
        found = []
        if d.api_key == METADATA:
            found = [(b.node_id, b.host, b.port) for b in body.brokers]
            assert found, "Metadata response lists no broker"
        elif d.api_key == DESCRIBE_CLUSTER:
            found = [(b.broker_id, b.host, b.port) for b in body.brokers]
        elif d.api_key == FIND_COORDINATOR:
            if d.api_version >= 4:
                found = [(c.node_id, c.host, c.port) for c in body.coordinators if c.error_code == 0]
            elif body.error_code == 0:
                found = [(body.node_id, body.host, body.port)]
        elif d.api_key in (PRODUCE, FETCH):
            found = [(e.node_id, e.host, e.port) for e in getattr(body, "node_endpoints", None) or ()]
        for address in found:
            assert address == expected, f"{api_name(d.api_key)} v{d.api_version} lists {address}"
            checked += 1
    return checked


def check_client_ids(header: dict, decoded: list[Decoded]) -> set[str]:
    """Requests carry exactly the client ids configured: the client's name and a role.

    The header lists them; a note explains any that a tool chose itself.
    """
    prefix = header["client_id_prefix"] + "-"
    client_ids = {d.request.client_id for d in decoded}
    assert client_ids == set(header["client_ids"])
    strangers = {c for c in client_ids if not c.startswith(prefix) and not header["client_ids"][c]}
    assert not strangers, f"client ids not starting with {prefix!r}: {strangers}"
    return client_ids


def check_produce_topics(header: dict, decoded: list[Decoded]) -> None:
    ids = topic_ids(decoded)
    produced = {_topic_name(t, ids, "name")
                for d in decoded if d.api_key == PRODUCE for t in d.request.body.topic_data}
    assert produced == {plan["topic"] for plan in header["topics"]}


def check_unanswered(decoded: list[Decoded]) -> None:
    """A request without a response is acks=0, or in flight when the client closed.

    Responses come back in request order, so after an unanswered request no
    later request on the same connection has a response either.
    """
    for i, d in enumerate(decoded):
        if d.response is None and d.expects_response:
            answered = [e for e in decoded[i + 1:] if e.conn == d.conn and e.response is not None]
            assert not answered, (f"{api_name(d.api_key)} v{d.api_version} on connection {d.conn} "
                                  f"got no response, but {len(answered)} later requests did")


def api_versions_ranges(decoded: list[Decoded]) -> list[dict[int, tuple[int, int]]]:
    ranges = []
    for d in decoded:
        if d.api_key == API_VERSIONS and d.response is not None and d.response.body.error_code == 0:
            ranges.append({k.api_key: (k.min_version, k.max_version) for k in d.response.body.api_keys})
    return ranges


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
