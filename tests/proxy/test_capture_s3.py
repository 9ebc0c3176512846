"""Captures uploaded to S3-compatible storage (s3proxy, a real server on loopback) and read
back with ``kproxy analyze s3a://...``.

- A kproxy capturing with small rotations uploads every file it closed, the last ones
  when it shuts down: the objects under ``<prefix>/<instance>/`` are the local files,
  byte for byte, and the counters say so.
- Spark over ``s3a://bucket/prefix`` (and ``s3://``) finds the same files and reads the
  same rows as over the local directory; every table and the summary of the whole job
  over both is the ``soak`` variant.
- An unreachable store costs uploads (counted), never traffic or rows.
Settings and the admin listener's limits: ``tests/observers/test_capture_s3_settings.py``.
"""

from __future__ import annotations

import os
import socket
import time
import uuid

import pytest

from tests.pipeline.conftest import spark  # noqa: F401 - the one session-wide SparkSession
from tests.proxy.cluster import ADMIN_TIMEOUT_S
from tests.proxy.harness import ProxyThread

pytestmark = [pytest.mark.broker, pytest.mark.timeout(300)]

MESSAGES = 200
INSTANCE = "sidecar-a.example"
# Small files, so one short run closes many (the capture's floor is 4096).
ROTATE_BYTES = 4096


def _client(server):
    import boto3
    from botocore.config import Config
    return boto3.client("s3", endpoint_url=server.endpoint_url, aws_access_key_id=server.access_key,
                        aws_secret_access_key=server.secret_key, region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}))


def _objects(client, bucket: str, prefix: str) -> dict[str, bytes]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {item["Key"]: client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            for page in pages for item in page.get("Contents", ())}


def _round_trip(bootstrap: str, topic: str) -> None:
    from confluent_kafka import Consumer, Producer
    failures: list = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(MESSAGES):
        producer.produce(topic, key=f"k{i}".encode(), value=b"v" * 200,
                         on_delivery=lambda err, msg: err and failures.append(err))
    assert producer.flush(ADMIN_TIMEOUT_S) == 0 and not failures
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got, deadline = 0, time.monotonic() + 60
    try:
        while got < MESSAGES and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got += 1
    finally:
        consumer.close()
    assert got == MESSAGES


def _run_capture(kafka_cluster, directory, s3: dict, rotate_bytes: int = ROTATE_BYTES) -> dict:
    """A kproxy capturing a client round trip with ``s3``; its capture counters after shutdown."""
    proxy = ProxyThread(upstream=kafka_cluster.bootstrap_servers, shutdown_timeout=10,
                        capture_root=str(directory), capture_autostart=True, instance_name=INSTANCE,
                        capture={"directory": str(directory), "formats": ["jsonl", "parquet"],
                                 "rotate_bytes": rotate_bytes, "max_total_bytes": 256 * 1024 ** 2, "s3": s3})
    with proxy:
        _round_trip(proxy.bootstrap, f"s3cap-{uuid.uuid4().hex[:8]}")
    return proxy.runtime.capture.counters()


def _aws_env(patch: pytest.MonkeyPatch, server, endpoint: bool) -> None:
    """The AWS_* environment boto3 and ``kproxy analyze`` read: s3proxy's keys (and endpoint).
    Never the instance metadata service: no AWS call of a test leaves loopback."""
    patch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    patch.setenv("AWS_ACCESS_KEY_ID", server.access_key)
    patch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
    patch.setenv("AWS_REGION", "us-east-1")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        patch.delenv(name, raising=False)
    if endpoint:
        patch.setenv("AWS_ENDPOINT_URL", server.endpoint_url)


@pytest.fixture(scope="module")
def uploaded(kafka_cluster, s3_server, tmp_path_factory):
    """(local capture directory, bucket, prefix, counters) of one capture uploaded to s3proxy."""
    bucket, prefix = f"captures-{uuid.uuid4().hex[:8]}", "fleet/eu-1"
    _client(s3_server).create_bucket(Bucket=bucket)
    directory = tmp_path_factory.mktemp("s3-capture")
    with pytest.MonkeyPatch.context() as patch:
        _aws_env(patch, s3_server, endpoint=False)          # the endpoint comes from capture.s3
        counters = _run_capture(kafka_cluster, directory, {
            "bucket": bucket, "prefix": prefix, "endpoint_url": s3_server.endpoint_url})
    return directory, bucket, prefix, counters


@pytest.fixture
def s3_env(monkeypatch, s3_server):
    """The AWS_* environment ``kproxy analyze`` reads, pointing at s3proxy."""
    _aws_env(monkeypatch, s3_server, endpoint=True)


def test_closed_files_are_uploaded_as_they_are(uploaded, s3_server):
    directory, bucket, prefix, counters = uploaded
    local = {name: (directory / name).read_bytes() for name in os.listdir(directory)}
    assert len(local) >= 4, "the run should have rotated several files"
    objects = _objects(_client(s3_server), bucket, prefix + "/")
    assert objects == {f"{prefix}/{INSTANCE}/{name}": data for name, data in local.items()}
    assert counters["files_uploaded"] == counters["files_opened"] == len(local)
    assert counters["uploaded_bytes"] == sum(map(len, local.values()))
    assert (counters["upload_failed"], counters["upload_dropped"], counters["dropped"]) == (0, 0, 0)


def test_s3a_reads_what_the_directory_holds(uploaded, spark, s3_env):
    from kproxy.pipeline.load import load_capture
    directory, bucket, prefix, counters = uploaded
    from kproxy.pipeline.s3_source import resolve
    local_inputs, local = load_capture(spark, [str(directory)])
    inputs, remote = load_capture(spark, [f"s3a://{bucket}/{prefix}"])
    assert inputs.format == "parquet"
    assert [f.rsplit("/", 1)[1] for f in inputs.files] == [os.path.basename(f) for f in local_inputs.files]
    assert all(f.startswith(f"s3a://{bucket}/{prefix}/{INSTANCE}/") for f in inputs.files)
    assert inputs.skipped == local_inputs.skipped                # the JSONL twins are set aside alike
    assert resolve(spark, [f"s3://{bucket}/{prefix}/"]).files == inputs.files
    # A few dozen rows: compared whole on the driver (two jobs, not a count and two exceptAll each).
    rows = [sorted(map(repr, frame.collect())) for frame in (remote, local)]
    assert rows[0] == rows[1] and len(rows[0]) == counters["rows_written"]


def test_no_captures_under_a_prefix_is_one_line(uploaded, spark, s3_env):
    from kproxy.pipeline.load import load_capture
    from kproxy.pipeline.source import InputError
    _, bucket, _, _ = uploaded
    with pytest.raises(InputError, match="no such object or prefix"):
        load_capture(spark, [f"s3a://{bucket}/nothing-here"])


def test_an_unreachable_store_costs_uploads_not_traffic(kafka_cluster, s3_server, tmp_path, monkeypatch):
    """Every closed file is counted as failed and stays on disk; every pair is still a row."""
    _aws_env(monkeypatch, s3_server, endpoint=False)
    with socket.socket() as closed:                  # bound, never listening: refused
        closed.bind(("127.0.0.1", 0))
        endpoint = "http://127.0.0.1:%d" % closed.getsockname()[1]
        # One file per format (default rotation): each upload is refused MAX_ATTEMPTS times.
        counters = _run_capture(kafka_cluster, tmp_path, {"bucket": "captures", "endpoint_url": endpoint,
                                                          "delete_after_upload": True,
                                                          "stop_timeout_seconds": 5}, rotate_bytes=64 * 1024 * 1024)
    files = os.listdir(tmp_path)
    assert counters["files_uploaded"] == 0
    assert counters["upload_failed"] + counters["upload_dropped"] == counters["files_opened"] == len(files)
    assert counters["rows_written"] > 0 and counters["dropped"] == 0 and counters["write_errors"] == 0


@pytest.mark.soak
def test_the_whole_job_over_s3a_equals_the_local_one(uploaded, spark, s3_env, tmp_path):
    """Every table, the summary and the report's sections: s3a:// and the directory alike."""
    import json
    from kproxy.pipeline.job import Options, analyze
    directory, bucket, prefix, _ = uploaded
    local = analyze(spark, [str(directory)], str(tmp_path / "local"), Options())
    remote = analyze(spark, [f"s3a://{bucket}/{prefix}"], str(tmp_path / "s3"), Options())
    assert local.tables.keys() == remote.tables.keys() and local.table_rows == remote.table_rows
    for name, path in local.tables.items():
        ours, theirs = spark.read.parquet(path), spark.read.parquet(remote.tables[name])
        assert ours.exceptAll(theirs).isEmpty() and theirs.exceptAll(ours).isEmpty(), name
    summaries = [json.loads((tmp_path / run / "summary.json").read_text()) for run in ("local", "s3")]
    for summary in summaries:
        summary.pop("inputs", None)
        summary.pop("generated_at", None)
    assert summaries[0] == summaries[1]


def test_delete_after_upload_deletes_only_what_the_store_took(s3_server, tmp_path, monkeypatch):
    """The uploader alone (no kproxy): uploaded files are deleted, a missing one is counted."""
    from kproxy.observers.capture import Capture
    from kproxy.observers.capture.s3_upload import S3Target, Uploader
    _aws_env(monkeypatch, s3_server, endpoint=False)
    bucket = f"captures-{uuid.uuid4().hex[:8]}"
    _client(s3_server).create_bucket(Bucket=bucket)
    paths = [tmp_path / f"kproxy-capture-20261127T000000-00000{i}.jsonl" for i in range(3)]
    for i, path in enumerate(paths[:2]):
        path.write_bytes(b'{"capture_version":4}\n' * (i + 1))
    capture = Capture(instance_name="pod-0")
    uploader = Uploader(S3Target(bucket, "p", endpoint_url=s3_server.endpoint_url, delete_after_upload=True),
                        capture, capture.instance_name)
    uploader.open()
    for path in paths:                               # the third was never written: gone before its turn
        uploader.submit(str(path))
    uploader.finish()
    counters = capture.counters()
    assert (counters["files_uploaded"], counters["upload_failed"], counters["upload_dropped"]) == (2, 1, 0)
    assert not any(path.exists() for path in paths)
    assert _objects(_client(s3_server), bucket, "p/") == {
        f"p/pod-0/{path.name}": b'{"capture_version":4}\n' * (i + 1) for i, path in enumerate(paths[:2])}
