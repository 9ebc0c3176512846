#!/usr/bin/env python3
"""Health-check latency on the admin listener while a scrape storm hits /metrics.

kproxy runs in its own process (``kproxy run``, no broker needed: /healthz and
/metrics answer without one). A prober sends ``GET /healthz`` on a fresh
connection every ``PROBE_INTERVAL_S`` and records the round trip, first with
no other load, then while waves of ``--scrapes`` concurrent ``GET /metrics``
hit the same port. ``--src DIR`` runs another source tree's kproxy (e.g. a
``git worktree`` of an older commit) for a before/after in one run.

    python benchmarks/bench_admin.py [--scrapes 1000] [--seconds 10] [--src DIR ...] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks.bench_proxy import free_port, stop_process  # noqa: E402

PROBE_INTERVAL_S = 0.05
PROBE_TIMEOUT_S = 30.0
START_TIMEOUT_S = 30.0


class Kproxy:
    def __init__(self, src: Path):
        self.admin_port = free_port()
        self.argv = [sys.executable, "-m", "kproxy", "run", "--upstream", "127.0.0.1:1",
                     "--listen", f"127.0.0.1:{free_port()}", "--admin-listen", f"127.0.0.1:{self.admin_port}",
                     "--broker-port-base", str(free_port()), "--log-level", "WARNING"]
        self.env = {**os.environ, "PYTHONPATH": str(src)}
        self.src = src

    def __enter__(self):
        self.process = subprocess.Popen(self.argv, env=self.env, cwd=self.src)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.admin_port), 1).close()
                return self
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("kproxy did not start")

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
    """Round trips of /healthz in ms (a timeout counts as PROBE_TIMEOUT_S)."""
    rtts = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        try:
            await asyncio.wait_for(get(port, "/healthz"), PROBE_TIMEOUT_S)
            rtts.append((time.perf_counter() - start) * 1000)
        except (OSError, asyncio.TimeoutError, ValueError, IndexError):
            rtts.append(PROBE_TIMEOUT_S * 1000)
        await asyncio.sleep(PROBE_INTERVAL_S)
    return rtts


async def storm(port: int, scrapes: int, stop: asyncio.Event, statuses: list) -> None:
    async def one():
        try:
            statuses.append(await get(port, "/metrics"))
        except (OSError, ValueError, IndexError):
            statuses.append(0)
    while not stop.is_set():
        await asyncio.gather(*(one() for _ in range(scrapes)))


async def measure(port: int, scrapes: int, seconds: float) -> dict:
    quiet = await probe(port, seconds / 2)
    stop, statuses = asyncio.Event(), []
    stormer = asyncio.create_task(storm(port, scrapes, stop, statuses))
    await asyncio.sleep(0.5)
    loaded = await probe(port, seconds)
    stop.set()
    await stormer
    summary = lambda rtts: {"p50_ms": statistics.median(rtts),  # noqa: E731
                            "p99_ms": sorted(rtts)[int(len(rtts) * 0.99) - 1 if len(rtts) > 1 else 0],
                            "max_ms": max(rtts), "probes": len(rtts)}
    return {"quiet": summary(quiet), "storm": summary(loaded), "scrapes_answered": len(statuses),
            "scrapes_200": statuses.count(200), "scrapes_503": statuses.count(503)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=1000, help="concurrent scrapes per wave")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--src", action="append", default=[], help="other source trees to compare")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {}
    for src in [str(REPO)] + args.src:
        with Kproxy(Path(src)) as kproxy:
            results[src] = asyncio.run(measure(kproxy.admin_port, args.scrapes, args.seconds))
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"/healthz round trips, one probe every {PROBE_INTERVAL_S * 1000:g} ms; storm: waves of "
          f"{args.scrapes} concurrent /metrics scrapes")
    print(f"{'source':40}{'quiet p50/p99 ms':>20}{'storm p50/p99/max ms':>26}{'scrapes 200/503':>18}")
    for src, r in results.items():
        q, s = r["quiet"], r["storm"]
        print(f"{src[-40:]:40}{q['p50_ms']:>9.1f} /{q['p99_ms']:>7.1f}   "
              f"{s['p50_ms']:>8.1f} /{s['p99_ms']:>7.1f} /{s['max_ms']:>7.0f}"
              f"{r['scrapes_200']:>10}/{r['scrapes_503']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
