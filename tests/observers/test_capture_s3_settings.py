"""Capture uploads without a server: the ``capture.s3`` settings, object keys, what the admin
listener may not choose, and the S3A settings ``kproxy analyze`` derives from the environment.
The real server, kproxy and Spark: ``tests/proxy/test_capture_s3.py``."""

from __future__ import annotations

import pytest

from kproxy.config import ConfigError, build
from kproxy.observers.capture import Capture, CaptureConfig
from kproxy.observers.capture.control import start_capture
from kproxy.observers.capture.s3_upload import S3Target
from kproxy.pipeline.s3_source import S3Settings, check_paths, s3a_uri
from kproxy.pipeline.source import InputError


def test_capture_settings_for_uploads(tmp_path):
    target = {"bucket": "kproxy-captures", "prefix": "/fleet/eu-1/"}
    config = CaptureConfig.from_dict({"directory": str(tmp_path), "formats": ["parquet"], "s3": target})
    assert config.s3 == S3Target("kproxy-captures", "fleet/eu-1")
    assert config.s3.delete_after_upload is False and config.to_dict()["s3"]["prefix"] == "fleet/eu-1"
    assert config.s3.uri == "s3a://kproxy-captures/fleet/eu-1"
    assert config.s3.object_key("pod a/1", "x.parquet") == "fleet/eu-1/pod_a_1/x.parquet"
    assert S3Target("b-1").object_key("kproxy-0", "x.jsonl") == "kproxy-0/x.jsonl"
    for bad, message in (({"formats": ["kafka"], "kafka": {"bootstrap": "h:1", "topic": "t"}, "s3": target},
                          "needs a file format"),
                         ({"s3": {**target, "bucket": "Bad_Bucket"}}, "capture.s3.bucket"),
                         ({"s3": {"prefix": "p"}}, "capture.s3.bucket: required"),
                         ({"s3": {**target, "endpoint_url": "127.0.0.1:9000"}}, "capture.s3.endpoint_url"),
                         ({"s3": {**target, "queue_max_files": 0}}, "capture.s3.queue_max_files"),
                         ({"s3": {**target, "delete_after": True}}, "capture.s3.delete_after")):
        with pytest.raises(ValueError, match=message):
            CaptureConfig.from_dict({"directory": str(tmp_path), **bad})
    built = build({"upstream": "127.0.0.1:9092", "capture": {"directory": str(tmp_path), "s3": target}})
    assert built.capture.s3.bucket == "kproxy-captures"
    with pytest.raises(ConfigError, match="capture.s3.stop_timeout_seconds"):
        build({"upstream": "127.0.0.1:9092",
               "capture": {"directory": str(tmp_path), "s3": {**target, "stop_timeout_seconds": -1}}})


def test_the_admin_listener_cannot_choose_where_files_go(tmp_path):
    capture = Capture(instance_name="t")
    status, answer = start_capture(capture, {"s3": {"bucket": "elsewhere"}}, None, root=str(tmp_path))
    assert status == 403 and "capture.s3" in answer["error"]
    assert not capture.active


def test_analyze_reads_the_aws_environment():
    assert s3a_uri("s3://bucket/fleet/") == "s3a://bucket/fleet"
    assert check_paths(["s3a://b/x", "s3://b/y"]) == ["s3a://b/x", "s3a://b/y"]
    for bad in (["s3://b/x", "/tmp/local"], ["s3:///nobucket"]):
        with pytest.raises(InputError):
            check_paths(bad)
    compatible = S3Settings.from_env({"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ACCESS_KEY_ID": "a",
                                      "AWS_SECRET_ACCESS_KEY": "s"}).hadoop()
    assert compatible["fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert compatible["fs.s3a.path.style.access"] == "true" and compatible["fs.s3a.endpoint.region"] == "us-east-1"
    assert (compatible["fs.s3a.access.key"], compatible["fs.s3a.secret.key"]) == ("a", "s")
    aws = S3Settings.from_env({"AWS_DEFAULT_REGION": "eu-west-1"}).hadoop()
    assert "fs.s3a.endpoint" not in aws and "fs.s3a.access.key" not in aws
    assert aws["fs.s3a.endpoint.region"] == "eu-west-1"
    assert aws["fs.s3a.aws.credentials.provider"].endswith("DefaultCredentialsProvider")   # profiles too


def test_a_full_upload_queue_leaves_files_local_and_counts_them():
    """The writer never waits for the store: past queue_max_files a closed file is not queued."""
    from kproxy.observers.capture.s3_upload import Uploader
    capture = Capture(instance_name="t")
    uploader = Uploader(S3Target("captures", queue_max_files=2), capture, "t")    # never started
    for name in ("a", "b", "c", "d"):
        uploader.submit(f"/nowhere/{name}.parquet")
    assert capture.counters()["upload_dropped"] == 2 and uploader.queue.qsize() == 2
    uploader.finish()                                # not running: returns at once


@pytest.mark.parametrize("data, message", [
    ({"buckt": "b"}, "capture.s3.buckt: unknown setting (did you mean bucket?)"),
    (["b"], "capture.s3: expected a table/object"),
])
def test_a_misspelt_or_misshapen_s3_table_is_named(data, message):
    with pytest.raises(ValueError) as refused:
        S3Target.from_dict(data)
    assert str(refused.value) == message


def test_a_misspelt_kafka_table_setting_is_named():
    from kproxy.observers.capture.kafka_sink import KafkaTarget
    with pytest.raises(ValueError, match=r"capture\.kafka\.topc: unknown setting \(did you mean topic\?\)"):
        KafkaTarget.from_dict({"bootstrap": "kafka:9092", "topc": "t"})
