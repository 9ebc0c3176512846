"""The live page of ``kproxy run --workers N``: every worker's traffic on one page.

Each worker keeps its own live view (``kproxy.observers.live``) behind its private
admin listener; the supervisor's page is made from theirs:

- ``/live/stream``: for each viewer, a stream from every serving worker with the
  viewer's filter (the filter needs what only a worker has: the connection and
  the decoded request). Their rows go through one ``RowBacklog``, the same
  per-second cap and bounded backlog a worker gives a viewer (and leave it in time
  order, ``REORDER_S`` late), and the supervisor
  reads the workers' streams whatever the browser does: a slow browser loses rows
  (counted), never holds up a worker. Every ``FOLLOW_CHECK_S`` the viewer's
  followers are matched with the workers serving then, so a restarted worker
  (a new process) joins again. The viewer's stream starts once the workers' streams
  have answered (``FOLLOW_ANSWER_WAIT_S`` at most), so a page that says "live"
  misses no row of a worker that answered. The status event adds up the workers' counts,
  over every stream the viewer had, with the merge's own, and names workers
  whose connections are missing.
- ``/live/overview``: the workers' overviews merged (``merge_overviews``), with a
  notice naming any worker not in it.
- ``/live/pairs/<id>``, ``/live/connections/<id>/pcapng``: asked of the worker that
  handed out the id (``worker_identity.id_owner``). Rows carry that worker's pid and the page
  sends it back, so a pair clicked after its worker restarted is refused rather
  than confused with the new process's pair of the same id.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from operator import itemgetter
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from ..observers.live import MAX_VIEWERS, RowBacklog, ViewerFilter, merge_overviews
from .live_web import PageRoutes, json_answer, send_stream, stream_filter
from ..proxy.worker_identity import id_owner

if TYPE_CHECKING:
    from .worker_admin import WorkerAdmin, WorkerView

# How often a viewer's followers are matched with the serving workers: a restarted
# worker's rows are back on the page at most this long after it serves.
FOLLOW_CHECK_S = 1.0
# A worker's stream that ended (the worker stopped, or refused) is asked again no sooner.
FOLLOW_RETRY_S = 2.0
# A worker's stream sends a status every second: silent this long, it is hung or gone.
STREAM_SILENCE_S = 10.0
# One event of a worker's stream is at most its viewer backlog (1000 rows of ~1 KiB);
# a partial event past this is not a worker talking: that stream is dropped.
EVENT_MAX_BYTES = 8 * 1024 * 1024
# Rows of different workers reach the supervisor up to a worker's stream tick apart (plus
# its live thread's lag): held this long, they go to the page in time order, not in
# per-worker batches.
REORDER_S = 0.5
# A page's stream starts (the page says "live") once every serving worker's stream has
# answered, so that every row from then on is shown, as with one process; a worker that
# takes longer is named missing in the status until its stream answers.
FOLLOW_ANSWER_WAIT_S = 2.0
# Counts in a worker's status that add up across workers and streams.
_SUMMED = ("matched", "dropped", "thinned")


class _Follower:
    """One worker's stream, for one merged viewer."""

    def __init__(self, worker: "WorkerView"):
        self.worker = worker
        self.status: dict = {}            # the worker's last status event
        self.task: asyncio.Task | None = None
        self.answered = asyncio.Event()   # its stream answered (200), or failed
        self.failed = False               # refused, broke off or went silent


class MergedViewer(RowBacklog):
    """One page's stream, fed by every worker's."""

    def __init__(self, admin: "WorkerAdmin", row_filter: ViewerFilter, query: str):
        super().__init__()
        self.admin = admin
        self.filter = row_filter
        self.query = query
        self.followers: dict[tuple[int, int], _Follower] = {}    # (worker index, pid) -> its stream
        self.retry_at: dict[tuple[int, int], float] = {}
        self.ended: dict[str, int] = dict.fromkeys(_SUMMED, 0)   # counts of streams that ended
        self.overloaded: dict[int, int] = {}                     # pid -> its live view's count

    def follow_serving(self) -> None:
        """Follow each serving worker not followed yet (a restarted one is a new process);
        let go of streams that ended or whose worker is gone."""
        loop = asyncio.get_running_loop()
        serving = {(w.index, w.pid): w for w in self.admin.serving()}
        for key, follower in list(self.followers.items()):
            if follower.task.done() or key not in serving:
                self._forget(key)
                self.retry_at[key] = loop.time() + FOLLOW_RETRY_S
        for key, worker in serving.items():
            if key not in self.followers and loop.time() >= self.retry_at.get(key, 0.0):
                follower = self.followers[key] = _Follower(worker)
                follower.task = loop.create_task(self._follow(follower))

    async def answered(self, timeout: float) -> None:
        """Wait until every worker followed now has answered (or failed), at most ``timeout``."""
        waits = [asyncio.ensure_future(f.answered.wait()) for f in self.followers.values()]
        if waits:
            _, pending = await asyncio.wait(waits, timeout=timeout)
            for wait in pending:
                wait.cancel()

    async def keep_following(self) -> None:
        """``follow_serving`` every FOLLOW_CHECK_S until cancelled; then stop following."""
        try:
            while True:
                await asyncio.sleep(FOLLOW_CHECK_S)
                self.follow_serving()
        finally:
            for key in list(self.followers):
                self._forget(key)

    def _forget(self, key: tuple[int, int]) -> None:
        follower = self.followers.pop(key)
        follower.task.cancel()
        for name in _SUMMED:
            self.ended[name] += follower.status.get(name, 0)

    async def _follow(self, follower: _Follower) -> None:
        worker = follower.worker
        url = f"http://127.0.0.1:{worker.admin_port}/live/stream" + (f"?{self.query}" if self.query else "")
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=STREAM_SILENCE_S, sock_read=STREAM_SILENCE_S)
        try:
            async with self.admin.stream_session.get(url, headers=self.admin.auth, timeout=timeout) as response:
                if response.status != 200:          # e.g. 503: that worker has all the viewers it takes
                    return
                follower.answered.set()
                pending = bytearray()
                async for chunk in response.content.iter_any():
                    pending += chunk
                    start = 0
                    while (end := pending.find(b"\n\n", start)) >= 0:
                        self._event(follower, bytes(pending[start:end]))
                        start = end + 2
                    del pending[:start]
                    if len(pending) > EVENT_MAX_BYTES:
                        break
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
            pass
        finally:
            follower.failed = True         # a stream only ends when the worker ends it or goes
            follower.answered.set()

    def take(self) -> list[dict]:
        """The rows at least REORDER_S old, oldest first; the newer ones wait for the next tick."""
        if not self.backlog:
            return []
        rows = sorted(self.backlog, key=itemgetter("time"))
        horizon = time.time() - REORDER_S
        ready = next((i for i, row in enumerate(rows) if row["time"] > horizon), len(rows))
        self.backlog = deque(rows[ready:])
        self.sent += ready
        return rows[:ready]

    def _event(self, follower: _Follower, block: bytes) -> None:
        kind = data = None
        for line in block.split(b"\n"):
            if line.startswith(b"event: "):
                kind = line[7:]
            elif line.startswith(b"data: "):
                data = line[6:]
        if kind == b"pairs" and data:
            now, pid = time.time(), follower.worker.pid
            for row in json.loads(data):
                row["pid"] = pid
                self.offer(row, now)
        elif kind == b"status" and data:
            follower.status = json.loads(data)
            self.overloaded[follower.worker.pid] = follower.status.get("overloaded", 0)

    def status(self) -> dict:
        counts = dict(self.ended)
        for follower in self.followers.values():
            for name in _SUMMED:
                counts[name] += follower.status.get(name, 0)
        following = {key[0] for key, f in self.followers.items() if f.answered.is_set() and not f.failed}
        workers = len(self.admin.workers())
        return {"matched": counts["matched"], "sent": self.sent,
                "dropped": counts["dropped"] + self.dropped, "thinned": counts["thinned"] + self.thinned,
                "overloaded": sum(self.overloaded.values()), "backlog": len(self.backlog),
                "filter": self.filter.describe(), "workers": workers,
                "workers_missing": [i for i in range(workers) if i not in following]}


class MergedLiveRoutes(PageRoutes):
    """The supervisor's page: its data merged from the workers' (or asked of one)."""

    def __init__(self, admin: "WorkerAdmin"):
        super().__init__()
        self.admin = admin
        self.viewers: set[MergedViewer] = set()
        self.closed = False

    async def pair(self, request: web.Request, pair_id: int) -> web.StreamResponse:
        return await self._from_owner(request, pair_id, "pair")

    async def pcapng(self, request: web.Request, connection_id: int) -> web.StreamResponse:
        return await self._from_owner(request, connection_id, "connection")

    async def _from_owner(self, request: web.Request, some_id: int, what: str) -> web.StreamResponse:
        """The answer of the worker that handed out ``some_id``, if it is still that process."""
        owner = id_owner(some_id, len(self.admin.workers()))
        worker = next((w for w in self.admin.serving() if w.index == owner), None)
        if worker is None:
            return json_answer(404, {"error": f"that {what} is on worker {owner}, which is not serving now"})
        if request.query.get("pid", str(worker.pid)) != str(worker.pid):
            return json_answer(404, {"error": f"that {what} was on worker {owner}, which has restarted "
                                              f"since: its recent pairs went with it"})
        return await self.admin.pass_through(request, worker)

    async def stream(self, request: web.Request) -> web.StreamResponse:
        row_filter = await stream_filter(request)
        if isinstance(row_filter, web.Response):
            return row_filter
        if len(self.viewers) >= MAX_VIEWERS or self.closed:
            return json_answer(503, {"error": "too many live viewers; close one"})
        viewer = MergedViewer(self.admin, row_filter, request.query_string)
        self.viewers.add(viewer)
        viewer.follow_serving()
        following = asyncio.get_running_loop().create_task(viewer.keep_following())
        try:
            await viewer.answered(FOLLOW_ANSWER_WAIT_S)
            return await send_stream(request, viewer.take, viewer.status, lambda: self.closed)
        finally:
            following.cancel()
            self.viewers.discard(viewer)

    async def overview(self) -> web.Response:
        answers = await self.admin.ask_all("GET", "/live/overview")
        overviews = {}
        for worker, (status, body) in answers:
            if status == 200:
                try:
                    overviews[worker.index] = json.loads(body)
                except ValueError:
                    pass
        merged = merge_overviews(list(overviews.values()))
        workers = len(self.admin.workers())
        missing = [str(i) for i in range(workers) if i not in overviews]
        if missing:
            merged["notice"] = (f"worker {', '.join(missing)} not answering now: "
                                f"{'its' if len(missing) == 1 else 'their'} connections are missing here")
        merged["workers"] = workers
        return json_answer(200, merged)
