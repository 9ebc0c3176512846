#!/usr/bin/env python3
"""What one request/response pair costs the relay as ``kproxy run`` sets it up, counted.

``bench_pair_bytecodes.py`` counts the relay alone (no observers, no held answers); this
counts the whole Python path of a broker listener's connection: the default configuration's
observers (metrics, capture idle, live view with no page open, audit, failovers, topic-id
lookup), the hold and address check of answers that may carry addresses, and (``--callbacks``)
the event loop's two callbacks per read, through which a large answer lands in place.
Deterministic where wall clock on a shared machine is not: fake transports, no sockets, a
tracer counting bytecodes over 20 pairs after 50 to warm up. The frames are
``bench_pair_latency.py``'s recording (Produce v10 100 B; Fetch v16 with a 1 MiB answer).

    python benchmarks/bench_relay_path.py --runtime --callbacks                 # Produce pair
    python benchmarks/bench_relay_path.py --runtime --callbacks --case fetch --read-bytes 112640
    python benchmarks/bench_relay_path.py --tree /path/to/other/tree --runtime --callbacks
    python benchmarks/bench_relay_path.py --runtime --by-function 30            # where they go
    python benchmarks/bench_relay_path.py --runtime --callbacks --time 2000     # CPU us per pair

Without ``--runtime``: the relay alone, as ``bench_pair_bytecodes.py``. ``--profile``: also
cProfile over 20,000 pairs. ``--time``: CPU time per pair, best of 7 runs (the rest is other
load; compare trees in interleaved runs).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gzip
import pickle
import struct
import sys
from pathlib import Path

# The frames, counts and stand-in transport of the relay-alone count (a sibling script).
from bench_pair_bytecodes import COUNTED, FRAMES, HERE, SIZE, WARM_UP, _Transport  # noqa: E402

PROFILED = 20_000
TIMED_RUNS = 7


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default=str(HERE))
    parser.add_argument("--runtime", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--time", type=int, default=0, metavar="PAIRS",
                        help="also the CPU time per pair: best of %d runs of PAIRS pairs (best: the rest is other load)" % 7)
    parser.add_argument("--case", choices=("produce", "fetch"), default="produce",
                        help="the pair: Produce v10 100 B (default) or Fetch v16 with a 1 MiB answer")
    parser.add_argument("--callbacks", action="store_true",
                        help="through the event loop's two callbacks per read (get_buffer, buffer_updated)")
    parser.add_argument("--read-bytes", type=int, default=1 << 30,
                        help="with --callbacks: most bytes one read brings (a 1 MiB answer comes in ~110 KiB reads)")
    parser.add_argument("--by-function", type=int, default=0, metavar="N",
                        help="also the N functions that run most of the bytecodes (own, not callees')")
    parser.add_argument("--sort", default="tottime", help="cProfile order (tottime, cumulative)")
    args = parser.parse_args()
    sys.path.insert(0, args.tree)
    from kproxy.protocol.connection import Connection
    from kproxy.proxy.relay import BufferBudget, ConnectionInfo, Endpoint, ReadArena, Relay

    request, answer = pickle.loads(gzip.decompress(FRAMES.read_bytes()))[args.case]
    request, answer = SIZE.pack(len(request)) + request, SIZE.pack(len(answer)) + answer
    arena = ReadArena()
    relay = Relay()
    client, broker = Endpoint(arena, "client"), Endpoint(arena, "broker")
    client.transport, broker.transport = _Transport(), _Transport()
    relay.client, relay.broker = client, broker
    relay.info = ConnectionInfo(1, ("127.0.0.1", 1), "broker-1", ("127.0.0.1", 2), 1)
    relay.budget = BufferBudget(1 << 30)
    budget = relay.budget

    def assemble(nbytes: int, start):       # as run_relay: large frames assembled where they land
        return arena.frame_buffer(nbytes, start) if budget.admits(nbytes) else None

    relay.tracker = Connection(assemble=assemble)
    if args.runtime:
        from kproxy import config as config_module
        from kproxy.proxy.relay import bodies_needed
        from kproxy.runtime import Runtime
        config = config_module.build({"upstream": "127.0.0.1:9", "listen": "127.0.0.1:0",
                                      "admin_listen": "127.0.0.1:0", "broker_port_base": 0})
        proxy = Runtime(config).proxy
        proxy.upstream_of[1] = ("127.0.0.1", 2)
        policy = proxy._policy("broker-1", 1)
        # As run_relay sets up a connection.
        relay.tracker = Connection(max_frame_size=policy.max_frame_size, hold=policy.hold,
                                   transform=policy.transform, stream_frame_bytes=policy.stream_frame_bytes,
                                   keep_bodies=bodies_needed(policy.observers), assemble=assemble)
        from kproxy.proxy import relay as relay_module
        if hasattr(relay_module, "listener_routes"):     # (trees before observers' interests: all take all)
            relay.routes = relay_module.listener_routes(policy)
        relay.observers = [o for o in policy.observers if getattr(o, "takes_events", True)]
    client.relay = broker.relay = relay

    def pair(correlation_id: int) -> None:
        ask, reply = bytearray(request), bytearray(answer)
        struct.pack_into(">i", ask, 8, correlation_id)
        struct.pack_into(">i", reply, 4, correlation_id)
        if not args.callbacks:
            relay.received(client, memoryview(ask))
            relay.received(broker, memoryview(reply))
            return
        for endpoint, data in ((client, memoryview(ask)), (broker, memoryview(reply))):
            while data:              # as the event loop reads: into the room the endpoint offers
                room = endpoint.get_buffer(-1)
                n = min(len(room), len(data), args.read_bytes)
                room[:n] = data[:n]
                endpoint.buffer_updated(n)
                data = data[n:]

    def measure() -> None:
        for i in range(WARM_UP):
            pair(i)
        assert relay.close_reason is None, relay.close_reason
        count = 0
        by_function: collections.Counter = collections.Counter()

        def tracer(frame, event, arg):
            nonlocal count
            frame.f_trace_opcodes = True
            if event == "opcode":
                count += 1
                if args.by_function:
                    code = frame.f_code
                    by_function[f"{Path(code.co_filename).name}:{code.co_firstlineno} {code.co_name}"] += 1
            return tracer

        sys.settrace(tracer)
        for i in range(WARM_UP, WARM_UP + COUNTED):
            pair(i)
        sys.settrace(None)
        print(f"{count / COUNTED:.0f} bytecodes per {args.case} pair")
        for name, n in by_function.most_common(args.by_function):
            print(f"{n / COUNTED:8.1f}  {name}")

    async def in_a_loop() -> None:       # as in kproxy: observers may schedule tasks (never run here)
        measure()
        if args.profile:
            profile()
        if args.time:
            timed()

    def timed() -> None:
        import gc
        import time
        gc.collect()
        gc.freeze()                          # as kproxy run does once started
        best = float("inf")
        correlation_id = WARM_UP + COUNTED
        for _ in range(TIMED_RUNS):
            start = time.process_time()
            for i in range(correlation_id, correlation_id + args.time):
                pair(i)
            best = min(best, time.process_time() - start)
            correlation_id += args.time
        print(f"{best / args.time * 1e6:.2f} us CPU per {args.case} pair (best of {TIMED_RUNS} runs of {args.time})")

    def profile() -> None:
        import cProfile
        import pstats
        profiler = cProfile.Profile()
        profiler.runcall(lambda: [pair(i) for i in range(PROFILED)])
        pstats.Stats(profiler).sort_stats(args.sort).print_stats(40)

    asyncio.run(in_a_loop())
    return 0


if __name__ == "__main__":
    sys.exit(main())
