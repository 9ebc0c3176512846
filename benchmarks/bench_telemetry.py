#!/usr/bin/env python3
"""What the client telemetry harvest costs per PushTelemetry pair (KIP-714), in memory.

Pushes are built like the clients' (a Java producer's ~60 data points, librdkafka's ~10),
zstd-compressed as both clients send them by default, framed and paired by the tracker,
then handed to ``observers.telemetry.ClientTelemetry``: the decompression, the OTLP decode
and the joins. Beside it, the tracker alone on the same frames, and capture's row builder
(which decodes the push again, on its writer thread, when a capture runs).

    python benchmarks/bench_telemetry.py [--pairs 5000]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import zstandard  # noqa: E402
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue  # noqa: E402
from opentelemetry.proto.metrics.v1.metrics_pb2 import Gauge, Metric, MetricsData, NumberDataPoint  # noqa: E402

from kproxy.observers.capture.summary import build_row  # noqa: E402
from kproxy.observers.telemetry import ClientTelemetry  # noqa: E402
from kproxy.protocol import Request, Response, Uuid, encode_request, encode_response, new_body  # noqa: E402
from kproxy.protocol.connection import Connection  # noqa: E402
from kproxy.protocol.events import ResponseReceived  # noqa: E402
from kproxy.observers.contract import ConnectionInfo  # noqa: E402

ZSTD = 4


def payload(points: int) -> bytes:
    data = MetricsData()
    metrics = data.resource_metrics.add().scope_metrics.add().metrics
    for i in range(points):
        metrics.append(Metric(name=f"org.apache.kafka.producer.metric{i}.avg", gauge=Gauge(data_points=[
            NumberDataPoint(as_double=i * 1.5, time_unix_nano=1_700_000_000_000_000_000,
                            attributes=[KeyValue(key="node.id", value=AnyValue(int_value=i % 3))])])))
    return zstandard.ZstdCompressor().compress(data.SerializeToString())


def stream(pairs: int, points: int) -> tuple[bytes, bytes]:
    metrics = payload(points)
    requests, responses = bytearray(), bytearray()
    instances = [Uuid(uuid.uuid4().bytes) for _ in range(50)]
    for corr in range(pairs):
        frame = encode_request(Request(72, 0, corr, "bench", new_body(
            "request", 72, 0, client_instance_id=instances[corr % 50], subscription_id=1, terminating=False,
            compression_type=ZSTD, metrics=metrics)))
        requests += len(frame).to_bytes(4, "big") + frame
        answer = encode_response(Response(corr, new_body("response", 72, 0, error_code=0)), 72, 0)
        responses += len(answer).to_bytes(4, "big") + answer
    return bytes(requests), bytes(responses)


def per_pair(pairs: int, points: int) -> dict:
    requests, responses = stream(pairs, points)
    info = ConnectionInfo(1, ("127.0.0.1", 5000), "bootstrap", ("127.0.0.1", 9092), None)

    def run(observe) -> float:
        conn = Connection()
        start = time.perf_counter()
        events = conn.receive_client(requests)
        answered = conn.receive_broker(responses)
        observe(events + answered)
        return (time.perf_counter() - start) / pairs

    tracker = min(run(lambda events: None) for _ in range(3))
    telemetry = ClientTelemetry(100)
    telemetry.connection_opened(info)
    harvest = min(run(lambda events: telemetry(info, events)) for _ in range(3)) - tracker

    def rows(events):
        for e in events:
            if e.__class__ is ResponseReceived:
                build_row(info, e.request_event, e, "response", 0.0, {}, False, False)
    capture = min(run(rows) for _ in range(3)) - tracker
    return {"points": points, "compressed_bytes": len(payload(points)), "tracker_us": tracker * 1e6,
            "harvest_us": harvest * 1e6, "capture_row_us": capture * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5000)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}")
    for points in (10, 60):
        r = per_pair(args.pairs, points)
        print(f"{points:3d} points ({r['compressed_bytes']} B zstd): tracker {r['tracker_us']:.1f} us/pair, "
              f"harvest +{r['harvest_us']:.1f} us/pair, capture row +{r['capture_row_us']:.1f} us/pair")


if __name__ == "__main__":
    main()
