"""The probe port: ``/healthz`` and ``/readyz`` answered by a process of their own.

Why a process. On the admin port a probe shares the kernel's accept queue and the
event loop with every scrape, live stream and capture call: during a storm of
1,000 scrapes it waited behind the wave's connections (hundreds of ms), and a
kubelet whose probes time out restarts a kproxy that was only busy. A thread of
its own (the probe listener before this) escaped the queue and the loop but not
the interpreter lock: under pipelining the proxy's gen-2 garbage collections
(100-280 ms) hold it, and the probe port's p99 was 120 ms against 19 ms for a
bare responder (``benchmarks/bench_admin.py``). The probe process
(``probe_server``, started by ``ProbeProcess``) shares no lock with the proxy:
it imports neither aiohttp nor the proxy (20 MiB resident, ~60 ms to start), and
answers from the probe board; in one run beside the thread it took p50/p99 2.7/27
ms during pipelining (the thread 11/139, the bare responder 2.3/26).

How it still tells the truth. Each proxy process's event loop posts to its slot
of the board (``probe_board``: shared memory, one slot per process, seqlocked)
every ``HEARTBEAT_INTERVAL_S`` (``LoopHeartbeat``): its heartbeat, and its
readiness (ready or not, why, and when that was established).

- ``/healthz`` is 503 once a slot's heartbeat is older than ``LOOP_STALL_LIMIT_S``
  (with workers, naming the worker). A slot with no heartbeat yet (the process
  is starting, or a dead worker is being restarted) is 200 and says so: the
  process is alive and not stuck, and starting has limits of its own (a kproxy
  that cannot bind exits; a worker that does not serve within 60 s is killed and
  restarted by the supervisor). Readiness is 503 meanwhile, which is what keeps
  traffic away; a kubelet needs no startupProbe.
- ``/readyz`` is the runtime's real check (starting, stopping, unbound listeners,
  then a broker's ApiVersions round trip, cached ``READINESS_CACHE_S``). An
  answer older than that is refreshed on demand: the probe process stamps "asked
  at" in the slot and wakes the loop (the slot's eventfd; each heartbeat looks
  too), which runs the check (the loop owns every upstream connection) and posts
  the result. The probe waits at most ``READY_WAIT_S`` for it; a loop that cannot
  check within that is reported 503 with its last answer and that answer's age.

The admin port keeps its own ``/healthz`` (the same heartbeat, in process) and
``/readyz``. With ``--workers N`` the supervisor starts the probe process and
resets a dead worker's slot; each worker posts to its own.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import subprocess
import sys
import time
from typing import Awaitable, Callable, Collection

from ..http_limits import READ_TIMEOUT_S
from ..readiness import READINESS_CACHE_S, READY_WAIT_S
from .probe_board import Board, SlotState

# How often each proxy event loop posts its heartbeat and readiness: often enough that a
# healthy loop is never mistaken for a stalled one, rarely enough to cost nothing (10
# callbacks/s of a few microseconds each). A probe wanting a fresh readiness answer wakes
# the loop at once; a wake-up lost (a loop not listening yet) waits for the next beat.
HEARTBEAT_INTERVAL_S = 0.1
# /healthz fails once the loop has not turned for this long. Nothing kproxy does on the
# loop takes more than milliseconds (rendering and capture run in threads); a loop silent
# for seconds serves no client, and Kafka clients time requests out after 30 s. The
# shipped liveness probes restart after three failures 10 s apart.
LOOP_STALL_LIMIT_S = 5.0
# How often a waiting /readyz looks at the board for the fresh answer.
READY_POLL_S = 0.005
PROBE_PATHS = ("/healthz", "/readyz")
# The probe process binds and says so within this at start, or kproxy does not start
# (it imports a few stdlib modules: ~30 ms on an idle machine).
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0

# (ready, why, when established): what a proxy process posts as its readiness.
Readiness = tuple[bool, str, float]


def stall_text(silent: float, limit: float) -> str:
    return f"event loop stalled: it has not turned for {silent:.1f}s (limit {limit:g}s)"


class LoopHeartbeat:
    """The proxy's event loop stamps ``last`` every ``interval``; ``health()`` is the admin
    port's ``/healthz`` answer. ``post_to`` makes each beat also post to a probe board."""

    def __init__(self, interval: float = HEARTBEAT_INTERVAL_S, stall_limit: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.interval = interval
        self.stall_limit = LOOP_STALL_LIMIT_S if stall_limit is None else stall_limit
        self.clock = clock
        self.last: float | None = None          # None until started: nothing to judge yet
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next: asyncio.TimerHandle | None = None
        self._board: Board | None = None
        self._slot = 0
        self._readiness: Callable[[], Readiness] | None = None
        self._check: Callable[[], Awaitable] | None = None
        self._checking: asyncio.Task | None = None

    def post_to(self, board: Board, slot: int, readiness: Callable[[], Readiness],
                check: Callable[[], Awaitable]) -> None:
        """Post to ``board``'s ``slot`` at every beat: the heartbeat and ``readiness()``; when a
        probe asked for an answer newer than that, run ``check()`` (which updates it)."""
        self._board, self._slot, self._readiness, self._check = board, slot, readiness, check

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        if self._board is not None:
            loop.add_reader(self._board.wakers[self._slot], self._woken)
        self._beat()

    def _woken(self) -> None:
        self._board.woken(self._slot)
        self.post()

    def _beat(self) -> None:
        self.last = self.clock()
        self.post()
        self._next = self._loop.call_later(self.interval, self._beat)

    def post(self) -> None:
        """Post to the board now (each beat does; so does a change worth not waiting for)."""
        if self._board is None or self.last is None:
            return
        ready, reason, checked_at = self._readiness()
        if self._checking is None and self._board.asked(self._slot) > checked_at:
            self._checking = self._loop.create_task(self._check())
            self._checking.add_done_callback(self._checked)
        self._board.post(self._slot, SlotState(os.getpid(), ready, self.last, checked_at,
                                               self.stall_limit, reason))

    def _checked(self, task: asyncio.Task) -> None:
        self._checking = None
        if not task.cancelled():
            task.exception()                    # retrieved: the check logs its own failures
        self.post()                             # the answer now, not at the next beat

    def stop(self) -> None:
        if self._next is not None:
            self._next.cancel()
            self._next = None
        if self._board is not None:
            self._loop.remove_reader(self._board.wakers[self._slot])
        self.last = None
        self._board = None

    def silent_for(self) -> float:
        """Seconds since the loop last turned (0 before it started)."""
        last = self.last
        return 0.0 if last is None else max(0.0, self.clock() - last)

    def health(self) -> tuple[int, str, bytes]:
        silent = self.silent_for()
        if silent > self.stall_limit:
            return 503, "text/plain", (stall_text(silent, self.stall_limit) + "\n").encode()
        return 200, "text/plain", b"ok\n"


# ---------------------------------------------------------------- answers from the board

def _body(lines: list[tuple[int, SlotState, str]], named: bool) -> bytes:
    if not named:
        return (lines[0][2] + "\n").encode()
    return "".join(f"worker {index}: " + text.strip().replace("\n", "; ")
                   + (f" (pid {state.pid})" if state.pid else "") + "\n"
                   for index, state, text in lines).encode()


def health_answer(states: list[SlotState], now: float) -> tuple[int, bytes]:
    """``/healthz`` from the board: 503 if any slot's loop has stalled."""
    healthy, lines = True, []
    for index, state in enumerate(states):
        silent = now - state.beat
        if not state.running:
            text = state.reason                 # starting, or restarting: the supervisor's job
        elif silent > state.stall_limit:
            healthy, text = False, stall_text(silent, state.stall_limit)
        else:
            text = "ok"
        lines.append((index, state, text))
    return (200 if healthy else 503), _body(lines, named=len(states) > 1)


def ready_answer(states: list[SlotState], unchecked: Collection[int], now: float) -> tuple[int, bytes]:
    """``/readyz`` from the board: 200 when every slot is ready. ``unchecked``: the slots
    whose loop did not refresh an expired answer within ``READY_WAIT_S``."""
    ready, lines = True, []
    for index, state in enumerate(states):
        if index in unchecked:
            last = (f"its last answer, {now - state.checked_at:.1f}s old: {state.reason.strip()}"
                    if state.checked_at else "no answer yet")
            ready, text = False, (f"the event loop did not check the upstream within "
                                  f"{READY_WAIT_S:g}s ({last})")
        else:
            ready, text = ready and state.running and state.ready, state.reason
        lines.append((index, state, text))
    return (200 if ready else 503), _body(lines, named=len(states) > 1)


def needs_refresh(state: SlotState, now: float) -> bool:
    """A running loop's readiness answer too old to serve: ask it for a fresh one."""
    return state.running and now - state.checked_at > READINESS_CACHE_S


# ---------------------------------------------------------------- the process

# The child's command: only the package root on its path, no site-packages (-S: nothing
# it needs is there, and site's import costs start-up time), no environment (-I).
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CHILD = (f"import sys; sys.path.insert(0, {_PACKAGE_ROOT!r}); "
          f"from kproxy.probes.probe_server import main; sys.exit(main(sys.argv[1:]))")


class ProbeProcess:
    """``probe_server`` in a child process answering ``PROBE_PATHS`` from a ``Board``.

    ``start``/``stop`` are blocking (call them through ``asyncio.to_thread`` from a loop);
    ``start`` raises ``OSError`` with the child's one line when it cannot bind. The child
    stops when its stdin (a pipe only this process holds) closes: at ``stop``, or when
    this process dies however it dies (SIGKILL included), so it is never left behind.
    (Not PR_SET_PDEATHSIG: that fires when the *thread* that started the child ends, and
    kproxy starts it from a worker thread.)
    """

    routes = PROBE_PATHS

    def __init__(self, read_timeout: float = READ_TIMEOUT_S):
        self.read_timeout = read_timeout
        self.process: subprocess.Popen | None = None
        self.address: tuple[str, int] | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.address is not None

    def start(self, board: Board, host: str, port: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _CHILD, ",".join(map(str, board.descriptors)), host,
             str(port), repr(self.read_timeout)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=board.descriptors,
            process_group=0)              # a terminal's Ctrl-C is for kproxy, which stops it
        line = self._first_line()
        kind, _, detail = line.partition(" ")
        if kind == "listening":
            bound_host, _, bound_port = detail.rpartition(" ")
            self.address = (bound_host, int(bound_port))
            return
        self.stop()
        if kind == "error":
            raise OSError(f"probe_listen {host}:{port}: {detail}")
        raise OSError(f"probe_listen {host}:{port}: the probe process did not start ({line or 'no word'})")

    def _first_line(self) -> str:
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            if not selector.select(START_TIMEOUT_S):
                return f"no answer within {START_TIMEOUT_S:g}s"
        return self.process.stdout.readline().decode("utf-8", "replace").strip()

    def stop(self) -> None:
        process, self.process, self.address = self.process, None, None
        if process is None:
            return
        process.stdin.close()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()
