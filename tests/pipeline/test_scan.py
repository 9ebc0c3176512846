"""Where the shared pairs are kept, by the capture's format, size and row groups."""

from __future__ import annotations

import dataclasses
import os

from kproxy.pipeline import tables as T
from kproxy.pipeline.scan import (COMPACT_BELOW_ROWS_PER_GROUP, MEMORY_SCAN_MAX_PAIRS, UNREAD_COLUMNS, Kept,
                                  shared_scan, where_kept)
from kproxy.pipeline.load import load_capture
from kproxy.pipeline.source import Inputs
from kproxy.pipeline.synthetic import write_synthetic


def test_small_parquet_in_memory_large_parquet_from_files_text_on_disk():
    assert where_kept(Inputs(("a.parquet",), "parquet", pairs=MEMORY_SCAN_MAX_PAIRS)) is Kept.MEMORY
    assert where_kept(Inputs(("a.parquet",), "parquet", pairs=MEMORY_SCAN_MAX_PAIRS + 1)) is Kept.FILES
    assert where_kept(Inputs(("s3a://b/c",), "parquet")) is Kept.FILES        # size unknown
    assert where_kept(Inputs(("a.jsonl",), "jsonl")) is Kept.DISK
    assert where_kept(Inputs(("kafka://h:9092/t",), "kafka")) is Kept.DISK


def test_large_captures_in_small_row_groups_are_rewritten_unless_spark_is_remote():
    small_groups = Inputs(("a.parquet",), "parquet", pairs=MEMORY_SCAN_MAX_PAIRS + 1,
                          row_groups=(MEMORY_SCAN_MAX_PAIRS + 1) // 1000)
    assert where_kept(small_groups) is Kept.COMPACTED
    assert where_kept(small_groups, local=False) is Kept.FILES     # executors do not see the driver's disk
    large_groups = Inputs(("a.parquet",), "parquet", pairs=10 * COMPACT_BELOW_ROWS_PER_GROUP, row_groups=10)
    assert where_kept(large_groups) is Kept.FILES


def test_rewritten_pairs_are_read_from_their_directory_until_released(spark, tmp_path):
    """The pairs rewritten into large row groups are what the tables read (every table is
    compared in test_tables.py), and release removes them."""
    write_synthetic(str(tmp_path / "cap"), 3_000, files=1, seed=3, row_group_rows=100)
    inputs, pairs = load_capture(spark, [str(tmp_path / "cap")])
    assert (inputs.pairs, inputs.row_groups) == (3_000, 30)
    scan = shared_scan(pairs, dataclasses.replace(inputs, pairs=MEMORY_SCAN_MAX_PAIRS + 1))
    assert scan.kept is Kept.COMPACTED
    assert scan.pairs.inputFiles() and all(scan.directory in f for f in scan.pairs.inputFiles())
    direct = pairs.drop(*UNREAD_COLUMNS)
    assert T.api_latency(scan.pairs).collect() == T.api_latency(direct).collect()
    scan.release()
    assert not os.path.exists(scan.directory)
