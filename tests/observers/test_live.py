"""The live view's parts on their own: the hot path's one check, a viewer's bounds, p99, filters."""

from __future__ import annotations

import time

import pytest

from kproxy.observers import live as live_module
from kproxy.observers.live import LATENCY_EDGES_MS, LiveView, Viewer, ViewerFilter, _Window
from kproxy.protocol.events import RequestReceived, ResponseReceived
from kproxy.observers.contract import ConnectionInfo

INFO = ConnectionInfo(7, ("10.1.2.3", 5555), "bootstrap", ("10.9.9.9", 9092), None, 0.0)


def metadata_pair(correlation_id: int) -> tuple[RequestReceived, ResponseReceived]:
    request = RequestReceived(b"\x00\x03\x00\x00" + correlation_id.to_bytes(4, "big") + b"\xff\xff",
                              3, 0, correlation_id, 1.0, True)
    return request, ResponseReceived(correlation_id.to_bytes(4, "big"), request, 1.002)


def test_with_no_viewer_the_hook_queues_nothing():
    live = LiveView()
    live.connection_opened(INFO)
    request, response = metadata_pair(1)
    live(INFO, [request])                     # the connection's first request: read for the inventory
    live(INFO, [response])
    assert live.put_pairs == 0 and live.overloaded == 0
    live.watch()
    try:
        live(INFO, [response])
        assert live.put_pairs == 1
    finally:
        live.close()


def test_a_viewer_keeps_at_most_its_backlog_and_its_rate(monkeypatch):
    monkeypatch.setattr(live_module, "VIEWER_BACKLOG", 10)
    viewer = Viewer(LiveView(), ViewerFilter())
    for i in range(15):                       # one second: under the rate cap, over the backlog
        viewer.offer({"id": i}, 100.0)
    assert len(viewer.backlog) == 10 and viewer.dropped == 5 and viewer.thinned == 0
    assert [row["id"] for row in viewer.take()] == list(range(10)) and viewer.sent == 10
    for i in range(live_module.VIEWER_MAX_ROWS_PER_S + 3):
        viewer.offer({"id": i}, 101.0)        # the next second: the cap thins
        viewer.take()
    assert viewer.thinned == 3 and viewer.matched == 15 + live_module.VIEWER_MAX_ROWS_PER_S + 3


def test_p99_comes_from_the_histogram_within_its_resolution():
    window = _Window()
    for ms in range(1, 101):
        window.add(1000, "Fetch", float(ms), failed=ms > 95)
    (fetch,) = window.snapshot(1000.5)["apis"]
    assert 99.0 <= fetch["p99_ms"] <= 99.0 * 1.25
    assert fetch["count"] == 100 and fetch["errors"] == 5 and fetch["error_rate"] == 0.05
    assert fetch["p99_ms"] in [round(e, 3) for e in LATENCY_EDGES_MS]


def test_viewer_filters():
    request, _ = metadata_pair(3)
    row = {"topics": ["orders"], "error_count": 0, "decode_error": None, "latency_ms": 2.0}
    assert ViewerFilter({"apis": "Metadata"}).compile().matches(INFO, request, row)
    assert not ViewerFilter({"apis": "Produce"}).compile().matches(INFO, request, row)
    assert not ViewerFilter({"errors": "1"}).compile().matches(INFO, request, row)
    assert ViewerFilter({"errors": "1"}).compile().matches(INFO, request, {**row, "error_count": 1})
    assert not ViewerFilter({"min_latency_ms": "5"}).compile().matches(INFO, request, row)
    assert ViewerFilter({"topics": "ord*", "clients": "10.0.0.0/8"}).compile().matches(INFO, request, row)
    assert not ViewerFilter({"clients": "192.168.0.0/16"}).compile().matches(INFO, request, row)
    for bad, message in (({"apis": "Nope"}, "unknown API"), ({"colour": "red"}, "filter.colour"),
                         ({"min_latency_ms": "soon"}, "min_latency_ms")):
        with pytest.raises(ValueError, match=message):
            ViewerFilter(bad)


def test_recent_pairs_are_bounded_and_let_go_when_the_last_viewer_leaves(monkeypatch):
    monkeypatch.setattr(live_module, "RECENT_MAX_PAIRS", 5)
    live = LiveView()
    viewer = live.add_viewer(ViewerFilter().compile())
    try:
        for i in range(1, 9):
            request, response = metadata_pair(i)
            live._remember(i, INFO, request, response, {"time": 1000.0 + i})
        assert list(live._recent) == [4, 5, 6, 7, 8]
        assert live.pair(1) is None and live.connection_pcapng(999) is None
        live.remove_viewer(viewer)
        assert not live.watched and not live._recent and live._recent_bytes == 0
    finally:
        live.close()


def test_overviews_of_several_workers_merge_into_the_overview_of_all_their_traffic():
    """``kproxy run --workers``: counts add up, p99 comes from the summed latency buckets
    (not from the workers' p99s), and a client with connections on both is one entry."""
    from kproxy.observers.live import merge_overviews

    def worker_overview(latencies_ms, connection_ids, failed=0):
        window = _Window()
        for i, ms in enumerate(latencies_ms):
            window.add(int(time.time()), "Fetch", float(ms), failed=i < failed)
        live = LiveView()
        live._window = window
        for conn in connection_ids:
            live.connection_opened(ConnectionInfo(conn, ("10.1.2.3", 5000 + conn), "bootstrap",
                                                  ("10.9.9.9", 9092), None, 0.0))
            request, _ = metadata_pair(conn)
            live(ConnectionInfo(conn, ("10.1.2.3", 5000 + conn), "bootstrap", ("10.9.9.9", 9092), None, 0.0),
                 [request])
        return live.overview()

    fast = worker_overview([1.0] * 90, [1, 3], failed=2)     # worker 0: 90 quick answers
    slow = worker_overview([500.0] * 10, [2])                # worker 1: 10 slow ones
    assert fast["traffic"]["apis"][0]["p99_ms"] < 2 and slow["traffic"]["apis"][0]["p99_ms"] >= 500
    merged = merge_overviews([fast, slow])
    (fetch,) = merged["traffic"]["apis"]
    alone = worker_overview([1.0] * 90 + [500.0] * 10, [])["traffic"]["apis"][0]
    assert fetch["count"] == 100 and fetch["errors"] == 2 and fetch["error_rate"] == 0.02
    assert fetch["p99_ms"] == alone["p99_ms"] >= 500              # 10 % of all are slow
    assert merged["connections"] == {"open": 3, "by_listener": {"bootstrap": 3}}
    (client,) = merged["inventory"]
    assert client["open"] == 3 and client["client_id"] is None and client["listeners"] == ["bootstrap"]
    assert merge_overviews([])["traffic"]["apis"] == []


def test_workers_audit_events_and_failovers_merge_newest_first():
    """``kproxy run --workers``: each worker's latest audit events and failovers, one list."""
    from kproxy.observers.live import merge_overviews

    def worker(audit_times, recovered, failing):
        live = LiveView()
        live.panels["audit"] = lambda: [{"time": t, "api": "CreateTopics"} for t in sorted(audit_times, reverse=True)]
        live.panels["failovers"] = lambda: {
            "failovers": [{"recovered": r, "client_id": f"c{r}"} for r in sorted(recovered, reverse=True)],
            "leader_changes": [{"time": r - 1} for r in recovered], "ended": len(recovered),
            "failing_now": failing}
        return live.overview()

    merged = merge_overviews([worker(["2026-01-01T00:00:02Z"], [5.0, 1.0], 1),
                              worker(["2026-01-01T00:00:03Z", "2026-01-01T00:00:01Z"], [3.0], 0)])
    assert [e["time"][-3:] for e in merged["audit"]] == ["03Z", "02Z", "01Z"]
    assert [f["recovered"] for f in merged["failovers"]["failovers"]] == [5.0, 3.0, 1.0]
    assert (merged["failovers"]["ended"], merged["failovers"]["failing_now"]) == (3, 1)
    assert "audit" not in merge_overviews([LiveView().overview()])       # audit off: no section
