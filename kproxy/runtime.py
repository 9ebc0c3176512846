"""Start and stop a whole kproxy: the proxy listeners, the admin listener and the probe process.

Used by ``kproxy run``, the demo and end-to-end tests, so all three run the
same wiring. Shutdown order: stop accepting connections and reading new requests
(``/readyz`` turns 503), close each connection once its in-flight requests are
answered (all by ``shutdown_timeout``), close the admin port, then the probe port.
``/readyz`` is also 503 while a broker listener cannot be bound (one line per
listener says why). ``/healthz`` and ``/readyz`` answer the same on the admin port
and on the probe port (``probe_listen``: a process of its own reading what the
event loop posts to the probe board; see ``probes/probes.py``).
"""

from __future__ import annotations

import asyncio
import errno
import gc
import json
import logging
import os
import signal
import time
from typing import Callable, Iterable

from prometheus_client import generate_latest

from . import startup_log
from .config import Config, show_address
from .observers.audit import Audit
from .observers.policy import PolicyObserver
from .observers.failover import Failovers
from .observers.capture import Capture
from .observers.capture import control as capture_control
from .observers.live import LiveView
from .observers.metrics import Metrics
from .observers.telemetry import ClientTelemetry
from .admin.admin import AdminServer, SharedRender, metrics_answer
from .admin.live_web import LiveRoutes
from .probes.probe_board import Board
from .probes.probes import LoopHeartbeat, ProbeProcess, Readiness
from .proxy.relay import Observer
from .proxy.worker_identity import worker_ids
from .proxy.server import Proxy

log = logging.getLogger("kproxy")

# Need the admin token. The status is included: it names the capture directory, file
# names and filters (client ids, topics); capture's counters stay public on /metrics.
CAPTURE_ROUTES = frozenset({"/capture", "/capture/start", "/capture/stop"})
# The live page's data (pairs, overview, downloads) needs the token too; the page's own
# HTML/JS/CSS, the same for everyone, does not (it asks for the token).
LIVE_PREFIX = "/live/"


def _json(status: int, payload: dict) -> tuple[int, str, bytes]:
    return status, "application/json", (json.dumps(payload, indent=2, default=str) + "\n").encode()


def _ready_answer(ok: bool, detail: str) -> tuple[int, str, bytes]:
    return (200 if ok else 503), "text/plain", (detail + "\n").encode()


async def start_admin(server, address: tuple[str, int]) -> None:
    """Start an admin listener; an address it cannot take fails naming admin_listen."""
    host, port = address
    try:
        await server.start(host, port)
    except OSError as exc:           # taken, not an address of this host, a name that does not resolve
        # aiohttp words a bind failure itself, quoting the address; the errno says it plainly.
        # (A name that does not resolve: a gaierror, its errno negative and its strerror plain.)
        why = os.strerror(exc.errno).lower() if (exc.errno or 0) > 0 else (exc.strerror or str(exc))
        if exc.errno == errno.EADDRNOTAVAIL:
            why += " (not an address of this host)"
        raise OSError(f"admin_listen {show_address(host, port)}: {why}") from None


class Runtime:
    """``probe_slot``: (board, slot) to post this process's heartbeat and readiness to, for a
    worker whose supervisor runs the probe process; without it, ``probe_listen`` makes the
    runtime start a probe process of its own (a board of one slot). ``announce``: log the
    start-up block (``startup_log``) once serving."""

    def __init__(self, config: Config, observers: Iterable[Observer] = (),
                 probe_slot: tuple[Board, int] | None = None, announce: bool = True):
        self.config = config
        self.announce = announce            # log the start-up block (a worker's supervisor does)
        self.capture = Capture(instance_name=config.instance_name)
        # The audit trail (file and/or kproxy.audit log lines); not an observer when both are off.
        self.audit = Audit(config.audit, config.instance_name) if config.audit.enabled else None
        # Client telemetry (KIP-714) harvested from relayed pushes, when asked for.
        self.telemetry = ClientTelemetry(config.metrics_label_cap) if config.client_telemetry else None
        # Policy rules judged on every request (policy_file); requests refused by enforced ones counted.
        self.policy = (PolicyObserver(config.policy, config.metrics_label_cap)
                       if config.policy is not None else None)
        self.metrics = Metrics(client_id_label=config.metrics_client_id_label,
                               topic_label=config.metrics_topic_label,
                               group_label=config.metrics_group_label,
                               principal_label=config.metrics_principal_label,
                               label_cap=config.metrics_label_cap, capture=self.capture,
                               audit=self.audit, telemetry=self.telemetry, policy=self.policy,
                               in_flight=lambda: self.proxy.in_flight(),
                               traffic=lambda: self.proxy.traffic(),
                               unbound_listeners=lambda: len(self.proxy.unbound))
        # Record data in the live page only when the operator allows it in capture files.
        self.live = LiveView(include_record_data=config.capture_allow_record_data,
                             instance_name=config.instance_name, pair_ids=worker_ids(),
                             telemetry=self.telemetry)
        # What leader changes cost each client (live page, kproxy_failover_recovery_seconds).
        self.failovers = Failovers(on_failover=self.metrics.failover_recovered)
        self.live.panels["failovers"] = self.failovers.recent
        audit = [self.audit] if self.audit is not None else []
        if self.audit is not None:
            self.live.panels["audit"] = self.audit.recent
        telemetry = [self.telemetry] if self.telemetry is not None else []
        policy = [self.policy] if self.policy is not None else []
        self.proxy = Proxy(config, [self.metrics, self.capture, self.live, *audit, self.failovers, *telemetry,
                                    *policy, *observers],
                           policy_refused=self.policy.refused if self.policy is not None else None)
        self.admin = AdminServer({
            "/healthz": self._healthz, "/readyz": self._readyz, "/metrics": self._metrics,
            "/capture": self._capture_status,
            "/capture/start": {"POST": self._capture_start},
            "/capture/stop": {"POST": self._capture_stop},
        }, admin_token=config.admin_token, protected=CAPTURE_ROUTES,
            web_routes=LiveRoutes(self.live, self.policy).routes(), protected_prefixes=(LIVE_PREFIX,))
        # /healthz on either port: the event loop's heartbeat (probes.LoopHeartbeat).
        self.heartbeat = LoopHeartbeat()
        self.probe_slot = probe_slot
        self.probes = ProbeProcess() if config.probe_listen is not None and probe_slot is None else None
        self._own_board: Board | None = None                # the probe process's, when it is ours
        # prometheus-client's own exposition, rendered in a worker thread and shared by
        # concurrent scrapes (see admin.SharedRender): a scrape storm costs one render.
        self.scrape = SharedRender(lambda: generate_latest(self.metrics.registry))

    async def _metrics(self):
        return await metrics_answer(self.scrape)

    async def _capture_status(self):
        return _json(*capture_control.capture_status(self.capture))

    async def _capture_start(self, body: bytes):
        settings = capture_control.parse_json_body(body)
        if isinstance(settings, tuple):                        # (400, error)
            return _json(*settings)
        return _json(*await asyncio.to_thread(self._start_capture, settings))

    def _start_capture(self, settings: dict) -> tuple[int, dict]:
        """The operator's settings bound every start: root, record data, table defaults."""
        return capture_control.start_capture(
            self.capture, settings, self.config.capture, root=self.config.capture_root,
            allow_record_data=self.config.capture_allow_record_data)

    async def _capture_stop(self, body: bytes):
        return _json(*await asyncio.to_thread(capture_control.stop_capture, self.capture))

    async def _healthz(self):
        return self.heartbeat.health()

    def _readiness_now(self) -> tuple[bool, str] | None:
        """The /readyz answer if it needs no request to a broker."""
        if not self.proxy.started:
            return False, "starting"
        if self.proxy.stopping:             # draining: load balancers should send no one new
            return False, "stopping"
        unbound = self.proxy.unbound_reasons()
        if unbound:                         # some brokers are withheld from clients meanwhile
            return False, "\n".join(unbound)
        return None

    async def _readyz(self):
        known = self._readiness_now()
        return _ready_answer(*(known or await self.proxy.upstream_ready()))

    def _readiness_posted(self) -> Readiness:
        """What the event loop posts to the probe board: the answer now, or the broker
        check's last answer and when it was established (the probe process asks for a
        new check when that is too old)."""
        known = self._readiness_now()
        if known is not None:
            return (*known, time.monotonic())
        last = self.proxy.own_requests.last_readiness
        if last is None:
            return False, "the upstream has not been checked yet", 0.0
        when, (ready, detail) = last
        return ready, detail, when

    @property
    def admin_url(self) -> str | None:
        if self.admin.server is None:
            return None
        host, port = self.admin.address
        return f"http://{host}:{port}"

    @property
    def probe_url(self) -> str | None:
        if self.probes is None or not self.probes.running:
            return None
        host, port = self.probes.address
        return f"http://{host}:{port}"

    async def start(self) -> None:
        if self.probes is not None:
            self._own_board = Board.create(1)
            self.probe_slot = (self._own_board, 0)
        if self.probe_slot is not None:
            self.heartbeat.post_to(*self.probe_slot, self._readiness_posted, self.proxy.upstream_ready)
        self.heartbeat.start(asyncio.get_running_loop())
        if self.audit is not None:
            try:
                await asyncio.to_thread(self.audit.start)
            except OSError as exc:
                raise OSError(f"audit: cannot open {self.config.audit.path}: {exc.strerror or exc}") from None
        if self.config.capture_autostart:
            status, detail = await asyncio.to_thread(self._start_capture, {})
            if status != 200:
                raise OSError(f"capture_autostart: {detail.get('error', detail)}")
        await self.proxy.start()
        if self.config.admin_listen is not None:
            await start_admin(self.admin, self.config.admin_listen)
        self.heartbeat.post()                             # "starting" no more
        if self.probes is not None:
            await asyncio.to_thread(self.probes.start, self._own_board, *self.config.probe_listen)
        if self.announce:
            for line in startup_log.lines(self.config, startup_log.Bound(
                    bootstrap=self.proxy.bootstrap_address,
                    admin=None if self.admin.server is None else self.admin.address,
                    probes=None if self.probes is None else self.probes.address,
                    capture_active=self.capture.active)):
                log.info("%s", line)

    async def stop(self) -> None:
        await self.proxy.stop()
        await asyncio.to_thread(self.live.close)          # live streams end
        await self.admin.stop()
        if self.probes is not None:                       # probes say "stopping" until here
            await asyncio.to_thread(self.probes.stop)
        self.heartbeat.stop()
        if self._own_board is not None:
            self._own_board.close()
            self._own_board = None
        if self.capture.active:
            await asyncio.to_thread(self.capture.stop)
        if self.audit is not None:                        # after the drain: every answer is in
            await asyncio.to_thread(self.audit.stop)

    async def run_until_signalled(self, stop: asyncio.Event | None = None,
                                  serving: Callable[[], object] | None = None) -> None:
        """Serve until SIGTERM or SIGINT (or ``stop`` is set), then shut down gracefully;
        SIGHUP reloads the TLS files. ``serving`` is called once kproxy serves (a worker
        tells its supervisor). The one serving path of both a process and a worker."""
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, self.proxy.reload_tls)
        await self.start()
        # What exists now (modules, the Kafka schema tables: ~46,000 objects) lives as long
        # as the process. Frozen, a full garbage collection no longer walks it each time
        # (20 ms a pass, measured), and a collection holds the interpreter lock, which the
        # event loop and its helper threads wait for. Here, not in start(): a process
        # that starts many runtimes (the tests) would freeze each one's leftovers.
        gc.collect()
        gc.freeze()
        try:
            if serving is not None:
                serving()
            await stop.wait()
            log.info("shutting down (up to %gs for in-flight requests)", self.config.shutdown_timeout)
        finally:
            await self.stop()
