"""The probe board and the probe process, without a proxy: a real ``ProbeProcess`` reading a
real board that the test posts to as a proxy's event loop would.

What is checked: a reader never takes a torn slot for an answer (a writer process
rewriting a slot as fast as it can); the answers each board state gives (starting,
ok, stalled, a worker restarting, one line per worker); /readyz asking the loop for
a fresh answer and serving it; and the limits slow or malformed callers meet.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kproxy.http_limits import MAX_HEADER_LINES, MAX_LINE_BYTES
from kproxy.probes.probe_board import REASON_BYTES, Board, SlotState
from kproxy.probes.probe_server import MAX_CONNECTIONS
from kproxy.probes.probes import ProbeProcess
from tests.proxy.harness import wait_for
from tests.proxy.probes import get

REPO = Path(__file__).resolve().parents[2]
READ_TIMEOUT_S = 0.5               # the probe process's header deadline in these tests (5 s by default)
# Read until this many different states were seen (the writer competes for the cores with
# the reader, so reads alone are no measure of how many writes they overlapped).
DISTINCT_STATES = 2_000
MAX_READS = 3_000_000
# Posts slot 0 forever, each state internally consistent: pid == beat == checked_at and a
# reason of that number repeated to a length that varies with it.
WRITER = """
import sys
from kproxy.probes.probe_board import Board, SlotState
memory, waker = map(int, sys.argv[1].split(","))
board = Board.attach(memory, [waker])
n = 1
while True:
    board.post(0, SlotState(n, n % 2 == 0, float(n), float(n), 5.0, str(n) * (1 + n % 97)))
    n += 1
"""


@pytest.fixture
def board():
    board = Board.create(2)
    yield board
    board.close()


@pytest.fixture
def probes(board):
    process = ProbeProcess(read_timeout=READ_TIMEOUT_S)
    process.start(board, "127.0.0.1", 0)
    yield "http://%s:%d" % process.address
    process.stop()


def test_a_reader_never_sees_a_torn_slot():
    board = Board.create(1)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, ",".join(map(str, board.descriptors))],
                              pass_fds=board.descriptors,
                              cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        wait_for(lambda: board.read(0).pid > 0, 30, "the writer's first post")
        seen, reads = set(), 0
        while len(seen) < DISTINCT_STATES and reads < MAX_READS:
            reads += 1
            state = board.read(0)
            n = state.pid
            assert (state.beat, state.checked_at, state.ready) == (n, n, n % 2 == 0), state
            assert state.reason == str(n) * (1 + n % 97), state
            seen.add(n)
    finally:
        writer.kill()
        writer.wait()
        board.close()
    assert len(seen) == DISTINCT_STATES         # the slot really was rewritten meanwhile


def test_reset_requests_and_long_reasons(board):
    board.post(1, SlotState(42, True, 10.0, 9.0, 5.0, "x" * (2 * REASON_BYTES)))
    state = board.read(1)
    assert state.running and len(state.reason.encode()) == REASON_BYTES and state.reason.endswith("...")
    assert board.read(0) == SlotState() and not board.read(0).running      # never posted: starting
    assert board.asked(1) == 0.0
    board.ask(1, 12.5)
    assert board.asked(1) == 12.5 and board.asked(0) == 0.0
    board.reset(1, "restarting (killed by SIGKILL)", 20.0)
    assert board.read(1) == SlotState(reason="restarting (killed by SIGKILL)", checked_at=20.0)
    for wakers in (board.wakers[:1], board.wakers * 2):            # 1 and 4 slots: it has 2
        with pytest.raises(ValueError, match="not a probe board"):
            Board.attach(board.fd, wakers)


def test_answers_name_each_worker_and_judge_each_heartbeat(board, probes):
    assert get(probes + "/healthz") == (200, "worker 0: starting\nworker 1: starting\n")
    assert get(probes + "/readyz") == (503, "worker 0: starting\nworker 1: starting\n")
    now = time.monotonic()
    board.post(0, SlotState(100, True, now, now, 5.0, "b:9092 answers ApiVersions"))
    board.post(1, SlotState(101, True, now - 10, now, 5.0, "b:9092 answers ApiVersions"))
    status, body = get(probes + "/healthz")
    assert status == 503 and body.startswith("worker 0: ok (pid 100)\n"), body
    assert "worker 1: event loop stalled: it has not turned for 1" in body and "(limit 5s) (pid 101)" in body, body
    board.reset(1, "restarting (killed by SIGKILL)", now)      # the supervisor saw it die
    assert get(probes + "/healthz") == (200, "worker 0: ok (pid 100)\nworker 1: restarting (killed by SIGKILL)\n")
    assert get(probes + "/readyz") == (503, "worker 0: b:9092 answers ApiVersions (pid 100)\n"
                                            "worker 1: restarting (killed by SIGKILL)\n")


def test_an_expired_answer_is_refreshed_by_the_loop_on_demand(board, probes):
    """The probe stamps "asked at" and wakes the slot's loop (here a thread waiting on the
    slot's eventfd, nothing else), which checks and posts."""
    stale = time.monotonic() - 30
    for slot in (0, 1):
        board.post(slot, SlotState(1, False, time.monotonic(), stale, 5.0, "b:9092: TimeoutError"))
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            for slot in select.select(board.wakers, [], [], 0.1)[0]:
                index = board.wakers.index(slot)
                board.woken(index)
                now = time.monotonic()
                board.post(index, SlotState(1, True, now, now, 5.0, f"checked after {board.asked(index)}"))
    thread = threading.Thread(target=loop)
    thread.start()
    try:
        status, body = get(probes + "/readyz")
    finally:
        stop.set()
        thread.join()
    assert status == 200 and body.count("checked after") == 2, body


def raw(address: tuple[str, int], data: bytes) -> bytes:
    """The whole answer to ``data`` sent on a connection of its own (b"": closed unanswered)."""
    answer = b""
    with socket.create_connection(address, timeout=10) as sock:
        try:
            sock.sendall(data)
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    return answer


def test_malformed_and_unexpected_requests_get_their_status(probes):
    address = ("127.0.0.1", int(probes.rpartition(":")[2]))
    assert raw(address, b"GET /healthz?verbose=1 HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 200 ")
    head = raw(address, b"HEAD /healthz HTTP/1.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and head.endswith(b"\r\n\r\n")           # no body
    assert raw(address, b"POST /readyz HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi").startswith(b"HTTP/1.1 405 ")
    assert raw(address, b"GET /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 404 ")
    assert raw(address, b"hello\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert raw(address, b"GET /" + b"a" * (MAX_LINE_BYTES + 10) + b" HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 431 ")
    many = b"".join(b"X-%d: y\r\n" % i for i in range(MAX_HEADER_LINES + 5))
    assert raw(address, b"GET /healthz HTTP/1.1\r\n" + many + b"\r\n").startswith(b"HTTP/1.1 431 ")


def test_slow_callers_are_dropped_and_connections_capped(probes):
    address = ("127.0.0.1", int(probes.rpartition(":")[2]))
    slow = [socket.create_connection(address) for _ in range(MAX_CONNECTIONS)]
    try:
        for sock in slow:
            sock.sendall(b"GET /healthz HTTP/1.1\r\n")          # never finishes its headers
        # Once all are being served, one more is closed unread.
        wait_for(lambda: raw(address, b"GET /healthz HTTP/1.1\r\n\r\n") == b"", 10, "the cap")
        for sock in slow:                                     # each dropped at the header deadline
            sock.settimeout(10 * READ_TIMEOUT_S)
            assert sock.recv(64) == b""
        assert get(probes + "/healthz")[0] == 200             # and the port serves again
    finally:
        for sock in slow:
            sock.close()
