"""The pairs every table of one run reads: projected once, and kept where keeping pays.

``shared_scan`` narrows the prepared pairs to the columns the tables read (derived
columns already computed by ``source.prepare``) and decides, by the capture's format
and size, whether Spark keeps them for the tables or each table reads the files again:

- small Parquet captures are kept in memory (spilling to disk): their tables are each
  a few tiny jobs, and a task that reads cached batches skips opening the files and
  their footers;
- larger Parquet captures are read again by each table, only the columns it needs:
  Spark's vectorized Parquet reader was cheaper than building and reading a cache, and
  needs no heap for it;
- larger Parquet captures in small row groups (kproxy's writer closes one per flush, about
  1,000 rows) are rewritten once, narrowed, into large row groups in a local temporary
  directory (local Spark only), which the tables then read: every table would otherwise
  decode every small group's pages and dictionaries again;
- JSONL (and Kafka topics) are parsed once into a disk cache instead of once per table.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from enum import Enum
from typing import Callable

from pyspark import StorageLevel
from pyspark.sql import DataFrame

from .source import Inputs

# Columns of the prepared pairs that no table reads (``topic_records`` carries the bytes per
# topic that ``topics`` and ``topic_clients`` sum).
UNREAD_COLUMNS = ("record_bytes", "batch_count")
# Parquet captures of up to this many pairs (counted from the footers) are cached in memory.
# 1,000 pairs, one warm JVM, twelve tables, alternating at load 31-39: 22.4 and 13.7 CPU
# seconds cached against 30.4 and 17.4 read per table. 1 M pairs: 70 CPU seconds cached
# (17 of them filling the cache) against 38-51 read per table, and the cache is heap that
# large captures need for their aggregations. The same bound as the quick JIT (jvm.py).
MEMORY_SCAN_MAX_PAIRS = 50_000
# Larger Parquet captures whose row groups hold fewer rows than this on average are
# rewritten once into Spark's own large row groups (kproxy's writer: ~1,000 rows a group).
# 1 M pairs in 1,000-row groups, side by side at load 10-21: 85 CPU s rewritten against
# 122 read per table (the rewrite ~30 s of it); 10 M: 421 CPU s read per table against
# 219 for the same pairs in 500 k-row groups. Files already in large groups gain nothing.
COMPACT_BELOW_ROWS_PER_GROUP = 50_000


class Kept(Enum):
    """Where the shared pairs live between the tables' jobs."""
    MEMORY = "cached in memory"
    DISK = "parsed once, cached on disk"
    FILES = "read by each table from the files"
    COMPACTED = "rewritten once in large row groups"


@dataclass(frozen=True)
class Scan:
    pairs: DataFrame
    kept: Kept
    directory: str | None = None           # the rewritten pairs (Kept.COMPACTED)

    def release(self) -> None:
        """Drop the cache or the rewritten pairs (if any) once every table is written."""
        if self.kept in (Kept.MEMORY, Kept.DISK):
            self.pairs.unpersist()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


def where_kept(inputs: Inputs, local: bool = True) -> Kept:
    """Keep small Parquet captures in memory, parsed text on disk, rewrite large captures
    of small row groups (``local``: on a Spark whose executors share the driver's disk),
    and read the rest per table."""
    if inputs.format != "parquet":
        return Kept.DISK
    if inputs.pairs is not None and inputs.pairs <= MEMORY_SCAN_MAX_PAIRS:
        return Kept.MEMORY
    if (local and inputs.pairs is not None and inputs.row_groups
            and inputs.pairs < COMPACT_BELOW_ROWS_PER_GROUP * inputs.row_groups):
        return Kept.COMPACTED
    return Kept.FILES


def shared_scan(pairs: DataFrame, inputs: Inputs, note: Callable[[str], None] = lambda text: None) -> Scan:
    """The prepared ``pairs`` narrowed to what the tables read, persisted per ``where_kept``.

    Lazy, like any persist: the job's first pass over the pairs fills the cache. A
    rewrite (``Kept.COMPACTED``) runs here, saying what it does through ``note``.
    """
    narrow = pairs.drop(*UNREAD_COLUMNS)
    spark = narrow.sparkSession
    kept = where_kept(inputs, local=spark.sparkContext.master.startswith("local"))
    if kept is Kept.MEMORY:
        narrow = narrow.persist(StorageLevel.MEMORY_AND_DISK)
    elif kept is Kept.DISK:
        narrow = narrow.persist(StorageLevel.DISK_ONLY)
    elif kept is Kept.COMPACTED:
        directory = tempfile.mkdtemp(prefix="kproxy-analyze-pairs-")
        note(f"rewriting {inputs.pairs:,} pairs from {inputs.row_groups:,} row groups into large "
             f"ones under {directory}")
        began = time.monotonic()
        try:
            narrow.write.mode("overwrite").parquet(directory)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        note(f"rewritten ({time.monotonic() - began:.1f}s)")
        return Scan(spark.read.parquet(directory), kept, directory)
    return Scan(narrow, kept)
