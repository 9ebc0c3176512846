"""One audit event made from a request/response pair (no I/O).

What is audited (``AUDITED_APIS``, and OffsetCommit from outside a group) and the
outcome names live in ``protocol.audited``, shared with ``kproxy analyze``.

``build_event`` turns a pair into a JSON-able dict: who (principal, address,
client id and software), what (the API, its decoded request, secrets redacted by
capture's rules) and the broker's answer per resource (``results``: every struct
of the answer that carries an error code, named by the fields that identify it).
"""

from __future__ import annotations

from typing import Any

from ...protocol import OpaqueBody, Struct, api_name, error_name
from ...protocol.api_keys import ApiKey
from ...protocol.audited import (AUDITED_API_NAMES, AUDITED_APIS, NO_GENERATION,  # noqa: F401 (re-exported)
                                 OFFSET_COMMIT_KEY, OUTCOME_ERROR, OUTCOME_OK, OUTCOME_PARTIAL,
                                 OUTCOME_UNANSWERED, OUTCOMES, WATCHED_APIS, is_outside_commit,
                                 outcome_of)
from ...protocol.schema import API_KEYS
from ..capture.redact import to_json
from ..capture.summary import iso_utc

# Enum fields spelt out (values from Kafka's AclOperation, AclPermissionType, PatternType,
# ResourceType, ConfigResource.Type, AlterConfigOp.OpType, ScramMechanism).
_ACL_RESOURCE_TYPES = {0: "UNKNOWN", 1: "ANY", 2: "TOPIC", 3: "GROUP", 4: "CLUSTER",
                       5: "TRANSACTIONAL_ID", 6: "DELEGATION_TOKEN", 7: "USER"}
_CONFIG_RESOURCE_TYPES = {0: "UNKNOWN", 2: "TOPIC", 4: "BROKER", 8: "BROKER_LOGGER",
                          16: "CLIENT_METRICS", 32: "GROUP"}
_ACL_OPERATIONS = {0: "UNKNOWN", 1: "ANY", 2: "ALL", 3: "READ", 4: "WRITE", 5: "CREATE",
                   6: "DELETE", 7: "ALTER", 8: "DESCRIBE", 9: "CLUSTER_ACTION",
                   10: "DESCRIBE_CONFIGS", 11: "ALTER_CONFIGS", 12: "IDEMPOTENT_WRITE",
                   13: "CREATE_TOKENS", 14: "DESCRIBE_TOKENS", 15: "TWO_PHASE_COMMIT"}
_ACL_PERMISSIONS = {0: "UNKNOWN", 1: "ANY", 2: "DENY", 3: "ALLOW"}
_PATTERN_TYPES = {0: "UNKNOWN", 1: "ANY", 2: "MATCH", 3: "LITERAL", 4: "PREFIXED"}
_CONFIG_OPERATIONS = {0: "SET", 1: "DELETE", 2: "APPEND", 3: "SUBTRACT"}
_SCRAM_MECHANISMS = {0: "UNKNOWN", 1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
_ACL_ENUMS = {"resource_type": _ACL_RESOURCE_TYPES, "resource_type_filter": _ACL_RESOURCE_TYPES,
              "operation": _ACL_OPERATIONS, "permission_type": _ACL_PERMISSIONS,
              "resource_pattern_type": _PATTERN_TYPES, "pattern_type": _PATTERN_TYPES,
              "pattern_type_filter": _PATTERN_TYPES}
_CONFIG_ENUMS = {"resource_type": _CONFIG_RESOURCE_TYPES, "config_operation": _CONFIG_OPERATIONS}
ENUMS = {ApiKey.CREATE_ACLS: _ACL_ENUMS, ApiKey.DELETE_ACLS: _ACL_ENUMS,
         ApiKey.ALTER_CONFIGS: _CONFIG_ENUMS, ApiKey.INCREMENTAL_ALTER_CONFIGS: _CONFIG_ENUMS,
         ApiKey.ALTER_USER_SCRAM_CREDENTIALS: {"mechanism": _SCRAM_MECHANISMS}}
# Answers whose results name nothing (CreateAcls, DeleteAcls): the n-th result answers the
# n-th item of this request list, which then names it.
_BY_POSITION = {ApiKey.CREATE_ACLS: ("creations", "results"),
                ApiKey.DELETE_ACLS: ("filters", "filter_results")}

# Fields of an answer's struct that say which resource it is about (kept in its result, and
# passed down to the structs inside it: a partition's result names its topic).
IDENTITY_FIELDS = ("resource_type", "resource_name", "name", "topic", "topic_name", "topic_id",
                   "group_id", "user", "feature", "partition_index", "partition_id", "entity",
                   "principal", "host", "operation", "permission_type", "pattern_type")
_ERROR_CODE, _ERROR_MESSAGE = "error_code", "error_message"
# Answer lists not walked: CreateTopics echoes every config of the new topic (no error
# codes, and the request already names what was set); quota entities are identity.
_SKIPPED_LISTS = frozenset({"configs", "entity"})


def _named(value: Any, enums: dict) -> Any:
    """``to_json`` output with the enum fields of ``enums`` spelt out."""
    if isinstance(value, list):
        return [_named(v, enums) for v in value]
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            table = enums.get(key)
            out[key] = table.get(item, item) if table is not None and isinstance(item, int) \
                else _named(item, enums)
        return out
    return value


def request_json(api_key: int, body) -> Any:
    """The request's decoded body, secrets redacted, enums spelt out."""
    return _named(to_json(body), ENUMS.get(api_key, {}))


def results(api_key: int, request_body, response_body) -> list[dict]:
    """The broker's answer per resource: one entry per struct carrying an error code
    (the answer's top-level code only when it is an error or the only one)."""
    enums = ENUMS.get(api_key, {})
    out: list[dict] = []
    top = None
    fields = response_body.fields()
    if _ERROR_CODE in fields:
        top = _result({}, fields)
    positional = _BY_POSITION.get(api_key)
    for name, value in fields.items():
        if not isinstance(value, list) or not value or not isinstance(value[0], Struct) \
                or name in _SKIPPED_LISTS:
            continue
        asked = getattr(request_body, positional[0], None) if positional and positional[1] == name else None
        for index, item in enumerate(value):
            identity = {}
            if asked is not None and index < len(asked):
                identity = {"request": _named(to_json(asked[index]), enums)}
            _walk(item, identity, enums, out)
    if top is not None and (top["error"] != "NONE" or not out):
        out.insert(0, top)
    return out


def _walk(item: Struct, inherited: dict, enums: dict, out: list) -> None:
    fields = item.fields()
    identity = dict(inherited)
    for key in IDENTITY_FIELDS:
        if key in fields and fields[key] is not None:
            identity[key] = _named({key: _json_value(fields[key])}, enums)[key]
    if _ERROR_CODE in fields:
        out.append(_result(identity, fields))
    for name, value in fields.items():
        if isinstance(value, list) and value and isinstance(value[0], Struct) \
                and name not in _SKIPPED_LISTS:
            for child in value:
                _walk(child, identity, enums, out)


def _json_value(value: Any) -> Any:
    """An identity field as JSON: structs (quota entities) through capture's rules, UUIDs as text."""
    if isinstance(value, Struct):
        return to_json(value)
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def _result(identity: dict, fields: dict) -> dict:
    return {**identity, "error": error_name(fields[_ERROR_CODE]),
            "message": fields.get(_ERROR_MESSAGE)}


def outcome(found: list[dict]) -> str:
    """ok (every resource accepted), error (none), partial (some)."""
    return outcome_of(sum(1 for r in found if r["error"] != "NONE"), len(found))


class Who:
    """One connection as the audit names it: principal and client software, followed from
    its SASL and ApiVersions pairs (see ``observer.py``)."""

    __slots__ = ("principal", "software", "sasl")

    def __init__(self, principal: str | None):
        self.principal = principal                 # a TLS client certificate's subject, or later the SASL user
        self.software: tuple[str | None, str | None] = (None, None)
        self.sasl = None


def build_event(info, who: Who, request_event, response_event, wall_offset: float,
                instance: str) -> dict:
    """The audit event of one pair (``response_event`` None: unanswered)."""
    api_key = request_event.api_key
    request = request_event.request
    event: dict[str, Any] = {
        "time": iso_utc(request_event.time + wall_offset),
        "proxy_instance": instance,
        "principal": who.principal or "ANONYMOUS",
        "client_address": f"{info.client[0]}:{info.client[1]}",
        "via": f"{info.via[0]}:{info.via[1]}" if getattr(info, "via", None) else None,
        "listener": info.listener,
        "client_id": request.client_id if request is not None else None,
        "client_software_name": who.software[0],
        "client_software_version": who.software[1],
        "api": api_name(api_key),
        "api_version": request_event.api_version,
        "correlation_id": request_event.correlation_id,
    }
    if request is None or isinstance(request.body, OpaqueBody):
        event["request"] = None
        event["request_error"] = "streamed" if request_event.streamed else str(request_event.decode_error
                                                                               or "not decodable")
    else:
        event["request"] = request_json(api_key, request.body)
    if response_event is None:
        event.update(outcome=OUTCOME_UNANSWERED, latency_ms=None, results=[])
        return event
    event["latency_ms"] = round((response_event.time - request_event.time) * 1000, 3)
    response = response_event.response
    if response is None or isinstance(response.body, OpaqueBody) or request is None:
        event.update(outcome=OUTCOME_ERROR if response is None else OUTCOME_OK, results=[],
                     response_error="answer not decodable")
        return event
    found = results(api_key, request.body, response.body)
    event["outcome"] = outcome(found)
    event["results"] = found
    return event
