"""The live page of ``kproxy run --workers 2`` in a real browser: every worker's traffic on it.

The supervisor subprocess in front of the real broker; raw clients (one Produce per
connection, so the kernel spreads them over both workers) are the witnesses, and
each worker's private /metrics says where they landed. Headless Chromium opens the
supervisor's page as a person would; a worker killed meanwhile rejoins the page
once restarted.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import time
from types import SimpleNamespace

import pytest

from tests.proxy.harness import WORKERS_TOKEN, value
from tests.proxy.live_page import WAIT_MS, open_page, wait_until
from tests.proxy.wire import WitnessClient

SCREENSHOT_ENV = "KPROXY_LIVE_WORKERS_SCREENSHOT"
# Connections made, one Produce each: all on one worker by chance has odds 2 x 2^-24.
CONNECTIONS = 24


def page_of(browser, proxy):
    page = open_page(browser, SimpleNamespace(admin_url=proxy.admin_url), token=WORKERS_TOKEN)
    assert page.errors == []                # the page names its icon: no /favicon.ico 404
    page.refused = []                       # answers >= 400 the page got, to name them
    page.on("response", lambda r: page.refused.append((r.status, r.url)) if r.status >= 400 else None)
    return page


def produce_on_new_connections(proxy, topic: str, n: int, tag: str) -> None:
    for i in range(n):
        with WitnessClient(proxy.bootstrap) as client:
            client.produce(topic, f"{tag} {i}".encode())


def produce_rows(page, topic: str) -> list[dict]:
    """The Produce rows on the page for ``topic`` (every row names its topics)."""
    return [row for row in page.eval_on_selector_all(
        "#pairs tbody tr[data-api=Produce]",
        "rows => rows.map(r => ({id: r.dataset.id, conn: r.dataset.conn, pid: r.dataset.pid,"
        " time: r.cells[0].textContent, topics: r.cells[11].textContent}))") if row["topics"] == topic]


def per_worker_produces(proxy) -> list[float]:
    return [value(m, "kproxy_requests_total", api="Produce") for m in proxy.per_worker_metrics()]


def test_the_page_shows_the_traffic_of_every_worker(browser, workers_proxy, workers_topic, tmp_path):
    before = per_worker_produces(workers_proxy)
    page = page_of(browser, workers_proxy)
    try:
        produce_on_new_connections(workers_proxy, workers_topic, CONNECTIONS, "merged")
        wait_until(lambda: len(produce_rows(page, workers_topic)) >= CONNECTIONS, f"{CONNECTIONS} Produce rows")
        time.sleep(1.0)                                       # anything extra would arrive by now
        rows = produce_rows(page, workers_topic)
        landed = [after - was for after, was in zip(per_worker_produces(workers_proxy), before)]
        assert min(landed) > 0 and sum(landed) == CONNECTIONS, landed     # both workers served some
        assert len(rows) == CONNECTIONS and len({r["conn"] for r in rows}) == CONNECTIONS, rows
        times = [r["time"] for r in rows]                # one list, newest first, not per worker
        assert times == sorted(times, reverse=True), times
        pids = {w["index"]: str(w["pid"]) for w in workers_proxy.workers()}
        for index, pid in pids.items():                    # each worker's rows, as many as it served
            mine = [r for r in rows if r["pid"] == pid]
            assert len(mine) == landed[index], (index, rows)
            # Worker w hands out ids w+1, w+1+2, ...: the supervisor routes details by id.
            assert all((int(r["conn"]) - 1) % 2 == index and (int(r["id"]) - 1) % 2 == index
                       for r in mine), mine
        assert page.is_hidden("[data-testid=notice]"), page.inner_text("[data-testid=notice]")

        # The overview adds up both workers: the Produce count, one inventory entry.
        page.locator("#apis").get_by_role("cell", name="Produce", exact=True).wait_for(timeout=WAIT_MS)
        status, body = workers_proxy.get("/live/overview")
        overview = json.loads(body)
        assert status == 200 and "notice" not in overview and overview["workers"] == 2
        (produce,) = [a for a in overview["traffic"]["apis"] if a["api"] == "Produce"]
        assert produce["count"] == CONNECTIONS
        (witness,) = [c for c in overview["inventory"] if c["client_id"] == "raw-witness"]
        assert witness["open"] + witness["closed"] >= CONNECTIONS
        assert "worker" not in page.inner_text("#window-note")
        screenshot = tmp_path / "live-workers.png"
        page.screenshot(path=str(screenshot))
        if os.environ.get(SCREENSHOT_ENV):
            shutil.copyfile(screenshot, os.environ[SCREENSHOT_ENV])

        # A pair of each worker opens in the detail view, asked of the worker that has it.
        for index, pid in pids.items():
            (row,) = [r for r in rows if r["pid"] == pid][:1]
            page.click(f"#pairs tbody tr[data-id='{row['id']}']")
            page.locator(f"#detail-title", has_text=f"pair {row['id']}").wait_for(timeout=WAIT_MS)
            page.locator("#detail-summary[data-records='1']").wait_for(timeout=WAIT_MS)
            assert page.eval_on_selector("#detail-summary", "e => e.dataset.topics") == workers_topic
            assert f"conn {row['conn']}" in page.inner_text("#detail-summary")
            with page.expect_download(timeout=WAIT_MS) as download:
                page.click("#detail-pcap")
            data = open(download.value.path(), "rb").read()
            assert data[:4] == b"\x0a\x0d\x0d\x0a" and workers_topic.encode() in data
        assert page.errors == [], (page.errors, page.refused)
    finally:
        page.close()


def test_a_slow_viewer_of_the_merged_stream_slows_no_one(browser, workers_proxy, workers_topic):
    """A stream nobody reads: the supervisor still reads the workers' streams (its own
    backlog drops), so another page gets every row and the clients every answer."""
    stuck = socket.socket()
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.connect(("127.0.0.1", int(workers_proxy.admin_url.rsplit(":", 1)[1])))
    stuck.sendall(f"GET /live/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {WORKERS_TOKEN}\r\n\r\n".encode())
    page = page_of(browser, workers_proxy)
    try:
        produce_on_new_connections(workers_proxy, workers_topic, CONNECTIONS, "beside a stuck viewer")
        wait_until(lambda: len([r for r in produce_rows(page, workers_topic)]) >= CONNECTIONS,
                   "every Produce row beside a stuck viewer")
        assert page.errors == [], (page.errors, page.refused)
    finally:
        page.close()
        stuck.close()


# Soak only (17 s: a worker killed and restarted under the page): the default suite proves
# the page merges every worker (test_the_page_shows_the_traffic_of_every_worker) and the
# supervisor restarting a killed worker (test_workers_e2e.py).
@pytest.mark.soak
def test_a_restarted_worker_rejoins_the_page(browser, workers_proxy, workers_topic, tmp_path):
    page = page_of(browser, workers_proxy)
    try:
        victim = workers_proxy.workers()[1]
        produce_on_new_connections(workers_proxy, workers_topic, CONNECTIONS, "before the kill")
        wait_until(lambda: any(r["pid"] == str(victim["pid"]) for r in produce_rows(page, workers_topic)),
                   "a row of worker 1")
        old_row = next(r for r in produce_rows(page, workers_topic) if r["pid"] == str(victim["pid"]))
        # While it does not answer the page says whose connections are missing. Frozen
        # (SIGSTOP) rather than dead for this: a dead worker is back within ~1 s, which a
        # page refreshing its overview every 2 s may never see.
        os.kill(victim["pid"], signal.SIGSTOP)
        page.locator("[data-testid=notice]", has_text="worker 1").wait_for(timeout=WAIT_MS)
        page.locator("#window-note", has_text="worker 1 not answering").wait_for(timeout=WAIT_MS)
        page.screenshot(path=str(tmp_path / "live-workers-one-down.png"))
        os.kill(victim["pid"], signal.SIGKILL)

        def restarted():
            worker = workers_proxy.workers()[1]
            return worker if worker["state"] == "serving" and worker["pid"] != victim["pid"] else None
        wait_until(restarted, "worker 1 restarted")
        new_pid = str(restarted()["pid"])
        deadline = time.monotonic() + WAIT_MS / 1000
        while not any(r["pid"] == new_pid for r in produce_rows(page, workers_topic)):
            assert time.monotonic() < deadline, "no row of the restarted worker on the page"
            produce_on_new_connections(workers_proxy, workers_topic, 4, "after the restart")
            time.sleep(0.5)
        page.wait_for_selector("[data-testid=notice]", state="hidden", timeout=WAIT_MS)
        wait_until(lambda: "not answering" not in page.inner_text("#window-note"), "the overview whole again")
        page.screenshot(path=str(tmp_path / "live-workers-rejoined.png"))

        # A pair of the killed process is not confused with the new one's pair of that id.
        status, body = workers_proxy.get(f"/live/pairs/{old_row['id']}?pid={victim['pid']}")
        assert status == 404 and "restarted" in json.loads(body)["error"], body
        assert page.errors == [], (page.errors, page.refused)
    finally:
        page.close()
