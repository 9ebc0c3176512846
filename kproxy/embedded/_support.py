"""Process, port and readiness helpers shared by the embedded Kafka and Tansu brokers.

Readiness is judged by the Kafka protocol, not by a bound port: a KRaft broker binds its
listeners before it has joined the cluster, and only a Metadata answer that lists every
expected broker proves that clients can use it. The probe is a hand-written Metadata v1
request (non-flexible, ~40 lines) rather than a Kafka client library, so this package runs
without the test extras (the README demo) and a probe costs a millisecond, not a client
start-up. Kafka 3.x, 4.x and Tansu all serve Metadata v1.

Every child process is tracked here and killed at interpreter exit, so a crashed test run
does not leave JVMs holding ports and memory on a 2-core machine.
"""

from __future__ import annotations

import atexit
import os
import socket
import struct
import subprocess
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

# Short: the probe runs in a polling loop and a broker that is still starting may accept the
# connection and answer nothing; the next poll tries again.
PROBE_TIMEOUT_S = 2.0

# How long a process gets to shut down cleanly after SIGTERM before SIGKILL. A combined KRaft
# node stops in ~1-2 s; a node that lost its quorum can hang in controlled shutdown forever.
TERMINATE_GRACE_S = 10.0

# Lines of a log shown in a start-up error: enough for a Java stack trace and its cause.
LOG_TAIL_LINES = 60

# Responses larger than this are not Metadata-without-topics answers; refuse rather than
# allocate whatever a confused peer announces.
MAX_PROBE_RESPONSE_BYTES = 1 << 20

# Where the kernel picks ports for port-0 binds and outgoing connections
# (ip_local_port_range(7)); Linux's default when it cannot be read.
EPHEMERAL_RANGE_PATH = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_RANGE = (32768, 60999)
# Ports picked ahead start here: below it sit the well-known ports and the registered
# ones that services on a developer's machine commonly use (databases, 8080, 9092 ...).
FIRST_PICKED_PORT = 10000
MAX_PORT = 65535
LOOPBACK_HOST = "127.0.0.1"
# Any large odd number coprime to the range sizes works; it scatters consecutive pids.
_PID_SPREAD = 7919

_METADATA_API_KEY = 3
_METADATA_VERSION = 1
_PROBE_CLIENT_ID = b"kproxy-embedded-probe"
_PROBE_CORRELATION_ID = 0x6B70  # arbitrary; checked on the way back

_live_processes: set[subprocess.Popen[bytes]] = set()


class EmbeddedBrokerError(RuntimeError):
    """A broker or tool could not be fetched, started or run."""


class BrokerAddress(NamedTuple):
    """One broker as listed in a Metadata response (or as listened on)."""

    node_id: int
    host: str
    port: int


def ephemeral_port_range(path: Path = EPHEMERAL_RANGE_PATH) -> tuple[int, int]:
    """The kernel's ephemeral range (lowest, highest), inclusive: where port 0 binds land."""
    try:
        low, high = map(int, path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL_RANGE
    return low, high


def _outside(ephemeral: tuple[int, int]) -> list[range]:
    low, high = ephemeral
    below = range(FIRST_PICKED_PORT, min(low, MAX_PORT + 1))
    above = range(max(high + 1, FIRST_PICKED_PORT), MAX_PORT + 1)
    return [r for r in (below, above) if len(r)]


class PortAllocator:
    """Loopback ports to be handed to a listener that must know its port before it binds.

    Why not bind port 0, read the port and close (the usual trick): the kernel hands that
    very port to the next port-0 bind, or to an outgoing connection, of any process, so a
    kproxy told "bind 0" (or a client) can take it before the broker it was picked for
    binds it. A test run lost that race (kproxy listened on an OS-chosen port, then node 1
    was given the same port). Here ports come from *outside* the kernel's ephemeral range,
    where the kernel never picks one by itself, so no OS-chosen port can ever take it; one
    allocator per process hands out each port once only, so no two picks in a test run
    repeat; each port is still checked by binding it (something else may listen there); and
    each process starts at an offset derived from its pid, so parallel test runs on one
    machine walk different stretches. Where the range leaves no room outside it, ports
    fall back to the usual trick.
    """

    def __init__(self, ephemeral: tuple[int, int] | None = None, pid: int | None = None) -> None:
        self.pid = os.getpid() if pid is None else pid
        self._lock = threading.Lock()
        self._ranges = _outside(ephemeral or ephemeral_port_range())
        self._size = sum(len(r) for r in self._ranges)
        self._cursor = self.pid * _PID_SPREAD % self._size if self._size else 0
        self._handed_out = 0

    @property
    def ranges(self) -> list[range]:
        """Where this allocator picks from: every port outside the ephemeral range."""
        return list(self._ranges)

    def _port_at(self, index: int) -> int:
        index %= self._size
        for r in self._ranges:
            if index < len(r):
                return r[index]
            index -= len(r)
        raise AssertionError("unreachable: index is below the total size")

    def take(self, count: int, host: str = LOOPBACK_HOST, *, consecutive: bool = False) -> list[int]:
        """``count`` ports, each free now and never handed out before by this allocator;
        ``consecutive``: p, p+1, ... (for rules that derive ports from a base)."""
        if not self._size:
            return _os_chosen_ports(count, host)
        with self._lock:
            picked: list[int] = []
            while len(picked) < count:
                if self._handed_out + 1 > self._size:
                    raise EmbeddedBrokerError("every port outside the ephemeral range was handed out")
                port = self._port_at(self._cursor)
                self._cursor += 1
                self._handed_out += 1
                if consecutive and picked and port != picked[-1] + 1:
                    picked = []                       # a gap (range end, wrap): start a new run
                if _bindable(host, port):
                    picked.append(port)
                elif consecutive:
                    picked = []                       # the run is broken: start after it
            return picked


def _bindable(host: str, port: int) -> bool:
    # No SO_REUSEADDR: a port some socket still holds in TIME_WAIT is refused too, so the
    # check is at least as strict as the listener that will bind it.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _os_chosen_ports(count: int, host: str) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


_allocator: PortAllocator | None = None
_allocator_lock = threading.Lock()


def port_allocator() -> PortAllocator:
    """This process's one allocator (made on first use, so a forked child gets its own)."""
    global _allocator
    with _allocator_lock:
        if _allocator is None or _allocator.pid != os.getpid():
            _allocator = PortAllocator()
        return _allocator


def free_ports(count: int, host: str = LOOPBACK_HOST, *, consecutive: bool = False) -> list[int]:
    """``count`` distinct ports for listeners that must be told their port before they bind
    (a Kafka broker's listeners, fixed port rules under test, a port meant to refuse
    connections). See ``PortAllocator`` for why they cannot collide. A listener that can
    bind port 0 and report what it got should do that instead."""
    return port_allocator().take(count, host, consecutive=consecutive)


def free_port(host: str = LOOPBACK_HOST) -> int:
    """One port from ``free_ports``."""
    return free_ports(1, host)[0]


def _metadata_request() -> bytes:
    client_id = _PROBE_CLIENT_ID
    body = struct.pack(
        f">hhih{len(client_id)}si",
        _METADATA_API_KEY,
        _METADATA_VERSION,
        _PROBE_CORRELATION_ID,
        len(client_id),
        client_id,
        0,  # topics: an empty array asks for brokers only (v1+; null would mean all topics)
    )
    return struct.pack(">i", len(body)) + body


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    """Exactly ``size`` bytes from ``sock``; ConnectionError if the peer closes first."""
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("peer closed the connection mid-response")
        chunks += chunk
    return bytes(chunks)


def _parse_brokers(payload: bytes) -> list[BrokerAddress]:
    correlation_id, count = struct.unpack_from(">ii", payload, 0)
    if correlation_id != _PROBE_CORRELATION_ID:
        raise ConnectionError(f"unexpected correlation id {correlation_id}")
    offset = 8
    brokers = []
    for _ in range(count):
        node_id, host_len = struct.unpack_from(">ih", payload, offset)
        offset += 6
        host = payload[offset : offset + host_len].decode()
        offset += host_len
        port, rack_len = struct.unpack_from(">ih", payload, offset)
        offset += 6 + max(rack_len, 0)  # rack: nullable string, -1 = null
        brokers.append(BrokerAddress(node_id, host, port))
    return brokers


def metadata_brokers(host: str, port: int, timeout: float = PROBE_TIMEOUT_S) -> list[BrokerAddress]:
    """Ask the broker at host:port for Metadata v1 and return the brokers it lists.

    Raises OSError (including ConnectionError and TimeoutError) when the broker does not
    answer a well-formed response in time.
    """
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(_metadata_request())
        (size,) = struct.unpack(">i", recv_exactly(sock, 4))
        if not 8 <= size <= MAX_PROBE_RESPONSE_BYTES:
            raise ConnectionError(f"implausible Metadata response size {size}")
        payload = recv_exactly(sock, size)
    try:
        return _parse_brokers(payload)
    except (struct.error, UnicodeDecodeError) as exc:
        raise ConnectionError(f"malformed Metadata response: {exc}") from exc


def tcp_accepts(host: str, port: int, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def spawn(
    args: Sequence[str],
    log_path: Path,
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start a tracked child with stdout and stderr appended to log_path.

    The child stays in this process group on purpose: whoever kills the group (a CI
    timeout, a closed terminal) then kills the brokers too, even when this process gets
    no chance to run its exit handlers.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            list(args),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
        )
    _live_processes.add(process)
    return process


def terminate(processes: Iterable[subprocess.Popen[bytes]], grace: float = TERMINATE_GRACE_S) -> None:
    """SIGTERM all processes at once, then SIGKILL whichever still runs after grace seconds.

    Signalling all first matters for multi-node clusters: stopped one by one, the last
    nodes lose their quorum and hang in controlled shutdown. A grace of 0 kills at once,
    for processes whose data is thrown away anyway.
    """
    processes = list(processes)
    for process in processes:
        if process.poll() is None:
            if grace > 0:
                process.terminate()
            else:
                process.kill()
    for process in processes:
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        _live_processes.discard(process)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a log file, or a note that it does not exist."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"({path} does not exist)"
    return "\n".join(text.splitlines()[-lines:])


def write_if_changed(path: Path, text: str) -> None:
    """Write text to path atomically, unless it already holds exactly that text."""
    try:
        if path.read_text() == text:
            return
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(text)
    partial.replace(path)


def tail_of(output: str | bytes | None, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of captured process output."""
    if output is None:
        return ""
    text = output.decode(errors="replace") if isinstance(output, bytes) else output
    return "\n".join(text.splitlines()[-lines:])


@atexit.register
def _kill_leftovers() -> None:
    terminate(list(_live_processes), grace=0)  # nobody waits for a clean shutdown at exit
