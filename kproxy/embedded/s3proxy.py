"""A real S3-compatible server on loopback: s3proxy (Apache 2.0, Java) over a local directory.

For tests and demos of captures uploaded to object storage and read back with
``s3a://``. s3proxy publishes a runnable ``jar-with-dependencies`` on Maven Central
(``org.gaul:s3proxy``), fetched once with Maven into ``$KPROXY_CACHE_DIR``
(``scripts/setup.sh`` does it for the test profile). It serves the S3 API with AWS
signature v2/v4 over jclouds' ``filesystem`` store, so what was uploaded is also a
plain file under ``data_dir``. It binds port 0 and the port is read back from the
line Jetty logs when its connector starts: nothing picks a port ahead.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from ._support import EmbeddedBrokerError, LOOPBACK_HOST, log_tail, spawn, terminate
from .kafka import _exclusive, default_cache_dir, java_executable

VERSION = "4.1.0"
ARTIFACT = f"org.gaul:s3proxy:{VERSION}:jar:jar-with-dependencies"
JAR = f"s3proxy-{VERSION}-jar-with-dependencies.jar"
# The jar is ~55 MB: minutes on a slow mirror, never hours.
FETCH_TIMEOUT_S = 900.0
# s3proxy starts Jetty in 2-3 s on an idle machine; a loaded one (load 30 on 2 cores) took 10.
STARTUP_TIMEOUT_S = 120.0
# Jetty's start line names the address it bound: "...ServerConnector@1a2b{HTTP/1.1, (http/1.1)}{127.0.0.1:36109}".
_BOUND = re.compile(rb"ServerConnector@\w+\{HTTP/1\.1[^}]*\}\{127\.0\.0\.1:(\d+)\}")
# A small heap: the server holds no objects in memory (they are files), and the JVM shares
# two cores with brokers and Spark. C1 only, as the test brokers (LIGHT_BROKER_JVM_ARGS).
JVM_ARGS = ("-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
DEFAULT_ACCESS_KEY = "kproxy-test"
DEFAULT_SECRET_KEY = "kproxy-test-secret"


def s3proxy_jar(cache_dir: Path | None = None) -> Path:
    """The runnable jar, fetched with Maven first if need be. Raises EmbeddedBrokerError."""
    home = (cache_dir or default_cache_dir()) / f"s3proxy-{VERSION}"
    jar = home / JAR
    if jar.exists():
        return jar
    mvn = shutil.which("mvn")
    if mvn is None:
        raise EmbeddedBrokerError(f"s3proxy is not in {home} and mvn is not on PATH: install Apache "
                                  f"Maven (Debian: apt-get install maven) to fetch it from Maven Central")
    with _exclusive(home.with_name(f"{home.name}.lock")):
        if jar.exists():                          # another process fetched it meanwhile
            return jar
        home.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(
            [mvn, "-q", "-B", "-Dstyle.color=never", "dependency:copy", f"-Dartifact={ARTIFACT}",
             f"-DoutputDirectory={home}", "-Dmdep.useBaseVersion=true"],
            capture_output=True, text=True, timeout=FETCH_TIMEOUT_S, check=False, cwd=home)
        if result.returncode != 0 or not jar.exists():
            raise EmbeddedBrokerError(f"fetching {ARTIFACT} with Maven failed:\n"
                                      f"{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return jar


class S3Proxy:
    """s3proxy serving ``data_dir`` (a fresh temporary directory by default) on 127.0.0.1.

    ::

        with S3Proxy() as s3:
            s3.endpoint_url          # http://127.0.0.1:PORT
            s3.access_key, s3.secret_key
    """

    def __init__(self, data_dir: Path | None = None, *, access_key: str = DEFAULT_ACCESS_KEY,
                 secret_key: str = DEFAULT_SECRET_KEY, cache_dir: Path | None = None,
                 startup_timeout: float = STARTUP_TIMEOUT_S):
        self.access_key = access_key
        self.secret_key = secret_key
        self._cache_dir = cache_dir
        self._startup_timeout = startup_timeout
        self.workdir = Path(tempfile.mkdtemp(prefix="kproxy-s3proxy-"))
        self.data_dir = Path(data_dir) if data_dir is not None else self.workdir / "data"
        self.log_path = self.workdir / "s3proxy.log"
        self.port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        if self.port is None:
            raise EmbeddedBrokerError("s3proxy is not running")
        return f"http://{LOOPBACK_HOST}:{self.port}"

    def __enter__(self) -> S3Proxy:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self) -> None:
        jar = s3proxy_jar(self._cache_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        properties = self.workdir / "s3proxy.conf"
        properties.write_text("\n".join((
            f"s3proxy.endpoint=http://{LOOPBACK_HOST}:0",
            "s3proxy.authorization=aws-v2-or-v4",
            f"s3proxy.identity={self.access_key}",
            f"s3proxy.credential={self.secret_key}",
            "jclouds.provider=filesystem",
            f"jclouds.filesystem.basedir={self.data_dir}",
        )) + "\n")
        self._process = spawn([java_executable(), *JVM_ARGS, "-jar", str(jar), "--properties", str(properties)],
                              self.log_path, cwd=self.workdir)
        deadline = time.monotonic() + self._startup_timeout
        while self.port is None:
            match = _BOUND.search(self.log_path.read_bytes())
            if match is not None:
                self.port = int(match[1])
                return
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()                       # the work directory stays: its log says why
                raise EmbeddedBrokerError(f"s3proxy did not start (log {self.log_path}):\n"
                                          f"{log_tail(self.log_path)}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self._process is not None:
            terminate([self._process], grace=0)     # nothing to flush: every object is a file
            self._process = None
        if self.port is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        self.port = None


if __name__ == "__main__":                        # scripts/setup.sh: python -m kproxy.embedded.s3proxy
    print(s3proxy_jar())
