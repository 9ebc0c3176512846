#!/usr/bin/env python3
"""kproxy's RSS before, at the peak of and after a burst of partial frames (issue 10, item 7).

A burst: many clients each send part of a request and stop (``--half-frames``
connections with half of a ``--frame-bytes`` frame each: below the streaming
threshold, so kproxy holds them), then all close. kproxy runs in its own
process (``kproxy run``) in front of an upstream that reads and discards (no
broker needed: nothing is ever answered); its RSS is read from /proc before
the burst, at its peak, and ``--settle`` seconds after the clients closed.

Every variant runs in the same invocation, one after the other:

- this tree, as ``kproxy run`` starts it;
- each ``--kproxy-tree NAME=PATH`` (e.g. the commit before the change);
- ``--glibc-trim-threshold``: a tree run with glibc's own trim threshold (128 KiB)
  instead of kproxy's 128 MiB (the mmap threshold as kproxy sets it), the
  other way of getting memory back that was considered.

    python benchmarks/bench_memory_return.py --kproxy-tree before=/work/wt-stream-base
    python benchmarks/bench_memory_return.py --half-frames 500 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))
from kproxy.embedded._support import free_port  # noqa: E402

DEFAULT_HALF_FRAMES = 2000
DEFAULT_FRAME_BYTES = 256 * 1024      # a Produce of ordinary size: held whole, never streamed
DEFAULT_SETTLE_S = 10.0               # how long after the burst closed RSS is read again
PEAK_WAIT_S = 30.0                    # most the burst may take to be read by kproxy
START_TIMEOUT_S = 30.0
GLIBC_TRIM_THRESHOLD = 128 * 1024     # glibc's own M_TRIM_THRESHOLD default
KPROXY_MMAP_THRESHOLD = 32 * 1024 * 1024


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


class DiscardUpstream:
    """A TCP server that reads everything and answers nothing, on its own thread."""

    def __init__(self):
        self.port = free_port()
        self.received = 0
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        class Discard(asyncio.Protocol):
            def data_received(protocol, data):
                self.received += len(data)

        async def serve():
            await self.loop.create_server(Discard, "127.0.0.1", self.port, backlog=4096)
            ready.set()

        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(serve(), self.loop)
        ready.wait(10)

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)


def produce_frame(size: int) -> bytes:
    """A Produce v9 (acks=1) of ``size`` bytes, its tail record-like filler."""
    head = struct.pack(">hhih", 0, 9, 1, 5) + b"bench" + b"\x00\x00" + struct.pack(">h", 1) \
        + struct.pack(">i", 1000) + b"\x01\x00"
    return struct.pack(">i", size) + head + b"r" * (size - len(head))


def run_variant(name: str, tree: Path, upstream: DiscardUpstream, args, env_extra: dict) -> dict:
    listen, admin = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(tree), **env_extra}
    proc = subprocess.Popen([sys.executable, "-m", "kproxy", "run", "--upstream",
                             f"127.0.0.1:{upstream.port}", "--listen", f"127.0.0.1:{listen}",
                             "--admin-listen", f"127.0.0.1:{admin}", "--broker-port-base", "0",
                             "--log-level", "WARNING"], cwd=str(tree), env=env)
    clients: list[socket.socket] = []
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{admin}/healthz", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"{name}: kproxy did not start")
                time.sleep(0.1)
        time.sleep(1.0)
        before = rss(proc.pid)
        frame = produce_frame(args.frame_bytes)
        part = frame[:len(frame) // 2]
        start = upstream.received
        for _ in range(args.half_frames):
            client = socket.create_connection(("127.0.0.1", listen))
            client.sendall(part)
            clients.append(client)
        expected = start + len(part) * args.half_frames
        deadline = time.monotonic() + PEAK_WAIT_S
        peak = rss(proc.pid)
        while upstream.received < expected and time.monotonic() < deadline:
            time.sleep(0.2)
            peak = max(peak, rss(proc.pid))
        time.sleep(1.0)
        peak = max(peak, rss(proc.pid))
        for client in clients:
            client.close()
        clients = []
        samples = []
        closed = time.monotonic()
        while time.monotonic() - closed < args.settle:
            time.sleep(0.5)
            samples.append((round(time.monotonic() - closed, 1), rss(proc.pid)))
        after = samples[-1][1]
        return {"variant": name, "before_mib": before / 2**20, "peak_mib": peak / 2**20,
                "after_mib": after / 2**20, "returned": (peak - after) / max(peak - before, 1),
                "per_connection_kib": (peak - before) / args.half_frames / 1024,
                "after_1s_mib": next((r for t, r in samples if t >= 1.0), after) / 2**20}
    finally:
        for client in clients:
            client.close()
        proc.terminate()
        proc.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--half-frames", type=int, default=DEFAULT_HALF_FRAMES)
    parser.add_argument("--frame-bytes", type=int, default=DEFAULT_FRAME_BYTES)
    parser.add_argument("--settle", type=float, default=DEFAULT_SETTLE_S)
    parser.add_argument("--kproxy-tree", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--glibc-trim-threshold", metavar="NAME", action="append", default=[],
                        help="also run this variant (this tree or a --kproxy-tree name) with "
                             "glibc's 128 KiB trim threshold")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    trees = {"this": HERE, **{n: Path(p) for n, p in (t.split("=", 1) for t in args.kproxy_tree)}}
    variants = [(name, tree, {}) for name, tree in trees.items()]
    for name in args.glibc_trim_threshold:
        variants.append((f"{name}, glibc trim threshold", trees[name], {
            "MALLOC_MMAP_THRESHOLD_": str(KPROXY_MMAP_THRESHOLD),
            "MALLOC_TRIM_THRESHOLD_": str(GLIBC_TRIM_THRESHOLD)}))
    upstream = DiscardUpstream()
    results = []
    try:
        for name, tree, env in variants:
            print(f"{name} ...", flush=True)
            results.append(run_variant(name, tree, upstream, args, env))
    finally:
        upstream.close()
    print(f"\n{args.half_frames} connections, each half of a {args.frame_bytes // 1024} KiB frame; "
          f"RSS read {args.settle:g} s after they closed")
    print(f"{'variant':36} {'before':>8} {'peak':>8} {'after 1s':>9} {'after':>8} {'returned':>9}")
    for r in results:
        print(f"{r['variant']:36} {r['before_mib']:7.0f}M {r['peak_mib']:7.0f}M "
              f"{r['after_1s_mib']:8.0f}M {r['after_mib']:7.0f}M {r['returned']:8.0%}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
