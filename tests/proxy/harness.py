"""Real kproxies and the things tests put around them.

- ``ProxyThread``: a Runtime on its own event-loop thread, for tests driving blocking clients;
- ``KproxyProcess``: ``kproxy run`` in a process of its own (its memory, its limits, its workers,
  a loop a test may freeze), from ``tests/kproxy_process.py``, which benchmarks share;
- ``silent_port``: a broker that accepts connections and never answers;
- ``Traffic``: a producer and a group consumer on threads of their own, counting what got through
  (``ConfluentTraffic``: with confluent-kafka);
- ``kafka_python_group_consumer``: a kafka-python group member that cannot wedge on its first join;
- ``GROUP_TIMEOUTS`` (librdkafka and Java names), ``KP_GROUP_TIMEOUTS`` (kafka-python's): how
  long a group member may go unheard before the broker expels it, and how often it speaks;
- ``wait_for`` and ``http_status`` (from ``tests/kproxy_process.py`` too): deadlines on a
  condition, and an HTTP answer as (status, text);
- ``ssl_config``, ``sasl_config``: confluent-kafka settings for a client of a TLS or SASL kproxy.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

import uvloop

from kproxy import config as config_module
from kproxy.embedded._support import free_port, free_ports  # noqa: F401  (tests import them from here)
from kproxy.runtime import Runtime
from tests.kproxy_process import REPO, KproxyProcess, http_status, wait_for  # noqa: F401  (tests import them from here)
from tests.proxy.certs import PKI

START_TIMEOUT_S = 10.0


def _proc_stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name; None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` now."""
    return [child for child in map(int, filter(str.isdigit, os.listdir("/proc")))
            if (_proc_stat(child) or [None, None])[1] == str(pid)]


def process_state(pid: int) -> str | None:
    """``pid``'s state letter (R, S, T for stopped, Z ...); None once it is gone."""
    fields = _proc_stat(pid)
    return None if fields is None else fields[0]


def exited(pid: int) -> bool:
    """True once ``pid`` has ended (gone, or a zombie nobody reaped yet)."""
    return process_state(pid) in (None, "Z", "X")


def rss(pid: int) -> int:
    """``pid``'s resident memory now, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def open_fds(pid: int | str = "self") -> int:
    """How many file descriptors ``pid`` (this process by default) has open now."""
    return len(os.listdir(f"/proc/{pid}/fd"))


class ProxyThread:
    """``with ProxyThread(upstream=..., ...) as proxy: proxy.bootstrap`` → "127.0.0.1:PORT".

    Every port defaults to 0 (broker listeners too, in gateway mode): kproxy binds first
    and advertises what it bound, so no race with other processes for a free port.
    """

    def __init__(self, observers: Iterable = (), **settings):
        settings.setdefault("listen", "127.0.0.1:0")
        settings.setdefault("admin_listen", "127.0.0.1:0")
        if settings.get("mode", "gateway") == "gateway" and settings.get("routing") != "sni":
            settings.setdefault("broker_port_base", 0)
        self.config = config_module.build(settings)
        self.runtime = Runtime(self.config, observers)
        self.loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="kproxy")

    def call(self, coro, timeout: float = START_TIMEOUT_S):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def __enter__(self) -> "ProxyThread":
        self._thread.start()
        self.call(self.runtime.start())
        return self

    def __exit__(self, *exc) -> None:
        self.call(self.runtime.stop(), timeout=self.config.shutdown_timeout + 10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)

    @property
    def bootstrap(self) -> str:
        host, port = self.runtime.proxy.bootstrap_address
        return f"{host}:{port}"

    @property
    def admin_url(self) -> str:
        return self.runtime.admin_url

    def served_broker_addresses(self) -> set[tuple[str, int]]:
        """The broker addresses kproxy hands out now (gateway: listeners it has bound)."""
        return set(self.runtime.proxy.broker_addresses().values())

    broker_addresses = property(served_broker_addresses)


@contextmanager
def silent_port() -> Iterator[tuple[str, int]]:
    """(host, port) of a listener that is never accepted from and never answers: the
    kernel completes each TCP handshake into its backlog, as for a stopped (SIGSTOP) or
    wedged broker. Also a port kproxy cannot bind."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)             # room for every connection a test makes
    try:
        yield listener.getsockname()
    finally:
        listener.close()


# ---------------------------------------------------------------- clients that keep going

# A group consumer's session: short (the broker's minimum), so a member that went away
# without leaving is replaced quickly; heartbeats at a sixth of it, so the broker expels a
# member only if none gets through for 5 s past its due time. At the clients' default
# interval (3 s, half this session; kafka-python warns about the pair) one heartbeat held
# up over 3 s -- the client or kproxy's loop starved on a loaded 2-core machine -- expelled
# the member: its commits failed (UNKNOWN_MEMBER_ID) and each rejoin restarted it from the
# last commit, rereading what it had already counted instead of making progress.
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_INTERVAL_MS = 1000
GROUP_TIMEOUTS = {"session.timeout.ms": SESSION_TIMEOUT_MS, "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS}
KP_GROUP_TIMEOUTS = {"session_timeout_ms": SESSION_TIMEOUT_MS, "heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS}

GROUP_METADATA_TIMEOUT_S = 30.0     # a Metadata answer on a busy 2-core machine
TRAFFIC_PRODUCE_INTERVAL_S = 0.005   # pace of ConfluentTraffic's producer (~200 messages/s)


class Traffic:
    """A producer (acks=all, idempotent) and a group consumer of numbered messages, each on
    its own thread, for tests that break something while clients keep going.

    A subclass drives one client library: ``_produce`` sends ``next_number()`` until
    ``producing()`` is false, then flushes, reporting each answer to ``acknowledged`` or
    ``failed``; ``_consume`` adds what it reads to ``consumed`` while ``consuming()``.
    ``crashes``: whatever ended a thread; every wait here fails on one at once.
    """

    def __init__(self, bootstrap: str, topic: str, timeout: float):
        self.bootstrap, self.topic, self.timeout = bootstrap, topic, timeout
        self.produced = 0
        self.delivered: set[int] = set()
        self.consumed: set[int] = set()
        self.delivery_errors: list = []
        self.crashes: list[BaseException] = []
        self._stop_producing, self._stop_consuming = threading.Event(), threading.Event()
        self._producer = threading.Thread(target=self._guard, args=(self._produce,), daemon=True)
        self._consumer = threading.Thread(target=self._guard, args=(self._consume,), daemon=True)

    def _produce(self) -> None:
        raise NotImplementedError

    def _consume(self) -> None:
        raise NotImplementedError

    def _guard(self, body) -> None:
        try:
            body()
        except BaseException as exc:          # noqa: BLE001 - reported by check()
            self.crashes.append(exc)

    def producing(self) -> bool:
        return not self._stop_producing.is_set()

    def consuming(self) -> bool:
        return not self._stop_consuming.is_set()

    def next_number(self) -> int:
        number = self.produced
        self.produced += 1
        return number

    def acknowledged(self, number: int) -> None:
        self.delivered.add(number)

    def failed(self, error) -> None:
        self.delivery_errors.append(error)

    def start(self) -> None:
        self._producer.start()
        self._consumer.start()

    def check(self) -> None:
        assert not self.crashes, self.crashes

    def wait_for_progress(self, count: int, what: str) -> None:
        """Wait until ``count`` more messages are both acknowledged and consumed."""
        delivered, consumed = len(self.delivered), len(self.consumed)
        try:
            wait_for(lambda: self.check() or (len(self.delivered) >= delivered + count
                                              and len(self.consumed) >= consumed + count),
                     self.timeout, f"{count} messages through kproxy {what}")
        except AssertionError as exc:          # which side fell short
            exc.add_note(f"meanwhile {len(self.delivered) - delivered} acknowledged, "
                         f"{len(self.consumed) - consumed} consumed")
            raise

    def stop_producing(self) -> None:
        """Stop producing; return once the producer has flushed (every answer is in)."""
        self._stop_producing.set()
        self._producer.join(self.timeout + 30)
        self.check()

    def stop_consuming(self) -> None:
        self._stop_consuming.set()
        self._consumer.join(30)
        self.check()

    def finish(self) -> None:
        """Stop producing, then wait until the consumer has every acknowledged message."""
        self.stop_producing()
        wait_for(lambda: self.check() or self.delivered <= self.consumed, self.timeout,
                 "every acknowledged message to be consumed")
        self.stop_consuming()


class ConfluentTraffic(Traffic):
    """``Traffic`` with confluent-kafka (librdkafka) clients; ``settings``: more of theirs
    (TLS, say), for both."""

    settings: dict = {}

    def _on_delivery(self, err, msg):
        if err is None:
            self.acknowledged(int(msg.value()))
        else:
            self.failed(err)

    def _produce(self):
        from confluent_kafka import Producer
        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all",
                             "enable.idempotence": True, "linger.ms": 5, **self.settings})
        while self.producing():
            number = self.next_number()
            producer.produce(self.topic, key=str(number), value=str(number), on_delivery=self._on_delivery)
            producer.poll(TRAFFIC_PRODUCE_INTERVAL_S)
        assert producer.flush(self.timeout) == 0

    def _consume(self):
        from confluent_kafka import Consumer
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"g-{self.topic}",
                             "auto.offset.reset": "earliest", **GROUP_TIMEOUTS, **self.settings})
        consumer.subscribe([self.topic])
        try:
            while self.consuming():
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is None:
                    self.consumed.add(int(msg.value()))
        finally:
            consumer.close()


def kafka_python_group_consumer(bootstrap: str, topic: str, group: str, **settings):
    """A kafka-python consumer in ``group``, subscribed to ``topic``, that knows the topic's
    partitions before its first poll (so before it joins).

    Subscribed at once, kafka-python 3.0 joins before its first Metadata answer for the
    topic is in: as the group's leader it assigns nothing, then rejoins when the answer
    comes. If that rejoin outlasts one ``poll()`` timeout (a few hundred ms on a loaded
    machine) the client drops the finished join and, no longer seeing a reason to rejoin,
    stays wedged: no partitions, no heartbeats (the broker expels it; LeaveGroup on close
    answers UNKNOWN_MEMBER_ID). Knowing the partitions first, its first join assigns them.
    """
    from kafka import KafkaConsumer
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                             **KP_GROUP_TIMEOUTS, **settings)
    try:
        consumer.subscribe([topic])          # first: the Metadata answer below updates the group's view
        wait_for(lambda: consumer.partitions_for_topic(topic), GROUP_METADATA_TIMEOUT_S, f"{topic}'s partitions")
    except BaseException:
        consumer.close()
        raise
    return consumer


# ---------------------------------------------------------------- clients of a TLS or SASL kproxy

SCRAM_USER, PASSWORD = "alice", "alice-secret"     # the user ``sasl_cluster`` knows


def ssl_config(proxy: ProxyThread, pki: PKI, **extra) -> dict:
    return {"bootstrap.servers": proxy.bootstrap, "security.protocol": "SSL",
            "ssl.ca.location": str(pki.ca), "ssl.endpoint.identification.algorithm": "https",
            **extra}


def sasl_config(proxy: ProxyThread, mechanism: str, password: str = PASSWORD) -> dict:
    return {"bootstrap.servers": proxy.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism, "sasl.username": SCRAM_USER, "sasl.password": password}


# ---------------------------------------------------------------- kproxy run --workers

WORKERS_TOKEN = "workers-test-token-0123456789abcdef"


class Workers(KproxyProcess):
    """A ``kproxy run --workers N`` process (``KproxyProcess``) and the calls a test makes to it."""

    def __init__(self, upstream: str, node_ids: list[int], tmp: Path, workers: int = 2,
                 listen_port: int | None = None, ready: str | None = "/readyz"):
        # Every worker binds the same Kafka ports (SO_REUSEPORT), so those are given; the
        # supervisor alone binds the admin and probe ports, so the OS picks them.
        listen, *broker_ports = free_ports(1 + len(node_ids))
        self.capture_root = tmp / "captures"
        super().__init__(tmp, ready=ready, admin_token=WORKERS_TOKEN,
                         upstream=upstream, workers=workers, listen=f"127.0.0.1:{listen_port or listen}",
                         probe_listen="127.0.0.1:0",
                         broker_port_rule="map", broker_port_map=dict(zip(node_ids, broker_ports)),
                         shutdown_timeout=10, capture_root=str(self.capture_root))

    def workers(self) -> list[dict]:
        return json.loads(self.call("/workers")[1])["workers"]

    def per_worker_metrics(self) -> list[dict[tuple, float]]:
        """Each worker's own exposition, from its private admin listener."""
        return [self.metrics(base=f"http://127.0.0.1:{w['admin_port']}") for w in self.workers()]


def value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)
