"""``kproxy analyze --follow DIR``: the series and the client inventory, kept current.

Spark Structured Streaming over a directory of rotating capture files. Two
streaming queries, one per table, each a stateful aggregation in *update*
mode: every micro-batch hands ``foreachBatch`` the groups it changed, with
their full current values (the percentile sketches live in Spark's state
store), and those rows replace their old versions in ``OUT/tables/<name>/``.
So a reader sees the batch job's tables, same columns, same values, after
every micro-batch, without waiting for a window to close:

- ``series``: the aggregation is ``tables.series_unordered`` (the batch
  function minus its sort), keyed by window and API. A watermark on ``time``
  (``WATERMARK_DELAY_S``) bounds the state: windows older than the newest pair
  minus the delay are dropped from it and keep their last values; a pair
  arriving later than that for such a window is not counted (the progress line
  says how many; the batch job counts them).
- ``client_inventory``: the aggregation is ``tables.per_connection`` (keyed by
  connection, so its state lasts as long as the follow: a few hundred bytes per
  connection ever seen); the merged connection rows are kept under the
  checkpoint and ``tables.inventory_of_connections`` rebuilds the inventory
  from them after each batch.

Why not *append* mode with a watermark: a window would reach the table only
once the watermark passed its end, hours after its pairs were read. Why not
*complete* mode: its state never shrinks (every window's percentile sketch).

Only closed capture files are read. kproxy writes a capture file in place and
a Parquet file is unreadable until its footer is written at rotation, while
Spark's file source reads a file once and never again. So a feeder (this
module, on the driver) links each file into ``OUT/_checkpoints/inbox/<table>/``
once it is complete: a Parquet file whose footer reads, a JSONL file that has
a successor in its capture session or is older than a rotation. A hard link is
atomic and copies nothing; the file source deletes its link once the file is
processed (``cleanSource``), so the capture's size cap still frees the space.
A Hadoop URI (``s3a://``, ``hdfs://``), where files appear whole, is read in place.
A topic of shipped rows (``kafka://BOOTSTRAP/TOPIC``, ``kafka_source.py``) is read
with Spark's Kafka source; the checkpoint keeps its offsets instead of file names.

The lag a user sees: the capture's rotation (``rotate_seconds``, one hour by
default; capture with ``rotate_seconds`` of a minute to follow closely), plus
up to ``FEED_POLL_S`` + ``TRIGGER_SECONDS`` and the batch's own time (seconds).

A table is replaced whole after each batch (written aside, swapped in by
renames): a read that listed the old files just before a swap fails with
Spark's FILE_NOT_EXIST (or a footer it cannot read) and succeeds when repeated.

``once=True`` reads the files that are complete now (``availableNow``) and
returns; otherwise it runs until Ctrl-C (or ``stop`` is set), lets the batch in
progress finish and stops the queries. Either way the checkpoint
(``OUT/_checkpoints``) remembers what was read, so the next run starts where
this one stopped; delete it (with ``OUT/tables``) to start over.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from functools import reduce

from ..observers.capture.config import DEFAULT_ROTATE_SECONDS
from . import kafka_source
from . import tables as T
from .source import (InputError, capture_name, check_file, format_of, is_uri, local_path,
                     prepare, read_with, resolve_inputs)

STREAMED_TABLES = ("series", "client_inventory")
# A capture file holds up to one rotation of pairs, and sidecars writing to one
# directory close theirs independently: a pair can reach the stream a whole
# rotation after newer ones. Twice the default rotation keeps those; the state
# holds this much of the series (windows x APIs, a percentile sketch each).
WATERMARK_DELAY_S = int(2 * DEFAULT_ROTATE_SECONDS)
# A catch-up micro-batch reads at most this many files (each up to the capture's
# rotate_bytes, 128 MiB by default): bounded memory, progress lines while catching up.
MAX_FILES_PER_TRIGGER = 4
# How often the running queries look for new files, and the feeder for closed ones:
# files arrive once per rotation, so seconds add little lag and cost a directory listing.
TRIGGER_SECONDS = 5
FEED_POLL_S = 2.0
# The capture closes a file one rotation after opening it (when it holds rows), so a
# JSONL file created longer ago than this gets no more rows (default rotate_seconds).
JSONL_CLOSED_AFTER_S = DEFAULT_ROTATE_SECONDS + 60
# Ctrl-C lets the micro-batch in progress finish for up to this long before stopping it.
STOP_GRACE_S = 60.0
_LOOP_S = 0.5
# The shape of what a checkpoint holds (stream state, merged connection rows); a checkpoint
# of another shape cannot be continued. 2: conn_key a struct, no longer a string.
CHECKPOINT_LAYOUT = 2


@dataclass
class Followed:
    """What one ``follow`` run did (for callers and tests; users read the progress lines)."""
    rows: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STREAMED_TABLES, 0))
    batches: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STREAMED_TABLES, 0))
    files: int = 0                    # capture files handed to the streams by this run
    waiting: int = 0                  # files still being written when it ended


class _Layout:
    """Where follow keeps things under OUT."""

    def __init__(self, out: str):
        if is_uri(out):
            raise InputError("--follow writes its tables to a local --out directory")
        self.out = local_path(out)
        self.checkpoints = os.path.join(self.out, "_checkpoints")
        self.settings = os.path.join(self.checkpoints, "follow.json")
        self.fed = os.path.join(self.checkpoints, "fed.txt")
        self.connections = os.path.join(self.checkpoints, "connections")

    def table(self, name: str) -> str:
        return os.path.join(self.out, "tables", name)

    def stream(self, name: str) -> str:
        return os.path.join(self.checkpoints, "streams", name)

    def inbox(self, name: str) -> str:
        return os.path.join(self.checkpoints, "inbox", name)


# ------------------------------------------------------------------ the feeder

class _Feeder:
    """Hands closed capture files of local directories to the streams, each file once."""

    def __init__(self, directories: list[str], fmt: str, layout: _Layout):
        self.directories = directories
        self.fmt = fmt
        self.layout = layout
        self.fed: set[str] = set()
        if os.path.exists(layout.fed):
            with open(layout.fed) as f:
                self.fed = {line.rstrip("\n") for line in f if line.strip()}
        self.waiting = 0

    def candidates(self) -> list[str]:
        found = []
        for directory in self.directories:
            try:
                names = sorted(os.listdir(directory))
            except OSError as exc:
                raise InputError(f"cannot list {directory}: {exc.strerror}") from None
            for name in names:
                path = os.path.join(directory, name)
                if format_of(name) == self.fmt and os.path.isfile(path):
                    found.append(path)
        return found

    def feed(self) -> int:
        """Link newly closed files into every inbox; returns how many."""
        pending = [p for p in self.candidates() if p not in self.fed]
        closed = _closed_files(pending, self.fmt)
        self.waiting = len(pending) - len(closed)
        if not closed:
            return 0
        placed = 0
        with open(self.layout.fed, "a") as ledger:
            for path in closed:
                try:
                    check_file(path, self.fmt)         # a foreign or newer-version file stops here
                except InputError:
                    if os.path.exists(path):
                        raise
                    continue                           # deleted by the capture's size cap meanwhile
                name = f"{_tag(os.path.dirname(path))}-{os.path.basename(path)}"
                # One link (or copy) first, so every inbox gets the file even if the
                # capture's size cap deletes it meanwhile; the inboxes link to that.
                staged = os.path.join(os.path.dirname(self.layout.inbox(STREAMED_TABLES[0])), f".{name}")
                if not _place(path, staged):
                    continue                             # already deleted by the capture's size cap
                for table in STREAMED_TABLES:
                    _place(staged, os.path.join(self.layout.inbox(table), name))
                os.unlink(staged)
                ledger.write(path + "\n")
                self.fed.add(path)
                placed += 1
        return placed


def _tag(directory: str) -> str:
    """A short name for a source directory: files of two directories may share a name."""
    return hashlib.sha1(os.path.abspath(directory).encode()).hexdigest()[:8]


def _place(source: str, target: str) -> bool:
    """Make ``source`` appear at ``target`` at once: a hard link, else a copy renamed into place.

    False if ``source`` is gone.
    """
    try:
        os.link(source, target)
        return True
    except FileExistsError:
        return True
    except FileNotFoundError:
        return False
    except OSError:
        pass                                     # another filesystem, or links not allowed
    hidden = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.tmp")   # skipped by Spark
    try:
        shutil.copy2(source, hidden)             # keeps the modification time: files are read in its order
    except FileNotFoundError:
        return False
    os.replace(hidden, target)
    return True


def _closed_files(paths: list[str], fmt: str) -> list[str]:
    """Those of ``paths`` the capture will not write to again."""
    if fmt == "parquet":
        import pyarrow.parquet as pq
        closed = []
        for path in paths:
            try:
                pq.read_metadata(path)           # the footer is written when the file is closed
            except Exception:                    # noqa: BLE001 - pyarrow raises several types
                continue
            closed.append(path)
        return closed
    names = {path: capture_name(path) for path in paths}
    latest: dict[tuple[str, str, str], tuple[str, int]] = {}
    for name in names.values():
        if name is not None:
            latest[name.session] = max(latest.get(name.session, ("", -1)), (name.stamp, name.seq))
    now = time.time()
    closed = []
    for path, name in names.items():
        if name is None:
            created = os.path.getmtime(path)
        else:
            if (name.stamp, name.seq) < latest[name.session]:
                closed.append(path)              # a later file of the same session exists
                continue
            created = name.opened.timestamp()
        if os.path.getsize(path) > 0 and now - created >= JSONL_CLOSED_AFTER_S:
            closed.append(path)
    return closed


def _inputs(paths: list[str], fmt: str, once: bool) -> tuple[list[str], str, bool]:
    """(local directories or one URI, format, local?) for ``--follow``; InputError if unusable."""
    if fmt not in ("auto", "parquet", "jsonl"):
        raise InputError(f"--format must be auto, parquet or jsonl, got {fmt!r}")
    if any(kafka_source.is_kafka(p) for p in paths):
        return [kafka_source.one_input(paths).uri], "kafka", False
    if any(is_uri(p) for p in paths):
        if len(paths) > 1:
            raise InputError("--follow reads one URI, or local directories")
        inputs = resolve_inputs(paths, fmt)
        return [paths[0]], inputs.format, False
    directories = []
    for path in paths:
        local = local_path(path)
        if os.path.isfile(local):
            raise InputError(f"{path}: --follow reads a capture directory (analyze a file without --follow)")
        if not os.path.isdir(local):
            raise InputError(f"no such directory: {path}")
        directories.append(local)
    names = [n for d in directories for n in os.listdir(d)]
    present = {f for f in (format_of(n) for n in names) if f}
    if fmt == "auto":
        if not present:
            raise InputError(f"no capture files in {' '.join(paths)} yet: start the capture "
                             f"first, or give --format to wait for them")
        fmt = "parquet" if "parquet" in present else "jsonl"      # as resolve_inputs chooses
    elif once and fmt not in present:
        raise InputError(f"no {fmt} capture files in {' '.join(paths)}")
    return directories, fmt, True


# ------------------------------------------------------------------ tables from the streams

def _exists(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "_SUCCESS"))


def _siblings(path: str) -> tuple[str, str]:
    head, name = os.path.split(path)
    return os.path.join(head, f".{name}.next"), os.path.join(head, f".{name}.old")


def _replace(df, path: str) -> None:
    """Write ``df`` as the Parquet table at ``path``: written aside, then swapped in by renames."""
    following, previous = _siblings(path)
    df.write.mode("overwrite").parquet(following)
    shutil.rmtree(previous, ignore_errors=True)
    if os.path.exists(path):
        os.rename(path, previous)
    os.rename(following, path)
    shutil.rmtree(previous, ignore_errors=True)


def _recover(path: str) -> None:
    """Finish a swap that a crash interrupted (the table is missing, its replacement complete)."""
    following, previous = _siblings(path)
    if not os.path.exists(path):
        if _exists(following):
            os.rename(following, path)
        elif _exists(previous):
            os.rename(previous, path)
    shutil.rmtree(following, ignore_errors=True)
    shutil.rmtree(previous, ignore_errors=True)


def _upsert(updates, path: str, key: tuple[str, ...], order: tuple[str, ...] = ()) -> None:
    """Replace the rows of the table at ``path`` whose ``key`` is in ``updates`` by those rows.

    Idempotent: a micro-batch run again after a crash writes the same table.
    """
    merged = updates
    if _exists(path):
        current = updates.sparkSession.read.parquet(path)
        same = reduce(lambda a, b: a & b, [current[k].eqNullSafe(updates[k]) for k in key])
        merged = current.join(updates.select(*key), same, "left_anti").unionByName(updates)
    merged = merged.coalesce(1)                    # aggregates, not pairs: one file, no range sort
    _replace(merged.sortWithinPartitions(*order) if order else merged, path)


def _series_batch(layout: _Layout):
    def write(updates, batch_id: int) -> None:
        _upsert(updates, layout.table("series"), T.SERIES_KEY, T.SERIES_KEY)
    return write


def _inventory_batch(layout: _Layout):
    def write(updates, batch_id: int) -> None:
        _upsert(updates, layout.connections, ("conn_key",))
        connections = updates.sparkSession.read.parquet(layout.connections)
        _replace(T.inventory_of_connections(connections), layout.table("client_inventory"))
    return write


def _changed_only(write):
    """Run ``write`` on a batch's changed groups, computed once (the batch plan updates state)."""
    def run(updates, batch_id: int) -> None:
        updates = updates.persist()
        try:
            if updates.count():
                write(updates, batch_id)
        finally:
            updates.unpersist()
    return run


def _read_stream(spark, location: str, fmt: str, options, local: bool):
    if fmt == "kafka":
        raw = kafka_source.read_stream(spark, location)
        return prepare(raw, options.since, options.until).withWatermark("time", f"{WATERMARK_DELAY_S} seconds")
    reader = spark.readStream.option("maxFilesPerTrigger", MAX_FILES_PER_TRIGGER)
    if local:
        reader = reader.option("cleanSource", "delete")       # our links, never the capture's files
    raw = read_with(reader, fmt, location)
    return prepare(raw, options.since, options.until).withWatermark("time", f"{WATERMARK_DELAY_S} seconds")


def _start(spark, name: str, location: str, fmt: str, options, local: bool, layout: _Layout, once: bool):
    pairs = _read_stream(spark, location, fmt, options, local)
    if name == "series":
        aggregate, write = T.series_unordered(pairs, options.window_seconds), _series_batch(layout)
    else:
        aggregate, write = T.per_connection(pairs), _inventory_batch(layout)
    writer = (aggregate.writeStream.queryName(f"kproxy-follow-{name}").outputMode("update")
              .foreachBatch(_changed_only(write))
              .option("checkpointLocation", layout.stream(name)))
    writer = writer.trigger(availableNow=True) if once else writer.trigger(
        processingTime=f"{TRIGGER_SECONDS} seconds")
    return writer.start()


# ------------------------------------------------------------------ settings, progress

def _settings(layout: _Layout, options, fmt: str) -> None:
    """Start fresh, or refuse to continue a checkpoint made with another window or format."""
    wanted = {"window_seconds": options.window_seconds, "format": fmt, "layout": CHECKPOINT_LAYOUT}
    if os.path.exists(layout.settings):
        with open(layout.settings) as f:
            saved = json.load(f)
        if saved.get("layout", 1) != CHECKPOINT_LAYOUT:
            raise InputError(f"{layout.checkpoints} was made by another kproxy version: use another "
                             f"--out, or delete {layout.checkpoints} and "
                             f"{os.path.join(layout.out, 'tables')} to start over")
        for key, flag in (("window_seconds", "--window"), ("format", "--format")):
            if saved.get(key) != wanted[key]:
                raise InputError(f"{layout.checkpoints} was made with {flag} {saved.get(key)}, not "
                                 f"{wanted[key]}: use the same {flag}, another --out, or delete "
                                 f"{layout.checkpoints} and {os.path.join(layout.out, 'tables')} to start over")
        for path in (layout.connections, *(layout.table(n) for n in STREAMED_TABLES)):
            _recover(path)
    else:
        for path in (layout.checkpoints, *(layout.table(n) for n in STREAMED_TABLES)):
            shutil.rmtree(path, ignore_errors=True)      # nothing of an earlier follow mixes in
    for name in STREAMED_TABLES:
        os.makedirs(layout.inbox(name), exist_ok=True)
    os.makedirs(os.path.join(layout.out, "tables"), exist_ok=True)
    with open(layout.settings, "w") as f:
        json.dump(wanted, f)


def _files_in_batch(checkpoint: str, progress) -> int | None:
    """Files a micro-batch read, from the file source's log in the checkpoint (None if unknown)."""
    try:
        source = progress["sources"][0]
        start = json.loads(source["startOffset"] or "null")
        end = json.loads(source["endOffset"] or "null")
        offset = end["logOffset"]
        if start is not None and start["logOffset"] == offset:
            return 0
        log = os.path.join(checkpoint, "sources", "0")
        for name in (str(offset), f"{offset}.compact"):
            path = os.path.join(log, name)
            if os.path.exists(path):
                with open(path) as f:
                    entries = [json.loads(line) for line in f if line.startswith("{")]
                return sum(1 for e in entries if e.get("batchId") == offset)
    except (KeyError, TypeError, ValueError, OSError):
        pass
    return None


def _duration(seconds: float) -> str:
    sign, seconds = ("-" if seconds < 0 else ""), abs(seconds)
    if seconds < 120:
        return f"{sign}{seconds:.0f}s"
    if seconds < 7200:
        return f"{sign}{seconds / 60:.0f}m"
    return f"{sign}{seconds / 3600:.1f}h"


class _Reporter:
    """One line per micro-batch that read rows: rows, files, newest pair and lag behind now."""

    def __init__(self, stream, layout: _Layout, result: Followed):
        self.stream = stream
        self.layout = layout
        self.result = result
        self.started = time.monotonic()
        self.printed: dict[str, int] = {}

    def line(self, text: str) -> None:
        print(f"[follow {time.monotonic() - self.started:6.1f}s] {text}", file=self.stream, flush=True)

    def poll(self, name: str, query, waiting: int) -> None:
        for progress in query.recentProgress:
            batch = progress["batchId"]
            if batch <= self.printed.get(name, -1):
                continue
            self.printed[name] = batch
            rows = progress["numInputRows"]
            if not rows:
                continue                                  # a batch that only moved the watermark
            self.result.rows[name] += rows
            self.result.batches[name] += 1
            files = _files_in_batch(self.layout.stream(name), progress)
            text = f"{name}: batch {batch}, {rows:,} rows"
            if files is not None:
                text += f" from {files} file{'s' * (files != 1)}"
            newest = (progress["eventTime"] or {}).get("max")
            if newest:
                at = dt.datetime.fromisoformat(newest.replace("Z", "+00:00"))
                lag = dt.datetime.now(dt.timezone.utc) - at
                text += f", newest pair {newest[:19]}Z (lag {_duration(lag.total_seconds())})"
            dropped = sum(op.get("numRowsDroppedByWatermark", 0) or 0
                          for op in progress["stateOperators"] or [])
            if dropped:
                text += f", {dropped:,} late rows not counted (older than the watermark)"
            text += f", {progress['durationMs'].get('triggerExecution', 0) / 1000:.1f}s"
            if waiting:
                text += f"; {waiting} file{'s' * (waiting != 1)} still being written"
            self.line(text)


# ------------------------------------------------------------------ follow

def follow(spark, paths: list[str], out: str, options, once: bool, *,
           stop: threading.Event | None = None, stream=None) -> Followed:
    """Keep ``OUT/tables/series`` and ``client_inventory`` current over capture directories.

    ``once``: read what is complete now, then return. Otherwise run until ``stop``
    is set or Ctrl-C (SIGINT/SIGTERM in the main thread), finishing the batch in progress.
    """
    stream = stream if stream is not None else sys.stderr
    if options.window_seconds <= 0:
        raise InputError("--window must be positive")
    layout = _Layout(out)
    locations, fmt, local = _inputs(paths, options.fmt, once)
    _settings(layout, options, fmt)
    result = Followed()
    reporter = _Reporter(stream, layout, result)
    feeder = _Feeder(locations, fmt, layout) if local else None
    if feeder is not None:
        result.files += feeder.feed()
        result.waiting = feeder.waiting
        reporter.line(f"following {' '.join(paths)} ({fmt}): {len(feeder.fed)} closed files, "
                      f"{feeder.waiting} still being written; tables under {os.path.join(layout.out, 'tables')}")
    else:
        reporter.line(f"following {locations[0]} ({fmt}); tables under {os.path.join(layout.out, 'tables')}")
    stop = stop or threading.Event()
    handlers = _on_signals(stop)
    queries = {}
    try:
        for name in STREAMED_TABLES:
            location = layout.inbox(name) if local else locations[0]
            queries[name] = _start(spark, name, location, fmt, options, local, layout, once)
        last_feed = time.monotonic()
        while True:
            for name, query in queries.items():
                reporter.poll(name, query, result.waiting)
                failure = query.exception()
                if failure is not None:
                    raise failure
            if not any(q.isActive for q in queries.values()):
                break
            if stop.is_set():
                reporter.line("stopping: letting the batch in progress finish")
                break
            if feeder is not None and not once and time.monotonic() - last_feed >= FEED_POLL_S:
                result.files += feeder.feed()
                result.waiting = feeder.waiting
                last_feed = time.monotonic()
            stop.wait(_LOOP_S)
    finally:
        _stop(queries.values())
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    for name, query in queries.items():
        reporter.poll(name, query, result.waiting)
    reporter.line(f"done: {result.rows['series']:,} rows read; tables "
                  + ", ".join(layout.table(n) for n in STREAMED_TABLES))
    return result


def _on_signals(stop: threading.Event) -> dict:
    """Ctrl-C and SIGTERM set ``stop`` (instead of Spark's cancel-every-job handler)."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handle(signum, frame):
        stop.set()

    saved = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        saved[signum] = signal.signal(signum, handle)
    return saved


def _stop(queries) -> None:
    """Stop each query between micro-batches if it gets there within STOP_GRACE_S."""
    deadline = time.monotonic() + STOP_GRACE_S
    for query in queries:
        while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
            time.sleep(0.2)
        query.stop()
