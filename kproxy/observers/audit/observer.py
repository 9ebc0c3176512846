"""The Audit observer: a set lookup per pair on the event loop, the rest in a writer thread.

On the event loop (``__call__``), a response whose API key is not watched costs a
class check and one frozenset lookup; a request, the same. Audited requests and
answers, and the few pairs that say who a connection is (SaslHandshake,
SaslAuthenticate, ApiVersions), are put on a queue bounded by a count (the
event loop never waits: past the bound an item is dropped and counted). The
writer thread decodes, builds the event (``events.build_event``), appends it to
the JSON Lines file (rotated by ``logging.handlers.RotatingFileHandler``) and
logs it on ``kproxy.audit``, then counts it for ``kproxy_audit_events_total``.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import sys
import threading
import time
from collections import deque
from logging.handlers import RotatingFileHandler

from ...protocol.events import RequestReceived, ResponseReceived
from ...protocol.pair_fields import pair_fields
from ...protocol.api_keys import ApiKey
from ...protocol.sasl import SaslPrincipal
from ..contract import NO_EVENTS, CloseCause, Interest
from .config import AuditConfig
from .events import (AUDITED_APIS, WATCHED_APIS, Who, build_event,
                     is_outside_commit)

log = logging.getLogger("kproxy.audit")
API_VERSIONS_SOFTWARE_VERSION = 3      # ApiVersions v3+ names the client's software
# Pairs that name a connection's principal or software: read in the writer, in order.
WHO_APIS = frozenset({ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE, ApiKey.API_VERSIONS})
LOOKED_AT = WATCHED_APIS | WHO_APIS
# Connections whose principal and software are remembered at most (a close forgets one;
# this bounds what a missing close hook could leave behind).
MAX_CONNECTIONS_TRACKED = 100_000
# Audited requests remembered per connection until answered (a client pipelining more
# admin requests than this without answers is not one to follow further).
MAX_PENDING_PER_CONNECTION = 1_000
STOP_TIMEOUT_S = 10.0
# Latest events kept for the live page (newest first there): a page shows a screenful.
RECENT_EVENTS = 50
_STOP = object()
_ASK, _ANSWER, _LEARN, _CLOSE = range(4)
COUNTERS = ("enqueued", "dropped", "write_errors")


class _AuditFile(RotatingFileHandler):
    """A rotating JSON Lines file, 0600 (who changed what is for operators only), that
    keeps the error of a failed write for the writer to count (the stock handler prints it)."""

    def __init__(self, path: str, rotate_bytes: int, keep: int):
        self.failure: BaseException | None = None
        super().__init__(path, maxBytes=rotate_bytes, backupCount=keep, encoding="utf-8", delay=False)
        self.setFormatter(logging.Formatter("%(message)s"))

    def _open(self):
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return os.fdopen(fd, "a", encoding=self.encoding)

    def handleError(self, record) -> None:
        self.failure = sys.exc_info()[1]


class _Conn:
    __slots__ = ("who", "pending")

    def __init__(self, who: Who):
        self.who = who
        self.pending: list = []          # audited requests not answered yet, in order


class Audit:
    """The audit observer. ``start()`` opens the file (OSError: it cannot be) and starts the
    writer; ``stop()`` writes what is queued and closes it."""

    def __init__(self, config: AuditConfig, instance_name: str):
        self.config = config
        self.instance = instance_name
        self.enqueued = self.dropped = self.write_errors = 0
        self.events: dict[tuple[str, str], int] = {}       # (api, outcome) -> events written
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._put = self._got = 0       # each written by one thread only (no lock)
        self._file: _AuditFile | None = None
        self._thread: threading.Thread | None = None
        self._active = False
        self._conns: dict[int, _Conn] = {}
        self._wall_offset = time.time() - time.monotonic()
        self._logged_failure = False
        self._recent: deque = deque(maxlen=RECENT_EVENTS)     # appended by the writer thread
        self.interest = Interest(NO_EVENTS)     # the APIs it records while started

    # ------------------------------------------------------------ hooks (event loop thread)

    def __call__(self, info, events) -> None:
        for event in events:
            cls = event.__class__
            if cls is ResponseReceived:
                key = event.request_event.api_key
                if key in LOOKED_AT:
                    if key in WHO_APIS:
                        self._enqueue((_LEARN, info, event))
                    elif key != ApiKey.OFFSET_COMMIT or self._outside_commit(event.request_event):
                        self._enqueue((_ANSWER, info, event))
            elif cls is RequestReceived:
                key = event.api_key
                if key in WATCHED_APIS and (key in AUDITED_APIS or self._outside_commit(event)):
                    self._enqueue((_ASK, info, event))

    @staticmethod
    def _outside_commit(request_event) -> bool:
        request = request_event.request        # decoded once per event (the metrics read it too)
        return request is not None and not request.is_opaque and is_outside_commit(request.body)

    def _enqueue(self, item: tuple) -> None:
        if not self._active:
            return
        if self._put - self._got >= self.config.queue_max_items:
            self.dropped += 1
            return
        self._put += 1
        self.enqueued += 1
        self._queue.put(item)

    def connection_closed(self, info, reason: CloseCause | None = None, in_flight: int | None = None) -> None:
        if self._active and info is not None:
            self._put += 1                 # past the bound: it frees a connection's state
            self._queue.put((_CLOSE, info, None))

    # ------------------------------------------------------------ control

    @property
    def active(self) -> bool:
        return self._active

    def start(self) -> None:
        if self.config.path is not None:
            directory = os.path.dirname(os.path.abspath(self.config.path))
            os.makedirs(directory, exist_ok=True)
            self._file = _AuditFile(self.config.path, self.config.rotate_bytes, self.config.keep)
        self._active = True
        self.interest.set(frozenset(map(int, LOOKED_AT)))
        self._thread = threading.Thread(target=self._run, name="kproxy-audit", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Write what is queued (up to ``timeout`` seconds), close the file. Blocks."""
        if not self._active:
            return
        self._active = False
        self.interest.set(NO_EVENTS)
        self._queue.put(_STOP)
        if self._thread is not None:
            self._thread.join(timeout)
        if self._file is not None:
            self._file.close()

    def recent(self) -> list[dict]:
        """The latest events, newest first (the live page's audit section)."""
        return list(reversed(self._recent))

    def counters(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in COUNTERS}

    # ------------------------------------------------------------ writer thread

    def _run(self) -> None:
        q = self._queue
        while True:
            item = q.get()
            if item is _STOP:
                return
            self._got += 1
            try:
                self._handle(*item)
            except Exception:                 # noqa: BLE001 - a bug must not stop the audit
                log.exception("audit: an event could not be made; later ones go on")

    def _conn(self, info) -> _Conn:
        conn = self._conns.get(info.id)
        if conn is None:
            if len(self._conns) >= MAX_CONNECTIONS_TRACKED:
                self._conns.clear()
            conn = self._conns[info.id] = _Conn(Who(getattr(info, "principal", None)))
        return conn

    def _handle(self, kind: int, info, event) -> None:
        if kind == _CLOSE:
            conn = self._conns.pop(info.id, None)
            for request in conn.pending if conn is not None else ():
                self._write(info, conn.who, request, None)
            return
        conn = self._conn(info)
        if kind == _ASK:
            if len(conn.pending) < MAX_PENDING_PER_CONNECTION:
                conn.pending.append(event)
        elif kind == _ANSWER:
            request = event.request_event
            pending = conn.pending
            for index, asked in enumerate(pending):
                if asked is request:
                    del pending[index]
                    break
            self._write(info, conn.who, request, event)
        else:
            self._learn(conn.who, event)

    @staticmethod
    def _learn(who: Who, event) -> None:
        """A SASL pair (the principal, once the broker accepts the exchange) or an accepted
        ApiVersions v3+ (the client software: a connection's latest one counts)."""
        request, answer = event.request_event.request, event.response
        if request is None or answer is None or request.is_opaque or answer.is_opaque:
            return
        key = event.request_event.api_key
        if key == ApiKey.API_VERSIONS:
            if event.request_event.api_version >= API_VERSIONS_SOFTWARE_VERSION \
                    and not getattr(answer.body, "error_code", 0):
                fields = pair_fields(ApiKey.API_VERSIONS, request.body, None)
                who.software = (fields["client_software_name"], fields["client_software_version"])
            return
        if who.sasl is None:
            who.sasl = SaslPrincipal()
        if who.sasl.observe(key, request.body, answer.body):
            who.principal = who.sasl.principal

    def _write(self, info, who: Who, request, response) -> None:
        event = build_event(info, who, request, response, self._wall_offset, self.instance)
        line = json.dumps(event, separators=(",", ":"), ensure_ascii=False, default=str)
        self._recent.append(event)
        key = (event["api"], event["outcome"])
        self.events[key] = self.events.get(key, 0) + 1
        if self._file is not None:
            self._file.emit(logging.makeLogRecord({"msg": line, "levelno": logging.INFO,
                                                   "levelname": "INFO"}))
            failure, self._file.failure = self._file.failure, None
            if failure is not None:
                self.write_errors += 1
                if not self._logged_failure:
                    self._logged_failure = True
                    log.error("audit: cannot write %s (%s); events still go to this log "
                              "(further write errors are counted, not logged)", self.config.path, failure)
                if not self.config.log:
                    log.warning("%s", line)     # not lost: the operator's log keeps it
        if self.config.log:
            log.info("%s", line)
