"""Queries over the generated Kafka schema: API names, version ranges, header rules.

The generated tables in ``_schema`` are plain data; this module is the only
reader of their layout, so the rest of the codec talks in names, not indexes.
"""

from __future__ import annotations

from typing import NamedTuple

from . import _schema
from .api_keys import ApiKey

UNSUPPORTED_VERSION = 35       # ApiVersions answers an unsupported version with a v0 body and this code


class FieldSpec(NamedTuple):
    """One field row of the generated schema (see ``_schema``'s docstring)."""
    name: str
    type: str
    versions: tuple[int, int] | None
    nullable: tuple[int, int] | None
    tag: int | None
    tagged: tuple[int, int] | None
    default: object


class MessageSpec(NamedTuple):
    api_key: int
    kind: str                   # "request" or "response"
    name: str                   # e.g. "MetadataResponse"
    versions: tuple[int, int]
    first_flexible: int | None
    fields: tuple[FieldSpec, ...]
    structs: dict[str, tuple[FieldSpec, ...]]

    def is_flexible(self, version: int) -> bool:
        return self.first_flexible is not None and version >= self.first_flexible

    def has_version(self, version: int) -> bool:
        return self.versions[0] <= version <= self.versions[1]


def _message(api_key: int, kind: str, name: str, raw: tuple) -> MessageSpec:
    versions, first_flexible, fields, structs = raw
    return MessageSpec(
        api_key, kind, name + kind.capitalize(), versions, first_flexible,
        tuple(FieldSpec(*row) for row in fields),
        {key: tuple(FieldSpec(*row) for row in rows) for key, rows in structs.items()})


REQUESTS: dict[int, MessageSpec] = {}
RESPONSES: dict[int, MessageSpec] = {}
API_NAMES: dict[int, str] = {}
for _key, (_name, _request, _response) in _schema.APIS.items():
    API_NAMES[_key] = _name
    REQUESTS[_key] = _message(_key, "request", _name, _request)
    RESPONSES[_key] = _message(_key, "response", _name, _response)

API_KEYS: dict[str, int] = {name: key for key, name in API_NAMES.items()}
ERROR_NAMES: dict[int, str] = {code: name for code, (name, _) in _schema.ERRORS.items()}
RETRIABLE_ERRORS: frozenset[int] = frozenset(c for c, (_, r) in _schema.ERRORS.items() if r)
SCHEMA_SOURCES: tuple[str, ...] = _schema.SOURCE_VERSIONS
REMOVED_VERSIONS: dict[int, tuple[int, int]] = _schema.REMOVED_VERSIONS


def api_name(api_key: int) -> str:
    """The API's name ("Produce", "Metadata", ...); "Unknown(<key>)" for keys Kafka never defined."""
    return API_NAMES.get(api_key) or f"Unknown({api_key})"


def error_name(code: int) -> str:
    """Kafka's name for an error code ("NONE", "NOT_LEADER_OR_FOLLOWER", ...)."""
    return ERROR_NAMES.get(code) or f"UNKNOWN_ERROR_CODE_{code}"


def version_range(api_key: int) -> tuple[int, int] | None:
    """Lowest and highest version kproxy can decode for an API, or None if unknown."""
    spec = REQUESTS.get(api_key)
    return spec.versions if spec is not None else None


def is_known(api_key: int, api_version: int) -> bool:
    spec = REQUESTS.get(api_key)
    return spec is not None and spec.has_version(api_version)


def removed_versions(api_key: int) -> tuple[int, int] | None:
    """The request versions of an API that Kafka 4.0 removed, as (lo, hi); None if none were.

    "Removed" means gone since Kafka 4.0 (KIP-896, plus the ZooKeeper-only
    inter-broker APIs): a 4.x broker rejects such a request although older
    brokers accept it, so a client sending one must upgrade before the cluster
    does. kproxy still decodes these versions. Derived by the generator from
    the definitions of the two Kafka lines in ``SCHEMA_SOURCES``, not from what
    a broker advertises: 4.x lists Produce 0-13 in ApiVersions (KAFKA-18659)
    yet rejects 0-2.
    """
    return REMOVED_VERSIONS.get(api_key)


def is_removed(api_key: int, api_version: int) -> bool:
    """Whether a 4.x broker rejects this request version because Kafka 4.0 removed it."""
    removed = REMOVED_VERSIONS.get(api_key)
    return removed is not None and removed[0] <= api_version <= removed[1]


def request_header_version(api_key: int, api_version: int) -> int | None:
    """Request header version for a known API version; None when unknown."""
    spec = REQUESTS.get(api_key)
    if spec is None or not spec.has_version(api_version):
        return None
    if api_key == ApiKey.CONTROLLED_SHUTDOWN and api_version == 0:   # the one request header v0
        return 0
    return 2 if spec.is_flexible(api_version) else 1


def response_header_version(api_key: int, api_version: int) -> int | None:
    """Response header version for a known API version; None when unknown."""
    spec = RESPONSES.get(api_key)
    if spec is None or not spec.has_version(api_version):
        return None
    if api_key == ApiKey.API_VERSIONS:   # always v0: clients read it before negotiating
        return 0
    return 1 if spec.is_flexible(api_version) else 0
