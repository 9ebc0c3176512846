"""One running capture: the event-loop half (filter + enqueue) and its writer thread.

``observe`` runs on the event loop thread after the bytes are forwarded. It
does O(1) work per event and never blocks: a per-connection address check
(cached), the API / client_id / sampling check, and a ``put`` on an
unbounded ``queue.SimpleQueue`` whose bounds (items and bytes) are kept
here. When either bound is reached the event is dropped and counted. The
two halves count what they put and took in separate integers, each written
by one thread only, so no lock is needed.
"""

from __future__ import annotations

import queue
import time

from ...protocol.client_software import FIRST_NAMING_VERSION
from ...protocol.events import MalformedFrame, RequestReceived, ResponseReceived, SaslTokenPassed
from ...protocol.api_keys import SASL_KEYS as _SASL_KEYS, ApiKey   # SASL: they name the principal
from .config import CaptureConfig
from .writer import STOP, Writer

_ITEM_OVERHEAD = 200            # bytes charged per queued item besides its frames


class Session:
    def __init__(self, capture, config: CaptureConfig):
        self.capture = capture
        self.config = config
        self.filter = config.filter.compile()
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.max_items = config.queue_max_items
        self.max_bytes = config.queue_max_bytes
        self.put_items = self.put_bytes = 0          # written by the event loop thread only
        self.got_items = self.got_bytes = 0          # written by the writer thread only
        self.pcap = "pcapng" in config.formats
        # Requests are queued on their own for pcapng (wire order) and unanswered rows;
        # otherwise a pair travels as its response (which holds the request).
        self.want_requests = self.pcap or config.record_unanswered
        self.learn_metadata = self.filter.has_topics
        # A connection's client software and principal fill all its rows, so its ApiVersions
        # and SASL pairs are read even when a filter (APIs, sampling) leaves their rows out.
        self.learn_software = bool({"jsonl", "parquet", "kafka"} & set(config.formats))
        self.connection_ok: dict[int, bool] = {}
        self.seen: set[int] = set()                  # connections with something queued
        self.wall_offset = time.time() - time.monotonic()
        self.started_at = time.time()
        self.active = False
        self.error: str | None = None
        self.writer = Writer(self)

    def start(self) -> None:
        self.writer.open_files()                     # OSError here: start fails, nothing runs
        self.active = True
        self.writer.start()

    def stop(self, timeout: float) -> None:
        self.active = False
        self.queue.put(STOP)
        self.writer.join(timeout)

    @property
    def queued_items(self) -> int:
        return max(self.put_items - self.got_items, 0)

    @property
    def queued_bytes(self) -> int:
        return max(self.put_bytes - self.got_bytes, 0)

    # ------------------------------------------------------------ event loop thread

    def _put(self, item_kind: str, info, payload, extra, size: int) -> None:
        if (self.put_items - self.got_items >= self.max_items
                or self.put_bytes - self.got_bytes + size > self.max_bytes):
            capture = self.capture
            capture.dropped += 1
            capture.dropped_bytes += size
            return
        self.put_items += 1
        self.put_bytes += size
        self.seen.add(info.id)
        self.capture.enqueued += 1
        self.queue.put((item_kind, info, payload, extra, size))

    def observe(self, info, events) -> None:
        ok = self.connection_ok.get(info.id)
        if ok is None:
            if len(self.connection_ok) > 100_000:        # no close hook wired: do not grow forever
                self.connection_ok.clear()
            ok = self.connection_ok[info.id] = self.filter.connection_ok(info)
        capture = self.capture
        if not ok:
            capture.filtered += sum(1 for e in events if e.__class__ is ResponseReceived or (
                e.__class__ is RequestReceived and not e.expects_response))
            return
        request_ok = self.filter.request_ok
        conn_id = info.id
        for event in events:
            cls = event.__class__
            if cls is ResponseReceived:
                request = event.request_event
                if request_ok(conn_id, request):
                    # A response holds its request (and its frame: MBs for Produce) until
                    # written, even when the request was queued, or dropped, on its own:
                    # charge both, or the queue's bytes bound would not bound its memory.
                    self._put("resp", info, event, None, event.held_size + request.held_size + _ITEM_OVERHEAD)
                elif self.learn_metadata and request.api_key == ApiKey.METADATA:
                    self._put("learn", info, event, None, event.held_size + request.held_size + _ITEM_OVERHEAD)
                    capture.filtered += 1
                elif self.learn_software and (request.api_key in _SASL_KEYS or (
                        request.api_key == ApiKey.API_VERSIONS
                        and request.api_version >= FIRST_NAMING_VERSION)):
                    self._put("learn", info, event, None, event.held_size + request.held_size + _ITEM_OVERHEAD)
                    capture.filtered += 1
                else:
                    capture.filtered += 1
            elif cls is RequestReceived:
                if self.want_requests or not event.expects_response:
                    if request_ok(conn_id, event):
                        self._put("req", info, event, None, event.held_size + _ITEM_OVERHEAD)
                    elif not event.expects_response:     # pairs are counted once, at their end
                        capture.filtered += 1
            elif cls is SaslTokenPassed:
                if self.pcap:
                    self._put("sasl", info, event, None, _ITEM_OVERHEAD)
            elif cls is MalformedFrame:
                capture.malformed_frames += 1
                if self.pcap:
                    self._put("bad", info, event, None, event.size + _ITEM_OVERHEAD)

    def connection_closed(self, info, in_flight: int | None) -> None:
        self.connection_ok.pop(info.id, None)
        if info.id in self.seen:
            self.seen.discard(info.id)
            # Bypasses the bounds: one small item per connection that had something queued,
            # so streams and unanswered requests are always closed out.
            self.put_items += 1
            self.put_bytes += _ITEM_OVERHEAD
            self.queue.put(("close", info, time.monotonic(), in_flight, _ITEM_OVERHEAD))
