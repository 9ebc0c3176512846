#!/usr/bin/env python3
"""What the live page's observer costs per request/response pair: with no page open, and with one.

The relay's per-pair work on the event loop (tracker, then the observers a
``Runtime`` wires: metrics, an idle capture) is measured on the same in-memory
stream of typical traffic as ``bench_metrics.py``, no sockets, with and
without the live observer in the list, alternating runs and keeping each
one's best. "One page open" adds a viewer with no filter, so every pair is
queued for the live thread, which runs meanwhile (its CPU share counts too); its
backlog is drained before the next run starts.

    python benchmarks/bench_live.py [--pairs 20000] [--repeat 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_metrics import CHUNK, traffic  # noqa: E402

from kproxy.observers.capture import Capture  # noqa: E402
from kproxy.observers.live import LiveView, ViewerFilter  # noqa: E402
from kproxy.observers.metrics import Metrics  # noqa: E402
from kproxy.protocol.connection import Connection  # noqa: E402
from kproxy.observers.contract import ConnectionInfo  # noqa: E402

INFO = ConnectionInfo(1, ("127.0.0.1", 40000), "bootstrap", ("127.0.0.1", 9092), None, time.time())


def run(client: bytes, broker: bytes, observers: list) -> float:
    conn = Connection()
    for observer in observers:
        hook = getattr(observer, "connection_opened", None)
        if hook is not None:
            hook(INFO)
    start = time.perf_counter()
    for stream, feed in ((client, conn.receive_client), (broker, conn.relay_broker)):
        for pos in range(0, len(stream), CHUNK):
            result = feed(stream[pos:pos + CHUNK])
            events = result[0] if isinstance(result, tuple) else result
            if events:
                for observer in observers:
                    observer(INFO, events)
    elapsed = time.perf_counter() - start
    for observer in observers:
        hook = getattr(observer, "connection_closed", None)
        if hook is not None:
            hook(INFO)
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    client, broker = traffic(args.pairs)
    metrics, capture = Metrics(), Capture(instance_name="bench")
    idle, watched = LiveView(), LiveView()
    watched.add_viewer(ViewerFilter().compile())
    paths = {"without": [metrics, capture], "no_page": [metrics, capture, idle],
             "one_page": [metrics, capture, watched]}
    best = {name: float("inf") for name in paths}
    for round_no in range(args.repeat):
        names = list(paths)
        names = names[round_no % 3:] + names[:round_no % 3]       # rotate the order each round
        for name in names:
            best[name] = min(best[name], run(client, broker, paths[name]))
            while watched.put_pairs > watched.got_pairs:           # the live thread's backlog must
                time.sleep(0.05)                                   # not overlap the next run
    watched.close()
    per_pair = {name: seconds / args.pairs * 1e6 for name, seconds in best.items()}
    result = {"pairs": args.pairs, "us_per_pair": per_pair,
              "no_page_ratio": best["no_page"] / best["without"],
              "one_page_ratio": best["one_page"] / best["without"],
              "one_page_pairs_overloaded": watched.overloaded}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.pairs} request/response pairs (Produce v9, Fetch v12 with records, Heartbeat v4), "
          f"tracker + metrics + idle capture, best of {args.repeat}")
    print(f"without the live observer      {per_pair['without']:7.2f} us/pair")
    print(f"live observer, no page open    {per_pair['no_page']:7.2f} us/pair  "
          f"({(result['no_page_ratio'] - 1) * 100:+.1f} %)")
    print(f"live observer, one page open   {per_pair['one_page']:7.2f} us/pair  "
          f"({(result['one_page_ratio'] - 1) * 100:+.1f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
