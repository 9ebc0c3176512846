"""The cluster path, proven: ``spark-submit`` on a standalone cluster writes what local mode writes.

A Spark standalone master and one worker (1 core, 1 GiB) start on loopback from
the pyspark install's own ``bin/spark-class``; ``spark-submit --master
spark://127.0.0.1:PORT`` runs ``kproxy/pipeline/submit.py`` on a synthetic
capture, and the session's local SparkSession runs ``analyze`` on the same
files. Every table and ``summary.json`` must be equal.

Exactly equal, percentiles included, and that is by construction, not luck:
``percentile_approx`` (Greenwald-Khanna summaries, relative error
1 / PERCENTILE_ACCURACY) only merges samples or widens their rank bounds once a
partial summary holds ACCURACY / 2 values. Below that every summary keeps every
value with no rank uncertainty and the answer is the exact order statistic,
however Spark splits and merges the rows. Every percentile the tables take is
over a subset of the pairs (or of the connections or generations, fewer still),
so a capture of fewer than ACCURACY / 2 pairs makes all of them exact. Larger
captures can differ by a rank between two partitionings, within the documented
accuracy; the test asserts its own precondition so a bigger capture fails loudly
instead of flaking.

The executors are given a Python interpreter that does not exist: the job runs
Spark SQL only (no UDFs, no DataFrames built from Python rows), so executors
never start Python, and the run proves they need neither Python nor kproxy.

A soak test (``--soak-seconds N``, tests/soak.py): four JVMs and the whole job on one
executor core take a minute on an idle two-core machine, the default suite's largest item.
The default suite keeps what it is made of: every table against plain Python in local
mode (``test_tables.py``), the same tables from JSONL and Parquet (``test_live.py``), and
``python -m kproxy.pipeline.submit --path`` naming the entry file (``test_cli.py``).
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass

import pyarrow.parquet as pq
import pyspark
import pytest

from kproxy.pipeline import TABLE_NAMES, Options, analyze
from kproxy.pipeline.synthetic import write_synthetic
from kproxy.pipeline.tables import PERCENTILE_ACCURACY

pytestmark = [pytest.mark.spark, pytest.mark.soak]

SPARK_HOME = os.path.dirname(pyspark.__file__)          # pip's pyspark is a whole Spark install
SPARK_CLASS = os.path.join(SPARK_HOME, "bin", "spark-class")
SPARK_SUBMIT = os.path.join(SPARK_HOME, "bin", "spark-submit")
APP_NAME = "kproxy analyze"                              # what kproxy.pipeline.cli.session names it
# Below PERCENTILE_ACCURACY / 2 pairs every percentile is exact (module docstring), and
# four files give Spark four input partitions to split the work across.
CAPTURE_PAIRS = 4_000
CAPTURE_FILES = 4
CAPTURE_SPAN_S = 900.0            # 15 one-minute windows: busy enough for anomalies to show
WORKER_CORES = 1
WORKER_MEMORY = "1g"
EXECUTOR_MEMORY = "512m"          # fits the worker's 1 GiB; a few thousand pairs need little
DAEMON_MEMORY = "256m"            # master and worker heaps: they only schedule
# Local mode uses 2 shuffle partitions (conftest); the cluster run another number, so the
# equality below holds across partitionings, not just across masters.
CLUSTER_SHUFFLE_PARTITIONS = 3
# Executors' Python: none. Any Python work on an executor would fail the job.
EXECUTOR_PYTHON = "/nonexistent/executor-python"
START_TIMEOUT_S = 120             # cold JVMs on a shared two-core machine
SUBMIT_TIMEOUT_S = 480
STOP_TIMEOUT_S = 20
POLL_S = 0.5
# Short-lived JVMs: C1 alone compiles less and sooner than tiered C2 (the run is seconds
# of work, not hours), and the serial collector suits their small heaps.
SHORT_JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# A log4j line at ERROR level: "26/11/23 16:04:42 ERROR TaskSetManager: ..."
ERROR_LINE = re.compile(r"^\S+ \S+ ERROR ", re.MULTILINE)


@dataclass
class Cluster:
    url: str                      # spark://127.0.0.1:PORT
    web: str                      # the master's web UI, whose /json/ reports workers and apps
    root: str                     # a temporary directory: logs, work, conf, local files
    work_dir: str                 # the worker's: app-*/<executor>/stderr are the executors' logs
    env: dict


def spark_env(root: str) -> dict:
    """The environment for the daemons, hence the executors: loopback, files under ``root``.

    No SPARK_LOG_DIR, SPARK_PID_DIR or SPARK_NO_DAEMONIZE: those are for ``sbin/`` scripts;
    ``spark-class`` runs the daemon in the foreground, logging to the stream it is given.
    """
    conf_dir = os.path.join(root, "conf")                 # empty: no host spark-defaults or log4j
    local_dir = os.path.join(root, "local")               # shuffle and spill files
    os.makedirs(conf_dir, exist_ok=True)
    os.makedirs(local_dir, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))}
    env.pop("PYTHONPATH", None)      # executors see only what Spark itself puts on their path
    env.update(SPARK_HOME=SPARK_HOME, SPARK_CONF_DIR=conf_dir, SPARK_LOCAL_DIRS=local_dir,
               SPARK_LOCAL_IP="127.0.0.1",                 # every Spark socket binds to loopback
               SPARK_DAEMON_MEMORY=DAEMON_MEMORY, SPARK_DAEMON_JAVA_OPTS=SHORT_JVM_OPTS,
               # The master's REST submission server would take the fixed port 6066.
               SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def driver_env(cluster: Cluster) -> dict:
    """spark-submit's: the daemons' plus this process's PYTHONPATH (a worktree's kproxy).

    The Python driver gets it; executors do not (PySpark hands them only spark.executorEnv.*).
    """
    env = dict(cluster.env)
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def _start(main_class: str, args: list[str], log_path: str, env: dict) -> subprocess.Popen:
    """A Spark daemon in its own process group (it and the executors it forks die together)."""
    with open(log_path, "wb") as log:
        return subprocess.Popen([SPARK_CLASS, main_class, *args], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)


def _stop(process: subprocess.Popen) -> None:
    """TERM the daemon's group, KILL what is left: no JVM outlives the module."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)             # executors the worker forked, if any
    except ProcessLookupError:
        pass
    process.wait()


def _tail(path: str, lines: int = 40) -> str:
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def _wait_for(what: str, process: subprocess.Popen, log_path: str, check):
    """Poll ``check()`` until it returns something, failing early if the daemon exits."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        if process.poll() is not None:
            pytest.fail(f"{what} exited with {process.returncode}:\n{_tail(log_path)}")
        time.sleep(POLL_S)
    pytest.fail(f"{what} not ready within {START_TIMEOUT_S} s:\n{_tail(log_path)}")


def _in_log(log_path: str, pattern: str):
    def check():
        with open(log_path, errors="replace") as f:
            return re.search(pattern, f.read())
    return check


def master_state(web: str) -> dict:
    with urllib.request.urlopen(f"{web}/json/", timeout=10) as response:
        return json.load(response)


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory):
    """A standalone master and one worker on loopback, on ports the kernel picks (0)."""
    root = str(tmp_path_factory.mktemp("spark-standalone"))
    env = spark_env(root)
    work_dir = os.path.join(root, "work")
    master_log, worker_log = os.path.join(root, "master.log"), os.path.join(root, "worker.log")
    master = _start("org.apache.spark.deploy.master.Master",
                    ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0"], master_log, env)
    worker = None
    try:
        url = _wait_for("master", master, master_log,
                        _in_log(master_log, r"Starting Spark master at (spark://\S+)"))[1]
        web_port = _wait_for("master web UI", master, master_log,
                             _in_log(master_log, r"started service 'MasterUI' on port (\d+)"))[1]
        web = f"http://127.0.0.1:{web_port}"
        worker = _start("org.apache.spark.deploy.worker.Worker",
                        [url, "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
                         "--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY,
                         "--work-dir", work_dir], worker_log, env)
        _wait_for("worker registration", worker, worker_log,
                  lambda: master_state(web)["aliveworkers"] >= 1)
        yield Cluster(url=url, web=web, root=root, work_dir=work_dir, env=env)
    finally:
        if worker is not None:
            _stop(worker)
        _stop(master)


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    directory = tmp_path_factory.mktemp("cluster-capture")
    write_synthetic(str(directory), CAPTURE_PAIRS, files=CAPTURE_FILES, seed=11,
                    span_seconds=CAPTURE_SPAN_S)
    return str(directory)


@dataclass
class Runs:
    cluster_out: str              # written by spark-submit on the standalone cluster
    local_out: str                # written by analyze() in the session's local SparkSession
    returncode: int               # spark-submit's
    stdout: str
    stderr: str


def submit_command(cluster: Cluster, capture: str, out: str) -> list[str]:
    """``spark-submit`` of the file ``python -m kproxy.pipeline.submit --path`` names."""
    submit_file = subprocess.run([sys.executable, "-m", "kproxy.pipeline.submit", "--path"],
                                 env=driver_env(cluster), capture_output=True, text=True,
                                 check=True).stdout.strip()
    return [SPARK_SUBMIT, "--master", cluster.url,
            "--executor-memory", EXECUTOR_MEMORY, "--driver-java-options", SHORT_JVM_OPTS,
            "--conf", f"spark.executor.extraJavaOptions={SHORT_JVM_OPTS}",
            "--conf", f"spark.pyspark.driver.python={sys.executable}",
            "--conf", f"spark.pyspark.python={EXECUTOR_PYTHON}",
            "--conf", "spark.ui.enabled=false",
            "--conf", f"spark.sql.shuffle.partitions={CLUSTER_SHUFFLE_PARTITIONS}",
            submit_file, capture, "--out", out, "--no-report"]


@pytest.fixture(scope="module")
def runs(standalone_cluster, capture, spark, tmp_path_factory) -> Runs:
    """The same capture analysed by spark-submit on the cluster and in local mode, side by side."""
    root = standalone_cluster.root
    assert not os.path.exists(EXECUTOR_PYTHON)
    cluster_out = str(tmp_path_factory.mktemp("cluster-out"))
    local_out = str(tmp_path_factory.mktemp("local-out"))
    out_path, err_path = os.path.join(root, "submit.out"), os.path.join(root, "submit.err")
    with open(out_path, "wb") as out, open(err_path, "wb") as err:     # files: no pipe to drain meanwhile
        process = subprocess.Popen(submit_command(standalone_cluster, capture, cluster_out),
                                   stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                   env=driver_env(standalone_cluster), cwd=root, start_new_session=True)
    try:
        analyze(spark, [capture], local_out, Options(report=False))
        process.wait(SUBMIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"spark-submit still running after {SUBMIT_TIMEOUT_S} s:\n{_tail(err_path)}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)          # the JVM and the Python driver it runs
            process.wait()
    with open(out_path, errors="replace") as out, open(err_path, errors="replace") as err:
        return Runs(cluster_out, local_out, process.returncode, out.read(), err.read())


# Tables the synthetic capture has no rows for (no telemetry pushes, no per-partition
# answers, no cluster changes): compared all the same (both empty); their content is
# proven against live traffic in test_latency_split, test_failovers_audit and the policy tests.
SYNTHETIC_LACKS = frozenset({"latency_split", "failovers", "leader_changes", "audit"})


def canonical_rows(path: str) -> list[str]:
    """A table's rows as sorted JSON strings: order-free, exact (floats by repr, NaN included)."""
    rows = pq.read_table(path).to_pylist()
    return sorted(json.dumps(row, sort_keys=True, default=repr) for row in rows)


def test_spark_submit_ran_the_job_on_the_cluster(standalone_cluster, runs):
    assert runs.returncode == 0, runs.stderr[-4000:]
    assert f"({len(TABLE_NAMES)})" in runs.stdout, runs.stdout
    errors = ERROR_LINE.findall(runs.stderr)
    assert not errors and "Traceback" not in runs.stderr, runs.stderr[-4000:]
    finished = [app for app in master_state(standalone_cluster.web)["completedapps"]
                if app["name"] == APP_NAME]
    assert [app["state"] for app in finished] == ["FINISHED"]
    # Its tasks ran in the worker's executor, not in the driver.
    executor_logs = glob.glob(os.path.join(standalone_cluster.work_dir, finished[0]["id"], "*", "stderr"))
    assert executor_logs, f"no executor of {finished[0]['id']} under {standalone_cluster.work_dir}"
    ran = sum(_count_finished_tasks(path) for path in executor_logs)
    assert ran > len(TABLE_NAMES), f"executors finished {ran} tasks"


def _count_finished_tasks(path: str) -> int:
    with open(path, errors="replace") as f:
        return sum(1 for line in f if "Executor: Finished task" in line)


def test_cluster_tables_equal_local_tables(runs):
    assert runs.returncode == 0, runs.stderr[-4000:]
    with open(os.path.join(runs.local_out, "summary.json")) as f:
        pairs = json.load(f)["pairs"]
    assert 0 < pairs < PERCENTILE_ACCURACY // 2, "percentiles are exact only below ACCURACY / 2 pairs"
    for out in (runs.cluster_out, runs.local_out):
        assert sorted(os.listdir(os.path.join(out, "tables"))) == sorted(TABLE_NAMES)
    for name in TABLE_NAMES:
        cluster = canonical_rows(os.path.join(runs.cluster_out, "tables", name))
        local = canonical_rows(os.path.join(runs.local_out, "tables", name))
        if name in SYNTHETIC_LACKS:
            assert not local, f"table {name}: the synthetic capture was not expected to fill it"
        else:
            assert local, f"table {name} is empty: its equality would prove nothing"
        differ = [(c, l) for c, l in zip(cluster, local) if c != l][:3]
        assert (len(cluster), differ) == (len(local), []), f"table {name} differs"


def test_cluster_summary_equals_local_summary(runs):
    assert runs.returncode == 0, runs.stderr[-4000:]
    summaries = []
    for out in (runs.cluster_out, runs.local_out):
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f)
        summary.pop("generated_at")                          # the one field a rerun changes
        summaries.append(summary)
    assert summaries[0] == summaries[1]
