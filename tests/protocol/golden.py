"""What a golden or live capture of client-broker pairs must show: decoded pairs, and checks on what they mean."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from kproxy.protocol import (Request, Response, api_name, decode_request, decode_response, encode_request,
                             encode_response, is_known)
from kproxy.protocol.records import iter_batches

PRODUCE, FETCH, METADATA, FIND_COORDINATOR, API_VERSIONS, CREATE_TOPICS = 0, 1, 3, 10, 18, 19
DESCRIBE_CLUSTER, DESCRIBE_TOPIC_PARTITIONS = 60, 75
# What each broker answered in ApiVersions, checked against the captures: 4.4.0
# still advertises Produce v0-2 although its message definitions (and KIP-896)
# start at v3; Fetch starts at v4 as KIP-896 says.
BROKER_RANGES = {
    "4.4.0": {PRODUCE: (0, 13), FETCH: (4, 18), METADATA: (0, 13), API_VERSIONS: (0, 5)},
    "3.9.2": {PRODUCE: (0, 11), FETCH: (0, 17), METADATA: (0, 12), API_VERSIONS: (0, 4)},
}


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
