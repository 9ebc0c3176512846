"""Kafka on a bare socket, and what tests read of kproxy's connections.

- ``RawClient`` and its frames (``framed``, ``request_frame``, ``fetch_fields``): exactly
  the bytes a test wants, for clients kproxy must survive or answer exactly;
- ``relay_states``, ``relay_count``, ``close_reasons``: kproxy's connections, seen on its
  own event loop and in its log;
- ``create_topic``: a fresh topic, made through the broker's admin API;
- ``StandInBroker``: a broker that answers as the test says (hostile or broken answers,
  which no real broker gives on demand), and ``answer_naming``: answers naming given nodes.

Shared by the tests that speak raw Kafka through kproxy (faults, limits, wire hardening,
clusters, streaming). Not in ``harness``: that module starts kproxies and knows nothing of
the Kafka protocol, while everything here builds or decodes frames with ``kproxy.protocol``
or looks inside a running proxy's relays. The fixtures around them (``start_proxy``,
``kproxy_log``, ``topic``) are in ``conftest.py``.
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from dataclasses import dataclass

import threading
from collections.abc import Callable

from kproxy.embedded import recv_exactly
from kproxy.protocol import (DecodeError, Request, Response, Struct, decode_request, decode_response,
                             encode_request, encode_response, new_body)
from kproxy.protocol.record_encoder import build_batch
from kproxy.protocol.records import Record
from tests.protocol.frames import framed
from tests.proxy.harness import ProxyThread

API_VERSIONS, METADATA, FETCH = 18, 3, 1
FETCH_VERSION = 12                # the newest Fetch that names topics (v13+ use topic ids)
CLIENT_ID = "kproxy-faults"

# "Promptly": a connection kproxy must close is closed well inside this, even on a
# loaded machine; far below the long-polls and timeouts that would otherwise end it.
CLOSE_TIMEOUT_S = 10.0
RESPONSE_TIMEOUT_S = 30.0         # a broker answer on a busy 2-core machine
ADMIN_TIMEOUT_S = 30.0


# ---------------------------------------------------------------- raw Kafka client

def request_frame(api_key: int, version: int, correlation_id: int, *,
                  header_client_id: str | None = CLIENT_ID, **fields) -> bytes:
    """A request frame; ``fields`` are the body's, ``header_client_id`` the header's client_id."""
    body = new_body("request", api_key, version, **fields)
    return framed(encode_request(Request(api_key, version, correlation_id, header_client_id, body)))


def fetch_fields(topic: str, offset: int = 0, *, max_wait_ms: int = 500, min_bytes: int = 1,
                 max_bytes: int = 1024 * 1024) -> dict:
    partition = Struct(partition=0, current_leader_epoch=-1, fetch_offset=offset,
                       last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=max_bytes)
    return dict(max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes,
                topics=[Struct(topic=topic, partitions=[partition])])


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


class RawClient:
    """A blocking Kafka client on a bare socket: exactly the bytes a test wants, no retries.
    ``client_id``: the one its request headers carry."""

    def __init__(self, target: str | tuple[str, int], rcvbuf: int | None = None,
                 client_id: str | None = CLIENT_ID):
        self.client_id = client_id
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(RESPONSE_TIMEOUT_S)
        self.sock.connect(address(target) if isinstance(target, str) else target)
        self.port = self.sock.getsockname()[1]
        self._ids = iter(range(1, 1 << 30))
        self._pending: list[tuple[int, int, int]] = []      # (correlation id, api key, version)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_request(self, api_key: int, version: int, **fields) -> int:
        correlation_id = next(self._ids)
        self._pending.append((correlation_id, api_key, version))
        self.send(request_frame(api_key, version, correlation_id, header_client_id=self.client_id, **fields))
        return correlation_id

    def _recv_exactly(self, size: int) -> bytes:
        chunks, remaining = [], size
        while remaining:
            chunk = self.sock.recv(min(remaining, 1 << 20))
            if not chunk:
                raise ConnectionError(f"closed with {remaining} of {size} bytes unread")
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def read_response(self):
        size, = struct.unpack(">i", self._recv_exactly(4))
        frame = self._recv_exactly(size)
        correlation_id, api_key, version = self._pending.pop(0)
        response = decode_response(frame, api_key, version)
        assert response.correlation_id == correlation_id
        return response

    def roundtrip(self, api_key: int, version: int, **fields):
        self.send_request(api_key, version, **fields)
        return self.read_response()

    def wait_closed(self, timeout: float = CLOSE_TIMEOUT_S) -> tuple[float, int]:
        """Read until the peer closes; (seconds it took, bytes read meanwhile). Fails on timeout."""
        started = time.monotonic()
        deadline = started + timeout
        received = 0
        while True:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(1 << 20)
            except (ConnectionResetError, BrokenPipeError):
                break
            except socket.timeout:
                raise AssertionError(f"connection still open after {timeout:g}s "
                                     f"({received} bytes received)") from None
            if not chunk:
                break
            received += len(chunk)
        return time.monotonic() - started, received

    def abort(self) -> None:
        """Close with a TCP reset, as a killed process with unread data does."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def close(self) -> None:
        self.sock.close()


def start_long_poll(client: RawClient, topic: str, max_wait_ms: int) -> int:
    """Send a Fetch at the partition's end, which the broker holds for ``max_wait_ms``."""
    peek = client.roundtrip(FETCH, FETCH_VERSION, **fetch_fields(topic, 0, max_wait_ms=0, min_bytes=0))
    end = peek.body.responses[0].partitions[0].high_watermark
    return client.send_request(FETCH, FETCH_VERSION, **fetch_fields(topic, end, max_wait_ms=max_wait_ms))


API_VERSIONS_FIELDS = dict(client_software_name="kproxy-tests", client_software_version="1")


def api_versions_ok(client: RawClient) -> None:
    response = client.roundtrip(API_VERSIONS, 3, **API_VERSIONS_FIELDS)
    assert response.body.error_code == 0 and response.body.api_keys


# ---------------------------------------------------------------- kproxy's connections, a broker's topics

@dataclass(frozen=True)
class RelayState:
    client_port: int
    in_flight: int
    write_buffer: int           # kproxy's unsent bytes towards the client
    buffered: int               # the tracker's bytes of incomplete frames
    from_broker: int            # bytes kproxy has read from the broker


async def _relay_states(proxy) -> list[RelayState]:
    states = []
    for relay in list(proxy.relays):
        if relay.info is None or relay.tracker is None:
            continue
        transport = relay.client.transport
        states.append(RelayState(relay.info.client[1], relay.in_flight,
                                 transport.get_write_buffer_size(), relay.tracker.buffered,
                                 relay.bytes_from_broker))
    return states


def relay_states(proxy: ProxyThread) -> list[RelayState]:
    """A consistent snapshot of kproxy's connections, taken on its own event loop."""
    return proxy.call(_relay_states(proxy.runtime.proxy))


def relay_count(proxy: ProxyThread) -> int:
    async def count():
        return len(proxy.runtime.proxy.relays)
    return proxy.call(count())


def close_reasons(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "kproxy.relay" and " close " in r.getMessage()]


def create_topic(bootstrap: str, partitions: int = 1) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic
    topic = f"kp-faults-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})      # must outlive its futures
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    futures[topic].result(ADMIN_TIMEOUT_S)
    return topic


class WitnessClient:
    """One connection, requests sent one at a time: every request and byte accounted for."""

    def __init__(self, bootstrap: str):
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.correlation_id = 0
        self.sent = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.sock.close()

    def send(self, api_key: int, version: int, body):
        self.correlation_id += 1
        payload = encode_request(Request(api_key, version, self.correlation_id, "raw-witness", body))
        self.sock.sendall(len(payload).to_bytes(4, "big") + payload)
        self.sent += 4 + len(payload)
        return self.correlation_id

    def receive(self, api_key: int, version: int):
        frame = recv_exactly(self.sock, int.from_bytes(recv_exactly(self.sock, 4), "big"))
        return decode_response(frame, api_key, version)

    def request(self, api_key: int, version: int, body):
        correlation_id = self.send(api_key, version, body)
        response = self.receive(api_key, version)
        assert response.correlation_id == correlation_id
        return response.body

    def create(self, topic: str) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:      # auto-created, then a leader elected
            metadata = self.request(3, 12, new_body("request", 3, 12, topics=[Struct(name=topic)],
                                                    allow_auto_topic_creation=True))
            if metadata.topics[0].error_code == 0 and metadata.topics[0].partitions:
                return
            time.sleep(0.3)
        raise AssertionError(f"{topic} not created")

    def produce(self, topic: str, value: bytes) -> None:
        batch = build_batch([Record(0, int(time.time() * 1000), None, value, ())], "none")
        body = self.request(0, 9, new_body("request", 0, 9, acks=1, timeout_ms=5000, topic_data=[
            Struct(name=topic, partition_data=[Struct(index=0, records=batch)])]))
        assert body.responses[0].partition_responses[0].error_code == 0


# ---------------------------------------------------------------- a broker that answers as told

PRODUCE, FIND_COORDINATOR, DESCRIBE_CLUSTER = 0, 10, 60


def answer_naming(request: Request, nodes: list[int], coordinator: int | None = None) -> bytes:
    """A broker's answer to Metadata, DescribeCluster or Produce (a NOT_LEADER error with
    KIP-951 node endpoints) naming ``nodes``, or to FindCoordinator naming ``coordinator``
    (default: the first node), each at the broker's own address ``broker-N.internal:9092``."""
    key, version = request.api_key, request.api_version
    coordinator = nodes[0] if coordinator is None else coordinator

    def at(node: int, /, **fields) -> Struct:
        return Struct(host=f"broker-{node}.internal", port=9092, **fields)

    if key == METADATA:
        body = new_body("response", key, version, cluster_id="standin", controller_id=nodes[0],
                        brokers=[at(n, node_id=n, rack=None) for n in nodes], topics=[])
    elif key == DESCRIBE_CLUSTER:
        body = new_body("response", key, version, cluster_id="standin", controller_id=nodes[0],
                        brokers=[at(n, broker_id=n, rack=None) for n in nodes])
    elif key == FIND_COORDINATOR:
        body = new_body("response", key, version, coordinators=[
            at(coordinator, key="group", node_id=coordinator, error_code=0, error_message=None)])
    elif key == PRODUCE:
        partition = Struct(index=0, error_code=6, base_offset=-1, log_append_time_ms=-1, log_start_offset=-1,
                           record_errors=[], error_message=None,
                           current_leader=Struct(leader_id=nodes[0], leader_epoch=1))
        body = new_body("response", key, version, responses=[Struct(name="t", partition_responses=[partition])],
                        throttle_time_ms=0, node_endpoints=[at(n, node_id=n, rack=None) for n in nodes])
    else:
        raise AssertionError(f"no answer naming nodes for {key} v{version}")
    return encode_response(Response(request.correlation_id, body), key, version)


class StandInBroker:
    """``with StandInBroker(answer) as broker: broker.address`` → "127.0.0.1:PORT".

    A thread per connection reads request frames and writes back ``answer(request)``:
    a response frame's payload (correlation id first, no size prefix), or None to close
    the connection. ``requests`` counts what it read; ``failures`` holds what broke in
    ``answer`` (checked by the test: a stand-in must not hide its own bugs).
    """

    def __init__(self, answer: Callable[[Request], bytes | None]):
        self.answer = answer
        self.requests = 0
        self.failures: list[BaseException] = []
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self._stopping = False
        self._connections: list[socket.socket] = []

    @property
    def address(self) -> str:
        return "127.0.0.1:%d" % self._listener.getsockname()[1]

    def __enter__(self) -> "StandInBroker":
        threading.Thread(target=self._accept, daemon=True, name="stand-in broker").start()
        return self

    def __exit__(self, *exc) -> None:
        self._stopping = True
        self._listener.close()
        for conn in list(self._connections):
            conn.close()

    def _accept(self) -> None:
        while not self._stopping:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._connections.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while not self._stopping:
                try:
                    size, = struct.unpack(">i", recv_exactly(conn, 4))
                    request = decode_request(recv_exactly(conn, size))
                except (OSError, struct.error, DecodeError):     # closed, or not Kafka
                    return
                self.requests += 1
                try:
                    payload = self.answer(request)
                except Exception as exc:         # noqa: BLE001 - reported to the test
                    self.failures.append(exc)
                    return
                if payload is None:
                    return
                try:
                    conn.sendall(framed(payload))
                except OSError:
                    return
