"""The admin page's HTTP side: the page itself, its live stream and its JSON reads.

``/`` and ``/static/*`` are the page (HTML, JS and CSS from ``kproxy/admin/web``,
no CDN, no build step); they are the same bytes for everyone and hold no data,
so they are served without the token. Everything under ``/live/`` is data and
needs the admin token (the admin listener checks it before these handlers run):

    GET /live/stream?apis=Produce,Fetch&client_id=app-*&clients=10.0.0.0/8&topics=t*&errors=1&min_latency_ms=5
        server-sent events: ``pairs`` (a JSON list of rows, oldest first) every
        ``STREAM_TICK_S`` when there are any, ``status`` (matched, sent, dropped,
        thinned, overloaded) every second
    GET /live/overview                       per-API rate/p99/errors, connections, client inventory
    GET /live/pairs/<id>                     one pair in the capture's JSON form, bodies included
    GET /live/connections/<id>/pcapng        that connection's recent pairs as a pcapng file
    GET /live/policy                         policy rules and their violators, each with an example

The browser sends the token as ``Authorization: Bearer`` on every call (the page
reads the stream with ``fetch``, not ``EventSource``, precisely so that the
token never goes into a URL).
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Callable

from aiohttp import web

from ..observers.live import LiveView, ViewerFilter, encode_rows

WEB_DIR = Path(__file__).with_name("web")
STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                ".css": "text/css; charset=utf-8", ".png": "image/png",
                ".svg": "image/svg+xml"}
STREAM_TICK_S = 0.25          # rows reach the page at most this late; batching keeps writes few
STATUS_EVERY_S = 1.0
# A viewer whose socket has accepted nothing for this long has gone or stalled: its stream ends.
VIEWER_STALL_S = 30.0
# Kernel send buffer of a stream: with the viewer's backlog, what one slow browser can cost.
STREAM_SEND_BUFFER = 256 * 1024
# Pair and connection ids are this process's counters: 19 digits hold any of them (int64),
# and a longer one is not worth int()'s time (over 4,300 digits it raises).
MAX_ID_DIGITS = 19


def json_answer(status: int, payload) -> web.Response:
    return web.Response(status=status, body=(json.dumps(payload, default=str) + "\n").encode(),
                        headers={"Content-Type": "application/json", "Cache-Control": "no-store"})


class PageRoutes:
    """The admin listener's ``web_routes`` for the page: ``/`` and ``/static/*`` (HTML, JS
    and CSS, no data: served without the token), and the ``/live/`` reads, answered by a
    subclass's ``stream``, ``overview``, ``pair`` and ``pcapng``."""

    def __init__(self):
        self._static = {p.name: (p.read_bytes(), STATIC_TYPES.get(p.suffix, "application/octet-stream"))
                        for p in WEB_DIR.iterdir() if p.is_file()}

    def routes(self) -> dict:
        return {"/": self.page, "/static/": self.static, "/live/": self.data}

    async def page(self, request: web.Request) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            return web.Response(status=405, text="allowed: GET\n", content_type="text/plain")
        return self._file("index.html")

    async def static(self, request: web.Request) -> web.StreamResponse:
        return self._file(request.path.removeprefix("/static/"))

    def _file(self, name: str) -> web.Response:
        entry = self._static.get(name)
        if entry is None:
            return _not_found()
        body, ctype = entry
        return web.Response(body=body, headers={
            "Content-Type": ctype, "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
            # The page loads nothing from anywhere else, and may not be framed.
            "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
            "Referrer-Policy": "no-referrer"})

    async def data(self, request: web.Request) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            return web.Response(status=405, text="allowed: GET\n", content_type="text/plain")
        parts = request.path.removeprefix("/live/").strip("/").split("/")
        if parts == ["stream"]:
            return await self.stream(request)
        if parts == ["overview"]:
            return await self.overview()
        if parts == ["policy"]:
            return await self.policy()
        if len(parts) == 2 and parts[0] == "pairs":
            pair_id = parse_id(parts[1])
            if pair_id is None:
                return _bad_id("pair")
            return await self.pair(request, pair_id)
        if len(parts) == 3 and parts[0] == "connections" and parts[2] == "pcapng":
            connection_id = parse_id(parts[1])
            if connection_id is None:
                return _bad_id("connection")
            return await self.pcapng(request, connection_id)
        return _not_found()

    async def stream(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    async def overview(self) -> web.Response:
        raise NotImplementedError

    async def pair(self, request: web.Request, pair_id: int) -> web.StreamResponse:
        raise NotImplementedError

    async def policy(self) -> web.Response:
        return json_answer(200, {"configured": False, "rules": [], "violators": []})

    async def pcapng(self, request: web.Request, connection_id: int) -> web.StreamResponse:
        raise NotImplementedError


def parse_id(text: str) -> int | None:
    """A pair or connection id from the path, or None: ASCII digits only (``str.isdigit``
    also takes '²', which ``int`` refuses, and other scripts' digits), at most
    ``MAX_ID_DIGITS``."""
    if 0 < len(text) <= MAX_ID_DIGITS and text.isascii() and text.isdigit():
        return int(text)
    return None


def _bad_id(kind: str) -> web.Response:
    # The id itself is not echoed: it may be megabytes of anything.
    return json_answer(400, {"error": f"a {kind} id is a number of at most {MAX_ID_DIGITS} digits"})


def _not_found() -> web.Response:
    return web.Response(status=404, body=b"not found\n", headers={"Content-Type": "text/plain"})


async def stream_filter(request: web.Request) -> ViewerFilter | web.Response:
    """The viewer's filter from the query, compiled (host names resolved); or a 400."""
    try:
        row_filter = ViewerFilter(dict(request.query))
        await asyncio.to_thread(row_filter.compile)
    except ValueError as exc:
        return json_answer(400, {"error": str(exc)})
    return row_filter


async def send_stream(request: web.Request, take: Callable[[], list[dict]], status: Callable[[], dict],
                      ended: Callable[[], bool]) -> web.StreamResponse:
    """Server-sent events to one viewer until ``ended()`` or it goes: ``take()``'s rows every
    tick, ``status()`` every second. A viewer that stops reading is hung up on after
    ``VIEWER_STALL_S``; its socket buffers are small (``STREAM_SEND_BUFFER``)."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
    try:
        sock = request.transport.get_extra_info("socket") if request.transport else None
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_SEND_BUFFER)
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        status_at = 0.0
        while not ended():
            chunks = []
            rows = take()
            if rows:
                chunks.append(f"event: pairs\ndata: {encode_rows(rows)}\n\n")
            now = loop.time()
            if now - status_at >= STATUS_EVERY_S:
                status_at = now
                chunks.append(f"event: status\ndata: {json.dumps(status())}\n\n")
            if chunks:
                await asyncio.wait_for(response.write("".join(chunks).encode()), VIEWER_STALL_S)
            await asyncio.sleep(STREAM_TICK_S)
    except ConnectionError:
        pass                           # the viewer went away
    except asyncio.TimeoutError:       # the viewer stopped reading: hang up, do not wait on it
        if request.transport is not None:
            request.transport.abort()
    return response


class LiveRoutes(PageRoutes):
    """The page of one kproxy process, from its ``LiveView``."""

    def __init__(self, live: LiveView, policy=None):
        """``policy``: the policy observer, when a policy_file is set (``/live/policy``)."""
        super().__init__()
        self.live = live
        self._policy = policy

    async def policy(self) -> web.Response:
        if self._policy is None:
            return await super().policy()
        from ..observers.policy.page import policy_page
        return json_answer(200, policy_page(self._policy))

    async def overview(self) -> web.Response:
        return json_answer(200, self.live.overview())

    async def pair(self, request: web.Request, pair_id: int) -> web.Response:
        pair = await asyncio.to_thread(self.live.pair, pair_id)
        if pair is None:
            return json_answer(404, {"error": "no such pair any more (only the last minutes are kept)"})
        return json_answer(200, pair)

    async def pcapng(self, request: web.Request, connection_id: int) -> web.Response:
        data = await asyncio.to_thread(self.live.connection_pcapng, connection_id)
        if data is None:
            return json_answer(404, {"error": "nothing recent of that connection"})
        return web.Response(body=data, headers={
            "Content-Type": "application/vnd.tcpdump.pcap",
            "Content-Disposition": f'attachment; filename="kproxy-conn-{connection_id}.pcapng"'})

    async def stream(self, request: web.Request) -> web.StreamResponse:
        row_filter = await stream_filter(request)
        if isinstance(row_filter, web.Response):
            return row_filter
        live = self.live
        viewer = live.add_viewer(row_filter)
        if viewer is None:
            return json_answer(503, {"error": "too many live viewers; close one"})
        try:
            return await send_stream(request, viewer.take, viewer.status, lambda: live.closed)
        finally:
            live.remove_viewer(viewer)
