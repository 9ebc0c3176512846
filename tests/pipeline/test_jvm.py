"""The class-data sharing archive that speeds up the local Spark JVM's start (``pipeline.jvm``).

A plain ``java`` records an archive with the options kproxy passes and must then be
able to map it (``-Xshare:on`` refuses to start otherwise); kproxy chooses between
recording and mapping by what its cache directory holds. The whole path with Spark's
own JVM (two starts) runs with the soak tests.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time

import pytest

from kproxy.pipeline import jvm
from kproxy.pipeline.source import resolve_inputs
from kproxy.pipeline.synthetic import write_synthetic

pytestmark = pytest.mark.skipif(shutil.which("java") is None and not os.environ.get("JAVA_HOME"),
                                reason="no Java")


def _java(*options: str) -> subprocess.CompletedProcess:
    java = jvm._java()
    return subprocess.run([java, *options, "-version"], capture_output=True, text=True, timeout=120)


def test_first_run_records_then_runs_map_the_archive(tmp_path):
    first = jvm.ClassArchive.for_this_run(tmp_path)
    assert first.recording is not None and not first.path.exists()
    recorded = _java(*shlex.split(first.java_options()))
    assert recorded.returncode == 0, recorded.stderr
    assert first.recording.stat().st_size > 0
    assert recorded.stdout == "", "the JVM's archive messages must not reach kproxy's stdout"
    os.replace(first.recording, first.path)          # what finish() does once the JVM is gone

    later = jvm.ClassArchive.for_this_run(tmp_path)
    assert later == jvm.ClassArchive(first.path)       # maps it, records nothing
    mapped = _java("-Xshare:on", *shlex.split(later.java_options()))
    assert mapped.returncode == 0, mapped.stderr       # -Xshare:on fails if the archive is unusable


def test_an_archive_that_does_not_fit_is_ignored_not_fatal(tmp_path):
    archive = jvm.ClassArchive.for_this_run(tmp_path)
    archive.path.write_bytes(b"not an archive")
    assert jvm.ClassArchive.for_this_run(tmp_path).recording is None
    run = _java(*shlex.split(jvm.ClassArchive(archive.path).java_options()))
    assert run.returncode == 0, run.stderr
    assert run.stdout == ""


def test_the_archive_is_keyed_by_java_and_spark(tmp_path, monkeypatch):
    path = jvm.ClassArchive.for_this_run(tmp_path).path
    assert path.name.startswith(jvm.ARCHIVE_PREFIX) and path.suffix == ".jsa"
    other_java = tmp_path / "jdk" / "bin"
    other_java.mkdir(parents=True)
    (other_java / "java").write_text("#!/bin/sh\n")
    (other_java / "java").chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    assert jvm.ClassArchive.for_this_run(tmp_path).path != path


def test_partial_archives_of_stopped_runs_are_removed_when_stale(tmp_path):
    stale = tmp_path / f"{jvm.ARCHIVE_PREFIX}0123.jsa.99.partial"
    fresh = tmp_path / f"{jvm.ARCHIVE_PREFIX}0123.jsa.98.partial"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"x")
    old = time.time() - jvm.STALE_PARTIAL_S - 60
    os.utime(stale, (old, old))
    jvm.ClassArchive.for_this_run(tmp_path)
    assert not stale.exists() and fresh.exists()


_SPARK_RUN = """
import json, sys
from pathlib import Path
from pyspark import SparkContext
from kproxy.pipeline import cli, jvm
archive = jvm.ClassArchive.for_this_run(Path(sys.argv[1]))
spark = cli.session("local[1]", java_options=archive.java_options())
assert spark.range(3).count() == 3
pid = SparkContext._gateway.proc.pid
with open(f"/proc/{pid}/maps") as maps:
    mapped = str(archive.path) in maps.read()
recording = archive.recording is not None
print(json.dumps({"recording": recording, "mapped": mapped, "saved": archive.finish(spark)}))
"""


@pytest.mark.soak          # two Spark JVM starts and an archive written: ~40 s idle, minutes under load
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads the JVM's memory maps from /proc")
def test_kproxys_spark_jvm_records_the_archive_once_then_maps_it(tmp_path):
    """The whole path with Spark's own JVM and class path: the first session records, the
    archive is saved when its JVM exits, and the next session's JVM has it mapped."""
    import json
    import sys

    def run() -> dict:
        done = subprocess.run([sys.executable, "-c", _SPARK_RUN, str(tmp_path)], capture_output=True,
                              text=True, timeout=600, env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"))
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    assert run() == {"recording": True, "mapped": False, "saved": True}
    assert list(tmp_path.glob("*.partial")) == []
    assert run() == {"recording": False, "mapped": True, "saved": False}


def test_only_small_captures_get_the_quick_jit(tmp_path):
    write_synthetic(str(tmp_path / "small"), 1_000, files=1, seed=1)
    small = resolve_inputs([str(tmp_path / "small")])
    assert small.pairs == 1_000
    assert jvm.jit_options(small.pairs) == "-XX:TieredStopAtLevel=1"
    assert jvm.jit_options(jvm.QUICK_JIT_MAX_PAIRS + 1) == ""
    assert jvm.jit_options(None) == ""                 # JSONL: its size is not known up front
    assert _java("-XX:TieredStopAtLevel=1").returncode == 0


def test_a_capture_of_known_size_gets_a_heap_that_keeps_the_jvm_small():
    """Parquet footers give the size: the heap stops at SIZED_HEAP_MB whatever the machine
    offers (the job keeps no large capture in memory); an unknown size keeps the machine's share."""
    machine = 6 * 1024
    assert jvm.heap_mb(10_000_000, machine) == jvm.SIZED_HEAP_MB < machine
    assert jvm.heap_mb(1_000, machine) == jvm.SIZED_HEAP_MB
    assert jvm.heap_mb(None, machine) == machine
    assert jvm.heap_mb(10_000_000, 1024) == 1024            # never more than the machine's share
