"""CaptureConfig: where captures go, in which formats, and their limits."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from .filters import CaptureFilter

FORMATS = ("jsonl", "parquet", "pcapng")

# Each file is closed and a new one started above this size (approximate for
# Parquet, whose row groups are compressed as they are written).
DEFAULT_ROTATE_BYTES = 128 * 1024 * 1024
# ... or after this long, if anything was written to it.
DEFAULT_ROTATE_SECONDS = 3600.0
# All capture files with our prefix in the directory, open ones included (their
# full rotate_bytes is reserved), stay under this; the oldest are deleted first.
DEFAULT_MAX_TOTAL_BYTES = 2 * 1024 * 1024 * 1024
# The queue between the event loop and the writer thread. When either bound is
# hit, events are dropped and counted; the relay never waits for the disk.
# 64 MiB is ~60 full-size (1 MiB) fetch responses: a few hundred ms of burst.
DEFAULT_QUEUE_ITEMS = 20_000
DEFAULT_QUEUE_BYTES = 64 * 1024 * 1024
# The writer thread shares the interpreter lock with the relay: past this share of
# one core (its own CPU time over wall time) it pauses, the queue fills and events
# are dropped and counted instead, so a busy capture cannot starve forwarding.
DEFAULT_WRITER_CPU_SHARE = 0.25
# Parquet rows are buffered and written as one row group every N rows or T seconds.
DEFAULT_PARQUET_BATCH_ROWS = 1000
DEFAULT_PARQUET_FLUSH_SECONDS = 1.0


@dataclass(frozen=True)
class CaptureConfig:
    """One capture session's settings (frozen; ``from_dict`` validates plain values)."""

    directory: str
    prefix: str = "kproxy-capture"
    formats: tuple[str, ...] = ("jsonl",)
    filter: CaptureFilter = field(default_factory=CaptureFilter)
    include_bodies: bool = True             # JSONL: decoded request/response bodies
    include_record_data: bool = False       # record keys, values, header values (all formats)
    record_unanswered: bool = True          # a row for requests still unanswered at close
    rotate_bytes: int = DEFAULT_ROTATE_BYTES
    rotate_seconds: float = DEFAULT_ROTATE_SECONDS
    max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES
    queue_max_items: int = DEFAULT_QUEUE_ITEMS
    queue_max_bytes: int = DEFAULT_QUEUE_BYTES
    parquet_batch_rows: int = DEFAULT_PARQUET_BATCH_ROWS
    parquet_flush_seconds: float = DEFAULT_PARQUET_FLUSH_SECONDS
    writer_cpu_share: float = DEFAULT_WRITER_CPU_SHARE

    def __post_init__(self) -> None:
        if isinstance(self.formats, str):
            object.__setattr__(self, "formats", tuple(f.strip() for f in self.formats.split(",")))
        else:
            object.__setattr__(self, "formats", tuple(self.formats))
        if not isinstance(self.filter, CaptureFilter):
            object.__setattr__(self, "filter", CaptureFilter.from_dict(self.filter))
        self.validate()

    def validate(self, key: str = "capture") -> None:
        if not self.directory:
            raise ValueError(f"{key}.directory: required")
        if not self.prefix or "/" in self.prefix or self.prefix.startswith("."):
            raise ValueError(f"{key}.prefix: must be a plain file name prefix, got {self.prefix!r}")
        if not self.formats:
            raise ValueError(f"{key}.formats: at least one of {', '.join(FORMATS)}")
        for fmt in self.formats:
            if fmt not in FORMATS:
                raise ValueError(f"{key}.formats: unknown format {fmt!r} (one of {', '.join(FORMATS)})")
        if len(set(self.formats)) != len(self.formats):
            raise ValueError(f"{key}.formats: listed twice")
        for name in ("rotate_bytes", "max_total_bytes", "queue_max_items", "queue_max_bytes",
                     "parquet_batch_rows"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{key}.{name}: must be positive, got {getattr(self, name)}")
        for name in ("rotate_seconds", "parquet_flush_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{key}.{name}: must be positive, got {getattr(self, name)}")
        if not 0 < self.writer_cpu_share <= 1:
            raise ValueError(f"{key}.writer_cpu_share: must be in (0, 1], got {self.writer_cpu_share}")
        if self.max_total_bytes < self.rotate_bytes * len(self.formats):
            raise ValueError(f"{key}.max_total_bytes: must be at least rotate_bytes x formats "
                             f"({self.rotate_bytes * len(self.formats)}): open files reserve "
                             f"rotate_bytes each")
        self.filter.validate(f"{key}.filter")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], key: str = "capture") -> "CaptureConfig":
        """From a config-file table or an admin JSON body; ValueError names the bad key."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{key}: expected a table/object")
        names = {f.name: f for f in dataclasses.fields(cls)}
        unknown = set(data) - set(names)
        if unknown:
            raise ValueError(f"{key}.{sorted(unknown)[0]}: unknown setting")
        values: dict[str, Any] = {}
        for name, value in data.items():
            if value is None:
                continue
            if name == "filter":
                values[name] = CaptureFilter.from_dict(value, f"{key}.filter")
            elif name == "formats":
                values[name] = tuple(v.strip() for v in value.split(",")) if isinstance(value, str) \
                    else tuple(str(v) for v in value)
            elif name in ("directory", "prefix"):
                values[name] = str(value)
            elif name in ("include_bodies", "include_record_data", "record_unanswered"):
                values[name] = _bool(value, f"{key}.{name}")
            elif name in ("rotate_seconds", "parquet_flush_seconds", "writer_cpu_share"):
                values[name] = _number(value, float, f"{key}.{name}")
            else:
                values[name] = _number(value, int, f"{key}.{name}")
        if "directory" not in values:
            raise ValueError(f"{key}.directory: required")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["formats"] = list(self.formats)
        out["filter"] = self.filter.to_dict()
        return out


def _bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
        return value.lower() in ("true", "1", "yes", "on")
    raise ValueError(f"{key}: expected true or false, got {value!r}")


def _number(value: Any, kind: type, key: str):
    if isinstance(value, bool):
        raise ValueError(f"{key}: expected a number, got {value!r}")
    try:
        if kind is int and isinstance(value, str):
            return _size(value)
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key}: expected a number, got {value!r}") from None


_UNITS = {"": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024 ** 2, "mb": 1024 ** 2, "mib": 1024 ** 2,
          "g": 1024 ** 3, "gb": 1024 ** 3, "gib": 1024 ** 3}


def _size(text: str) -> int:
    """``"256MiB"``, ``"2g"``, ``"1000"`` → bytes (binary units)."""
    text = text.strip().lower()
    digits = text.rstrip("abcdefghijklmnopqrstuvwxyz ")
    unit = text[len(digits):].strip()
    if unit not in _UNITS:
        raise ValueError(text)
    return int(float(digits) * _UNITS[unit])
