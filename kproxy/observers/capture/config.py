"""CaptureConfig: where captures go, in which formats, and their limits."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from ...spelling import did_you_mean
from .filters import CaptureFilter
from .kafka_sink import KafkaTarget
from .s3_upload import S3Target

# "kafka": rows shipped to the topic of the ``kafka`` table instead of (or as well as) files.
FORMATS = ("jsonl", "parquet", "pcapng", "kafka")
FILE_FORMATS = ("jsonl", "parquet", "pcapng")
DEFAULT_PREFIX = "kproxy-capture"

# Each file is closed and a new one started above this size (approximate for
# Parquet, whose row groups are compressed as they are written).
DEFAULT_ROTATE_BYTES = 128 * 1024 * 1024
# ... or after this long, if anything was written to it.
DEFAULT_ROTATE_SECONDS = 3600.0
# The files this capture session wrote, open ones included (their full rotate_bytes
# is reserved), stay under this; its oldest are deleted first. Nobody else's files
# count or are ever deleted.
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

# Bounds. Settings can arrive over the admin listener, so each has a ceiling beyond
# which it is a typo or an attack rather than a capture plan.
# One page: smaller files are all header and footer, and a file per row exhausts inodes.
MIN_ROTATE_BYTES = 4096
# Wireshark and pandas read a capture file whole: past this it no longer opens on a laptop.
MAX_ROTATE_BYTES = 16 * 1024 ** 3
# More than any volume kproxy is given; a larger cap would mean no cap at all.
MAX_TOTAL_BYTES = 4 * 1024 ** 4
# max_total_bytes / rotate_bytes: the size cap remembers every file it wrote (~150 bytes
# each) and whoever reads the capture back lists the directory.
MAX_CAPTURE_FILES = 250_000
# A file open longer than a week is not being rotated; it is being forgotten.
MAX_ROTATE_SECONDS = 7 * 24 * 3600.0
# The queue keeps frames alive in memory: past these, a pod's memory limit ends kproxy
# before the queue absorbs anything useful.
MAX_QUEUE_ITEMS = 1_000_000
MAX_QUEUE_BYTES = 1024 ** 3
# Parquet rows wait in memory until a row group is written.
MAX_PARQUET_BATCH_ROWS = 1_000_000
MAX_PARQUET_FLUSH_SECONDS = 3600.0
# File names are <prefix>-<yyyymmddThhmmss>-<seq>.<ext> and stop at 255 bytes.
PREFIX_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")

# name -> (lowest, highest) accepted
_BOUNDS: dict[str, tuple[float, float]] = {
    "rotate_bytes": (MIN_ROTATE_BYTES, MAX_ROTATE_BYTES),
    "max_total_bytes": (MIN_ROTATE_BYTES, MAX_TOTAL_BYTES),
    "rotate_seconds": (0.0, MAX_ROTATE_SECONDS),
    "queue_max_items": (1, MAX_QUEUE_ITEMS),
    "queue_max_bytes": (1, MAX_QUEUE_BYTES),
    "parquet_batch_rows": (1, MAX_PARQUET_BATCH_ROWS),
    "parquet_flush_seconds": (0.0, MAX_PARQUET_FLUSH_SECONDS),
}


@dataclass(frozen=True)
class CaptureConfig:
    """One capture session's settings (frozen; ``from_dict`` validates plain values)."""

    directory: str = ""                     # required when a file format is written
    prefix: str = DEFAULT_PREFIX
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
    kafka: KafkaTarget | None = None        # where the "kafka" format ships rows
    s3: S3Target | None = None              # where closed files are uploaded (s3_upload.py)

    @property
    def file_formats(self) -> tuple[str, ...]:
        return tuple(f for f in self.formats if f in FILE_FORMATS)

    def __post_init__(self) -> None:
        if isinstance(self.formats, str):
            object.__setattr__(self, "formats", tuple(f.strip() for f in self.formats.split(",")))
        else:
            object.__setattr__(self, "formats", tuple(self.formats))
        if not isinstance(self.filter, CaptureFilter):
            object.__setattr__(self, "filter", CaptureFilter.from_dict(self.filter))
        self.validate()

    def validate(self, key: str = "capture") -> None:
        if (self.file_formats or self.directory) and (not self.directory or "\x00" in self.directory):
            raise ValueError(f"{key}.directory: required (a path without NUL bytes)")
        if not PREFIX_PATTERN.fullmatch(self.prefix):
            raise ValueError(f"{key}.prefix: 1-100 letters, digits, '.', '_' or '-', not starting "
                             f"with '.', '_' or '-'; got {self.prefix!r}")
        if not self.formats:
            raise ValueError(f"{key}.formats: at least one of {', '.join(FORMATS)}")
        for fmt in self.formats:
            if fmt not in FORMATS:
                raise ValueError(f"{key}.formats: unknown format {fmt!r} (one of {', '.join(FORMATS)})")
        if len(set(self.formats)) != len(self.formats):
            raise ValueError(f"{key}.formats: listed twice")
        for name, (lowest, highest) in _BOUNDS.items():
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value)):
                raise ValueError(f"{key}.{name}: expected a finite number, got {value!r}")
            if value <= 0 or value < lowest:
                floor = "positive" if lowest <= 1 else f"at least {_show(name, lowest)}"
                raise ValueError(f"{key}.{name}: must be {floor}, got {value}")
            if value > highest:
                raise ValueError(f"{key}.{name}: must be at most {_show(name, highest)}, got {value}")
        if not 0 < self.writer_cpu_share <= 1:
            raise ValueError(f"{key}.writer_cpu_share: must be in (0, 1], got {self.writer_cpu_share}")
        if self.s3 is not None and not self.file_formats:
            raise ValueError(f"{key}.s3: uploads closed files: needs a file format (jsonl, parquet, pcapng)")
        if "kafka" in self.formats and self.kafka is None:
            raise ValueError(f"{key}.formats: \"kafka\" needs the {key}.kafka table (bootstrap, topic)")
        if self.max_total_bytes < self.rotate_bytes * len(self.file_formats):
            raise ValueError(f"{key}.max_total_bytes: must be at least rotate_bytes x formats "
                             f"({self.rotate_bytes * len(self.file_formats)}): open files reserve "
                             f"rotate_bytes each")
        if self.max_total_bytes // self.rotate_bytes > MAX_CAPTURE_FILES:
            raise ValueError(f"{key}.max_total_bytes: at most {MAX_CAPTURE_FILES} x rotate_bytes "
                             f"({MAX_CAPTURE_FILES * self.rotate_bytes}), got {self.max_total_bytes}")
        self.filter.validate(f"{key}.filter")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], key: str = "capture") -> "CaptureConfig":
        """From a config-file table or an admin JSON body; ValueError names the bad key."""
        values = cls._fields_of(data, key)
        if "directory" not in values and set(values.get("formats", ("jsonl",))) & set(FILE_FORMATS):
            raise ValueError(f"{key}.directory: required")     # "kafka" alone writes no files
        return cls(**values)

    def updated(self, data: Mapping[str, Any], key: str = "capture") -> "CaptureConfig":
        """These settings with what ``data`` (an admin JSON body) sets instead."""
        return dataclasses.replace(self, **self._fields_of(data, key))

    def for_worker(self, index: int, workers: int) -> "CaptureConfig":
        """Worker ``index``'s share of these settings: its own files and its part of the disk cap."""
        return dataclasses.replace(self, prefix=worker_prefix(self.prefix, index),
                                   max_total_bytes=self.max_total_bytes // workers)

    @classmethod
    def _fields_of(cls, data: Mapping[str, Any], key: str) -> dict[str, Any]:
        """The settings ``data`` gives (None: not given), typed; ValueError names the bad key."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{key}: expected a table/object")
        names = {f.name: f for f in dataclasses.fields(cls)}
        unknown = set(data) - set(names)
        if unknown:
            name = sorted(unknown)[0]
            raise ValueError(f"{key}.{name}: unknown setting{did_you_mean(str(name), names)}")
        values: dict[str, Any] = {}
        for name, value in data.items():
            if value is None:
                continue
            if name == "filter":
                values[name] = CaptureFilter.from_dict(value, f"{key}.filter")
            elif name == "kafka":
                values[name] = value if isinstance(value, KafkaTarget) else \
                    KafkaTarget.from_dict(value, f"{key}.kafka")
            elif name == "s3":
                values[name] = value if isinstance(value, S3Target) else S3Target.from_dict(value, f"{key}.s3")
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
        return values

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["formats"] = list(self.formats)
        out["filter"] = self.filter.to_dict()
        out["kafka"] = self.kafka.to_dict() if self.kafka is not None else None
        out["s3"] = self.s3.to_dict() if self.s3 is not None else None
        return out


def worker_prefix(prefix: str, index: int) -> str:
    """The file prefix of worker ``index`` (``kproxy run --workers N``): files never collide."""
    return f"{prefix}-w{index}"


def _show(name: str, limit: float) -> str:
    """A bound as the error message shows it: ``17179869184 (16 GiB)``."""
    if not name.endswith("_bytes") or limit < 1024:
        return f"{limit:g}"
    for unit, size in (("TiB", 1024 ** 4), ("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if limit >= size:
            return f"{int(limit)} ({limit / size:g} {unit})"
    return str(limit)


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
        if isinstance(value, float) and not math.isfinite(value):     # JSON allows NaN, Infinity, 1e999
            raise ValueError(value)
        return kind(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{key}: expected a finite number, got {value!r}") from None


_UNITS = {"": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024 ** 2, "mb": 1024 ** 2, "mib": 1024 ** 2,
          "g": 1024 ** 3, "gb": 1024 ** 3, "gib": 1024 ** 3}


def _size(text: str) -> int:
    """``"256MiB"``, ``"2g"``, ``"1000"`` → bytes (binary units)."""
    text = text.strip().lower()
    digits = text.rstrip("abcdefghijklmnopqrstuvwxyz ")
    unit = text[len(digits):].strip()
    if unit not in _UNITS:
        raise ValueError(text)
    return int(float(digits) * _UNITS[unit])        # int(inf) raises OverflowError: refused
