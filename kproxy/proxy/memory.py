"""The relay's memory: where reads land, and what incomplete frames may hold.

- ``ReadArena``: one read buffer for every connection of an event loop; bytes are
  handed on as views and never overwritten while anything can still see them.
- ``BufferBudget``: bytes all connections of a loop hold in incomplete frames; over the
  limit the sides holding them stop being read (all but one), and after a burst the
  heap's free pages go back to the system (``allocator.give_back_memory``).
- ``loop_read_arena``/``loop_buffer_budget``: one of each per event loop.

Used by ``relay`` alone (its ``Endpoint`` reads into the arena and reports to the budget).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import weakref
from typing import TYPE_CHECKING, Callable

from ..allocator import give_back_memory
from .unsent import UnsentAnswers

if TYPE_CHECKING:
    from .relay import Endpoint

log = logging.getLogger("kproxy.relay")

# Most one read takes (an arena buffer's size). Frames of 1 KiB-record traffic are ~1 MiB
# (Produce requests up to max.request.size, Fetch answers max.partition.fetch.bytes per
# partition): reads this big halve the reads, writes and wake-ups per GB against 256 KiB,
# measured ~15 % less CPU per GB produced. One arena per event loop, so this is per process.
READ_CHUNK = 1024 * 1024
# A read is offered at least this much room; a busy arena with less left is replaced.
MIN_READ_ROOM = 64 * 1024
# An arena buffer has this much room past one read's worth, so that a frame of about
# READ_CHUNK (Kafka's 1 MiB defaults, max.request.size and max.partition.fetch.bytes, plus
# headers) whose first bytes a read brought fits in the buffer they landed in: it is
# assembled there, and those bytes (a quarter of such a frame) are not copied.
ARENA_SLACK = 64 * 1024
# Bytes all connections of a process may hold in incomplete frames (each kept whole for
# the observers) before kproxy stops reading the sides that hold them: backpressure,
# not an out-of-memory kill. A quarter of the container's memory limit where one is
# set (the rest: the interpreter, observers' queues, transports' write buffers), else this.
DEFAULT_BUFFER_BUDGET = 256 * 1024 * 1024
# While frames and unsent answers pass the budget, a broker is read this much at a time: a
# connection whose client takes nothing adds at most this past the budget before it is
# squeezed (see unsent.py), not a whole READ_CHUNK.
OVER_BUDGET_READ_BYTES = 64 * 1024
# Of that, what frames assembled in place (a buffer allocated whole when the frame starts,
# reads landing straight in it) may have allocated and not yet received.
ASSEMBLY_SHARE = 0.25
CONTAINER_MEMORY_LIMIT_FILES = ("/sys/fs/cgroup/memory.max",                    # cgroup v2
                                "/sys/fs/cgroup/memory/memory.limit_in_bytes")  # cgroup v1
# Memory freed after a burst stays with the process (frames freed out of order leave holes
# in the heap that glibc keeps: 2,000 half-frames left RSS at ~315 MB once they closed).
# When the bytes held in incomplete frames, having reached at least this, fall to a
# quarter of their peak, the heap's free pages go back to the system: a burst worth a
# trim. Ordinary traffic holds far less (a few reads per connection in progress).
TRIM_AFTER_BURST_BYTES = 32 * 1024 * 1024
# ... once they have stayed down this long (a burst that goes on is not trimmed midway),
TRIM_QUIET_S = 1.0
# ... and at most once per this: a trim costs milliseconds (in a worker thread) and the
# next burst's pages must be faulted in again.
TRIM_MIN_INTERVAL_S = 10.0


# sys.getrefcount of an arena's buffer inside ``ReadArena.room`` when nothing else holds
# it: the attribute (or the spare list), the local name, the call's argument.
_UNSHARED_REFS = 3
# Buffers an arena keeps for reuse once whoever still refers to them (the tracker
# gathering a large frame out of several reads, a transport that could not send them at
# once, an observer) lets go: a fresh one costs a zero fill of READ_CHUNK, and a frame
# spanning reads holds one per read. At most this many (4 MiB) sit unused per event loop.
ARENA_SPARES = 4
# Buffers large frames were assembled in (see Connection's ``assemble``), kept for the next
# ones once nothing refers to them (a fresh one costs a zero fill and page faults), at most
# this many, and none bigger than FRAME_SPARE_MAX_BYTES (rarer frames are not worth holding).
FRAME_SPARES = 4
FRAME_SPARE_MAX_BYTES = 4 * 1024 * 1024
# A frame is assembled in the read buffer its start landed in only if it takes at least
# 1/this of that buffer: the buffer is the frame's until it completes, and a 128 KiB frame
# holding a whole 1 MiB buffer cost 9x its bytes (2,000 clients each sending half of one
# and stopping: 596 KiB of RSS per connection). Smaller frames get a buffer of their own
# size (their start copied: less than a read). Kafka's 1 MiB frames still land in place.
IN_PLACE_MIN_SHARE = 2


class ReadArena:
    """Where reads land: one buffer for every connection of an event loop.

    A read gets the free end of the buffer; its bytes are handed on as a
    ``memoryview`` of it, which the tracker keeps (large frames are views of
    the reads they came in) and a transport may keep while it cannot send them
    yet. The buffer is reused from the start as soon as nothing refers to it
    any more (the usual case: the other socket took the bytes at once), else
    the next read goes after the last one, and another buffer is taken when too
    little is left: a spare that nothing refers to any more, or a fresh one.
    Bytes are never overwritten while anything can still see them, and never
    copied to keep them safe. The loop calls ``get_buffer``/``buffer_updated``
    of one read back to back, so reads of different connections never interleave.
    """

    __slots__ = ("_buffer", "_offset", "_spares", "_frames")

    def __init__(self):
        self._buffer: bytearray | None = None
        self._offset = 0
        self._spares: list[bytearray] = []      # earlier buffers, still referred to when left
        self._frames: list[bytearray] = []      # buffers large frames were assembled in

    def room(self) -> memoryview:
        buffer = self._buffer
        if buffer is not None and sys.getrefcount(buffer) == _UNSHARED_REFS:
            self._offset = 0                     # nobody can see earlier reads any more
        elif buffer is None or len(buffer) - self._offset < MIN_READ_ROOM:
            buffer = self._buffer = self._another(buffer)
            self._offset = 0
        return memoryview(buffer)[self._offset:self._offset + READ_CHUNK]

    def _another(self, full: bytearray | None) -> bytearray:
        """A buffer nothing refers to: a spare, or a new one; ``full`` becomes a spare."""
        spares = self._spares
        free = None
        for spare in spares:                     # (not enumerate: its tuple is one more reference)
            if sys.getrefcount(spare) == _UNSHARED_REFS:
                free = spare
                break
        if free is not None:
            spares[:] = [spare for spare in spares if spare is not free]   # (remove() compares contents)
        if full is not None:
            self._spare(full)
        return free if free is not None else bytearray(READ_CHUNK + ARENA_SLACK)

    def _spare(self, buffer: bytearray) -> None:
        """Keep ``buffer`` for reuse once nothing refers to it any more."""
        spares = self._spares
        if len(spares) >= ARENA_SPARES:
            spares.pop(0)                        # the oldest: likeliest to be held longest
        spares.append(buffer)

    def filled(self, nbytes: int) -> None:
        self._offset += nbytes

    def frame_buffer(self, nbytes: int, start) -> tuple[bytearray, int]:
        """Where to assemble a large frame of ``nbytes`` whose first bytes, ``start``, the
        last read brought: the rest of the buffer that read landed in if the frame fits
        there (no copy; the buffer is then the frame's, and a spare once let go), else a
        buffer of at least ``nbytes`` (at most twice that) from offset 0: an earlier one
        nothing refers to any more, or a fresh one (then kept for reuse)."""
        buffer = self._buffer
        if (buffer is not None and memoryview(start).obj is buffer
                and nbytes * IN_PLACE_MIN_SHARE >= len(buffer)):
            base = self._offset - len(start)     # a read's bytes end where the arena's offset is
            if base + nbytes <= len(buffer):
                self._spare(buffer)              # the next read takes another buffer
                self._buffer = None
                return buffer, base
        frames = self._frames
        for spare in frames:                     # (not enumerate: its tuple is one more reference)
            if nbytes <= len(spare) <= 2 * nbytes and sys.getrefcount(spare) == _UNSHARED_REFS:
                return spare, 0
        buffer = bytearray(nbytes)
        if nbytes <= FRAME_SPARE_MAX_BYTES:
            if len(frames) >= FRAME_SPARES:
                frames.pop(0)
            frames.append(buffer)
        return buffer, 0


# Worker processes sharing the machine (``kproxy run --workers``) share the budget too;
# set by ``share_budget`` (``workers.become_worker``).
_budget_shares = 1


def share_budget(workers: int) -> None:
    """This process is one of ``workers``: its buffer budget is a 1/workers share."""
    global _budget_shares
    _budget_shares = workers


def buffer_budget_limit() -> int:
    """``DEFAULT_BUFFER_BUDGET``, or a quarter of the container's memory limit if lower;
    divided among worker processes."""
    limit = DEFAULT_BUFFER_BUDGET
    for path in CONTAINER_MEMORY_LIMIT_FILES:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            limit = min(DEFAULT_BUFFER_BUDGET, int(text) // 4)
            break
    return limit // _budget_shares


class BufferBudget:
    """Bytes held in incomplete frames by every connection of one event loop.

    Over the limit, a side whose frame grows stops being read, unless no other
    side holding a frame is still read: one always proceeds, so frames keep
    completing and freeing memory. Below the limit every paused side is read
    again; above it, once no holder is being read, the one holding the most
    (the likeliest to finish first) is.

    After a burst (``TRIM_AFTER_BURST_BYTES``), free memory goes back to the system.
    """

    def __init__(self, limit: int, trim: Callable[[], object] = give_back_memory):
        self.limit = limit
        self.held = 0
        self.peak = 0                            # most in use (held + reserved) since the last trim
        self.trims = 0                           # trims run (for tests and logs)
        self._trim = trim
        self._trim_timer: asyncio.TimerHandle | None = None
        self._last_trim = float("-inf")
        self.reserved = 0                        # allocated for frames assembled, not arrived yet
        self._reservations: dict[Endpoint, int] = {}
        self.reading: set[Endpoint] = set()      # holders still read
        self.waiting: set[Endpoint] = set()      # holders paused for the budget
        self.unsent = UnsentAnswers()            # answers clients have not taken (see unsent.py)

    def over_with_answers(self) -> bool:
        """Whether frames held and answers unsent together pass the limit."""
        return self.held + self.reserved + self.unsent.total > self.limit

    def update(self, endpoint: Endpoint, held: int) -> None:
        freed = held < endpoint.held
        self.held += held - endpoint.held
        endpoint.held = held
        if endpoint in self.waiting:             # bytes read just before the pause took hold
            if not held:
                self.waiting.discard(endpoint)
                endpoint.resume("buffer budget")
        elif not held:
            self.reading.discard(endpoint)
        elif self.held > self.limit and any(other is not endpoint for other in self.reading):
            self.reading.discard(endpoint)
            self.waiting.add(endpoint)
            endpoint.pause("buffer budget")
        else:
            self.reading.add(endpoint)
        self._note_peak()
        if freed:
            self._release()
            self._burst_over()

    def admits(self, frame_bytes: int) -> bool:
        """Whether a large frame may be assembled in a buffer of its own, allocated before its
        bytes arrive: only while all such allocations stay within ``ASSEMBLY_SHARE`` of the
        limit. A peer that announces big frames and sends nothing then costs kproxy no more
        than that, and never pauses anyone (reservations are not ``held``); past it, frames
        are gathered as they arrive (one more copy of each)."""
        return self.reserved + frame_bytes <= self.limit * ASSEMBLY_SHARE

    def reserve(self, endpoint: Endpoint, reserved: int) -> None:
        before = self._reservations.pop(endpoint, 0)
        self.reserved += reserved - before
        if reserved:
            self._reservations[endpoint] = reserved
        self._note_peak()
        if reserved < before:
            self._burst_over()

    @property
    def in_use(self) -> int:
        """Frame memory allocated now: bytes arrived plus buffers allocated whole for the rest
        (what a burst makes the process hold, and so what a trim after it gives back)."""
        return self.held + self.reserved

    def _note_peak(self) -> None:
        if self.in_use > self.peak:
            self.peak = self.in_use

    def forget(self, endpoint: Endpoint) -> None:
        """The connection closed: its frames are gone."""
        self.held -= endpoint.held
        endpoint.held = 0
        self.reserved -= self._reservations.pop(endpoint, 0)
        self.reading.discard(endpoint)
        self.waiting.discard(endpoint)
        self.unsent.drained(endpoint)
        self._release()
        self._burst_over()

    def _burst_over(self) -> None:
        """Held bytes fell: if a burst is over, give memory back once things stay quiet."""
        if (self.peak < TRIM_AFTER_BURST_BYTES or self.in_use > self.peak // 4
                or self._trim_timer is not None):
            return
        loop = asyncio.get_running_loop()
        delay = max(TRIM_QUIET_S, self._last_trim + TRIM_MIN_INTERVAL_S - loop.time())
        self._trim_timer = loop.call_later(delay, self._trim_now)

    def _trim_now(self) -> None:
        self._trim_timer = None
        if self.in_use > self.peak // 4:         # another burst began: trim after it
            return
        loop = asyncio.get_running_loop()
        self.peak = self.in_use
        self._last_trim = loop.time()
        self.trims += 1
        log.debug("giving memory back after a burst (%d bytes still held)", self.held)
        loop.run_in_executor(None, self._trim)

    def _release(self) -> None:
        if not self.waiting:
            return
        if self.held <= self.limit:
            resumed, self.waiting = self.waiting, set()
        elif not self.reading:
            resumed = {max(self.waiting, key=lambda e: e.held)}
            self.waiting -= resumed
        else:
            return
        for endpoint in resumed:
            self.reading.add(endpoint)
            endpoint.resume("buffer budget")


_budgets: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # event loop -> its BufferBudget


_arenas: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()    # event loop -> its ReadArena


def loop_read_arena() -> ReadArena:
    """The event loop's read arena, shared by all its listeners (reads never interleave)."""
    loop = asyncio.get_running_loop()
    arena = _arenas.get(loop)
    if arena is None:
        arena = _arenas[loop] = ReadArena()
    return arena


def loop_buffer_budget() -> BufferBudget:
    loop = asyncio.get_running_loop()
    budget = _budgets.get(loop)
    if budget is None:
        budget = _budgets[loop] = BufferBudget(buffer_budget_limit())
    return budget
