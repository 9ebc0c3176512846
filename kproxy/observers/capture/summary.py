"""One capture row per request/response pair: the summary fields every format shares.

``build_row`` decodes the pair (on the writer thread, never the event loop)
and returns a plain dict whose keys are the columns documented in
``SCHEMA.md``; the JSONL format adds ``request`` and ``response`` bodies.
Topics, partitions and record counts are found through the schema: any
list of a struct type named like ``*Topic*`` is a list of topics, any list
of ``*Partition*`` structs inside it a list of partitions. Group columns
(``group_id``, ``member_id``, ``generation``) and the client software
columns come from the fields that ``PAIR_FIELDS`` names per API.
"""

from __future__ import annotations

import datetime as _dt
from functools import lru_cache
from typing import Any

from ...protocol import API_KEYS, DecodeError, Struct, error_name, schema
from ...protocol.records import iter_batches
from .filters import header_client_id
from .redact import inflate, to_json

SCHEMA_VERSION = 2
# Topic ids remembered from Metadata (and the like) to name topics in Fetch v13+ etc.
MAX_TOPIC_IDS = 100_000

OUTCOME_RESPONSE = "response"          # the broker answered
OUTCOME_NO_RESPONSE = "no_response"    # Produce with acks=0: no answer by design
OUTCOME_UNANSWERED = "unanswered"      # the connection closed first

_NAME_FIELDS = ("name", "topic", "topic_name")
_PARTITION_INDEX_FIELDS = ("partition_index", "index", "partition", "partition_id")
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


def iso_utc(wall: float) -> str:
    """Seconds since the epoch → ``2024-05-01T12:00:00.123456Z``."""
    micros = int(round(wall * 1_000_000))
    return (_EPOCH + _dt.timedelta(microseconds=micros)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ---------------------------------------------------------------- schema plan

class _Plan:
    """For one message (api key, direction): how to find topics in a decoded body."""

    __slots__ = ("rows", "structs")

    def __init__(self, spec: schema.MessageSpec):
        self.rows = spec.fields
        self.structs = spec.structs


@lru_cache(maxsize=None)
def _plan(kind: str, api_key: int) -> _Plan | None:
    specs = schema.REQUESTS if kind == "request" else schema.RESPONSES
    spec = specs.get(api_key)
    return _Plan(spec) if spec is not None else None


def _is_topic_struct(type_name: str, rows) -> bool:
    if "Topic" not in type_name or "Config" in type_name:
        return False
    names = {f.name for f in rows}
    return bool(names & {"name", "topic", "topic_name", "topic_id"})


class Facts:
    """What a body says about topics, partitions, records and errors."""

    __slots__ = ("topics", "partitions", "records", "record_bytes", "batches", "codecs",
                 "topic_records", "errors", "error_count", "has_records", "topic_ids",
                 "count_errors")

    def __init__(self):
        self.topics: dict[str, None] = {}            # ordered set
        self.partitions: set[tuple[str, object]] = set()    # distinct (topic, partition)
        self.records = 0
        self.record_bytes = 0
        self.batches = 0
        self.codecs: dict[str, None] = {}
        self.topic_records: dict[str, list[int]] = {}
        self.errors: dict[str, None] = {}
        self.error_count = 0
        self.has_records = False
        self.topic_ids: dict[str, str] = {}          # id → name, learned from this body
        self.count_errors = False                    # only responses' error codes count


def body_facts(kind: str, api_key: int, body, topic_names: dict[str, str], facts: Facts) -> Facts:
    """Walk a decoded body once; ``topic_names`` maps topic id strings to names."""
    if not isinstance(body, Struct):
        return facts
    plan = _plan(kind, api_key)
    if plan is None:
        return facts
    _walk(body, plan.rows, plan.structs, topic_names, facts, None)
    return facts


def _walk(obj: Struct, rows, structs, names, facts: Facts, topic: str | None) -> None:
    values = obj.__dict__
    for f in rows:
        value = values.get(f.name)
        if value is None:
            continue
        name = f.name
        if name == "error_code" or name.endswith("_error_code"):
            if value and facts.count_errors:
                facts.error_count += 1
                facts.errors[error_name(value)] = None
            continue
        t = f.type
        is_array = t[:2] == "[]"
        element = t[2:] if is_array else t
        sub = structs.get(element)
        if sub is not None:
            items = value if is_array else (value,)
            if topic is None and _is_topic_struct(element, sub):
                for item in items:
                    _topic(item, sub, structs, names, facts)
            elif topic is not None and is_array and "Partition" in element:
                for item in items:
                    _partition(item, sub, structs, names, facts, topic)
            else:
                for item in items:
                    _walk(item, sub, structs, names, facts, topic)
        elif element == "string" and is_array and "topic" in name and topic is None:
            for text in value:
                facts.topics[text] = None
        elif t == "records" and topic is not None:
            _records(value, facts, topic)


def _topic_name(item: Struct, names: dict[str, str], facts: Facts) -> str:
    values = item.__dict__
    for key in _NAME_FIELDS:
        text = values.get(key)
        if text:
            topic_id = values.get("topic_id")
            if topic_id is not None and any(topic_id):
                facts.topic_ids[str(topic_id)] = text
            return text
    topic_id = values.get("topic_id")
    if topic_id is not None:
        text = str(topic_id)
        return names.get(text, text)
    return ""


def _topic(item: Struct, rows, structs, names, facts: Facts) -> None:
    topic = _topic_name(item, names, facts)
    if topic:
        facts.topics[topic] = None
    values = item.__dict__
    for f in rows:
        if f.type == "[]int32" and f.name in ("partitions", "partition_indexes", "partition_ids"):
            for index in values.get(f.name) or ():
                facts.partitions.add((topic, index))
    _walk(item, rows, structs, names, facts, topic)


def _partition(item: Struct, rows, structs, names, facts: Facts, topic: str) -> None:
    values = item.__dict__
    index = next((values[k] for k in _PARTITION_INDEX_FIELDS if k in values), None)
    facts.partitions.add((topic, index if index is not None else id(item)))
    _walk(item, rows, structs, names, facts, topic)


def _records(blob, facts: Facts, topic: str) -> None:
    facts.has_records = True
    per_topic = facts.topic_records.setdefault(topic, [0, 0])
    try:
        for batch in iter_batches(blob):
            facts.batches += 1
            facts.record_bytes += batch.size_bytes
            per_topic[1] += batch.size_bytes
            count = batch.record_count
            if count is None:                     # legacy compressed wrapper: count inside
                try:
                    count = len(inflate(batch))       # bounded; a bomb is counted and skipped
                except DecodeError:
                    count = 0
            facts.records += count
            per_topic[0] += count
            facts.codecs[batch.compression] = None
    except DecodeError:
        pass


# ---------------------------------------------------------------- group and client software columns

# Which API fills which of these columns, and from which fields (names as in
# ``protocol/_schema.py``). A source is "request.<path>" or "response.<path>";
# a step into a list takes its first element. Sources are tried in order and the
# first value that means something wins: not None, not "", not negative (-1 is
# Kafka's "unknown" generation or epoch, -2 a static member leaving).
_CLASSIC_MEMBER = {"group_id": ("request.group_id",), "member_id": ("request.member_id",),
                   "generation": ("request.generation_id",)}
_COMMIT = {"group_id": ("request.group_id",), "member_id": ("request.member_id",),
           "generation": ("request.generation_id_or_member_epoch",)}
# KIP-848 style heartbeats: the broker's answer holds the member id it knows and the
# epoch it granted; without an answer, what the member sent.
_GROUP_HEARTBEAT = {"group_id": ("request.group_id",),
                    "member_id": ("response.member_id", "request.member_id"),
                    "generation": ("response.member_epoch", "request.member_epoch")}
PAIR_FIELDS: dict[str, dict[str, tuple[str, ...]]] = {
    "ApiVersions": {"client_software_name": ("request.client_software_name",),       # v3+
                    "client_software_version": ("request.client_software_version",)},
    "JoinGroup": {"group_id": ("request.group_id",),
                  # MEMBER_ID_REQUIRED answers carry the id the broker assigned
                  "member_id": ("response.member_id", "request.member_id"),
                  "generation": ("response.generation_id",)},
    "SyncGroup": _CLASSIC_MEMBER,
    "Heartbeat": _CLASSIC_MEMBER,
    "LeaveGroup": {"group_id": ("request.group_id",),
                   "member_id": ("request.member_id", "request.members.member_id")},    # v3+: a batch
    "OffsetCommit": _COMMIT,
    "TxnOffsetCommit": _COMMIT,
    "OffsetFetch": {"group_id": ("request.group_id", "request.groups.group_id"),        # v8+: a batch
                    "member_id": ("request.groups.member_id",)},                        # v9+
    "ConsumerGroupHeartbeat": _GROUP_HEARTBEAT,
    "ShareGroupHeartbeat": _GROUP_HEARTBEAT,
    "StreamsGroupHeartbeat": _GROUP_HEARTBEAT,
    "DescribeGroups": {"group_id": ("request.groups",)},
    "ConsumerGroupDescribe": {"group_id": ("request.group_ids",)},
    "ShareGroupDescribe": {"group_id": ("request.group_ids",)},
    "StreamsGroupDescribe": {"group_id": ("request.group_ids",)},
}
PAIR_COLUMNS = ("client_software_name", "client_software_version", "group_id", "member_id", "generation")
_NO_PAIR_FIELDS = dict.fromkeys(PAIR_COLUMNS)
API_VERSIONS = API_KEYS["ApiVersions"]

# api key -> ((column, ((reads the response?, (step, ...)), ...)), ...); APIs this
# schema does not have are left out.
_PAIR_SOURCES = {
    API_KEYS[api]: tuple((column, tuple((source.startswith("response."), tuple(source.split(".")[1:]))
                                        for source in sources))
                         for column, sources in columns.items())
    for api, columns in PAIR_FIELDS.items() if api in API_KEYS}


def _field(body, steps):
    value = body
    for step in steps:
        if isinstance(value, list):
            value = value[0] if value else None
        if not isinstance(value, Struct):
            return None
        value = value.__dict__.get(step)
    if isinstance(value, list):
        value = value[0] if value else None
    return value


def pair_fields(api_key: int, request_body, response_body) -> dict[str, Any]:
    """The group and client software columns of one pair (None where not known; for
    APIs without such fields, one shared dict: read it, do not change it).

    Numbers from a response with a top-level error are not read: the broker
    leaves them at their defaults (a failed ConsumerGroupHeartbeat says epoch 0).
    """
    sources = _PAIR_SOURCES.get(api_key)
    if sources is None:
        return _NO_PAIR_FIELDS
    response_failed = isinstance(response_body, Struct) and bool(response_body.__dict__.get("error_code"))
    out = dict(_NO_PAIR_FIELDS)
    for column, candidates in sources:
        for from_response, steps in candidates:
            value = _field(response_body if from_response else request_body, steps)
            if value is None or value == "" or (isinstance(value, int) and (
                    value < 0 or (from_response and response_failed))):
                continue
            out[column] = value
            break
    return out


# ---------------------------------------------------------------- rows

def build_row(info, request, response, outcome: str, wall_offset: float,
              topic_names: dict[str, str], bodies: bool, include_record_data: bool,
              proxy_instance: str | None = None) -> tuple[dict, Facts]:
    """The row for one pair. ``request`` is a RequestReceived, ``response`` a ResponseReceived or None.

    ``client_software_*`` are this pair's own (ApiVersions v3+); carrying them to the
    connection's later rows is the writer's job, which knows the connection.
    """
    decoded = request.request
    client_id = decoded.client_id if decoded is not None else header_client_id(request.frame)
    decode_errors = []
    if decoded is None:
        decode_errors.append(f"request: {request.decode_error}")
    facts = Facts()
    req_body = decoded.body if decoded is not None else None
    if req_body is not None:
        body_facts("request", request.api_key, req_body, topic_names, facts)
    resp_body = None
    throttle = None
    if response is not None:
        decoded_response = response.response
        if decoded_response is None:
            decode_errors.append(str(response.decode_error))
        else:
            resp_body = decoded_response.body
            if isinstance(resp_body, Struct):
                throttle = resp_body.__dict__.get("throttle_time_ms")
            facts.count_errors = True
            body_facts("response", request.api_key, resp_body, topic_names, facts)
    if facts.topic_ids:
        # Learn topic ids (Metadata, CreateTopics...) for rows and topic filters that only see ids.
        if len(topic_names) > MAX_TOPIC_IDS:
            topic_names.clear()
        topic_names.update(facts.topic_ids)
    row: dict[str, Any] = {
        "capture_version": SCHEMA_VERSION,
        "time": request.time + wall_offset,
        "connection_id": info.id,
        "client_host": info.client[0],
        "client_port": info.client[1],
        "listener": info.listener,
        "upstream_host": info.upstream[0],
        "upstream_port": info.upstream[1],
        "node_id": info.node_id,
        "client_id": client_id,
        "api_key": request.api_key,
        "api_name": request.api_name,
        "api_version": request.api_version,
        "correlation_id": request.correlation_id,
        "outcome": outcome,
        "latency_ms": response.latency * 1000.0 if response is not None else None,
        "request_size": request.size,
        "response_size": response.size if response is not None else None,
        "throttle_ms": throttle,
        "error_count": facts.error_count,
        "errors": list(facts.errors),
        "topics": list(facts.topics),
        "partition_count": len(facts.partitions),
        "record_count": facts.records if facts.has_records else None,
        "record_bytes": facts.record_bytes if facts.has_records else None,
        "batch_count": facts.batches if facts.has_records else None,
        "compression": list(facts.codecs),
        "topic_records": ([{"topic": t, "record_count": c[0], "record_bytes": c[1]}
                           for t, c in facts.topic_records.items()] if facts.has_records else None),
        "decode_error": "; ".join(decode_errors) or None,
        # schema version 2
        "proxy_instance": proxy_instance,
        "connection_start": getattr(info, "opened", None),
    }
    row.update(pair_fields(request.api_key, req_body, resp_body))
    if bodies:
        row["request"] = to_json(req_body, include_record_data) if req_body is not None else None
        row["response"] = to_json(resp_body, include_record_data) if resp_body is not None else None
    return row, facts
