#!/usr/bin/env python3
"""Proxy throughput: produce and consume directly vs through kproxy, in the same run.

kproxy, the broker and the client share one machine (2 cores here), so
absolute MB/s say more about the machine than about kproxy; the ratio
(through kproxy / direct, measured back to back) is the figure to track.

    python benchmarks/bench_proxy.py                  # Apache Kafka 4.4.0 (default)
    python benchmarks/bench_proxy.py --broker tansu   # Tansu (its in-memory engine stalled
                                                      # consumers at ~15k records here)
    python benchmarks/bench_proxy.py --records 200000 --size 1024 --json
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvloop  # noqa: E402

from kproxy import config as config_module  # noqa: E402
from kproxy.runtime import Runtime  # noqa: E402

DEFAULT_RECORDS = 100_000
DEFAULT_SIZE = 1024
CONSUME_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ProxyInThread:
    """kproxy on its own uvloop thread, as it runs in production (its own process's loop)."""

    def __init__(self, upstream: str):
        port = free_port()
        self.bootstrap = f"127.0.0.1:{port}"
        self.runtime = Runtime(config_module.build({
            "upstream": upstream, "listen": self.bootstrap, "admin_listen": "off",
            "broker_port_base": free_port(), "log_level": "WARNING"}))
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self):
        import asyncio
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.runtime.start(), self.loop).result(10)
        return self

    def __exit__(self, *exc):
        import asyncio
        asyncio.run_coroutine_threadsafe(self.runtime.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)


def produce(bootstrap: str, topic: str, records: int, size: int) -> float:
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 1 << 20,
                         "compression.type": "none", "acks": "all"})
    payload = b"x" * size
    start = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, payload)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(60) != 0:
        raise RuntimeError("produce did not finish")
    return time.perf_counter() - start


def consume(bootstrap: str, topic: str, records: int) -> float:
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "fetch.max.bytes": 52428800})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = 0
    start = time.perf_counter()
    deadline = start + CONSUME_TIMEOUT_S
    while got < records and time.perf_counter() < deadline:
        got += len(consumer.consume(10_000, 1.0))
    elapsed = time.perf_counter() - start
    consumer.close()
    if got < records:
        raise RuntimeError(f"consumed {got} of {records}")
    return elapsed


def run(broker: str, records: int, size: int, rounds: int, capture_dir: str | None = None,
        capture_formats: tuple[str, ...] = ("jsonl",)) -> dict:
    if broker == "tansu":
        from kproxy.embedded.tansu import TansuBroker
        cm = TansuBroker()
    else:
        from kproxy.embedded.kafka import KafkaCluster
        cm = KafkaCluster(1)
    mb = records * size / 1e6
    results = {"broker": broker, "records": records, "record_bytes": size, "rounds": rounds}
    labels = ["direct", "kproxy"] + (["capture"] if capture_dir else [])
    with cm as b:
        upstream = b.bootstrap_servers
        with ProxyInThread(upstream) as proxy:
            # Alternate the paths so JVM warm-up and machine noise hit all of them; report
            # each one's best round.
            for round_no in range(rounds):
                # Rotate the order too: whichever path runs right after two others have
                # written 50 MB each meets a busier broker (GC, log flushes).
                for label in labels[round_no % len(labels):] + labels[:round_no % len(labels)]:
                    bootstrap = upstream if label == "direct" else proxy.bootstrap
                    if label == "capture":
                        start_overloaded_capture(proxy.runtime.capture, capture_dir, capture_formats)
                    topic = f"bench-{label}-{uuid.uuid4().hex[:6]}"
                    for op, seconds in (("produce", produce(bootstrap, topic, records, size)),
                                        ("consume", consume(bootstrap, topic, records))):
                        key = f"{label}_{op}_mb_s"
                        results[key] = max(results.get(key, 0.0), mb / seconds)
                    if label == "capture":
                        counters = proxy.runtime.capture.counters()
                        proxy.runtime.capture.stop()
                        for name in ("enqueued", "dropped", "rows_written"):
                            results[f"capture_{name}"] = results.get(f"capture_{name}", 0) + counters[name]
    for op in ("produce", "consume"):
        results[f"{op}_ratio"] = results[f"kproxy_{op}_mb_s"] / results[f"direct_{op}_mb_s"]
        if capture_dir:
            results[f"capture_{op}_ratio"] = results[f"capture_{op}_mb_s"] / results[f"kproxy_{op}_mb_s"]
    return results


SLOW_DISK_DELAY_S = 0.02      # per write: the writer manages ~50 rows/s, far below the traffic


def start_overloaded_capture(capture, directory: str, formats: tuple[str, ...]) -> None:
    """Capture everything to a simulated slow disk, so the writer cannot keep up.

    The delay sleeps (releasing the GIL, like a blocked write), so what is measured
    is the relay's side of the bargain: filter, enqueue, drop and count, never wait.
    """
    from kproxy.observers.capture import CaptureConfig
    from kproxy.observers.capture.files import RotatingSink

    if not getattr(RotatingSink, "_bench_slowed", False):
        original = RotatingSink.before_write

        def slow_before_write(self, nbytes):
            time.sleep(SLOW_DISK_DELAY_S)
            return original(self, nbytes)
        RotatingSink.before_write = slow_before_write
        RotatingSink._bench_slowed = True
    capture.start(CaptureConfig(directory=directory, formats=formats))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", choices=("kafka", "tansu"), default="kafka")
    parser.add_argument("--records", type=int, default=DEFAULT_RECORDS)
    parser.add_argument("--size", type=int, default=DEFAULT_SIZE, help="record value bytes")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds; best is reported")
    parser.add_argument("--capture-overload", metavar="FORMATS", nargs="?", const="jsonl",
                        help="also run kproxy with capture on (these formats; default jsonl, the "
                             "capture default) and a writer that cannot keep up")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        formats = tuple(args.capture_overload.split(",")) if args.capture_overload else ()
        r = run(args.broker, args.records, args.size, args.rounds,
                capture_dir=tmp if formats else None, capture_formats=formats)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"{args.records} records x {args.size} B, broker {args.broker}, confluent-kafka client, "
          f"best of {args.rounds} alternating rounds")
    print(f"{'':10}{'direct MB/s':>14}{'kproxy MB/s':>14}{'ratio':>8}")
    for op in ("produce", "consume"):
        print(f"{op:10}{r[f'direct_{op}_mb_s']:14.1f}{r[f'kproxy_{op}_mb_s']:14.1f}{r[f'{op}_ratio']:8.2f}")
    if args.capture_overload:
        print(f"\nwith capture on ({args.capture_overload}) and a writer that cannot keep up "
              f"(slow disk, {SLOW_DISK_DELAY_S * 1000:g} ms/write):")
        print(f"{'':10}{'capture MB/s':>14}{'vs capture off':>16}")
        for op in ("produce", "consume"):
            print(f"{op:10}{r[f'capture_{op}_mb_s']:14.1f}{r[f'capture_{op}_ratio']:16.2f}")
        print(f"capture events enqueued {r['capture_enqueued']}, dropped {r['capture_dropped']}, "
              f"rows written {r['capture_rows_written']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
