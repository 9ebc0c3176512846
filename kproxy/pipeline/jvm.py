"""A faster start for the Spark JVM that ``kproxy analyze`` launches itself: class-data sharing.

Before its first job the driver JVM loads and verifies some twenty thousand classes
(Spark, Scala, Parquet, Janino), most of a local run's start. A class-data sharing
(CDS) archive holds them already parsed, and the JVM maps it instead. The first local
run records the classes it loaded when its JVM exits (``-XX:ArchiveClassesAtExit``,
Java 13 and later, so every Java that Spark 4 runs on); later runs map that archive
(``-XX:SharedArchiveFile``). It lives in kproxy's cache directory under a name keyed
by the Java runtime and the Spark jars, so an upgrade of either records a new one. The
JVM checks an archive against its own runtime and class path and ignores one that does
not match (``-Xshare:auto``, the default): a stale archive costs the time it would have
saved, never a failure.

Only a JVM kproxy starts gets these options; under ``spark-submit`` nothing is added.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ARCHIVE_PREFIX = "spark-classes-"
# The JVM writes its archive as it exits: ~170 MB, seconds on an idle machine, minutes on
# one loaded fifty times over. The run that records it waits this long, then leaves it
# (a later run records it again).
ARCHIVE_WAIT_S = 600.0
# An archive being written by a JVM that was stopped part way is removed by a later run
# once it is this old.
STALE_PARTIAL_S = 3600.0
# Captures up to this many pairs get a JVM that compiles with its quick tier only
# (``-XX:TieredStopAtLevel=1``): their run is mostly one-off planning and code generation,
# which the optimising tier spends more CPU compiling than it then saves. Measured at
# 1,000 pairs: 26 against 40 CPU seconds for the whole run. A large capture's hot loops
# want the optimising tier, and were not measured with it off, so they keep it.
QUICK_JIT_MAX_PAIRS = 50_000
# Heap for a local run over a capture whose size the Parquet footers tell: the job keeps no
# large capture's pairs in memory (each table reads its columns from the files, and its
# aggregation state grows with its groups, not with the pairs), so more heap buys no speed,
# only a JVM that grows towards it: 10 M pairs with a 6 GiB heap peaked at 2.9 GB RSS. With
# this heap the JVM (heap, plus ~0.5 GB of classes, code and native buffers) stays under
# 2 GiB; measured at 10 M and 100 M pairs (benchmarks/README.md). A capture of unknown
# size (JSONL, a topic) keeps the machine's share: its disk cache is built in the heap.
SIZED_HEAP_MB = 1280
# The JVM's own lines about the archive (classes it cannot store, a mismatch it ignores)
# would land on kproxy's stdout: they say nothing a user can act on.
QUIET = "-Xlog:cds*=off"


def cache_dir() -> Path:
    """``$KPROXY_CACHE_DIR``, else ``~/.cache/kproxy`` (where kproxy keeps Kafka's jars too)."""
    configured = os.environ.get("KPROXY_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "kproxy"


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(java) if java and os.access(java, os.X_OK) else None


def _key() -> str | None:
    """What an archive depends on: the java binary and the Spark jars (names and sizes)."""
    java = _java()
    if java is None:
        return None
    import pyspark
    jars = Path(pyspark.__file__).parent / "jars"
    digest = hashlib.sha256()
    stat = os.stat(java)
    digest.update(f"{java}\0{stat.st_size}\0{stat.st_mtime_ns}\0{pyspark.__version__}\0".encode())
    for jar in sorted(jars.glob("*.jar")):
        digest.update(f"{jar.name}\0{jar.stat().st_size}\0".encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class ClassArchive:
    """The archive for this Java and Spark: mapped if present, else recorded by this run."""
    path: Path
    recording: Path | None = None          # where this run's JVM writes it, renamed when whole

    @classmethod
    def for_this_run(cls, directory: Path | None = None) -> ClassArchive | None:
        """None when there is no java to key by or no writable cache directory."""
        key = _key()
        if key is None:
            return None
        directory = directory or cache_dir()
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None
        path = directory / f"{ARCHIVE_PREFIX}{key}.jsa"
        if path.is_file():
            return cls(path)
        if not os.access(directory, os.W_OK):
            return None
        _remove_stale_partials(directory)
        return cls(path, directory / f"{path.name}.{os.getpid()}.partial")

    def java_options(self) -> str:
        """Driver JVM options (``spark.driver.extraJavaOptions``)."""
        if self.recording is not None:
            return f"{QUIET} -XX:ArchiveClassesAtExit={self.recording}"
        return f"{QUIET} -XX:SharedArchiveFile={self.path}"

    def finish(self, spark) -> bool:
        """After a run that records the archive: stop its JVM, wait, keep the archive.

        The JVM writes the archive as it exits, and it exits when its stdin closes (the
        PySpark gateway's way of following its Python), so the archive is whole once the
        process is gone. True when this run saved it; a run that maps one does nothing.
        """
        if self.recording is None:
            return False
        from pyspark import SparkContext
        process = getattr(SparkContext._gateway, "proc", None)
        spark.stop()
        if process is None or process.stdin is None:
            return False
        process.stdin.close()
        try:
            process.wait(timeout=ARCHIVE_WAIT_S)
        except subprocess.TimeoutExpired:
            return False                            # left to finish; removed later if stale
        if process.returncode == 0 and self.recording.is_file() and self.recording.stat().st_size:
            os.replace(self.recording, self.path)
            return True
        self.recording.unlink(missing_ok=True)
        return False


def _remove_stale_partials(directory: Path) -> None:
    for partial in glob.glob(str(directory / f"{ARCHIVE_PREFIX}*.partial")):
        try:
            if time.time() - os.stat(partial).st_mtime > STALE_PARTIAL_S:
                os.unlink(partial)
        except OSError:
            pass                                    # another run removed or renamed it


def heap_mb(pairs: int | None, machine_mb: int) -> int:
    """The local driver's heap for a capture of ``pairs`` (None: unknown), at most ``machine_mb``."""
    return machine_mb if pairs is None else min(machine_mb, SIZED_HEAP_MB)


def jit_options(pairs: int | None) -> str:
    """Driver JVM options for a capture of ``pairs`` (None: unknown, e.g. JSONL)."""
    return "-XX:TieredStopAtLevel=1" if pairs is not None and pairs <= QUICK_JIT_MAX_PAIRS else ""
