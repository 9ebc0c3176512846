#!/usr/bin/env python3
"""Proxy throughput: produce and consume directly vs through kproxy, in the same run.

kproxy, the broker and the client share one machine (2 cores here), so
absolute MB/s say more about the machine than about kproxy; the ratio
(through kproxy / direct, measured back to back) is the figure to track.

    python benchmarks/bench_proxy.py                  # Apache Kafka 4.4.0 (default)
    python benchmarks/bench_proxy.py --broker tansu   # Tansu (its in-memory engine stalled
                                                      # consumers at ~15k records here)
    python benchmarks/bench_proxy.py --records 200000 --size 1024 --json
    python benchmarks/bench_proxy.py --workers        # kproxy run --workers 2 vs 1 worker,
                                                      # 4 parallel client processes
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from kproxy.embedded._support import free_port  # noqa: E402
from tests.kproxy_process import KproxyProcess  # noqa: E402

DEFAULT_RECORDS = 100_000
DEFAULT_SIZE = 1024
CONSUME_TIMEOUT_S = 120.0
CONSUME_BATCH = 10_000
# Capture runs over a simulated slow disk (see _kproxy_process.py): each write sleeps
# this long first, so the writer manages ~50 writes/s, far below the traffic.
SLOW_DISK_DELAY_S = 0.02


def stop_process(process: subprocess.Popen) -> None:
    """SIGTERM (a clean shutdown), then SIGKILL if it has not exited after STOP_GRACE_S."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# A proxy or peer given SIGTERM drains its connections first; one still running after
# this is hung, and is killed so a benchmark run never leaves it behind.
STOP_GRACE_S = 30.0
LAUNCHER = Path("benchmarks") / "_kproxy_process.py"     # in the tree under test


def kproxy_process(upstream: str, slow_disk_s: float = 0.0, without_live_view: bool = False,
                   workers: int = 1, node_ids: tuple[int, ...] = (), tree: Path = REPO) -> KproxyProcess:
    """kproxy (``tree``'s) in its own process, as it runs in production, through the
    benchmarks' launcher (``_kproxy_process.py``: a slow disk, no live view).

    Not a thread of this process: the client's Python loop (confluent-kafka's
    ``consume`` builds a Python object per message) would share kproxy's GIL and
    the figures would measure that contention, which no deployment has.
    Capture is controlled over the admin listener, as an operator would (``capture``),
    under the system's temporary directory.
    """
    entry = [str(tree / LAUNCHER)]
    if slow_disk_s:
        entry += ["--slow-disk-ms", str(slow_disk_s * 1000)]
    if without_live_view:
        entry += ["--without-live-view"]
    settings: dict = {}
    if workers > 1:           # every worker binds the same ports: they must be given
        settings = {"workers": workers, "broker_port_rule": "map",
                    "broker_port_map": {node: free_port() for node in node_ids}}
    return KproxyProcess(entry=tuple(entry), tree=tree, admin_token=secrets.token_hex(24),
                         upstream=upstream, capture_root=tempfile.gettempdir(), **settings)


def capture(proxy: KproxyProcess, action: str, body: dict | None = None) -> dict:
    """POST /capture/<action>: its JSON answer."""
    status, reply = proxy.call(f"/capture/{action}", body or {})
    if status != 200:
        raise RuntimeError(f"capture {action}: HTTP {status}: {reply.decode(errors='replace')}")
    return json.loads(reply)


def produce(bootstrap: str, topic: str, records: int, size: int, before_start=None,
            settings: dict | None = None) -> float:
    """Seconds to produce ``records`` (acks=all, after a warm-up send that connects).
    ``before_start()``, if given, runs between the warm-up and the timed part; ``settings``
    override the producer's (e.g. limits for large records)."""
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 1 << 20,
                         "compression.type": "none", "acks": "all", **(settings or {})})
    producer.produce(topic, b"w")
    producer.flush(30)
    payload = b"x" * size
    if before_start is not None:
        before_start()
    start = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, payload)
                break
            except BufferError:
                producer.poll(0.005)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError("produce did not finish")
    return time.perf_counter() - start


def consume(bootstrap: str, topic: str, records: int, before_start=None) -> float:
    """Seconds from the first consumed record to the last (steady state, no connect time).
    ``before_start()``, if given, runs once the consumer is made, before it fetches."""
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "fetch.max.bytes": 52428800,
                         "fetch.queue.backoff.ms": 10, "session.timeout.ms": 6000})
    consumer.assign([TopicPartition(topic, 0, 0)])
    if before_start is not None:
        before_start()
    total = records + 1                       # the warm-up record too
    got = 0
    start = None
    deadline = time.perf_counter() + CONSUME_TIMEOUT_S
    try:
        while got < total and time.perf_counter() < deadline:
            # Never ask for more than remain: consume() waits its full timeout for a count.
            batch = consumer.consume(min(CONSUME_BATCH, total - got), 1.0)
            if batch and start is None:
                start = time.perf_counter()
                first_batch = len(batch)
            got += len(batch)
        elapsed = time.perf_counter() - start if start else 0.0
    finally:
        consumer.close()
    if got < total:
        raise RuntimeError(f"consumed {got} of {total}")
    return elapsed * total / max(total - first_batch, 1)      # scale: the first batch took no time


def run(broker: str, records: int, size: int, rounds: int, capture_dir: str | None = None,
        capture_formats: tuple[str, ...] = ("jsonl",), live_view: bool = False) -> dict:
    if broker == "tansu":
        from kproxy.embedded.tansu import TansuBroker
        cm = TansuBroker()
    else:
        from kproxy.embedded.kafka import KafkaCluster
        cm = KafkaCluster(1)
    mb = records * size / 1e6
    results = {"broker": broker, "records": records, "record_bytes": size, "rounds": rounds}
    labels = ["direct", "kproxy"] + (["capture"] if capture_dir else []) + (["nolive"] if live_view else [])
    with cm as b, contextlib.ExitStack() as stack:
        upstream = b.bootstrap_servers
        # --live-view: a second kproxy without the live page's observer ("nolive"), the
        # "before" of what that observer costs with no page open.
        bare = stack.enter_context(kproxy_process(upstream, without_live_view=True)) if live_view else None
        with kproxy_process(upstream, SLOW_DISK_DELAY_S if capture_dir else 0.0) as proxy:
            # Alternate the paths so JVM warm-up and machine noise hit all of them; report
            # each one's best round.
            for round_no in range(rounds):
                # Rotate the order too: whichever path runs right after two others have
                # written 50 MB each meets a busier broker (GC, log flushes).
                for label in labels[round_no % len(labels):] + labels[:round_no % len(labels)]:
                    bootstrap = (upstream if label == "direct" else
                                 bare.bootstrap if label == "nolive" else proxy.bootstrap)
                    if label == "capture":
                        capture(proxy, "start", {"directory": capture_dir, "formats": list(capture_formats)})
                    topic = f"bench-{label}-{uuid.uuid4().hex[:6]}"
                    for op, seconds in (("produce", produce(bootstrap, topic, records, size)),
                                        ("consume", consume(bootstrap, topic, records))):
                        results.setdefault(f"{label}_{op}_rounds_mb_s", []).append(mb / seconds)
                    if label == "capture":
                        counters = capture(proxy, "stop")["counters"]
                        for name in ("enqueued", "dropped", "rows_written"):   # cumulative
                            results[f"capture_{name}"] = counters[name]
    for label in labels:
        for op in ("produce", "consume"):
            results[f"{label}_{op}_mb_s"] = max(results[f"{label}_{op}_rounds_mb_s"])
    for op in ("produce", "consume"):
        pairs = [("", "kproxy", "direct")] + ([("capture_", "capture", "kproxy")] if capture_dir else []) \
            + ([("live_", "kproxy", "nolive")] if live_view else [])
        for prefix, path, reference in pairs:
            results[f"{prefix}{op}_ratio"] = results[f"{path}_{op}_mb_s"] / results[f"{reference}_{op}_mb_s"]
            # Rounds ran the paths back to back: the median of each round's own ratio is
            # the steadier figure when the machine's speed drifts between rounds.
            results[f"{prefix}{op}_ratio_median"] = statistics.median(
                a / b for a, b in zip(results[f"{path}_{op}_rounds_mb_s"],
                                      results[f"{reference}_{op}_rounds_mb_s"]))
    return results


# --workers: client processes producing (then consuming) at once, each its own topic, so
# that there are enough connections for the kernel to spread over two workers.
DEFAULT_PARALLEL_CLIENTS = 4
# A client process imports confluent-kafka and connects within a second or two.
CLIENT_START_TIMEOUT_S = 60.0


def _timed_client(op: str, bootstrap: str, topic: str, records: int, size: int, barrier, out) -> None:
    """One client process of a parallel round: set up, wait for the others, run, report its window."""
    window = []

    def go():
        barrier.wait(CLIENT_START_TIMEOUT_S)
        window.append(time.perf_counter())      # CLOCK_MONOTONIC: comparable across processes
    if op == "produce":
        produce(bootstrap, topic, records, size, before_start=go)
    else:
        consume(bootstrap, topic, records, before_start=go)
    out.put((window[0], time.perf_counter()))


def parallel(op: str, bootstrap: str, topics: list[str], records: int, size: int) -> float:
    """MB/s of len(topics) clients at once (one process each, ``records`` each): all bytes
    over the time from the first client's start to the last client's end."""
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(len(topics)), ctx.Queue()
    clients = [ctx.Process(target=_timed_client, args=(op, bootstrap, topic, records, size, barrier, out))
               for topic in topics]
    for client in clients:
        client.start()
    windows = [out.get(timeout=CLIENT_START_TIMEOUT_S + CONSUME_TIMEOUT_S) for _ in clients]
    for client in clients:
        client.join()
        if client.exitcode != 0:
            raise RuntimeError(f"a {op} client failed (exit code {client.exitcode})")
    seconds = max(end for _, end in windows) - min(start for start, _ in windows)
    return len(topics) * records * size / 1e6 / seconds


def proxy_cpu_seconds(proxy: KproxyProcess) -> float:
    """CPU seconds of every kproxy process (all workers' ``process_cpu_seconds_total`` summed)."""
    return sum(value for (name, _), value in proxy.metrics().items() if name == "process_cpu_seconds_total")


def connections_per_worker(proxy: KproxyProcess) -> list[float]:
    """Client connections each worker of a ``--workers`` kproxy has accepted so far (from its
    private admin listener, listed by the supervisor's /workers)."""
    return [sum(value for (name, _), value in proxy.metrics(base=f"http://127.0.0.1:{worker['admin_port']}").items()
                if name == "kproxy_connections_opened_total")
            for worker in json.loads(proxy.call("/workers")[1])["workers"]]


def run_workers(records: int, size: int, rounds: int, clients: int, warmup: int = 1) -> dict:
    """Direct, kproxy with 1 worker and with 2, interleaved, ``clients`` parallel clients each;
    the first ``warmup`` rounds (a cold JVM and page cache) are run but not counted."""
    from kproxy.embedded.kafka import KafkaCluster
    labels = ["direct", "w1", "w2"]
    each = records // clients
    mb = each * clients * size / 1e6
    results: dict = {"records": each * clients, "record_bytes": size, "rounds": rounds, "clients": clients}
    with KafkaCluster(1) as cluster, contextlib.ExitStack() as stack:
        upstream = cluster.bootstrap_servers
        node_ids = tuple(node.node_id for node in cluster.nodes)
        proxies = {"w1": stack.enter_context(kproxy_process(upstream)),
                   "w2": stack.enter_context(kproxy_process(upstream, workers=2, node_ids=node_ids))}
        for round_no in range(-warmup, rounds):
            for label in labels[round_no % 3:] + labels[:round_no % 3]:     # the order rotates
                proxy = proxies.get(label)
                bootstrap = proxy.bootstrap if proxy else upstream
                topics = [f"bench-{label}-{uuid.uuid4().hex[:6]}" for _ in range(clients)]
                cpu = proxy_cpu_seconds(proxy) if proxy else 0.0
                for op in ("produce", "consume"):
                    mb_s = parallel(op, bootstrap, topics, each, size)
                    if round_no >= 0:
                        results.setdefault(f"{label}_{op}_rounds_mb_s", []).append(mb_s)
                if proxy and round_no >= 0:
                    results.setdefault(f"{label}_cpu_s_per_gb_rounds", []).append(
                        (proxy_cpu_seconds(proxy) - cpu) / (2 * mb / 1000))
        results["w2_connections_per_worker"] = connections_per_worker(proxies["w2"])
    for op in ("produce", "consume"):
        for path, reference in (("w2", "w1"), ("w1", "direct"), ("w2", "direct")):
            ratios = [a / b for a, b in zip(results[f"{path}_{op}_rounds_mb_s"],
                                            results[f"{reference}_{op}_rounds_mb_s"])]
            results[f"{op}_{path}_vs_{reference}"] = {
                "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
    for label in labels[1:]:
        results[f"{label}_cpu_s_per_gb"] = statistics.median(results[f"{label}_cpu_s_per_gb_rounds"])
    return results


def print_workers(r: dict) -> None:
    print(f"{r['records']} records x {r['record_bytes']} B by {r['clients']} parallel clients "
          f"(one process and one topic each), Apache Kafka, confluent-kafka, {r['rounds']} "
          f"interleaved rounds; ratios are per round (median, min-max)")
    print(f"{'':10}{'direct MB/s':>13}{'1 worker':>10}{'2 workers':>11}{'2w / 1w':>20}"
          f"{'1w / direct':>20}{'2w / direct':>20}")
    for op in ("produce", "consume"):
        med = {k: statistics.median(r[f"{k}_{op}_rounds_mb_s"]) for k in ("direct", "w1", "w2")}
        cells = "".join(f"{x['median']:8.2f} ({x['min']:.2f}-{x['max']:.2f})"
                        for x in (r[f"{op}_w2_vs_w1"], r[f"{op}_w1_vs_direct"], r[f"{op}_w2_vs_direct"]))
        print(f"{op:10}{med['direct']:13.1f}{med['w1']:10.1f}{med['w2']:11.1f}  {cells}")
    print(f"kproxy CPU seconds per GB relayed (median): 1 worker {r['w1_cpu_s_per_gb']:.2f}, "
          f"2 workers {r['w2_cpu_s_per_gb']:.2f}; connections each of the 2 workers accepted: "
          f"{', '.join(f'{n:.0f}' for n in r['w2_connections_per_worker'])}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", choices=("kafka", "tansu"), default="kafka")
    parser.add_argument("--records", type=int, default=DEFAULT_RECORDS)
    parser.add_argument("--size", type=int, default=DEFAULT_SIZE, help="record value bytes")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds; best is reported")
    parser.add_argument("--capture-overload", metavar="FORMATS", nargs="?", const="jsonl",
                        help="also run kproxy with capture on (these formats; default jsonl, the "
                             "capture default) and a writer that cannot keep up")
    parser.add_argument("--live-view", action="store_true",
                        help="also run a kproxy without the live page's observer: its cost with no page open")
    parser.add_argument("--workers", action="store_true",
                        help="compare kproxy run --workers 2 with 1 worker (and direct), parallel clients")
    parser.add_argument("--clients", type=int, default=DEFAULT_PARALLEL_CLIENTS,
                        help="--workers: client processes at once")
    parser.add_argument("--warmup", type=int, default=1, help="--workers: rounds run first, not counted")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.workers:
        r = run_workers(args.records, args.size, args.rounds, args.clients, args.warmup)
        print(json.dumps(r, indent=2)) if args.json else print_workers(r)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        formats = tuple(args.capture_overload.split(",")) if args.capture_overload else ()
        r = run(args.broker, args.records, args.size, args.rounds,
                capture_dir=tmp if formats else None, capture_formats=formats, live_view=args.live_view)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"{args.records} records x {args.size} B, broker {args.broker}, confluent-kafka client, "
          f"best of {args.rounds} alternating rounds")
    print(f"{'':10}{'direct MB/s':>14}{'kproxy MB/s':>14}{'ratio':>8}{'median ratio':>14}")
    for op in ("produce", "consume"):
        print(f"{op:10}{r[f'direct_{op}_mb_s']:14.1f}{r[f'kproxy_{op}_mb_s']:14.1f}{r[f'{op}_ratio']:8.2f}"
              f"{r[f'{op}_ratio_median']:14.2f}")
    if args.live_view:
        print("\nthe live page's observer with no page open (kproxy) vs no such observer (nolive):")
        print(f"{'':10}{'nolive MB/s':>14}{'kproxy MB/s':>14}{'ratio':>8}{'median ratio':>14}")
        for op in ("produce", "consume"):
            print(f"{op:10}{r[f'nolive_{op}_mb_s']:14.1f}{r[f'kproxy_{op}_mb_s']:14.1f}"
                  f"{r[f'live_{op}_ratio']:8.2f}{r[f'live_{op}_ratio_median']:14.2f}")
    if args.capture_overload:
        print(f"\nwith capture on ({args.capture_overload}) and a writer that cannot keep up "
              f"(slow disk, {SLOW_DISK_DELAY_S * 1000:g} ms/write):")
        print(f"{'':10}{'capture MB/s':>14}{'vs capture off':>16}{'median ratio':>14}")
        for op in ("produce", "consume"):
            print(f"{op:10}{r[f'capture_{op}_mb_s']:14.1f}{r[f'capture_{op}_ratio']:16.2f}"
                  f"{r[f'capture_{op}_ratio_median']:14.2f}")
        print(f"capture events enqueued {r['capture_enqueued']}, dropped {r['capture_dropped']}, "
              f"rows written {r['capture_rows_written']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
