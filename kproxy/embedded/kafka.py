"""Real Apache Kafka brokers on loopback, fetched from Maven Central, for tests and benchmarks.

Why real brokers: a proxy that rewrites addresses and decodes every API is only proven by
the broker that wrote the protocol. No Docker and no Kafka download site are reachable
here, but Maven Central is: Kafka publishes the broker (`kafka_2.13`) and the command-line
tools (`kafka-tools`) there as jars, and `java -cp 'lib/*' kafka.Kafka server.properties`
runs a KRaft node without the distribution's shell scripts.

Layout of one fetched version (``fetch_kafka``)::

    <cache>/kafka-<version>/
        lib/        broker classpath: kafka_2.13 and a logging backend
        tools-lib/  tools classpath: kafka-tools (and kafka_2.13, home of 3.x's ConsoleProducer)
        config/     logging configurations written by this module
        maven/      the generated pom.xml files

The tools get their own classpath because they are published apart from the broker and
can lag it (kafka-tools 4.4.0 is not on Maven Central; see ``TOOLS_VERSION_FALLBACK``).

Every node of a ``KafkaCluster`` is a combined broker+controller with three listeners:
``CLIENT`` (what clients use; its advertised address can be overridden so a broker
advertises a proxy in front of it), ``INTERNAL`` (inter-broker traffic and readiness
probes, always PLAINTEXT with the real address, so overriding or securing ``CLIENT`` cannot
break the cluster) and ``CONTROLLER`` (the KRaft quorum).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import dataclasses
import fcntl
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import NamedTuple

from kproxy.embedded._support import (
    TERMINATE_GRACE_S,
    BrokerAddress,
    EmbeddedBrokerError,
    free_ports,
    log_tail,
    metadata_brokers,
    spawn,
    tail_of,
    tcp_accepts,
    terminate,
    write_if_changed,
)
from kproxy.embedded.class_archive import ClassArchive

KAFKA_4_VERSION = "4.4.0"
KAFKA_3_VERSION = "3.9.2"

# kafka-tools is released separately from the broker jars and Maven Central has no 4.4.0
# (checked 2026-11: kafka_2.13, kafka-server and kafka-clients 4.4.0 are there, kafka-tools
# stops at 4.3.1). The tools are ordinary clients on the wire, so the newest published
# release serves a newer broker. Drop an entry once its kafka-tools appears.
TOOLS_VERSION_FALLBACK: Mapping[str, str] = {"4.4.0": "4.3.1"}

# Logging backends. Kafka declares only the slf4j 1.7 API; the distribution adds the
# backend: log4j2 from 4.0 on (log4j-slf4j-impl is log4j2's binding for slf4j 1.x),
# reload4j (a maintained log4j 1.2) through slf4j-reload4j before.
LOG4J2_VERSION = "2.26.1"
SLF4J_RELOAD4J_VERSION = "1.7.36"  # must match Kafka's slf4j-api 1.7.36

# A cold fetch of both versions downloads ~150 MB and took ~40 s here; Maven Central can be slower.
FETCH_TIMEOUT_S = 900.0

# Three JVMs starting together on 2 cores take 12-19 s (one node 4-10 s). On a machine
# shared with other test runs (load ~50 on 2 cores) three nodes took over 90 s: starved JVMs
# miss Raft's 2 s fetch timeout and elect leaders again and again. A start that succeeds
# returns as soon as the nodes answer, so a generous limit costs nothing.
STARTUP_TIMEOUT_S = 240.0

# How often readiness is polled: a probe costs ~1 ms, start-up takes seconds.
READY_POLL_INTERVAL_S = 0.25

# StorageTool is one JVM start (~2-4 s on 2 cores).
FORMAT_TIMEOUT_S = 120.0

# A console tool run with a few messages takes ~3-6 s; perf tools with larger counts longer.
TOOL_TIMEOUT_S = 120.0

# Brokers: a fixed small heap keeps three nodes plus a proxy and clients within a laptop or
# CI machine; G1 with a short pause target as Kafka's own start script uses.
BROKER_JVM_ARGS: tuple[str, ...] = (
    "-Xms256m",
    "-Xmx768m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)

# Brokers that carry little traffic (the test suite's): C1 only. It halves a start's CPU
# (5.0 -> 2.5 s to ready on 2 cores) and cut the CPU of a test module's run (clients,
# tools and broker) from 37.5 to 27.7 s. Benchmarks keep C2: its code is faster once warm.
LIGHT_BROKER_JVM_ARGS: tuple[str, ...] = (*BROKER_JVM_ARGS, "-XX:TieredStopAtLevel=1")

# Tools are short-lived: C1 only and the serial collector cut a run of TopicCommand --list
# from ~0.95 s to ~0.75 s on 2 cores. Benchmarks that measure a perf tool's throughput
# should pass their own (C1-only code is slower once warm).
TOOL_JVM_ARGS: tuple[str, ...] = (
    "-Xmx256m",
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
    "-Xshare:auto",
    "-Djava.awt.headless=true",
)

# The offsets and transaction topics are created on first use; with 3 replicas, 50
# partitions (the default) take ~1-1.5 s to come up on 2 cores and 10 take ~0.3-0.9 s.
# 10 still spreads group and transaction coordinators over three brokers.
INTERNAL_TOPIC_PARTITIONS = 10

CLIENT_LISTENER = "CLIENT"
INTERNAL_LISTENER = "INTERNAL"
CONTROLLER_LISTENER = "CONTROLLER"
LOOPBACK = "127.0.0.1"

_FETCHED_MARKER = ".fetched"
_MAVEN_EXTRA_ARGS = ("-q", "-B", "-Dstyle.color=never")

Advertised = Callable[[int, int], str] | Mapping[int, str]
"""Advertised CLIENT address per node: ``f(node_id, listen_port) -> "host:port"`` or a dict."""


@dataclasses.dataclass(frozen=True)
class ToolClasses:
    """Main classes of Kafka's command-line tools, as run by ``run_tool``."""

    storage: str
    console_producer: str
    console_consumer: str
    producer_perf: str
    consumer_perf: str
    consumer_groups: str
    topics: str


KAFKA_4_TOOLS = ToolClasses(
    storage="kafka.tools.StorageTool",
    console_producer="org.apache.kafka.tools.ConsoleProducer",
    console_consumer="org.apache.kafka.tools.consumer.ConsoleConsumer",
    producer_perf="org.apache.kafka.tools.ProducerPerformance",
    consumer_perf="org.apache.kafka.tools.ConsumerPerformance",
    consumer_groups="org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    topics="org.apache.kafka.tools.TopicCommand",
)
# 3.9 had moved every tool but the console producer from Scala core to kafka-tools.
KAFKA_3_TOOLS = dataclasses.replace(KAFKA_4_TOOLS, console_producer="kafka.tools.ConsoleProducer")


class _Artifact(NamedTuple):
    group: str
    artifact: str
    version: str


class KafkaToolError(subprocess.CalledProcessError):
    """A Kafka tool exited non-zero; the message carries the end of its output."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n--- stderr ---\n{tail_of(self.stderr)}\n--- stdout ---\n{tail_of(self.stdout)}"


def _major(version: str) -> int:
    return int(version.split(".", 1)[0])


def tool_classes(version: str) -> ToolClasses:
    """The tool main classes for a Kafka version (3.9 and 4.x)."""
    return KAFKA_4_TOOLS if _major(version) >= 4 else KAFKA_3_TOOLS


def tools_version(version: str) -> str:
    """The kafka-tools release used with a broker version."""
    return TOOLS_VERSION_FALLBACK.get(version, version)


def default_cache_dir() -> Path:
    """``$KPROXY_CACHE_DIR``, else ``~/.cache/kproxy``."""
    configured = os.environ.get("KPROXY_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "kproxy"


def kafka_home(version: str, cache_dir: Path | None = None) -> Path:
    """Where ``fetch_kafka`` puts a version (whether or not it has been fetched)."""
    return (cache_dir or default_cache_dir()) / f"kafka-{version}"


def is_fetched(version: str, cache_dir: Path | None = None) -> bool:
    """Whether the jars of a version are complete in the cache."""
    marker = kafka_home(version, cache_dir) / _FETCHED_MARKER
    return marker.exists() and marker.read_text() == _fetch_manifest(version)


def java_executable() -> str:
    """``$JAVA_HOME/bin/java`` or ``java`` on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise EmbeddedBrokerError("java not found: Kafka needs a Java 17+ runtime on PATH or in $JAVA_HOME")
    return found


def missing_prerequisites(version: str, cache_dir: Path | None = None) -> list[str]:
    """What this machine lacks to run a version: java always, mvn until it is fetched."""
    missing = []
    try:
        java_executable()
    except EmbeddedBrokerError:
        missing.append("java (a Java 17+ runtime)")
    if not is_fetched(version, cache_dir) and shutil.which("mvn") is None:
        missing.append("mvn (Apache Maven, to fetch the Kafka jars from Maven Central)")
    return missing


def _logging_dependencies(version: str) -> list[_Artifact]:
    if _major(version) >= 4:
        return [
            _Artifact("org.apache.logging.log4j", "log4j-core", LOG4J2_VERSION),
            _Artifact("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J2_VERSION),
        ]
    return [_Artifact("org.slf4j", "slf4j-reload4j", SLF4J_RELOAD4J_VERSION)]


def _classpath_dependencies(version: str) -> dict[str, list[_Artifact]]:
    tools = tools_version(version)
    return {
        "lib": [_Artifact("org.apache.kafka", "kafka_2.13", version), *_logging_dependencies(version)],
        "tools-lib": [
            _Artifact("org.apache.kafka", "kafka_2.13", tools),
            _Artifact("org.apache.kafka", "kafka-tools", tools),
            *_logging_dependencies(tools),
        ],
    }


def _fetch_manifest(version: str) -> str:
    """The marker's content: what was fetched, so a change of artifacts forces a refetch."""
    lines: list[str] = []
    for directory, dependencies in _classpath_dependencies(version).items():
        lines.extend(f"{directory} {':'.join(coordinates)}" for coordinates in dependencies)
    return "\n".join(lines) + "\n"


def _pom(dependencies: Sequence[_Artifact]) -> str:
    entries = "\n".join(
        f"    <dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
        f"<version>{version}</version></dependency>"
        for group, artifact, version in dependencies
    )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by kproxy.embedded: only used to resolve Kafka's jars. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>kproxy.embedded</groupId>
  <artifactId>kafka-classpath</artifactId>
  <version>1</version>
  <dependencies>
{entries}
  </dependencies>
</project>
"""


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Serialise fetches of one version across processes (parallel test runs, CI steps)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def fetch_kafka(version: str, cache_dir: Path | None = None) -> Path:
    """Download a Kafka version's broker and tool jars with Maven; return its home directory.

    Idempotent: a marker is written after a complete fetch and later calls return at once.
    """
    home = kafka_home(version, cache_dir)
    if is_fetched(version, cache_dir):
        return home
    mvn = shutil.which("mvn")
    if mvn is None:
        raise EmbeddedBrokerError(
            f"Kafka {version} is not in {home} and mvn is not on PATH: install Apache Maven "
            "(Debian: apt-get install maven) to fetch the jars from Maven Central"
        )
    with _exclusive(home.with_name(f"{home.name}.lock")):
        if is_fetched(version, cache_dir):  # another process finished while we waited
            return home
        for directory, dependencies in _classpath_dependencies(version).items():
            pom = home / "maven" / directory / "pom.xml"
            write_if_changed(pom, _pom(dependencies))
            partial = home / f"{directory}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            command = [
                mvn,
                *_MAVEN_EXTRA_ARGS,
                "-f",
                str(pom),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={partial}",
            ]
            result = subprocess.run(command, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S, check=False)
            if result.returncode != 0:
                raise EmbeddedBrokerError(
                    f"fetching Kafka {version} ({directory}) with Maven failed:\n"
                    f"{tail_of(result.stdout)}\n{tail_of(result.stderr)}"
                )
            shutil.rmtree(home / directory, ignore_errors=True)
            partial.rename(home / directory)
        (home / _FETCHED_MARKER).write_text(_fetch_manifest(version))
    return home


# Brokers log INFO to stdout, which start() sends to the node's server.log. The request
# logger would log every request at DEBUG/TRACE; it stays quiet unless a test raises it.
_LOG4J2_BROKER = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.request.name = kafka.request.logger
logger.request.level = warn
"""

# Tools print data on stdout (the console consumer, perf results); logs go to stderr, and
# only warnings, so that stdout stays parseable.
_LOG4J2_TOOLS = """\
status = warn
appender.err.type = Console
appender.err.name = err
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.err.ref = err
"""

_RELOAD4J_BROKER = """\
log4j.rootLogger=INFO, out
log4j.appender.out=org.apache.log4j.ConsoleAppender
log4j.appender.out.layout=org.apache.log4j.PatternLayout
log4j.appender.out.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
"""

_RELOAD4J_TOOLS = """\
log4j.rootLogger=WARN, err
log4j.appender.err=org.apache.log4j.ConsoleAppender
log4j.appender.err.Target=System.err
log4j.appender.err.layout=org.apache.log4j.PatternLayout
log4j.appender.err.layout.ConversionPattern=[%d] %p %m (%c)%n
"""


def _logging_jvm_arg(home: Path, version: str, role: str) -> str:
    """Write the logging configuration for a role ("broker"/"tools"); return the JVM flag."""
    if _major(version) >= 4:
        path = home / "config" / f"log4j2-{role}.properties"
        write_if_changed(path, _LOG4J2_BROKER if role == "broker" else _LOG4J2_TOOLS)
        return f"-Dlog4j2.configurationFile={path}"
    path = home / "config" / f"log4j-{role}.properties"
    write_if_changed(path, _RELOAD4J_BROKER if role == "broker" else _RELOAD4J_TOOLS)
    return f"-Dlog4j.configuration=file:{path}"


def _tool_command(
    version: str, main_class: str, args: Sequence[str], jvm_args: Sequence[str], cache_dir: Path | None,
    record: bool = False,
) -> tuple[list[str], ClassArchive | None]:
    """The tool's command line, and the class archive it maps (or records, if ``record``)."""
    home = fetch_kafka(version, cache_dir)
    tools_release = tools_version(version)
    java = java_executable()
    archive = ClassArchive.for_jars(java, home / "tools-lib", record=record)
    return [
        java,
        *(archive.jvm_args() if archive else ()),
        *jvm_args,
        _logging_jvm_arg(home, tools_release, "tools"),
        "-cp",
        f"{home / 'tools-lib'}/*",
        main_class,
        *args,
    ], archive


def tool_command(
    target: KafkaCluster | str,
    main_class: str,
    *args: str,
    jvm_args: Sequence[str] = TOOL_JVM_ARGS,
    cache_dir: Path | None = None,
) -> list[str]:
    """The command line ``run_tool`` runs, for a caller that must start the tool itself
    (a console consumer read line by line and stopped once it has what it waits for)."""
    if isinstance(target, KafkaCluster):
        version, cache_dir = target.version, target.cache_dir
    else:
        version = target
    return _tool_command(version, main_class, args, jvm_args, cache_dir)[0]


def run_tool(
    target: KafkaCluster | str,
    main_class: str,
    *args: str,
    input: str | None = None,
    timeout: float = TOOL_TIMEOUT_S,
    check: bool = True,
    jvm_args: Sequence[str] = TOOL_JVM_ARGS,
    cache_dir: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run one of Kafka's Java tools for a cluster (or a version) and capture its output.

    ``main_class`` is best taken from ``tool_classes(version)`` or ``cluster.tools``;
    the tools' own arguments follow, e.g. ``"--bootstrap-server", cluster.bootstrap_servers``.
    ``input`` is fed to stdin (the console producer sends one record per line). Raises
    ``KafkaToolError`` on a non-zero exit when ``check`` is true, and
    ``subprocess.TimeoutExpired`` (after killing the tool) when it runs over ``timeout``.
    """
    if isinstance(target, KafkaCluster):
        version, cache_dir = target.version, target.cache_dir
    else:
        version = target
    command, archive = _tool_command(version, main_class, args, jvm_args, cache_dir, record=True)
    try:
        result = subprocess.run(command, input=input, capture_output=True, text=True, timeout=timeout, check=False)
    except BaseException:
        if archive is not None:
            archive.finish(None)
        raise
    if archive is not None:
        archive.finish(result.returncode)
    if check and result.returncode != 0:
        raise KafkaToolError(result.returncode, command, result.stdout, result.stderr)
    return result


def _random_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes in URL-safe base64, as ``kafka-storage random-uuid``.

    Like Kafka, refuse ids that start with "-": a command line would read them as an option.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def _properties_value(value: object) -> str:
    """A value in Java .properties syntax: booleans lower-case, backslashes and newlines escaped."""
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return text.replace("\\", "\\\\").replace("\n", "\\n")


@dataclasses.dataclass
class _Node:
    node_id: int
    client_port: int
    internal_port: int
    controller_port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def config_path(self) -> Path:
        return self.directory / "server.properties"

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"


class KafkaCluster:
    """A KRaft cluster of combined broker+controller nodes on loopback, ids 1..brokers.

    Use as a context manager, or call ``start()`` and ``stop()``. ``extra_config`` overrides
    any ``server.properties`` entry of every node (e.g. to put SASL on the ``CLIENT``
    listener: ``listener.security.protocol.map=CLIENT:SASL_PLAINTEXT,INTERNAL:PLAINTEXT,
    CONTROLLER:PLAINTEXT`` plus ``listener.name.client.*`` settings); ``format_args`` are
    passed to the storage format tool (e.g. ``--add-scram``). ``advertised`` sets the
    ``CLIENT`` address each node advertises, e.g. a relay in front of it.
    ``extra_classpath`` entries follow Kafka's jars on each node's classpath (plugins, such
    as a ``metric.reporters`` class).

    A temporary workdir is removed by ``stop()`` unless ``keep_workdir``; one given by the
    caller is never removed. After a failed start the workdir is kept for its logs.
    """

    def __init__(
        self,
        brokers: int = 1,
        *,
        version: str = KAFKA_4_VERSION,
        workdir: Path | str | None = None,
        keep_workdir: bool = False,
        extra_config: Mapping[str, object] | None = None,
        advertised: Advertised | None = None,
        format_args: Sequence[str] = (),
        cache_dir: Path | None = None,
        startup_timeout: float = STARTUP_TIMEOUT_S,
        extra_classpath: Sequence[Path | str] = (),
        jvm_args: Sequence[str] = BROKER_JVM_ARGS,
    ) -> None:
        if brokers < 1:
            raise ValueError(f"brokers must be at least 1, not {brokers}")
        self._brokers = brokers
        self._version = version
        self._requested_workdir = Path(workdir) if workdir is not None else None
        self._keep_workdir = keep_workdir
        self._extra_config = dict(extra_config or {})
        self._advertised = advertised
        self._format_args = tuple(format_args)
        self._cache_dir = cache_dir
        self._startup_timeout = startup_timeout
        self._extra_classpath = tuple(str(p) for p in extra_classpath)
        self._jvm_args = tuple(jvm_args)
        self._workdir: Path | None = None
        self._home: Path | None = None
        self._nodes: dict[int, _Node] = {}

    # -- public properties ---------------------------------------------------------------

    @property
    def version(self) -> str:
        return self._version

    @property
    def cache_dir(self) -> Path | None:
        return self._cache_dir

    @property
    def tools(self) -> ToolClasses:
        """Main classes of this version's tools, for ``run_tool``."""
        return tool_classes(self._version)

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise EmbeddedBrokerError("the cluster has not been started")
        return self._workdir

    @property
    def nodes(self) -> list[BrokerAddress]:
        """(node_id, host, port) of each node's CLIENT listener, where it really listens."""
        return [BrokerAddress(node.node_id, LOOPBACK, node.client_port) for node in self._started_nodes()]

    @property
    def bootstrap_servers(self) -> str:
        """``"127.0.0.1:p1,..."``: every node's CLIENT listener."""
        return ",".join(f"{LOOPBACK}:{node.client_port}" for node in self._started_nodes())

    @property
    def internal_bootstrap_servers(self) -> str:
        """The INTERNAL listeners: always PLAINTEXT, advertising the real addresses.

        For setting up topics or checking results behind the back of whatever the CLIENT
        listener advertises (a proxy that is not running yet, say).
        """
        return ",".join(f"{LOOPBACK}:{node.internal_port}" for node in self._started_nodes())

    def advertised_address(self, node_id: int) -> str:
        """The ``host:port`` a node advertises on its CLIENT listener."""
        node = self._node(node_id)
        if self._advertised is None:
            return f"{LOOPBACK}:{node.client_port}"
        if callable(self._advertised):
            return self._advertised(node_id, node.client_port)
        return self._advertised.get(node_id, f"{LOOPBACK}:{node.client_port}")

    def log_path(self, node_id: int) -> Path:
        """The node's server.log (the broker's stdout and stderr)."""
        return self._node(node_id).log_path

    def running_node_ids(self) -> list[int]:
        return [node.node_id for node in self._nodes.values() if node.process is not None]

    # -- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> KafkaCluster:
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
        """Fetch the jars if needed, format storage, start every node, wait until ready."""
        if self._nodes:
            raise EmbeddedBrokerError("a KafkaCluster starts once; create a new one")
        self._home = fetch_kafka(self._version, self._cache_dir)
        java_executable()  # fail before creating anything when Java is missing
        if self._requested_workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="kproxy-kafka-"))
        else:
            self._workdir = self._requested_workdir
            self._workdir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        ports = iter(free_ports(3 * self._brokers))
        for node_id in range(1, self._brokers + 1):
            self._nodes[node_id] = _Node(
                node_id=node_id,
                client_port=next(ports),
                internal_port=next(ports),
                controller_port=next(ports),
                directory=self._workdir / f"node-{node_id}",
            )
        try:
            for node in self._nodes.values():
                node.directory.mkdir(parents=True, exist_ok=True)
                node.config_path.write_text(self._server_properties(node))
            self._format_storage()
            for node in self._nodes.values():
                self._launch(node)
            self._wait_ready(list(self._nodes.values()))
        except BaseException:
            self._keep_workdir = True  # the logs explain the failure
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every node and clean up.

        Nodes whose data is kept get a clean shutdown (SIGTERM, SIGKILL after a grace
        period); when the workdir is about to be deleted they are killed at once, which
        saves ~6 s per three-node cluster.
        """
        atexit.unregister(self.stop)
        discard = self._workdir is not None and self._requested_workdir is None and not self._keep_workdir
        terminate(
            (node.process for node in self._nodes.values() if node.process is not None),
            grace=0 if discard else TERMINATE_GRACE_S,
        )
        for node in self._nodes.values():
            node.process = None
        if discard:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def stop_node(self, node_id: int) -> None:
        """Stop one node cleanly (controlled shutdown); its data stays for ``start_node``."""
        node = self._node(node_id)
        if node.process is not None:
            terminate([node.process])
            node.process = None

    def start_node(self, node_id: int) -> None:
        """Restart a node stopped with ``stop_node``, on the same ports, and wait until ready."""
        node = self._node(node_id)
        if node.process is not None:
            raise EmbeddedBrokerError(f"node {node_id} is already running")
        self._launch(node)
        self._wait_ready([node])

    # -- internals -----------------------------------------------------------------------

    def _node(self, node_id: int) -> _Node:
        try:
            return self._nodes[node_id]
        except KeyError:
            raise EmbeddedBrokerError(f"no node {node_id} (started nodes: {sorted(self._nodes)})") from None

    def _started_nodes(self) -> list[_Node]:
        if not self._nodes:
            raise EmbeddedBrokerError("the cluster has not been started")
        return list(self._nodes.values())

    def _server_properties(self, node: _Node) -> str:
        replication = str(min(3, self._brokers))
        voters = ",".join(f"{n.node_id}@{LOOPBACK}:{n.controller_port}" for n in self._nodes.values())
        config: dict[str, object] = {
            "process.roles": "broker,controller",
            "node.id": node.node_id,
            "controller.quorum.voters": voters,
            "listeners": (
                f"{CLIENT_LISTENER}://{LOOPBACK}:{node.client_port},"
                f"{INTERNAL_LISTENER}://{LOOPBACK}:{node.internal_port},"
                f"{CONTROLLER_LISTENER}://{LOOPBACK}:{node.controller_port}"
            ),
            "advertised.listeners": (
                f"{CLIENT_LISTENER}://{self.advertised_address(node.node_id)},"
                f"{INTERNAL_LISTENER}://{LOOPBACK}:{node.internal_port}"
            ),
            "listener.security.protocol.map": (
                f"{CLIENT_LISTENER}:PLAINTEXT,{INTERNAL_LISTENER}:PLAINTEXT,{CONTROLLER_LISTENER}:PLAINTEXT"
            ),
            "inter.broker.listener.name": INTERNAL_LISTENER,
            "controller.listener.names": CONTROLLER_LISTENER,
            "log.dirs": node.directory / "data",
            "num.partitions": 1,
            "auto.create.topics.enable": True,
            "group.initial.rebalance.delay.ms": 0,
            "offsets.topic.replication.factor": replication,
            "offsets.topic.num.partitions": INTERNAL_TOPIC_PARTITIONS,
            "transaction.state.log.replication.factor": replication,
            "transaction.state.log.min.isr": 1,
            "transaction.state.log.num.partitions": INTERNAL_TOPIC_PARTITIONS,
        }
        if _major(self._version) >= 4:
            # Share groups (KIP-932) keep state in an internal topic of their own.
            config["share.coordinator.state.topic.replication.factor"] = replication
            config["share.coordinator.state.topic.min.isr"] = 1
        config.update(self._extra_config)
        lines = [f"{key}={_properties_value(value)}" for key, value in config.items()]
        return "# Written by kproxy.embedded.KafkaCluster\n" + "\n".join(lines) + "\n"

    def _format_storage(self) -> None:
        """Format every node's log dir, all in parallel (one JVM each)."""
        assert self._home is not None
        cluster_id = _random_cluster_id()
        classpath = f"{self._home / 'lib'}/*"
        logging = _logging_jvm_arg(self._home, self._version, "tools")
        java = java_executable()
        runs = []
        for node in self._nodes.values():
            # The brokers map what the first format run records (the same jars).
            archive = ClassArchive.for_jars(java, self._home / "lib")
            command = [
                java,
                *(archive.jvm_args() if archive else ()),
                *TOOL_JVM_ARGS,
                logging,
                "-cp",
                classpath,
                KAFKA_4_TOOLS.storage,
                "format",
                "--cluster-id",
                cluster_id,
                "--config",
                str(node.config_path),
                *self._format_args,
            ]
            log = node.directory / "format.log"
            runs.append((node, log, spawn(command, log), archive))
        deadline = time.monotonic() + FORMAT_TIMEOUT_S
        for node, log, process, archive in runs:
            try:
                code = process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                code = None
            terminate([process])
            if archive is not None:
                archive.finish(code)
            if code != 0:
                raise EmbeddedBrokerError(
                    f"formatting storage of node {node.node_id} failed (exit {code}):\n{log_tail(log)}"
                )

    def _launch(self, node: _Node) -> None:
        assert self._home is not None
        java = java_executable()
        archive = ClassArchive.for_jars(java, self._home / "lib", record=False)   # killed: never records
        command = [
            java,
            *(archive.jvm_args() if archive else ()),
            *self._jvm_args,
            _logging_jvm_arg(self._home, self._version, "broker"),
            "-cp",
            os.pathsep.join((f"{self._home / 'lib'}/*", *self._extra_classpath)),
            "kafka.Kafka",
            str(node.config_path),
        ]
        node.process = spawn(command, node.log_path, cwd=node.directory)

    def _wait_ready(self, nodes: list[_Node]) -> None:
        """Wait until each node lists every running node in Metadata and accepts clients.

        Probes go to the INTERNAL listener: it speaks PLAINTEXT whatever CLIENT is set to.
        """
        deadline = time.monotonic() + self._startup_timeout
        expected = set(self.running_node_ids())
        pending = list(nodes)
        last_seen: dict[int, str] = {}
        while pending:
            for node in list(pending):
                assert node.process is not None
                code = node.process.poll()
                if code is not None:
                    raise EmbeddedBrokerError(
                        f"Kafka {self._version} node {node.node_id} exited with code {code} during start-up "
                        f"(workdir kept: {self._workdir}):\n{log_tail(node.log_path)}"
                    )
                try:
                    listed = {broker.node_id for broker in metadata_brokers(LOOPBACK, node.internal_port)}
                except OSError as exc:
                    last_seen[node.node_id] = f"probe failed: {exc!r}"
                    continue
                last_seen[node.node_id] = f"Metadata lists nodes {sorted(listed)}"
                if expected <= listed and tcp_accepts(LOOPBACK, node.client_port):
                    pending.remove(node)
            if not pending:
                return
            if time.monotonic() > deadline:
                details = "\n\n".join(
                    f"--- node {node.node_id}: {last_seen.get(node.node_id, 'not probed')}; "
                    f"end of {node.log_path}:\n{log_tail(node.log_path)}"
                    for node in pending
                )
                raise EmbeddedBrokerError(
                    f"Kafka {self._version} nodes {[n.node_id for n in pending]} not ready after "
                    f"{self._startup_timeout:.0f} s, expecting nodes {sorted(expected)} "
                    f"(workdir kept: {self._workdir})\n{details}"
                )
            time.sleep(READY_POLL_INTERVAL_S)
