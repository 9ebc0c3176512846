"""The writer thread: everything slow about a capture happens here.

The event loop only filters and enqueues (see ``session.py``); this thread
takes items off the queue in order, pairs and decodes them, applies the
topic filter, builds rows and writes every enabled format, rotates files on
size and time, and flushes buffered Parquet rows every
``parquet_flush_seconds``.

Queue items are tuples ``(kind, info, payload, extra, size)``:

========  ====================  ============================================
kind      payload               meaning
========  ====================  ============================================
"req"     RequestReceived       a request (kept for pcapng order, unanswered
                                rows, and acks=0 rows, which it completes)
"resp"    ResponseReceived      a response; carries its request: one pair
"sasl"    SaslTokenPassed       a raw SASL token's size (pcapng placeholder)
"bad"     MalformedFrame        a frame that breaks framing (pcapng only)
"learn"   ResponseReceived      a Metadata response outside the filter, read
                                only to learn topic ids for the topic filter,
                                or an ApiVersions or SASL pair outside it,
                                read only for the connection's client
                                software or principal
"close"   monotonic time        the connection closed; extra = in-flight count
========  ====================  ============================================

An OSError from any file operation ends the capture: one ERROR log line,
``write_errors`` + 1, the observer stops enqueuing, queued items are
discarded (counted), files are closed as well as they still can be.
Traffic is never affected.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque

from .files import FileSet
from .jsonl import JsonlSink
from .pcapng import PcapngSink
from .redact import scrub_frame
from ...protocol.client_software import ClientSoftware, software_named
from ...protocol.api_keys import SASL_KEYS, ApiKey
from ...protocol.sasl import SaslPrincipal
from .summary import (OUTCOME_NO_RESPONSE, OUTCOME_RESPONSE, OUTCOME_UNANSWERED,
                      Facts, body_facts, build_row, fill_client_software)

log = logging.getLogger("kproxy.capture")

TICK_S = 0.25                  # flush / time-rotation check interval when idle
# The CPU-share pause (``writer_cpu_share``) is taken once this much is owed: short
# enough to keep each stretch the thread holds the interpreter lock brief, long
# enough that sleeping does not become the writer's main cost.
MIN_PAUSE_S = 0.002
MAX_CONNECTIONS_TRACKED = 100_000   # per-connection state kept without a close hook, at most
MAX_PENDING_PER_CONNECTION = 10_000  # a client that never gets answers cannot grow this forever
STOP = object()


class _Conn:
    __slots__ = ("info", "pending", "software", "sasl")

    def __init__(self, info):
        self.info = info
        self.pending: deque = deque()        # (RequestReceived, written to pcapng?)
        # The connection's client software (client_software.software_named: its latest
        # accepted ApiVersions v3+), filled on every later row of the connection.
        self.software: ClientSoftware | None = None
        self.sasl: SaslPrincipal | None = None    # its SASL exchange, once it starts one


class Writer(threading.Thread):
    def __init__(self, session):
        super().__init__(name="kproxy-capture", daemon=True)
        self.session = session
        self.capture = session.capture
        config = self.config = session.config
        self.filter = session.filter
        self.wall_offset = session.wall_offset
        # No file format (rows only shipped to Kafka): no directory is created or needed.
        self.files = FileSet(config.directory, config.prefix, config.rotate_bytes,
                             config.rotate_seconds, config.max_total_bytes,
                             self.capture) if config.file_formats else None
        self.jsonl = JsonlSink(self.files, self.capture) if "jsonl" in config.formats else None
        self.parquet = None
        if "parquet" in config.formats:
            from .parquet import ParquetSink     # pyarrow (~40 MiB) only when Parquet is written
            self.parquet = ParquetSink(self.files, self.capture, config.parquet_batch_rows,
                                       config.parquet_flush_seconds)
        self.pcap = PcapngSink(self.files, self.capture) if "pcapng" in config.formats else None
        self.kafka = None
        if "kafka" in config.formats:
            from .kafka_sink import KafkaSink    # confluent-kafka only when rows are shipped
            self.kafka = KafkaSink(config.kafka, self.capture)
        self.sinks = [s for s in (self.jsonl, self.parquet, self.pcap, self.kafka) if s is not None]
        self.uploader = None
        if config.s3 is not None:
            from .s3_upload import Uploader      # boto3 only when files are uploaded
            self.uploader = Uploader(config.s3, self.capture, self.capture.instance_name)
            self.files.on_finished = self.uploader.submit
        self.rows = self.jsonl is not None or self.parquet is not None or self.kafka is not None
        # With a topic filter a request's fate is known only with its response:
        # pcapng then writes both together.
        self.defer_pcap = self.filter.has_topics
        self.conns: dict[int, _Conn] = {}
        self.pending_bytes = 0               # frames of requests in all conns' pending
        self.topic_names: dict[str, str] = dict(self.capture.learned_topic_names)
        self.instance = self.capture.instance_name
        self._logged_row_error = False

    def open_files(self) -> None:
        """Create the first file of every format (in the caller's thread: errors reach start())."""
        try:
            if self.uploader is not None:
                self.uploader.open()
            for sink in self.sinks:
                sink.open()
            if self.files is not None:
                self.files.enforce_cap()
        except OSError:
            for sink in self.sinks:
                sink.abandon()
            if self.uploader is not None:
                self.uploader.finish()
            raise

    def current_files(self) -> dict[str, str | None]:
        return {sink.ext.lstrip("."): sink.path for sink in self.sinks}

    # ------------------------------------------------------------ loop

    def run(self) -> None:
        session, q = self.session, self.session.queue
        next_tick = time.monotonic() + TICK_S
        # Seconds of pause owed per second of this thread's CPU: share 0.25 -> 3.
        pause_per_cpu_s = (1.0 - self.config.writer_cpu_share) / self.config.writer_cpu_share
        owed = 0.0
        cpu = time.thread_time()
        try:
            while True:
                if owed >= MIN_PAUSE_S:
                    time.sleep(owed)         # the relay has the lock; the queue absorbs or drops
                    owed = 0.0
                try:
                    item = q.get(timeout=TICK_S)
                except queue.Empty:
                    item = None
                if item is STOP:
                    break
                if item is not None:
                    try:
                        self._handle(item)
                    except OSError:
                        raise
                    except Exception:                      # noqa: BLE001 - one bad pair never stops capture
                        self._row_error()
                    finally:
                        session.got_items += 1
                        session.got_bytes += item[4]
                now = time.monotonic()
                if now >= next_tick:
                    try:
                        for sink in self.sinks:
                            sink.tick(now)
                    except OSError:
                        raise
                    except Exception:                      # noqa: BLE001 - e.g. a Parquet batch pyarrow refused
                        self._row_error()
                    if self.jsonl is not None:
                        self.jsonl.flush()
                    next_tick = now + TICK_S
                spent, cpu = cpu, time.thread_time()
                owed += (cpu - spent) * pause_per_cpu_s
            for sink in self.sinks:
                sink.close()
            if self.uploader is not None:
                self.uploader.finish()
        except OSError as exc:
            self._fail(exc)
        except Exception as exc:                           # noqa: BLE001 - a bug: say so, stop cleanly
            log.exception("capture stopped: writer thread failed")
            self._fail(OSError(f"writer thread failed: {exc!r}"))
            self.capture.write_errors -= 1                 # not a disk error
            self.capture.row_errors += 1

    def _row_error(self) -> None:
        self.capture.row_errors += 1
        if not self._logged_row_error:
            self._logged_row_error = True
            log.exception("capture: a pair could not be written (skipped; further failures are "
                          "counted, not logged)")

    def _fail(self, exc: OSError) -> None:
        session = self.session
        session.active = False
        self.capture.write_errors += 1
        where = getattr(exc, "filename", None) or next((s.path for s in self.sinks if s.path), "")
        session.error = f"{where}: {exc.strerror or exc}" if where else str(exc)
        log.error("capture stopped: cannot write %s (%s); traffic is not affected",
                  where or self.config.directory, exc.strerror or exc)
        for sink in self.sinks:
            sink.abandon()
        if self.uploader is not None:
            self.uploader.finish()           # what closed whole before the error still goes
        discarded = 0
        while True:
            try:
                item = session.queue.get_nowait()
            except queue.Empty:
                break
            if item is not STOP:
                discarded += 1
                session.got_items += 1
                session.got_bytes += item[4]
        self.capture.discarded += discarded

    # ------------------------------------------------------------ items

    def _wall(self, monotonic: float) -> float:
        return monotonic + self.wall_offset

    def _conn(self, info) -> _Conn:
        conn = self.conns.get(info.id)
        if conn is None:
            if len(self.conns) >= MAX_CONNECTIONS_TRACKED:          # no close hook: forget the oldest
                oldest = next(iter(self.conns))
                self.pending_bytes -= sum(r.held_size for r, _ in self.conns.pop(oldest).pending)
                if self.pcap is not None:
                    self.pcap.streams.pop(oldest, None)
            conn = self.conns[info.id] = _Conn(info)
        return conn

    def _handle(self, item) -> None:
        kind, info, payload, extra, _ = item
        if kind == "resp":
            self._response(info, payload)
        elif kind == "req":
            self._request(info, payload)
        elif kind == "sasl":
            if self.pcap is not None:
                self.pcap.placeholder(info, payload.direction == "client", self._wall(payload.time),
                                      payload.size, f"kproxy: SASL token of {payload.size} bytes "
                                                    f"(never captured): replaced by zeros")
        elif kind == "bad":
            if self.pcap is not None:
                self.pcap.frame(info, payload.direction == "client", self._wall(payload.time),
                                payload.frame, f"kproxy: malformed frame: {payload.reason}")
        elif kind == "learn":
            if payload.api_key in SASL_KEYS:
                self._follow_sasl(self._conn(info), payload.request_event, payload)
                return
            if payload.api_key == ApiKey.API_VERSIONS:
                named = software_named(payload)
                if named is not None:
                    self._conn(info).software = named
                return
            response = payload.response
            if response is not None:
                facts = body_facts("response", payload.api_key, response.body, self.topic_names, Facts())
                self.topic_names.update(facts.topic_ids)
        elif kind == "close":
            self._close(info, payload, extra)

    def _request(self, info, event) -> None:
        conn = self._conn(info)
        if not event.expects_response:
            self._pair(conn, event, None, OUTCOME_NO_RESPONSE, written=False, row=True)
            return
        written = False
        if self.pcap is not None and not self.defer_pcap:
            self._pcap_frame(info, event, True)
            written = True
        pending = conn.pending
        if len(pending) >= MAX_PENDING_PER_CONNECTION:
            self._unpend(pending)
        pending.append((event, written))
        # Requests awaiting their response hold their frames (MBs for Produce); when
        # responses are dropped under overload they pile up. Past the queue's own bytes
        # bound the oldest of this connection are let go (their pairs lost, as dropped).
        self.pending_bytes += event.held_size
        while self.pending_bytes > self.config.queue_max_bytes and len(pending) > 1:
            self._unpend(pending)

    def _unpend(self, pending: deque):
        request, written = pending.popleft()
        self.pending_bytes -= request.held_size
        return request, written

    def _response(self, info, event) -> None:
        request = event.request_event
        conn = self._conn(info)
        written = False
        pending = conn.pending
        if pending and any(r is request for r, _ in pending):
            while pending:
                r, w = self._unpend(pending)
                if r is request:          # earlier ones: their responses were dropped
                    written = w
                    break
        self._pair(conn, request, event, OUTCOME_RESPONSE, written=written, row=True)

    def _close(self, info, when: float, in_flight: int | None) -> None:
        conn = self.conns.pop(info.id, None)
        if conn is not None and conn.pending:
            pending = list(conn.pending)
            self.pending_bytes -= sum(r.held_size for r, _ in pending)
            if in_flight is not None:           # the tracker knows what is really unanswered
                pending = pending[len(pending) - in_flight:] if in_flight else []
            for request, written in pending:
                self._pair(conn, request, None, OUTCOME_UNANSWERED, written=written,
                           row=self.config.record_unanswered)
        if self.pcap is not None:
            self.pcap.close_stream(info, self._wall(when))

    def _pair(self, conn: _Conn, request, response, outcome: str, written: bool, row: bool) -> None:
        """One request/response pair (response None: acks=0 or unanswered)."""
        info = conn.info
        built = None
        if (row and self.rows) or self.filter.has_topics:
            built, facts = build_row(info, request, response, outcome, self.wall_offset,
                                     self.topic_names, self.jsonl is not None and self.config.include_bodies,
                                     self.config.include_record_data, self.instance)
            self._with_software(conn, response, built)
            if request.api_key in SASL_KEYS and response is not None:
                self._follow_sasl(conn, request, response)
            if conn.sasl is not None and conn.sasl.principal is not None:
                built["principal"] = conn.sasl.principal
            if not self.filter.topics_ok(facts.topics):
                self.capture.filtered_topics += 1
                return
        if row and built is not None:
            if self.jsonl is not None:
                self.jsonl.write(built)
            if self.parquet is not None:
                self.parquet.write(built)
            if self.kafka is not None:
                self.kafka.write(built)
            self.capture.rows_written += 1
        if self.pcap is not None:
            if not written:
                self._pcap_frame(info, request, True)
            if response is not None:
                self._pcap_frame(info, response, False)

    @staticmethod
    def _follow_sasl(conn: _Conn, request, response) -> None:
        """A SaslHandshake / SaslAuthenticate pair: the user it names is the principal of the
        connection's later rows once the broker accepts the exchange (never the password)."""
        decoded, answer = request.request, response.response
        if decoded is None or answer is None or decoded.is_opaque:
            return
        if conn.sasl is None:
            conn.sasl = SaslPrincipal()
        conn.sasl.observe(request.api_key, decoded.body, answer.body)

    @staticmethod
    def _with_software(conn: _Conn, response, row: dict) -> None:
        """Follow the connection's client software (an accepted ApiVersions v3+ names it
        from this pair on) and put it on the row: every row carries its connection's
        software as of that pair (a refused ApiVersions row: the one before)."""
        if response is not None:
            named = software_named(response)
            if named is not None:
                conn.software = named
        fill_client_software(row, conn.software)

    def _pcap_frame(self, info, event, is_request: bool) -> None:
        if event.streamed:       # passed on before this capture began: only its header was kept
            self.pcap.frame(info, is_request, self._wall(event.time), event.frame,
                            f"kproxy: streamed frame of {event.size} bytes, only its header kept")
            return
        frame, note = scrub_frame(event.frame, "request" if is_request else "response",
                                  event.api_key, event.api_version, self.config.include_record_data)
        self.pcap.frame(info, is_request, self._wall(event.time), frame, note)
