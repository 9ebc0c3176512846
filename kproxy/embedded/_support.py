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


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Ports that are free right now: all sockets are held open together so they differ.

    Another process can still take a port between this call and the broker binding it;
    on a test machine that is rare enough to accept.
    """
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
