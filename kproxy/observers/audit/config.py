"""The audit settings, parsed once (``AuditConfig.from_value``) at config loading."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

# An audit file is rotated at this size: admin changes are rare (a few hundred bytes to a
# few KiB each), so 64 MiB holds months of them and stays easy to open and grep.
DEFAULT_ROTATE_BYTES = 64 * 1024 * 1024
# Rotated files kept beside the current one (audit.jsonl.1 ... .10): ~700 MiB at most.
DEFAULT_KEEP_FILES = 10
# Smallest rotation size accepted: below it a single event (a CreateTopics of many topics)
# could fill a file on its own.
MIN_ROTATE_BYTES = 4096
# Events waiting for the writer thread; past this they are dropped and counted. Admin changes
# come a few at a time; a client scripting thousands at once (a topic-per-tenant migration)
# still fits while the writer catches up.
DEFAULT_QUEUE_MAX_ITEMS = 10_000
_KEYS = ("path", "rotate_bytes", "keep", "log", "queue_max_items")


@dataclass(frozen=True)
class AuditConfig:
    """Where audit events go: a JSON Lines file (``path``, rotated at ``rotate_bytes``,
    ``keep`` old files), and/or one INFO line each on the ``kproxy.audit`` logger (``log``)."""
    path: str | None = None
    rotate_bytes: int = DEFAULT_ROTATE_BYTES
    keep: int = DEFAULT_KEEP_FILES
    log: bool = True
    queue_max_items: int = DEFAULT_QUEUE_MAX_ITEMS

    @property
    def enabled(self) -> bool:
        return self.path is not None or self.log

    @classmethod
    def from_value(cls, value: Any) -> "AuditConfig":
        """A table (file), a JSON object (env var), or a path (``audit_file``). ValueError
        names the bad key."""
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("{"):
                try:
                    value = json.loads(text)
                except ValueError as exc:
                    raise ValueError(f"audit: expected a JSON object ({exc})") from None
            else:
                value = {"path": text}
        if not isinstance(value, Mapping):
            raise ValueError("audit: expected a table of settings or a file path")
        unknown = set(value) - set(_KEYS)
        if unknown:
            raise ValueError(f"audit.{sorted(unknown)[0]}: unknown setting")
        out: dict[str, Any] = {}
        path = value.get("path")
        if path is not None:
            if not isinstance(path, str) or not path.strip() or "\x00" in path:
                raise ValueError(f"audit.path: expected a file path, got {path!r}")
            out["path"] = path
        for key in ("rotate_bytes", "keep", "queue_max_items"):
            if key in value:
                number = value[key]
                try:
                    number = int(number)
                except (TypeError, ValueError):
                    raise ValueError(f"audit.{key}: expected a whole number, got {value[key]!r}") from None
                out[key] = number
        if "log" in value:
            flag = value["log"]
            if isinstance(flag, str):
                flag = flag.strip().lower()
                if flag not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                    raise ValueError(f"audit.log: expected true or false, got {value['log']!r}")
                flag = flag in ("true", "1", "yes", "on")
            out["log"] = bool(flag)
        config = cls(**out)
        if config.rotate_bytes < MIN_ROTATE_BYTES:
            raise ValueError(f"audit.rotate_bytes: at least {MIN_ROTATE_BYTES}, got {config.rotate_bytes}")
        if config.keep < 1:
            raise ValueError(f"audit.keep: at least 1 (rotated files kept), got {config.keep}")
        if config.queue_max_items < 1:
            raise ValueError(f"audit.queue_max_items: must be positive, got {config.queue_max_items}")
        return config
