#!/usr/bin/env python3
"""Health-check latency during a scrape storm and during pipelining: admin port beside probe port.

kproxy runs in its own process (``kproxy run``) in front of a real Kafka 4.4
broker, with its admin listener and its probe port (``--probe-listen``; answered
by a process of its own since the probe board, by a thread before). Two
probers send ``GET /healthz`` on a fresh connection every ``PROBE_INTERVAL_S``,
one to each port, at the same time, and record the round trips, in three phases:

- quiet: no other load;
- storm: waves of ``--scrapes`` concurrent ``GET /metrics`` on the admin port;
- pipelining: ``PIPELINERS`` clients each send ``PIPELINE_BYTES`` of ApiVersions v0
  requests on a connection without reading an answer, and when kproxy stops
  reading them (its in-flight cap) hang up and start again (issue 10's attack).

The loads run in child processes, so the probers' own event loop is not the one
that is busy. A third prober, at the same time, asks a bare HTTP responder in a
process of its own ("control"): what a probe costs on this machine under the
same load, whatever answers it. ``--src DIR`` adds another source tree's kproxy (e.g. a ``git
worktree`` of an older commit), probed on its admin port (and its probe port if
it has one).

    python benchmarks/bench_admin.py [--scrapes 1000] [--seconds 10] [--src DIR ...] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks.bench_proxy import stop_process  # noqa: E402
from kproxy.embedded._support import free_port  # noqa: E402

PROBE_INTERVAL_S = 0.05
PROBE_TIMEOUT_S = 30.0
START_TIMEOUT_S = 30.0
LOAD_START_S = 0.5                 # a load runs this long before probing starts
PIPELINERS = 2                     # as in issue 10
PIPELINE_BYTES = 512 * 1024        # per connection, as in issue 10 (0.5 MiB)
PIPELINE_STALL_S = 0.5             # a send blocked this long: kproxy stopped reading; reconnect


class Kproxy:
    def __init__(self, src: Path, upstream: str):
        self.admin_port = free_port()
        self.listen_port = free_port()
        self.probe_port = free_port() if (src / "kproxy" / "proxy" / "probes.py").exists() else None
        self.argv = [sys.executable, "-m", "kproxy", "run", "--upstream", upstream,
                     "--listen", f"127.0.0.1:{self.listen_port}", "--admin-listen", f"127.0.0.1:{self.admin_port}",
                     "--broker-port-base", str(free_port()), "--log-level", "WARNING"]
        if self.probe_port is not None:
            self.argv += ["--probe-listen", f"127.0.0.1:{self.probe_port}"]
        self.env = {**os.environ, "PYTHONPATH": str(src)}
        self.src = src

    @property
    def ports(self) -> dict[str, int]:
        ports = {"admin": self.admin_port}
        if self.probe_port is not None:
            ports["probe"] = self.probe_port
        return ports

    def __enter__(self):
        self.process = subprocess.Popen(self.argv, env=self.env, cwd=self.src)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                for port in self.ports.values():
                    socket.create_connection(("127.0.0.1", port), 1).close()
                return self
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("kproxy did not start")

    def helpers(self) -> dict[int, int]:
        """kproxy's child processes (the probe process, if it has one): pid -> resident KiB."""
        found = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if int(fields["PPid"]) == self.process.pid:
                found[int(pid)] = int(fields.get("VmRSS", "0 kB").split()[0])
        return found

    def __exit__(self, *exc):
        stop_process(self.process)


async def get(port: int, path: str) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        await reader.read()              # the whole answer, as a scraper reads it
        return status
    finally:
        writer.close()


async def probe(port: int, seconds: float) -> list[float]:
    """Round trips of /healthz in ms (a timeout or an error counts as PROBE_TIMEOUT_S)."""
    rtts = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        try:
            status = await asyncio.wait_for(get(port, "/healthz"), PROBE_TIMEOUT_S)
            rtts.append((time.perf_counter() - start) * 1000 if status == 200 else PROBE_TIMEOUT_S * 1000)
        except (OSError, asyncio.TimeoutError, ValueError, IndexError):
            rtts.append(PROBE_TIMEOUT_S * 1000)
        await asyncio.sleep(PROBE_INTERVAL_S)
    return rtts


def control_server(port: int, ready) -> None:
    """A bare asyncio HTTP responder in a process of its own: what any probe round trip
    costs on this machine under the same load (the floor kproxy's probe port can reach)."""
    async def answer(reader, writer):
        try:
            while (await reader.readline()) not in (b"\r\n", b""):
                pass
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n")
            await writer.drain()
        finally:
            writer.close()

    async def serve():
        server = await asyncio.start_server(answer, "127.0.0.1", port, backlog=1024)
        ready.set()
        async with server:
            await server.serve_forever()
    asyncio.run(serve())


# ---------------------------------------------------------------- loads (child processes)

def storm_load(port: int, scrapes: int, stop, counts) -> None:
    """Waves of ``scrapes`` concurrent /metrics scrapes until ``stop`` is set."""
    statuses: list[int] = []

    async def one():
        try:
            statuses.append(await get(port, "/metrics"))
        except (OSError, ValueError, IndexError):
            statuses.append(0)

    async def waves():
        while not stop.is_set():
            await asyncio.gather(*(one() for _ in range(scrapes)))
    asyncio.run(waves())
    counts["scrapes_200"] = statuses.count(200)
    counts["scrapes_503"] = statuses.count(503)
    counts["scrapes_failed"] = len(statuses) - statuses.count(200) - statuses.count(503)


def pipeline_load(port: int, stop, counts) -> None:
    """PIPELINERS threads, each sending ApiVersions v0 without reading, reconnecting
    whenever kproxy stops reading it, until ``stop`` is set."""
    import threading
    from kproxy.protocol import Request, encode_request, new_body

    def frame(correlation_id: int) -> bytes:
        body = encode_request(Request(18, 0, correlation_id, "bench-pipeline", new_body("request", 18, 0)))
        return len(body).to_bytes(4, "big") + body

    one = len(frame(0))
    burst = b"".join(frame(i) for i in range(PIPELINE_BYTES // one))
    connections, whole = [0] * PIPELINERS, [0] * PIPELINERS

    def client(index: int) -> None:
        while not stop.is_set():
            sock = socket.create_connection(("127.0.0.1", port))
            sock.settimeout(PIPELINE_STALL_S)
            connections[index] += 1
            try:
                sock.sendall(burst)
                whole[index] += 1
            except OSError:              # timed out: kproxy stopped reading (its in-flight cap)
                pass
            finally:
                sock.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(PIPELINERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    counts["pipeline_connections"] = sum(connections)
    counts["pipeline_bursts_sent_whole"] = sum(whole)
    counts["requests_per_burst"] = len(burst) // one


async def phase(ports: dict[str, int], seconds: float, load=None, args=()) -> dict:
    """Probe every port at once for ``seconds`` while ``load`` runs in a child process."""
    context = multiprocessing.get_context("spawn")
    manager = context.Manager() if load else None
    child = None
    counts = {}
    if load is not None:
        stop, shared = manager.Event(), manager.dict()
        child = context.Process(target=load, args=(*args, stop, shared))
        child.start()
        await asyncio.sleep(LOAD_START_S)
    try:
        rtts = await asyncio.gather(*(probe(port, seconds) for port in ports.values()))
    finally:
        if child is not None:
            stop.set()
            await asyncio.to_thread(child.join, 120)
            counts = dict(shared)
            manager.shutdown()
    return {"probes": {name: summary(r) for name, r in zip(ports, rtts)}, **counts}


def summary(rtts: list[float]) -> dict:
    ordered = sorted(rtts)
    return {"p50_ms": statistics.median(ordered),
            "p99_ms": ordered[max(0, int(len(ordered) * 0.99) - 1)],
            "max_ms": ordered[-1], "probes": len(ordered)}


async def measure(kproxy: Kproxy, control_port: int, scrapes: int, seconds: float) -> dict:
    ports = {**kproxy.ports, "control": control_port}
    return {
        "quiet": await phase(ports, seconds / 2),
        "storm": await phase(ports, seconds, storm_load, (kproxy.admin_port, scrapes)),
        "pipelining": await phase(ports, seconds, pipeline_load, (kproxy.listen_port,)),
    }


class Control:
    """``control_server`` in a child process, for the duration of a ``with``."""

    def __enter__(self):
        context = multiprocessing.get_context("spawn")
        self.port = free_port()
        ready = context.Event()
        self.process = context.Process(target=control_server, args=(self.port, ready), daemon=True)
        self.process.start()
        if not ready.wait(START_TIMEOUT_S):
            raise RuntimeError("the control server did not start")
        return self

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.join(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=1000, help="concurrent scrapes per wave")
    parser.add_argument("--seconds", type=float, default=10.0, help="probing time per loaded phase")
    parser.add_argument("--src", action="append", default=[], help="other source trees to compare")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from kproxy.embedded.kafka import KafkaCluster
    results = {}
    with KafkaCluster(1) as cluster, Control() as control:
        for src in [str(REPO)] + args.src:
            with Kproxy(Path(src), cluster.bootstrap_servers) as kproxy:
                results[src] = asyncio.run(measure(kproxy, control.port, args.scrapes, args.seconds))
                results[src]["child_processes_rss_kib"] = kproxy.helpers()
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    loads = {"quiet": "quiet",
             "storm": f"storm: waves of {args.scrapes} /metrics scrapes",
             "pipelining": f"pipelining: {PIPELINERS} clients, ApiVersions v0"}
    print(f"GET /healthz round trips, a fresh connection every {PROBE_INTERVAL_S * 1000:g} ms to each port at once")
    for src, result in results.items():
        print(f"\n{src}")
        print(f"{'load':44}{'port':9}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'probes':>8}")
        for key, label in loads.items():
            for port, s in result[key]["probes"].items():
                print(f"{label:44}{port:9}{s['p50_ms']:>9.1f}{s['p99_ms']:>9.1f}{s['max_ms']:>9.1f}{s['probes']:>8}")
        storm = result["storm"]
        print(f"storm: scrapes answered 200/503/failed {storm.get('scrapes_200')}/{storm.get('scrapes_503')}/"
              f"{storm.get('scrapes_failed')}")
        helpers = result["child_processes_rss_kib"]
        print("kproxy's child processes: " + (", ".join(f"pid {pid} {kib / 1024:.1f} MiB resident"
                                                      for pid, kib in helpers.items()) or "none"))
        pipe = result["pipelining"]
        print(f"pipelining: {pipe.get('pipeline_connections')} connections, each offered "
              f"{pipe.get('requests_per_burst')} requests ({PIPELINE_BYTES // 1024} KiB); "
              f"{pipe.get('pipeline_bursts_sent_whole')} were read whole by kproxy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
