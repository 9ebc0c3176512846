#!/usr/bin/env python3
"""``kproxy analyze`` end to end on synthetic captures: rows per second and peak memory.

For each size (default 1 M and 10 M pairs) it writes a synthetic capture
(``kproxy.pipeline.synthetic``: one hour of traffic per million pairs, kept in
a cache directory for later runs), then runs ``python -m kproxy analyze DIR
--out OUT --master local[2]`` as a subprocess, as a user would, and reports
wall time (JVM start included), pairs per second, the time of each stage (from
the job's own progress lines) and peak resident memory of the Python driver
and of its JVM (``VmHWM`` from /proc, polled while they run), and the load
average around each run (the machine may be shared: compare runs made together).

In the same run, unless ``--no-duckdb``, a single-process columnar engine
(DuckDB, in its own process, ``DUCKDB_THREADS`` threads like ``local[2]``)
computes the headline tables on the same files: per API and version (latency
percentiles, bytes, errors), per client, per topic. Spark's wall time over
DuckDB's is the overhead the Spark job's design pays. DuckDB is optional and
benchmark-only (``pip install duckdb``); without it the ratio is left out.

``--code DIR`` (repeatable) runs the kproxy checked out at DIR instead of this
one, so two commits are compared in one run on the same input: ``--code
/path/to/old --code . --repeat 3`` alternates old and new three times per size
and prints each one's median wall time and the ratio of the medians.

    python benchmarks/bench_analyze.py [--rows 1000000,10000000] [--json] [--no-report]
        [--cache DIR] [--master local[2]] [--spark-conf KEY=VALUE ...] [--timeout S]
        [--code DIR ...] [--repeat N] [--no-duckdb] [--row-group-rows N]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kproxy.pipeline.synthetic import ROW_GROUP_ROWS, write_synthetic  # noqa: E402

DEFAULT_ROWS = (1_000_000, 10_000_000)
CHUNK_ROWS = 1_000_000             # generated one hour at a time: 10 M pairs at once would need ~6 GiB
CHUNK_SPAN_S = 3600.0
FILES_PER_CHUNK = 2                # a capture rotating at ~35 MB (Parquet, zstd) per 500 k pairs
START = dt.datetime(2026, 11, 23, 0, 0, tzinfo=dt.timezone.utc)
POLL_S = 0.2                       # /proc sampling period; VmHWM is the kernel's own peak, so it only
                                   # needs reading before the process exits
DUCKDB_THREADS = 2                 # as many as local[2] gives Spark
_STAGE = re.compile(r"^\[analyze\s+[\d.]+s\] (?:\d+/\d+ )?(?P<name>[^:]+): (?P<what>.*) \((?P<s>[\d.]+)s\)$")


def capture(cache: Path, rows: int, row_group_rows: int = ROW_GROUP_ROWS) -> Path:
    """The synthetic capture of ``rows`` pairs, generated once into ``cache``, one chunk at a
    time (memory bounded by CHUNK_ROWS whatever ``rows``)."""
    shaped = "" if row_group_rows == ROW_GROUP_ROWS else f"-rg{row_group_rows}"
    directory = cache / f"synthetic-{rows}{shaped}"
    done = directory / ".complete"
    if done.exists():
        return directory
    shutil.rmtree(directory, ignore_errors=True)
    began = time.monotonic()
    written = 0
    for chunk in range(-(-rows // CHUNK_ROWS)):
        size = min(CHUNK_ROWS, rows - written)
        write_synthetic(str(directory), size, files=FILES_PER_CHUNK, seed=chunk,
                        prefix="kproxy-capture", start=START + dt.timedelta(seconds=chunk * CHUNK_SPAN_S),
                        span_seconds=CHUNK_SPAN_S * size / CHUNK_ROWS, row_group_rows=row_group_rows)
        written += size
    done.write_text(f"{rows}\n")
    print(f"generated {rows:,} pairs in {time.monotonic() - began:.0f}s under {directory}", file=sys.stderr)
    return directory


def _status(pid: int, key: str) -> int:
    """A /proc/PID/status figure in kB (0 once the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _descendants(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        try:
            with open(f"/proc/{parent}/task/{parent}/children") as f:
                children = [int(c) for c in f.read().split()]
        except OSError:
            children = []
        found.extend(children)
        frontier.extend(children)
    return found


def _cpu_s(pid: int) -> float:
    """User plus system CPU seconds a process has used so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")    # utime, stime


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


class PeakMemory(threading.Thread):
    """Polls the driver process and its JVM child for their peak resident set (VmHWM)."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid = pid
        self.python_kb = 0
        self.jvm_kb = 0
        # CPU seconds of the driver and every descendant, the last figure read of each: the
        # load changes them far less than wall time. A process's last POLL_S is missed.
        self.cpu_by_pid: dict[int, float] = {}
        self.finished = threading.Event()

    def run(self) -> None:
        while not self.finished.is_set():
            self.python_kb = max(self.python_kb, _status(self.pid, "VmHWM"))
            for pid in (self.pid, *_descendants(self.pid)):
                self.cpu_by_pid[pid] = max(self.cpu_by_pid.get(pid, 0.0), _cpu_s(pid))
            for child in _descendants(self.pid):
                if _comm(child) == "java":
                    self.jvm_kb = max(self.jvm_kb, _status(child, "VmHWM"))
            self.finished.wait(POLL_S)


def run_analyze(directory: Path, rows: int, args, code: Path = ROOT) -> dict:
    """Time one ``kproxy analyze`` subprocess of the kproxy at ``code``; its progress lines are
    echoed to stderr as they come."""
    out = Path(tempfile.mkdtemp(prefix="kproxy-bench-analyze-out-"))
    command = [sys.executable, "-m", "kproxy", "analyze", str(directory), "--out", str(out),
               "--master", args.master]
    if args.no_report:
        command.append("--no-report")
    env = dict(os.environ, PYTHONPATH=str(code) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if args.spark_conf:
        env["PYSPARK_SUBMIT_ARGS"] = " ".join(f"--conf {c}" for c in args.spark_conf) + " pyspark-shell"
    load_before = os.getloadavg()[0]
    began = time.monotonic()
    process = subprocess.Popen(command, cwd=code, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)     # its JVM is in its session
    memory = PeakMemory(process.pid)
    memory.start()
    stages: dict[str, float] = {}
    errors: list[str] = []
    log_path = args.cache_dir / f"analyze-{rows}.log"          # Spark's warnings and errors, whole

    def read_progress() -> None:
        with open(log_path, "w") as log:
            for line in process.stderr:
                log.write(line)
                line = line.rstrip()
                match = _STAGE.match(line)
                if match:
                    stages[match["name"]] = float(match["s"])
                if line.startswith("[analyze") or line.startswith("kproxy analyze"):
                    print(f"  {line}", file=sys.stderr, flush=True)
                elif " ERROR " in line or "Error:" in line:
                    errors.append(line)

    reader = threading.Thread(target=read_progress, daemon=True)
    reader.start()
    try:
        process.wait(timeout=args.timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)           # the driver and its JVM, nothing else
        process.wait()
        timed_out = True
    wall = time.monotonic() - began
    reader.join()
    memory.finished.set()
    memory.join()
    result = {"code": str(code), "rows": rows, "files": sum(1 for p in directory.glob("*.parquet")),
              "capture_mb": round(sum(p.stat().st_size for p in directory.glob("*.parquet")) / 1e6, 1),
              "wall_s": round(wall, 1), "rows_per_s": None if timed_out else round(rows / wall),
              "stage_s": stages, "stages_total_s": round(sum(stages.values()), 1),
              "peak_jvm_mb": round(memory.jvm_kb / 1024), "peak_python_mb": round(memory.python_kb / 1024),
              "cpu_s": round(sum(memory.cpu_by_pid.values()), 1),
              "load_1min": [round(load_before, 1), round(os.getloadavg()[0], 1)]}
    if timed_out:
        result["error"] = f"stopped after --timeout {args.timeout:g}s"
    elif process.returncode != 0:
        result["rows_per_s"] = None
        result["error"] = (f"exit {process.returncode}: " + (errors[0] if errors else "see the log"))[:300]
    else:
        with open(out / "summary.json") as f:
            pairs = json.load(f)["pairs"]
        if pairs != rows:
            result["error"] = f"summary.json counts {pairs:,} pairs, the capture holds {rows:,}"
    if "error" in result:
        result["log"] = str(log_path)
    shutil.rmtree(out, ignore_errors=True)
    return result


# The headline tables in DuckDB SQL, as close to ``kproxy.pipeline.tables`` as its functions
# allow (exact quantiles instead of percentile_approx): the work a single process needs.
_LONG_POLL = ("outcome = 'response' AND api_name IN ('Fetch', 'ShareFetch') "
              "AND coalesce(record_count, 0) = 0")
DUCKDB_TABLES = {
    "api_latency": f"""
        SELECT api_name, api_key, api_version, count(*) AS requests,
               count_if(outcome = 'response') AS answered,
               quantile_disc(CASE WHEN NOT ({_LONG_POLL}) THEN latency_ms END, [0.5, 0.95, 0.99]) AS q,
               max(CASE WHEN NOT ({_LONG_POLL}) THEN latency_ms END) AS latency_max_ms,
               count_if({_LONG_POLL}) AS long_polls,
               quantile_disc(CASE WHEN {_LONG_POLL} THEN latency_ms END, [0.5, 0.99]) AS lq,
               sum(request_size) AS request_bytes, sum(coalesce(response_size, 0)) AS response_bytes,
               count_if(error_count > 0) AS error_pairs, count_if(coalesce(throttle_ms, 0) > 0) AS throttled,
               max(throttle_ms) AS throttle_max_ms
        FROM pairs GROUP BY ALL ORDER BY api_key, api_version""",
    "clients": """
        SELECT client_id, client_host,
               count(DISTINCT (proxy_instance, connection_start, connection_id)) AS connections,
               count(*) AS requests, sum(request_size) AS request_bytes,
               sum(coalesce(response_size, 0)) AS response_bytes,
               coalesce(sum(CASE WHEN api_name = 'Produce' AND error_count = 0
                                  AND outcome <> 'unanswered' THEN record_count END), 0) AS records_produced,
               coalesce(sum(CASE WHEN api_name IN ('Fetch', 'ShareFetch') THEN record_count END), 0)
                   AS records_fetched,
               count_if(error_count > 0) AS error_pairs,
               list_sort(list(DISTINCT api_name || ' v' || api_version)) AS api_versions,
               list_sort(list(DISTINCT concat_ws(' ', client_software_name, client_software_version)))
                   AS software,
               list_sort(list(DISTINCT proxy_instance)) AS proxies,
               min(time) AS first_seen, max(time) AS last_seen
        FROM pairs GROUP BY ALL ORDER BY requests DESC, client_id, client_host""",
    "topics": """
        WITH flows AS (
            SELECT t.topic AS topic,
                   CASE WHEN api_name = 'Produce' THEN 'producer' ELSE 'consumer' END AS role,
                   client_id,
                   api_name = 'Produce' AND NOT (error_count = 0 AND outcome <> 'unanswered') AS rejected,
                   t.record_count AS record_count, t.record_bytes AS record_bytes
            FROM (SELECT api_name, client_id, error_count, outcome, unnest(topic_records) AS t
                  FROM pairs WHERE api_name IN ('Produce', 'Fetch', 'ShareFetch'))),
        traffic AS (
            SELECT topic,
                   sum(CASE WHEN role = 'producer' AND NOT rejected THEN record_count ELSE 0 END)
                       AS produced_records,
                   sum(CASE WHEN role = 'producer' AND NOT rejected THEN record_bytes ELSE 0 END)
                       AS produced_bytes,
                   sum(CASE WHEN role = 'consumer' THEN record_count ELSE 0 END) AS fetched_records,
                   sum(CASE WHEN role = 'consumer' THEN record_bytes ELSE 0 END) AS fetched_bytes,
                   list_sort(list(DISTINCT client_id) FILTER (WHERE role = 'producer')) AS producers,
                   list_sort(list(DISTINCT client_id) FILTER (WHERE role = 'consumer')) AS consumers
            FROM flows GROUP BY topic),
        named AS (SELECT unnest(topics) AS topic, count(*) AS pairs FROM pairs GROUP BY 1)
        SELECT named.topic, pairs, coalesce(produced_records, 0) AS produced_records,
               coalesce(produced_bytes, 0) AS produced_bytes, coalesce(fetched_records, 0) AS fetched_records,
               coalesce(fetched_bytes, 0) AS fetched_bytes, producers, consumers
        FROM named LEFT JOIN traffic USING (topic)
        ORDER BY produced_records DESC, fetched_records DESC, topic""",
}


def duckdb_tables(directory: str) -> dict:
    """(In the child process) DuckDB's time for the headline tables of the capture at ``directory``."""
    import duckdb
    began = time.monotonic()
    db = duckdb.connect(config={"threads": DUCKDB_THREADS})
    db.execute(f"CREATE VIEW pairs AS SELECT * FROM read_parquet('{directory}/*.parquet')")
    stage_s, rows = {}, {}
    for name, sql in DUCKDB_TABLES.items():
        start = time.monotonic()
        rows[name] = len(db.execute(sql).fetchall())
        stage_s[name] = round(time.monotonic() - start, 2)
    return {"wall_s": round(time.monotonic() - began, 2), "stage_s": stage_s, "rows": rows}


def run_duckdb(directory: Path) -> dict | None:
    """DuckDB's headline tables in a process of its own (interpreter start and import
    included, as Spark's JVM start is); None when DuckDB is not installed."""
    try:
        import duckdb  # noqa: F401  (only whether it is there)
    except ImportError:
        return None
    load_before = os.getloadavg()[0]
    began = time.monotonic()
    done = subprocess.run([sys.executable, __file__, "--duckdb-child", str(directory)],
                          capture_output=True, text=True, check=True)
    result = json.loads(done.stdout)
    result["process_s"] = round(time.monotonic() - began, 2)
    result["load_1min"] = [round(load_before, 1), round(os.getloadavg()[0], 1)]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(str(r) for r in DEFAULT_ROWS),
                        help="comma-separated capture sizes in pairs (default 1000000,10000000)")
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "kproxy-bench-analyze"),
                        help="where generated captures are kept between runs")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--no-report", action="store_true", help="tables and summary.json only")
    parser.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark setting for the run (spark-submit --conf), repeatable")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="stop a run after S seconds and report the stages it finished")
    parser.add_argument("--code", action="append", default=[], metavar="DIR",
                        help="run the kproxy checked out at DIR (repeatable: compared side by side; "
                             "default: this checkout)")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="runs per size and --code, alternating between the --code trees")
    parser.add_argument("--no-duckdb", action="store_true",
                        help="leave out DuckDB's time for the headline tables (and the ratio)")
    parser.add_argument("--row-group-rows", type=int, default=ROW_GROUP_ROWS, metavar="N",
                        help="rows per Parquet row group of the generated capture (default: one per "
                             "file; kproxy's capture writer closes one per 1,000 rows)")
    parser.add_argument("--duckdb-child", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.duckdb_child:
        print(json.dumps(duckdb_tables(args.duckdb_child)))
        return 0
    args.cache_dir = Path(args.cache)
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    codes = [Path(c).resolve() for c in args.code] or [ROOT]
    for code in codes:
        if not (code / "kproxy" / "pipeline").is_dir():
            parser.error(f"--code {code}: no kproxy/pipeline there")
    results = []
    engines = []
    for rows in (int(r) for r in args.rows.split(",")):
        directory = capture(args.cache_dir, rows, args.row_group_rows)
        for _ in range(args.repeat):
            duck = None if args.no_duckdb else run_duckdb(directory)
            if duck is not None:
                duck["rows"], duck["table_rows"] = rows, duck["rows"]
                engines.append(duck)
                if not args.json:
                    print(f"{rows:>12,} pairs  {duck['process_s']:7.2f} s  DuckDB ({DUCKDB_THREADS} threads, "
                          f"own process; queries {duck['wall_s']:.2f} s: "
                          + ", ".join(f"{k} {v:.2f} s / {duck['table_rows'][k]:,} rows"
                                      for k, v in duck["stage_s"].items())
                          + f")  load {duck['load_1min'][0]}-{duck['load_1min'][1]}", flush=True)
            for code in codes:
                result = run_analyze(directory, rows, args, code)
                if duck is not None:
                    result["duckdb_s"] = duck["process_s"]
                    result["x_duckdb"] = round(result["wall_s"] / duck["process_s"], 1)
                results.append(result)
                if "error" in result:
                    print(f"{rows:,} pairs: {result['error']} (log: {result['log']})", file=sys.stderr)
                if not args.json:
                    speed = (f"{result['rows_per_s']:,} pairs/s" if result["rows_per_s"] else "did not finish")
                    label = f"  {code}" if len(codes) > 1 else ""
                    versus = f"  x{result['x_duckdb']:g} DuckDB" if "x_duckdb" in result else ""
                    stages = ", ".join(f"{k} {v:g}" for k, v in result["stage_s"].items())
                    print(f"{rows:>12,} pairs  stages (s): {stages}", flush=True)
                    print(f"{rows:>12,} pairs  {result['wall_s']:7.1f} s  {speed:>16}{versus}  "
                          f"{result['cpu_s']:g} CPU s  "
                          f"peak JVM {result['peak_jvm_mb']:,} MB, Python {result['peak_python_mb']:,} MB  "
                          f"load {result['load_1min'][0]}-{result['load_1min'][1]}{label}", flush=True)
        if len(codes) > 1 and not args.json:
            print(compare(rows, codes, results), flush=True)
    if args.json:
        print(json.dumps({"python": platform.python_version(), "machine": platform.machine(),
                          "cpus": os.cpu_count(), "master": args.master, "report": not args.no_report,
                          "spark_conf": args.spark_conf, "repeat": args.repeat,
                          "results": results, "duckdb": engines}, indent=2))
    return 0


def compare(rows: int, codes: list[Path], results: list[dict]) -> str:
    """Median wall time of each --code tree's finished runs at ``rows``, as a ratio to the first's."""
    medians = {}
    for code in codes:
        walls = [r["wall_s"] for r in results
                 if r["rows"] == rows and r["code"] == str(code) and "error" not in r]
        medians[code] = statistics.median(walls) if walls else None
    base = medians[codes[0]]
    lines = []
    for code, median in medians.items():
        ratio = f"  x{median / base:.2f} of the first" if base and median and code != codes[0] else ""
        lines.append(f"{rows:>12,} pairs  median {median if median is None else f'{median:.1f} s'}{ratio}  {code}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
