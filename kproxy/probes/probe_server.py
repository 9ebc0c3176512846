"""The probe process's server: ``/healthz`` and ``/readyz`` from the probe board (see ``probes``).

A small HTTP/1.1 responder on ``asyncio.start_server``, one answer per connection
(``Connection: close``; the kubelet opens a connection per probe), holding its
callers to the admin listener's limits (``http_limits``): request headers within
the read timeout, lines of at most ``MAX_LINE_BYTES``, at most ``MAX_HEADER_LINES``
header lines, and at most ``MAX_CONNECTIONS`` connections at once (the rest are
closed unread). Request bodies are never read. It imports only the stdlib and
the board, so it starts in tens of milliseconds and stays a few MB.

Run by ``ProbeProcess`` as ``main([board descriptors, host, port, read timeout])``:
it prints ``listening HOST PORT`` once bound, or ``error WHY`` and exits 1, then
serves until its stdin closes (its parent stopped it or died).
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time

from ..http_limits import LISTEN_BACKLOG, MAX_HEADER_LINES, MAX_LINE_BYTES
from .probe_board import Board
from .probes import READY_POLL_S, READY_WAIT_S, health_answer, needs_refresh, ready_answer

# Connections open at once: the kubelet and a container runtime send one probe at a time;
# past this a caller is holding connections open, and new ones are closed unread (each of
# those still waits at most the read timeout, so probes get through again within it).
MAX_CONNECTIONS = 64
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            431: "Request Header Fields Too Large", 503: "Service Unavailable"}


class _Refused(Exception):
    def __init__(self, status: int, text: str):
        self.status, self.text = status, text


class ProbeServer:
    def __init__(self, board: Board, read_timeout: float, clock=time.monotonic):
        self.board = board
        self.read_timeout = read_timeout
        self.clock = clock
        self.open = 0                     # connections being served now
        self.routes = {"/healthz": self.healthz, "/readyz": self.readyz}

    def _states(self):
        return [self.board.read(index) for index in range(self.board.slots)]

    async def healthz(self) -> tuple[int, bytes]:
        return health_answer(self._states(), self.clock())

    async def readyz(self) -> tuple[int, bytes]:
        asked = self.clock()
        states = self._states()
        waiting = [index for index, state in enumerate(states) if needs_refresh(state, asked)]
        for index in waiting:
            self.board.ask(index, asked)
        deadline = asked + READY_WAIT_S
        while waiting and self.clock() < deadline:
            await asyncio.sleep(READY_POLL_S)
            for index in waiting:
                states[index] = self.board.read(index)
            waiting = [i for i in waiting if states[i].running and states[i].checked_at < asked]
        return ready_answer(states, waiting, self.clock())

    async def _request(self, reader: asyncio.StreamReader) -> tuple[str, str]:
        """(method, path) once the request's headers are in; ``_Refused`` if malformed."""
        try:
            method, target, version = (await reader.readuntil(b"\n")).decode("latin-1").split()
            if not version.startswith("HTTP/1."):
                raise ValueError(version)
            for _ in range(MAX_HEADER_LINES + 1):
                if await reader.readuntil(b"\n") in (b"\r\n", b"\n"):
                    return method, target.partition("?")[0]
        except asyncio.LimitOverrunError:
            raise _Refused(431, "line too long") from None
        except (ValueError, asyncio.IncompleteReadError):     # not a request line; cut short
            raise _Refused(400, "bad request") from None
        raise _Refused(431, "too many header lines")

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open >= MAX_CONNECTIONS:
            writer.transport.abort()
            return
        self.open += 1
        try:
            try:
                method, path = await asyncio.wait_for(self._request(reader), self.read_timeout)
            except asyncio.TimeoutError:          # too slow: hang up, as the admin listener does
                return
            except _Refused as refused:
                return await _answer(writer, refused.status, (refused.text + "\n").encode())
            route = self.routes.get(path)
            if route is None:
                return await _answer(writer, 404, b"not found\n")
            if method not in ("GET", "HEAD"):
                return await _answer(writer, 405, b"allowed: GET\n")
            status, body = await route()
            await _answer(writer, status, body, head=method == "HEAD")
        except (ConnectionError, asyncio.TimeoutError):
            pass
        finally:
            self.open -= 1
            writer.close()


async def _answer(writer: asyncio.StreamWriter, status: int, body: bytes, head: bool = False) -> None:
    writer.write(f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\nContent-Type: text/plain\r\n"
                 f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                 + (b"" if head else body))
    await writer.drain()              # a few hundred bytes: the socket's buffer takes them at once


async def serve(board: Board, host: str, port: int, read_timeout: float) -> int:
    server = ProbeServer(board, read_timeout)
    try:
        listener = await asyncio.start_server(server.handle, host, port, backlog=LISTEN_BACKLOG,
                                              limit=MAX_LINE_BYTES + 2, reuse_address=True)
    except OSError as exc:
        print(f"error {exc}", flush=True)
        return 1
    bound = listener.sockets[0].getsockname()
    print(f"listening {bound[0]} {bound[1]}", flush=True)
    loop = asyncio.get_running_loop()
    parent_gone = asyncio.Event()
    # The parent never writes: stdin turns readable only at EOF (it stopped us, or died).
    loop.add_reader(sys.stdin.fileno(), parent_gone.set)
    loop.add_signal_handler(signal.SIGTERM, parent_gone.set)
    await parent_gone.wait()
    listener.close()
    return 0


def main(argv: list[str]) -> int:
    descriptors, host, port, read_timeout = argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # kproxy stops us in order
    memory, *wakers = map(int, descriptors.split(","))
    board = Board.attach(memory, wakers)
    return asyncio.run(serve(board, host, int(port), float(read_timeout)))
