"""The container image, built from deploy/Dockerfile and run with podman.

scripts/build-image.sh builds it without a registry (a Debian base from debootstrap, kproxy's
dependencies from PyPI) and names it by a hash of its inputs, so the first run on a machine
takes a few minutes (the base) and later runs reuse what is built. The tests run what a user
runs: the image's entrypoint in front of the session's real broker, a real client through
it, stopped as a container engine stops it. They skip, saying why, where podman is missing
or cannot start a container (scripts/setup-image.sh installs it; the build script explains
what failed); ``-m "not image"`` leaves them out.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

import kproxy
from tests.deploy.image import REPO, image_env, image_user
from tests.proxy.cluster import CONSUME_TIMEOUT_S, topic_name

pytestmark = [pytest.mark.image, pytest.mark.timeout(1200)]   # the first build makes the base

BUILD_SCRIPT = REPO / "scripts" / "build-image.sh"
NO_ENGINE_EXIT = 3                # build-image.sh: no container can run on this machine
NO_ENGINE_SAYS = "build-image: no container can run here"   # ... and why, maybe over lines
BUILD_TIMEOUT_S = 1100.0          # debootstrap + import + image build on a busy 2-core machine
RUN_TIMEOUT_S = 120.0             # a one-off command in the container (start, run, remove)
START_TIMEOUT_S = 60.0            # the container up and kproxy's listener bound
STOP_GRACE_S = 30                 # podman stop's SIGTERM-to-SIGKILL wait: over kproxy's drain
HELP_COLUMNS = "100"              # argparse wraps help to $COLUMNS: the same on both sides
MESSAGES = 20
ADVERTISED_HOST = "localhost"
LISTENING = re.compile(r"kproxy gateway listening on ([\d.]+):(\d+), upstream ")


@pytest.fixture(scope="module")
def image() -> str:
    """The image's name (localhost/kproxy:<inputs hash>), built or reused."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (scripts/setup-image.sh installs it)")
    built = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True,
                           timeout=BUILD_TIMEOUT_S)
    if built.returncode == NO_ENGINE_EXIT:
        reason = built.stderr[built.stderr.rfind(NO_ENGINE_SAYS):].strip()
        pytest.skip(" ".join(reason.split()))
    assert built.returncode == 0, f"scripts/build-image.sh exits {built.returncode}:\n{built.stderr[-4000:]}"
    return built.stdout.split()[-1]


@pytest.fixture(scope="module")
def run_flags() -> list[str]:
    """The flags `podman run` needs on this machine (runtime, limits), from the build script."""
    out = subprocess.run(["bash", str(BUILD_SCRIPT), "--run-flags"], capture_output=True, text=True,
                         check=True, timeout=RUN_TIMEOUT_S)
    return out.stdout.split()


def podman_run(image: str, flags: list[str], *args: str, entrypoint: str | None = None,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    command = ["podman", "run", "--rm", "--network", "none", *flags]
    for key, value in (env or {}).items():
        command += ["--env", f"{key}={value}"]
    if entrypoint:
        command += ["--entrypoint", entrypoint]
    return subprocess.run([*command, image, *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def host_kproxy(*args: str) -> subprocess.CompletedProcess:
    """kproxy from this checkout with the image's ENV, as the container sees it."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("KPROXY_")}
    env.update(image_env(), COLUMNS=HELP_COLUMNS, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "kproxy", *args], capture_output=True, text=True,
                          env=env, timeout=RUN_TIMEOUT_S)


def test_image_runs_as_the_dockerfiles_non_root_user(image, run_flags):
    uid, gid = image_user()
    ran = podman_run(image, run_flags, "-c", "import os; print(os.getuid(), os.getgid())", entrypoint="python")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == [str(uid), str(gid)] and uid != 0


def test_image_has_this_checkouts_kproxy_and_cli(image, run_flags):
    version = podman_run(image, run_flags, "-c", "import kproxy; print(kproxy.__version__)", entrypoint="python")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == kproxy.__version__
    env = {"COLUMNS": HELP_COLUMNS}
    run_help = podman_run(image, run_flags, "--help", env=env)          # the entrypoint is `kproxy run`
    top_help = podman_run(image, run_flags, "--help", entrypoint="kproxy", env=env)
    for ran, here in ((run_help, host_kproxy("run", "--help")), (top_help, host_kproxy("--help"))):
        assert ran.returncode == here.returncode == 0, ran.stderr
        assert ran.stdout == here.stdout and ran.stdout.startswith("usage: kproxy")


class Container:
    """`podman run` of the image in the foreground, its log lines read as they come."""

    def __init__(self, image: str, podman_args: list[str], kproxy_args: list[str]) -> None:
        self.name = f"kproxy-test-{uuid.uuid4().hex[:8]}"
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.log: list[str] = []
        self.process = subprocess.Popen(
            ["podman", "run", "--rm", "--name", self.name, *podman_args, image, *kproxy_args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for_line(self, pattern: re.Pattern, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                raise AssertionError(f"the container exited ({self.process.wait()}):\n{''.join(self.log)}")
            self.log.append(line)
            if match := pattern.search(line):
                return match
        raise AssertionError(f"no {pattern.pattern!r} in {timeout:g}s:\n{''.join(self.log)}")

    def stop(self) -> int:
        """`podman stop`: SIGTERM, then SIGKILL after the grace period; the exit status."""
        subprocess.run(["podman", "stop", "--time", str(STOP_GRACE_S), self.name],
                       capture_output=True, timeout=STOP_GRACE_S + RUN_TIMEOUT_S)
        code = self.process.wait(timeout=RUN_TIMEOUT_S)
        while (line := self.lines.get(timeout=RUN_TIMEOUT_S)) is not None:
            self.log.append(line)
        return code

    def remove(self) -> None:
        if self.process.poll() is None:
            subprocess.run(["podman", "rm", "--force", self.name], capture_output=True, timeout=RUN_TIMEOUT_S)
            self.process.wait(timeout=RUN_TIMEOUT_S)


@pytest.fixture
def container(image, run_flags) -> Iterator:
    started: list[Container] = []

    def start(podman_args: list[str], kproxy_args: list[str]) -> Container:
        started.append(Container(image, [*run_flags, *podman_args], kproxy_args))
        return started[-1]

    yield start
    for one in started:
        one.remove()


def test_image_serves_a_client_in_front_of_the_broker_and_stops_on_sigterm(container, kafka_cluster):
    from confluent_kafka import Consumer, Producer

    # The host's network (the broker is on its 127.0.0.1), every port chosen by the OS: the
    # listen port is read from kproxy's log, the broker listener ports come in Metadata,
    # under the advertised host (a name here, so it shows apart from the listen address).
    proxy = container(["--network", "host"],
                      ["--upstream", kafka_cluster.bootstrap_servers, "--listen", "127.0.0.1:0",
                       "--advertised-host", ADVERTISED_HOST, "--broker-port-base", "0",
                       "--admin-listen", "127.0.0.1:0", "--probe-listen", "127.0.0.1:0"])
    host, port = proxy.wait_for_line(LISTENING, START_TIMEOUT_S).groups()
    bootstrap = f"{host}:{port}"
    topic = topic_name("image")

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    brokers = producer.list_topics(timeout=CONSUME_TIMEOUT_S).brokers.values()
    assert brokers and {b.host for b in brokers} == {ADVERTISED_HOST}
    assert not {b.port for b in brokers} & {n.port for n in kafka_cluster.nodes}, "a broker's own port leaked"
    sent = [f"message {i}".encode() for i in range(MESSAGES)]
    for value in sent:
        producer.produce(topic, value)
    assert producer.flush(CONSUME_TIMEOUT_S) == 0, "messages left undelivered"

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    received, deadline = [], time.monotonic() + CONSUME_TIMEOUT_S
    try:
        while len(received) < len(sent) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                received.append(message.value())
    finally:
        consumer.close()
    assert received == sent

    assert proxy.stop() == 0
    log = "".join(proxy.log)
    assert "listener=bootstrap" in log and re.search(r"listener=broker-\d+", log), \
        "the client's connections did not go through the container's kproxy:\n" + log
    assert "kproxy stopped" in log, "SIGTERM did not stop kproxy gracefully:\n" + log
