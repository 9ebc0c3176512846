#!/usr/bin/env python3
"""Time added per request/response pair: a bare relay (the floor) vs kproxy, same run.

No Kafka: a stand-in broker (its own process, uvloop) answers every request at once
with a canned answer, so what is timed is the relays, not the broker's work. The
frames are confluent-kafka 2.16's against Kafka 4.4 (Produce v10 acks=1 and its
49-byte answer; Fetch v16 and a 1 MiB answer), saved by ``--record-frames`` once:

    python benchmarks/bench_pair_latency.py --record-frames      # needs Kafka (kproxy.embedded)
    python benchmarks/bench_pair_latency.py --kproxy-tree main=/work/main

Paths, each a persistent connection, timed in turns within every round (the order
rotating from round to round):

- ``direct``: client to the stand-in broker;
- ``bare``: through a relay of a few lines (uvloop ``BufferedProtocol``, forwards each
  read to the other side): the cost of two extra loopback hops and two wake-ups;
- ``kproxy <tree>``: through kproxy's relay (the tree's ``Proxy``, with the runtime's
  observers: metrics, capture, live view), as a broker listener serves clients;
- ``kproxy <tree> -obs``: the same without the runtime's observers: what they add when
  the broker (here: at once) answers before they are done with the request;
- ``kproxy +policy`` (``--policy FILE``): this tree with that ``policy_file`` (a rule that
  enforces puts the policy gate on the client path).

Relays run in a process of their own (as in production, client and broker elsewhere).
Figures: median and p99 of the round trip per path, and what each adds to ``direct``
(medians over rounds of per-round medians). The machine is shared: read the spread.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import gzip
import os
import pickle
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
FRAMES = Path(__file__).resolve().parent / "data" / "pair_frames.pkl.gz"
SIZE = struct.Struct(">i")
CASES = {"produce": (0, 10), "fetch": (1, 16)}     # name -> (api key, version) of the frames


# ------------------------------------------------------------------ the stand-in broker

class CannedBroker(asyncio.Protocol):
    """Answers each request frame with the canned answer for its API, correlation id patched."""

    def __init__(self, answers: dict[int, bytes]):
        self.answers = answers
        self.pending = bytearray()

    def connection_made(self, transport):
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data):
        self.pending += data
        while len(self.pending) >= 4:
            size, = SIZE.unpack_from(self.pending, 0)
            if len(self.pending) < 4 + size:
                return
            api_key = struct.unpack_from(">h", self.pending, 4)[0]
            correlation = bytes(self.pending[8:12])
            del self.pending[:4 + size]
            answer = self.answers[api_key]
            self.transport.write(answer[:4] + correlation)
            self.transport.write(memoryview(answer)[8:])


async def serve_broker(answers, ready) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: CannedBroker(answers), "127.0.0.1", 0)
    ready(server.sockets[0].getsockname()[1])
    await asyncio.Event().wait()


async def serve_relays(upstream: int, ready, policy_file: str | None = None) -> None:
    """A bare relay and kproxy's, both to ``upstream``; reports their two ports."""
    loop = asyncio.get_running_loop()

    from _bare_relay import Side as BareRelay      # the floor relay bench_peers.py runs too

    def bare_factory():
        client = BareRelay()

        async def connect():
            _, broker = await loop.create_connection(lambda: BareRelay(client), "127.0.0.1", upstream)
            broker.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client.peer = broker
            for data in client.early:
                broker.transport.write(data)
        client.connected = loop.create_task(connect())
        return client

    bare = await loop.create_server(bare_factory, "127.0.0.1", 0)

    from kproxy import config as config_module
    from kproxy.proxy.relay import serve_relays as kproxy_serve
    from kproxy.proxy.server import Proxy
    from kproxy.runtime import Runtime
    config = config_module.build({"upstream": f"127.0.0.1:{upstream}", "listen": "127.0.0.1:0",
                                  "admin_listen": "127.0.0.1:0", "broker_port_base": 0,
                                  **({"policy_file": policy_file} if policy_file else {})})
    ports = [bare.sockets[0].getsockname()[1]]
    # With the runtime's observers, and with only the proxy's own (no metrics, capture, live).
    for proxy in (Runtime(config).proxy, Proxy(config)):
        proxy.upstream_of[1] = ("127.0.0.1", upstream)
        policy = proxy._policy("broker-1", 1)
        server = await kproxy_serve(proxy._handler(policy), host="127.0.0.1", port=0)
        ports.append(server.sockets[0].getsockname()[1])
    # As ``Runtime.run_until_signalled`` does once started: what exists now lives as long
    # as the process; a full collection walking it is not what a running kproxy pays.
    gc.collect()
    gc.freeze()
    ready(*ports)
    await asyncio.Event().wait()


def child(argv: list[str]) -> None:
    import uvloop
    answers = {CASES[name][0]: SIZE.pack(len(frames[1])) + frames[1]
               for name, frames in pickle.loads(gzip.decompress(FRAMES.read_bytes())).items()}

    def ready(*ports):
        print(*ports, flush=True)
    if argv[0] == "broker":
        uvloop.run(serve_broker(answers, ready))
    else:
        uvloop.run(serve_relays(int(argv[1]), ready, *argv[2:3]))


# ------------------------------------------------------------------ the client

def recv_exactly(sock: socket.socket, n: int, into: bytearray) -> None:
    view = memoryview(into)[:n]
    got = 0
    while got < n:
        got += sock.recv_into(view[got:])


def pairs(port: int, request: bytes, answer_size: int, count: int) -> list[float]:
    """Seconds per sequential round trip of ``request`` on one connection."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buffer = bytearray(answer_size)
        times = []
        for _ in range(count + 20):                  # the first ones warm up
            start = time.perf_counter()
            sock.sendall(request)
            recv_exactly(sock, answer_size, buffer)
            times.append(time.perf_counter() - start)
        return times[20:]


def start(argv: list[str], tree: Path, cpus: set[int] | None = None) -> tuple[subprocess.Popen, list[int]]:
    process = subprocess.Popen([sys.executable, __file__, "--child", *argv], stdout=subprocess.PIPE,
                               env={**os.environ, "PYTHONPATH": str(tree)}, text=True,
                               preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus))
    return process, [int(p) for p in process.stdout.readline().split()]


def record_frames() -> None:
    """Save the Produce v10 / Fetch v16 frames confluent-kafka and Kafka exchange through kproxy."""
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE / "tests" / "proxy"))
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from harness import ProxyThread
    from kproxy.embedded.kafka import KafkaCluster
    from kproxy.protocol.events import ResponseReceived
    frames: dict[str, tuple[bytes, bytes]] = {}

    def observer(info, events):
        for e in events:
            if isinstance(e, ResponseReceived):
                for name, key in CASES.items():
                    if (e.api_key, e.api_version) == key and (name not in frames or e.size > len(frames[name][1])):
                        frames[name] = (bytes(e.request_event.frame), bytes(e.frame))
    with KafkaCluster(1) as cluster, ProxyThread([observer], upstream=cluster.bootstrap_servers) as proxy:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
        for future in admin.create_topics([NewTopic("pairs", 1, 1)]).values():
            future.result(60)
        time.sleep(2)
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 0, "acks": 1})
        producer.produce("pairs", b"y" * 100)
        producer.flush(10)
        frames.pop("produce", None)                  # keep a 100 B send's, not the largest
        producer.produce("pairs", b"y" * 100)
        producer.flush(10)
        small = frames.pop("produce")
        for _ in range(3000):
            producer.produce("pairs", b"x" * 1024)
        producer.flush(30)
        consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": "pairs",
                             "auto.offset.reset": "earliest"})
        consumer.subscribe(["pairs"])
        got, deadline = 0, time.monotonic() + 60
        while got < 3002 and time.monotonic() < deadline:
            got += len(consumer.consume(1000, 1.0))
        consumer.close()
        frames["produce"] = small
    FRAMES.parent.mkdir(exist_ok=True)
    FRAMES.write_bytes(gzip.compress(pickle.dumps(frames)))
    for name, (request, answer) in frames.items():
        print(f"{name}: request {len(request) + 4} B, answer {len(answer) + 4} B")


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record-frames", action="store_true")
    parser.add_argument("--kproxy-tree", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--pairs", type=int, default=300, help="per path, case and round")
    parser.add_argument("--cases", default="produce,fetch")
    parser.add_argument("--policy", metavar="FILE",
                        help="also time this tree with this policy_file (paths 'kproxy +policy')")
    parser.add_argument("--pin", action="store_true",
                        help="client and stand-in broker on the first CPU, relays on the second: "
                             "steadier figures (every hop then crosses CPUs, so all paths add more)")
    args = parser.parse_args()
    if args.record_frames:
        record_frames()
        return 0
    client_cpus = relay_cpus = None
    if args.pin:
        first, second, *_ = sorted(os.sched_getaffinity(0))
        client_cpus, relay_cpus = {first}, {second}
        os.sched_setaffinity(0, client_cpus)
    trees = {"kproxy": (HERE, [])}
    if args.policy:
        trees["kproxy +policy"] = (HERE, [str(Path(args.policy).resolve())])
    for spec in args.kproxy_tree:
        name, _, path = spec.partition("=")
        trees[f"kproxy {name}"] = (Path(path), [])
    frames = pickle.loads(gzip.decompress(FRAMES.read_bytes()))
    broker, (broker_port,) = start(["broker"], HERE, client_cpus)
    processes = [broker]
    ports = {"direct": broker_port}
    try:
        for label, (tree, extra) in trees.items():
            process, (bare_port, kproxy_port, unobserved_port) = start(["relays", str(broker_port), *extra], tree,
                                                                       relay_cpus)
            processes.append(process)
            ports.setdefault("bare", bare_port)
            ports[label] = kproxy_port
            ports[f"{label} -obs"] = unobserved_port
        results: dict = {}
        for case in args.cases.split(","):
            request, answer = frames[case]
            request = SIZE.pack(len(request)) + request
            count = args.pairs if case == "produce" else max(20, args.pairs // 5)
            labels = list(ports)
            for round_ in range(args.rounds):
                # The order rotates each round: no path always runs first, or right after another.
                turn = round_ % len(labels)
                for label in labels[turn:] + labels[:turn]:
                    port = ports[label]
                    times = pairs(port, request, len(answer) + 4, count)
                    results.setdefault(case, {}).setdefault(label, []).append(times)
        for case, by_path in results.items():
            print(f"\n{case} ({len(frames[case][0]) + 4} B request, {len(frames[case][1]) + 4} B answer), "
                  f"{args.rounds} rounds; µs, median of per-round medians [min-max], p99")
            direct = [statistics.median(t) for t in by_path["direct"]]
            this = [statistics.median(t) for t in by_path["kproxy"]]
            for label, rounds in by_path.items():
                medians = [statistics.median(t) for t in rounds]
                added = [m - d for m, d in zip(medians, direct)]
                p99 = statistics.median(sorted(t)[int(0.99 * len(t))] for t in rounds)
                # Paired with this tree's kproxy in the same round: the before/after figure.
                versus = [m - k for m, k in zip(medians, this)]
                print(f"  {label:20} {statistics.median(medians) * 1e6:8.1f}   added "
                      f"{statistics.median(added) * 1e6:+7.1f} [{min(added) * 1e6:+.1f}..{max(added) * 1e6:+.1f}]"
                      f"   p99 {p99 * 1e6:8.1f}   vs kproxy {statistics.median(versus) * 1e6:+7.1f}")
    finally:
        for process in processes:
            process.terminate()
            process.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
