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
- JSONL (and Kafka topics) are parsed once into a disk cache instead of once per table.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

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


class Kept(Enum):
    """Where the shared pairs live between the tables' jobs."""
    MEMORY = "cached in memory"
    DISK = "parsed once, cached on disk"
    FILES = "read by each table from the files"


@dataclass(frozen=True)
class Scan:
    pairs: DataFrame
    kept: Kept

    def release(self) -> None:
        """Drop the cache (if any) once every table is written."""
        if self.kept is not Kept.FILES:
            self.pairs.unpersist()


def where_kept(inputs: Inputs) -> Kept:
    """Keep small Parquet captures in memory, parsed text on disk, and read the rest per table."""
    if inputs.format != "parquet":
        return Kept.DISK
    if inputs.pairs is not None and inputs.pairs <= MEMORY_SCAN_MAX_PAIRS:
        return Kept.MEMORY
    return Kept.FILES


def shared_scan(pairs: DataFrame, inputs: Inputs) -> Scan:
    """The prepared ``pairs`` narrowed to what the tables read, persisted per ``where_kept``.

    Lazy, like any persist: the job's first pass over the pairs fills the cache.
    """
    narrow = pairs.drop(*UNREAD_COLUMNS)
    kept = where_kept(inputs)
    if kept is Kept.MEMORY:
        narrow = narrow.persist(StorageLevel.MEMORY_AND_DISK)
    elif kept is Kept.DISK:
        narrow = narrow.persist(StorageLevel.DISK_ONLY)
    return Scan(narrow, kept)
