#!/usr/bin/env python3
"""kproxy beside going direct and beside other Kafka proxies, in one run.

One Apache Kafka node (``kproxy.embedded``); in front of it, each in its own
process: kproxy (this tree, plus any other trees given with ``--kproxy-tree``,
e.g. main's relay for a before/after), grepplabs/kafka-proxy with its default
4 KiB copy buffers and with 256 KiB ones, and Kroxylicious (pass-through).
Peers come prebuilt from ``../shared/peers`` (``--peers``) and are skipped,
with a message, when absent. Clients are confluent-kafka.

The floor under every proxy's ratios comes from two relays that know nothing of
Kafka: ``bare`` (``_bare_relay.py``, uvloop, forwards each read at once) and
``splice`` (``_splice_relay.py``, bytes never in user space). The broker's CLIENT
listener advertises the port they take in turn (started for their rounds only), so
they need no rewriting; direct and the proxies use its INTERNAL listener, which
advertises itself. ``--no-floor`` leaves them out.

Every round runs every path once, the order rotating from round to round; each
figure is divided by direct's figure *of the same round* (paired ratios), and
the median and min-max of those ratios are reported, so a machine whose speed
drifts (2 shared cores here) moves both sides of each ratio together.

Scenarios (``--scenarios``, all by default): ``1k`` and ``100`` (produce then
consume 1 KiB / 100 B records), ``large`` (1 MiB records), ``latency`` (sequential
small sends), ``memory`` (RSS per idle connection), ``fleet`` (a gateway's load:
``--fleet-connections`` producer connections at ``--fleet-rate`` records/s each
plus ``--fleet-consumers`` consumers, from ``_fleet.py``'s light clients).

    python benchmarks/bench_peers.py --quick              # ~3 min
    python benchmarks/bench_peers.py --rounds 7 --json out.json
    python benchmarks/bench_peers.py --kproxy-tree main=/work/main   # old vs new relay
    python benchmarks/bench_peers.py --scenarios fleet,large --quick
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _fleet, _fleet_wire  # noqa: E402
from benchmarks.bench_proxy import consume, kproxy_process, produce, stop_process  # noqa: E402
from kproxy.embedded import recv_exactly  # noqa: E402
from kproxy.embedded._support import free_port, free_ports  # noqa: E402

HERE = Path(__file__).resolve().parent
DEFAULT_PEERS = HERE.parent.parent / "shared" / "peers"
# Records per throughput phase (MB = records x size). Full: ~100 MB per 1 KiB phase.
# The fleet: 1,000 producer connections at 50 records/s each, batched 5 to a request (a
# 100 ms linger: 10,000 requests/s in all, ~50 MB/s), and 100 consumers. --quick keeps
# the connections and lowers the rate to what a loaded 2-core machine carries directly.
FULL = {"records_1k": 100_000, "records_100": 400_000, "records_1m": 400, "latency_sends": 2_000, "rounds": 5,
        "fleet_connections": 1000, "fleet_consumers": 100, "fleet_rate": 50.0, "fleet_batch": 5,
        "fleet_seconds": 60.0}
QUICK = {"records_1k": 40_000, "records_100": 150_000, "records_1m": 150, "latency_sends": 500, "rounds": 3,
         "fleet_connections": 1000, "fleet_consumers": 100, "fleet_rate": 2.0, "fleet_batch": 1,
         "fleet_seconds": 20.0}
SCENARIOS = ("1k", "100", "large", "latency", "memory", "fleet")
LARGE_RECORD_BYTES = 1 << 20
# A 1 MiB record in its batch is a little over the broker's default limit (1 MiB + 12 bytes):
# the large-record topics allow 2 MiB, and their producer's own limits are raised to match.
LARGE_MAX_MESSAGE_BYTES = 2 << 20
FLEET_RECORD_BYTES = 1024
FLEET_WORKERS = 4          # client processes holding the fleet's connections (two cores here)
FLEET_SAMPLED = 100        # producers whose every request's latency is recorded
# The splice relay runs two threads per connection: 2,200 threads for the fleet's
# connections would measure the scheduler, not a relay. The bare relay is the fleet's floor.
FLEET_SKIPS = ("splice",)
# A fleet round whose producers got fewer answers than this share of their due sends ran
# the path (or the machine) past what it carries: its latency is a queue's, flagged.
FLEET_SATURATED_BELOW = 0.95
# The fleet runs once directly before the rounds, not counted: the first fleet round of a
# run (the broker's JIT and its 100-partition logs cold) carried 0.74 of its load at a p50 of
# 5.8 s, the later direct rounds 1.00 at 5-11 ms (session 12, load average ~35).
WARM_UP = -1
LATENCY_WARMUP_SENDS = 50        # first sends of a latency phase (connections, metadata) not counted
IDLE_CONNECTIONS = 1000          # opened at once to measure RSS per idle connection (more: steadier)
PEER_START_TIMEOUT_S = 120.0     # a JVM proxy takes seconds to listen, more on a loaded machine
TOPIC_SETTLE_S = 1.0             # after leaders exist; see the peers README (kafka-proxy bypass)
# A proxied phase whose proxy used less CPU than this per MB moved its bytes elsewhere
# (a client that learnt the broker's own address bypasses the proxy): flagged, not trusted.
# A third of what the splice relay (the floor: bytes never in user space) uses; it was 5
# times this until kproxy itself came under it (0.45-0.55 s per GB consumed, session 7).
BYPASS_CPU_S_PER_MB = 0.0001
KAFKA_PROXY_BIG_BUFFER = 256 * 1024


# ------------------------------------------------------------------ processes

def cpu_seconds(pid: int) -> float:
    """CPU time of a process, summed over its threads' ``/proc/<pid>/task/*/schedstat``
    (nanoseconds run; ``/proc/<pid>/stat`` counts 10 ms clock ticks, steps of ~0.09 s/GB in
    a ``--quick`` phase). A thread that ends between two readings takes its time with it:
    the proxies here keep their threads for their lifetime."""
    total = 0
    for path in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue                     # the thread ended while being read
    return total / 1e9


def user_system_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU time of a process from ``/proc/<pid>/stat`` (10 ms clock ticks;
    ended threads' time included). User time is the relay's own code; system time is mostly
    the kernel moving the bytes, about the same for every relay here (session 8: kproxy,
    the bare relay and the splice relay all ~0.33 s per GB consumed)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def api_versions_round_trip(address: str, timeout: float = 5.0) -> socket.socket:
    """Open a connection, send ApiVersions v0, read the whole answer; the socket stays open."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    client_id = b"bench"
    body = struct.pack(">hhih", 18, 0, 1, len(client_id)) + client_id
    sock.sendall(struct.pack(">i", len(body)) + body)
    header = recv_exactly(sock, 4)
    recv_exactly(sock, struct.unpack(">i", header)[0])
    return sock


def wait_until_serving(address: str, process: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + PEER_START_TIMEOUT_S
    while True:
        try:
            api_versions_round_trip(address, timeout=2).close()
            return
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start serving on {address}")
        time.sleep(0.2)


def start_serving(argv: list[str], address: str, what: str, **popen) -> subprocess.Popen:
    """Start a peer and wait until it answers ApiVersions at address; stopped again if it does not."""
    process = subprocess.Popen(argv, **popen)
    try:
        wait_until_serving(address, process, what)
    except RuntimeError:
        stop_process(process)
        raise
    return process


class _Path:
    """What the rounds ask of every path: a process serving for a round (already running
    for those started once), and its CPU seconds so far."""

    pid: int | None = None
    idle_connections_measured = True    # RSS per idle connection: a figure of this path's

    def serving(self):
        return contextlib.nullcontext()

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)


class KproxyPath(_Path):
    """kproxy (the tree this file is in, or another checkout) in its own process."""

    def __init__(self, label: str, upstream: str, tree: Path | None = None):
        self.label = label
        self.proxy = kproxy_process(upstream, **({} if tree is None else {"tree": tree}))

    @property
    def bootstrap(self) -> str:
        return self.proxy.bootstrap

    def __enter__(self):
        self.proxy.__enter__()
        self.pid = self.proxy.pid
        return self

    def __exit__(self, *exc):
        self.proxy.__exit__(*(exc or (None, None, None)))


class KafkaProxyPath(_Path):
    """grepplabs/kafka-proxy, one mapping for the one broker."""

    def __init__(self, label: str, upstream: str, binary: Path, buffer_bytes: int | None):
        self.label = label
        self.bootstrap = f"127.0.0.1:{free_port()}"
        self.argv = [str(binary), "server",
                     "--bootstrap-server-mapping", f"{upstream},{self.bootstrap}",
                     "--default-listener-ip", "127.0.0.1",
                     "--dynamic-sequential-min-port", str(free_port()),
                     "--http-listen-address", f"127.0.0.1:{free_port()}",
                     "--debug-listen-address", f"127.0.0.1:{free_port()}"]
        if buffer_bytes:
            self.argv += ["--proxy-request-buffer-size", str(buffer_bytes),
                          "--proxy-response-buffer-size", str(buffer_bytes)]

    def __enter__(self):
        self.process = start_serving(self.argv, self.bootstrap, self.label,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.pid = self.process.pid
        return self

    def __exit__(self, *exc):
        stop_process(self.process)


class KroxyliciousPath(_Path):
    """Kroxylicious, a pass-through virtual cluster; node n at bootstrap port + 1 + n."""

    def __init__(self, label: str, upstream: str, home: Path, workdir: Path):
        self.label = label
        self.upstream = upstream
        self.config = workdir / "kroxylicious.yaml"
        self.home = home
        self.log = workdir / "kroxylicious.log"
        self.argv = ["java", "-XX:+ExitOnOutOfMemoryError",
                     "-Dlog4j2.configurationFile=config/log4j2.yaml", "-cp", "app/*:libs/*",
                     "io.kroxylicious.app.Kroxylicious", "--config", str(self.config)]
        self.bootstrap = "(not started)"

    def __enter__(self):
        # Ports chosen just before it starts: its node ports (bootstrap + 1 + node id) are
        # not reserved, and the other proxies' listeners take ports as they start.
        self.bootstrap = f"127.0.0.1:{free_ports(4, consecutive=True)[0]}"
        upstream = self.upstream
        self.config.write_text(f"""\
management:
  bindAddress: 127.0.0.1
  port: {free_port()}
  endpoints:
    prometheus: {{}}
virtualClusters:
  - name: bench
    targetCluster:
      bootstrapServers: {upstream}
    gateways:
    - name: default
      portIdentifiesNode:
        bootstrapAddress: {self.bootstrap}
    logNetwork: false
    logFrames: false
""")
        with open(self.log, "wb") as log:
            self.process = start_serving(self.argv, self.bootstrap, self.label,
                                         cwd=self.home, stdout=log, stderr=subprocess.STDOUT)
        self.pid = self.process.pid
        return self

    def __exit__(self, *exc):
        stop_process(self.process)


class RelayPath(_Path):
    """A Kafka-blind relay (the floor) on the port the broker advertises, started for the
    phases of its rounds only (another takes the port in turn). Its CPU is read from
    ``/proc/<pid>/stat``, which keeps the time of threads that ended: the splice relay's
    threads last as long as a connection."""

    # Their fresh RSS is a Python relay's floor. Per connection not measured: the splice
    # relay keeps two threads and a pipe; the bare relay's read buffer, 1 MiB a side until
    # session 12, is now one for all its connections (its RSS in the fleet is a floor).
    idle_connections_measured = False

    def __init__(self, label: str, script: str, listen: int, upstream: int):
        self.label = label
        self.argv = [sys.executable, str(HERE / script), str(listen), str(upstream)]
        self.bootstrap = f"127.0.0.1:{listen}"
        self.process: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    @contextlib.contextmanager
    def serving(self):
        self.process = start_serving(self.argv, self.bootstrap, self.label)
        try:
            yield
        finally:
            stop_process(self.process)
            self.process = None

    def cpu_seconds(self) -> float:          # /proc/<pid>/stat: ended threads' time kept
        return sum(user_system_seconds(self.pid))


class DirectPath(_Path):
    label = "direct"

    def __init__(self, upstream: str):
        self.bootstrap = upstream

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


# ------------------------------------------------------------------ workloads

def latency(bootstrap: str, topic: str, sends: int) -> list[float]:
    """Seconds per sequential acks=1 send of 100 B (each awaited before the next)."""
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": 1})
    times = []
    for i in range(sends + LATENCY_WARMUP_SENDS):
        start = time.perf_counter()
        producer.produce(topic, b"y" * 100)
        producer.flush(10)
        if i >= LATENCY_WARMUP_SENDS:
            times.append(time.perf_counter() - start)
    return times


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def idle_connection_rss(path) -> int:
    """RSS added per connection by a second batch of ``IDLE_CONNECTIONS`` idle clients
    (each did one ApiVersions round trip, so the proxy has its upstream side open too).
    The first batch fills what start-up freed, which would hide the cost."""
    socks = [api_versions_round_trip(path.bootstrap) for _ in range(IDLE_CONNECTIONS)]
    time.sleep(1.0)
    first = rss_bytes(path.pid)
    socks += [api_versions_round_trip(path.bootstrap) for _ in range(IDLE_CONNECTIONS)]
    time.sleep(1.0)
    second = rss_bytes(path.pid)
    for s in socks:
        s.close()
    time.sleep(0.5)
    return (second - first) // IDLE_CONNECTIONS


def create_topics(bootstrap: str, names: list[str], partitions: dict[str, int] | None = None,
                  configs: dict[str, dict] | None = None) -> None:
    """Topics of one partition (``partitions`` names other counts), each replica on the one node."""
    from confluent_kafka.admin import AdminClient, NewTopic
    partitions, configs = partitions or {}, configs or {}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = [NewTopic(n, partitions.get(n, 1), 1, config=configs.get(n, {})) for n in names]
    for future in admin.create_topics(new).values():
        future.result(60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        meta = admin.list_topics(timeout=10).topics
        if all(n in meta and len(meta[n].partitions) == partitions.get(n, 1)
               and all(p.leader >= 0 for p in meta[n].partitions.values()) for n in names):
            break
        time.sleep(0.2)
    time.sleep(TOPIC_SETTLE_S)


def await_writable(bootstrap: str, topic: str, partitions: int) -> None:
    """Produce one record to each partition until the broker takes it. A new topic's leader
    is in the metadata before the broker can append to it: with a few thousand new
    partitions on a loaded node, the first fleet round met NOT_LEADER_OR_FOLLOWER on one
    send in seven without this."""
    host, port = bootstrap.rsplit(":", 1)
    deadline = time.monotonic() + 120
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        for partition in range(partitions):
            template = _fleet_wire.ProduceTemplate(topic, partition, 1, 1, "bench-ready")
            while True:
                sock.sendall(template.frame(partition))
                answer = recv_exactly(sock, struct.unpack(">i", recv_exactly(sock, 4))[0])
                if template.error_code(answer) == 0:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{topic} partition {partition} refuses records")
                time.sleep(0.1)


def produce_large(bootstrap: str, topic: str, records: int, size: int) -> float:
    """``produce`` for records over librdkafka's default limits (1 MB a message)."""
    return produce(bootstrap, topic, records, size, settings={
        "message.max.bytes": LARGE_MAX_MESSAGE_BYTES, "batch.size": LARGE_MAX_MESSAGE_BYTES})


def consume_large(bootstrap: str, topic: str, records: int) -> float:
    """``consume`` one record at a time: its batches of up to 10,000 would take most of a
    large-record phase in the first batch, which its timing leaves out."""
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "fetch.max.bytes": 52428800,
                         "fetch.queue.backoff.ms": 10, "receive.message.max.bytes": 104857600})
    consumer.assign([TopicPartition(topic, 0, 0)])
    total = records + 1                       # the warm-up record too
    got = 0
    start = None
    deadline = time.perf_counter() + 120
    try:
        while got < total and time.perf_counter() < deadline:
            message = consumer.poll(1.0)
            if message is None or message.error():
                continue
            if start is None:
                start = time.perf_counter()
            got += 1
        elapsed = time.perf_counter() - start if start else 0.0
    finally:
        consumer.close()
    if got < total:
        raise RuntimeError(f"consumed {got} of {total}")
    return elapsed * total / (total - 1)     # from the first record's arrival: scale by one


def partition_leaders(bootstrap: str, topic: str) -> dict[int, str]:
    """Partition -> leader address, as the path in front of ``bootstrap`` advertises it."""
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(_fleet_wire.metadata_request(1, topic))
        frame = recv_exactly(sock, struct.unpack(">i", recv_exactly(sock, 4))[0])
    return _fleet_wire.leaders(frame, topic)


def fleet_round(path, topic: str, args) -> dict:
    """One path's fleet phase: latency of the sampled producers, the proxy's CPU and RSS
    while every connection is open, and how much of the due load was carried."""
    pid = path.pid

    def proxy_state():
        return (time.perf_counter(), path.cpu_seconds() if pid else None, rss_bytes(pid) if pid else None)

    sample_every = max(1, args.fleet_connections // FLEET_SAMPLED)
    fleet = _fleet.run_fleet(partition_leaders(path.bootstrap, topic), topic,
                             connections=args.fleet_connections, consumers=args.fleet_consumers,
                             rate=args.fleet_rate, records_per_request=args.fleet_batch,
                             record_bytes=FLEET_RECORD_BYTES, seconds=args.fleet_seconds,
                             workers=FLEET_WORKERS, sample_every=sample_every,
                             on_start=proxy_state, on_end=proxy_state)
    (t0, cpu0, _), (t1, cpu1, rss) = fleet["started"], fleet["ended"]
    latencies = fleet["latencies_s"]
    due = args.fleet_connections * args.fleet_rate * args.fleet_seconds
    out = {"fleet_p50_ms": percentile(latencies, 0.50) * 1000, "fleet_p99_ms": percentile(latencies, 0.99) * 1000,
           "fleet_carried": fleet["acked_records"] / due,
           "fleet_consumed": fleet["consumed_records"] / max(fleet["acked_records"], 1),
           "fleet_errors": sum(fleet["errors"].values()) + sum(fleet["fetch_errors"].values())
           + fleet["unanswered"] + fleet["closed"]}
    if pid:
        moved_gb = (fleet["acked_records"] + fleet["consumed_records"]) * FLEET_RECORD_BYTES / 1e9
        out["fleet_cpu_s_per_min"] = (cpu1 - cpu0) / (t1 - t0) * 60
        out["fleet_cpu_s_per_gb"] = (cpu1 - cpu0) / max(moved_gb, 1e-9)
        out["fleet_rss_mib"] = rss / 2**20
    out["fleet_errors"] += fleet["connect_failures"]
    if out["fleet_errors"] or fleet["connect_retries"]:
        print(f"  fleet on {path.label}: produce errors {fleet['errors']}, fetch errors {fleet['fetch_errors']}, "
              f"unanswered {fleet['unanswered']}, connections closed {fleet['closed']}, connections retried "
              f"{fleet['connect_retries']} and left out {fleet['connect_failures']} "
              f"({fleet.get('connect_error', '')})", file=sys.stderr)
    return out


# ------------------------------------------------------------------ the run

SIZE_SCENARIOS = ("1k", "100", "1m")             # their phases: produce_<size>, consume_<size>


def phases(results: dict) -> list[str]:
    """The throughput phases of a run, in the order they run."""
    return [f"{op}_{size}" for size in results["sizes"] for op in ("produce", "consume")]


def run(args) -> dict:
    from kproxy.embedded.kafka import KafkaCluster

    chosen = {"1k": (1024, args.records_1k), "100": (100, args.records_100),
              "1m": (LARGE_RECORD_BYTES, args.records_1m)}
    sizes = {key: chosen[key] for key in SIZE_SCENARIOS
             if (key if key != "1m" else "large") in args.scenarios}
    results: dict = {"rounds": args.rounds, "scenarios": sorted(args.scenarios), "sizes": list(sizes),
                     "records_1k": args.records_1k, "records_100": args.records_100,
                     "records_1m": args.records_1m, "latency_sends": args.latency_sends,
                     "skipped": {}, "paths": {}}
    if "fleet" in args.scenarios:
        results["fleet"] = {k: getattr(args, f"fleet_{k}") for k in ("connections", "consumers", "rate", "batch",
                                                                      "seconds")}
    peers = Path(args.peers)
    relay_port = free_port()
    with tempfile.TemporaryDirectory() as tmp, \
            KafkaCluster(1, advertised={1: f"127.0.0.1:{relay_port}"}) as cluster:
        upstream = cluster.internal_bootstrap_servers
        paths = [DirectPath(upstream), KproxyPath("kproxy", upstream)]
        for spec in args.kproxy_tree:
            name, _, tree = spec.partition("=")
            paths.append(KproxyPath(f"kproxy-{name}", upstream, Path(tree).resolve()))
        binary = peers / "kafka-proxy" / "kafka-proxy"
        if binary.exists():
            paths.append(KafkaProxyPath("kafka-proxy-4k", upstream, binary, None))
            paths.append(KafkaProxyPath("kafka-proxy-256k", upstream, binary, KAFKA_PROXY_BIG_BUFFER))
        else:
            results["skipped"]["kafka-proxy"] = f"not found at {binary}"
        krox = peers / "kroxylicious"
        if (krox / "app").is_dir() and shutil.which("java"):
            paths.append(KroxyliciousPath("kroxylicious", upstream, krox, Path(tmp)))
        else:
            results["skipped"]["kroxylicious"] = f"not found at {krox} (or no java on PATH)"
        if args.floor:
            client_port = cluster.nodes[0].port
            paths += [RelayPath("bare", "_bare_relay.py", relay_port, client_port),
                      RelayPath("splice", "_splice_relay.py", relay_port, client_port)]
        for name, why in results["skipped"].items():
            print(f"skipping {name}: {why}", file=sys.stderr)
        labels = [p.label for p in paths]
        topics = {(label, r, size): f"bench-{label}-{r}-{size}-{uuid.uuid4().hex[:6]}"
                  for label in labels for r in range(args.rounds) for size in (*sizes, "lat", "fleet")}
        if "fleet" in args.scenarios:
            topics[("direct", WARM_UP, "fleet")] = f"bench-warm-up-fleet-{uuid.uuid4().hex[:6]}"
        partitions = {name: max(1, args.fleet_consumers) for (_, _, kind), name in topics.items() if kind == "fleet"}
        configs = {name: {"max.message.bytes": str(LARGE_MAX_MESSAGE_BYTES)}
                   for (_, _, kind), name in topics.items() if kind == "1m"}
        create_topics(upstream, list(topics.values()), partitions, configs)
        for name, count in partitions.items():
            await_writable(upstream, name, count)
        started = []
        try:
            for path in list(paths):
                try:
                    started.append(path.__enter__())
                except RuntimeError as exc:
                    if isinstance(path, (DirectPath, KproxyPath)):
                        raise
                    why = str(exc)
                    if getattr(path, "log", None) is not None and path.log.exists():
                        why += ": " + " | ".join(path.log.read_text(errors="replace").splitlines()[-3:])
                    results["skipped"][path.label] = why
                    print(f"skipping {path.label}: {why}", file=sys.stderr)
                    paths.remove(path)
                    continue
                stats = results["paths"].setdefault(path.label, {"rounds": {}})
                with path.serving():         # the floor relays' too: a Python process's floor
                    if path.pid is not None:
                        stats["rss_fresh_bytes"] = rss_bytes(path.pid)
                        if path.idle_connections_measured and "memory" in args.scenarios:
                            stats["rss_per_idle_connection_bytes"] = idle_connection_rss(path)
            if "fleet" in args.scenarios:        # not counted: the broker's first fleet is its slowest
                print("fleet warm-up (direct, not counted)", file=sys.stderr)
                fleet_round(paths[0], topics[("direct", WARM_UP, "fleet")], args)
            for r in range(args.rounds):
                order = paths[r % len(paths):] + paths[:r % len(paths)]
                for path in order:
                    with path.serving():
                        run_round(path, r, results["paths"][path.label]["rounds"], sizes, topics, args)
            for path in paths:
                if path.pid:
                    results["paths"][path.label]["rss_after_bytes"] = rss_bytes(path.pid)
        finally:
            for path in reversed(started):
                path.__exit__()
    return results


def run_round(path, r: int, rounds: dict, sizes: dict, topics: dict, args) -> None:
    """One path's round: the throughput phases, the latency sends, then the fleet."""
    print(f"round {r + 1}/{args.rounds}: {path.label}", file=sys.stderr)
    cpu = 0.0
    moved_mb = 0.0
    user_before = user_system_seconds(path.pid)[0] if path.pid else 0.0
    for phase in [f"{op}_{size}" for size in sizes for op in ("produce", "consume")]:
        op, size_key = phase.split("_")
        size, records = sizes[size_key]
        topic = topics[(path.label, r, size_key)]
        before = path.cpu_seconds() if path.pid else 0.0
        if op == "produce":
            seconds = (produce_large if size_key == "1m" else produce)(path.bootstrap, topic, records, size)
        else:
            seconds = (consume_large if size_key == "1m" else consume)(path.bootstrap, topic, records)
        mb = records * size / 1e6
        rounds.setdefault(f"{phase}_mb_s", []).append(mb / seconds)
        if path.pid:
            used = path.cpu_seconds() - before
            cpu += used
            moved_mb += mb
            if used < BYPASS_CPU_S_PER_MB * mb:
                rounds.setdefault("suspect_bypass", []).append(phase)
    if path.pid and moved_mb:
        rounds.setdefault("cpu_s_per_gb", []).append(cpu / moved_mb * 1000)
        user = user_system_seconds(path.pid)[0] - user_before
        rounds.setdefault("user_cpu_s_per_gb", []).append(user / moved_mb * 1000)
    if "latency" in args.scenarios:
        times = latency(path.bootstrap, topics[(path.label, r, "lat")], args.latency_sends)
        rounds.setdefault("latency_p50_ms", []).append(percentile(times, 0.50) * 1000)
        rounds.setdefault("latency_p99_ms", []).append(percentile(times, 0.99) * 1000)
    if "fleet" in args.scenarios and path.label not in FLEET_SKIPS:
        try:
            figures = fleet_round(path, topics[(path.label, r, "fleet")], args)
        except RuntimeError as exc:            # a round lost, not the run: None keeps rounds paired
            print(f"  fleet on {path.label} failed: {exc}", file=sys.stderr)
            rounds.setdefault("fleet_failed", []).append(str(exc))
            figures = dict.fromkeys(FLEET_FIGURES)
        for key, value in figures.items():
            rounds.setdefault(key, []).append(value)


def _spread(values: list[float | None]) -> dict | None:
    """Median and min-max of a row's rounds; a round that failed (None) is left out."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _pairs(mine: list | None, theirs: list | None) -> list[tuple[float, float]]:
    """Same-round figures of two paths, rounds either lost left out."""
    return [(a, b) for a, b in zip(mine or (), theirs or ()) if a is not None and b is not None]


def _paired(mine: list[float] | None, theirs: list[float] | None, fn) -> dict | None:
    """fn(mine, theirs) per round, as a spread (None when either side has no such rounds)."""
    return _spread([fn(a, b) for a, b in _pairs(mine, theirs)])


# Figures of a round that are a spread of their own (no pairing with direct).
FLEET_FIGURES = ("fleet_p50_ms", "fleet_p99_ms", "fleet_cpu_s_per_min", "fleet_cpu_s_per_gb", "fleet_rss_mib",
                 "fleet_carried", "fleet_consumed", "fleet_errors")
ROUND_FIGURES = ("cpu_s_per_gb", "user_cpu_s_per_gb", *FLEET_FIGURES)


def summarize(results: dict) -> None:
    """Paired ratios to direct (throughput; to the bare relay too) and added latency, per
    round; median and min-max."""
    direct = results["paths"]["direct"]["rounds"]
    bare = results["paths"].get("bare", {}).get("rounds", {})
    for label, stats in results["paths"].items():
        rounds = stats["rounds"]
        summary = stats["summary"] = {}
        for phase in phases(results):
            key = f"{phase}_mb_s"
            summary[key] = _spread(rounds[key])
            summary[f"{phase}_ratio"] = _paired(rounds[key], direct[key], lambda a, b: a / b)
            to_bare = _paired(rounds[key], bare.get(key), lambda a, b: a / b)
            if to_bare is not None:
                summary[f"{phase}_to_bare"] = to_bare
        for key in ("latency_p50_ms", "latency_p99_ms", "fleet_p50_ms", "fleet_p99_ms"):
            if _spread(rounds.get(key, ())):
                summary[key] = _spread(rounds[key])
                added = _paired(rounds[key], direct.get(key), lambda a, b: a - b)
                if added is not None:
                    summary[f"added_{key}"] = added
        for key in ROUND_FIGURES:
            if _spread(rounds.get(key, ())):
                summary[key] = _spread(rounds[key])


def print_table(results: dict) -> None:
    labels = list(results["paths"])
    width = max(14, *(len(x) + 2 for x in labels))
    print(f"1 Apache Kafka node, {results['rounds']} interleaved rounds (order rotating); ratios to direct "
          f"in the same round: median [min-max]")
    if "fleet" in results:
        f = results["fleet"]
        print(f"fleet: {f['connections']} producer connections x {f['rate']:g} records/s of {FLEET_RECORD_BYTES} B, "
              f"{f['batch']} a request (acks=all), {f['consumers']} consumers, {f['seconds']:g} s; "
              f"light clients in {FLEET_WORKERS} processes (_fleet.py)")
    print(f"{'':26}" + "".join(f"{x:>{width + 8}}" for x in labels))

    def row(title, fn):
        print(f"{title:26}" + "".join(f"{fn(results['paths'][x]):>{width + 8}}" for x in labels))

    def spread(key, form="{median:.2f} [{min:.2f}-{max:.2f}]"):
        return lambda s: form.format(**s["summary"][key]) if key in s["summary"] else "-"

    def shown(key):
        return any(key in s.get("summary", {}) for s in results["paths"].values())

    for phase in phases(results):
        row(f"{phase} ratio", spread(f"{phase}_ratio"))
    for phase in phases(results):
        if shown(f"{phase}_to_bare"):
            row(f"{phase} / bare relay", spread(f"{phase}_to_bare"))
    for phase in phases(results):
        row(f"{phase} MB/s (median)", spread(f"{phase}_mb_s", "{median:.1f}"))
    for name, key in (("latency", "latency"), ("fleet", "fleet")):
        for q in ("p50", "p99"):
            if shown(f"{key}_{q}_ms"):
                row(f"{name} {q} ms", spread(f"{key}_{q}_ms", "{median:.3f}"))
                row(f"{name} added {q} ms", spread(f"added_{key}_{q}_ms", "{median:+.3f} [{min:+.2f}..{max:+.2f}]"))
    for title, key in (("CPU s per GB", "cpu_s_per_gb"), ("  of it user space", "user_cpu_s_per_gb"),
                       ("fleet CPU s per minute", "fleet_cpu_s_per_min"), ("fleet CPU s per GB", "fleet_cpu_s_per_gb"),
                       ("fleet RSS MiB", "fleet_rss_mib"), ("fleet carried / due", "fleet_carried"),
                       ("fleet consumed / acked", "fleet_consumed"), ("fleet errors", "fleet_errors")):
        if shown(key):
            row(title, spread(key, "{median:.0f} [{min:.0f}-{max:.0f}]" if key == "fleet_errors" else
                              "{median:.1f} [{min:.1f}-{max:.1f}]" if key in ("fleet_rss_mib", "fleet_cpu_s_per_min")
                              else "{median:.2f} [{min:.2f}-{max:.2f}]"))
    row("RSS fresh MiB", lambda s: f"{s['rss_fresh_bytes'] / 2**20:.1f}" if "rss_fresh_bytes" in s else "-")
    if any("rss_per_idle_connection_bytes" in s for s in results["paths"].values()):
        row("RSS/idle conn KiB", lambda s: f"{s['rss_per_idle_connection_bytes'] / 1024:.1f}"
            if "rss_per_idle_connection_bytes" in s else "-")
    row("RSS after MiB", lambda s: f"{s['rss_after_bytes'] / 2**20:.1f}" if "rss_after_bytes" in s else "-")
    suspects = {x: s["rounds"]["suspect_bypass"] for x, s in results["paths"].items()
                if s["rounds"].get("suspect_bypass")}
    if suspects:
        print(f"WARNING: phases where the proxy used almost no CPU (bytes went around it?): {suspects}")
    saturated = {x: [c if c is None else round(c, 2) for c in s["rounds"]["fleet_carried"]]
                 for x, s in results["paths"].items()
                 if any(c is not None and c < FLEET_SATURATED_BELOW for c in s["rounds"].get("fleet_carried", ()))}
    failed = {x: s["rounds"]["fleet_failed"] for x, s in results["paths"].items() if s["rounds"].get("fleet_failed")}
    if failed:
        print(f"WARNING: fleet rounds lost: {failed}")
    if saturated:
        print(f"WARNING: fleet rounds that carried under {FLEET_SATURATED_BELOW:.0%} of the due records "
              f"(latency is a queue's there): {saturated}")
    for name, why in results["skipped"].items():
        print(f"skipped {name}: {why}")


HIGHER, LOWER = 1, -1


class Goal(NamedTuple):
    """One goal of the speed issues (#12, restated against the floor in #29), one row."""

    title: str
    key: str                            # the summary's figure (medians compared)
    direction: int                      # HIGHER or LOWER is ahead
    bound: float | None = None          # an absolute bound
    peers: bool = True                  # ahead of every peer too
    floor_margin: float | None = None   # within this of the bare relay's figure
    floor_factor: float | None = None   # at most this multiple of the bare relay's figure
    judged: bool = True                 # False: shown beside the peers, no goal


# Kroxylicious's connections live in a JVM heap already resident: its RSS per idle
# connection is no comparable figure (the table gives none), so it is left out there.
NOT_COMPARED = {"rss_per_idle_connection_kib": ("kroxylicious",)}
GOALS = (
    Goal("produce 1 KiB / direct", "produce_1k_ratio", HIGHER, 0.90),
    Goal("consume 1 KiB / direct", "consume_1k_ratio", HIGHER, floor_margin=0.05),
    Goal("produce 100 B / direct", "produce_100_ratio", HIGHER),
    Goal("consume 100 B / direct", "consume_100_ratio", HIGHER),
    Goal("produce 1 MiB / direct", "produce_1m_ratio", HIGHER, peers=False, floor_margin=0.05),
    Goal("consume 1 MiB / direct", "consume_1m_ratio", HIGHER, peers=False, floor_margin=0.05),
    Goal("added p50 ms", "added_latency_p50_ms", LOWER, peers=False, floor_factor=1.6),
    Goal("added p99 ms", "added_latency_p99_ms", LOWER, 0.5),
    Goal("CPU s per GB", "cpu_s_per_gb", LOWER),
    Goal("user CPU s per GB", "user_cpu_s_per_gb", LOWER, peers=False, floor_factor=1.6),
    Goal("RSS fresh MiB", "rss_fresh_mib", LOWER, 50),
    Goal("RSS per idle conn KiB", "rss_per_idle_connection_kib", LOWER, 16),
    Goal("fleet added p99 ms", "added_fleet_p99_ms", LOWER),
    Goal("fleet CPU s per minute", "fleet_cpu_s_per_min", LOWER),
    Goal("fleet RSS MiB", "fleet_rss_mib", LOWER, judged=False),
)
PEER_PREFIXES = ("kafka-proxy", "kroxylicious")
FLOOR_LABELS = ("bare", "splice")


def _figure(stats: dict, key: str) -> float | None:
    """A path's median of a row (None where the row does not apply to it)."""
    if key == "rss_fresh_mib":
        return stats["rss_fresh_bytes"] / 2**20 if "rss_fresh_bytes" in stats else None
    if key == "rss_per_idle_connection_kib":
        value = stats.get("rss_per_idle_connection_bytes")
        return value / 1024 if value is not None else None
    summary = stats.get("summary", {}).get(key)
    return summary["median"] if summary is not None else None


def _per_round(paths: dict, label: str, key: str) -> list[float] | None:
    """A row's figure of each round for one path (None for rows measured once); the paths of
    a round ran back to back, so a round's figures are a pair."""
    if key.endswith("_ratio"):          # same round, same direct: the MB/s compare as the ratios
        return paths[label]["rounds"].get(key.removesuffix("_ratio") + "_mb_s")
    if key.startswith("added_"):
        mine, direct = paths[label]["rounds"].get(key.removeprefix("added_")), \
            paths["direct"]["rounds"].get(key.removeprefix("added_"))
        return [None if a is None or b is None else a - b for a, b in zip(mine, direct)] if mine and direct else None
    return paths[label]["rounds"].get(key)


def _rounds_ahead(paths: dict, key: str, direction: int, peer: str) -> str:
    """In how many rounds kproxy was ahead of ``peer`` on a row ("" for rows measured once)."""
    mine, theirs = _per_round(paths, "kproxy", key), _per_round(paths, peer, key)
    if not mine or not theirs:
        return ""
    pairs = _pairs(mine, theirs)
    return f" [{sum(direction * (a - b) > 0 for a, b in pairs)}/{len(pairs)}]"


def _floor_bound(goal: Goal, bare: float) -> float:
    """What the bare relay's figure makes of a goal stated against it."""
    if goal.floor_margin is not None:
        return bare - goal.direction * goal.floor_margin
    return bare * goal.floor_factor


def _rounds_within_floor(paths: dict, goal: Goal) -> str:
    if goal.key.endswith("_ratio"):     # ratios to direct: each round's own direct
        direct = paths["direct"]["rounds"].get(goal.key.removesuffix("_ratio") + "_mb_s")
        mine, bare = (_per_round(paths, x, goal.key) for x in ("kproxy", "bare"))
        if not (mine and bare and direct):
            return ""
        mine, bare = [a / d for a, d in zip(mine, direct)], [b / d for b, d in zip(bare, direct)]   # MB/s: none lost
    else:
        mine, bare = (_per_round(paths, x, goal.key) for x in ("kproxy", "bare"))
        if not mine or not bare:
            return ""
    pairs = _pairs(mine, bare)
    return f" [{sum(goal.direction * (a - _floor_bound(goal, b)) >= 0 for a, b in pairs)}/{len(pairs)}]"


def print_goals(results: dict) -> None:
    """kproxy against each goal, beside the peers and the floor (the best of the Kafka-blind
    relays in this run): a goal the floor misses too is out of any relay's reach here.
    Goals stated against the bare relay ("within 0.05 of it", "at most 1.6 times it") are
    judged against its figure in the same run, with the rounds in which kproxy met it."""
    paths = results["paths"]
    if "kproxy" not in paths:
        return
    peers = [label for label in paths if label.startswith(PEER_PREFIXES)]
    floor = [label for label in paths if label in FLOOR_LABELS]
    print("the speed goals (#12, #29) in this run: kproxy, the peers (medians; [k/n]: kproxy ahead of that "
          "peer in k of n rounds), the floor (best Kafka-blind relay; for goals against the bare relay, "
          "[k/n]: rounds kproxy met it)")
    for goal in GOALS:
        mine = _figure(paths["kproxy"], goal.key)
        if mine is None:
            continue
        direction, bound = goal.direction, goal.bound
        compared = [p for p in peers if p not in NOT_COMPARED.get(goal.key, ()) and _figure(paths[p], goal.key) is not None]
        theirs = [_figure(paths[p], goal.key) for p in compared]
        floors = [v for v in (_figure(paths[f], goal.key) for f in floor) if v is not None]
        bare = _figure(paths["bare"], goal.key) if "bare" in paths else None
        against_bare = goal.floor_margin is not None or goal.floor_factor is not None
        if against_bare and bare is not None:
            bound = _floor_bound(goal, bare)

        def reaches(value: float) -> bool:
            ahead = not goal.peers or all(direction * (value - other) > 0 for other in theirs)
            return ahead and (bound is None or direction * (value - bound) >= 0)

        best_floor = max(floors, key=lambda v: direction * v) if floors else None
        if not goal.judged:
            verdict = "(shown, no goal)"
        elif against_bare and bare is None:
            verdict = "not judged (no bare relay in this run)"
        elif goal.peers and not compared and bound is None:
            verdict = "not judged (no peer in this run)"
        else:
            verdict = "met" if reaches(mine) else "NOT met"
            if verdict != "met" and best_floor is not None and not reaches(best_floor):
                verdict += " (out of the floor's reach too)"
        sign = ">=" if direction == HIGHER else "<="
        if goal.floor_margin is not None:
            target = f"within {goal.floor_margin:g} of bare"
        elif goal.floor_factor is not None:
            target = f"{sign} {goal.floor_factor:g} x bare"
        else:
            target = f"{sign} {bound:g}" if bound is not None else ""
        if goal.peers and goal.judged:
            target += (", " if target else "") + "ahead of every peer"
        if not goal.judged:
            target = "beside the peers"
        floor_text = ""
        if best_floor is not None:
            floor_text = f"   floor {best_floor:.3f}"
            if against_bare and bare is not None:
                floor_text += f" (bare {bare:.3f}: bound {bound:.3f}{_rounds_within_floor(paths, goal)})"
        print(f"  {goal.title:24} {target:44} kproxy {mine:7.3f}   peers "
              + " ".join(f"{v:.3f}{_rounds_ahead(paths, goal.key, direction, p)}" for p, v in zip(compared, theirs))
              + floor_text + f"   {verdict}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer records and rounds (~3 min)")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--records-1k", type=int)
    parser.add_argument("--records-100", type=int)
    parser.add_argument("--records-1m", type=int, help="1 MiB records per large-record phase")
    parser.add_argument("--latency-sends", type=int)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma-separated, of {', '.join(SCENARIOS)} (default: all)")
    parser.add_argument("--fleet-connections", type=int, help="producer connections of the fleet")
    parser.add_argument("--fleet-consumers", type=int, help="consumer connections of the fleet (one partition each)")
    parser.add_argument("--fleet-rate", type=float, help="records per second per producer connection")
    parser.add_argument("--fleet-batch", type=int, help="records per Produce request (rate / batch: requests/s)")
    parser.add_argument("--fleet-seconds", type=float, help="how long the fleet sends")
    parser.add_argument("--peers", default=str(DEFAULT_PEERS), help="folder of prebuilt peers")
    parser.add_argument("--kproxy-tree", action="append", default=[], metavar="NAME=PATH",
                        help="also run kproxy from another checkout (e.g. main=/work/main)")
    parser.add_argument("--no-floor", dest="floor", action="store_false",
                        help="leave out the Kafka-blind relays (bare, splice)")
    parser.add_argument("--json", metavar="FILE", help="write all figures here as JSON")
    args = parser.parse_args()
    defaults = QUICK if args.quick else FULL
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.scenarios = set(args.scenarios.split(","))
    if args.scenarios - set(SCENARIOS):
        parser.error(f"unknown scenarios: {', '.join(sorted(args.scenarios - set(SCENARIOS)))}")
    results = run(args)
    if args.json:                       # the rounds first: kept even if summarizing fails
        Path(args.json).write_text(json.dumps(results, indent=2))
    summarize(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print_table(results)
    print_goals(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
