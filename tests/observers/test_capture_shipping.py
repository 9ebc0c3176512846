"""Capture shipping without a broker: the ``capture.kafka`` settings, what the admin listener
may not choose, the producer queue's bound and what is counted when the cluster is away.
The fleet (sidecars, a real cluster, Spark): ``tests/proxy/test_capture_shipping.py``."""

from __future__ import annotations

import socket
import time

import pytest

from kproxy.config import ConfigError, build
from kproxy.observers.capture import Capture, CaptureConfig
from kproxy.observers.capture.control import start_capture
from kproxy.observers.capture.kafka_sink import KafkaSink, KafkaTarget


def test_capture_settings_for_shipping(tmp_path):
    target = {"bootstrap": "127.0.0.1:9092", "topic": "kproxy-capture"}
    config = CaptureConfig.from_dict({"formats": ["kafka"], "kafka": target})
    assert config.file_formats == () and config.directory == "" and config.kafka.compression == "zstd"
    assert config.kafka.producer_settings()["acks"] == "all"
    for bad, message in (({"formats": ["kafka"]}, "needs the capture.kafka table"),
                         ({"formats": ["kafka"], "kafka": {**target, "topic": "a/b"}}, "capture.kafka.topic"),
                         ({"formats": ["kafka"], "kafka": {**target, "bootstrap": "nohost"}}, "bootstrap"),
                         ({"formats": ["kafka"], "kafka": {**target, "linger": 5}}, "capture.kafka.linger"),
                         ({"formats": ["kafka"], "kafka": {**target, "security_protocol": "sasl_ssl"}},
                          "sasl_mechanism"),
                         ({"formats": ["kafka", "jsonl"], "kafka": target}, "capture.directory")):
        with pytest.raises(ValueError, match=message):
            CaptureConfig.from_dict(bad)
    # From the config file: no capture_root needed when nothing is written to disk.
    built = build({"upstream": "127.0.0.1:9092", "capture": {"formats": ["kafka"], "kafka": target}})
    assert built.capture_root is None
    with pytest.raises(ConfigError, match="capture.kafka.queue_max_rows"):
        build({"upstream": "127.0.0.1:9092", "capture": {"formats": ["kafka"],
                                                        "kafka": {**target, "queue_max_rows": 0}}})


def test_the_admin_listener_cannot_choose_where_rows_go(tmp_path):
    capture = Capture(instance_name="t")
    status, answer = start_capture(capture, {"formats": ["kafka"], "kafka": {"bootstrap": "evil:9092",
                                                                          "topic": "t"}},
                                   None, root=str(tmp_path))
    assert status == 403 and "capture.kafka" in answer["error"]
    status, answer = start_capture(capture, {"formats": ["kafka"]}, None, root=None)
    assert status == 400 and "capture.kafka" in answer["error"]
    assert not capture.active


def test_a_full_queue_drops_and_an_absent_cluster_fails_counted():
    """The producer's queue bounds what waits for the cluster (dropped, counted); rows still
    unacknowledged when the capture stops are counted as failed, after flush_timeout_seconds."""
    with socket.socket() as closed:                  # bound, never listening: refused
        closed.bind(("127.0.0.1", 0))
        bootstrap = "127.0.0.1:%d" % closed.getsockname()[1]
        capture = Capture(instance_name="t")
        sink = KafkaSink(KafkaTarget(bootstrap, "t", queue_max_rows=2, flush_timeout_seconds=0.5), capture)
        sink.open()
        row = {"capture_version": 3, "time": time.time(), "connection_start": None, "proxy_instance": "t"}
        for _ in range(5):
            sink.write(row)
        started = time.monotonic()
        sink.close()
    assert time.monotonic() - started < 5
    counters = capture.counters()
    assert (counters["ship_dropped"], counters["ship_failed"], counters["rows_shipped"]) == (3, 2, 0)
