"""The supervisor's admin listener (``kproxy run --workers N``): answers gathered from the workers.

Each worker serves the usual admin routes on a private loopback port, guarded by
a token only the supervisor knows; the operator talks to the supervisor's one
listener, which asks every worker and combines the answers:

- ``/metrics``: the workers' expositions merged (``ExpositionMerger``: counters
  and histograms summed, the rule in ``kproxy.observers.metrics``) plus the
  supervisor's own series. Rendered as one shared render (``SharedRender``): a
  scrape storm costs one round of worker scrapes. A worker that does not answer
  in time is counted as its last answer.
- ``/healthz``: 503 only when a worker process is up but does not answer (hung);
  a worker being restarted is the supervisor's job, not a reason to kill it all.
- ``/readyz``: 200 only when every worker is ready; the body has a line per worker.
- ``/capture/start|stop`` and ``/capture``: sent to every worker (each writes its
  own files, ``<prefix>-w<index>-...``); a start that fails on one worker is
  stopped on the others, so a capture runs everywhere or nowhere.
- ``/workers``: each worker's state, pid, restarts and private admin address.
- ``/``, ``/static/*``, ``/live/*``: the live page, showing every worker's traffic
  (``kproxy.admin.live_merge``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, Callable, Collection

import aiohttp
from aiohttp import web

from ..observers.metrics import ExpositionMerger
from .admin import AdminServer, SharedRender, metrics_answer
from .live_merge import MergedLiveRoutes

log = logging.getLogger("kproxy.workers")

# A worker's admin listener answers from its own event loop; one busy relaying still answers
# in milliseconds, so a worker silent this long is hung (or gone) for this answer.
WORKER_ANSWER_TIMEOUT_S = 5.0
# Capture start and stop wait for files to open or to be flushed and closed (a worker's
# stop gives its writer up to 30 s): their answers get this long.
CAPTURE_ANSWER_TIMEOUT_S = 40.0
_JSON = "application/json"


@dataclass
class WorkerView:
    """What the supervisor knows of one worker, for the admin answers."""
    index: int
    state: str                 # "starting", "serving", "restarting", "stopped"
    pid: int | None
    admin_port: int | None     # its private admin listener, once it serves
    restarts: int = 0
    last_exit: str | None = None


def _json(status: int, payload: Any) -> tuple[int, str, bytes]:
    return status, _JSON, (json.dumps(payload, indent=2, default=str) + "\n").encode()


class WorkerAdmin:
    def __init__(self, workers: Callable[[], list[WorkerView]], worker_token: str, *,
                 admin_token: str | None, protected: Collection[str],
                 protected_prefixes: Collection[str], capture_settings: Callable[[dict, int], dict],
                 extra_metrics: Callable[[], bytes], scrape_failed: Callable[[], None]):
        self.workers = workers
        self.auth = {"Authorization": f"Bearer {worker_token}"}
        self.capture_settings = capture_settings
        self.extra_metrics = extra_metrics
        self.scrape_failed = scrape_failed
        self.merger = ExpositionMerger()
        self._expositions: dict[tuple[int, int], str] = {}   # (index, pid) -> its last /metrics
        self.session: aiohttp.ClientSession | None = None
        # The live page's streams from the workers (up to MAX_VIEWERS x workers, each open
        # as long as a page is), in their own pool: never waited for by a scrape or a probe.
        self.stream_session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.scrape = SharedRender(self._render)
        self.live = MergedLiveRoutes(self)
        self.server = AdminServer({
            "/healthz": self.healthz, "/readyz": self.readyz, "/metrics": self._metrics,
            "/workers": self._workers,
            "/capture": self._capture_status,
            "/capture/start": {"POST": self._capture_start},
            "/capture/stop": {"POST": self._capture_stop},
        }, admin_token=admin_token, protected=protected,
            web_routes=self.live.routes(),
            protected_prefixes=protected_prefixes)

    async def start(self, host: str, port: int) -> None:
        self._loop = asyncio.get_running_loop()
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WORKER_ANSWER_TIMEOUT_S))
        self.stream_session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        await self.server.start(host, port)

    async def stop(self) -> None:
        self.live.closed = True                  # live streams end at their next tick
        await self.server.stop()
        for session in (self.session, self.stream_session):
            if session is not None:
                await session.close()

    def retire(self, index: int, pid: int) -> None:
        """Worker ``index`` (process ``pid``) is being replaced: what it counted stays in the sums."""
        self._expositions.pop((index, pid), None)
        self.merger.retire((index, pid))

    # ------------------------------------------------------------ asking the workers

    def serving(self) -> list[WorkerView]:
        return [w for w in self.workers() if w.admin_port is not None and w.state == "serving"]

    async def _ask(self, worker: WorkerView, method: str, path: str,
                   body: Any = None) -> tuple[int, bytes]:
        """(status, body) of one worker's answer; (0, why) when it gave none."""
        url = f"http://127.0.0.1:{worker.admin_port}{path}"
        timeout = aiohttp.ClientTimeout(total=CAPTURE_ANSWER_TIMEOUT_S if path.startswith("/capture/")
                                        else WORKER_ANSWER_TIMEOUT_S)
        try:
            async with self.session.request(method, url, headers=self.auth, json=body,
                                             timeout=timeout) as response:
                return response.status, await response.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            return 0, f"no answer ({type(exc).__name__})".encode()

    async def ask_all(self, method: str, path: str, bodies: Callable[[int], Any] | None = None):
        workers = self.serving()
        answers = await asyncio.gather(*(self._ask(w, method, path, bodies(w.index) if bodies else None)
                                         for w in workers))
        return list(zip(workers, answers))

    # ------------------------------------------------------------ /metrics

    async def _gather_expositions(self) -> dict[tuple[int, int], str]:
        for worker, (status, body) in await self.ask_all("GET", "/metrics"):
            if status == 200:
                self._expositions[(worker.index, worker.pid)] = body.decode("utf-8", "replace")
            else:
                self.scrape_failed()
        return dict(self._expositions)

    def _render(self) -> bytes:
        """In a thread of the supervisor (``SharedRender``): ask on the loop, merge here."""
        expositions = asyncio.run_coroutine_threadsafe(self._gather_expositions(), self._loop).result()
        return self.merger.merge(expositions) + self.extra_metrics()

    async def _metrics(self):
        return await metrics_answer(self.scrape)

    # ------------------------------------------------------------ health, readiness, state

    async def healthz(self):
        workers = self.workers()
        answers = dict((w.index, a) for w, a in await self.ask_all("GET", "/healthz"))
        lines, healthy = [], True
        for w in workers:
            status = answers.get(w.index, (None,))[0]
            if w.state == "serving" and status != 200:
                healthy = False
                lines.append(f"worker {w.index}: not answering (pid {w.pid})")
            else:
                lines.append(f"worker {w.index}: {'ok' if status == 200 else w.state}")
        return (200 if healthy else 503), "text/plain", ("\n".join(lines) + "\n").encode()

    async def readyz(self):
        workers = self.workers()
        answers = dict((w.index, a) for w, a in await self.ask_all("GET", "/readyz"))
        lines, ready = [], True
        for w in workers:
            status, body = answers.get(w.index, (None, w.state.encode()))
            ready = ready and status == 200
            detail = body.decode("utf-8", "replace").strip().replace("\n", "; ")
            lines.append(f"worker {w.index}: {detail}")
        return (200 if ready else 503), "text/plain", ("\n".join(lines) + "\n").encode()

    async def _workers(self):
        return _json(200, {"workers": [vars(w) for w in self.workers()]})

    # ------------------------------------------------------------ capture

    async def _capture_status(self):
        answers = await self.ask_all("GET", "/capture")
        return _json(200, _combined_capture_status(answers))

    async def _capture_start(self, body: bytes):
        from ..observers.capture import control
        settings = control.parse_json_body(body)
        if isinstance(settings, tuple):                        # (400, error)
            return _json(*settings)
        answers = await self.ask_all("POST", "/capture/start",
                                      lambda index: self.capture_settings(settings, index))
        combined = _combined_capture_status(answers)
        failed = [(w, status, data) for w, (status, data) in answers if status != 200]
        if not answers:
            return _json(503, {"error": "no worker is serving now; try again"})
        if failed:
            started = [w for w, (status, _) in answers if status == 200]
            await asyncio.gather(*(self._ask(w, "POST", "/capture/stop") for w in started))
            worker, status, data = failed[0]
            error = _loads(data).get("error") or data.decode("utf-8", "replace").strip()
            return _json(status or 503, {"error": f"worker {worker.index}: {error}", **combined})
        return _json(200, combined)

    async def _capture_stop(self, body: bytes):
        return _json(200, _combined_capture_status(await self.ask_all("POST", "/capture/stop")))

    # ------------------------------------------------------------ the live page

    async def pass_through(self, request: web.Request, worker: WorkerView) -> web.StreamResponse:
        """``worker``'s answer to ``request`` (a pair, a connection's pcapng), passed on as it comes."""
        url = f"http://127.0.0.1:{worker.admin_port}{request.rel_url}"
        try:
            upstream = await self.session.get(url, headers=self.auth,
                                              timeout=aiohttp.ClientTimeout(total=None,
                                                                            sock_connect=WORKER_ANSWER_TIMEOUT_S,
                                                                            sock_read=WORKER_ANSWER_TIMEOUT_S))
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            return web.Response(status=502, body=f"worker {worker.index}: {exc}\n".encode(),
                                headers={"Content-Type": "text/plain"})
        response: web.StreamResponse | None = None
        try:
            headers = {k: v for k, v in upstream.headers.items()
                       if k.lower() in ("content-type", "cache-control", "content-disposition")}
            response = web.StreamResponse(status=upstream.status, headers=headers)
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            return response
        except (aiohttp.ClientError, ConnectionError, asyncio.TimeoutError):
            if response is not None:          # the viewer or the worker went away mid-answer
                return response
            return web.Response(status=502, body=b"the worker's answer broke off\n",
                                headers={"Content-Type": "text/plain"})
        finally:
            upstream.release()


def _loads(data: bytes) -> dict:
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def _combined_capture_status(answers) -> dict:
    """Every worker's capture status, plus the summary the live page reads (state, counters, files)."""
    statuses = []
    for worker, (status, data) in answers:
        entry = _loads(data) if status else {"state": "unknown", "error": data.decode()}
        entry["worker"] = worker.index
        statuses.append(entry)
    states = {s.get("state") for s in statuses}
    counters: dict[str, float] = {}
    for s in statuses:
        for key, value in (s.get("counters") or {}).items():
            if isinstance(value, (int, float)):
                counters[key] = counters.get(key, 0) + value
    files = {f"worker {s['worker']} {kind}": path for s in statuses
             for kind, path in (s.get("files") or {}).items()}
    combined: dict[str, Any] = {
        "state": states.pop() if len(states) == 1 else "mixed",
        "active": all(s.get("active") for s in statuses) if statuses else False,
        "counters": counters, "files": files, "workers": statuses}
    started = [s["started_at"] for s in statuses if s.get("started_at")]
    if started:
        combined["started_at"] = min(started)
    errors = [f"worker {s['worker']}: {s['error']}" for s in statuses if s.get("error")]
    if errors:
        combined["error"] = "; ".join(errors)
    return combined
