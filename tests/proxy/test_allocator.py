"""kproxy run tunes glibc's malloc so MB-sized frame buffers come from the heap."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import ctypes, ctypes.util, sys
from kproxy.allocator import tune_allocator, MALLOC_MMAP_THRESHOLD

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                 "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
if not hasattr(libc, "mallinfo2"):
    print("skip"); sys.exit(0)
libc.mallinfo2.restype = MallInfo2
tuned = tune_allocator() if sys.argv[1] == "tuned" else False
keep = [bytearray(4 * 1024 * 1024) for _ in range(8)]     # frame-sized buffers, kept
print(tuned, libc.mallinfo2().hblks)                        # hblks: chunks served by mmap
"""


@pytest.mark.parametrize("mode", ["default", "tuned"])
def test_frame_sized_buffers_come_from_the_heap_once_tuned(mode):
    out = subprocess.run([sys.executable, "-c", CHECK, mode], capture_output=True, text=True,
                         check=True, env={"PATH": "/usr/bin:/bin"}).stdout.split()
    if out == ["skip"]:
        pytest.skip("not glibc >= 2.33")
    tuned, mmapped = out[0] == "True", int(out[1])
    if mode == "tuned":
        assert tuned and mmapped < 8
    else:
        assert not tuned and mmapped >= 8      # glibc's default: each one its own mapping


def test_an_operators_malloc_environment_wins():
    out = subprocess.run([sys.executable, "-c", "from kproxy.allocator import tune_allocator; "
                          "print(tune_allocator())"], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "MALLOC_MMAP_THRESHOLD_": "1048576"}).stdout
    assert out.strip() == "False"
