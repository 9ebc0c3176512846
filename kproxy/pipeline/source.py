"""Capture files in, one normalised DataFrame out.

``resolve_inputs`` turns what a user typed (files, capture directories,
globs, Hadoop URIs) into a list of capture files of one format, refusing with
a one-line ``InputError`` what cannot be a capture: a missing path, a pcapng
file, a Parquet file of another schema or a newer capture version.
``read_capture`` reads them with the newest capture schema, so v1 files get
null v2 columns, and adds the derived columns every question shares (``prepare``); ``load.load_capture``
is the entry that also reads a Kafka topic or an S3 bucket.

The Spark schema is derived from the capture writer's own Arrow schema
(``observers.capture.parquet.SCHEMA``): one definition of the columns.
"""

from __future__ import annotations

import datetime as dt
import glob
import json
import os
import re
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import urlparse

from ..observers.capture.parquet import SCHEMA as ARROW_SCHEMA
from ..observers.capture.summary import SCHEMA_VERSION

# Formats the pipeline reads; pcapng is for Wireshark and carries no pair rows.
FORMATS = ("parquet", "jsonl")
_EXTENSIONS = {"parquet": (".parquet",), "jsonl": (".jsonl", ".jsonl.gz")}
_IGNORED = (".pcapng",)
SCHEMA_VERSION_KEY = b"kproxy.capture.schema_version"
# A capture file name: <prefix>-<UTC yyyymmddThhmmss>-<seq>.<ext> (see observers/capture/files.py).
_FILE_NAME = re.compile(r"^(?P<prefix>.+)-(?P<stamp>\d{8}T\d{6})-(?P<seq>\d+)\.(?P<ext>[a-z.]+)$")
# Columns no question reads: left out of the cached frame.
_UNUSED = ("upstream_host", "upstream_port", "listener", "compression", "decode_error",
           "topic_ids")          # used (batch) by topic_ids.resolve_topic_ids, before prepare
LONG_POLL_APIS = ("Fetch", "ShareFetch")
_TIME_COLUMNS = ("time", "connection_start")


class InputError(ValueError):
    """What the user asked to read cannot be read as a kproxy capture (one line, for the CLI)."""


@dataclass(frozen=True)
class Inputs:
    """Capture files of one format, and what was set aside while finding them."""
    files: tuple[str, ...]
    format: str
    skipped: tuple[str, ...] = ()          # e.g. "12 .jsonl files (the .parquet files hold the same pairs)"
    pruned: int = 0                        # files left out because they end before --since
    pairs: int | None = None               # rows in the files, when their footers say (Parquet)
    row_groups: int | None = None          # Parquet row groups in the files (their footers)


def is_uri(path: str) -> bool:
    """A Hadoop URI (``s3a://``, ``hdfs://``), not a local path (``file:`` counts as local)."""
    scheme = urlparse(path).scheme
    return len(scheme) > 1 and scheme != "file"       # "C:" is not a scheme


def local_path(path: str) -> str:
    """A local path or ``file:`` URI as a plain path."""
    return urlparse(path).path if path.startswith("file:") else path


def format_of(name: str) -> str | None:
    """``parquet`` or ``jsonl`` from a capture file's extension, None for anything else."""
    for fmt, extensions in _EXTENSIONS.items():
        if name.endswith(extensions):
            return fmt
    return None


class CaptureName(NamedTuple):
    """What a capture file's name says: the session it belongs to and its place in it."""
    session: tuple[str, str, str]          # (directory, prefix, extension): one rotating series
    stamp: str                             # UTC yyyymmddThhmmss the file was opened
    seq: int

    @property
    def opened(self) -> dt.datetime:
        return dt.datetime.strptime(self.stamp, "%Y%m%dT%H%M%S").replace(tzinfo=dt.timezone.utc)


def capture_name(path: str) -> CaptureName | None:
    """Parse ``<prefix>-<stamp>-<seq>.<ext>``; None for a file named otherwise."""
    match = _FILE_NAME.match(os.path.basename(path))
    if match is None:
        return None
    return CaptureName((os.path.dirname(path), match["prefix"], match["ext"]), match["stamp"], int(match["seq"]))


def resolve_inputs(paths: list[str], fmt: str = "auto", since: dt.datetime | None = None) -> Inputs:
    """Expand PATH arguments into capture files. Raises InputError with a one-line reason."""
    if fmt not in ("auto", *FORMATS):
        raise InputError(f"--format must be auto, parquet or jsonl, got {fmt!r}")
    if not paths:
        raise InputError("no capture path given")
    found: list[str] = []
    remote: list[str] = []
    for path in paths:
        if is_uri(path):
            remote.append(path)
            continue
        local = local_path(path)
        if any(ch in local for ch in "*?["):
            matches = sorted(glob.glob(local))
            if not matches:
                raise InputError(f"no capture files match {path}")
            found.extend(m for m in matches if os.path.isfile(m))
        elif os.path.isdir(local):
            entries = sorted(os.path.join(local, n) for n in os.listdir(local))
            found.extend(e for e in entries if os.path.isfile(e) and format_of(e))
        elif os.path.isfile(local):
            if local.endswith(_IGNORED):
                raise InputError(f"{path}: pcapng is for Wireshark; analyze reads the .parquet or "
                                 f".jsonl files of a capture")
            if format_of(local) is None:
                raise InputError(f"{path}: not a capture file (expected .parquet or .jsonl)")
            found.append(local)
        else:
            raise InputError(f"no such file or directory: {path}")
    if remote:
        if found:
            raise InputError("mix of local paths and URIs: give one kind per run")
        chosen = "parquet" if fmt == "auto" else fmt
        return Inputs(tuple(remote), chosen)
    by_format = {f: [p for p in found if format_of(p) == f] for f in FORMATS}
    if fmt == "auto":
        # A capture written in both formats holds the same pairs twice: read Parquet (faster).
        fmt = "parquet" if by_format["parquet"] else "jsonl"
    files = by_format[fmt]
    skipped = tuple(f"{len(v)} {k} files (the {fmt} files hold the same pairs)"
                    for k, v in by_format.items() if k != fmt and v)
    if not files:
        wanted = "capture files (.parquet or .jsonl)" if not found else f"{fmt} capture files"
        raise InputError(f"no {wanted} in {' '.join(paths)}")
    kept, pruned = prune_before(files, since) if since is not None else (files, 0)
    counts = [_check(path, fmt) for path in kept]
    rows = sum(rows for rows, _ in counts)
    if rows == 0:
        raise InputError(f"the capture in {' '.join(paths)} holds no request/response pairs")
    if fmt != "parquet":
        return Inputs(tuple(kept), fmt, skipped, pruned)
    return Inputs(tuple(kept), fmt, skipped, pruned, rows, sum(groups for _, groups in counts))


def prune_before(files: list[str], since: dt.datetime) -> tuple[list[str], int]:
    """Leave out files that end before ``since``, known from their names alone.

    A file of one capture session ends when the next one (same directory, prefix
    and extension) begins, and every row in it was written, hence timed, before
    that: the next name's second plus one is a safe upper bound. No such bound
    exists for a file's first row (an unanswered request can be hours old when
    the connection closes), so ``--until`` is left to Parquet's row-group statistics.
    """
    series: dict[tuple[str, str, str], list[tuple[CaptureName, str]]] = {}
    kept: list[str] = []
    for path in files:
        name = capture_name(path)
        if name is None:
            kept.append(path)
            continue
        series.setdefault(name.session, []).append((name, path))
    pruned = 0
    for entries in series.values():
        entries.sort()
        for (_, path), following in zip(entries, entries[1:] + [None]):
            if following is not None and following[0].opened + dt.timedelta(seconds=1) <= since:
                pruned += 1
                continue
            kept.append(path)
    return sorted(kept), pruned


def check_file(path: str, fmt: str) -> int:
    """Refuse a file that is not a kproxy capture of a version this pipeline reads.

    Returns its row count when the footer says (Parquet), else 1 for a non-empty file.
    """
    return _check(path, fmt)[0]


def _check(path: str, fmt: str) -> tuple[int, int]:
    """``check_file``, and the file's Parquet row groups (0 for JSONL)."""
    groups = 0
    if fmt == "parquet":
        import pyarrow.parquet as pq
        try:
            metadata = pq.read_metadata(path)
        except Exception as exc:        # pyarrow raises several types for a non-Parquet file
            raise InputError(f"{path}: not a Parquet file ({exc})") from None
        schema = metadata.schema.to_arrow_schema()
        raw = (schema.metadata or {}).get(SCHEMA_VERSION_KEY)
        if raw is None or "capture_version" not in schema.names:
            raise InputError(f"{path}: a Parquet file without kproxy's capture schema")
        version, rows, groups = int(raw), metadata.num_rows, metadata.num_row_groups
    else:
        if path.endswith(".gz"):
            return 1, 0                  # checked row by row once Spark reads it
        with open(path, "rb") as f:
            first = f.readline()
        if not first.strip():
            return 0, 0                  # an empty file: nothing to misread
        rows = 1
        try:
            version = json.loads(first)["capture_version"]
        except (ValueError, KeyError, TypeError):
            raise InputError(f"{path}: not a kproxy JSONL capture (no capture_version)") from None
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise InputError(f"{path}: capture schema version {version}; this kproxy reads up to "
                         f"{SCHEMA_VERSION} (upgrade kproxy)")
    return rows, groups


# ------------------------------------------------------------------ Spark side

def spark_schema(for_json: bool = False):
    """The newest capture schema as a Spark StructType (JSONL: timestamps read as text)."""
    import pyarrow as pa
    from pyspark.sql import types as T

    def convert(arrow_type):
        if pa.types.is_timestamp(arrow_type):
            return T.StringType() if for_json else T.TimestampType()
        if pa.types.is_list(arrow_type):
            return T.ArrayType(convert(arrow_type.value_type))
        if pa.types.is_struct(arrow_type):
            return T.StructType([T.StructField(f.name, convert(f.type)) for f in arrow_type])
        return {pa.int16(): T.ShortType(), pa.int32(): T.IntegerType(), pa.int64(): T.LongType(),
                pa.float64(): T.DoubleType(), pa.string(): T.StringType(),
                pa.bool_(): T.BooleanType()}[arrow_type]

    return T.StructType([T.StructField(f.name, convert(f.type)) for f in ARROW_SCHEMA])


def read_capture(spark, inputs: Inputs):
    """The raw rows of the capture files, every column of the newest schema."""
    # A directory URI may hold the other formats too (pcapng, JSONL beside Parquet): read only ours.
    return read_with(spark.read, inputs.format, list(inputs.files))


def read_with(reader, fmt: str, location):
    """Capture rows through a batch or streaming reader: the schema, only our files, JSONL times."""
    from pyspark.sql import functions as F
    if fmt == "parquet":
        return reader.schema(spark_schema()).option("pathGlobFilter", "*.parquet").parquet(
            *(location if isinstance(location, list) else [location]))
    df = (reader.schema(spark_schema(for_json=True)).option("mode", "PERMISSIVE")
          .option("pathGlobFilter", "*.jsonl*").json(location))
    for name in _TIME_COLUMNS:
        df = df.withColumn(name, F.col(name).cast("timestamp"))
    return df


def prepare(df, since: dt.datetime | None = None, until: dt.datetime | None = None):
    """The columns every question shares, filtered to [since, until).

    ``long_poll``: a Fetch/ShareFetch answered with no records, which waited for
    ``max.wait.ms`` by design; its latency is kept apart (as the metrics do).
    ``end_time``: when the response arrived (request time for rows without one).
    ``conn_key``: a connection across merged captures (ids restart with a process): a
    struct of the three columns, which Spark compares as they are; a string of them cost
    every connection-keyed table a timestamp formatted per row (twice the time at 10 M pairs).
    """
    from pyspark.sql import functions as F
    if since is not None:
        df = df.where(F.col("time") >= F.lit(since))
    if until is not None:
        df = df.where(F.col("time") < F.lit(until))
    answered = F.col("outcome") == "response"
    return (df.drop(*_UNUSED)
            .withColumn("long_poll", answered & F.col("api_name").isin(*LONG_POLL_APIS)
                        & (F.coalesce(F.col("record_count"), F.lit(0)) == 0))
            .withColumn("has_error", F.col("error_count") > 0)
            .withColumn("throttled", F.coalesce(F.col("throttle_ms"), F.lit(0)) > 0)
            .withColumn("end_time", F.timestamp_micros(
                F.unix_micros("time") + F.coalesce(F.col("latency_ms") * 1000.0, F.lit(0.0)).cast("long")))
            .withColumn("conn_key", F.struct("proxy_instance", "connection_start", "connection_id")))
