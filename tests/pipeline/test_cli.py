"""``kproxy analyze`` refuses what it cannot read with one line and a non-zero exit, before Spark starts."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kproxy.observers.capture.parquet import SCHEMA
from kproxy.pipeline import cli
from kproxy.pipeline.source import InputError, prune_before, resolve_inputs
from kproxy.pipeline.synthetic import synthetic_table, write_synthetic


def analyze_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "kproxy", "analyze", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def one_error_line(result, expected):
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("kproxy analyze: error: "), result.stderr
    assert expected in lines[0]
    assert result.stdout == ""


def test_missing_path(tmp_path):
    one_error_line(analyze_cli(str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")),
                   "no such file or directory")


def test_empty_capture(tmp_path):
    pq.write_table(SCHEMA.empty_table(), tmp_path / "kproxy-capture-20261123T120000-000001.parquet")
    one_error_line(analyze_cli(str(tmp_path), "--out", str(tmp_path / "out")), "holds no request/response pairs")


def test_directory_without_capture_files(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    one_error_line(analyze_cli(str(tmp_path), "--out", str(tmp_path / "out")), "no capture files (.parquet or .jsonl)")


def test_newer_schema_version(tmp_path):
    table = synthetic_table(10)
    newer = table.replace_schema_metadata({b"kproxy.capture.schema_version": b"99"})
    pq.write_table(newer, tmp_path / "future.parquet")
    one_error_line(analyze_cli(str(tmp_path / "future.parquet"), "--out", str(tmp_path / "out")),
                   "capture schema version 99")


def test_parquet_of_another_schema(tmp_path):
    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "other.parquet")
    one_error_line(analyze_cli(str(tmp_path / "other.parquet"), "--out", str(tmp_path / "out")),
                   "without kproxy's capture schema")


def test_other_formats(tmp_path):
    (tmp_path / "x.pcapng").write_bytes(b"\n\r\r\n")
    one_error_line(analyze_cli(str(tmp_path / "x.pcapng"), "--out", str(tmp_path / "o")), "pcapng is for Wireshark")
    (tmp_path / "fake.parquet").write_text("not parquet")
    one_error_line(analyze_cli(str(tmp_path / "fake.parquet"), "--out", str(tmp_path / "o")), "not a Parquet file")
    (tmp_path / "x.jsonl").write_text(json.dumps({"hello": 1}) + "\n")
    one_error_line(analyze_cli(str(tmp_path / "x.jsonl"), "--out", str(tmp_path / "o")), "not a kproxy JSONL")


def test_no_java(tmp_path):
    write_synthetic(str(tmp_path / "cap"), 100, files=1)
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = os.path.dirname(sys.executable)          # python, but no java
    one_error_line(analyze_cli(str(tmp_path / "cap"), "--out", str(tmp_path / "out"), env=env),
                   "Java 17 or newer is needed")


@pytest.mark.parametrize("text, seconds", [("30s", 30), ("1m", 60), ("5 minutes", 300), ("2h", 7200), ("90", 90)])
def test_window_parsing(text, seconds):
    assert cli.parse_window(text) == seconds


@pytest.mark.parametrize("text", ["0s", "1 fortnight", "-5m", ""])
def test_bad_window(text):
    with pytest.raises(cli.UsageError):
        cli.parse_window(text)


def test_times_are_utc_unless_zoned():
    assert cli.parse_time("2026-11-23T10:00:00", "--since") == dt.datetime(2026, 11, 23, 10, tzinfo=dt.timezone.utc)
    assert cli.parse_time("2026-11-23T10:00:00Z", "--since").utcoffset() == dt.timedelta(0)
    assert cli.parse_time("2026-11-23T11:00:00+01:00", "--since").astimezone(dt.timezone.utc).hour == 10
    with pytest.raises(cli.UsageError):
        cli.parse_time("yesterday", "--since")


def test_auto_format_prefers_parquet_and_says_what_it_left_out(tmp_path):
    write_synthetic(str(tmp_path), 50, files=1)
    (tmp_path / "kproxy-capture-20261123T120000-000009.jsonl").write_text(
        json.dumps({"capture_version": 2}) + "\n")
    inputs = resolve_inputs([str(tmp_path)])
    assert inputs.format == "parquet" and len(inputs.files) == 1
    assert "jsonl" in inputs.skipped[0]
    assert resolve_inputs([str(tmp_path)], "jsonl").format == "jsonl"


def test_globs_and_uris(tmp_path):
    paths = write_synthetic(str(tmp_path), 50, files=2)
    assert resolve_inputs([str(tmp_path / "*.parquet")]).files == tuple(sorted(paths))
    assert resolve_inputs([f"file://{paths[0]}"]).files == (paths[0],)
    remote = resolve_inputs(["s3a://bucket/capture/"])
    assert remote.files == ("s3a://bucket/capture/",) and remote.format == "parquet"
    with pytest.raises(InputError, match="no capture files match"):
        resolve_inputs([str(tmp_path / "*.nothing")])


def test_since_prunes_only_files_that_ended_before_it():
    names = ["/c/kproxy-capture-20261123T100000-000001.parquet",
             "/c/kproxy-capture-20261123T110000-000002.parquet",
             "/c/kproxy-capture-20261123T120000-000003.parquet",
             "/c/other-20261123T090000-000004.parquet"]
    since = dt.datetime(2026, 11, 23, 11, 30, tzinfo=dt.timezone.utc)
    kept, pruned = prune_before(names, since)
    # The 10:00 file ended at 11:00 (< since): pruned. The 11:00 file may hold rows up to 12:00.
    # The "other" series has no successor, so nothing bounds its end: kept.
    assert pruned == 1 and names[0] not in kept and set(names[1:]) == set(kept)
    edge = dt.datetime(2026, 11, 23, 11, 0, 1, tzinfo=dt.timezone.utc)
    assert prune_before(names[:2], edge)[1] == 1
    assert prune_before(names[:2], edge - dt.timedelta(microseconds=1))[1] == 0


def test_out_must_be_local(tmp_path):
    write_synthetic(str(tmp_path / "cap"), 100, files=1)
    one_error_line(analyze_cli(str(tmp_path / "cap"), "--out", "s3a://bucket/out"), "--out must be a local directory")


def test_local_spark_gets_a_bounded_share_of_memory():
    mb = cli.local_driver_memory_mb()
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    assert cli.LOCAL_DRIVER_MEMORY_MIN_MB <= mb <= cli.LOCAL_DRIVER_MEMORY_MAX_MB
    assert mb == max(cli.LOCAL_DRIVER_MEMORY_MIN_MB,
                     min(int(total * cli.LOCAL_DRIVER_MEMORY_SHARE), cli.LOCAL_DRIVER_MEMORY_MAX_MB))


def test_only_the_jvm_incubator_notice_is_dropped_from_spark_stderr():
    """Spark's launcher always adds jdk.incubator.vector, so the JVM announces it; that one
    line goes, every other line (log4j warnings and errors, other WARNING lines) passes."""
    source_read, source_write = os.pipe()
    sink_read, sink_write = os.pipe()
    lines = [b"12:00:00 WARN SparkContext: a real warning\n", cli.JVM_INCUBATOR_NOTICE,
             b"WARNING: Using incubator modules: jdk.incubator.foreign\n", b"last line, unterminated"]
    with os.fdopen(source_write, "wb") as jvm:
        jvm.write(b"".join(lines))
    cli._pass_on_stderr(source_read, sink_write)
    with os.fdopen(sink_read, "rb") as passed:
        assert passed.read() == b"".join(line for line in lines if line != cli.JVM_INCUBATOR_NOTICE)


def test_a_bad_policy_file_is_one_line_naming_rule_and_key(tmp_path):
    rules = tmp_path / "policy.toml"
    rules.write_text('[rules.named]\ncheck = "client_id"\npattern = "(a)\\\\1"\n')
    one_error_line(analyze_cli(str(tmp_path), "--out", str(tmp_path / "out"), "--policy", str(rules)),
                   f"policy file {rules}: rules.named.pattern:")



def test_submit_path_names_the_file_spark_submit_runs():
    """``spark-submit "$(python -m kproxy.pipeline.submit --path)" ...``: the file named is
    ``kproxy analyze`` with no ``--master`` of its own (spark-submit sets it). The run on a
    standalone cluster itself is test_cluster.py, a soak test."""
    import kproxy.pipeline.submit as submit
    named = subprocess.run([sys.executable, "-m", "kproxy.pipeline.submit", "--path"], capture_output=True,
                           text=True, timeout=120, check=True).stdout.strip()
    assert os.path.samefile(named, submit.__file__)
    usage = subprocess.run([sys.executable, named, "--help"], capture_output=True, text=True,
                           timeout=120, check=True).stdout
    assert usage.startswith("usage: kproxy analyze") and "--out" in usage and "--master" not in usage
