"""Class-data sharing for the Kafka JVMs this package starts: tools, storage formatting, brokers.

A Kafka tool spends most of a short run loading and verifying classes; a dynamic CDS
archive holds them already parsed and the JVM maps it instead: a ``kafka-topics --list``
takes 0.8 CPU seconds instead of 1.5 on two cores. One archive per jar directory of a
Kafka install (``tools-lib`` for the tools, ``lib`` for formatting and the brokers), kept
beside the jars under a name keyed by the java binary and the jars, so another Java or
another set of jars gets an archive of its own.

The first short-lived JVM of a directory records the archive as it exits
(``-XX:ArchiveClassesAtExit``, Java 13+) into a file of its own, renamed into place once
the process has ended by itself; every later JVM maps it (``-XX:SharedArchiveFile``).
Brokers only map: they are killed, not exited, so they never record. The JVM checks an
archive against its own runtime and class path and ignores one that does not match
(``-Xshare:auto``, the default): a stale archive costs the time it would have saved,
never a failure.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path

ARCHIVE_PREFIX = "classes-"
# The JVM's own lines about the archive (classes it cannot store, a mismatch it ignores)
# would land in a tool's stdout, which tests and users read.
QUIET = "-Xlog:cds*=off"
# A recording left by a JVM stopped part way is removed by a later run once this old.
STALE_PARTIAL_S = 3600.0
KAFKA_ARCHIVES_ENV = "KPROXY_KAFKA_CLASS_ARCHIVES"      # "0": start Kafka's JVMs without one
_recordings = itertools.count()


def _key(java: str, jars: Path) -> str:
    """What an archive depends on: the java binary and the jars (names, sizes, times)."""
    real = os.path.realpath(java)
    stat = os.stat(real)
    digest = hashlib.sha256(f"{real}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    for jar in sorted(jars.glob("*.jar")):
        jar_stat = jar.stat()
        digest.update(f"{jar.name}\0{jar_stat.st_size}\0{jar_stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class ClassArchive:
    """The archive for one jar directory and one java: mapped if present, else recorded."""
    path: Path
    recording: Path | None = None          # where this JVM writes it, renamed when whole

    @classmethod
    def for_jars(cls, java: str, jars: Path, record: bool = True) -> ClassArchive | None:
        """None when switched off, when nothing is to be mapped and ``record`` is false, or
        when the directory cannot be written."""
        if os.environ.get(KAFKA_ARCHIVES_ENV) == "0":
            return None
        try:
            path = jars.parent / f"{ARCHIVE_PREFIX}{jars.name}-{_key(java, jars)}.jsa"
        except OSError:
            return None
        if path.is_file():
            return cls(path)
        if not record or not os.access(jars.parent, os.W_OK):
            return None
        _remove_stale_partials(jars.parent)
        return cls(path, jars.parent / f"{path.name}.{os.getpid()}-{next(_recordings)}.partial")

    def jvm_args(self) -> list[str]:
        if self.recording is not None:
            return [QUIET, f"-XX:ArchiveClassesAtExit={self.recording}"]
        return [QUIET, f"-XX:SharedArchiveFile={self.path}"]

    def finish(self, returncode: int | None) -> None:
        """After the JVM has ended: keep what it recorded if it exited by itself."""
        if self.recording is None:
            return
        if returncode is not None and returncode >= 0 and self.recording.is_file() \
                and self.recording.stat().st_size:
            os.replace(self.recording, self.path)       # atomic; a JVM mapping the old file keeps it
        else:
            self.recording.unlink(missing_ok=True)


def _remove_stale_partials(directory: Path) -> None:
    for partial in directory.glob(f"{ARCHIVE_PREFIX}*.partial"):
        try:
            if time.time() - partial.stat().st_mtime > STALE_PARTIAL_S:
                partial.unlink()
        except OSError:
            pass                                     # another run removed or renamed it
