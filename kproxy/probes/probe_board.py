"""The probe board: shared memory where each proxy process posts its heartbeat and readiness.

The probe process (``probe_server``) answers ``/healthz`` and ``/readyz`` without
the proxy's interpreter lock, so it cannot ask the proxy's objects: it reads this
board instead. One slot per proxy process (one without workers, N with
``--workers N``), each written by that process's event loop alone, and a request
field per slot written by the probe process alone ("a probe wants a readiness
answer newer than this"), with an eventfd per slot to wake that slot's event loop
at once rather than at its next heartbeat. Times are ``time.monotonic()``:
CLOCK_MONOTONIC is system-wide on Linux, so a time written by one process is
comparable in another.

The memory is a ``memfd`` (no file left behind by a kill): its descriptor and the
eventfds go to the probe process with ``subprocess.Popen(pass_fds=...)`` and to
workers inside multiprocessing's arguments (``Board.__reduce__``). Every record is a seqlock
(odd while being written; a reader retries until it reads the same even number
before and after) with a CRC32 of the payload, so a reader never takes a torn or
half-ordered write for an answer. Stdlib only: the probe process imports this.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from dataclasses import dataclass

# A reason longer than this (many unbound listeners) is cut: a probe's body names the
# first of them, the admin port's /readyz has them all.
REASON_BYTES = 1024
# A record being rewritten is read again up to this many times (a write takes microseconds);
# after that the reader keeps the last state it read whole (the writer is stopped mid-write).
READ_ATTEMPTS = 1000
_MAGIC = b"KPB1"
_HEADER = struct.Struct("<4sI")                 # magic, slot count
_HEADER_BYTES = 64
_SEQ = struct.Struct("<Q")
_FRAME = struct.Struct("<QII")                  # seq, crc32 of the payload, payload length
# pid, ready, heartbeat, readiness checked at, stall limit, then the reason (utf-8)
_STATE = struct.Struct("<iB3xddd")
_REQUEST = struct.Struct("<d")                  # a probe asked for readiness at
_STATE_BYTES = _FRAME.size + _STATE.size + REASON_BYTES
_REQUEST_BYTES = _FRAME.size + _REQUEST.size
_SLOT_BYTES = -(-(_STATE_BYTES + _REQUEST_BYTES) // 64) * 64     # whole cache lines


@dataclass(frozen=True)
class SlotState:
    """What one proxy process last posted. ``pid`` 0 and ``beat`` 0.0: no event loop has
    written since the slot was created or reset (``reason`` then says why)."""
    pid: int = 0
    ready: bool = False
    beat: float = 0.0              # when its event loop last turned
    checked_at: float = 0.0        # when ``ready``/``reason`` were established
    stall_limit: float = 0.0       # /healthz is 503 once ``beat`` is older than this
    reason: str = "starting"

    @property
    def running(self) -> bool:
        return self.beat > 0.0


def _attach_passed(duplicated: list) -> "Board":
    memory, *wakers = (fd.detach() for fd in duplicated)
    return Board.attach(memory, wakers)


class Board:
    """``Board.create(slots)`` in the process that owns it; the others get its descriptors
    (``descriptors``: the memory's, then one eventfd per slot) and ``attach``."""

    def __init__(self, fd: int, wakers: list[int]):
        self.fd, self.wakers, self.slots = fd, wakers, len(wakers)
        self._map = mmap.mmap(fd, _HEADER_BYTES + self.slots * _SLOT_BYTES)
        self._last: dict[int, SlotState] = {}   # per slot, the last state read whole

    @classmethod
    def create(cls, slots: int) -> "Board":
        fd = os.memfd_create("kproxy-probe-board")                  # close-on-exec
        os.ftruncate(fd, _HEADER_BYTES + slots * _SLOT_BYTES)      # zeros: nothing written
        board = cls(fd, [os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC) for _ in range(slots)])
        board._map[:_HEADER.size] = _HEADER.pack(_MAGIC, slots)
        return board

    @classmethod
    def attach(cls, fd: int, wakers: list[int]) -> "Board":
        """The board behind ``fd`` and its slots' eventfds (passed by its creator)."""
        slots = len(wakers)
        if os.fstat(fd).st_size == _HEADER_BYTES + slots * _SLOT_BYTES:
            board = cls(fd, wakers)
            if _HEADER.unpack(board._map[:_HEADER.size]) == (_MAGIC, slots):
                return board
            board._map.close()
        raise ValueError(f"descriptor {fd} is not a probe board of {slots} slots")

    @property
    def descriptors(self) -> tuple[int, ...]:
        return (self.fd, *self.wakers)

    def __reduce__(self):
        """Pickled into a spawned worker's arguments: the descriptors travel with them."""
        from multiprocessing.reduction import DupFd
        return _attach_passed, ([DupFd(fd) for fd in self.descriptors],)

    def close(self) -> None:
        self._map.close()
        for fd in self.descriptors:
            os.close(fd)

    # ------------------------------------------------------------ seqlocked records

    # Every store and load below is a slice of the map (one memcpy of bytes packed beforehand),
    # never struct.pack_into/unpack_from on the map itself: pack_into zeroes its target before
    # filling it in, and a reader in another process would see that zero sequence number.

    def _write(self, offset: int, payload: bytes) -> None:
        seq_end = offset + _SEQ.size
        seq, = _SEQ.unpack(self._map[offset:seq_end])
        begin = seq + 1 if seq % 2 == 0 else seq + 2            # odd: being written
        self._map[offset:seq_end] = _SEQ.pack(begin)
        self._map[seq_end:seq_end + _FRAME.size - _SEQ.size + len(payload)] = \
            struct.pack("<II", zlib.crc32(payload), len(payload)) + payload
        self._map[offset:seq_end] = _SEQ.pack(begin + 1)

    def _read(self, offset: int, limit: int) -> bytes | None:
        """The record's payload (b"" if never written), or None if no whole read succeeded."""
        start, seq_end = offset + _FRAME.size, offset + _SEQ.size
        for _ in range(READ_ATTEMPTS):
            seq, crc, length = _FRAME.unpack(self._map[offset:start])
            if seq == 0:
                return b""
            if seq % 2 or length > limit:
                continue
            payload = self._map[start:start + length]
            if self._map[offset:seq_end] == _SEQ.pack(seq) and zlib.crc32(payload) == crc:
                return payload
        return None

    def _slot(self, index: int) -> int:
        if not 0 <= index < self.slots:
            raise IndexError(f"slot {index} of {self.slots}")
        return _HEADER_BYTES + index * _SLOT_BYTES

    # ------------------------------------------------------------ the proxy's side

    def post(self, index: int, state: SlotState) -> None:
        """Write slot ``index`` (only its own process's event loop, or ``reset``, does)."""
        reason = state.reason.encode("utf-8", "replace")
        if len(reason) > REASON_BYTES:
            reason = reason[:REASON_BYTES - 3].decode("utf-8", "ignore").encode() + b"..."
        self._write(self._slot(index), _STATE.pack(state.pid, state.ready, state.beat, state.checked_at,
                                                   state.stall_limit) + reason)

    def reset(self, index: int, reason: str, now: float) -> None:
        """Slot ``index`` is nobody's (its process is gone): no heartbeat to judge until
        its successor posts; ``reason`` is the readiness answer meanwhile."""
        self.post(index, SlotState(reason=reason, checked_at=now))

    def woken(self, index: int) -> None:
        """Slot ``index``'s event loop read its wake-up (``wake``) and will look at the board."""
        try:
            os.eventfd_read(self.wakers[index])
        except BlockingIOError:                  # nothing pending
            pass

    def asked(self, index: int) -> float:
        """When a probe last asked for a readiness answer newer than what slot ``index`` has."""
        payload = self._read(self._slot(index) + _STATE_BYTES, _REQUEST.size)
        return _REQUEST.unpack(payload)[0] if payload else 0.0

    # ------------------------------------------------------------ the probe process's side

    def read(self, index: int) -> SlotState:
        payload = self._read(self._slot(index), _STATE.size + REASON_BYTES)
        if payload is None:                          # its writer stopped mid-write
            return self._last.get(index, SlotState())
        if not payload:
            return SlotState()
        pid, ready, beat, checked_at, stall_limit = _STATE.unpack_from(payload)
        state = SlotState(pid, bool(ready), beat, checked_at, stall_limit,
                          payload[_STATE.size:].decode("utf-8", "replace"))
        self._last[index] = state
        return state

    def ask(self, index: int, at: float) -> None:
        """Ask slot ``index``'s event loop for a readiness answer checked at ``at`` or later,
        and wake it (it also looks at every heartbeat, should no loop be listening now)."""
        self._write(self._slot(index) + _STATE_BYTES, _REQUEST.pack(at))
        os.eventfd_write(self.wakers[index], 1)
