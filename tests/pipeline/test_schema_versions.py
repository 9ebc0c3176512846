"""The pipeline reads capture files of every schema version side by side (older ones get
null for the columns they lack), and refuses a newer version with one line."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kproxy.observers.capture import SCHEMA_VERSION, Capture, CaptureConfig
from kproxy.observers.capture.parquet import SCHEMA
from kproxy.pipeline.load import load_capture
from kproxy.pipeline.source import InputError, check_file
from tests.observers.captures import (V2_COLUMNS, V3_COLUMNS, V4_COLUMNS, Link, produce_request, produce_response, sasl_plain,
                                      v1_rows)


def write_old(directory, version: int, columns_left_out: list[str], seq: int):
    schema = pa.schema([f for f in SCHEMA if f.name not in columns_left_out],
                       metadata={b"kproxy.capture.schema_version": str(version).encode()})
    rows = [dict(r, capture_version=version, connection_id=100 * version) for r in v1_rows()]
    columns = {name: [r.get(name) for r in rows] for name in schema.names}
    columns["time"] = [int(t * 1_000_000) for t in columns["time"]]
    path = directory / f"kproxy-capture-20231114T22132{seq}-00000{seq}.parquet"
    pq.write_table(pa.Table.from_pydict(columns, schema=schema), path)
    return path


def test_versions_1_to_4_read_together(spark, tmp_path):
    write_old(tmp_path, 1, V2_COLUMNS + V3_COLUMNS + V4_COLUMNS, 1)
    write_old(tmp_path, 2, V3_COLUMNS + V4_COLUMNS, 2)
    write_old(tmp_path, 3, V4_COLUMNS, 3)
    capture = Capture()
    capture.start(CaptureConfig(directory=str(tmp_path), formats=("parquet",)))
    link = Link(capture, conn_id=400)
    sasl_plain(link, "heidi")
    link.exchange(0, 9, 3, produce_request(), produce_response())
    link.close(capture)
    capture.stop()
    _, df = load_capture(spark, [str(tmp_path)])
    got = sorted((r.connection_id, r.api_name, r.principal)
                 for r in df.select("connection_id", "api_name", "principal").collect())
    assert got == sorted([(100, "Produce", None)] * 3 + [(200, "Produce", None)] * 3 + [(300, "Produce", None)] * 3 + [
        (400, "SaslHandshake", None), (400, "SaslAuthenticate", "heidi"), (400, "Produce", "heidi")])
    answers = [r.partition_answers for r in df.where("connection_id = 400 and api_name = 'Produce'").collect()]
    assert [[(a.topic, a.partition, a.error) for a in found] for found in answers] == [[("orders", 0, "NONE")]]


def test_a_newer_version_is_refused_with_one_line(tmp_path):
    path = tmp_path / "kproxy-capture-20231114T221320-000001.jsonl"
    path.write_text(json.dumps({"capture_version": SCHEMA_VERSION + 1}) + "\n")
    with pytest.raises(InputError, match=f"reads up to {SCHEMA_VERSION}"):
        check_file(str(path), "jsonl")
    assert check_file(str(write_old(tmp_path, 2, V3_COLUMNS + V4_COLUMNS, 2)), "parquet") == 3
