"""Capture files on disk: where they may go, names, 0600 creation, rotation, the size cap.

Where: ``directory_in_root`` decides whether a capture directory is acceptable
under the operator's ``capture_root`` (no ``..``, no symbolic link below the
root, absolute paths only inside it). Files are then created by walking the
directory's path from ``/`` one component at a time with ``O_NOFOLLOW``, so a
symbolic link swapped in after that check is refused too, never followed.

Names are ``<prefix>-<UTC yyyymmddThhmmss>-<seq>.<ext>``, so a plain sort is
chronological. Files are created with ``O_EXCL`` and mode 0600 (captures hold
client traffic), directories with 0700 if kproxy creates them.

Rotation: a sink closes its file when the next write would take it past
``rotate_bytes`` (a single larger item still gets written, alone) or when
the file is ``rotate_seconds`` old and not empty; the next write opens a new
one, so an idle capture leaves no trail of empty files. The first file of
each format is created when the capture starts, so a directory that cannot
be written fails ``start`` at once.

Cap: only the files this session created count, remembered by name and inode
(a file someone put in their place is not ours). After each rotation the
oldest closed ones are deleted until closed files + ``rotate_bytes`` per open
file fit in ``max_total_bytes``. Other files in the directory, earlier
sessions' included, are never counted, listed or deleted.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import stat
import time
from typing import BinaryIO

log = logging.getLogger("kproxy.capture")

EXTENSIONS = (".jsonl", ".parquet", ".pcapng")
_seq = itertools.count(1)       # process-wide: two sessions in one second never collide
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def directory_in_root(root: str, directory: str, key: str = "capture.directory") -> str:
    """The absolute capture directory for ``directory`` (a relative one is taken under
    ``root``), or ValueError naming ``key``: ``..`` anywhere, an absolute path outside
    ``root``, or a symbolic link at any existing component below ``root``. ``root``
    must be absolute and already resolved (the config resolves it once, at start)."""
    if not directory or "\x00" in directory:
        raise ValueError(f"{key}: required (a path without NUL bytes)")
    if ".." in directory.split("/"):
        raise ValueError(f"{key}: '..' is not allowed, got {directory!r}")
    path = os.path.normpath(os.path.join(root, directory))       # an absolute directory wins
    if os.path.commonpath([path, root]) != root:
        raise ValueError(f"{key}: {directory!r} is outside capture_root {root!r}")
    current = root
    for part in os.path.relpath(path, root).split(os.sep):
        if part == ".":
            continue
        current = os.path.join(current, part)
        if os.path.islink(current):
            raise ValueError(f"{key}: {current!r} is a symbolic link; captures never follow one")
    return path


def open_directory(path: str, create: bool = False) -> int:
    """A file descriptor of directory ``path`` (absolute), opened one component at a time
    from ``/`` without following symbolic links; missing components are created (0700)
    when ``create``. OSError if any component is a link or not a directory."""
    fd = os.open("/", _DIR_FLAGS)
    try:
        for part in [p for p in path.split("/") if p]:
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o700, dir_fd=fd)
                except FileExistsError:            # created meanwhile: opened (or refused) below
                    pass
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(part, fd):
                    raise OSError(errno.ELOOP, f"{path}: {part!r} is a symbolic link; "
                                               f"captures never follow one") from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


class FileSet:
    """The files of one capture session, shared by its sinks."""

    def __init__(self, directory: str, prefix: str, rotate_bytes: int, rotate_seconds: float,
                 max_total_bytes: int, counters):
        self.directory = os.path.abspath(directory)
        self.prefix = prefix
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self.max_total_bytes = max_total_bytes
        self.counters = counters           # the Capture: files_opened / files_deleted
        self.open_paths: set[str] = set()
        self.on_finished = None            # called with each file's path once it is closed whole (uploads)
        # name -> (st_dev, st_ino) of every file this session created and has not deleted,
        # oldest first: the only files the cap may count or delete.
        self.written: dict[str, tuple[int, int]] = {}
        os.close(open_directory(self.directory, create=True))

    def create(self, ext: str) -> tuple[str, BinaryIO]:
        """A new, empty file opened for writing (mode 0600). Raises OSError."""
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        dir_fd = open_directory(self.directory)
        try:
            for _ in range(100):
                name = f"{self.prefix}-{stamp}-{next(_seq):06d}{ext}"
                try:
                    fd = os.open(name, _FILE_FLAGS, 0o600, dir_fd=dir_fd)
                except FileExistsError:
                    continue
                st = os.fstat(fd)
                self.written[name] = (st.st_dev, st.st_ino)
                path = os.path.join(self.directory, name)
                self.open_paths.add(path)
                self.counters.files_opened += 1
                return path, os.fdopen(fd, "wb", buffering=1024 * 1024)
        finally:
            os.close(dir_fd)
        raise FileExistsError(f"no free capture file name in {self.directory}")

    def closed(self, path: str) -> None:
        self.open_paths.discard(path)

    def ours(self, dir_fd: int) -> list[tuple[str, int]]:
        """(name, size) of the files this session wrote that are still there, oldest first.
        A file gone or replaced (another inode under the name) is forgotten, never touched."""
        found = []
        for name, identity in list(self.written.items()):
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is None or (st.st_dev, st.st_ino) != identity:
                del self.written[name]
                continue
            found.append((name, st.st_size))
        return found

    def enforce_cap(self) -> None:
        """Delete our oldest closed files until the cap holds with every open file at full size."""
        dir_fd = open_directory(self.directory)
        try:
            closed = [(name, size) for name, size in self.ours(dir_fd)
                      if os.path.join(self.directory, name) not in self.open_paths]
            budget = self.max_total_bytes - self.rotate_bytes * len(self.open_paths)
            total = sum(size for _, size in closed)
            for name, size in closed:
                if total <= budget:
                    break
                try:
                    os.unlink(name, dir_fd=dir_fd)
                except FileNotFoundError:
                    pass
                del self.written[name]
                total -= size
                self.counters.files_deleted += 1
                log.info("capture: deleted %s to stay under max_total_bytes=%d",
                         os.path.join(self.directory, name), self.max_total_bytes)
        finally:
            os.close(dir_fd)


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
        if self.files.on_finished is not None:
            self.files.on_finished(self.path)

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
