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

    python benchmarks/bench_peers.py --quick              # ~3 min
    python benchmarks/bench_peers.py --rounds 7 --json out.json
    python benchmarks/bench_peers.py --kproxy-tree main=/work/main   # old vs new relay
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_proxy import ProxyProcess, consume, produce, stop_process  # noqa: E402
from kproxy.embedded import recv_exactly  # noqa: E402
from kproxy.embedded._support import free_port, free_ports  # noqa: E402

HERE = Path(__file__).resolve().parent
DEFAULT_PEERS = HERE.parent.parent / "shared" / "peers"
# Records per throughput phase (MB = records x size). Full: ~100 MB per 1 KiB phase.
FULL = {"records_1k": 100_000, "records_100": 400_000, "latency_sends": 2_000, "rounds": 5}
QUICK = {"records_1k": 40_000, "records_100": 150_000, "latency_sends": 500, "rounds": 3}
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
        self.proxy = ProxyProcess(upstream)
        if tree is not None:
            self.proxy.argv[1] = str(tree / "benchmarks" / "_kproxy_process.py")
            self.proxy.env = {**self.proxy.env, "PYTHONPATH": str(tree)}
        self.bootstrap = self.proxy.bootstrap

    def __enter__(self):
        self.proxy.__enter__()
        self.pid = self.proxy.process.pid
        return self

    def __exit__(self, *exc):
        self.proxy.__exit__()


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

    # Their fresh RSS is a Python relay's floor; per connection they keep read buffers
    # sized for throughput (1 MiB a side in the bare relay): no floor, not measured.
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


def create_topics(bootstrap: str, names: list[str]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(n, 1, 1) for n in names]).values():
        future.result(60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        meta = admin.list_topics(timeout=10).topics
        if all(n in meta and meta[n].partitions and meta[n].partitions[0].leader >= 0 for n in names):
            break
        time.sleep(0.2)
    time.sleep(TOPIC_SETTLE_S)


# ------------------------------------------------------------------ the run

PHASES = ("produce_1k", "consume_1k", "produce_100", "consume_100")


def run(args) -> dict:
    from kproxy.embedded.kafka import KafkaCluster

    sizes = {"1k": (1024, args.records_1k), "100": (100, args.records_100)}
    results: dict = {"rounds": args.rounds, "records_1k": args.records_1k,
                     "records_100": args.records_100, "latency_sends": args.latency_sends,
                     "skipped": {}, "paths": {}}
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
                  for label in labels for r in range(args.rounds) for size in (*sizes, "lat")}
        create_topics(upstream, list(topics.values()))
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
                        if path.idle_connections_measured:
                            stats["rss_per_idle_connection_bytes"] = idle_connection_rss(path)
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
    summarize(results)
    return results


def run_round(path, r: int, rounds: dict, sizes: dict, topics: dict, args) -> None:
    """One path's round: the throughput phases, then the latency sends."""
    print(f"round {r + 1}/{args.rounds}: {path.label}", file=sys.stderr)
    cpu = 0.0
    moved_mb = 0.0
    user_before = user_system_seconds(path.pid)[0] if path.pid else 0.0
    for phase in PHASES:
        op, size_key = phase.split("_")
        size, records = sizes[size_key]
        topic = topics[(path.label, r, size_key)]
        before = path.cpu_seconds() if path.pid else 0.0
        if op == "produce":
            seconds = produce(path.bootstrap, topic, records, size)
        else:
            seconds = consume(path.bootstrap, topic, records)
        mb = records * size / 1e6
        rounds.setdefault(f"{phase}_mb_s", []).append(mb / seconds)
        if path.pid:
            used = path.cpu_seconds() - before
            cpu += used
            moved_mb += mb
            if used < BYPASS_CPU_S_PER_MB * mb:
                rounds.setdefault("suspect_bypass", []).append(phase)
    if path.pid:
        rounds.setdefault("cpu_s_per_gb", []).append(cpu / moved_mb * 1000)
        user = user_system_seconds(path.pid)[0] - user_before
        rounds.setdefault("user_cpu_s_per_gb", []).append(user / moved_mb * 1000)
    times = latency(path.bootstrap, topics[(path.label, r, "lat")], args.latency_sends)
    rounds.setdefault("latency_p50_ms", []).append(percentile(times, 0.50) * 1000)
    rounds.setdefault("latency_p99_ms", []).append(percentile(times, 0.99) * 1000)


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(results: dict) -> None:
    """Paired ratios to direct (throughput) and added latency, per round; median and min-max."""
    direct = results["paths"]["direct"]["rounds"]
    for label, stats in results["paths"].items():
        rounds = stats["rounds"]
        summary = stats["summary"] = {}
        for phase in PHASES:
            key = f"{phase}_mb_s"
            summary[f"{phase}_mb_s"] = _spread(rounds[key])
            summary[f"{phase}_ratio"] = _spread([a / b for a, b in zip(rounds[key], direct[key])])
        for q in ("p50", "p99"):
            key = f"latency_{q}_ms"
            summary[key] = _spread(rounds[key])
            summary[f"added_{key}"] = _spread([a - b for a, b in zip(rounds[key], direct[key])])
        for key in ("cpu_s_per_gb", "user_cpu_s_per_gb"):
            if key in rounds:
                summary[key] = _spread(rounds[key])


def print_table(results: dict) -> None:
    labels = list(results["paths"])
    width = max(14, *(len(x) + 2 for x in labels))
    print(f"1 Apache Kafka node, confluent-kafka, {results['rounds']} interleaved rounds (order "
          f"rotating); ratios to direct in the same round: median [min-max]")
    print(f"{'':26}" + "".join(f"{x:>{width + 8}}" for x in labels))

    def row(title, fn):
        print(f"{title:26}" + "".join(f"{fn(results['paths'][x]):>{width + 8}}" for x in labels))

    def ratio(key):
        return lambda s: "{median:.2f} [{min:.2f}-{max:.2f}]".format(**s["summary"][key])

    for phase in PHASES:
        row(f"{phase} ratio", ratio(f"{phase}_ratio"))
    for phase in PHASES:
        row(f"{phase} MB/s (median)", lambda s, p=phase: f"{s['summary'][f'{p}_mb_s']['median']:.1f}")
    for q in ("p50", "p99"):
        row(f"latency {q} ms", lambda s, q=q: "{median:.3f}".format(**s["summary"][f"latency_{q}_ms"]))
        row(f"added {q} ms", lambda s, q=q: "{median:+.3f} [{min:+.2f}..{max:+.2f}]".format(
            **s["summary"][f"added_latency_{q}_ms"]))
    for title, key in (("CPU s per GB", "cpu_s_per_gb"), ("  of it user space", "user_cpu_s_per_gb")):
        row(title, lambda s, key=key: "{median:.2f} [{min:.2f}-{max:.2f}]".format(**s["summary"][key])
            if key in s["summary"] else "-")
    row("RSS fresh MiB", lambda s: f"{s['rss_fresh_bytes'] / 2**20:.1f}" if "rss_fresh_bytes" in s else "-")
    row("RSS/idle conn KiB", lambda s: f"{s['rss_per_idle_connection_bytes'] / 1024:.1f}"
        if "rss_per_idle_connection_bytes" in s else "-")
    row("RSS after MiB", lambda s: f"{s['rss_after_bytes'] / 2**20:.1f}" if "rss_after_bytes" in s else "-")
    suspects = {x: s["rounds"]["suspect_bypass"] for x, s in results["paths"].items()
                if s["rounds"].get("suspect_bypass")}
    if suspects:
        print(f"WARNING: phases where the proxy used almost no CPU (bytes went around it?): {suspects}")
    for name, why in results["skipped"].items():
        print(f"skipped {name}: {why}")


# The speed issue's goals (#12), one per row: (row, figure, direction, bound). Every goal
# asks kproxy to be ahead of each peer too; ``direction`` says which way is ahead.
# Kroxylicious's connections live in a JVM heap already resident: its RSS per idle
# connection is no comparable figure (the table gives none), so it is left out there.
HIGHER, LOWER = 1, -1
NOT_COMPARED = {"rss_per_idle_connection_kib": ("kroxylicious",)}
GOALS = (
    ("produce 1 KiB / direct", "produce_1k_ratio", HIGHER, 0.90),
    ("consume 1 KiB / direct", "consume_1k_ratio", HIGHER, 0.90),
    ("produce 100 B / direct", "produce_100_ratio", HIGHER, 0.95),
    ("consume 100 B / direct", "consume_100_ratio", HIGHER, 0.95),
    ("added p50 ms", "added_latency_p50_ms", LOWER, None),
    ("added p99 ms", "added_latency_p99_ms", LOWER, 0.5),
    ("CPU s per GB", "cpu_s_per_gb", LOWER, None),
    ("RSS fresh MiB", "rss_fresh_mib", LOWER, 50),
    ("RSS per idle conn KiB", "rss_per_idle_connection_kib", LOWER, 16),
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


def _rounds_ahead(paths: dict, key: str, direction: int, peer: str) -> str:
    """In how many rounds kproxy was ahead of ``peer`` on a row ("" for rows measured once):
    the paths of a round ran back to back, so a round's figures are a pair."""
    per_round = key.removeprefix("added_")
    if key.endswith("_ratio"):          # same round, same direct: the MB/s compare as the ratios
        per_round = key.removesuffix("_ratio") + "_mb_s"
    mine, theirs = paths["kproxy"]["rounds"].get(per_round), paths[peer]["rounds"].get(per_round)
    if not mine or not theirs:
        return ""
    ahead = sum(direction * (a - b) > 0 for a, b in zip(mine, theirs))
    return f" [{ahead}/{min(len(mine), len(theirs))}]"


def print_goals(results: dict) -> None:
    """kproxy against each goal, beside the peers and the floor (the best of the Kafka-blind
    relays in this run): a goal the floor misses too is out of any relay's reach here."""
    paths = results["paths"]
    if "kproxy" not in paths:
        return
    peers = [label for label in paths if label.startswith(PEER_PREFIXES)]
    floor = [label for label in paths if label in FLOOR_LABELS]
    print("the speed goals (#12) in this run: kproxy, the peers (medians; [k/n]: kproxy ahead of that "
          "peer in k of n rounds), the floor (best Kafka-blind relay)")
    for title, key, direction, bound in GOALS:
        mine = _figure(paths["kproxy"], key)
        compared = [p for p in peers if p not in NOT_COMPARED.get(key, ()) and _figure(paths[p], key) is not None]
        theirs = [_figure(paths[p], key) for p in compared]
        floors = [v for v in (_figure(paths[f], key) for f in floor) if v is not None]
        if mine is None:
            continue

        def reaches(value: float) -> bool:
            ahead = all(direction * (value - other) > 0 for other in theirs)
            return ahead and (bound is None or direction * (value - bound) >= 0)

        best_floor = max(floors, key=lambda v: direction * v) if floors else None
        verdict = "met" if reaches(mine) else "NOT met"
        if verdict != "met" and best_floor is not None and not reaches(best_floor):
            verdict += " (out of the floor's reach too)"
        target = (f"{'>=' if direction == HIGHER else '<='} {bound:g}, " if bound is not None else "") + \
            f"{'above' if direction == HIGHER else 'below'} every peer"
        print(f"  {title:24} {target:32} kproxy {mine:7.3f}   peers "
              + " ".join(f"{v:.3f}{_rounds_ahead(paths, key, direction, p)}" for p, v in zip(compared, theirs))
              + (f"   floor {best_floor:.3f}" if best_floor is not None else "") + f"   {verdict}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer records and rounds (~3 min)")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--records-1k", type=int)
    parser.add_argument("--records-100", type=int)
    parser.add_argument("--latency-sends", type=int)
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
    results = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print_table(results)
    print_goals(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
