"""Soak runs of kproxy itself (opt-in: ``pytest -m soak --soak-seconds N``; see tests/soak.py).

- ``test_soak_clients_beside_hostile_clients``: ``kproxy run`` in front of Kafka for N
  seconds (the first fifth, at least a minute, a warm-up): a producer and a group
  consumer (confluent-kafka) that must lose nothing, hostile clients (mutated requests,
  garbage, oversized and cut-short frames, another protocol, resets) and a scrape of
  /metrics twice a second. After it kproxy's file descriptors are back where the warm-up
  left them, its memory has levelled off, and its log has no ERROR and no traceback.
- ``test_soak_hostile_broker``: a stand-in broker answering Metadata, FindCoordinator,
  DescribeCluster and Produce (with KIP-951 node endpoints) with valid answers, half of
  them mutated. Every answer a client gets decodes, and names only addresses kproxy
  serves; kproxy never logs an error.
"""

from __future__ import annotations

import random
import socket
import struct
import threading
import time

import pytest

from kproxy.embedded import recv_exactly
from kproxy.protocol import DecodeError, Struct, decode_response
from kproxy.protocol.record_encoder import build_batch
from kproxy.protocol.records import Record
from kproxy.proxy.rewrite import node_addresses
from tests.observers.metrics import scrape
from tests.protocol.mutations import mutate
from tests.proxy.harness import ConfluentTraffic, KproxyProcess, ProxyThread, open_fds, rss
from tests.proxy.wire import (DESCRIBE_CLUSTER, FIND_COORDINATOR, METADATA, PRODUCE, StandInBroker, answer_naming,
                             create_topic, request_frame)

pytestmark = pytest.mark.soak

# Before memory and descriptors are first read: a fifth of the run, and at least the time
# kproxy's memory took to level off under this load (within the first minute, measured).
WARM_UP_FRACTION = 0.2
MIN_WARM_UP_S = 60.0
HOSTILE_THREADS = 2
SCRAPE_INTERVAL_S = 0.5
READ_WAIT_S = 0.2               # a hostile client reads what comes back this long
# After the run, with the hostile clients gone: descriptors as after the warm-up (the
# steady clients may hold a few more or fewer connections). Memory is read every second
# after the warm-up: the allocator keeps some of what bursts used, so it climbs for a
# while and levels off (measured over 150 s: 49.5 MiB after the warm-up, both halves'
# peaks 65.8); a leak keeps growing: the second half's peak may exceed the first's by
# this at most.
FD_SLACK = 16
RSS_LATE_GROWTH_BYTES = 8 << 20
RSS_SAMPLE_INTERVAL_S = 1.0
TRAFFIC_TIMEOUT_S = 120.0


# ---------------------------------------------------------------- hostile clients

# Read-only requests only: a mutant of a request that changes something could, by luck,
# be a valid one (its API key and version are never mutated, see ``hostile_bytes``).
VALID_REQUESTS = [
    request_frame(18, 3, 1, client_software_name="soak", client_software_version="1"),
    request_frame(METADATA, 12, 2, topics=None, allow_auto_topic_creation=False),
    request_frame(10, 4, 3, key_type=0, coordinator_keys=["soak-group"]),
    request_frame(60, 0, 4),
]
KEPT_PREFIX = 8                 # size prefix, API key and version: never mutated


def hostile_bytes(rng: random.Random) -> tuple[bytes, str]:
    """What one hostile connection sends, and what kind of hostility it is."""
    kind = rng.choice(("mutant", "mutant", "garbage", "oversized", "cut", "http", "pipelined"))
    frame = rng.choice(VALID_REQUESTS)
    if kind == "mutant":
        body = mutate(rng, frame[KEPT_PREFIX:], rng.randint(1, 3))
        payload = frame[4:KEPT_PREFIX] + body
        size = len(payload) if rng.random() < 0.7 else struct.unpack(">i", frame[:4])[0]
        return struct.pack(">i", size) + payload, kind
    if kind == "garbage":
        return rng.randbytes(rng.randint(1, 300)), kind
    if kind == "oversized":
        return struct.pack(">i", rng.choice((2**31 - 1, 200 << 20, -1))) + frame[4:], kind
    if kind == "cut":
        return frame[:rng.randint(1, len(frame) - 1)], kind
    if kind == "http":
        return b"GET / HTTP/1.1\r\nHost: kafka\r\n\r\n", kind
    return b"".join(rng.choice(VALID_REQUESTS) for _ in range(rng.randint(2, 50))), kind


class HostileClients:
    """Threads that connect, send something hostile, read a little and hang up (half the
    time with a reset), until stopped; ``sent`` counts connections per kind."""

    def __init__(self, address: tuple[str, int], seed: int):
        self.address = address
        self.seed = seed
        self.sent: dict[str, int] = {}
        self.crashes: list[BaseException] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(seed + i,), daemon=True)
                         for i in range(HOSTILE_THREADS)]

    def __enter__(self) -> "HostileClients":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _run(self, seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not self._stop.is_set():
                data, kind = hostile_bytes(rng)
                self._one(rng, data)
                self.sent[kind] = self.sent.get(kind, 0) + 1
        except BaseException as exc:             # noqa: BLE001 - reported by the test
            self.crashes.append(exc)

    def _one(self, rng: random.Random, data: bytes) -> None:
        try:
            sock = socket.create_connection(self.address, timeout=5)
        except OSError:
            return                               # refused under load: the next one tries again
        try:
            sock.settimeout(READ_WAIT_S)
            sock.sendall(data)
            while sock.recv(1 << 16):
                pass
        except OSError:
            pass                                 # closed by kproxy, or nothing more came
        finally:
            if rng.random() < 0.5:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()


def test_soak_clients_beside_hostile_clients(kafka_cluster, tmp_path, soak_seconds):
    seed = random.getrandbits(32)
    topic = create_topic(kafka_cluster.bootstrap_servers)
    scrapes = {"ok": 0, "failed": 0}
    with KproxyProcess(tmp_path, upstream=kafka_cluster.bootstrap_servers, broker_port_base=0) as kproxy:
        traffic = ConfluentTraffic(kproxy.bootstrap, topic, TRAFFIC_TIMEOUT_S)
        traffic.start()
        traffic.wait_for_progress(20, "before the soak")
        stop_scraping = threading.Event()

        def scraper():
            while not stop_scraping.wait(SCRAPE_INTERVAL_S):
                try:
                    scrape(kproxy)
                    scrapes["ok"] += 1
                except OSError:
                    scrapes["failed"] += 1

        scraping = threading.Thread(target=scraper, daemon=True)
        scraping.start()
        host, port = kproxy.bootstrap.rsplit(":", 1)
        with HostileClients((host, int(port)), seed) as hostile:
            time.sleep(max(MIN_WARM_UP_S, soak_seconds * WARM_UP_FRACTION))
            warm_fds = open_fds(kproxy.pid)
            rss_samples = []
            deadline = time.monotonic() + soak_seconds * (1 - WARM_UP_FRACTION)
            while time.monotonic() < deadline:
                rss_samples.append(rss(kproxy.pid))
                time.sleep(RSS_SAMPLE_INTERVAL_S)
            traffic.check()
        assert not hostile.crashes, hostile.crashes
        time.sleep(2)                            # kproxy closes what the last ones left
        end_fds = open_fds(kproxy.pid)
        half = len(rss_samples) // 2
        first_half, second_half = max(rss_samples[:half] or rss_samples), max(rss_samples[half:])
        stop_scraping.set()
        scraping.join(30)
        traffic.finish()
        samples = scrape(kproxy)
        assert kproxy.process.poll() is None, "kproxy exited"
    log = kproxy.log_text()
    print(f"\nsoak {soak_seconds:g}s (seed {seed:#x}): {len(traffic.delivered)} records delivered and "
          f"consumed; hostile connections {sum(hostile.sent.values())} {hostile.sent}; scrapes {scrapes}; "
          f"RSS after the warm-up {rss_samples[0] / 2**20:.1f} MiB, peak of the first half {first_half / 2**20:.1f}, "
          f"of the second {second_half / 2**20:.1f}; fds {warm_fds} -> {end_fds}")
    assert traffic.delivered and traffic.delivered <= traffic.consumed and not traffic.delivery_errors
    assert scrapes["failed"] == 0 and scrapes["ok"] > 0
    assert " ERROR " not in log and "Traceback" not in log, log[-5000:]
    assert end_fds <= warm_fds + FD_SLACK, (warm_fds, end_fds)
    assert second_half <= first_half + RSS_LATE_GROWTH_BYTES, (first_half, second_half)
    refused = sum(v for (name, labels), v in samples.items() if name == "kproxy_connections_closed_total"
                  and dict(labels).get("reason") not in ("client_closed", "broker_closed"))
    assert refused > 0, "kproxy closed no hostile connection itself"


# ---------------------------------------------------------------- a hostile broker

NODE_IDS = list(range(8)) + [70_000, 2**31 - 1]     # two with no port by the offset rule
MAX_BROKERS = 6
CLIENT_REQUESTS = [(METADATA, 12), (FIND_COORDINATOR, 4), (DESCRIBE_CLUSTER, 1), (PRODUCE, 11)]
ADDRESS_WAIT_S = 5.0


def broker_answer(rng: random.Random, request) -> bytes:
    """A valid answer naming a few of ``NODE_IDS``; half of them mutated."""
    frame = answer_naming(request, rng.sample(NODE_IDS, rng.randint(1, 5)))
    if rng.random() < 0.5:
        return frame
    kept = 4 if rng.random() < 0.9 else 0        # the correlation id, mostly
    return frame[:kept] + mutate(rng, frame[kept:], rng.randint(1, 3))


def client_request(rng: random.Random, correlation_id: int) -> tuple[bytes, int, int]:
    key, version = rng.choice(CLIENT_REQUESTS)
    if key == PRODUCE:
        batch = build_batch([Record(offset=0, timestamp=0, value=b"soak")])
        fields = dict(acks=1, timeout_ms=1000, topic_data=[Struct(name="t", partition_data=[
            Struct(index=0, records=batch)])])
    elif key == FIND_COORDINATOR:
        fields = dict(key_type=0, coordinator_keys=["g"])
    elif key == METADATA:
        fields = dict(topics=None)
    else:
        fields = {}
    return request_frame(key, version, correlation_id, **fields), key, version


def test_soak_hostile_broker(kproxy_log, soak_seconds):
    seed = random.getrandbits(32)
    broker_rng, client_rng = random.Random(seed), random.Random(seed + 1)
    lock = threading.Lock()

    def answer(request):
        with lock:
            return broker_answer(broker_rng, request)

    checked = {"answers": 0, "addresses": 0, "closed": 0}
    with StandInBroker(answer) as broker, \
            ProxyThread(upstream=broker.address, broker_port_base=20000, max_brokers=MAX_BROKERS) as proxy:
        host, port = proxy.bootstrap.rsplit(":", 1)
        deadline = time.monotonic() + soak_seconds
        sock = None
        correlation_id = 0
        while time.monotonic() < deadline:
            if sock is None:
                sock = socket.create_connection((host, int(port)), timeout=ADDRESS_WAIT_S)
            correlation_id += 1
            frame, key, version = client_request(client_rng, correlation_id)
            try:
                sock.sendall(frame)
                size, = struct.unpack(">i", recv_exactly(sock, 4))
                payload = recv_exactly(sock, size)
            except OSError:                      # (recv_exactly's ConnectionError too)
                checked["closed"] += 1           # kproxy refused the answer: closed instead
                sock.close()
                sock = None
                continue
            try:
                response = decode_response(payload, key, version)
            except DecodeError as exc:
                raise AssertionError(f"kproxy forwarded an answer to {key} v{version} that does not "
                                     f"decode ({exc}; seed {seed:#x}): {payload.hex()}") from None
            serving = proxy.served_broker_addresses()
            for node_id, node_host, node_port in node_addresses(key, version, response.body):
                assert (node_host, node_port) in serving, \
                    f"node {node_id} handed out at {node_host}:{node_port}, not served (seed {seed:#x})"
                checked["addresses"] += 1
            checked["answers"] += 1
        if sock is not None:
            sock.close()
        listeners = len(proxy.runtime.proxy.bound_ports)
    print(f"\nhostile broker soak {soak_seconds:g}s (seed {seed:#x}): {checked}, "
          f"{broker.requests} requests at the broker, {listeners} broker listeners")
    assert not broker.failures, broker.failures
    assert checked["answers"] and checked["addresses"] and checked["closed"]
    assert listeners <= MAX_BROKERS

