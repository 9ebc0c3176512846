#!/usr/bin/env python3
"""What the metrics observer costs per request/response pair, beside the tracker alone.

The proxy's per-pair work is: the tracker frames and pairs (always), then the
metrics observer decodes both frames and updates its series. This measures
both on the same in-memory stream of typical traffic, no sockets, then the
observer alone on frames decoded beforehand (its series updates and batch-header
walks), and what a scrape of a fresh, a typical and an every-API registry weighs
and costs to render.

    python benchmarks/bench_metrics.py [--pairs 20000] [--json]
    python benchmarks/bench_metrics.py --compare /work/main [--rounds 5]

``--compare TREE`` runs the same measurements on kproxy from TREE (before) and
from this tree (after), alternately in child processes, and prints them side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def _tree_from_argv() -> str:
    """``--tree PATH`` picks the kproxy to import (before argparse: imports come first)."""
    argv = sys.argv
    return argv[argv.index("--tree") + 1] if "--tree" in argv[:-1] else str(HERE)


sys.path.insert(0, _tree_from_argv())

from prometheus_client import generate_latest  # noqa: E402

from kproxy.observers.metrics import Metrics  # noqa: E402
from kproxy.protocol import (Request, Response, Struct, encode_request, encode_response, new_body,  # noqa: E402
                             schema)
from kproxy.protocol.connection import Connection, ResponseReceived  # noqa: E402
from kproxy.protocol.records import Record, build_batch  # noqa: E402


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def traffic(pairs: int) -> tuple[bytes, bytes]:
    """A client stream and a broker stream: Produce, Fetch and Heartbeat pairs in turn
    (the Fetch names 4 partitions, as a consumer does, and is answered with records)."""
    batch = build_batch([Record(i, 1_700_000_000_000, b"k", b"v" * 200, ()) for i in range(20)], "lz4")
    kinds = [  # one in KINDS is a Fetch
        (0, 9, dict(acks=-1, timeout_ms=30000, topic_data=[Struct(name="orders", partition_data=[
            Struct(index=p, records=batch) for p in range(2)])]),
         dict(responses=[Struct(name="orders", partition_responses=[
             Struct(index=p, error_code=0, base_offset=100, log_append_time_ms=-1, log_start_offset=0,
                    record_errors=[], error_message=None) for p in range(2)])])),
        (1, 12, dict(session_epoch=-1, topics=[Struct(topic="orders", partitions=[
            Struct(partition=p, fetch_offset=980) for p in range(4)])]),
         dict(responses=[Struct(topic="orders", partitions=[
             Struct(partition_index=p, high_watermark=1000, records=batch) for p in range(4)])])),
        (12, 4, dict(group_id="g", generation_id=3, member_id="m"), dict()),
    ]
    client, broker = bytearray(), bytearray()
    for i in range(pairs):
        api_key, version, req, resp = kinds[i % len(kinds)]
        client += framed(encode_request(Request(api_key, version, i, "bench",
                                                new_body("request", api_key, version, **req))))
        broker += framed(encode_response(Response(i, new_body("response", api_key, version, **resp)),
                                         api_key, version))
    return bytes(client), bytes(broker)


KINDS = 3          # Produce, Fetch, Heartbeat
TYPICAL_PAIRS = 300    # the traffic before the "typical" scrape (series, not values, matter)
CHUNK = 64 * 1024


def run(client: bytes, broker: bytes, observer) -> float:
    conn = Connection()
    start = time.perf_counter()
    for stream, feed in ((client, conn.receive_client), (broker, conn.relay_broker)):
        for pos in range(0, len(stream), CHUNK):
            result = feed(stream[pos:pos + CHUNK])
            events = result[0] if isinstance(result, tuple) else result
            if observer is not None and events:
                observer(None, events)
    return time.perf_counter() - start


def lag_alone(client: bytes, broker: bytes, repeat: int) -> float:
    """Seconds per Fetch pair of the consumer-lag step alone, on frames decoded beforehand:
    the difference of two whole runs drowns in noise on a shared machine; this does not."""
    conn = Connection()
    conn.receive_client(client)
    fetches = [e for e in conn.receive_broker(broker) if isinstance(e, ResponseReceived) and e.api_key == 1]
    bodies = [(e, e.response.body) for e in fetches if e.request_event.request is not None]
    best = float("inf")
    for _ in range(repeat):
        metrics = Metrics()
        start = time.perf_counter()
        for event, body in bodies:
            metrics._fetch_answered(event, None, body)
        best = min(best, (time.perf_counter() - start) / len(bodies))
    return best


def observer_alone(client: bytes, broker: bytes, repeat: int) -> float:
    """Seconds per pair of the metrics observer on events whose frames were decoded beforehand
    (decoding is cached on the event): its series updates, batch-header and error walks."""
    conn = Connection()
    events = list(conn.receive_client(client))
    events += conn.receive_broker(broker)
    warm = Metrics(consumer_lag=False)
    warm(None, events)                       # decodes every frame once
    best = float("inf")
    for _ in range(repeat):
        metrics = Metrics(consumer_lag=False)
        start = time.perf_counter()
        metrics(None, events)
        best = min(best, time.perf_counter() - start)
    return best / (len(events) / 2)


def every_api_requested(metrics) -> None:
    """One header-only request of every API kproxy knows (the bodies do not decode): each API's
    series then exist, as after a client that used them all."""
    for api_key in sorted(schema.API_NAMES):
        try:
            events = Connection().receive_client(framed(struct.pack(">hhih", api_key, 0, 1, 0)))
        except Exception:        # the tracker refuses what the broker could not parse (Produce)
            continue
        metrics(None, events)


def scrape(metrics, repeat: int) -> dict:
    """Series and bytes of one /metrics exposition, and the best time to render it."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        text = generate_latest(metrics.registry)
        best = min(best, time.perf_counter() - start)
    series = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
    return {"series": series, "bytes": len(text), "render_ms": best * 1e3}


def measure(args) -> dict:
    client, broker = traffic(args.pairs)
    tracker = min(run(client, broker, None) for _ in range(args.repeat))
    # Alternated, so both see the same machine load.
    without_lag, metrics = [], []
    for _ in range(args.repeat):
        without_lag.append(run(client, broker, Metrics(consumer_lag=False)))
        metrics.append(run(client, broker, Metrics()))
    without_lag, metrics = min(without_lag), min(metrics)
    per_pair = lambda t: t / args.pairs * 1e6  # noqa: E731
    result = {"pairs": args.pairs, "tracker_us_per_pair": per_pair(tracker),
              "tracker_and_metrics_us_per_pair": per_pair(metrics),
              "metrics_us_per_pair": per_pair(metrics - tracker),
              "metrics_without_lag_us_per_pair": per_pair(without_lag - tracker),
              "observer_on_decoded_frames_us_per_pair": observer_alone(client, broker, args.repeat) * 1e6,
              "consumer_lag_us_per_fetch_pair": per_pair(metrics - without_lag) * KINDS,
              "consumer_lag_alone_us_per_fetch_pair": lag_alone(client, broker, args.repeat) * 1e6}
    fresh, typical, every_api = Metrics(), Metrics(), Metrics()
    run(*traffic(TYPICAL_PAIRS), typical)
    every_api_requested(every_api)
    for name, registry in (("fresh", fresh), ("typical", typical), ("every_api", every_api)):
        for key, figure in scrape(registry, args.repeat).items():
            result[f"scrape_{name}_{key}"] = figure
    return result


# Figures of a side-by-side run: (key, label, unit); best (lowest) of the rounds for timings.
COMPARED = (
    ("tracker_us_per_pair", "tracker only (framing, pairing)", "us/pair"),
    ("metrics_us_per_pair", "metrics' own cost (decode + series)", "us/pair"),
    ("observer_on_decoded_frames_us_per_pair", "observer on decoded frames (series, batch walks)", "us/pair"),
    ("scrape_fresh_series", "fresh scrape: series", ""),
    ("scrape_fresh_bytes", "fresh scrape: bytes", ""),
    ("scrape_fresh_render_ms", "fresh scrape: render", "ms"),
    ("scrape_typical_series", "after Produce/Fetch/Heartbeat traffic: series", ""),
    ("scrape_typical_bytes", "after Produce/Fetch/Heartbeat traffic: bytes", ""),
    ("scrape_typical_render_ms", "after Produce/Fetch/Heartbeat traffic: render", "ms"),
    ("scrape_every_api_series", "after every API once: series", ""),
    ("scrape_every_api_bytes", "after every API once: bytes", ""),
    ("scrape_every_api_render_ms", "after every API once: render", "ms"),
)


def compare(args) -> int:
    """Before (``--compare`` tree) and after (this tree), alternately, best of the rounds."""
    trees = {"before": args.compare, "after": str(HERE)}
    runs: dict[str, list[dict]] = {side: [] for side in trees}
    loads = [os.getloadavg()[0]]
    for round_number in range(args.rounds):
        order = list(trees) if round_number % 2 == 0 else list(trees)[::-1]
        for side in order:
            command = [sys.executable, __file__, "--tree", trees[side], "--json",
                       "--pairs", str(args.pairs), "--repeat", str(args.repeat)]
            env = {**os.environ, "PYTHONPATH": trees[side]}
            out = subprocess.run(command, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
            runs[side].append(json.loads(out))
        loads.append(os.getloadavg()[0])
    best = {side: {key: min(run[key] for run in results) for key in results[0]}
            for side, results in runs.items()}
    if args.json:
        print(json.dumps({"trees": trees, "rounds": args.rounds, "load_average_1m": loads,
                          "best": best, "runs": runs}, indent=2))
        return 0
    print(f"{args.pairs} pairs, best of {args.rounds} rounds x {args.repeat}; before = {trees['before']}, "
          f"after = {trees['after']}; 1-minute load average {min(loads):.1f}-{max(loads):.1f} "
          f"on {os.cpu_count()} cores")
    print(f"{'':52} {'before':>10} {'after':>10}")
    for key, label, unit in COMPARED:
        before, after = best["before"].get(key), best["after"].get(key)
        shown = [f"{v:10.1f}" if isinstance(v, float) else f"{v:10}" for v in (before, after)]
        print(f"{label:52} {shown[0]} {shown[1]} {unit}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--tree", help="import kproxy from this checkout (default: this one)")
    parser.add_argument("--compare", metavar="TREE", help="before/after: kproxy of TREE beside this one")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds of --compare")
    args = parser.parse_args()
    if args.compare:
        return compare(args)
    result = measure(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.pairs} request/response pairs (Produce v9, Fetch v12 of 4 partitions with records, Heartbeat v4), "
          f"best of {args.repeat}")
    print(f"tracker only (framing, pairing)          {result['tracker_us_per_pair']:7.1f} us/pair")
    print(f"tracker + metrics (decode + series)      {result['tracker_and_metrics_us_per_pair']:7.1f} us/pair")
    print(f"metrics' own cost                        {result['metrics_us_per_pair']:7.1f} us/pair")
    print(f"  of which consumer lag                  {result['consumer_lag_us_per_fetch_pair']:7.1f} us "
          f"per Fetch pair (4 partitions; metrics without it: "
          f"{result['metrics_without_lag_us_per_pair']:.1f} us/pair)")
    print(f"observer on decoded frames               {result['observer_on_decoded_frames_us_per_pair']:7.1f} "
          f"us/pair (series updates, batch-header walks)")
    for name in ("fresh", "typical", "every_api"):
        print(f"scrape {name:10} {result[f'scrape_{name}_series']:6} series "
              f"{result[f'scrape_{name}_bytes']:8} bytes, render {result[f'scrape_{name}_render_ms']:6.1f} ms")
    print(f"  consumer lag step alone                {result['consumer_lag_alone_us_per_fetch_pair']:7.1f} us "
          f"per Fetch pair (decoded beforehand)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
