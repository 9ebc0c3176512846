"""Several kproxy worker processes behind one set of ports: ``kproxy run --workers N``.

One process relays on one core. With ``workers`` > 1 a supervisor starts N worker
processes, each a whole kproxy (``Runtime``) binding the same listener ports with
``SO_REUSEPORT``: the kernel spreads new connections among them. What is per worker:
its connections (a connection stays on the worker that accepted it), its broker
directory, its capture files (``<prefix>-w<index>-...``), its audit file
(``<name>-w<index>.jsonl``) and its live page data.
What is divided: ``max_connections`` and the buffer budget (each worker 1/N), and a
capture's ``max_total_bytes``, so N workers promise no more than one did.

The supervisor relays nothing. It:

- starts the workers and waits until each serves; if one cannot start (a port
  taken, a bad certificate) it stops them all and ``kproxy run`` exits 1 with that
  worker's one-line reason;
- restarts a worker that dies (a log line per worker at most once per
  ``RESTART_LOG_INTERVAL_S``, ``kproxy_worker_restarts_total``), after a pause
  that doubles while it keeps dying; a worker dying before it serves, or within
  ``MIN_UPTIME_S``, ``START_FAILURES_BEFORE_GIVING_UP`` times in a row, stops
  everything (exit 1): a loop of restarts would hide the cause;
- passes SIGHUP on to every worker (each reloads its TLS files; each also watches them);
- on SIGTERM or SIGINT sends SIGTERM to every worker, which drains as a single
  kproxy does (``shutdown_timeout``), and kills what is left ``STOP_GRACE_S`` later;
- serves the one admin listener (``kproxy.admin.worker_admin``): metrics summed
  over the workers, health and readiness of all of them, capture control for all;
- with ``probe_listen``, starts the probe process (``kproxy.probes``) on a
  probe board of one slot per worker: each worker's event loop posts its heartbeat
  and readiness to its slot, and the supervisor resets a dead worker's slot (its
  last heartbeat would otherwise age into "stalled") until its successor posts.

The supervisor's listener, not a worker's, so that it stays up while a worker is
restarted and never competes with relaying for a worker's event loop. Workers are
started with multiprocessing's "spawn" (a fresh interpreter, nothing inherited
from the supervisor's event loop), in their own process group (a terminal's
Ctrl-C reaches the supervisor, which stops them in order), and stop by themselves
if the supervisor goes away (their end of its pipe closes).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing
import os
import secrets
import signal
import sys
import time
from typing import Any, Mapping

from .config import Config
from .observers.capture.config import DEFAULT_MAX_TOTAL_BYTES, DEFAULT_PREFIX, CaptureConfig, worker_prefix
from .proxy.log_budget import LogBudget
from .admin.worker_admin import WorkerAdmin, WorkerView
from .probes.probe_board import Board
from .probes.probes import ProbeProcess

log = logging.getLogger("kproxy.workers")

# A worker imports kproxy and binds its ports in well under a second; a busy machine
# (many workers starting at once, a slow disk) can take several times that.
WORKER_START_TIMEOUT_S = 60.0
# A worker that dies sooner than this after it began serving has not really run (a bad
# setting, a resource it cannot get); START_FAILURES_BEFORE_GIVING_UP of those in a row
# and the supervisor stops, so the cause is in front of the operator rather than in a loop.
MIN_UPTIME_S = 10.0
START_FAILURES_BEFORE_GIVING_UP = 3
# Pause before a restart: the first at once-ish, doubling while the worker keeps dying.
RESTART_DELAY_S = 0.5
MAX_RESTART_DELAY_S = 30.0
# One line per worker per interval about its restarts (the counter has them all).
RESTART_LOG_INTERVAL_S = 60.0
# After shutdown_timeout, workers still running get this long before SIGKILL (their own
# stop closes listeners and capture files after the drain).
STOP_GRACE_S = 5.0


# ---------------------------------------------------------------- what each worker gets

def capture_settings(settings: Mapping[str, Any] | None, defaults: CaptureConfig | None,
                     index: int, workers: int) -> dict:
    """One worker's share of a capture started over HTTP (``settings``, the request's body,
    over the operator's ``defaults``): its own file prefix and 1/``workers`` of
    ``max_total_bytes``. The body stays as sent: each worker parses it (a value that is not
    a number is passed on, for the worker to refuse with its usual message)."""
    settings = settings or {}
    prefix = settings.get("prefix") or (defaults.prefix if defaults else DEFAULT_PREFIX)
    total = settings.get("max_total_bytes", defaults.max_total_bytes if defaults else DEFAULT_MAX_TOTAL_BYTES)
    out = {**settings, "prefix": worker_prefix(prefix, index)}
    out["max_total_bytes"] = total // workers if isinstance(total, int) and not isinstance(total, bool) \
        else total
    return out


def audit_settings(audit, index: int):
    """One worker's audit file: ``audit.jsonl`` -> ``audit-w<index>.jsonl`` (one writer per
    file: rotation renames files under whoever else appends to them)."""
    if audit.path is None:
        return audit
    stem, ext = os.path.splitext(audit.path)
    return dataclasses.replace(audit, path=f"{stem}-w{index}{ext}")


def worker_config(config: Config, index: int, token: str) -> Config:
    """The config worker ``index`` runs: the operator's, with a private admin listener
    (loopback, any port, a token only the supervisor knows) and its share of the limits."""
    capture = config.capture.for_worker(index, config.workers) if config.capture is not None else None
    return dataclasses.replace(config, admin_listen=("127.0.0.1", 0), admin_token=token,
                               probe_listen=None,          # the supervisor answers probes
                               audit=audit_settings(config.audit, index),

                               max_connections=config.max_connections // config.workers,
                               capture=capture)


def become_worker(index: int, workers: int) -> None:
    """This process is worker ``index`` of ``workers``: ids apart from the other workers'
    (``worker_identity``), and a 1/workers share of the buffer budget."""
    from .proxy import worker_identity
    from .proxy.memory import share_budget
    worker_identity.run_as_worker(index, workers)
    share_budget(workers)


def _worker_main(config: Config, index: int, pipe, probe_board: Board | None) -> None:
    """A worker process's body (spawned): a whole kproxy that tells the supervisor when it
    serves, posting to slot ``index`` of ``probe_board`` (when the supervisor runs probes)."""
    os.setpgrp()              # a terminal's Ctrl-C goes to the supervisor, which stops us in order
    logging.basicConfig(level=config.log_level.upper(),
                        format=f"%(asctime)s %(levelname)s %(name)s [worker {index}] %(message)s")
    from .allocator import tune_allocator
    from .runtime import Runtime
    become_worker(index, config.workers)
    tune_allocator()
    runtime = Runtime(config, probe_slot=None if probe_board is None else (probe_board, index),
                      announce=False)                     # the supervisor logs the block
    try:
        import uvloop
        uvloop.run(_serve(runtime, pipe))
    except OSError as exc:
        pipe.send(("failed", str(exc)))
        sys.exit(1)


async def _serve(runtime, pipe) -> None:
    """A worker serves as a single kproxy does, and also stops when its supervisor is gone."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def supervisor_gone():
        # The supervisor never writes: the pipe turns readable only when it has gone.
        loop.remove_reader(pipe.fileno())
        logging.getLogger("kproxy").warning("the supervisor is gone: stopping")
        stop.set()
    loop.add_reader(pipe.fileno(), supervisor_gone)
    await runtime.run_until_signalled(stop, lambda: pipe.send(("serving", runtime.admin.address[1])))


# ---------------------------------------------------------------- the supervisor

class GiveUp(Exception):
    """The workers cannot be kept running; the message says why, in one line."""


@dataclasses.dataclass(eq=False)
class _Worker:
    index: int
    process: Any = None                  # multiprocessing.Process
    pipe: Any = None                     # its end of the worker's pipe
    admin_port: int | None = None
    state: str = "starting"
    started_at: float = 0.0
    restarts: int = 0
    quick_deaths: int = 0                # in a row: died before serving or within MIN_UPTIME_S
    last_exit: str | None = None

    def view(self) -> WorkerView:
        return WorkerView(self.index, self.state, self.process.pid if self.process else None,
                          self.admin_port, self.restarts, self.last_exit)


def _exit_reason(process) -> str:
    code = process.exitcode
    if code is None or code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


async def _readable(fd: int, timeout: float | None = None) -> bool:
    """True once ``fd`` is readable (a message, EOF, a process's exit), False at timeout."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    loop.add_reader(fd, lambda: ready.done() or ready.set_result(True))
    try:
        return await asyncio.wait_for(ready, timeout)
    except asyncio.TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)


class Supervisor:
    def __init__(self, config: Config):
        from .observers.metrics import SupervisorMetrics
        from .runtime import CAPTURE_ROUTES, LIVE_PREFIX
        self.config = config
        self.count = config.workers
        self._token = secrets.token_hex(32)
        self._spawn = multiprocessing.get_context("spawn")
        self.workers = [_Worker(i) for i in range(self.count)]
        self.metrics = SupervisorMetrics(self.count)
        self.stopping = False
        self._stop = asyncio.Event()
        self._restart_log = LogBudget(RESTART_LOG_INTERVAL_S, self.count)
        self.admin = WorkerAdmin(
            lambda: [w.view() for w in self.workers], self._token,
            admin_token=config.admin_token, protected=CAPTURE_ROUTES, protected_prefixes=(LIVE_PREFIX,),
            capture_settings=lambda body, index: capture_settings(body, config.capture, index, self.count),
            extra_metrics=self._supervisor_metrics, scrape_failed=self.metrics.scrape_failures.inc)
        # The probe port is the supervisor's (one port, however many workers), answered by
        # the probe process from the board each worker posts to.
        self.probes = self.board = None
        if config.probe_listen is not None:
            self.probes, self.board = ProbeProcess(), Board.create(self.count)

    def _vacate_slot(self, worker: _Worker, why: str) -> None:
        """``worker``'s process is gone: its probe slot says so until its successor posts."""
        if self.board is not None:
            self.board.reset(worker.index, f"restarting ({why})", time.monotonic())

    def _supervisor_metrics(self) -> bytes:
        from prometheus_client import generate_latest
        self.metrics.workers_up.set(sum(w.state == "serving" for w in self.workers))
        return generate_latest(self.metrics.registry)

    async def _start(self, worker: _Worker) -> str | None:
        """Start ``worker``'s process; None once it serves, else why it did not."""
        receive, send = self._spawn.Pipe(duplex=False)
        process = self._spawn.Process(target=_worker_main, name=f"kproxy-worker-{worker.index}",
                                      args=(worker_config(self.config, worker.index, self._token),
                                            worker.index, send, self.board))
        process.start()
        send.close()
        worker.process, worker.pipe, worker.admin_port = process, receive, None
        worker.state, worker.started_at = "starting", time.monotonic()
        if not await _readable(receive.fileno(), WORKER_START_TIMEOUT_S):
            process.kill()
            await asyncio.to_thread(process.join)
            return f"did not start within {WORKER_START_TIMEOUT_S:g}s"
        try:
            kind, detail = receive.recv()
        except (EOFError, OSError):                      # died before a word (a crash, a kill)
            await asyncio.to_thread(process.join)
            return _exit_reason(process)
        if kind != "serving":
            await asyncio.to_thread(process.join)
            return detail                                # the worker's own one line
        worker.admin_port, worker.state = detail, "serving"
        return None

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self._reload_tls)
        watchers: list[asyncio.Task] = []
        try:
            failures = await asyncio.gather(*(self._start(w) for w in self.workers))
            failed = [(w, why) for w, why in zip(self.workers, failures) if why is not None]
            if failed:
                worker, why = failed[0]
                raise GiveUp(f"cannot start: worker {worker.index}: {why}")
            if self.config.admin_listen is not None:
                from .runtime import start_admin
                await start_admin(self.admin, self.config.admin_listen)
            if self.probes is not None:
                await asyncio.to_thread(self.probes.start, self.board, *self.config.probe_listen)
            log.info("%d workers serving (pids %s)", self.count,
                     ", ".join(str(w.process.pid) for w in self.workers))
            from . import startup_log
            for line in startup_log.lines(self.config, startup_log.Bound(
                    bootstrap=self.config.listen,           # given, never 0, with workers
                    admin=None if self.config.admin_listen is None else self.admin.server.address,
                    probes=None if self.probes is None else self.probes.address,
                    capture_active=self.config.capture_autostart, workers=self.count)):
                log.info("%s", line)
            watchers += [loop.create_task(self._watch(w)) for w in self.workers]
            stop = loop.create_task(self._stop.wait())
            done, _ = await asyncio.wait([stop, *watchers], return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            for task in done:
                if task is not stop:
                    task.result()                        # a GiveUp from a watcher
            log.info("signal received: stopping %d workers (up to %gs for in-flight requests)",
                     self.count, self.config.shutdown_timeout)
            return 0
        finally:
            self.stopping = True
            for task in watchers:
                task.cancel()
            await self._stop_workers()
            await self.admin.stop()
            if self.probes is not None:
                await asyncio.to_thread(self.probes.stop)
                self.board.close()

    def _reload_tls(self) -> None:
        """SIGHUP: each worker reloads its own TLS files (each also watches them itself)."""
        for worker in self.workers:
            if worker.state == "serving" and worker.process.is_alive():   # its handler is set
                os.kill(worker.process.pid, signal.SIGHUP)

    async def _watch(self, worker: _Worker) -> None:
        """Keep ``worker`` running; raises GiveUp when it keeps dying at start."""
        delay = RESTART_DELAY_S
        while True:
            await _readable(worker.process.sentinel)
            if self.stopping:
                return
            await asyncio.to_thread(worker.process.join)
            lived = time.monotonic() - worker.started_at
            worker.last_exit = _exit_reason(worker.process)
            worker.state, worker.admin_port = "restarting", None
            self._vacate_slot(worker, worker.last_exit)
            self.admin.retire(worker.index, worker.process.pid)
            if lived < MIN_UPTIME_S:
                worker.quick_deaths += 1
                delay = min(delay * 2, MAX_RESTART_DELAY_S)
            else:
                worker.quick_deaths, delay = 0, RESTART_DELAY_S
            if worker.quick_deaths >= START_FAILURES_BEFORE_GIVING_UP:
                raise GiveUp(f"stopping: worker {worker.index} died {worker.quick_deaths} times in a row within "
                             f"{MIN_UPTIME_S:g}s of starting (last: {worker.last_exit})")
            worker.restarts += 1
            self.metrics.restarts.inc()
            unlogged = self._restart_log.admit(worker.index)
            if unlogged is not None:
                log.warning("worker %d (pid %d) died after %.0fs: %s; starting it again in %gs "
                            "(%d restarts of it so far%s)", worker.index, worker.process.pid, lived,
                            worker.last_exit, delay, worker.restarts,
                            f", {unlogged} other lines not logged" if unlogged else "")
            while True:
                await asyncio.sleep(delay)
                if self.stopping:
                    return
                why = await self._start(worker)
                if why is None:
                    break
                self._vacate_slot(worker, why)
                worker.quick_deaths += 1
                worker.last_exit = why
                if worker.quick_deaths >= START_FAILURES_BEFORE_GIVING_UP:
                    raise GiveUp(f"stopping: worker {worker.index} could not start again: {why}")
                delay = min(delay * 2, MAX_RESTART_DELAY_S)

    async def _stop_workers(self) -> None:
        """SIGTERM to every worker (each drains), SIGKILL to what is left after the grace."""
        running = [w.process for w in self.workers if w.process is not None and w.process.is_alive()]
        for process in running:
            process.terminate()
        deadline = time.monotonic() + self.config.shutdown_timeout + STOP_GRACE_S
        for process in running:
            await asyncio.to_thread(process.join, max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                log.warning("worker pid %d still running %gs after SIGTERM; killing it", process.pid,
                            self.config.shutdown_timeout + STOP_GRACE_S)
                process.kill()
                await asyncio.to_thread(process.join)
        for worker in self.workers:
            worker.state = "stopped"
            if worker.pipe is not None:
                worker.pipe.close()
        log.info("workers stopped")


def run(config: Config) -> int:
    """``kproxy run`` with ``workers`` > 1: supervise until signalled; the exit status."""
    import uvloop

    async def main() -> int:
        return await Supervisor(config).run()
    try:
        return uvloop.run(main())
    except GiveUp as exc:
        print(f"kproxy run: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:                                # the admin port taken
        print(f"kproxy run: error: cannot start: {exc}", file=sys.stderr)
        return 1
