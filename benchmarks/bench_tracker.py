#!/usr/bin/env python3
"""The connection tracker on its own (framing and pairing, no sockets): µs per frame.

The tracker is on the relay's hot path; this times it apart from the network and the
broker, so a change to it can be compared side by side with another checkout:

    python benchmarks/bench_tracker.py
    python benchmarks/bench_tracker.py --kproxy-tree before=/work/other-checkout

On a loaded machine even CPU time varies by tens of percent between runs; machine
instructions do not. ``--only CASE --runs K`` runs one case K times and nothing else,
for an instruction count (K runs minus 0 runs, per frame)::

    valgrind --tool=cachegrind --cache-sim=no python benchmarks/bench_tracker.py \
        --only "answers 1 KiB, 64 per 64 KiB read" --runs 100

Each case feeds one connection's bytes in reads of a realistic size, timeit-style
(best of ``--repeat`` runs of at least ``--min-time`` seconds each), in CPU time
of the process (on a shared machine, wall time mostly measures waiting for a core).
Trees run in turns in their own processes, so both see the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import time
import timeit
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
KIB, MIB = 1024, 1024 * 1024


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def produce(correlation_id: int, size: int) -> bytes:
    """A Produce v9 (acks=1) of ``size`` bytes; its tail stands for the records."""
    head = struct.pack(">hhih", 0, 9, correlation_id, 5) + b"bench\x00\x00" + struct.pack(">hi", 1, 1000) + b"\x01\x00"
    return framed(head + b"r" * (size - 4 - len(head)))


def response(correlation_id: int, size: int) -> bytes:
    return framed(struct.pack(">i", correlation_id) + b"f" * (size - 8))


def reads(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


def cases():
    """name -> (frames per run, a function doing one run)."""
    from kproxy.protocol.connection import Connection
    stream = {}
    try:
        from kproxy.protocol.connection import STREAM_FRAME_BYTES
        stream = {"stream_frame_bytes": STREAM_FRAME_BYTES}
    except ImportError:                       # a checkout from before streaming
        pass

    def client_case(frames: list[bytes], read_size: int):
        chunks = reads(b"".join(frames), read_size)

        def run():
            conn = Connection(**stream)
            for chunk in chunks:
                conn.receive_client(chunk)
        return len(frames), run

    def broker_case(count: int, size: int, read_size: int):
        requests = b"".join(framed(struct.pack(">hhih", 18, 3, i, 0) + b"\x00\x00\x00") for i in range(count))
        chunks = reads(b"".join(response(i, size) for i in range(count)), read_size)

        def run():
            conn = Connection(**stream)
            conn.receive_client(requests)
            for chunk in chunks:
                conn.relay_broker(chunk)
        return count, run

    return {
        "produce 1 KiB, 64 per 64 KiB read": client_case([produce(i, KIB) for i in range(64)], 64 * KIB),
        "produce 1 MiB, 64 KiB reads": client_case([produce(i, MIB) for i in range(4)], 64 * KIB),
        "produce 32 MiB, 256 KiB reads": client_case([produce(1, 32 * MIB)], 256 * KIB),
        "answers 1 KiB, 64 per 64 KiB read": broker_case(64, KIB, 64 * KIB),
        "answers 4 MiB, 256 KiB reads": broker_case(2, 4 * MIB, 256 * KIB),
        "answers 32 MiB, 256 KiB reads": broker_case(1, 32 * MIB, 256 * KIB),
    }


def measure(repeat: int, min_time: float) -> dict:
    try:                                      # as kproxy run starts: frame buffers from the heap
        from kproxy.allocator import tune_allocator
    except ImportError:
        from kproxy.runtime import tune_allocator
    tune_allocator()
    out = {}
    for name, (frames, run) in cases().items():
        timer = timeit.Timer(run, timer=time.process_time)
        loops, _ = timer.autorange()
        loops = max(1, int(loops * min_time / 0.2))
        best = min(timer.repeat(repeat, loops)) / loops
        out[name] = best / frames * 1e6
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kproxy-tree", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=0.2)
    parser.add_argument("--turns", type=int, default=3, help="alternating turns per tree; best counts")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)   # one tree, JSON out
    parser.add_argument("--only", metavar="CASE", help="run this case --runs times, untimed")
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()
    if args.only:
        frames, run = cases()[args.only]
        for _ in range(args.runs):
            run()
        return 0
    if args.measure:
        print(json.dumps(measure(args.repeat, args.min_time)))
        return 0
    trees = {"this": HERE, **{n: Path(p) for n, p in (t.split("=", 1) for t in args.kproxy_tree)}}
    best: dict[str, dict[str, float]] = {name: {} for name in trees}
    for _ in range(args.turns):
        for name, tree in trees.items():
            env = {**os.environ, "PYTHONPATH": str(tree)}
            text = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--measure",
                                   "--repeat", str(args.repeat), "--min-time", str(args.min_time)],
                                  cwd=str(tree), env=env, capture_output=True, text=True, check=True).stdout
            for case, us in json.loads(text).items():
                best[name][case] = min(us, best[name].get(case, us))
    names = list(trees)
    print(f"{'µs per frame (best)':40}" + "".join(f"{n:>12}" for n in names))
    for case in best[names[0]]:
        print(f"{case:40}" + "".join(f"{best[n][case]:12.2f}" for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
