"""``kproxy analyze``: argument parsing, the Spark session, one-line errors.

Run directly (``kproxy analyze``) the master defaults to ``local[*]``; run by
``spark-submit`` (``kproxy/pipeline/submit.py``) the master and every other
setting come from spark-submit and nothing here overrides them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shutil
import sys
import threading

from .. import DISTRIBUTION

DEFAULT_MASTER = "local[*]"
DEFAULT_WINDOW = "1m"
DEFAULT_TOP = 20
# Shuffle partitions when kproxy starts a local Spark: the default 200 makes every
# aggregation of a laptop-sized capture pay for 200 tiny tasks. Per core, a few.
LOCAL_SHUFFLE_PARTITIONS_PER_CORE = 2
# Heap for a local Spark kproxy starts (driver and executors share it). Since the job
# caches no Parquet pairs, 10 M pairs run in Spark's default 1 GiB (1.5 GB peak RSS); the
# JSONL disk cache, shuffles of larger captures and wider tables still want headroom, so a
# quarter of the machine, within bounds; spark.driver.memory in PYSPARK_SUBMIT_ARGS (or
# spark-submit) wins.
LOCAL_DRIVER_MEMORY_SHARE = 0.25
LOCAL_DRIVER_MEMORY_MIN_MB = 1024
LOCAL_DRIVER_MEMORY_MAX_MB = 16 * 1024
# More settings when kproxy starts a local Spark (PYSPARK_SUBMIT_ARGS wins over each):
LOCAL_SETTINGS = {
    # The web UI costs a second or more of start and a listener per task; a local run reports
    # its own progress (job.Progress reads the status tracker, which needs no UI).
    "spark.ui.enabled": "false",
    # The job writes several tables at once from driver threads (job.CONCURRENT_TABLES):
    # shared fairly, a table of a few tasks is not queued behind a large one's many tasks.
    "spark.scheduler.mode": "FAIR",
}
LOG4J_CONFIG = os.path.join(os.path.dirname(__file__), "log4j2.properties")
# The JVM prints this line at start because Spark's launcher always passes
# --add-modules=jdk.incubator.vector (Spark's JavaModuleOptions; no setting turns it off)
# and the JVM has no option to silence it. It is no trouble, so kproxy does not pass it on.
JVM_INCUBATOR_NOTICE = b"WARNING: Using incubator modules: jdk.incubator.vector\n"
_UNITS = {"s": 1, "sec": 1, "second": 1, "seconds": 1, "m": 60, "min": 60, "minute": 60,
          "minutes": 60, "h": 3600, "hour": 3600, "hours": 3600, "d": 86400, "day": 86400, "days": 86400}


class UsageError(ValueError):
    """A bad argument or environment, said in one line."""


def parse_window(text: str) -> int:
    """``30s``, ``1m``, ``5 minutes``, ``2h`` or plain seconds → seconds."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", text.lower())
    if match is None or match[2] not in ("", *_UNITS):
        raise UsageError(f"--window: expected e.g. 30s, 1m, 5min, 1h, got {text!r}")
    seconds = int(match[1]) * (_UNITS[match[2]] if match[2] else 1)
    if seconds <= 0:
        raise UsageError("--window must be positive")
    return seconds


def parse_time(text: str, flag: str) -> dt.datetime:
    """ISO 8601 date/time; UTC unless it names a zone."""
    try:
        value = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"{flag}: expected an ISO 8601 UTC time like 2026-11-23T14:00:00Z, "
                         f"got {text!r}") from None
    return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value


def _policy(path: str | None):
    if path is None:
        return None
    from ..policy import PolicyError, load_policy
    try:
        return load_policy(path)
    except PolicyError as exc:
        raise UsageError(str(exc)) from None


def add_arguments(sub) -> None:
    """Register ``analyze`` on kproxy's subcommand parser."""
    parser = sub.add_parser("analyze", help="analyse capture files with Spark (tables, summary, report)",
                            description="Answer the questions an operator brings to a capture: "
                                        "latency, errors and throttling per API, time series and "
                                        "anomalies, clients and their software, topics, consumer "
                                        "groups, slow pairs and connection churn.")
    configure(parser, default_master=DEFAULT_MASTER)
    parser.set_defaults(command_parser=parser)      # reports its unknown arguments (kproxy/cli.py)


def configure(parser: argparse.ArgumentParser, default_master: str | None) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="capture file, capture directory, glob, Hadoop URI (hdfs://), uploaded "
                             "captures (s3a://BUCKET/PREFIX or s3://; endpoint and keys from the AWS_* "
                             "environment), or a topic of shipped rows (kafka://HOST:PORT/TOPIC)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="where tables/, summary.json, report.html and plots/ go")
    parser.add_argument("--since", type=str, help="UTC start (ISO 8601), inclusive")
    parser.add_argument("--until", type=str, help="UTC end (ISO 8601), exclusive")
    parser.add_argument("--window", default=DEFAULT_WINDOW, help="time-series bucket (default 1m)")
    parser.add_argument("--top", type=int, default=DEFAULT_TOP, help="slowest pairs to list (default 20)")
    parser.add_argument("--format", default="auto", choices=("auto", "parquet", "jsonl"),
                        help="capture format to read (auto: Parquet if present, else JSONL)")
    if default_master is not None:
        parser.add_argument("--master", default=default_master,
                            help=f"Spark master (default {default_master})")
    parser.add_argument("--no-report", action="store_true", help="tables and summary.json only")
    parser.add_argument("--policy", metavar="FILE",
                        help="a policy rules file (TOML/YAML, as kproxy's policy_file): the "
                             "policy_violations table and report section")
    parser.add_argument("--follow", action="store_true",
                        help="keep the series and the client inventory current over a directory of "
                             "rotating capture files (Structured Streaming)")
    parser.add_argument("--once", action="store_true",
                        help="with --follow: process the files there now, then stop")


def _check_java() -> None:
    if os.environ.get("PYSPARK_GATEWAY_PORT"):
        return                                       # spark-submit already started the JVM
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return
    if shutil.which("java") is None:
        raise UsageError("Java 17 or newer is needed (Spark runs on the JVM): install "
                         "openjdk-17-jre-headless or set JAVA_HOME")


def local_driver_memory_mb() -> int:
    """The heap for a local Spark: LOCAL_DRIVER_MEMORY_SHARE of physical memory, bounded
    (``jvm.heap_mb`` lowers it for a capture of known size)."""
    try:
        total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    except (ValueError, OSError, AttributeError):
        return LOCAL_DRIVER_MEMORY_MIN_MB
    return int(min(max(total_mb * LOCAL_DRIVER_MEMORY_SHARE, LOCAL_DRIVER_MEMORY_MIN_MB),
                   LOCAL_DRIVER_MEMORY_MAX_MB))


def session(master: str | None, jars: list[str] | tuple[str, ...] = (), java_options: str = "",
            pairs: int | None = None):
    """A SparkSession: ours with quiet logs when we start Spark, spark-submit's as it is otherwise.

    ``jars``: added to a Spark kproxy starts (spark-submit is given its own ``--packages``).
    ``java_options`` go to the driver JVM when we start it (``jvm``: class archive, JIT);
    ``pairs``, the capture's size when known, sizes its heap (``jvm.heap_mb``).
    """
    _check_java()
    from pyspark.sql import SparkSession
    from .jvm import heap_mb
    builder = SparkSession.builder.appName("kproxy analyze")
    if master is not None and jars:
        builder = builder.config("spark.jars", ",".join(jars))
    if master is not None:
        if master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            # Python workers (the policy table judges rows in Python) run this interpreter,
            # which has kproxy and its dependencies, not whatever python3 is on the PATH.
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            builder = builder.config("spark.sql.shuffle.partitions",
                                     str(LOCAL_SHUFFLE_PARTITIONS_PER_CORE * (os.cpu_count() or 1)))
            if "spark.driver.memory" not in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
                builder = builder.config("spark.driver.memory",
                                         f"{heap_mb(pairs, local_driver_memory_mb())}m")
            for key, value in LOCAL_SETTINGS.items():
                if key not in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
                    builder = builder.config(key, value)
        builder = (builder.master(master)
                   .config("spark.ui.showConsoleProgress", "false")      # Progress prints stages
                   .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}"
                           + (f" {java_options}" if java_options else "")))
        spark = _start_without_incubator_notice(builder)
    else:
        spark = builder.getOrCreate()
    spark.conf.set("spark.sql.session.timeZone", "UTC")                  # windows and times in UTC
    return spark


def _start_without_incubator_notice(builder):
    """``builder.getOrCreate()``, the JVM it starts writing its stderr through a filter.

    The JVM inherits file descriptor 2 when PySpark launches it, so for the launch only
    that descriptor is a pipe; a thread passes on every line but JVM_INCUBATOR_NOTICE to
    the real stderr for as long as the JVM (and anything it starts) writes to it.
    """
    read_end, write_end = os.pipe()
    real_stderr = os.dup(2)
    threading.Thread(target=_pass_on_stderr, args=(read_end, real_stderr),
                     name="jvm-stderr", daemon=True).start()
    sys.stderr.flush()
    os.dup2(write_end, 2)
    try:
        return builder.getOrCreate()
    finally:
        sys.stderr.flush()
        os.dup2(real_stderr, 2)
        os.close(write_end)                          # the JVM holds its own copy


def _pass_on_stderr(read_end: int, out: int) -> None:
    with os.fdopen(read_end, "rb") as lines, os.fdopen(out, "wb", buffering=0) as sink:
        for line in lines:
            if line != JVM_INCUBATOR_NOTICE:
                sink.write(line)


def _not_from_py4j(record) -> bool:
    return f"{os.sep}py4j{os.sep}" not in record.pathname


def run(args, master: str | None) -> int:
    try:
        from pyspark.errors import StreamingQueryException
        from pyspark.sql.utils import AnalysisException
    except ImportError:
        print(f"kproxy analyze: error: PySpark is not installed: pip install '{DISTRIBUTION}[analysis]'",
              file=sys.stderr)
        return 2
    from . import kafka_jars, kafka_source, s3_jars, s3_source
    from .job import Options, analyze
    from .jvm import ClassArchive, jit_options
    from .source import InputError, resolve_inputs
    import logging
    logging.getLogger("py4j").setLevel(logging.WARNING)     # its INFO lines say nothing to a user
    # py4j also logs on the root logger, with a traceback, each call that a Ctrl-C or the
    # JVM's exit broke; the caller gets that failure as an exception, so these only repeat it.
    logging.getLogger().addFilter(_not_from_py4j)
    try:
        options = Options(window_seconds=parse_window(args.window), top=args.top, fmt=args.format,
                          since=parse_time(args.since, "--since") if args.since else None,
                          until=parse_time(args.until, "--until") if args.until else None,
                          report=not args.no_report, policy=_policy(args.policy))
        if options.top <= 0:
            raise UsageError("--top must be positive")
        if args.once and not args.follow:
            raise UsageError("--once goes with --follow")
        if args.follow and options.policy is not None:
            raise UsageError("--policy is for a batch run (not --follow)")
        if "://" in args.out and not args.out.startswith("file://"):
            raise UsageError("--out must be a local directory (the report and summary are written "
                             "by the driver); the tables can be copied anywhere from there")
        args.out = args.out.removeprefix("file://")
        jars: list[str] = []
        inputs = None
        if any(kafka_source.is_kafka(p) for p in args.paths):
            kafka_source.one_input(args.paths)                        # fail fast, before Spark starts
            if master is not None:
                jars = kafka_jars.connector_jars()
        elif any(s3_source.is_s3(p) for p in args.paths):
            s3_source.check_paths(args.paths)                         # fail fast, before Spark starts
            if args.follow:
                raise UsageError("--follow reads a local directory or a kafka:// topic, not s3a://")
            if master is not None:
                s3_jars.check_hadoop()
                jars = s3_jars.s3a_jars()
        elif not args.follow:
            inputs = resolve_inputs(args.paths, options.fmt, options.since)   # fail fast, before Spark starts
        archive = ClassArchive.for_this_run() if master is not None and master.startswith("local") else None
        java_options = " ".join(filter(None, (archive.java_options() if archive else "",
                                              jit_options(inputs.pairs if inputs else None))))
        spark = session(master, jars, java_options, inputs.pairs if inputs else None)
        if args.follow:
            from .follow import follow
            follow(spark, args.paths, args.out, options, once=args.once)
            return 0
        result = analyze(spark, args.paths, args.out, options)
        if archive is not None and archive.recording is not None:
            print("kproxy analyze: saving the JVM's classes for faster starts (first run only)",
                  file=sys.stderr, flush=True)
            if archive.finish(spark):
                print(f"kproxy analyze: saved {archive.path}", file=sys.stderr)
    except (UsageError, InputError, kafka_jars.ConnectorError) as exc:
        print(f"kproxy analyze: error: {exc}", file=sys.stderr)
        return 2
    except (AnalysisException, StreamingQueryException) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"kproxy analyze: error: {first}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("kproxy analyze: interrupted", file=sys.stderr)
        return 130
    print(f"tables   {os.path.join(result.out, 'tables')}/ ({len(result.tables)})")
    print(f"summary  {os.path.join(result.out, 'summary.json')}")
    if result.report:
        print(f"report   {result.report}")
    return 0


def main(argv: list[str] | None = None, default_master: str | None = DEFAULT_MASTER) -> int:
    parser = argparse.ArgumentParser(prog="kproxy analyze")
    configure(parser, default_master)
    args = parser.parse_args(argv)
    return run(args, getattr(args, "master", None))
