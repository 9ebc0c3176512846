#!/usr/bin/env python3
"""What any relay costs on this machine: the floor under kproxy's ratios to direct.

One Apache Kafka node whose CLIENT listener advertises a fixed port (``--advertised``,
``kproxy.embedded``), where a relay that knows nothing of Kafka listens in its turn:

- ``bare``: a uvloop relay of a few lines, forwarding every read to the other side at
  once (one copy out of its read buffer, as a relay that keeps nothing must make);
- ``splice``: a relay that never brings the bytes into user space (``os.splice`` from
  socket to pipe to socket, a thread per direction): the least CPU any relay can use.

Neither rewrites addresses; they need none, the broker advertising them. ``direct`` is
the INTERNAL listener (which advertises itself), and kproxy (this tree, plus any
``--kproxy-tree NAME=PATH``) fronts that listener too. Rounds rotate the order; each
figure is divided by direct's of the same round, as in ``bench_peers.py``: consume and
produce 1 KiB records, the added latency of sequential acks=1 sends, and the relay's CPU
per GB (``/proc/<pid>/stat``, which keeps the time of threads that ended: the splice
relay's threads live as long as a connection).

    python benchmarks/bench_floor.py --rounds 7 --records 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_peers import (KproxyPath, create_topics, latency, percentile,  # noqa: E402
                                    wait_until_serving)
from benchmarks.bench_proxy import consume, free_port, produce, stop_process  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

BARE_RELAY = r'''
import asyncio, socket, sys, uvloop

class Side(asyncio.BufferedProtocol):
    def __init__(self, peer=None):
        self.peer, self.buffer, self.early = peer, memoryview(bytearray(1 << 20)), []
    def connection_made(self, transport):
        self.transport = transport
    def get_buffer(self, hint):
        return self.buffer
    def buffer_updated(self, n):
        data = bytes(self.buffer[:n])
        if self.peer is None:
            self.early.append(data)
        else:
            self.peer.transport.write(data)
    def pause_writing(self):
        self.peer.transport.pause_reading()
    def resume_writing(self):
        self.peer.transport.resume_reading()
    def connection_lost(self, exc):
        if self.peer is not None:
            self.peer.transport.close()

async def main(listen, upstream):
    loop = asyncio.get_running_loop()
    def accepted():
        client = Side()
        async def connect():
            _, broker = await loop.create_connection(lambda: Side(client), "127.0.0.1", upstream)
            client.peer = broker
            for data in client.early:
                broker.transport.write(data)
        loop.create_task(connect())
        return client
    await loop.create_server(accepted, "127.0.0.1", listen)
    await asyncio.Event().wait()

uvloop.run(main(int(sys.argv[1]), int(sys.argv[2])))
'''

SPLICE_RELAY = r'''
import fcntl, os, socket, sys, threading
F_SETPIPE_SZ = 1031
PIPE_BYTES = 1 << 20

def pump(source, sink):
    r, w = os.pipe()
    try:
        fcntl.fcntl(w, F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:
        pass
    try:
        while True:
            n = os.splice(source.fileno(), w, PIPE_BYTES)
            if n == 0:
                break
            while n:
                n -= os.splice(r, sink.fileno(), n)
    except OSError:
        pass
    for s in (source, sink):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

listen, upstream = int(sys.argv[1]), int(sys.argv[2])
server = socket.create_server(("127.0.0.1", listen))
while True:
    client, _ = server.accept()
    broker = socket.create_connection(("127.0.0.1", upstream))
    for s in (client, broker):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threading.Thread(target=pump, args=(client, broker), daemon=True).start()
    threading.Thread(target=pump, args=(broker, client), daemon=True).start()
'''


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process, threads that ended included (10 ms ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class RelayPath:
    """A Kafka-blind relay on the advertised port, started for its phases only."""

    def __init__(self, label: str, source: str, listen: int, upstream: int):
        self.label, self.source = label, source
        self.listen, self.upstream = listen, upstream
        self.bootstrap = f"127.0.0.1:{listen}"
        self.process = None

    def __enter__(self):
        self.process = subprocess.Popen([sys.executable, "-c", self.source, str(self.listen),
                                         str(self.upstream)])
        self.pid = self.process.pid
        wait_until_serving(self.bootstrap, self.process, self.label)
        return self

    def __exit__(self, *exc):
        stop_process(self.process)


class Direct:
    label = "direct"
    pid = None

    def __init__(self, bootstrap: str):
        self.bootstrap = bootstrap

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def run(args) -> dict:
    from kproxy.embedded.kafka import KafkaCluster
    advertised = free_port()
    results: dict = {"records": args.records, "rounds": args.rounds, "paths": {}}
    with KafkaCluster(1, advertised={1: f"127.0.0.1:{advertised}"}) as cluster:
        internal = cluster.internal_bootstrap_servers
        client_port = cluster.nodes[0].port
        relays = [RelayPath("bare", BARE_RELAY, advertised, client_port),
                  RelayPath("splice", SPLICE_RELAY, advertised, client_port)]
        kproxies = [KproxyPath("kproxy", internal)] + [
            KproxyPath(name, internal, Path(tree))
            for name, tree in (spec.split("=", 1) for spec in args.kproxy_tree)]
        paths = [Direct(internal)] + relays + kproxies
        create_topics(internal, ["floor-produce", "floor-consume", "floor-latency"])
        produce(internal, "floor-consume", args.records, 1024)
        for path in kproxies:
            path.__enter__()
        try:
            for r in range(args.rounds):
                order = paths[r % len(paths):] + paths[:r % len(paths)]
                for path in order:
                    figures = results["paths"].setdefault(path.label, {})
                    with (path if path in relays else Direct(path.bootstrap)):
                        pid = path.pid
                        before = process_cpu_seconds(pid) if pid else 0.0
                        seconds = consume(path.bootstrap, "floor-consume", args.records)
                        cpu = process_cpu_seconds(pid) - before if pid else None
                        produced = produce(path.bootstrap, "floor-produce", args.records, 1024)
                        sends = latency(path.bootstrap, "floor-latency", args.latency_sends)
                    gb = args.records * 1024 / 1e9
                    figures.setdefault("consume_mb_s", []).append(gb * 1000 / seconds)
                    figures.setdefault("produce_mb_s", []).append(gb * 1000 / produced)
                    figures.setdefault("latency_p50_ms", []).append(percentile(sends, 0.5) * 1000)
                    figures.setdefault("latency_p99_ms", []).append(percentile(sends, 0.99) * 1000)
                    if cpu is not None:
                        figures.setdefault("consume_cpu_s_per_gb", []).append(cpu / gb)
                    print(f"round {r} {path.label}: consume {gb * 1000 / seconds:.0f} MB/s, "
                          f"produce {gb * 1000 / produced:.0f} MB/s, p50 "
                          f"{percentile(sends, 0.5) * 1000:.3f} ms", file=sys.stderr, flush=True)
        finally:
            for path in kproxies:
                path.__exit__()
    return results


def summarize(results: dict) -> None:
    direct = results["paths"]["direct"]
    print(f"{results['records']:,} x 1 KiB per phase, {results['rounds']} rounds; "
          "ratio to direct of the same round, median [min-max]")
    print(f"{'path':12s} {'consume 1 KiB':>22s} {'produce 1 KiB':>22s} {'added p50 ms':>13s} "
          f"{'added p99 ms':>13s} {'CPU s/GB':>9s}")
    for label, figures in results["paths"].items():
        cells = []
        for key in ("consume_mb_s", "produce_mb_s"):
            ratios = [a / b for a, b in zip(figures[key], direct[key])]
            cells.append(f"{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]")
        for key in ("latency_p50_ms", "latency_p99_ms"):
            cells.append(f"{statistics.median(a - b for a, b in zip(figures[key], direct[key])):+.3f}")
        cpu = figures.get("consume_cpu_s_per_gb")
        cells.append(f"{statistics.median(cpu):.3f}" if cpu else "-")
        print(f"{label:12s} {cells[0]:>22s} {cells[1]:>22s} {cells[2]:>13s} {cells[3]:>13s} {cells[4]:>9s}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--records", type=int, default=1_000_000, help="1 KiB records per phase")
    parser.add_argument("--latency-sends", type=int, default=2000)
    parser.add_argument("--kproxy-tree", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    results = run(args)
    summarize(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
