"""``kproxy analyze --follow``: the streamed tables equal the batch job's, file after file.

Every check compares the tables ``follow`` wrote with the batch functions run
on the same files (``tables.series`` / ``tables.client_inventory``): counts,
sums, sets and times exactly, the p99 by its rank among the raw latencies
(within ``PERCENTILE_ACCURACY``'s documented rank error).
"""

from __future__ import annotations

import bisect
import datetime as dt
import io
import json
import os
import shutil
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kproxy.observers.capture.parquet import SCHEMA
from kproxy.pipeline.job import Options
from kproxy.pipeline.load import load_capture
from kproxy.pipeline.source import InputError
from kproxy.pipeline.synthetic import synthetic_table, write_synthetic

pytest.importorskip("pyspark")

from pyspark.sql import functions as F  # noqa: E402
from py4j.protocol import Py4JJavaError  # noqa: E402
from pyspark.sql.utils import AnalysisException  # noqa: E402

from kproxy.pipeline import follow as follow_module  # noqa: E402
from kproxy.pipeline import tables as T  # noqa: E402
from kproxy.pipeline.follow import follow  # noqa: E402

ROWS_PER_FILE = 2000
WAIT_S = 180.0           # a loaded two-core machine; the test returns as soon as the table is there
POLL_S = 0.2             # how often a test reads the tables back while it waits
# A running follow looks for closed files and new input every few seconds (a capture rotates
# once a minute or more): the test shortens both, so it waits on the batch, not the clock.
TEST_TRIGGER_SECONDS = 1
TEST_FEED_POLL_S = 0.2


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """Four chronological capture files (2,000 pairs each, one hour in all)."""
    directory = tmp_path_factory.mktemp("follow-generated")
    return write_synthetic(str(directory), 4 * ROWS_PER_FILE, files=4, seed=11)


def _copy_in(paths, directory):
    os.makedirs(directory, exist_ok=True)
    for path in paths:
        shutil.copy2(path, os.path.join(directory, os.path.basename(path)))


def _rows(df) -> list[dict]:
    return [r.asDict(recursive=True) for r in df.collect()]


def _within_rank_error(value, values: list[float], p: float) -> bool:
    """``value`` is one of ``values`` and its rank is within n / PERCENTILE_ACCURACY of p * n."""
    if not values:
        return value is None
    ordered = sorted(values)
    below, through = bisect.bisect_left(ordered, value), bisect.bisect_right(ordered, value)
    slack = len(ordered) / T.PERCENTILE_ACCURACY + 1          # + 1: ranks are whole numbers
    return through > below and below + 1 - slack <= p * len(ordered) <= through + slack


def _assert_tables_match(spark, out, inputs, window_seconds=60, fmt="auto"):
    """follow's series and client inventory under ``out`` equal the batch functions on ``inputs``."""
    _, pairs = load_capture(spark, [str(p) for p in inputs], fmt)
    expected_series = _rows(T.series(pairs, window_seconds))
    followed_series = _rows(spark.read.parquet(os.path.join(out, "tables", "series")))
    assert followed_series == sorted(followed_series, key=lambda r: (r["window_start"], r["api_name"]))
    key = lambda r: (r["window_start"], r["api_name"])          # noqa: E731
    assert [key(r) for r in followed_series] == [key(r) for r in expected_series]
    latencies: dict[tuple, list[float]] = {}
    for r in _rows(pairs.where(~F.col("long_poll") & F.col("latency_ms").isNotNull())
                   .select(F.window("time", f"{window_seconds} seconds").start.alias("window_start"),
                           "api_name", "latency_ms")):
        latencies.setdefault(key(r), []).append(r["latency_ms"])
    for got, want in zip(followed_series, expected_series):
        p99 = got.pop("latency_p99_ms")
        assert _within_rank_error(p99, latencies.get(key(want), []), 0.99), (key(want), p99)
        want.pop("latency_p99_ms")
        assert got == want
    expected_inventory = _rows(T.client_inventory(pairs))
    followed_inventory = _rows(spark.read.parquet(os.path.join(out, "tables", "client_inventory")))
    assert followed_inventory == expected_inventory
    return sum(r["requests"] for r in expected_series)


def test_once_matches_batch_then_reads_only_the_new_file(spark, tmp_path, generated):
    capture, out = tmp_path / "capture", str(tmp_path / "out")
    _copy_in(generated[:3], capture)
    log = io.StringIO()

    first = follow(spark, [str(capture)], out, Options(), once=True, stream=log)
    assert first.files == 3 and first.waiting == 0
    assert first.rows == {"series": 3 * ROWS_PER_FILE, "client_inventory": 3 * ROWS_PER_FILE}
    assert _assert_tables_match(spark, out, [capture]) == 3 * ROWS_PER_FILE
    assert "series: batch 0" in log.getvalue() and "rows from" in log.getvalue()

    _copy_in(generated[3:], capture)        # the capture rotated: one more closed file
    second = follow(spark, [str(capture)], out, Options(), once=True, stream=log)
    assert second.files == 1
    assert second.rows == {"series": ROWS_PER_FILE, "client_inventory": ROWS_PER_FILE}   # checkpoint
    assert _assert_tables_match(spark, out, [capture]) == 4 * ROWS_PER_FILE

    with pytest.raises(InputError, match="--window"):
        follow(spark, [str(capture)], out, Options(window_seconds=30), once=True, stream=log)

    settings = os.path.join(out, "_checkpoints", "follow.json")
    with open(settings) as f:
        saved = json.load(f)
    del saved["layout"]                     # as written before conn_key became a struct
    with open(settings, "w") as f:
        json.dump(saved, f)
    with pytest.raises(InputError, match="another kproxy version"):
        follow(spark, [str(capture)], out, Options(), once=True, stream=log)


def test_runs_until_stopped_reading_files_as_the_capture_closes_them(spark, tmp_path, generated, monkeypatch):
    monkeypatch.setattr(follow_module, "TRIGGER_SECONDS", TEST_TRIGGER_SECONDS)
    monkeypatch.setattr(follow_module, "FEED_POLL_S", TEST_FEED_POLL_S)
    capture, out = tmp_path / "capture", str(tmp_path / "out")
    _copy_in(generated[:1], capture)
    # The capture's current file: row groups written, no footer yet (as ParquetSink leaves it).
    open_path = os.path.join(capture, os.path.basename(generated[1]))
    writer = pq.ParquetWriter(open_path, SCHEMA)
    writer.write_table(pq.read_table(generated[1], schema=SCHEMA))
    log, stop, failures = io.StringIO(), threading.Event(), []

    def run():
        try:
            follow(spark, [str(capture)], out, Options(), once=False, stop=stop, stream=log)
        except BaseException as exc:          # noqa: BLE001 - reported by the test below
            failures.append(exc)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        _wait_for_requests(spark, out, ROWS_PER_FILE, failures)
        assert "1 file still being written" in log.getvalue()
        writer.close()                        # rotation: the file is complete now
        writer = None
        _wait_for_requests(spark, out, 2 * ROWS_PER_FILE, failures)
        assert _assert_tables_match(spark, out, [capture]) == 2 * ROWS_PER_FILE
    finally:
        if writer is not None:
            writer.close()
        stop.set()
        runner.join(WAIT_S)
    assert not runner.is_alive()
    assert failures == []
    assert not [q for q in spark.streams.active if q.name and q.name.startswith("kproxy-follow")]
    assert "stopping" in log.getvalue()


def _wait_for_requests(spark, out, expected, failures):
    """Wait until both tables account for ``expected`` pairs (they are swapped in whole)."""
    deadline = time.monotonic() + WAIT_S
    seen = None
    while time.monotonic() < deadline and not failures:
        try:
            seen = [spark.read.parquet(os.path.join(out, "tables", name)).agg(F.sum("requests")).first()[0]
                    for name in follow_module.STREAMED_TABLES]
        except AnalysisException:
            seen = None                       # not written yet
        except Py4JJavaError as exc:          # listed the table just before a swap replaced it
            if "FILE_NOT_EXIST" not in str(exc) and "FOOTER" not in str(exc).upper():
                raise                         # (or read a file the swap was still replacing)
            seen = None
        if seen == [expected, expected]:
            return
        time.sleep(POLL_S)
    raise AssertionError(f"tables hold {seen} requests, expected {expected} (failures: {failures})")


def _write_jsonl(table, path):
    with open(path, "w") as f:
        for row in table.to_pylist():
            for name in ("time", "connection_start"):
                if row[name] is not None:
                    row[name] = row[name].isoformat().replace("+00:00", "Z")
            f.write(json.dumps(row) + "\n")


def test_jsonl_capture_reads_closed_files_only(spark, tmp_path):
    capture, out = tmp_path / "capture", str(tmp_path / "out")
    capture.mkdir()
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    start = now - dt.timedelta(hours=3)
    names = []
    for index, began in enumerate((start, start + dt.timedelta(minutes=30), now)):
        name = f"kproxy-capture-{began:%Y%m%dT%H%M%S}-{index + 1:06d}.jsonl"
        _write_jsonl(synthetic_table(600, seed=index, start=began, span_seconds=600), capture / name)
        names.append(name)
    # The first has a successor, the second is older than a rotation, the third may still grow.
    assert follow_module._closed_files([str(capture / n) for n in names], "jsonl") == \
        [str(capture / n) for n in names[:2]]

    result = follow(spark, [str(capture)], out, Options(), once=True, stream=io.StringIO())
    assert (result.files, result.waiting) == (2, 1)
    assert _assert_tables_match(spark, out, [capture / n for n in names[:2]], fmt="jsonl") == 1200


@pytest.mark.parametrize("case, message", [("missing", "no such directory"),
                                           ("file", "reads a capture directory"),
                                           ("empty", "no capture files"),
                                           ("foreign", "without kproxy's capture schema")])
def test_refuses_what_it_cannot_follow(spark, tmp_path, case, message):
    path = tmp_path / case
    if case == "file":
        path = write_synthetic(str(tmp_path), 10, files=1)[0]
    elif case == "empty":
        path.mkdir()
    elif case == "foreign":
        path.mkdir()
        pq.write_table(pa.table({"x": [1]}), path / "kproxy-capture-20261123T120000-000001.parquet")
    with pytest.raises(InputError, match=message):
        follow(spark, [str(path)], str(tmp_path / "out"), Options(), once=True, stream=io.StringIO())
