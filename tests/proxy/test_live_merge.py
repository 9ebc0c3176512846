"""The supervisor's merged live stream without processes: rows of several workers in one
time-ordered stream, and counts that add up over workers and over a restarted worker's
streams (the browser test, test_live_page_workers.py, runs the real thing)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

from kproxy.observers.live import ViewerFilter
from kproxy.admin.live_merge import REORDER_S, MergedViewer, _Follower
from kproxy.admin.worker_admin import WorkerView

WORKERS = [WorkerView(0, "serving", 100, 4000), WorkerView(1, "serving", 101, 4001)]


def follower(viewer: MergedViewer, worker: WorkerView) -> _Follower:
    f = _Follower(worker)
    f.task = SimpleNamespace(cancel=lambda: None, done=lambda: False)
    f.answered.set()                                    # its stream answered
    viewer.followers[(worker.index, worker.pid)] = f
    return f


def event(kind: str, data) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}".encode()


def test_rows_of_both_workers_leave_in_time_order_once_old_enough():
    viewer = MergedViewer(SimpleNamespace(workers=lambda: WORKERS), ViewerFilter(), "")
    zero, one = follower(viewer, WORKERS[0]), follower(viewer, WORKERS[1])
    then = time.time() - 5
    viewer._event(one, event("pairs", [{"id": 2, "time": then + 0.2}, {"id": 4, "time": then + 0.4}]))
    viewer._event(zero, event("pairs", [{"id": 1, "time": then + 0.1}, {"id": 3, "time": then + 0.3},
                                        {"id": 5, "time": time.time() + REORDER_S}]))     # too new yet
    rows = viewer.take()
    assert [r["id"] for r in rows] == [1, 2, 3, 4] and viewer.sent == 4
    assert [r["pid"] for r in rows] == [100, 101, 100, 101]          # the page sends it back
    assert [r["id"] for r in viewer.backlog] == [5]


def test_status_adds_up_workers_and_a_restarted_workers_streams():
    viewer = MergedViewer(SimpleNamespace(workers=lambda: WORKERS), ViewerFilter(), "")
    zero, one = follower(viewer, WORKERS[0]), follower(viewer, WORKERS[1])
    viewer._event(zero, event("status", {"matched": 5, "dropped": 1, "thinned": 0, "overloaded": 2}))
    viewer._event(one, event("status", {"matched": 3, "dropped": 0, "thinned": 2, "overloaded": 1}))
    one.failed = True
    assert viewer.status()["workers_missing"] == [1]
    viewer._forget((1, 101))                            # worker 1 died; its successor is followed
    again = follower(viewer, WorkerView(1, "serving", 102, 4002))
    viewer._event(again, event("status", {"matched": 1, "dropped": 0, "thinned": 0, "overloaded": 0}))
    status = viewer.status()
    assert (status["matched"], status["dropped"], status["thinned"]) == (9, 1, 2)
    assert status["overloaded"] == 3 and status["workers_missing"] == [] and status["workers"] == 2


def test_a_worker_whose_stream_has_not_answered_yet_is_missing():
    viewer = MergedViewer(SimpleNamespace(workers=lambda: WORKERS), ViewerFilter(), "")
    follower(viewer, WORKERS[0])
    connecting = _Follower(WORKERS[1])                  # asked, no answer yet
    connecting.task = SimpleNamespace(cancel=lambda: None, done=lambda: False)
    viewer.followers[(1, 101)] = connecting
    assert viewer.status()["workers_missing"] == [1]
    connecting.answered.set()
    assert viewer.status()["workers_missing"] == []


def test_a_page_stream_starts_once_every_worker_stream_answered_or_the_wait_ends():
    import asyncio

    async def scenario():
        viewer = MergedViewer(SimpleNamespace(workers=lambda: WORKERS), ViewerFilter(), "")
        slow = [_Follower(w) for w in WORKERS]
        for f in slow:
            viewer.followers[(f.worker.index, f.worker.pid)] = f
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, slow[0].answered.set)
        loop.call_later(0.10, slow[1].answered.set)
        started = loop.time()
        await viewer.answered(timeout=5)
        answered_after = loop.time() - started
        never = MergedViewer(SimpleNamespace(workers=lambda: WORKERS), ViewerFilter(), "")
        never.followers[(0, 100)] = _Follower(WORKERS[0])
        started = loop.time()
        await never.answered(timeout=0.2)
        return answered_after, loop.time() - started

    answered_after, gave_up_after = asyncio.run(scenario())
    assert 0.1 <= answered_after < 5                    # waited for the second, not the timeout
    assert 0.2 <= gave_up_after < 5                     # a worker that never answers: the wait ends
