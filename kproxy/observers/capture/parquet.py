"""Parquet capture: the summary columns of every request/response pair, zstd, in row groups.

Schema version 4 (``SCHEMA_VERSION``; also in each file's key-value metadata
as ``kproxy.capture.schema_version`` and in the ``capture_version`` column).
Bodies are not stored (use JSONL for those). Timestamps are microseconds,
UTC (Spark rejects nanoseconds). A new schema version only ever adds
nullable columns at the end and never changes an existing one, so readers
of version N read version N+1 files; a version 1 file simply lacks the
columns marked (v2), (v3) and (v4), a version 2 file those marked (v3) and
(v4), a version 3 file those marked (v4), which a reader takes as null.

=======================  ================================  ===============================================
column                   type                              meaning
=======================  ================================  ===============================================
capture_version          int16                             schema version of this row (4)
time                     timestamp[us, tz=UTC]             when the request was complete at kproxy
connection_id            int64                             kproxy's connection id (per process)
client_host              string                            client address (a PROXY protocol header's, if one named it)
client_port              int32
listener                 string                            "bootstrap" or "broker-<node id>"
upstream_host            string                            broker address kproxy connected to
upstream_port            int32
node_id                  int32, null                       upstream node id, if known
client_id                string, null                      request header client_id
api_key                  int16
api_name                 string                            Kafka's name, e.g. "Produce"
api_version              int16
correlation_id           int32
outcome                  string                            response / no_response (acks=0) / unanswered
latency_ms               float64, null                     request complete → response complete
request_size             int32                             request frame bytes incl. size prefix
response_size            int32, null                       response frame bytes incl. size prefix
throttle_ms              int32, null                       response throttle_time_ms, if it has one
error_count              int32                             non-zero error codes in the response
errors                   list<string>                      distinct error names, in order seen
topics                   list<string>                      topics named by request or response
partition_count          int32                             distinct topic-partitions named
record_count             int64, null                       records (batch headers); null: no records field
record_bytes             int64, null                       record batch bytes
batch_count              int32, null                       record batches
compression              list<string>                      codecs of those batches
topic_records            list<struct<topic: string,        per-topic records and bytes
                         record_count: int64,
                         record_bytes: int64>>, null
decode_error             string, null                      why a frame could not be decoded
proxy_instance           string, null (v2)                 kproxy's instance_name (default: host name)
connection_start         timestamp[us, tz=UTC], null (v2)  when kproxy accepted the client connection
client_software_name     string, null (v2)                 the connection's client software as of this pair:
                                                           its latest ApiVersions v3+ the broker accepted
client_software_version  string, null (v2)                 (same)
group_id                 string, null (v2)                 group APIs: the group (first of a batch)
member_id                string, null (v2)                 the member the broker knows
generation               int32, null (v2)                  generation / KIP-848 member epoch
principal                string, null (v3)                 the SASL PLAIN/SCRAM user the broker accepted,
                                                           else the verified client certificate's subject
client_instance_id       string, null (v4)                 KIP-714 telemetry pairs: the client instance
telemetry_metrics        list<struct<name: string,         PushTelemetry: the data points pushed
                         attributes: string,
                         value: float64>>, null (v4)
partition_answers        list<struct<topic: string,        Produce, Fetch, Metadata answers: per partition
                         partition: int32, error: string,  its error name, and a leader with its epoch
                         leader_id: int32,                 (Metadata: the leader; Produce/Fetch: the
                         leader_epoch: int32>>, null (v4)  KIP-951 hint, else null)
=======================  ================================  ===============================================
"""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.parquet as pq

from .files import RotatingSink
from .summary import SCHEMA_VERSION

COMPRESSION = "zstd"

_TOPIC_RECORDS = pa.struct([("topic", pa.string()), ("record_count", pa.int64()),
                            ("record_bytes", pa.int64())])

_TELEMETRY_METRIC = pa.struct([("name", pa.string()), ("attributes", pa.string()),
                               ("value", pa.float64())])
_TOPIC_IDS = pa.struct([("topic_id", pa.string()), ("topic", pa.string())])
# Per partition of a Produce, Fetch or Metadata answer (protocol.failover.PartitionAnswer).
_PARTITION_ANSWER = pa.struct([("topic", pa.string()), ("partition", pa.int32()), ("error", pa.string()),
                               ("leader_id", pa.int32()), ("leader_epoch", pa.int32())])

SCHEMA = pa.schema([
    ("capture_version", pa.int16()),
    ("time", pa.timestamp("us", tz="UTC")),
    ("connection_id", pa.int64()),
    ("client_host", pa.string()),
    ("client_port", pa.int32()),
    ("listener", pa.string()),
    ("upstream_host", pa.string()),
    ("upstream_port", pa.int32()),
    ("node_id", pa.int32()),
    ("client_id", pa.string()),
    ("api_key", pa.int16()),
    ("api_name", pa.string()),
    ("api_version", pa.int16()),
    ("correlation_id", pa.int32()),
    ("outcome", pa.string()),
    ("latency_ms", pa.float64()),
    ("request_size", pa.int32()),
    ("response_size", pa.int32()),
    ("throttle_ms", pa.int32()),
    ("error_count", pa.int32()),
    ("errors", pa.list_(pa.string())),
    ("topics", pa.list_(pa.string())),
    ("partition_count", pa.int32()),
    ("record_count", pa.int64()),
    ("record_bytes", pa.int64()),
    ("batch_count", pa.int32()),
    ("compression", pa.list_(pa.string())),
    ("topic_records", pa.list_(_TOPIC_RECORDS)),
    ("decode_error", pa.string()),
    # version 2
    ("proxy_instance", pa.string()),
    ("connection_start", pa.timestamp("us", tz="UTC")),
    ("client_software_name", pa.string()),
    ("client_software_version", pa.string()),
    ("group_id", pa.string()),
    ("member_id", pa.string()),
    ("generation", pa.int32()),
    # version 3
    ("principal", pa.string()),
    # version 4
    ("client_instance_id", pa.string()),
    ("telemetry_metrics", pa.list_(_TELEMETRY_METRIC)),
    ("topic_ids", pa.list_(_TOPIC_IDS)),          # id -> name pairs this row knows (Metadata answers, ids resolved)
    ("partition_answers", pa.list_(_PARTITION_ANSWER)),
], metadata={b"kproxy.capture.schema_version": str(SCHEMA_VERSION).encode()})

COLUMNS = tuple(SCHEMA.names)
_STRING_COLUMNS = ("client_host", "listener", "upstream_host", "client_id", "api_name", "outcome",
                   "decode_error", "proxy_instance", "client_software_name", "client_software_version",
                   "group_id", "member_id", "principal", "client_instance_id")


def _text(value):
    """Strings that are valid UTF-8 (the codec keeps undecodable bytes as surrogates)."""
    if value is None or value.isascii():
        return value
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


class ParquetSink(RotatingSink):
    ext = ".parquet"

    def __init__(self, files, counters, batch_rows: int, flush_seconds: float):
        super().__init__(files)
        self.counters = counters
        self.batch_rows = batch_rows
        self.flush_seconds = flush_seconds
        self.columns: dict[str, list] = {name: [] for name in COLUMNS}
        self.pending = 0
        self.last_flush = time.monotonic()
        self.writer: pq.ParquetWriter | None = None

    def on_open(self) -> None:
        self.writer = pq.ParquetWriter(self.file, SCHEMA, compression=COMPRESSION)

    def on_close(self) -> None:
        self._write_pending()
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def close(self) -> None:
        if self.pending:
            self.ensure_open()          # rows buffered after a rotation still get written
        super().close()

    def write(self, row: dict) -> None:
        columns = self.columns
        for name in COLUMNS:
            columns[name].append(row[name])
        self.pending += 1
        if self.pending >= self.batch_rows:
            self.flush()

    def flush(self) -> None:
        """Write buffered rows as one row group; rotate if the file is now big enough."""
        self._write_pending()
        if self.file is not None and self.items_in_file and self.size() >= self.files.rotate_bytes:
            self.rotate()

    def _write_pending(self) -> None:
        if not self.pending:
            return
        self.ensure_open()
        columns = self.columns
        self.columns = {name: [] for name in COLUMNS}
        pending, self.pending = self.pending, 0
        try:
            columns["time"] = [int(round(t * 1_000_000)) for t in columns["time"]]
            columns["connection_start"] = [None if t is None else int(round(t * 1_000_000))
                                           for t in columns["connection_start"]]
            for name in _STRING_COLUMNS:
                columns[name] = [_text(v) for v in columns[name]]
            columns["topics"] = [[_text(t) for t in topics] for topics in columns["topics"]]
            columns["topic_records"] = [
                None if entries is None else [dict(e, topic=_text(e["topic"])) for e in entries]
                for entries in columns["topic_records"]]
            columns["topic_ids"] = [
                None if pairs is None else [dict(e, topic=_text(e["topic"])) for e in pairs]
                for pairs in columns["topic_ids"]]
            columns["partition_answers"] = [
                None if answers is None else [dict(a, topic=_text(a["topic"])) for a in answers]
                for answers in columns["partition_answers"]]
            table = pa.Table.from_pydict(columns, schema=SCHEMA)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            self.counters.row_errors += pending - 1      # the writer counts the one that raised
            raise
        before = self.size()
        self.writer.write_table(table)
        self.items_in_file += pending
        self.counters.bytes_written += max(self.size() - before, 0)
        self.last_flush = time.monotonic()

    def tick(self, now: float) -> None:
        if self.pending and now - self.last_flush >= self.flush_seconds:
            self.flush()
        super().tick(now)
