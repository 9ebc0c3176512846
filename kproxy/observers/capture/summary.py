"""One capture row per request/response pair: the summary fields every format shares.

``build_row`` decodes the pair (on the writer thread, never the event loop)
and returns a plain dict whose keys are the columns documented in
``SCHEMA.md``; the JSONL format adds ``request`` and ``response`` bodies.
Topics, partitions and record counts are found through the schema: any
list of a struct type named like ``*Topic*`` is a list of topics, any list
of ``*Partition*`` structs inside it a list of partitions. Group columns
(``group_id``, ``member_id``, ``generation``) and the client software
columns come from the fields that ``protocol.pair_fields.PAIR_FIELDS`` names per API.
"""

from __future__ import annotations

import datetime as _dt
from functools import lru_cache
from typing import Any

from ...protocol import DecodeError, Struct, error_name, schema
from ...protocol.client_software import ClientSoftware
from ...protocol.client_telemetry import TELEMETRY_KEYS, PUSH_TELEMETRY_KEY, decode_push
from ...protocol.failover import PARTITION_APIS, partition_answers
from ...protocol.pair_fields import PAIR_COLUMNS, PAIR_FIELDS, pair_fields  # noqa: F401 (re-exported)
from ...protocol.records import iter_batches
from .filters import header_client_id
from .redact import inflate, to_json

SCHEMA_VERSION = 4
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
        name = names.get(text)
        if name is None:
            return text
        facts.topic_ids[text] = name         # the row says which id it named by that name
        return name
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


# ---------------------------------------------------------------- rows

def _telemetry(api_key: int, request_body, response_body) -> tuple[str | None, list | None]:
    """(client instance id, pushed data points) of a GetTelemetrySubscriptions or
    PushTelemetry pair: the id the answer assigned (else the request's), and a push's
    metrics decoded (None if they do not decode; the pair is still recorded)."""
    if api_key not in TELEMETRY_KEYS or not isinstance(request_body, Struct):
        return None, None
    instance = request_body.client_instance_id
    if isinstance(response_body, Struct) and "client_instance_id" in response_body.__dict__:
        instance = response_body.client_instance_id
    if api_key != PUSH_TELEMETRY_KEY:
        return str(instance), None
    try:
        push = decode_push(request_body.compression_type, request_body.metrics)
    except DecodeError:
        return str(instance), None
    return str(instance), [{"name": m.name, "attributes": m.attributes_text, "value": m.value}
                           for m in push.metrics]


def fill_client_software(row: dict, software: ClientSoftware | None) -> None:
    """A row's client software columns: its connection's software as of that pair
    (``client_software.software_named``: the latest ApiVersions v3+ the broker accepted)."""
    row["client_software_name"] = software.name if software is not None else None
    row["client_software_version"] = software.version if software is not None else None


def build_row(info, request, response, outcome: str, wall_offset: float,
              topic_names: dict[str, str], bodies: bool, include_record_data: bool,
              proxy_instance: str | None = None) -> tuple[dict, Facts]:
    """The row for one pair. ``request`` is a RequestReceived, ``response`` a ResponseReceived or None.

    ``client_software_*`` are this pair's own (ApiVersions v3+); the writer, which knows
    the connection, replaces them with the connection's (``fill_client_software``).
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
    # schema version 3: the client certificate's subject; a SASL user replaces it (the writer's job)
    row["principal"] = getattr(info, "principal", None)
    # schema version 4: client telemetry (KIP-714)
    row["client_instance_id"], row["telemetry_metrics"] = _telemetry(request.api_key, req_body, resp_body)
    # schema version 4: the topic ids this pair named with their names: a Metadata
    # answer's, or ids resolved to the names in ``topics``; the pipeline resolves other rows' ids.
    row["topic_ids"] = ([{"topic_id": i, "topic": n} for i, n in facts.topic_ids.items()]
                        if facts.topic_ids else None)
    # schema version 4: per partition of Produce/Fetch/Metadata answers (failovers)
    row["partition_answers"] = ([a._asdict() for a in partition_answers(request.api_key, resp_body, topic_names)]
                                if request.api_key in PARTITION_APIS and isinstance(resp_body, Struct)
                                else None)
    if bodies:
        row["request"] = to_json(req_body, include_record_data) if req_body is not None else None
        row["response"] = to_json(resp_body, include_record_data) if resp_body is not None else None
    return row, facts
