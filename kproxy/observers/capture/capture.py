"""The Capture observer: a plain class with hook methods, controlled at run time.

::

    capture = Capture(instance_name="kproxy-a")   # proxy_instance of every row (default: host name)
    proxy observers: [..., capture]              # capture(info, events) on the event loop
    relay on close:  capture.connection_closed(info, in_flight=relay.in_flight)
    capture.start(CaptureConfig(directory="/var/lib/kproxy/capture", formats=("jsonl", "parquet")))
    capture.status()  ->  JSON-able dict
    capture.stop()                               # drains the queue, closes files (blocks, bounded)

Counters (cumulative over all sessions, never reset: wire them as
Prometheus counters) are plain int attributes; ``counters()`` returns them
all. Each is written by one thread only.
"""

from __future__ import annotations

import socket
import threading
from typing import Any, NamedTuple

from ..contract import NO_EVENTS, CloseCause, Interest
from .config import CaptureConfig
from .redact import decompression_refused
from .session import Session
from .summary import MAX_TOPIC_IDS, SCHEMA_VERSION, iso_utc

COUNTERS = (
    "enqueued",          # items queued for the writer (requests, responses, tokens, closes)
    "dropped",           # items dropped because the queue was full (never blocks the relay)
    "dropped_bytes",     # frame bytes of those
    "discarded",         # items still queued when a disk error stopped the capture
    "filtered",          # pairs left out by the address / API / client_id / sampling filters
    "filtered_topics",   # pairs left out by the topic filter (writer thread)
    "malformed_frames",  # frames that broke framing (written to pcapng as they were)
    "rows_written",      # request/response pairs written (JSONL and/or Parquet rows)
    "packets_written",   # pcapng packets written
    "bytes_written",     # bytes written to capture files, all formats
    "row_errors",        # pairs that could not be turned into a row (a bug; logged once)
    "write_errors",      # disk errors; each one stopped a capture
    "files_opened",
    "files_deleted",     # oldest files deleted to stay under max_total_bytes
    "rows_shipped",      # rows the capture.kafka cluster acknowledged (kafka_sink.py)
    "ship_dropped",      # rows refused because the producer's queue was full
    "ship_failed",       # rows the cluster did not take, or not before the capture stopped
    "files_uploaded",    # closed files the capture.s3 store took (s3_upload.py)
    "uploaded_bytes",    # their bytes
    "upload_failed",     # closed files not uploaded: refused, unreachable, gone, or at stop
    "upload_dropped",    # closed files not queued for upload: queue_max_files were waiting
)

class _Info(NamedTuple):
    """Stands in for ``proxy.relay.ConnectionInfo`` when an observer is called without one."""
    id: int
    client: tuple[str, int]
    listener: str
    upstream: tuple[str, int]
    node_id: int | None
    opened: float | None = None     # wall clock when the connection was accepted


_UNKNOWN = _Info(0, ("0.0.0.0", 0), "unknown", ("0.0.0.0", 0), None)


class CaptureError(RuntimeError):
    """A control request that cannot be honoured now (e.g. start while running)."""


class Capture:
    """Traffic capture observer. Idle until ``start``; safe to leave in the observer list."""

    def __init__(self, instance_name: str | None = None) -> None:
        # Written into every row, so captures merged from many kproxies stay apart.
        self.instance_name = instance_name or socket.gethostname()
        for name in COUNTERS:
            setattr(self, name, 0)
        self._session: Session | None = None
        self._control = threading.Lock()
        # Topic id -> name kproxy asked the broker for (``topic_named``): every capture starts with them.
        self.learned_topic_names: dict[str, str] = {}
        # Every event while a capture runs, none otherwise (the relay does not call it then).
        self.interest = Interest(NO_EVENTS)

    # ------------------------------------------------------------ hooks (event loop thread)

    def __call__(self, info, events) -> None:
        """The observer hook: filter and enqueue; O(1) per event, never blocks."""
        session = self._session
        if session is None or not session.active:
            return
        session.observe(info if info is not None else _UNKNOWN, events)

    def needs_bodies(self) -> bool:
        """Hook: while capturing, large frames are kept whole (rows summarize bodies, pcapng
        writes frames) instead of streamed past the observers."""
        return self.active

    def topic_named(self, topic_id, name: str) -> None:
        """Hook: kproxy asked the broker for a topic id's name (``proxy.topic_names``). Kept
        for captures started later, and given to a running one's writer: a dict store is
        atomic, and the writer thread only reads, updates and clears that dict."""
        learned = self.learned_topic_names
        if len(learned) > MAX_TOPIC_IDS:
            learned.clear()
        learned[str(topic_id)] = name
        session = self._session
        if session is not None and session.active:
            session.writer.topic_names[str(topic_id)] = name

    def connection_closed(self, info, reason: CloseCause | None = None, in_flight: int | None = None) -> None:
        """Hook: the proxied connection ``info`` closed. ``in_flight``: requests the tracker
        still had unanswered (``Relay.in_flight``), so exactly those get "unanswered" rows."""
        session = self._session
        if session is not None and session.active and info is not None:
            session.connection_closed(info, in_flight)

    # ------------------------------------------------------------ control (any thread)

    @property
    def active(self) -> bool:
        session = self._session
        return session is not None and session.active

    def start(self, config: CaptureConfig) -> dict:
        """Start capturing. CaptureError: already running; OSError: the directory or first
        files cannot be created (nothing started)."""
        with self._control:
            old = self._session
            if old is not None and old.active:
                raise CaptureError("a capture is already running; stop it first")
            if old is not None:
                old.stop(timeout=5.0)
            session = Session(self, config)
            session.start()
            self._session = session
            self.interest.set(None)
        return self.status()

    def stop(self, timeout: float = 30.0) -> dict:
        """Stop, write what is queued (up to ``timeout`` seconds), close files. Blocks:
        call it from a thread (``asyncio.to_thread``) when on the event loop."""
        with self._control:
            session = self._session
            if session is not None and session.writer.is_alive():
                session.stop(timeout)
            self.interest.set(NO_EVENTS)
        return self.status()

    def counters(self) -> dict[str, int]:
        """COUNTERS, plus ``decompression_refused``: compressed batches no capture in this
        process inflated past redact.MAX_INFLATED_BYTES (likely decompression bombs)."""
        return {**{name: getattr(self, name) for name in COUNTERS},
                "decompression_refused": decompression_refused()}

    def status(self) -> dict:
        """JSON-able state for the admin listener."""
        session = self._session
        out: dict[str, Any] = {"state": "off", "active": False, "schema_version": SCHEMA_VERSION,
                               "instance_name": self.instance_name, "counters": self.counters()}
        if session is None:
            return out
        running = session.active and session.writer.is_alive()
        out.update({
            "state": "running" if running else ("failed" if session.error else "stopped"),
            "active": running,
            "error": session.error,
            "started_at": iso_utc(session.started_at),
            "config": session.config.to_dict(),
            "files": session.writer.current_files() if running else {},
            "queue": {"items": session.queued_items, "bytes": session.queued_bytes,
                      "max_items": session.max_items, "max_bytes": session.max_bytes},
        })
        return out
