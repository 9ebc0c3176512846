"""Capture files on disk: names, 0600 creation, rotation, and the total-size cap.

Names are ``<prefix>-<UTC yyyymmddThhmmss>-<seq>.<ext>``, so a plain sort is
chronological. Files are created with ``O_EXCL`` and mode 0600 (captures hold
client traffic), the directory with 0700 if kproxy creates it.

Rotation: a sink closes its file when the next write would take it past
``rotate_bytes`` (a single larger item still gets written, alone) or when
the file is ``rotate_seconds`` old and not empty; the next write opens a new
one, so an idle capture leaves no trail of empty files. The first file of
each format is created when the capture starts, so a directory that cannot
be written fails ``start`` at once.

Cap: every file in the directory with our prefix and a capture extension
counts, earlier sessions' included. After each rotation the oldest closed
files are deleted until closed files + ``rotate_bytes`` per open file fit
in ``max_total_bytes``.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from typing import BinaryIO

log = logging.getLogger("kproxy.capture")

EXTENSIONS = (".jsonl", ".parquet", ".pcapng")
_seq = itertools.count(1)       # process-wide: two sessions in one second never collide


class FileSet:
    """The files of one capture session, shared by its sinks."""

    def __init__(self, directory: str, prefix: str, rotate_bytes: int, rotate_seconds: float,
                 max_total_bytes: int, counters):
        self.directory = directory
        self.prefix = prefix
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self.max_total_bytes = max_total_bytes
        self.counters = counters           # the Capture: files_opened / files_deleted
        self.open_paths: set[str] = set()
        os.makedirs(directory, mode=0o700, exist_ok=True)

    def create(self, ext: str) -> tuple[str, BinaryIO]:
        """A new, empty file opened for writing (mode 0600). Raises OSError."""
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        for _ in range(100):
            path = os.path.join(self.directory, f"{self.prefix}-{stamp}-{next(_seq):06d}{ext}")
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                             0o600)
            except FileExistsError:
                continue
            self.open_paths.add(path)
            self.counters.files_opened += 1
            return path, os.fdopen(fd, "wb", buffering=1024 * 1024)
        raise FileExistsError(f"no free capture file name in {self.directory}")

    def closed(self, path: str) -> None:
        self.open_paths.discard(path)

    def ours(self) -> list[tuple[float, str, int]]:
        """(mtime, path, size) of every capture file of ours in the directory."""
        found = []
        with os.scandir(self.directory) as entries:
            for entry in entries:
                name = entry.name
                if name.startswith(self.prefix + "-") and name.endswith(EXTENSIONS) and entry.is_file():
                    st = entry.stat()
                    found.append((st.st_mtime, entry.path, st.st_size))
        found.sort()
        return found

    def enforce_cap(self) -> None:
        """Delete the oldest closed files until the cap holds with every open file at full size."""
        files = self.ours()
        closed = [(mtime, path, size) for mtime, path, size in files if path not in self.open_paths]
        budget = self.max_total_bytes - self.rotate_bytes * len(self.open_paths)
        total = sum(size for _, _, size in closed)
        for _, path, size in closed:
            if total <= budget:
                break
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            total -= size
            self.counters.files_deleted += 1
            log.info("capture: deleted %s to stay under max_total_bytes=%d", path, self.max_total_bytes)


class RotatingSink:
    """A sink writing to one file at a time; subclasses write headers/footers and rows."""

    ext = ".bin"

    def __init__(self, files: FileSet):
        self.files = files
        self.path: str | None = None
        self.file: BinaryIO | None = None
        self.opened_at = 0.0
        self.items_in_file = 0

    # ----- subclass hooks
    def on_open(self) -> None:
        """Write a file header (pcapng blocks, a Parquet writer...)."""

    def on_close(self) -> None:
        """Flush buffered rows and write a footer; the file is closed afterwards."""

    def size(self) -> int:
        return self.file.tell() if self.file is not None else 0

    # ----- lifecycle
    def open(self) -> None:
        self.path, self.file = self.files.create(self.ext)
        self.opened_at = time.monotonic()
        self.items_in_file = 0
        self.on_open()

    def close(self) -> None:
        if self.file is None:
            return
        try:
            self.on_close()
            self.file.close()
        finally:
            self.files.closed(self.path)
            self.file = None

    def abandon(self) -> None:
        """Close without raising (after a disk error)."""
        try:
            self.close()
        except Exception:          # noqa: BLE001 - the disk already failed; nothing to add
            self.files.closed(self.path or "")
            self.file = None

    def rotate(self) -> None:
        """Close the current file; the next write opens a new one (so no empty files pile up)."""
        self.close()
        self.files.enforce_cap()

    def ensure_open(self) -> None:
        if self.file is None:
            self.open()
            self.files.enforce_cap()

    def before_write(self, nbytes: int) -> None:
        """Rotate first if ``nbytes`` more would pass rotate_bytes (never for an empty file)."""
        if self.file is not None and self.items_in_file and self.size() + nbytes > self.files.rotate_bytes:
            self.rotate()
        self.ensure_open()

    def tick(self, now: float) -> None:
        """Periodic: time-based rotation."""
        if self.file is not None and self.items_in_file and now - self.opened_at >= self.files.rotate_seconds:
            self.rotate()
