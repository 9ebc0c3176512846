"""What a rule looks at in one request, read alike from a decoded request and a capture row.

A live request's body is a ``Struct`` (``records`` as raw batches); a capture row's
``request`` is the JSON capture wrote of the same body (same snake_case field names,
``records`` as a summary with its ``codecs``). ``field`` reads either, so each rule is
written once.
"""

from __future__ import annotations

from typing import Any

from ..protocol.errors import DecodeError
from ..protocol.records import iter_batches

NO_PRODUCER_ID = -1          # a batch's producer id without an idempotent producer


def field(obj: Any, name: str) -> Any:
    """A field of a decoded struct or of its capture JSON (None when absent)."""
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def items(obj: Any, name: str) -> list:
    """A list field (None and absent read as empty)."""
    value = field(obj, name)
    return value if isinstance(value, list) else []


class Subject:
    """One request as rules see it. ``software`` is the connection's client software (name,
    version) as of this request; ``body`` the decoded body or its capture JSON (None: not
    decodable, then body rules pass); ``codecs`` the compression codecs of its record
    batches when the caller knows them (a capture row's ``compression``)."""

    __slots__ = ("api_key", "api_version", "client_id", "software", "body", "_codecs", "_idempotent")

    def __init__(self, api_key: int, api_version: int, client_id: str | None,
                 software: tuple[str | None, str | None] = (None, None), body: Any = None,
                 codecs: list[str] | None = None):
        self.api_key = api_key
        self.api_version = api_version
        self.client_id = client_id
        self.software = software
        self.body = body
        self._codecs: frozenset[str] | None = frozenset(codecs) if codecs is not None else None
        self._idempotent: bool | None = None

    def _read_batches(self) -> None:
        codecs: set[str] = set()
        idempotent: bool | None = None
        for topic in items(self.body, "topic_data"):
            for partition in items(topic, "partition_data"):
                records = field(partition, "records")
                if isinstance(records, dict):            # capture JSON: a summary of the batches
                    codecs.update(records.get("codecs") or ())
                    continue
                try:
                    for batch in iter_batches(records):
                        codecs.add(batch.compression)
                        has_id = batch.magic == 2 and batch.producer_id != NO_PRODUCER_ID
                        idempotent = has_id if idempotent is None else (idempotent and has_id)
                except DecodeError:
                    pass                                 # what was readable counts
        if self._codecs is None:
            self._codecs = frozenset(codecs)
        self._idempotent = idempotent

    def codecs(self) -> frozenset[str]:
        """Compression codecs of a Produce request's batches (empty: none read)."""
        if self._codecs is None:
            self._read_batches()
        return self._codecs

    def idempotent(self) -> bool | None:
        """Whether every batch carries a producer id (None: not known, as in capture JSON,
        which keeps only a summary of the batches)."""
        if self._codecs is None or self._idempotent is None:
            self._read_batches()
        return self._idempotent
