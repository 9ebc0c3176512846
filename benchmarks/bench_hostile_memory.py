#!/usr/bin/env python3
"""What hostile connections cost a ``kproxy run`` process, in front of a real broker.

Two probes, each against every tree given (``--kproxy-tree NAME=PATH``, this tree
always), one ``kproxy run`` process per tree and probe, one embedded Kafka for all:

- ``partial``: ``--connections`` clients connect, then each sends the first
  ``--held-bytes`` of a Produce frame that claims ``--frame-bytes`` and nothing more.
  Figure: kproxy's RSS growth (/proc VmRSS) per connection, against the bytes held.
- ``pipeline``: ``--pipeliners`` clients send ApiVersions v0 requests as fast as they
  can and never read an answer, for ``--seconds``; beside them a canary client sends
  one ApiVersions at a time (``CANARY_INTERVAL_S`` apart) and a scraper reads
  ``/metrics`` (``SCRAPE_INTERVAL_S`` apart). Figures: RSS growth, requests in flight
  at close (kproxy's close log lines), RSS per request in flight, the canary's
  round trips (p50, p99, max, failures), the slowest scrape; beside them the same canary
  straight to the broker (what the flood costs the broker itself, not kproxy).

    python benchmarks/bench_hostile_memory.py --kproxy-tree base=/tmp/base-mem
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import struct
import sys
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))
from tests.kproxy_process import KproxyProcess  # noqa: E402

START_TIMEOUT_S = 60.0
SETTLE_S = 2.0                 # RSS must stay put this long to count as settled
SETTLE_TIMEOUT_S = 60.0
CANARY_INTERVAL_S = 0.02       # an ordinary client's pace: a request every 20 ms
CANARY_TIMEOUT_S = 10.0        # a canary request not answered in this long has failed
SCRAPE_INTERVAL_S = 0.5
# Issue #24's goal beside 10 pipelining clients: what they add to an ordinary client's p99
# (over its own idle p50), its failures, the slowest /metrics scrape.
GOAL_ADDED_P99_MS = 50.0
GOAL_FAILURES = 0
GOAL_SCRAPE_S = 1.0
API_VERSIONS = 18
PRODUCE = 0


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def api_versions_v0(correlation_id: int) -> bytes:
    client_id = b"hostile"
    body = struct.pack(">hhih", API_VERSIONS, 0, correlation_id, len(client_id)) + client_id
    return struct.pack(">i", len(body)) + body


def produce_start(frame_bytes: int, held: int) -> bytes:
    """The first ``held`` bytes of a Produce v9 frame whose size prefix claims ``frame_bytes``."""
    client_id = b"hostile"
    header = struct.pack(">hhih", PRODUCE, 9, 1, len(client_id)) + client_id
    body = header + b"\x00\x00\x00\x01\x00\x00\x03\xe8"          # tx id null-ish, acks=1, timeout
    frame = struct.pack(">i", frame_bytes - 4) + body
    return (frame + b"r" * held)[:held]


class Kproxy(KproxyProcess):
    """``kproxy run`` of ``tree`` (``KPROXY_ENTRY``: how to start it, default ``-m kproxy``),
    serving once entered; its log in ``log_path``."""

    def __init__(self, tree: Path, upstream: str, log_path: Path):
        super().__init__(log_path.parent, name=log_path.stem, tree=tree, upstream=upstream,
                         entry=tuple(os.environ.get("KPROXY_ENTRY", "-m kproxy").split()))
        self.upstream = upstream

    def __enter__(self) -> "Kproxy":
        super().__enter__()
        time.sleep(1.0)
        return self

    @property
    def listen(self) -> int:
        return self.listen_port

    @property
    def admin(self) -> int:
        return int(self.admin_url.rpartition(":")[2])

    def rss(self) -> int:
        return rss(self.pid)

    def settled_rss(self) -> int:
        """RSS once it has stopped growing (kproxy has read what was sent)."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        last, since = self.rss(), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.25)
            now = self.rss()
            if abs(now - last) > 256 * 1024:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= SETTLE_S:
                break
        return max(last, self.rss())

    def close(self) -> str:
        """Stop it; its whole log."""
        self.stop()
        return self.log_text()


def probe_partial(kproxy: Kproxy, args) -> dict:
    before = kproxy.rss()
    clients = [socket.create_connection(("127.0.0.1", kproxy.listen)) for _ in range(args.connections)]
    try:
        time.sleep(1.0)                          # every connection linked to the broker
        linked = kproxy.settled_rss()
        part = produce_start(args.frame_bytes, args.held_bytes)
        for client in clients:
            client.sendall(part)
        peak = kproxy.settled_rss()
    finally:
        for client in clients:
            client.close()
    return {"rss_before_mib": before / 2**20, "rss_linked_mib": linked / 2**20,
            "rss_held_mib": peak / 2**20,
            "per_connection_kib": (peak - before) / args.connections / 1024,
            "per_connection_partial_kib": (peak - linked) / args.connections / 1024,
            "held_kib": args.held_bytes / 1024}


def pipeliner(port: int, stop: threading.Event, sent: list) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(0.2)
    batch = b"".join(api_versions_v0(i) for i in range(100))
    try:
        while not stop.is_set():
            try:
                sock.sendall(batch)
                sent[0] += 100
            except socket.timeout:
                continue
            except OSError:
                break
        stop.wait()
    finally:
        sock.close()


def canary(port: int, stop: threading.Event, times: list, failures: list, host: str = "127.0.0.1") -> None:
    sock = None
    correlation_id = 0
    while not stop.is_set():
        try:
            if sock is None:
                sock = socket.create_connection((host, port), timeout=CANARY_TIMEOUT_S)
            correlation_id += 1
            started = time.monotonic()
            sock.sendall(api_versions_v0(correlation_id))
            size, = struct.unpack(">i", _recv(sock, 4))
            answer = _recv(sock, size)
            got, error = struct.unpack_from(">ih", answer)
            if got != correlation_id or error != 0:
                raise RuntimeError(f"answer {got} error {error}")
            times.append(time.monotonic() - started)
        except Exception as exc:                 # noqa: BLE001 - counted, the probe goes on
            failures.append(repr(exc))
            if sock is not None:
                sock.close()
            sock = None
        time.sleep(CANARY_INTERVAL_S)
    if sock is not None:
        sock.close()


def _recv(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionError("closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def scraper(admin: int, stop: threading.Event, times: list) -> None:
    while not stop.is_set():
        started = time.monotonic()
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=30).read()
            times.append(time.monotonic() - started)
        except OSError:
            times.append(float("inf"))
        time.sleep(SCRAPE_INTERVAL_S)


def probe_pipeline(kproxy: Kproxy, args) -> dict:
    stop = threading.Event()
    canary_times: list[float] = []
    failures: list[str] = []
    scrapes: list[float] = []
    baseline: list[float] = []
    quiet = threading.Event()
    threading.Thread(target=canary, args=(kproxy.listen, quiet, baseline, failures), daemon=True).start()
    time.sleep(3.0)
    quiet.set()
    before = kproxy.rss()
    sent = [[0] for _ in range(args.pipeliners)]
    threads = [threading.Thread(target=pipeliner, args=(kproxy.listen, stop, sent[i]), daemon=True)
               for i in range(args.pipeliners)]
    # The same canary straight to the broker: what the flood costs the broker itself.
    direct: list[float] = []
    broker_host, broker_port = kproxy.upstream.split(",")[0].rsplit(":", 1)
    threads.append(threading.Thread(target=canary, args=(int(broker_port), stop, direct, [], broker_host),
                                    daemon=True))
    threads.append(threading.Thread(target=canary, args=(kproxy.listen, stop, canary_times, failures),
                                    daemon=True))
    threads.append(threading.Thread(target=scraper, args=(kproxy.admin, stop, scrapes), daemon=True))
    for thread in threads:
        thread.start()
    time.sleep(args.seconds)
    peak = kproxy.rss()
    stop.set()
    for thread in threads:
        thread.join(30)
    log = kproxy.close()
    in_flight = [int(m) for m in re.findall(r"reason=.* in_flight=(\d+)", log)]
    held = sum(sorted(in_flight)[-args.pipeliners:])
    ordered = sorted(canary_times)

    def pct(values, q):
        return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")
    base_p50 = statistics.median(baseline) if baseline else float("nan")
    return {"rss_before_mib": before / 2**20, "rss_peak_mib": peak / 2**20,
            "rss_per_pipeliner_mib": (peak - before) / args.pipeliners / 2**20,
            "in_flight_at_close_max": max(in_flight, default=0),
            "bytes_per_in_flight": (peak - before) / max(held, 1),
            "requests_sent": sum(s[0] for s in sent),
            "canary_requests": len(canary_times), "canary_failures": len(failures),
            "canary_idle_p50_ms": base_p50 * 1000,
            "canary_p50_ms": pct(ordered, 0.5) * 1000, "canary_p99_ms": pct(ordered, 0.99) * 1000,
            "canary_added_p99_ms": (pct(ordered, 0.99) - base_p50) * 1000,
            "direct_p50_ms": pct(sorted(direct), 0.5) * 1000, "direct_p99_ms": pct(sorted(direct), 0.99) * 1000,
            "canary_max_ms": (ordered[-1] if ordered else float("nan")) * 1000,
            "scrape_max_s": max(scrapes, default=float("nan")), "scrapes": len(scrapes),
            "failures": failures[:3]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kproxy-tree", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--probe", choices=("partial", "pipeline", "both"), default="both")
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--held-bytes", type=int, default=64 * 1024)
    parser.add_argument("--frame-bytes", type=int, default=128 * 1024)
    parser.add_argument("--pipeliners", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--bootstrap", help="an existing broker (else an embedded one starts)")
    parser.add_argument("--logs", default="/tmp", help="where kproxy's logs go")
    args = parser.parse_args()
    trees = {"this": HERE, **{n: Path(p) for n, p in (t.split("=", 1) for t in args.kproxy_tree)}}
    import contextlib
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap
        if bootstrap is None:
            from kproxy.embedded import KAFKA_4_VERSION, KafkaCluster
            bootstrap = stack.enter_context(KafkaCluster(version=KAFKA_4_VERSION)).bootstrap_servers
        probes = ("partial", "pipeline") if args.probe == "both" else (args.probe,)
        for probe in probes:
            for name, tree in trees.items():
                kproxy = Kproxy(tree, bootstrap, Path(args.logs) / f"kproxy-{probe}-{name}.log").__enter__()
                try:
                    result = probe_partial(kproxy, args) if probe == "partial" else probe_pipeline(kproxy, args)
                finally:
                    if kproxy.process.poll() is None:
                        kproxy.close()
                print(probe, name, " ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                                           for k, v in result.items()), flush=True)
                if probe == "pipeline":
                    met = (result["canary_added_p99_ms"] <= GOAL_ADDED_P99_MS
                           and result["canary_failures"] <= GOAL_FAILURES
                           and result["scrape_max_s"] <= GOAL_SCRAPE_S)
                    print(f"  goal ({args.pipeliners} pipeliners): added p99 <= {GOAL_ADDED_P99_MS:g} ms "
                          f"(measured {result['canary_added_p99_ms']:.1f}), failures <= {GOAL_FAILURES} "
                          f"({result['canary_failures']}), slowest scrape <= {GOAL_SCRAPE_S:g} s "
                          f"({result['scrape_max_s']:.2f}): {'met' if met else 'NOT met'}; "
                          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
