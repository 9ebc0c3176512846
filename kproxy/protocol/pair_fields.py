"""Group and client software fields of a request/response pair, named per API.

One table, shared by capture (its group and client software columns) and the
metrics observer (client inventory, consumer groups): which API carries a
group id, a member id, a generation or member epoch, or the client's software
name and version, and in which of its fields.
"""

from __future__ import annotations

from typing import Any

from ._codec import Struct
from .schema import API_KEYS


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


