"""``kproxy run`` in a process of its own, as tests and benchmarks both start it.

One class, ``KproxyProcess``, for every caller that wants kproxy outside its own
interpreter: a test whose failure is a frozen event loop (frozen in C code it holds the
interpreter lock, so in the test's process nothing, not even its timeout, would run
again), a test of the process itself (its memory, its limits, its workers, its signals),
and a benchmark (the client's Python must not share kproxy's interpreter lock: the
figures would measure that contention, which no deployment has).

It lives in ``tests/`` beside the harness that re-exports it, and imports neither pytest
nor kproxy's runtime (only ``kproxy.embedded``'s port helper), so a benchmark's driver
process imports it without loading what it measures. What differs between callers is a
parameter: the program that runs kproxy (``entry``: ``-m kproxy``, a ``-c`` snippet that
patches a constant first, a benchmark's launcher), the tree it runs (``tree``: another
checkout, for a before/after), the admin token, what it waits for before serving.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Callable, NamedTuple

from prometheus_client.parser import text_string_to_metric_families

from kproxy.embedded._support import free_port

REPO = Path(__file__).resolve().parents[1]
ANSWER_TIMEOUT_S = 30.0           # an HTTP answer (admin, probes) on a busy 2-core machine
POLL_S = 0.05                     # how often a deadline loop re-checks its condition
PROCESS_START_TIMEOUT_S = 60.0    # an interpreter start and imports on a busy 2-core machine (workers: N+1)
PROCESS_STOP_TIMEOUT_S = 30.0     # SIGTERM to exit (connections drained first); past it the process is killed
READY_PROBE_TIMEOUT_S = 5.0       # one GET of the ready path; a slower answer is asked again
LOG_TAIL_CHARS = 20_000           # of the process's log, shown with a failure


def wait_for(condition: Callable[[], Any], timeout: float, what: str):
    """Poll ``condition()`` until it returns something truthy, and return that; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(POLL_S)


def http_status(url: str, timeout: float = ANSWER_TIMEOUT_S) -> tuple[int, str]:
    """(status, body text) of a GET, error statuses included."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


# Where a `kproxy run` listens, from the start-up block it logs once serving
# (kproxy/startup_log.py): bound addresses, so ports the OS picked are filled in.
STARTUP_BOOTSTRAP = re.compile(r"^.* INFO kproxy\S*   kafka bootstrap  (\S+) \(clients told", re.M)
STARTUP_ADMIN = re.compile(r"^.* INFO kproxy\S*   admin            (?:http://(\S+) |off)", re.M)
LOGS_START_UP_BLOCK = ("INFO", "DEBUG")      # the log levels at which a kproxy logs that block
STARTUP_PROBES = re.compile(r"^.* INFO kproxy\S*   probes           (?:http://(\S+) |off)", re.M)


class Listening(NamedTuple):
    """Where a ``kproxy run`` listens, as its start-up block says ("host:port"; None: off)."""
    bootstrap: str
    admin: str | None
    probes: str | None


def listening(log: str) -> Listening | None:
    """The addresses in a ``kproxy run`` log's start-up block; None until it is all there
    (the probes line comes after the other two)."""
    bootstrap, admin, probes = (pattern.search(log) for pattern in
                                (STARTUP_BOOTSTRAP, STARTUP_ADMIN, STARTUP_PROBES))
    if not (bootstrap and admin and probes):
        return None
    return Listening(bootstrap[1], admin[1], probes[1])


class _AdminToken:
    """``KproxyProcess.call``'s default bearer: the token the process was given."""


ADMIN_TOKEN = _AdminToken()


class KproxyProcess:
    """``with KproxyProcess(tmp_path, upstream=..., **settings) as kproxy:`` a ``kproxy run``
    process, configured by a TOML file written from ``settings``.

    Every listener defaults to port 0 (the OS picks; broker listeners too, in gateway mode
    with ports routing) and the caller learns what was bound from the start-up block the
    process logs at INFO (``bootstrap``, ``admin_url``, ``probe_url`` wait for it). With
    workers > 1 every worker binds the same listen port, so that one is taken from
    ``free_port``. On entry the process starts and, unless ``ready`` is None, is waited for
    until ``GET <admin><ready>`` (the probe port's with ``admin_listen="off"``) answers 200;
    on exit it gets SIGTERM (then SIGKILL past ``PROCESS_STOP_TIMEOUT_S``, and a failure).
    A failure inside, or in starting, carries the tail of the process's log.

    ``directory``: where the config file and the log go (None: a temporary directory,
    removed on exit). ``entry``: what runs kproxy, after the interpreter. ``tree``: the
    checkout it runs (``PYTHONPATH`` and working directory). ``admin_token``: given to the
    process in ``KPROXY_ADMIN_TOKEN`` and sent by ``call``. ``name``: of the config and log
    files (default: a fresh one).
    """

    def __init__(self, directory: Path | None = None, *, ready: str | None = "/readyz",
                 env: dict[str, str] | None = None, preexec_fn: Callable[[], None] | None = None,
                 entry: tuple[str, ...] = ("-m", "kproxy"), tree: Path = REPO,
                 admin_token: str | None = None, name: str | None = None, **settings: Any):
        if str(settings.get("log_level", "INFO")).upper() not in LOGS_START_UP_BLOCK:
            raise ValueError("KproxyProcess learns where kproxy listens from its start-up block, "
                             "logged at INFO: log_level must be INFO or DEBUG")
        if settings.get("workers", 1) > 1:
            settings.setdefault("listen", f"127.0.0.1:{free_port()}")    # one port, shared (SO_REUSEPORT)
        settings.setdefault("listen", "127.0.0.1:0")
        settings.setdefault("admin_listen", "127.0.0.1:0")
        if (settings.get("mode", "gateway") == "gateway" and settings.get("routing", "ports") == "ports"
                and settings["listen"].endswith(":0") and settings.get("broker_port_rule") != "map"):
            settings.setdefault("broker_port_base", 0)
        self.settings = settings
        self.ready = ready
        self.admin_token = admin_token
        self.env = {**os.environ, "PYTHONPATH": str(tree), **(env or {}),
                    **({"KPROXY_ADMIN_TOKEN": admin_token} if admin_token else {})}
        self.preexec_fn = preexec_fn
        self.entry = entry
        self.tree = tree
        self._own_directory = directory is None
        directory = Path(tempfile.mkdtemp(prefix="kproxy-")) if directory is None else Path(directory)
        name = name or f"kproxy-{uuid.uuid4().hex[:6]}"
        self.config_path = directory / f"{name}.toml"
        self.log_path = directory / f"{name}.log"
        self.process: subprocess.Popen | None = None
        self._listening: Listening | None = None

    def listening(self, timeout: float = PROCESS_START_TIMEOUT_S) -> Listening:
        """Where it listens; waits for the start-up block (fails if the process exits first)."""
        if self._listening is None:
            def logged() -> Listening | None:
                found = listening(self.log_text())
                assert found or self.process.poll() is None, \
                    f"kproxy exited with {self.process.returncode} before its start-up block"
                return found
            self._listening = wait_for(logged, timeout, "kproxy's start-up block")
        return self._listening

    @property
    def listen_port(self) -> int:
        return int(self.bootstrap.rpartition(":")[2])

    @property
    def bootstrap(self) -> str:
        return self.listening().bootstrap

    @property
    def admin_url(self) -> str | None:
        admin = self.listening().admin
        return None if admin is None else f"http://{admin}"

    @property
    def probe_url(self) -> str | None:
        probes = self.listening().probes
        return None if probes is None else f"http://{probes}"

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def call(self, path: str, body: dict | None = None, token: str | _AdminToken | None = ADMIN_TOKEN,
             base: str | None = None, timeout: float = ANSWER_TIMEOUT_S) -> tuple[int, bytes]:
        """(status, body) of a GET (no ``body``) or a JSON POST to the admin listener (or
        ``base``), with ``token`` as the bearer (default: the admin token; None: none)."""
        if token is ADMIN_TOKEN:
            token = self.admin_token
        request = urllib.request.Request((base or self.admin_url) + path,
                                         data=None if body is None else json.dumps(body).encode(),
                                         method="GET" if body is None else "POST")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    get = call

    def metrics(self, base: str | None = None) -> dict[tuple, float]:
        """Every sample of ``/metrics`` (of the admin listener, or ``base``), keyed
        (name, sorted labels)."""
        status, text = self.call("/metrics", base=base)
        assert status == 200, text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(text.decode()) for s in f.samples}

    def _write_config(self) -> None:
        lines = []
        for key, value in self.settings.items():
            if isinstance(value, dict):              # broker_port_map: "1=9101,2=9102"
                value = ",".join(f"{k}={v}" for k, v in value.items())
            lines.append(f"{key} = {json.dumps(value)}")     # JSON scalars are TOML scalars
        self.config_path.write_text("\n".join(lines) + "\n")

    def start(self) -> None:
        self._listening = None
        self._write_config()
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, *self.entry, "run", "--config", str(self.config_path)],
                env=self.env, cwd=self.tree, stdout=log, stderr=subprocess.STDOUT, preexec_fn=self.preexec_fn)

    def wait_ready(self, path: str = "/readyz", timeout: float = PROCESS_START_TIMEOUT_S) -> None:
        def ready() -> bool:
            assert self.process.poll() is None, f"kproxy exited with {self.process.returncode}"
            try:
                return http_status((self.admin_url or self.probe_url) + path, timeout=READY_PROBE_TIMEOUT_S)[0] == 200
            except OSError:
                return False
        wait_for(ready, timeout, f"kproxy's {path} to answer 200")

    def refusal(self, timeout: float = PROCESS_START_TIMEOUT_S) -> str:
        """The one line (``kproxy run: error: ...``) a kproxy that gives up prints, once it
        has exited with 1 and no traceback."""
        assert self.process.wait(timeout) == 1, f"kproxy exited with {self.process.returncode}"
        output = self.log_text()
        assert "Traceback" not in output, output
        lines = [line for line in output.splitlines() if line.startswith("kproxy run: error: ")]
        assert len(lines) == 1, output
        return lines[0]

    def stop(self) -> int:
        """SIGTERM, and its exit code; SIGKILL (and a failure) if it does not exit in time."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(PROCESS_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"kproxy did not exit within {PROCESS_STOP_TIMEOUT_S:g}s of SIGTERM; "
                                 f"killed") from None

    def _add_log(self, exc: BaseException) -> None:
        tail = self.log_text()[-LOG_TAIL_CHARS:] if self.log_path.exists() else "(none)"
        exc.add_note(f"kproxy's log ({self.log_path}), its end:\n{tail}")

    def __enter__(self) -> "KproxyProcess":
        self.start()
        if self.ready is not None:
            try:
                self.wait_ready(self.ready)
            except BaseException as exc:
                self.__exit__(type(exc), exc, exc.__traceback__)
                raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.stop()
        except AssertionError as stopping:
            if exc is None:
                self._add_log(stopping)
                raise
            exc.add_note(str(stopping))
        if exc is not None:
            self._add_log(exc)
        elif self._own_directory:
            shutil.rmtree(self.config_path.parent, ignore_errors=True)
