"""Where the shared pairs are kept, by the capture's format and size (no Spark needed)."""

from __future__ import annotations

from kproxy.pipeline.scan import MEMORY_SCAN_MAX_PAIRS, Kept, where_kept
from kproxy.pipeline.source import Inputs


def test_small_parquet_in_memory_large_parquet_from_files_text_on_disk():
    assert where_kept(Inputs(("a.parquet",), "parquet", pairs=MEMORY_SCAN_MAX_PAIRS)) is Kept.MEMORY
    assert where_kept(Inputs(("a.parquet",), "parquet", pairs=MEMORY_SCAN_MAX_PAIRS + 1)) is Kept.FILES
    assert where_kept(Inputs(("s3a://b/c",), "parquet")) is Kept.FILES        # size unknown
    assert where_kept(Inputs(("a.jsonl",), "jsonl")) is Kept.DISK
    assert where_kept(Inputs(("kafka://h:9092/t",), "kafka")) is Kept.DISK
