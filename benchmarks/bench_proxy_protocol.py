#!/usr/bin/env python3
"""What PROXY protocol costs: relay throughput and connection setup, off and on, same run.

kproxy (one process, uvloop) in front of a stand-in upstream that discards what it reads:
a client streams Produce requests with acks=0 (no answers, so the client → broker path is
all that is timed) over one connection, then opens and closes connections one after
another (each does an ApiVersions round trip, answered by the stand-in). ``off`` is the
path every listener takes without the setting; ``v2`` reads a header first. Run the same
script against another checkout (PYTHONPATH) to compare code, e.g. before the feature:

    python benchmarks/bench_proxy_protocol.py                 # off and v2
    PYTHONPATH=/path/to/other/checkout python benchmarks/bench_proxy_protocol.py --modes off
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import struct
import sys
import threading
import time
from pathlib import Path

if str(Path(__file__).resolve().parent.parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent.parent))

import uvloop

from kproxy import config as config_module
from kproxy.protocol import Request, Struct, encode_request, new_body
from kproxy.proxy.server import Proxy
from kproxy.protocol.record_encoder import build_batch
from kproxy.protocol.records import Record

PRODUCE_MB = 512                    # streamed per round
RECORDS_PER_REQUEST = 64
VALUE_BYTES = 16 * 1024             # one request is ~1 MiB, like a real producer's batch
CONNECTIONS = 500                   # opened one after another per round
V2_HEADER = (b"\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0c" + bytes([203, 0, 113, 7, 127, 0, 0, 1])
             + struct.pack(">HH", 40000, 9092))


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def produce_frame() -> bytes:
    batch = build_batch([Record(i, 0, None, b"x" * VALUE_BYTES, ()) for i in range(RECORDS_PER_REQUEST)], "none")
    body = new_body("request", 0, 9, acks=0, timeout_ms=1000, topic_data=[
        Struct(name="bench", partition_data=[Struct(index=0, records=batch)])])
    return framed(encode_request(Request(0, 9, 1, "bench", body)))


def api_versions_frame() -> bytes:
    return framed(encode_request(Request(18, 0, 1, "bench", new_body("request", 18, 0))))


API_VERSIONS_ANSWER = framed(struct.pack(">ihi", 1, 0, 0))      # v0: correlation id 1, no error, no keys


def stand_in() -> tuple[socket.socket, threading.Thread]:
    """An upstream that discards requests, answering each ApiVersions (a small frame)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve(conn):
        with conn:
            while True:
                data = conn.recv(1 << 20)
                if not data:
                    return
                if len(data) < 64 and data[4:6] == b"\x00\x12":
                    conn.sendall(API_VERSIONS_ANSWER)

    def accept():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    return listener, thread


def run_round(address, header: bytes, frame: bytes, ask: bytes, cpu) -> tuple[float, float, float, float]:
    """(MB/s streamed, kproxy CPU seconds per GB streamed, connections/s opened, kproxy CPU
    milliseconds per connection) through kproxy at ``address``; ``cpu()``: kproxy's thread's
    CPU time (less at the mercy of other load on the machine than wall-clock rates)."""
    count = PRODUCE_MB * 1024 * 1024 // len(frame)
    with socket.create_connection(address) as sock:
        sock.sendall(header)
        cpu_started = cpu()
        started = time.perf_counter()
        for _ in range(count):
            sock.sendall(frame)
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1)                       # kproxy closes once the broker side has it all
        elapsed = time.perf_counter() - started
    streamed = count * len(frame)
    throughput = streamed / elapsed / 1e6
    cpu_per_gb = (cpu() - cpu_started) / (streamed / 1e9)
    cpu_started = cpu()
    started = time.perf_counter()
    for _ in range(CONNECTIONS):
        with socket.create_connection(address) as sock:
            sock.sendall(header + ask)
            got = b""
            while len(got) < len(API_VERSIONS_ANSWER):
                chunk = sock.recv(64)
                if not chunk:
                    raise RuntimeError("closed before the answer")
                got += chunk
    rate = CONNECTIONS / (time.perf_counter() - started)
    return throughput, cpu_per_gb, rate, (cpu() - cpu_started) * 1000 / CONNECTIONS


def measure(mode: str, upstream: str, rounds: int) -> dict:
    settings = {"upstream": upstream, "listen": "127.0.0.1:0", "admin_listen": "off",
                "broker_port_base": 0}
    if mode != "off":
        settings["proxy_protocol"] = mode
    proxy = Proxy(config_module.build(settings))
    loop = uvloop.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(proxy.start(), loop).result(10)
    address = proxy.bootstrap_address
    header = V2_HEADER if mode != "off" else b""
    frame, ask = produce_frame(), api_versions_frame()
    clock = time.pthread_getcpuclockid(thread.ident)
    results = [run_round(address, header, frame, ask, lambda: time.clock_gettime(clock)) for _ in range(rounds)]
    asyncio.run_coroutine_threadsafe(proxy.stop(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    return {"mode": mode, "mb_per_s": [round(r[0]) for r in results],
            "connections_per_s": [round(r[2]) for r in results],
            "median_cpu_s_per_gb": round(statistics.median(r[1] for r in results), 3),
            "median_cpu_ms_per_connection": round(statistics.median(r[3] for r in results), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="off,v2")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    listener, _ = stand_in()
    upstream = "127.0.0.1:%d" % listener.getsockname()[1]
    for mode in args.modes.split(","):
        print(json.dumps(measure(mode, upstream, args.rounds)), flush=True)
    listener.close()


if __name__ == "__main__":
    main()
