#!/usr/bin/env python3
"""Does an overloaded capture slow clients? Capture toggled on and off under steady traffic.

A producer (then a consumer) runs flat out through kproxy (its own process)
against a real Kafka broker while capture is switched on and off every few
seconds over the admin API, writing to a simulated slow disk (every write
first sleeps 20 ms) so the writer cannot keep up and drops. Client throughput
is read in each window; each "on" window is compared with the mean of the
"off" windows either side of it, so the machine's drift (broker GC, page cache,
other load) cancels out. The drain after each stop (the queue written out) is
excluded from both.

    python benchmarks/bench_capture_overload.py [--windows 10] [--window-s 3] [--formats jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_proxy import SLOW_DISK_DELAY_S, capture as capture_control, kproxy_process  # noqa: E402
from tests.kproxy_process import KproxyProcess  # noqa: E402

RECORD_BYTES = 1024
CONSUME_TOPIC_RECORDS = 300_000      # consumed over and over from the start
# The producer writes ~0.2-0.3 GB/s for minutes: keep the broker's disk use bounded.
BROKER_CONFIG = {"log.retention.bytes": 512 * 1024 * 1024, "log.segment.bytes": 128 * 1024 * 1024,
                 "log.retention.check.interval.ms": 5000, "log.segment.delete.delay.ms": 1000}


class Counter:
    """Bytes the client moved; read by the main thread at window edges."""

    def __init__(self):
        self.bytes = 0
        self.stop = threading.Event()


def produce_forever(bootstrap: str, counter: Counter) -> None:
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 1 << 20,
                         "acks": "all", "compression.type": "none"})
    topic = f"overload-produce-{uuid.uuid4().hex[:6]}"
    payload = b"x" * RECORD_BYTES

    def delivered(err, msg):
        if err is None:
            counter.bytes += RECORD_BYTES

    while not counter.stop.is_set():
        try:
            producer.produce(topic, payload, on_delivery=delivered)
        except BufferError:
            producer.poll(0.01)
            continue
        producer.poll(0)
    producer.flush(30)


def fill(bootstrap: str, topic: str, records: int) -> None:
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 1 << 20})
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, b"y" * RECORD_BYTES)
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush(60)


def consume_forever(bootstrap: str, topic: str, counter: Counter) -> None:
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"overload-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "fetch.max.bytes": 52428800})
    consumer.assign([TopicPartition(topic, 0, 0)])
    while not counter.stop.is_set():
        messages = consumer.consume(10_000, 0.5)
        counter.bytes += sum(len(m.value() or b"") for m in messages if m.error() is None)
        if messages and messages[-1].offset() >= CONSUME_TOPIC_RECORDS - 1:
            consumer.seek(TopicPartition(topic, 0, 0))
    consumer.close()


def process_stats(pid: int) -> tuple[float, float, int]:
    """kproxy's CPU seconds (event loop thread, whole process) and minor page faults
    (memory it touched for the first time), from /proc (Linux)."""
    def fields(path: str) -> list[str]:
        try:
            with open(path) as f:
                return f.read().rsplit(")", 1)[1].split()
        except OSError:
            return ["0"] * 13
    tick = os.sysconf("SC_CLK_TCK")
    loop, whole = fields(f"/proc/{pid}/task/{pid}/stat"), fields(f"/proc/{pid}/stat")
    return ((int(loop[11]) + int(loop[12])) / tick, (int(whole[11]) + int(whole[12])) / tick,
            int(whole[7]))


def run_phase(proxy: KproxyProcess, counter: Counter, client: threading.Thread, windows: int,
              window_s: float, capture: dict) -> dict:
    client.start()
    time.sleep(window_s)                                   # warm-up, not measured
    rates = {"off": [], "on": []}
    cpu = {state: {"loop": 0.0, "other": 0.0, "faults": 0, "seconds": 0.0} for state in rates}
    sequence = []
    try:
        for i in range(2 * windows + 1):                  # off, on, off, ..., off
            state = "on" if i % 2 else "off"
            if state == "on":
                capture_control(proxy, "start", capture)
            start_bytes, start = counter.bytes, time.perf_counter()
            loop_cpu, all_cpu, faults = process_stats(proxy.process.pid)
            time.sleep(window_s)
            elapsed = time.perf_counter() - start
            mb_s = (counter.bytes - start_bytes) / 1e6 / elapsed
            loop_cpu2, all_cpu2, faults2 = process_stats(proxy.process.pid)
            cpu[state]["loop"] += loop_cpu2 - loop_cpu
            cpu[state]["other"] += (all_cpu2 - all_cpu) - (loop_cpu2 - loop_cpu)
            cpu[state]["faults"] += faults2 - faults
            cpu[state]["seconds"] += elapsed
            if state == "on":
                counters = capture_control(proxy, "stop")["counters"]    # drains: excluded from both
            rates[state].append(mb_s)
            sequence.append((state, mb_s))
    finally:
        counter.stop.set()
        client.join(60)
    if min(rates["off"]) <= 0:
        raise RuntimeError(f"the client stalled in a capture-off window: {sequence}")
    with open(f"/proc/{proxy.process.pid}/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    pair_ratios = [rates["on"][k] / ((rates["off"][k] + rates["off"][k + 1]) / 2)
                   for k in range(windows)]
    return {"off_mb_s": rates["off"], "on_mb_s": rates["on"], "ratios": pair_ratios,
            "median_ratio": statistics.median(pair_ratios),
            "mean_ratio": statistics.fmean(pair_ratios),
            "stdev_ratio": statistics.stdev(pair_ratios) if len(pair_ratios) > 1 else 0.0,
            # kproxy's CPU, in cores: its event loop thread, and all its other threads
            # (the capture writer, when on)
            "cpu_cores": {state: {part: c[part] / c["seconds"] for part in ("loop", "other")}
                          for state, c in cpu.items()},
            "page_faults_per_s": {state: c["faults"] / c["seconds"] for state, c in cpu.items()},
            "kproxy_rss_mib": int(status["VmRSS"].split()[0]) / 1024,
            "kproxy_peak_rss_mib": int(status["VmHWM"].split()[0]) / 1024,
            "enqueued": counters["enqueued"], "dropped": counters["dropped"],
            "rows_written": counters["rows_written"], "packets_written": counters["packets_written"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=10, help="capture-on windows per phase")
    parser.add_argument("--window-s", type=float, default=3.0)
    parser.add_argument("--formats", default="jsonl", help="comma-separated capture formats")
    parser.add_argument("--settings", default="{}", help="more capture settings, as JSON")
    parser.add_argument("--slow-disk-ms", type=float, default=SLOW_DISK_DELAY_S * 1000)
    parser.add_argument("--phases", default="produce,consume")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from kproxy.embedded.kafka import KafkaCluster

    results = {"formats": args.formats, "windows": args.windows, "window_s": args.window_s,
               "slow_disk_ms": SLOW_DISK_DELAY_S * 1000}
    with tempfile.TemporaryDirectory() as tmp, KafkaCluster(1, extra_config=BROKER_CONFIG) as broker, \
            kproxy_process(broker.bootstrap_servers, args.slow_disk_ms / 1000) as proxy:
        capture = {"directory": tmp, "formats": args.formats.split(","), **json.loads(args.settings)}
        counter = Counter()
        if "produce" in args.phases:
            results["produce"] = run_phase(proxy, counter, threading.Thread(
                target=produce_forever, args=(proxy.bootstrap, counter)), args.windows, args.window_s,
                capture)
        if "consume" in args.phases:
            topic = f"overload-consume-{uuid.uuid4().hex[:6]}"
            fill(broker.bootstrap_servers, topic, CONSUME_TOPIC_RECORDS)
            counter = Counter()
            results["consume"] = run_phase(proxy, counter, threading.Thread(
                target=consume_forever, args=(proxy.bootstrap, topic, counter)), args.windows,
                args.window_s, capture)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"capture {args.formats} over a slow disk ({args.slow_disk_ms:g} ms/write), "
          f"{args.windows} on-windows of {args.window_s:g} s between off-windows; "
          f"Kafka 4.4.0, confluent-kafka, 1 KiB records")
    print(f"{'':9}{'off MB/s':>10}{'on MB/s':>10}{'on/off median':>15}{'mean ± sd':>14}"
          f"{'dropped':>10}{'enqueued':>10}   kproxy: loop CPU off/on, writer CPU, page faults/s off/on")
    for phase in args.phases.split(","):
        r = results[phase]
        print(f"{phase:9}{statistics.median(r['off_mb_s']):10.1f}{statistics.median(r['on_mb_s']):10.1f}"
              f"{r['median_ratio']:15.3f}{r['mean_ratio']:8.3f} ± {r['stdev_ratio']:.3f}"
              f"{r['dropped']:10}{r['enqueued']:10}   {r['cpu_cores']['off']['loop']:.2f}/"
              f"{r['cpu_cores']['on']['loop']:.2f}, {r['cpu_cores']['on']['other']:.2f}, "
              f"{r['page_faults_per_s']['off']:.0f}/{r['page_faults_per_s']['on']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
