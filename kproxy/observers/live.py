"""The live view: request/response pairs, as they happen, for people watching the admin page.

An observer like capture, fed after the bytes are forwarded. With nobody
watching, its hook only keeps the client inventory: a set lookup that reads a
new connection's first request (its client_id), and a look at each response
for ApiVersions (a connection's client software is its latest accepted
ApiVersions v3+: ``protocol.client_software``), so a kproxy whose page is
closed pays nothing measurable (see benchmarks/README.md).

While someone watches::

    relay (event loop)  --pairs-->  bounded queue  -->  live thread: build_row (capture's
                                                        summary), overview, recent pairs
                                                        --rows-->  each viewer's bounded backlog
                                                                   --> its HTTP stream

- The event loop only enqueues (O(1) per pair); the queue is bounded in
  pairs and frame bytes: past that pairs are not analysed (``overloaded``).
- The live thread decodes and summarizes each pair once, whatever the number
  of viewers, with the capture's ``build_row``; its CPU share is bounded
  (``LIVE_CPU_SHARE``) so it never starves forwarding of the interpreter lock.
- Each viewer has its own filter (the capture's ``CaptureFilter``: APIs,
  client_id glob, client address, topics; plus errors only and a minimum
  latency), a rate cap (``VIEWER_MAX_ROWS_PER_S``: more is unreadable; the
  excess is ``thinned``) and a backlog of at most ``VIEWER_BACKLOG`` rows: a
  viewer that does not keep up loses rows (``dropped``), never slows anyone.
- The last minutes of pairs are kept (``RECENT_*`` bounds; dropped when the
  last viewer leaves) for the detail view (the capture's JSON form of a pair, redacted the same way, record data
  only if ``include_record_data``) and a connection's pcapng download.
- The overview (per-API rate, p99 latency, error rate over ``OVERVIEW_WINDOW_S``)
  is computed from the same rows while someone watches; connections by listener
  and the client inventory (ApiVersions v3+ software, client_id, address, API
  versions used) come from connection hooks, each connection's first request
  (its client_id) and its latest accepted ApiVersions v3+ (its software, and the
  client_id that request carried).
"""

from __future__ import annotations

import bisect
import itertools
import json
import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from typing import Any, Callable, Iterator, Mapping

from ..protocol.client_software import ClientSoftware, software_named
from ..protocol.events import RequestReceived, ResponseReceived
from ..protocol.api_keys import ApiKey
from .contract import CloseCause, Interest
from .capture.filters import CaptureFilter, header_client_id
from .capture.jsonl import json_form
from .capture.pcapng import stream_file
from .capture.redact import scrub_frame
from .capture.summary import (MAX_TOPIC_IDS, OUTCOME_NO_RESPONSE, OUTCOME_RESPONSE, build_row,
                              fill_client_software)

log = logging.getLogger("kproxy.live")

# Browsers (and people) cannot follow more; each viewer holds a thread-free backlog and a socket.
MAX_VIEWERS = 16
# Rows waiting for one viewer's stream (~1 KiB each): a browser further behind loses rows.
VIEWER_BACKLOG = 1000
# A page cannot show more than this many rows a second usefully; the excess is counted as thinned.
VIEWER_MAX_ROWS_PER_S = 200
# Pairs waiting for the live thread, and the frame bytes they hold: past either the
# thread cannot keep up and pairs go unanalysed (counted), so memory stays bounded.
PENDING_MAX_PAIRS = 20_000
PENDING_MAX_BYTES = 64 * 1024 * 1024
# Pairs kept for the detail view and pcapng downloads: "the last minutes", bounded in
# count and in frame bytes (a few large Produce requests would otherwise hold MBs each).
RECENT_MAX_PAIRS = 5000
RECENT_MAX_BYTES = 32 * 1024 * 1024
RECENT_MAX_AGE_S = 300.0
# Audit events and failovers on a page merged from workers' (each worker keeps its latest).
MERGED_PANEL_ROWS = 200
# Per-API rate, p99 and error rate over this many recent seconds.
OVERVIEW_WINDOW_S = 300
OVERVIEW_SHORT_S = 60
# The live thread's share of one CPU at most; the rest is the relay's (same idea as
# capture's writer_cpu_share: a thread holding the interpreter lock delays the event loop).
# Lower than capture's 0.25: a page is a person looking, and a thinned stream (counted,
# shown) serves them as well; bench_live.py measured a page open at +122 % per pair at
# 0.25 on a 2-core machine under load.
LIVE_CPU_SHARE = 0.1
MIN_PAUSE_S = 0.002
# Closed connections kept in the client inventory (open ones are all there).
INVENTORY_CLOSED = 500
# Topics sent per row to the page (a Metadata request for everything names hundreds).
ROW_TOPICS = 10
# Latency histogram for p99: 0.05 ms to ~60 s, 25% apart (p99 is exact to that).
LATENCY_EDGES_MS = tuple(0.05 * 1.25 ** i for i in range(64))
_ITEM_OVERHEAD = 200
# What the live view reads while nobody watches: ApiVersions answers (a connection's software).
_INVENTORY_APIS = frozenset({int(ApiKey.API_VERSIONS)})
_STOP = object()


class ViewerFilter:
    """What one viewer wants: the capture's filter plus errors-only and a minimum latency."""

    KEYS = ("apis", "client_id", "clients", "topics", "errors", "min_latency_ms")

    def __init__(self, spec: Mapping[str, Any] | None = None):
        spec = dict(spec or {})
        unknown = set(spec) - set(self.KEYS)
        if unknown:
            raise ValueError(f"filter.{sorted(unknown)[0]}: unknown (one of {', '.join(self.KEYS)})")
        self.errors_only = str(spec.pop("errors", "")).lower() in ("1", "true", "yes", "on")
        try:
            self.min_latency_ms = float(spec.pop("min_latency_ms", 0) or 0)
        except (TypeError, ValueError):
            raise ValueError("filter.min_latency_ms: expected a number") from None
        self.spec = CaptureFilter.from_dict({k: v for k, v in spec.items() if v not in (None, "", [])},
                                            key="filter")
        self.compiled = None

    def compile(self) -> "ViewerFilter":
        """Resolve host names (blocking: call from a thread)."""
        self.compiled = self.spec.compile()
        return self

    def describe(self) -> dict:
        return {**{k: v for k, v in self.spec.to_dict().items() if v and k != "sample"},
                "errors": self.errors_only, "min_latency_ms": self.min_latency_ms}

    def matches(self, info, request, row: dict) -> bool:
        compiled = self.compiled
        if not compiled.connection_ok(info) or not compiled.request_ok(info.id, request):
            return False
        if compiled.has_topics and not compiled.topics_ok(row["topics"]):
            return False
        if self.errors_only and not (row["error_count"] or row["decode_error"]):
            return False
        if self.min_latency_ms and (row["latency_ms"] or 0.0) < self.min_latency_ms:
            return False
        return True


class RowBacklog:
    """Rows on their way to one page's stream: a per-second cap and a bounded backlog, so a
    page that does not keep up loses rows (counted) and never slows anyone."""

    def __init__(self):
        self.backlog: deque = deque()
        self.matched = 0          # rows that passed the filter
        self.sent = 0             # rows taken for the stream
        self.dropped = 0          # rows lost because the backlog was full (the viewer is slow)
        self.thinned = 0          # rows left out by the per-second cap
        self._second = 0
        self._this_second = 0

    def offer(self, row: dict, now: float) -> None:
        """Keep the row unless the rate cap or the backlog says no (the live thread's call,
        or the supervisor's loop merging workers' rows)."""
        self.matched += 1
        second = int(now)
        if second != self._second:
            self._second, self._this_second = second, 0
        if self._this_second >= VIEWER_MAX_ROWS_PER_S:
            self.thinned += 1
            return
        self._this_second += 1
        if len(self.backlog) >= VIEWER_BACKLOG:
            self.dropped += 1
            return
        self.backlog.append(row)

    def take(self) -> list[dict]:
        """Event loop: everything waiting, oldest first."""
        rows = []
        backlog = self.backlog
        while backlog:
            rows.append(backlog.popleft())
        self.sent += len(rows)
        return rows


class Viewer(RowBacklog):
    """One connected page: its filter, its bounded backlog, what it missed."""

    def __init__(self, live: "LiveView", row_filter: ViewerFilter):
        super().__init__()
        self.live = live
        self.filter = row_filter

    def status(self) -> dict:
        live = self.live
        return {"matched": self.matched, "sent": self.sent, "dropped": self.dropped,
                "thinned": self.thinned, "overloaded": live.overloaded,
                "backlog": len(self.backlog), "filter": self.filter.describe()}


class _Client:
    __slots__ = ("id", "host", "port", "listener", "opened", "closed", "client_id", "software", "apis")

    def __init__(self, info):
        self.id = info.id
        self.host, self.port = info.client
        self.listener = info.listener
        self.opened = info.opened or time.time()
        self.closed: float | None = None
        self.client_id: str | None = None
        self.software: ClientSoftware | None = None
        self.apis: set[tuple[str, int]] = set()         # (API name, version) seen while watched


class _Window:
    """Per-second, per-API counts, errors and a latency histogram over the last minutes."""

    def __init__(self):
        self.lock = threading.Lock()
        self.seconds: deque = deque()          # (second, {api: [count, errors, no_latency, hist]})
        self.since: float | None = None

    def add(self, second: int, api: str, latency_ms: float | None, failed: bool) -> None:
        with self.lock:
            seconds = self.seconds
            if not seconds or second > seconds[-1][0]:
                seconds.append((second, {}))
                while seconds and seconds[0][0] <= second - OVERVIEW_WINDOW_S:
                    seconds.popleft()
                if self.since is None:
                    self.since = float(second)
            per_api = seconds[-1][1]
            entry = per_api.get(api)
            if entry is None:
                entry = per_api[api] = [0, 0, [0] * (len(LATENCY_EDGES_MS) + 1)]
            entry[0] += 1
            if failed:
                entry[1] += 1
            if latency_ms is not None:
                entry[2][bisect.bisect_left(LATENCY_EDGES_MS, latency_ms)] += 1

    def snapshot(self, now: float) -> dict:
        with self.lock:
            seconds = [(s, {api: (e[0], e[1], list(e[2])) for api, e in per.items()})
                       for s, per in self.seconds if s > now - OVERVIEW_WINDOW_S]
        span, short_span = _spans(self.since, now)
        apis: dict[str, dict] = {}
        for second, per in seconds:
            recent = second > now - OVERVIEW_SHORT_S
            for api, (count, errors, hist) in per.items():
                a = apis.setdefault(api, {"count": 0, "errors": 0, "recent": 0,
                                          "hist": [0] * len(hist)})
                a["count"] += count
                a["errors"] += errors
                if recent:
                    a["recent"] += count
                a["hist"] = [x + y for x, y in zip(a["hist"], hist)]
        rows = []
        for api, a in sorted(apis.items(), key=lambda kv: -kv[1]["count"]):
            rows.append(_api_traffic(api, a["count"], a["recent"], a["errors"], a["hist"], span, short_span))
        return {"window_s": OVERVIEW_WINDOW_S, "recent_s": OVERVIEW_SHORT_S, "span_s": round(span, 1),
                "since": self.since, "apis": rows}


def _held_size(request, response) -> int:
    """What a pair holds of its frames (a request without an answer: the request's)."""
    return request.held_size + (response.held_size if response is not None else 0)


def _spans(since: float | None, now: float) -> tuple[float, float]:
    """Seconds the overview's rates are over: since traffic was first seen while watched,
    at most the window (and its recent part)."""
    span = min(OVERVIEW_WINDOW_S, max(1.0, now - since)) if since is not None else 1.0
    return span, min(OVERVIEW_SHORT_S, span)


def _api_traffic(api: str, count: int, recent: int, errors: int, hist: list[int],
                 span: float, short_span: float) -> dict:
    """One API's line of the overview; ``recent`` and the non-zero latency buckets are
    there too, for ``merge_overviews``."""
    return {"api": api, "count": count, "recent": recent,
            "rate_per_s": round(count / span, 3),
            "rate_recent_per_s": round(recent / short_span, 3),
            "p99_ms": _percentile(hist, 0.99),
            "error_rate": round(errors / count, 4) if count else 0.0,
            "errors": errors,
            "latency_buckets": {str(i): n for i, n in enumerate(hist) if n}}


def _percentile(hist: list[int], q: float) -> float | None:
    total = sum(hist)
    if not total:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(hist):
        seen += n
        if seen >= rank:
            return round(LATENCY_EDGES_MS[min(i, len(LATENCY_EDGES_MS) - 1)], 3)
    return round(LATENCY_EDGES_MS[-1], 3)


class LiveView:
    """The observer behind the admin page's live stream, detail view and overview.

    ``include_record_data``: record keys/values in the detail view and pcapng
    downloads (the operator's ``capture_allow_record_data``); otherwise redacted.
    """

    def __init__(self, include_record_data: bool = False, instance_name: str | None = None,
                 pair_ids: Iterator[int] | None = None, telemetry=None):
        """``pair_ids``: where pair ids come from (as a worker: ids no other worker uses);
        ``telemetry``: the client telemetry harvest, whose clients the overview lists."""
        self.telemetry = telemetry
        self.include_record_data = include_record_data
        self.instance_name = instance_name
        self.viewers: list[Viewer] = []
        self.watchers = 0                 # viewers plus open overview polls: >0 means "watched"
        self.watched = False              # the hot path's one check
        self._learning: set[int] = set()  # connections whose first request is still to come
        # Every event while watched or learning a connection's client_id; else ApiVersions only.
        self.interest = Interest(_INVENTORY_APIS)
        self._clients: dict[int, _Client] = {}
        self._closed: deque = deque(maxlen=INVENTORY_CLOSED)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.put_pairs = self.put_bytes = 0       # written by the event loop only
        self.got_pairs = self.got_bytes = 0       # written by the live thread only
        self.overloaded = 0               # pairs not analysed: the live thread was behind
        self.analysed = 0
        self.row_errors = 0
        self._recent: OrderedDict[int, tuple] = OrderedDict()    # pair id -> (info, req, resp, row)
        self._recent_bytes = 0
        self._recent_lock = threading.Lock()
        self._pair_ids = pair_ids if pair_ids is not None else itertools.count(1)
        self._topic_names: dict[str, str] = {}
        self._window = _Window()
        self._wall_offset = time.time() - time.monotonic()
        self._thread: threading.Thread | None = None
        self.closed = False
        self._logged_row_error = False
        # Sections other observers add to the overview (name -> what to show, JSON-able):
        # the audit trail's latest events, the latest failovers.
        self.panels: dict[str, Callable[[], Any]] = {}

    # ------------------------------------------------------------ hooks (event loop thread)

    def __call__(self, info, events) -> None:
        if info.id in self._learning:
            self._learn_client_id(info, events)
        if not self.watched:                 # the inventory only: a connection's software
            for event in events:
                if event.__class__ is ResponseReceived and event.request_event.api_key == ApiKey.API_VERSIONS:
                    self._learn_software(info, event)
            return
        for event in events:
            cls = event.__class__
            if cls is ResponseReceived:
                request = event.request_event
                if request.api_key == ApiKey.API_VERSIONS:
                    self._learn_software(info, event)
                self._put(info, request, event)
            elif cls is RequestReceived and not event.expects_response:
                self._put(info, event, None)

    def needs_bodies(self) -> bool:
        """Hook: while someone watches, large frames are kept whole for the detail view."""
        return self.watched

    def connection_opened(self, info) -> None:
        self._clients[info.id] = _Client(info)
        self._learning.add(info.id)
        self.interest.set(None)

    def topic_named(self, topic_id, name: str) -> None:
        """Hook: kproxy asked the broker for a topic id's name (``proxy.topic_names``). A dict
        store is atomic: the live thread only reads, updates and clears this dict."""
        if len(self._topic_names) > MAX_TOPIC_IDS:
            self._topic_names.clear()
        self._topic_names[str(topic_id)] = name

    def connection_closed(self, info, reason: CloseCause | None = None, in_flight: int | None = None) -> None:
        self._learning.discard(info.id)
        self._update_interest()
        client = self._clients.pop(info.id, None)
        if client is not None:
            client.closed = time.time()
            self._closed.append(client)

    def _learn_client_id(self, info, events) -> None:
        """A connection's first request: its client_id."""
        for event in events:
            if event.__class__ is not RequestReceived:
                continue
            self._learning.discard(info.id)
            self._update_interest()
            client = self._clients.get(info.id)
            if client is not None:
                client.client_id = header_client_id(event.frame)
            return

    def _learn_software(self, info, response) -> None:
        """An ApiVersions answer: if the broker accepted a v3+ naming the software, that is
        the connection's software from now on, and its request's client_id the client_id."""
        named = software_named(response)
        client = self._clients.get(info.id)
        if named is not None and client is not None:
            client.software = named
            client.client_id = header_client_id(response.request_event.frame)

    def _put(self, info, request, response) -> None:
        size = _held_size(request, response) + _ITEM_OVERHEAD
        # Queued without what other observers decoded of them (tens of KiB of objects for
        # some answers): the queue's bound counts frames, and the live thread decodes anew.
        request = request.undecoded()
        response = response.undecoded(request) if response is not None else None
        if (self.put_pairs - self.got_pairs >= PENDING_MAX_PAIRS
                or self.put_bytes - self.got_bytes + size > PENDING_MAX_BYTES):
            self.overloaded += 1
            return
        self.put_pairs += 1
        self.put_bytes += size
        self._queue.put((info, request, response, size))

    # ------------------------------------------------------------ viewers (event loop thread)

    def add_viewer(self, row_filter: ViewerFilter) -> Viewer | None:
        """A new stream; None when MAX_VIEWERS are connected. ``row_filter`` compiled already."""
        if len(self.viewers) >= MAX_VIEWERS or self.closed:
            return None
        viewer = Viewer(self, row_filter)
        self.viewers = [*self.viewers, viewer]       # replaced, never mutated: the thread iterates it
        self.watch()
        return viewer

    def remove_viewer(self, viewer: Viewer) -> None:
        if viewer in self.viewers:
            self.viewers = [v for v in self.viewers if v is not viewer]
            self.unwatch()

    def watch(self) -> None:
        if self.watchers == 0:               # rates count from now: nothing was seen meanwhile
            self._window = _Window()
        self.watchers += 1
        self.watched = True
        self.interest.set(None)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kproxy-live", daemon=True)
            self._thread.start()

    def unwatch(self) -> None:
        self.watchers = max(self.watchers - 1, 0)
        self.watched = self.watchers > 0
        self._update_interest()
        if not self.watched:                 # nobody left to click a pair: let its frames go
            with self._recent_lock:
                self._recent.clear()
                self._recent_bytes = 0

    def _update_interest(self) -> None:
        self.interest.set(None if self.watched or self._learning else _INVENTORY_APIS)

    def close(self) -> None:
        """Stop: streams end, the thread exits."""
        self.closed = True
        self.watched = False
        self._update_interest()
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(5)
            self._thread = None

    # ------------------------------------------------------------ the live thread

    def _run(self) -> None:
        pause_per_cpu_s = (1.0 - LIVE_CPU_SHARE) / LIVE_CPU_SHARE
        owed = 0.0
        cpu = time.thread_time()
        q = self._queue
        while True:
            if owed >= MIN_PAUSE_S:
                time.sleep(owed)
                owed = 0.0
            item = q.get()
            if item is _STOP or self.closed:      # closing: what is still queued is not analysed
                return
            info, request, response, size = item
            try:
                self._analyse(info, request, response)
            except Exception:                       # noqa: BLE001 - one odd pair never stops the view
                self.row_errors += 1
                if not self._logged_row_error:
                    self._logged_row_error = True
                    log.exception("live view: a pair could not be summarized (further failures counted)")
            finally:
                self.got_pairs += 1
                self.got_bytes += size
            spent, cpu = cpu, time.thread_time()
            owed += (cpu - spent) * pause_per_cpu_s

    def _analyse(self, info, request, response) -> None:
        row, _ = build_row(info, request, response,
                           OUTCOME_RESPONSE if response is not None else OUTCOME_NO_RESPONSE,
                           self._wall_offset, self._topic_names, False, False, self.instance_name)
        self.analysed += 1
        client = self._clients.get(info.id)
        if client is not None:
            client.apis.add((row["api_name"], row["api_version"]))
            fill_client_software(row, client.software)
        now = time.time()
        self._window.add(int(row["time"]), row["api_name"], row["latency_ms"],
                         bool(row["error_count"] or row["decode_error"]))
        pair_id = next(self._pair_ids)
        self._remember(pair_id, info, request, response, row)
        viewers = self.viewers
        if viewers:
            compact = _compact(pair_id, row)
            for viewer in viewers:
                if viewer.filter.matches(info, request, row):
                    viewer.offer(compact, now)

    def _remember(self, pair_id: int, info, request, response, row) -> None:
        # Kept without their decoded bodies (a decoded ApiVersions answer alone is ~20 KiB
        # of objects): what is kept is then what RECENT_MAX_BYTES counts, the frames.
        request = request.undecoded()
        response = response.undecoded(request) if response is not None else None
        size = _held_size(request, response)
        with self._recent_lock:
            recent = self._recent
            recent[pair_id] = (info, request, response, row)
            self._recent_bytes += size
            oldest_kept = row["time"] - RECENT_MAX_AGE_S
            while recent and (len(recent) > RECENT_MAX_PAIRS or self._recent_bytes > RECENT_MAX_BYTES
                              or next(iter(recent.values()))[3]["time"] < oldest_kept):
                _, (_, old_req, old_resp, _) = recent.popitem(last=False)
                self._recent_bytes -= _held_size(old_req, old_resp)

    # ------------------------------------------------------------ reads (any thread)

    def pair(self, pair_id: int) -> dict | None:
        """The capture's JSON form of a recent pair, bodies included (decodes: call from a thread)."""
        with self._recent_lock:
            entry = self._recent.get(pair_id)
        if entry is None:
            return None
        info, request, response, summary = entry
        row, _ = build_row(info, request, response, summary["outcome"], self._wall_offset,
                           dict(self._topic_names), True, self.include_record_data, self.instance_name)
        row["client_software_name"] = summary["client_software_name"]
        row["client_software_version"] = summary["client_software_version"]
        out = json_form(row)
        out["pair_id"] = pair_id
        out["record_data_shown"] = self.include_record_data
        return out

    def connection_pcapng(self, connection_id: int) -> bytes | None:
        """The recent pairs of one connection as a pcapng file, redacted as capture's pcapng is."""
        with self._recent_lock:
            entries = [e for e in self._recent.values() if e[0].id == connection_id]
        if not entries:
            return None
        frames = []
        for info, request, response, _ in entries:
            for event, kind in ((request, "request"), (response, "response")):
                if event is None:
                    continue
                frame, note = scrub_frame(event.frame, kind, request.api_key, request.api_version,
                                          self.include_record_data)
                frames.append((kind == "request", event.time + self._wall_offset, frame, note))
        frames.sort(key=lambda f: f[1])
        return stream_file(entries[0][0], frames)

    def overview(self) -> dict:
        now = time.time()
        clients = list(self._clients.values())
        listeners: dict[str, int] = {}
        for client in clients:
            listeners[client.listener] = listeners.get(client.listener, 0) + 1
        return {"time": now, "watched_since": self._window.since,
                "traffic": self._window.snapshot(now),
                "connections": {"open": len(clients), "by_listener": dict(sorted(listeners.items()))},
                "inventory": _inventory(clients + list(self._closed)),
                "client_telemetry": self.telemetry.inventory() if self.telemetry is not None else [],
                "counters": {"analysed": self.analysed, "overloaded": self.overloaded,
                             "row_errors": self.row_errors, "viewers": len(self.viewers),
                             "queued": max(self.put_pairs - self.got_pairs, 0)},
                "record_data_shown": self.include_record_data,
                **{name: panel() for name, panel in self.panels.items()}}


def _inventory(clients: list[_Client]) -> list[dict]:
    """One entry per (address, client_id, software): connections, APIs and versions used."""
    groups: dict[tuple, dict] = {}
    for c in clients:
        software = (c.software.name, c.software.version) if c.software is not None else (None, None)
        g = _inventory_group(groups, c.host, c.client_id, software, c.opened, c.port)
        g["open" if c.closed is None else "closed"] += 1
        g["listeners"].add(c.listener)
        for api, version in c.apis:
            g["apis"].setdefault(api, set()).add(version)
    return _inventory_list(groups)


def _inventory_group(groups: dict, address: str, client_id: str | None, software: tuple,
                     first_seen: float, port: int) -> dict:
    key = (address, client_id, tuple(software))
    g = groups.get(key)
    if g is None:
        g = groups[key] = {"address": address, "client_id": client_id,
                           "software_name": software[0], "software_version": software[1],
                           "open": 0, "closed": 0, "listeners": set(), "apis": {},
                           "first_seen": first_seen, "last_port": port}
    g["first_seen"] = min(g["first_seen"], first_seen)
    return g


def _inventory_list(groups: dict) -> list[dict]:
    out = []
    for g in groups.values():
        g["listeners"] = sorted(g["listeners"])
        g["apis"] = {api: sorted(v) for api, v in sorted(g["apis"].items())}
        out.append(g)
    out.sort(key=lambda g: (-g["open"], g["address"], g["client_id"] or ""))
    return out


def merge_overviews(overviews: list[dict]) -> dict:
    """Several workers' overviews as one (``kproxy run --workers``): counts summed, rates
    and p99 worked out again from the summed counts and latency buckets, the client
    inventory grouped again (a client's connections may be on several workers)."""
    now = time.time()
    sinces = [o["traffic"]["since"] for o in overviews if o["traffic"]["since"] is not None]
    since = min(sinces) if sinces else None
    span, short_span = _spans(since, now)
    apis: dict[str, dict] = {}
    for o in overviews:
        for a in o["traffic"]["apis"]:
            m = apis.setdefault(a["api"], {"count": 0, "recent": 0, "errors": 0,
                                           "hist": [0] * (len(LATENCY_EDGES_MS) + 1)})
            for key in ("count", "recent", "errors"):
                m[key] += a[key]
            for bucket, n in a["latency_buckets"].items():
                m["hist"][int(bucket)] += n
    traffic = [_api_traffic(api, m["count"], m["recent"], m["errors"], m["hist"], span, short_span)
               for api, m in sorted(apis.items(), key=lambda kv: -kv[1]["count"])]
    groups: dict[tuple, dict] = {}
    listeners: dict[str, int] = {}
    counters: dict[str, float] = {}
    for o in overviews:
        for c in o["inventory"]:
            g = _inventory_group(groups, c["address"], c["client_id"],
                                 (c["software_name"], c["software_version"]), c["first_seen"], c["last_port"])
            g["open"] += c["open"]
            g["closed"] += c["closed"]
            g["listeners"].update(c["listeners"])
            for api, versions in c["apis"].items():
                g["apis"].setdefault(api, set()).update(versions)
        for name, n in o["connections"]["by_listener"].items():
            listeners[name] = listeners.get(name, 0) + n
        for name, n in o["counters"].items():
            counters[name] = counters.get(name, 0) + n
    watched = [o["watched_since"] for o in overviews if o["watched_since"] is not None]
    return {"time": now, "watched_since": min(watched) if watched else None,
            "traffic": {"window_s": OVERVIEW_WINDOW_S, "recent_s": OVERVIEW_SHORT_S,
                        "span_s": round(span, 1), "since": since, "apis": traffic},
            "connections": {"open": sum(o["connections"]["open"] for o in overviews),
                            "by_listener": dict(sorted(listeners.items()))},
            "inventory": _inventory_list(groups), "counters": counters,
            "client_telemetry": [row for o in overviews for row in o.get("client_telemetry", ())],
            "record_data_shown": bool(overviews) and all(o["record_data_shown"] for o in overviews),
            **_merge_panels(overviews)}


def _merge_panels(overviews: list[dict]) -> dict:
    """The workers' audit events and failovers, newest first, as many as one shows."""
    out: dict = {}
    audit = [e for o in overviews for e in o.get("audit", ())]
    if any("audit" in o for o in overviews):
        out["audit"] = sorted(audit, key=lambda e: e["time"], reverse=True)[:MERGED_PANEL_ROWS]
    parts = [o["failovers"] for o in overviews if "failovers" in o]
    if parts:
        out["failovers"] = {
            "failovers": sorted((f for p in parts for f in p["failovers"]),
                                key=lambda f: f["recovered"], reverse=True)[:MERGED_PANEL_ROWS],
            "leader_changes": sorted((c for p in parts for c in p["leader_changes"]),
                                     key=lambda c: c["time"], reverse=True)[:MERGED_PANEL_ROWS],
            "ended": sum(p["ended"] for p in parts), "failing_now": sum(p["failing_now"] for p in parts)}
    return out


def _compact(pair_id: int, row: dict) -> dict:
    """What the stream sends per pair (the detail view fetches the rest)."""
    topics = row["topics"]
    return {"id": pair_id, "time": row["time"], "conn": row["connection_id"],
            "client": f'{row["client_host"]}:{row["client_port"]}', "listener": row["listener"],
            "client_id": row["client_id"], "software": row["client_software_name"],
            "api": row["api_name"], "version": row["api_version"], "corr": row["correlation_id"],
            "latency_ms": None if row["latency_ms"] is None else round(row["latency_ms"], 3),
            "req_bytes": row["request_size"], "resp_bytes": row["response_size"],
            "throttle_ms": row["throttle_ms"], "errors": row["errors"],
            "error_count": row["error_count"], "topics": topics[:ROW_TOPICS],
            "more_topics": max(len(topics) - ROW_TOPICS, 0), "records": row["record_count"],
            "outcome": row["outcome"], "decode_error": row["decode_error"]}


def encode_rows(rows: list[dict]) -> str:
    return json.dumps(rows, separators=(",", ":"), default=str)
