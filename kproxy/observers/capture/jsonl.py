"""JSON Lines capture: one object per request/response pair, bodies included.

Each line holds the summary columns of ``SCHEMA.md`` (``time`` and
``connection_start`` as ISO 8601 UTC strings with microseconds) plus ``request`` and ``response``: the
decoded bodies with bytes as base64, UUIDs as Kafka prints them, secrets as
``"<redacted N bytes>"`` and ``records`` fields as a per-partition summary
(``batches``, ``records``, ``bytes``, ``codecs``; with record data enabled,
also ``data``: the decoded records, keys/values/header values in base64).
"""

from __future__ import annotations

import json

from .files import RotatingSink
from .summary import iso_utc


def json_form(row: dict) -> dict:
    """A row as it appears in a JSONL line (also the live page's detail view)."""
    out = dict(row)
    out["time"] = iso_utc(row["time"])
    if row["connection_start"] is not None:
        out["connection_start"] = iso_utc(row["connection_start"])
    return out


class JsonlSink(RotatingSink):
    ext = ".jsonl"

    def __init__(self, files, counters):
        super().__init__(files)
        self.counters = counters

    def write(self, row: dict) -> None:
        line = (json.dumps(json_form(row), ensure_ascii=True, separators=(",", ":"), default=str) + "\n").encode()
        self.before_write(len(line))
        self.file.write(line)
        self.items_in_file += 1
        self.counters.bytes_written += len(line)

    def flush(self) -> None:
        if self.file is not None:
            self.file.flush()
