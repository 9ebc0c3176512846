#!/usr/bin/env python3
"""A gateway's fleet of clients: many producer connections at a modest rate, plus consumers.

``run_fleet(...)`` starts ``workers`` processes (this file with ``--worker``), each an
asyncio (uvloop) loop holding its share of the connections, with no client library:
requests are kproxy's codec's bytes (``_fleet_wire.py``), so a send is a buffer copy
and a thousand producers fit in a few processes on two cores (a librdkafka producer
per connection would start three threads each).

Producers: each connection does one ApiVersions round trip, then sends one Produce
v9 request (acks=all, ``records_per_request`` records of ``record_bytes``) every
``records_per_request / rate`` seconds, open loop (a timer, not the previous answer,
decides when), to its own partition (connection i writes partition i mod
``partitions``). At most ``MAX_IN_FLIGHT`` requests wait for an answer per connection,
as a Java producer's default; a send due beyond that is held back and counted.
Latency is from the write of a request to its answer, recorded for every
``sample_every``-th producer. Consumers: one connection each, fetching one
partition from offset 0 in a loop (Fetch v12, long poll).

Workers connect everything, say ``ready``; the caller's ``on_start`` runs, all start
at once; after ``seconds`` the caller's ``on_end`` runs while every connection is
still open (the proxy's RSS), then sends stop, in-flight answers are awaited for up
to ``DRAIN_S`` and the workers report.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _fleet_wire as wire  # noqa: E402

MAX_IN_FLIGHT = 5          # a Java producer's max.in.flight.requests.per.connection default
# Producers of a worker are spread over this many phases of their send interval, so a
# worker's sends come in small waves instead of all at once every interval.
PACING_GROUPS = 10
CONNECT_CONCURRENCY = 64   # connections opened at once per worker: a listen backlog is ~100-4096
# A connection refused or closed before its ApiVersions answer is tried again this many times,
# then left out and counted (kafka-proxy closed one of 1,100 at a load average of 35).
CONNECT_ATTEMPTS = 3
CONNECT_RETRY_S = 0.5
FETCH_MAX_WAIT_MS = 500    # a consumer's long poll (librdkafka's fetch.wait.max.ms default)
FETCH_MIN_BYTES = 1        # answer as soon as anything is there, as consumers do by default
FETCH_MAX_BYTES = 1 << 20
DRAIN_S = 15.0             # after the timed window: how long answers to sent requests are awaited
WORKER_START_TIMEOUT_S = 180.0


class _Framed(asyncio.Protocol):
    """Size-prefixed Kafka frames in from one connection, one ``answer(frame)`` call each."""

    def __init__(self):
        self.buffer = bytearray()
        self.transport = None
        self.first_answer = asyncio.get_running_loop().create_future()
        self.closed = False

    def connection_made(self, transport):
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data):
        buffer = self.buffer
        buffer += data
        pos = 0
        while len(buffer) - pos >= 4:
            size = wire.SIZE.unpack_from(buffer, pos)[0]
            if len(buffer) - pos - 4 < size:
                break
            frame = bytes(buffer[pos + 4:pos + 4 + size])
            pos += 4 + size
            if not self.first_answer.done():
                self.first_answer.set_result(frame)
            else:
                self.answer(frame)
        if pos:
            del buffer[:pos]

    def connection_lost(self, exc):
        self.closed = True
        if not self.first_answer.done():
            self.first_answer.set_exception(ConnectionError(f"closed before answering: {exc}"))

    def answer(self, frame: bytes) -> None:
        raise NotImplementedError


class Producer(_Framed):
    def __init__(self, template: wire.ProduceTemplate, stats: dict, latencies: list[float] | None,
                 records: int):
        super().__init__()
        self.template, self.stats, self.latencies, self.records = template, stats, latencies, records
        self.sent_at: collections.deque[float] = collections.deque()
        self.correlation_id = 0

    def send(self) -> None:
        if self.closed:
            self.stats["sends_on_closed"] += 1
            return
        if len(self.sent_at) >= MAX_IN_FLIGHT:
            self.stats["held_back"] += 1
            return
        self.correlation_id += 1
        self.sent_at.append(time.perf_counter())
        self.transport.write(bytes(self.template.frame(self.correlation_id)))
        self.stats["sends"] += 1

    def answer(self, frame: bytes) -> None:
        elapsed = time.perf_counter() - self.sent_at.popleft()
        if self.latencies is not None:
            self.latencies.append(elapsed)
        error = self.template.error_code(frame)
        if error:
            self.stats["errors"][str(error)] = self.stats["errors"].get(str(error), 0) + 1
        else:
            self.stats["acked_records"] += self.records


class Consumer(_Framed):
    def __init__(self, topic: str, partition: int, client_id: str, stats: dict):
        super().__init__()
        self.topic, self.partition, self.client_id, self.stats = topic, partition, client_id, stats
        self.offset = 0
        self.correlation_id = 0
        self.running = False
        self.waiting = False

    def fetch(self) -> None:
        self.correlation_id += 1
        self.waiting = True
        self.transport.write(wire.fetch_request(self.correlation_id, self.client_id, self.topic, self.partition,
                                                self.offset, FETCH_MAX_WAIT_MS, FETCH_MIN_BYTES, FETCH_MAX_BYTES))

    def answer(self, frame: bytes) -> None:
        self.waiting = False
        error, self.offset, count = wire.fetched(frame, self.offset)
        self.stats["fetches"] += 1
        if error:
            self.stats["fetch_errors"][str(error)] = self.stats["fetch_errors"].get(str(error), 0) + 1
        self.stats["consumed_records"] += count
        if self.running and not self.closed:
            self.fetch()


async def _connect(loop, factory, address: str, hello: bytes, gate: asyncio.Semaphore, stats: dict):
    """A connection that has had its ApiVersions answer, or None (counted) if none would."""
    host, port = address.rsplit(":", 1)
    for attempt in range(CONNECT_ATTEMPTS):
        try:
            async with gate:
                _, protocol = await loop.create_connection(factory, host, int(port))
                protocol.transport.write(hello)
                await protocol.first_answer            # the ApiVersions answer
            return protocol
        except OSError as exc:                         # ConnectionError included
            stats["connect_retries"] += 1
            stats["connect_error"] = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(CONNECT_RETRY_S)
    stats["connect_failures"] += 1
    return None


async def _worker(config: dict) -> dict:
    loop = asyncio.get_running_loop()
    stats = {"sends": 0, "held_back": 0, "sends_on_closed": 0, "acked_records": 0, "errors": {},
             "fetches": 0, "consumed_records": 0, "fetch_errors": {}, "connect_retries": 0, "connect_failures": 0}
    latencies: list[float] = []
    topic, records, size = config["topic"], config["records_per_request"], config["record_bytes"]
    leaders = {int(k): v for k, v in config["leaders"].items()}
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
    pending = []
    for index in config["producers"]:
        partition = index % len(leaders)
        client_id = f"fleet-producer-{index}"
        template = wire.ProduceTemplate(topic, partition, records, size, client_id)
        sampled = latencies if index % config["sample_every"] == 0 else None
        pending.append(_connect(loop, lambda t=template, s=sampled: Producer(t, stats, s, records),
                                leaders[partition], wire.api_versions_request(0, client_id), gate, stats))
    for index in config["consumers"]:
        partition = index % len(leaders)
        client_id = f"fleet-consumer-{index}"
        pending.append(_connect(loop, lambda p=partition, c=client_id: Consumer(topic, p, c, stats),
                                leaders[partition], wire.api_versions_request(0, client_id), gate, stats))
    connections = [c for c in await asyncio.gather(*pending) if c is not None]
    producers = [c for c in connections if isinstance(c, Producer)]
    consumers = [c for c in connections if isinstance(c, Consumer)]
    print("ready", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)          # "go"

    for consumer in consumers:
        consumer.running = True
        consumer.fetch()
    groups = [producers[g::PACING_GROUPS] for g in range(PACING_GROUPS)]
    tick = records / config["rate"] / PACING_GROUPS
    start = time.perf_counter()
    ticks = int(config["seconds"] / tick)
    done = 0
    while done < ticks:
        due = min(ticks, int((time.perf_counter() - start) / tick) + 1)
        for k in range(done, due):              # late ticks are caught up, as a timer would
            for producer in groups[k % PACING_GROUPS]:
                producer.send()
        done = due
        await asyncio.sleep(max(0.0, start + done * tick - time.perf_counter()))
    stats["send_seconds"] = time.perf_counter() - start
    print("sent", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)          # "stop": the caller has measured
    for consumer in consumers:
        consumer.running = False
    deadline = time.perf_counter() + DRAIN_S
    while time.perf_counter() < deadline and any(p.sent_at for p in producers if not p.closed):
        await asyncio.sleep(0.05)
    stats["unanswered"] = sum(len(p.sent_at) for p in producers)
    stats["closed"] = sum(c.closed for c in connections)
    for c in connections:
        c.transport.close()
    stats["latencies_s"] = latencies
    return stats


def worker_main() -> int:
    import uvloop
    config = json.loads(sys.stdin.readline())
    stats = uvloop.run(_worker(config))
    print(json.dumps(stats), flush=True)
    return 0


def _tell(processes, word: str) -> None:
    """One line to every worker process (they wait for it on stdin)."""
    for process in processes:
        process.stdin.write(word + "\n")
        process.stdin.flush()


def _await_line(process: subprocess.Popen, expected: str) -> None:
    line = process.stdout.readline().strip()
    if line != expected:
        process.kill()
        raise RuntimeError(f"fleet worker said {line!r} instead of {expected!r} (exit {process.poll()})")


def run_fleet(leaders: dict[int, str], topic: str, *, connections: int, consumers: int, rate: float,
              records_per_request: int, record_bytes: int, seconds: float, workers: int,
              sample_every: int, on_start=None, on_end=None) -> dict:
    """Run the fleet against ``leaders`` (partition -> address); the workers' merged figures."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    processes = []
    try:
        for w in range(workers):
            process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker"],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
            processes.append(process)
            process.stdin.write(json.dumps({
                "topic": topic, "leaders": leaders, "records_per_request": records_per_request,
                "record_bytes": record_bytes, "rate": rate, "seconds": seconds, "sample_every": sample_every,
                "producers": list(range(w, connections, workers)),
                "consumers": list(range(w, consumers, workers))}) + "\n")
            process.stdin.flush()
        for process in processes:
            _await_line(process, "ready")
        started = on_start() if on_start else None
        _tell(processes, "go")
        for process in processes:
            _await_line(process, "sent")
        ended = on_end() if on_end else None
        _tell(processes, "stop")
        reports = [json.loads(process.stdout.readline()) for process in processes]
        for process in processes:
            process.wait(30)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    merged: dict = {"started": started, "ended": ended, "latencies_s": [], "errors": {}, "fetch_errors": {}}
    for report in reports:
        for key, value in report.items():
            if isinstance(value, list):
                merged[key] += value
            elif isinstance(value, dict):
                for code, n in value.items():
                    merged[key][code] = merged[key].get(code, 0) + n
            elif key == "send_seconds":
                merged[key] = max(merged.get(key, 0.0), value)
            elif key == "connect_error":
                merged[key] = value
            else:
                merged[key] = merged.get(key, 0) + value
    return merged


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        sys.exit(worker_main())
    sys.exit("usage: _fleet.py --worker (started by run_fleet)")
