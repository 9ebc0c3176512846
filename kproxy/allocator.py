"""glibc's malloc, tuned for frame-sized buffers, and made to give memory back after bursts.

Both are no-ops where the C library is not glibc (musl has no ``mallopt``/``malloc_trim``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

# glibc's malloc maps every allocation above a moving threshold (128 KiB at first) with
# mmap and unmaps it on free, so each MB-sized frame buffer arrives as fresh pages to
# fault in. That was invisible while buffers were freed at once (the threshold then
# rises), but whenever frames are kept a while (capture's queue, a slow client's
# write buffer) it cost ~0.45 ms per MB on the event loop, against ~0.05 ms with
# heap allocation (measured: 1 MB frames read in 64 KiB pieces, 60 kept).
MALLOC_MMAP_THRESHOLD = 32 * 1024 * 1024      # glibc's own ceiling for this setting
# Free memory at the top of the heap beyond this goes back to the system. Frames freed
# out of order leave their memory in the middle of the heap, which this never returns:
# ``give_back_memory`` does, after bursts (see proxy.memory.BufferBudget). glibc's own 128 KiB
# returned no more than this after 2,000 half-frames (benchmarks/bench_memory_return.py).
MALLOC_TRIM_THRESHOLD = 128 * 1024 * 1024
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3    # mallopt parameter numbers (malloc.h)


def tune_allocator() -> bool:
    """Serve frame-sized allocations from the heap (glibc only; a no-op elsewhere).

    Called once by ``kproxy run`` and ``kproxy demo`` at start. An operator's own
    ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` environment wins.
    """
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)
                and mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD))


def give_back_memory() -> bool:
    """Return the heap's free pages to the system (glibc's ``malloc_trim(0)``: all arenas,
    free pages in the middle of the heap too). Takes milliseconds on a heap of hundreds
    of MB and releases the GIL meanwhile: call it off the event loop."""
    trim = _libc_function("malloc_trim")
    return bool(trim(0)) if trim is not None else False


_functions: dict[str, object] = {}


def _libc_function(name: str):
    """A libc function by name, or None (not glibc, or no such function)."""
    if name not in _functions:
        library = ctypes.util.find_library("c")
        try:
            _functions[name] = getattr(ctypes.CDLL(library), name) if library else None
        except (OSError, AttributeError):
            _functions[name] = None
    return _functions[name]
