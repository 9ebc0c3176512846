"""The batch job: every table, ``summary.json`` and the report, for one set of capture files.

``analyze(spark, paths, out)`` is what ``kproxy analyze`` and ``spark-submit``
run; a notebook can call it too, or call the functions in ``tables`` one by
one. Tables are written as Parquet under ``out/tables/<name>/``, several at
once from driver threads (a small capture's cost is per job, not per row); only
aggregates (never pair rows) come back to the driver, for ``summary.json``
and the report, and the report shows at most ``REPORT_ROWS`` rows of a table.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from .. import __version__
from . import audit as audit_table
from . import failovers as failover_tables
from . import tables as T
from .tables import REPORT_ROWS, WORST_P99_MIN_REQUESTS
from .jvm import QUICK_JIT_MAX_PAIRS
from .scan import shared_scan
from .load import load_capture
from .source import Inputs, InputError

if TYPE_CHECKING:
    from ..policy import Policy

# Tables the report plots over time get all their rows up to this: one row per window
# and API (or group), so a day at one-minute windows and a dozen APIs fits.
PLOTTED_TABLES = ("series", "group_members")
PLOTTED_REPORT_ROWS = 50_000
SUMMARY_TOP = 5                   # top errors listed in summary.json
PROGRESS_POLL_S = 2.0             # how often a long stage reports its tasks
PROGRESS_QUIET_S = 5.0            # stages shorter than this print only their result
PROGRESS_REPEAT_S = 15.0          # a stage whose task counts stand still still says it is alive
# Tables written at once, each from its own driver thread (Spark runs jobs from several
# threads side by side). A small capture's tables are each a few tiny jobs whose cost is
# the driver's planning, code generation and task launching, not the data: run together,
# those overlap, and the executors always have tasks. More at once only adds memory (every
# running aggregation holds its hash map) without more cores to run them.
CONCURRENT_TABLES = 4
# Spark SQL settings the job's queries want wherever they run (``analyze`` sets them on
# the session, as it does the Parquet timestamp type):
JOB_SQL_SETTINGS = {
    # percentile_approx and collect_set keep one buffer per group in a hash map; past this
    # many groups in a task Spark falls back to sorting every input row by the grouping key
    # (default 128). ``series`` has a group per minute and API (840 an hour), so it sorted
    # all its rows. A buffer holds at most its group's values (a percentile's, once merged,
    # at most ~PERCENTILE_ACCURACY), which Spark does not count against its memory: 4,096
    # groups a task (with four shuffle partitions, about a day of one-minute windows of a
    # dozen APIs) stay well within a default heap; a task with more groups still sorts.
    "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "4096",
}
# More settings for a capture of up to SMALL_CAPTURE_MAX_PAIRS pairs (counted from the Parquet
# footers) in a local Spark, for the run only. Its tables are ~55 tiny jobs whose cost is the
# driver's, not the rows': before a query runs a row, Spark writes Java for it (a class per
# whole stage, and one per projection, predicate and ordering) and compiles it with Janino.
# Run interpreted, a thousand rows cost less than compiling: 1,000 pairs took 26-27 CPU
# seconds against 35-36 (one run each, load 19-27). One shuffle partition instead of two per
# core: a few kilobytes need no more tasks.
SMALL_CAPTURE_SQL_SETTINGS = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.shuffle.partitions": "1",
}
# The bound of the quick JIT (jvm.py) and of the in-memory scan (scan.py): the captures whose
# run is mostly planning. At 50,000 pairs interpreted still cost less: 33.7 CPU seconds against
# 38.9 compiled (one run each, load 23-31). Not measured above.
SMALL_CAPTURE_MAX_PAIRS = QUICK_JIT_MAX_PAIRS


@dataclass
class Options:
    """What one run computes (``kproxy analyze`` flags)."""
    window_seconds: int = 60
    top: int = 20
    fmt: str = "auto"
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    report: bool = True
    policy: "Policy | None" = None      # a rules file to judge the capture by (policy_violations)


@dataclass
class Result:
    out: str
    summary: dict
    tables: dict[str, str] = field(default_factory=dict)       # name -> path
    table_rows: dict[str, int] = field(default_factory=dict)   # name -> rows written
    report: str | None = None
    policy: dict | None = None                                  # the rules file judged, for summary.json


class Progress:
    """Stage lines on stderr, and task counts for stages that run long (Spark's own bar is off)."""

    def __init__(self, spark: SparkSession, stream=None, total: int = 0):
        self.spark = spark
        self.stream = stream if stream is not None else sys.stderr
        self.total = total
        self.done = 0
        self.started = time.monotonic()
        self._lock = threading.Lock()             # stages may run from several threads

    def _print(self, text: str) -> None:
        print(f"[analyze {time.monotonic() - self.started:6.1f}s] {text}", file=self.stream, flush=True)

    def note(self, text: str) -> None:
        self._print(text)

    def stage(self, name: str, work, describe=str):
        """Run ``work()``, printing the stage, its tasks while it runs long, and ``describe(result)``."""
        with self._lock:
            self.done += 1
            label = f"{self.done}/{self.total} {name}" if self.total else name
        stop = threading.Event()
        # Stages may run side by side: the jobs this thread starts carry the stage's name as
        # their group, so its watcher counts only their tasks.
        group = f"kproxy-analyze-{name}"
        self.spark.sparkContext.setJobGroup(group, name)
        watcher = threading.Thread(target=self._watch, args=(label, group, stop), daemon=True)
        watcher.start()
        began = time.monotonic()
        try:
            result = work()
        finally:
            stop.set()
            watcher.join()
            self.spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
        self._print(f"{label}: {describe(result)} ({time.monotonic() - began:.1f}s)")
        return result

    def _watch(self, label: str, group: str, stop: threading.Event) -> None:
        """While a stage runs long: its task counts when they move, else a line now and then."""
        tracker = self.spark.sparkContext.statusTracker()
        began = time.monotonic()
        said, said_at = None, 0.0
        while not stop.wait(PROGRESS_POLL_S):
            now = time.monotonic()
            if now - began < PROGRESS_QUIET_S:
                continue
            active = set(tracker.getActiveStageIds())
            mine = set()
            for job_id in tracker.getJobIdsForGroup(group):
                job = tracker.getJobInfo(job_id)
                if job is not None:
                    mine.update(job.stageIds)
            done = total = 0
            for stage_id in active & mine:
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    done += info.numCompletedTasks
                    total += info.numTasks
            if total and ((done, total) != said or now - said_at >= PROGRESS_REPEAT_S):
                self._print(f"{label}: running, {done}/{total} tasks")
                said, said_at = (done, total), now


def _write(df: DataFrame, path: str) -> int:
    """Write a table; its row count from the Parquet footers (no second Spark job)."""
    import pyarrow.dataset as pads
    df.write.mode("overwrite").parquet(path)
    return sum(f.metadata.num_rows for f in pads.dataset(path, format="parquet").get_fragments())


def _rows(path: str, limit: int) -> list[dict]:
    """The first ``limit`` rows of a written table, in its order, timestamps as naive UTC.

    Read with pyarrow from the driver's disk: Spark wrote the part files in the
    table's sort order, and the report needs no Spark job for a few hundred rows.
    """
    import pyarrow as pa
    import pyarrow.dataset as pads
    table = pads.dataset(path, format="parquet").head(limit)
    naive = pa.schema([f.with_type(pa.timestamp(f.type.unit)) if pa.types.is_timestamp(f.type) else f
                       for f in table.schema])
    return table.cast(naive).to_pylist()


def _arrow(path: str, columns: list[str]):
    """A written table's ``columns`` as one Arrow table, read on the driver."""
    import pyarrow.dataset as pads
    return pads.dataset(path, format="parquet").to_table(columns=columns)


def _iso(value) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:                 # Spark hands back session-time-zone naive datetimes
        value = value.replace(tzinfo=dt.timezone.utc)
    return value.astimezone(dt.timezone.utc).isoformat().replace("+00:00", "Z")


def _headline(pairs: DataFrame) -> dict:
    """One aggregate pass over the pairs for the figures no table holds.

    No distinct count here: Spark expands every row once per distinct column, which
    made this pass most of a 10 M-pair job; clients and connections are counted from
    their tables instead (``_summary``).
    """
    row = pairs.agg(F.count("*").alias("pairs"), F.min("time").alias("first"),
                    F.max("time").alias("last"),
                    F.array_sort(F.collect_set("proxy_instance")).alias("proxies"),
                    F.array_sort(F.collect_set("capture_version")).alias("versions"),
                    F.sum(F.when(F.col("capture_version").isNull(), 1).otherwise(0)).alias("foreign"),
                    ).first()
    return row.asDict(recursive=True)


def analyze(spark: SparkSession, paths: list[str], out: str, options: Options | None = None,
            progress: Progress | None = None) -> Result:
    """Read the capture at ``paths`` and write every table, ``summary.json`` and the report to ``out``."""
    options = options or Options()
    if options.window_seconds <= 0 or options.top <= 0:
        raise InputError("--window and --top must be positive")
    stages = len(_SHARED) + len(_PLAN) + 2 + (1 if options.report else 0) + (1 if options.policy is not None else 0)
    progress = progress or Progress(spark, total=stages)
    progress.total = stages
    if options.report:
        # matplotlib takes seconds to import: done while the driver waits on Spark anyway.
        threading.Thread(target=_import_report, name="import-report", daemon=True).start()
    # Tables in the modern Parquet timestamp type (not Spark's legacy INT96), for every reader.
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    for key, value in JOB_SQL_SETTINGS.items():
        spark.conf.set(key, value)
    inputs, pairs = load_capture(spark, paths, options.fmt, options.since, options.until)
    progress.note(_describe(inputs))
    scan = shared_scan(pairs, inputs, progress.note)
    pairs = scan.pairs
    # Local Spark only: on a cluster (spark-submit) its own settings stand.
    small = (inputs.pairs is not None and inputs.pairs <= SMALL_CAPTURE_MAX_PAIRS
             and spark.sparkContext.master.startswith("local"))
    restore = _set_for_run(spark, SMALL_CAPTURE_SQL_SETTINGS if small else {})
    try:
        head = progress.stage("read pairs", lambda: _headline(pairs), lambda h: f"{h['pairs']:,} pairs")
        if head["foreign"]:
            # Lines a JSON reader could not parse (a file cut short by a crash, say) or rows of
            # something else: left out and counted, the rest is still analysed.
            if head["foreign"] == head["pairs"]:
                raise InputError("no row has a capture_version: these are not kproxy captures")
            progress.note(f"{head['foreign']:,} unreadable rows left out (no capture_version)")
            head["pairs"] -= head["foreign"]
            pairs = pairs.where(F.col("capture_version").isNotNull())
        if not head["pairs"]:
            raise InputError("the capture holds no request/response pairs"
                             + (" in the --since/--until range" if options.since or options.until else ""))
        os.makedirs(os.path.join(out, "tables"), exist_ok=True)
        result = Result(out=out, summary={})
        written = _write_tables(spark, pairs, out, options, progress)
        for name, _ in _PLAN:                                # summary.json lists them in plan order
            result.tables[name], result.table_rows[name] = written[name]
        if options.policy is not None:
            _write_policy_table(spark, inputs, out, options, result, progress)
        progress.stage("summary.json", lambda: _summary(spark, head, inputs, result, options),
                       lambda s: f"{len(s['proxies'])} proxies, {s['client_ids']} client ids, "
                                 f"{s['topics']} topics")
        if options.report:
            from .report import write_report
            report_tables = {name: _rows(path, PLOTTED_REPORT_ROWS if name in PLOTTED_TABLES else REPORT_ROWS)
                             for name, path in result.tables.items()}
            result.report = progress.stage(
                "report", lambda: write_report(out, report_tables, result.summary), lambda path: path)
        return result
    finally:
        scan.release()
        restore()


def _set_for_run(spark: SparkSession, settings: dict[str, str]):
    """Set Spark SQL ``settings`` on the session; returns what puts the earlier values back
    (a notebook's or the tests' session outlives the run)."""
    earlier = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)

    def restore() -> None:
        for key, value in earlier.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
    return restore


def _write_tables(spark: SparkSession, pairs: DataFrame, out: str, options: Options,
                  progress: Progress) -> dict[str, tuple[str, int]]:
    """Write every table of ``_PLAN``, CONCURRENT_TABLES at a time: name -> (path, rows).

    A table built from others or from a shared step (``_NEEDS``) starts once they are
    written and reads them back from their Parquet. Shared steps are submitted first, then
    tables in plan order, which lists a table after those it needs, so a waiting table
    never holds back one it waits for.
    """
    removed = T.removed_versions(spark)
    futures: dict[str, Future] = {}
    schemas: dict[str, StructType] = {}

    def build(name: str, make) -> tuple[str, int]:
        # A pool per table: under spark.scheduler.mode=FAIR (kproxy's local Spark) pools share
        # the executors fairly; in one pool (FIFO) a small table queues behind a large one.
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", name)
        # Read back with the schema it was written with: Spark would otherwise run a job per
        # table read to take it from a Parquet footer.
        built = {}
        for need in _NEEDS.get(name, ()):
            written = futures[need].result()[0]          # its schema is known once this returns
            built[need] = spark.read.schema(schemas[need]).parquet(written)
        df = make(pairs, built, options, removed)
        schemas[name] = df.schema
        path = os.path.join(out, "tables" if name in TABLE_NAMES else WORK_DIR, name)
        rows = progress.stage(name, lambda: _write(df, path), lambda n: f"{n:,} rows")
        return path, rows

    try:
        with ThreadPoolExecutor(max_workers=CONCURRENT_TABLES, thread_name_prefix="table") as pool:
            for name, make in _SHARED + _PLAN:
                futures[name] = pool.submit(build, name, make)
            try:
                return {name: futures[name].result() for name in TABLE_NAMES}
            except BaseException:
                for future in futures.values():      # a failed table: start no more of them
                    future.cancel()
                raise
    finally:
        shutil.rmtree(os.path.join(out, WORK_DIR), ignore_errors=True)


def _write_policy_table(spark: SparkSession, inputs: Inputs, out: str, options: Options, result: Result,
                        progress: Progress) -> None:
    """The ``policy_violations`` table (from the capture files themselves: JSONL rows keep the
    request bodies that the shared frame leaves out)."""
    from .policy import judged_without_bodies, policy_violations
    name = "policy_violations"
    path = os.path.join(out, "tables", name)
    df = policy_violations(spark, inputs, options.policy, options.since, options.until)
    result.tables[name], result.table_rows[name] = path, progress.stage(
        name, lambda: _write(df, path), lambda n: f"{n:,} rows")
    result.policy = {"file": options.policy.source, "rules": [r.name for r in options.policy.rules],
                     "enforced": [r.name for r in options.policy.rules if r.enforce],
                     "not_judged": judged_without_bodies(options.policy) if inputs.format == "parquet" else []}


def _import_report() -> None:
    from . import report  # noqa: F401


def _describe(inputs: Inputs) -> str:
    text = f"reading {len(inputs.files)} {inputs.format} file{'s' * (len(inputs.files) != 1)}"
    extras = list(inputs.skipped)
    if inputs.pruned:
        extras.append(f"{inputs.pruned} files end before --since")
    return text + (f" (left out: {'; '.join(extras)})" if extras else "")


# name, builder(pairs, built tables, options, removed versions): the order respects dependencies.
_PLAN = (
    ("api_latency", lambda p, b, o, r: T.api_latency(p)),
    ("api_errors", lambda p, b, o, r: T.errors_of_latency(p, b["api_latency"])),
    ("series", lambda p, b, o, r: T.series(p, o.window_seconds)),
    ("anomalies", lambda p, b, o, r: T.anomalies(b["series"])),
    ("clients", lambda p, b, o, r: T.clients(p)),
    ("client_inventory", lambda p, b, o, r: T.inventory_of_connections(b["per_connection"])),
    ("latency_split", lambda p, b, o, r: T.latency_split(p)),
    ("upgrade_readiness", lambda p, b, o, r: T.upgrade_readiness(p, r)),
    ("topic_clients", lambda p, b, o, r: T.topic_clients(p)),
    ("topics", lambda p, b, o, r: T.topics(p, b["topic_clients"])),
    ("rebalances", lambda p, b, o, r: T.rebalances(p)),
    ("group_members", lambda p, b, o, r: T.group_members(p, o.window_seconds)),
    ("group_errors", lambda p, b, o, r: T.group_errors(p)),
    ("groups", lambda p, b, o, r: T.groups(p, b["rebalances"], b["group_members"], b["group_errors"])),
    ("slowest", lambda p, b, o, r: T.slowest(p, o.top)),
    ("connections", lambda p, b, o, r: T.churn_of_connections(b["per_connection"])),
    ("instances", lambda p, b, o, r: T.instances(p)),
    ("failovers", lambda p, b, o, r: failover_tables.failovers(p)),
    ("leader_changes", lambda p, b, o, r: failover_tables.leader_changes(p)),
    ("audit", lambda p, b, o, r: audit_table.audit(p)),
)
TABLE_NAMES = tuple(name for name, _ in _PLAN)
# Steps whose output more than one table starts from, written first under ``out/WORK_DIR``
# and removed once the tables are: one aggregation of the pairs instead of one per table.
_SHARED = (
    ("per_connection", lambda p, b, o, r: T.per_connection(p)),
)
WORK_DIR = ".work"
# Tables built from other tables or shared steps (the ``built`` argument above), which must
# be written first.
_NEEDS = {"api_errors": ("api_latency",), "anomalies": ("series",), "topics": ("topic_clients",),
          "groups": ("rebalances", "group_members", "group_errors"),
          "client_inventory": ("per_connection",), "connections": ("per_connection",)}


def _policy_summary(result: Result, read) -> dict:
    """summary.json's ``policy``: the rules file, and the violations found (with --policy)."""
    if result.policy is None:
        return {}
    import pyarrow.compute as pc
    table = read(result.tables["policy_violations"], ["violations"])
    return {"policy": {**result.policy, "violations": pc.sum(table["violations"]).as_py() or 0}}


def _summary(spark: SparkSession, head: dict, inputs: Inputs, result: Result, options: Options) -> dict:
    """The headline figures (summary.json): from the headline pass and the small tables.

    The tables are aggregates already written to the driver's disk (the report reads them
    there too), so pyarrow reads them: a dozen tiny Spark jobs cost seconds, this costs
    milliseconds.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    paths = result.tables
    read = _arrow
    by_error = read(paths["api_errors"], ["error", "pairs"]).group_by("error").aggregate([("pairs", "sum")])
    errors = (pa.table({"error": by_error["error"], "pairs": by_error["pairs_sum"]})
              .sort_by([("pairs", "descending"), ("error", "ascending")]).slice(0, SUMMARY_TOP).to_pylist())
    latency = read(paths["api_latency"], ["api_name", "api_version", "latency_p99_ms", "requests"])
    worst = (latency.filter(pc.and_(pc.greater_equal(latency["requests"], WORST_P99_MIN_REQUESTS),
                                    pc.is_valid(latency["latency_p99_ms"])))
             .sort_by([("latency_p99_ms", "descending")]).slice(0, 1).to_pylist())
    groups = read(paths["groups"], ["rebalances"])
    # Distinct clients and connections of the pairs, from the tables keyed by them: one row
    # per (client_id, client_host), and every connection counted once per client and proxy.
    clients = read(paths["clients"], ["client_id", "client_host"])
    apis = read(paths["api_latency"], ["api_name"])
    removed = read(paths["upgrade_readiness"], ["client_id", "client_host"])
    connections = pc.sum(read(paths["connections"], ["connections"])["connections"]).as_py() or 0
    first, last = head["first"], head["last"]
    summary = {
        "pairs": head["pairs"],
        "first_time": _iso(first),
        "last_time": _iso(last),
        "span_seconds": (last - first).total_seconds(),
        "proxies": head["proxies"],
        "client_ids": pc.count_distinct(clients["client_id"]).as_py(),       # nulls not counted
        "client_addresses": pc.count_distinct(clients["client_host"]).as_py(),
        "connections": connections,
        "topics": read(paths["topics"], []).num_rows,
        "apis": len(apis.group_by("api_name").aggregate([])),
        "top_errors": [{"error": r["error"], "pairs": r["pairs"]} for r in errors],
        "worst_p99": ({"api": worst[0]["api_name"], "version": worst[0]["api_version"],
                       "latency_p99_ms": worst[0]["latency_p99_ms"], "requests": worst[0]["requests"]}
                      if worst else None),
        "groups": groups.num_rows,
        "rebalances": pc.sum(groups["rebalances"]).as_py() or 0,
        "anomalies": read(paths["anomalies"], []).num_rows,
        "failovers": read(paths["failovers"], []).num_rows,
        "audit_events": read(paths["audit"], []).num_rows,
        **_policy_summary(result, read),
        "clients_on_removed_versions": len(removed.group_by(["client_id", "client_host"]).aggregate([])),
        "inputs": {"format": inputs.format, "files": len(inputs.files), "pruned_files": inputs.pruned},
        "capture_versions": head["versions"],
        "unreadable_rows": head["foreign"],
        "table_rows": dict(result.table_rows),
        "window_seconds": options.window_seconds,
        "since": _iso(options.since), "until": _iso(options.until),
        "percentile_accuracy": T.PERCENTILE_ACCURACY,
        "generated_at": _iso(dt.datetime.now(dt.timezone.utc)),
        "kproxy_version": __version__,
        "spark_version": spark.version,
    }
    with open(os.path.join(result.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    result.summary = summary
    return summary
