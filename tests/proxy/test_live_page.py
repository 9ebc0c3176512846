"""The live page at ``/`` in a real browser, with real traffic through kproxy to a real broker.

One kproxy (admin token, capture root) for the module; kafka-python clients send
known traffic; headless Chromium (the session's one browser) opens the page as a
person would: enters the token, watches, filters, clicks, starts and stops a
capture. Screenshots go to each test's tmp dir (``KPROXY_LIVE_SCREENSHOT`` also
copies the first one there, for the README).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
import urllib.error
import urllib.request
import uuid

import pytest

from kproxy.observers import live as live_module
from kproxy.admin import live_web
from tests.proxy.harness import ProxyThread
from tests.proxy.live_page import TOKEN, WAIT_MS, open_page, wait_until

SCREENSHOT_ENV = "KPROXY_LIVE_SCREENSHOT"


@pytest.fixture(scope="module")
def proxy(kafka_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("live-capture-root")
    with ProxyThread(upstream=kafka_cluster.bootstrap_servers, admin_token=TOKEN,
                     capture_root=str(root)) as running:
        running.capture_root = root
        yield running


def produce_one_by_one(proxy, topic: str, n: int, client_id: str) -> None:
    """n Produce requests of one record each (each send waits for its answer)."""
    from kafka import KafkaProducer
    producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, client_id=client_id, linger_ms=0)
    try:
        for i in range(n):
            producer.send(topic, value=b"record %d" % i).get(timeout=30)
    finally:
        producer.close()


def produce_rows(page) -> list:
    return page.eval_on_selector_all("#pairs tbody tr[data-api=Produce]",
                                     "rows => rows.map(r => [r.dataset.id, r.cells[3].textContent])")


def wait_for_rows(page, selector: str, n: int) -> None:
    page.locator(selector).nth(n - 1).wait_for(timeout=WAIT_MS)


@contextlib.contextmanager
def page_showing_produce(browser, proxy, topic_prefix: str, count: int, client_id: str):
    """The live page, open before ``count`` Produce requests of ``client_id`` to a new topic
    and showing their rows; yields (page, topic) and closes the page after."""
    topic = f"{topic_prefix}-{uuid.uuid4().hex[:6]}"
    page = open_page(browser, proxy)
    try:
        produce_one_by_one(proxy, topic, count, client_id=client_id)
        wait_for_rows(page, "#pairs tbody tr[data-api=Produce]", count)
        yield page, topic
    finally:
        page.close()


def screenshot(page, tmp_path, name: str) -> None:
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=False)
    if os.environ.get(SCREENSHOT_ENV) and name == "live":
        shutil.copyfile(path, os.environ[SCREENSHOT_ENV])


def test_the_page_shows_every_pair_the_client_sent_and_a_filter_narrows_them(browser, proxy, tmp_path):
    with page_showing_produce(browser, proxy, "live", 12, client_id="live-count") as (page, topic):
        time.sleep(1.0)                                   # anything extra would arrive by now
        rows = produce_rows(page)
        assert len(rows) == 12 and {client for _, client in rows} == {"live-count"}, rows
        assert page.eval_on_selector_all("#pairs tbody tr", "r => r.length") > 12   # Metadata etc. too
        page.locator("#apis").get_by_role("cell", name="Produce", exact=True).wait_for(timeout=WAIT_MS)
        screenshot(page, tmp_path, "live")

        # A filter is applied on the server: only Produce pairs of one client_id arrive.
        page.fill("#filters input[name=apis]", "Produce")
        page.fill("#filters input[name=client_id]", "live-f*")
        page.click("#filters button[type=submit]")
        page.wait_for_selector("[data-testid=state].live", timeout=WAIT_MS)
        produce_one_by_one(proxy, topic, 3, client_id="live-other")       # filtered out
        produce_one_by_one(proxy, topic, 5, client_id="live-filtered")
        wait_for_rows(page, "#pairs tbody tr", 5)
        time.sleep(1.0)
        shown = page.eval_on_selector_all(
            "#pairs tbody tr", "rows => rows.map(r => [r.dataset.api, r.cells[3].textContent])")
        assert shown == [["Produce", "live-filtered"]] * 5, shown
        screenshot(page, tmp_path, "filtered")


def test_clicking_a_produce_pair_shows_its_topic_and_record_count(browser, proxy, tmp_path):
    with page_showing_produce(browser, proxy, "detail", 2, client_id="live-detail") as (page, topic):
        page.click("#pairs tbody tr[data-api=Produce]")
        page.locator("#detail-summary[data-records]").wait_for(timeout=WAIT_MS)
        summary = page.eval_on_selector("#detail-summary", "e => [e.dataset.topics, e.dataset.records, e.textContent]")
        assert summary[0] == topic and summary[1] == "1", summary
        request = json.loads(page.inner_text("[data-testid=detail-request]"))
        assert request["topic_data"][0]["name"] == topic
        records = request["topic_data"][0]["partition_data"][0]["records"]
        assert records["records"] == 1 and "data" not in records     # record data is not shown by default
        assert "record data not shown" in summary[2]
        screenshot(page, tmp_path, "detail")

        # The connection's recent traffic as pcapng (the page's download button).
        with page.expect_download(timeout=WAIT_MS) as download:
            page.click("#detail-pcap")
        data = open(download.value.path(), "rb").read()
        assert data[:4] == b"\x0a\x0d\x0d\x0a" and topic.encode() in data


def test_the_inventory_lists_the_client_software(browser, proxy, tmp_path):
    import kafka
    page = open_page(browser, proxy)
    try:
        produce_one_by_one(proxy, f"inv-{uuid.uuid4().hex[:6]}", 1, client_id="live-inventory")
        page.locator("#inventory tbody tr", has_text="live-inventory").first.wait_for(timeout=WAIT_MS)
        rows = page.eval_on_selector_all("#inventory tbody tr",
                                         "rows => rows.map(r => [...r.cells].map(c => c.textContent))")
        mine = [r for r in rows if r[1] == "live-inventory"]
        assert mine and all(r[0] == "127.0.0.1" for r in mine), rows
        assert ["kafka-python", kafka.__version__] in [r[2:4] for r in mine], mine
        assert any("Produce" in r[5] for r in mine), mine          # API versions used
        screenshot(page, tmp_path, "inventory")
    finally:
        page.close()


def test_capture_start_and_stop_from_the_page_write_files(browser, proxy, tmp_path):
    before = set(proxy.capture_root.rglob("*"))
    page = open_page(browser, proxy)
    try:
        page.fill("#capture-dir", "from-the-page")
        page.click("#capture-start")
        try:
            page.wait_for_selector("[data-testid=capture-status][data-state=running]", timeout=WAIT_MS)
        except Exception:
            raise AssertionError((page.inner_text("#capture"), page.errors))
        produce_one_by_one(proxy, f"cap-{uuid.uuid4().hex[:6]}", 3, client_id="live-capture")
        page.click("#capture-stop")
        page.wait_for_selector("[data-testid=capture-status][data-state=stopped]", timeout=WAIT_MS)
        listed = page.eval_on_selector_all("#capture-files li", "items => items.map(i => i.textContent)")
        screenshot(page, tmp_path, "capture")
    finally:
        page.close()
    written = sorted(set(proxy.capture_root.rglob("*.jsonl")) - before)
    assert len(written) == 1 and written[0].parent.name == "from-the-page", written
    assert listed == [str(written[0])]
    rows = [json.loads(line) for line in written[0].read_text().splitlines()]
    assert sum(1 for r in rows if r["api_name"] == "Produce" and r["client_id"] == "live-capture") == 3


def capture_api(proxy, path: str, body: dict) -> dict:
    """POST to the capture API with the admin token, as a script or another page would."""
    request = urllib.request.Request(proxy.admin_url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.loads(r.read())


def test_the_capture_panel_follows_a_capture_started_elsewhere(browser, proxy, tmp_path):
    """Started and stopped over the API, not from the page: the panel shows both, and
    the rows written, without a reload."""
    page = open_page(browser, proxy)
    try:
        page.wait_for_selector("[data-testid=capture-status][data-state=off], "
                               "[data-testid=capture-status][data-state=stopped]", timeout=WAIT_MS)
        assert capture_api(proxy, "/capture/start", {"formats": ["jsonl"], "directory": "from-the-api"})["active"]
        page.wait_for_selector("[data-testid=capture-status][data-state=running]", timeout=WAIT_MS)
        produce_one_by_one(proxy, f"api-cap-{uuid.uuid4().hex[:6]}", 3, client_id="api-capture")
        written = capture_api(proxy, "/capture/stop", {})["counters"]["rows_written"]
        assert written >= 3
        page.wait_for_selector("[data-testid=capture-status][data-state=stopped]", timeout=WAIT_MS)
        wait_until(lambda: f"{written} rows written in total" in page.inner_text("#capture-status"),
                   "the panel to show the rows the capture wrote")
    finally:
        page.close()


def test_without_the_token_the_page_shows_nothing(browser, proxy, tmp_path):
    topic = f"refused-{uuid.uuid4().hex[:6]}"
    page = open_page(browser, proxy, token=None)
    try:
        page.fill("#token", "wrong-" + TOKEN)
        page.press("#token", "Enter")
        page.wait_for_selector("#token-error:not([hidden])", timeout=WAIT_MS)
        produce_one_by_one(proxy, topic, 2, client_id="live-refused")
        time.sleep(1.0)
        assert page.eval_on_selector_all("#pairs tbody tr", "r => r.length") == 0
        assert page.eval_on_selector_all("#inventory tbody tr", "r => r.length") == 0
        assert "refused" in page.inner_text("#token-error")
        screenshot(page, tmp_path, "refused")
    finally:
        page.close()
    # The data routes themselves, without and with a wrong token.
    for path in ("/live/stream", "/live/overview", "/live/pairs/1", "/live/connections/1/pcapng"):
        for headers in ({}, {"Authorization": "Bearer wrong-" + TOKEN}):
            request = urllib.request.Request(proxy.admin_url + path, headers=headers)
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=10)
            assert refused.value.code == 401, path


def test_no_configured_token_means_no_live_data(browser, tmp_path):
    with ProxyThread(upstream="127.0.0.1:1", broker_port_base=0) as bare:
        page = browser.new_page()
        try:
            page.goto(bare.admin_url + "/")
            page.fill("#token", "x" * 20)
            page.press("#token", "Enter")
            page.wait_for_selector("#notice:not([hidden])", timeout=WAIT_MS)
            assert "no admin token is configured" in page.inner_text("#notice")
        finally:
            page.close()


# ---------------------------------------------------------------- a viewer that never reads

# Above what one stream tick takes at the rate cap (200/s x 0.25 s): a full backlog means
# the stream is stuck on a socket nobody reads, not merely between ticks.
SMALL_BACKLOG = 120
STUCK_S = 2.0                # rows offered, none taken for this long: the stream is stuck
ROWS_AFTER_STUCK = 3 * SMALL_BACKLOG   # offered once stuck: a flowing stream would send most


def test_a_viewer_that_never_reads_costs_bounded_memory_and_slows_nobody(proxy, monkeypatch):
    """A stream whose reader stops reading: its rows pile up only to the backlog bound
    (then are dropped and counted), its socket buffers are small, and the client's
    traffic all gets through."""
    monkeypatch.setattr(live_module, "VIEWER_BACKLOG", SMALL_BACKLOG)
    monkeypatch.setattr(live_web, "STREAM_SEND_BUFFER", 4096)
    host, port = proxy.runtime.admin.address
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, port))
    sock.sendall(f"GET /live/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
    live = proxy.runtime.live
    try:
        deadline = time.monotonic() + 10
        while not live.viewers and time.monotonic() < deadline:
            time.sleep(0.05)
        (viewer,) = live.viewers
        topic = f"slow-{uuid.uuid4().hex[:6]}"
        sent = 0
        from kafka import KafkaProducer
        producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, client_id="live-slow", linger_ms=0)
        try:
            while viewer.dropped == 0 or sent < 300:
                producer.send(topic, value=b"x" * 100).get(timeout=30)
                sent += 1
                assert sent < 20_000, "the backlog never filled: the stream is not bounded"
            # The backlog overflowed, but a burst within one tick does that too while the
            # stream still flows into kernel and transport buffers: keep offering rows until
            # none has been taken for STUCK_S (a flowing stream takes them every tick).
            sent_rows_then, stuck_since = viewer.sent, time.monotonic()
            deadline = time.monotonic() + 60
            while time.monotonic() - stuck_since < STUCK_S and time.monotonic() < deadline:
                producer.send(topic, value=b"x" * 100).get(timeout=30)
                sent += 1
                time.sleep(0.01)
                if viewer.sent != sent_rows_then:
                    sent_rows_then, stuck_since = viewer.sent, time.monotonic()
            assert time.monotonic() - stuck_since >= STUCK_S, "the stream never stopped taking rows"
            for _ in range(ROWS_AFTER_STUCK):
                producer.send(topic, value=b"x" * 100).get(timeout=30)
                sent += 1
        finally:
            producer.close()
        deadline = time.monotonic() + 30
        while live.put_pairs > live.got_pairs and time.monotonic() < deadline:
            time.sleep(0.1)                                # the live thread catches up
        assert len(viewer.backlog) <= SMALL_BACKLOG
        assert viewer.dropped > 0
        # A write already waiting on the socket may still complete once and take the
        # backlog with it; beyond that nothing flows, though three backlogs were offered.
        assert viewer.sent - sent_rows_then <= SMALL_BACKLOG, "rows kept flowing into a socket nobody reads"
        produced = [r for r in proxy.runtime.live._recent.values()
                    if r[3]["client_id"] == "live-slow" and r[3]["api_name"] == "Produce"]
        assert len(produced) == sent                       # every Produce answered and seen
    finally:
        sock.close()


def test_the_page_says_when_the_stream_is_thinned(browser, proxy, tmp_path, monkeypatch):
    """Past the per-page rate cap rows are left out, counted, and the page says so."""
    monkeypatch.setattr(live_module, "VIEWER_MAX_ROWS_PER_S", 3)
    page = open_page(browser, proxy)
    try:
        produce_one_by_one(proxy, f"thin-{uuid.uuid4().hex[:6]}", 20, client_id="live-thinned")
        page.locator("[data-testid=notice]", has_text="thinned").wait_for(timeout=WAIT_MS)
        notice = page.inner_text("[data-testid=notice]")
        assert notice.startswith("Sampled stream: ") and "thinned (over the page's per-second cap)" in notice
        (viewer,) = proxy.runtime.live.viewers
        assert viewer.thinned > 0 and viewer.sent < viewer.matched
        screenshot(page, tmp_path, "thinned")
    finally:
        page.close()


# ---------------------------------------------------------------- markup in client ids and topic names

# Client ids and topic names are whatever a client puts in its requests. Each carries markup
# that would leave a trace (an element with data-xss, window.__kproxyXss) if the page ever
# parsed it as HTML; the CSP would also report an inline script or handler it blocked.
HOSTILE_CLIENT_ID = '<img src=x data-xss=client onerror="window.__kproxyXss=1">"><b data-xss=attr>'
HOSTILE_TOPIC = "<script data-xss=topic>window.__kproxyXss=2</script><svg data-xss=svg onload=alert(1)>"
XSS_TRACES = "() => [document.querySelectorAll('[data-xss]').length, window.__kproxyXss ?? null, " \
             "window.__kproxyViolations.length]"


def send_with_markup(proxy) -> None:
    """Metadata and a Produce naming HOSTILE_TOPIC, with HOSTILE_CLIENT_ID in the header, from a
    raw client (Kafka refuses the topic name: the answers carry its error, and still pass)."""
    from kproxy.protocol import Request, Struct, encode_request, new_body
    from kproxy.protocol.record_encoder import build_batch
    from kproxy.protocol.records import Record
    batch = build_batch([Record(0, 1_700_000_000_000, None, b"v" * 20, ())], "none")
    frames = [(3, 12, new_body("request", 3, 12, topics=[Struct(name=HOSTILE_TOPIC, topic_id=bytes(16))],
                               allow_auto_topic_creation=False)),
              (0, 9, new_body("request", 0, 9, acks=1, timeout_ms=5000, topic_data=[
                  Struct(name=HOSTILE_TOPIC, partition_data=[Struct(index=0, records=batch)])]))]
    host, port = proxy.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        for correlation_id, (api_key, version, body) in enumerate(frames, 1):
            payload = encode_request(Request(api_key, version, correlation_id, HOSTILE_CLIENT_ID, body))
            sock.sendall(len(payload).to_bytes(4, "big") + payload)
            size = int.from_bytes(sock.recv(4, socket.MSG_WAITALL), "big")
            assert len(sock.recv(size, socket.MSG_WAITALL)) == size


def test_markup_in_client_ids_and_topic_names_is_shown_as_text(browser, proxy, tmp_path):
    """The table, the detail view and the inventory show the client id and the topic name
    character for character, as text: no element made from them, nothing run, nothing the
    page's CSP had to block, no script error."""
    page = open_page(browser, proxy)
    try:
        page.evaluate("() => { window.__kproxyViolations = []; document.addEventListener("
                      "'securitypolicyviolation', e => window.__kproxyViolations.push(e.violatedDirective)); }")
        send_with_markup(proxy)
        produce = page.locator("#pairs tbody tr[data-api=Produce]").first
        produce.wait_for(timeout=WAIT_MS)
        cells = produce.evaluate("r => [...r.cells].map(c => c.textContent)")
        assert HOSTILE_CLIENT_ID in cells and HOSTILE_TOPIC in cells, cells

        produce.click()
        page.locator("#detail-summary[data-records]").wait_for(timeout=WAIT_MS)
        assert page.eval_on_selector("#detail-summary", "e => e.dataset.topics") == HOSTILE_TOPIC
        request = json.loads(page.inner_text("[data-testid=detail-request]"))
        assert request["topic_data"][0]["name"] == HOSTILE_TOPIC
        screenshot(page, tmp_path, "markup-detail")

        page.locator("#inventory tbody tr", has_text="data-xss=client").first.wait_for(timeout=WAIT_MS)
        inventory = page.eval_on_selector_all("#inventory tbody tr",
                                              "rows => rows.map(r => [...r.cells].map(c => c.textContent))")
        assert [HOSTILE_CLIENT_ID] == [r[1] for r in inventory if "data-xss" in r[1]], inventory
        page.locator("#inventory").scroll_into_view_if_needed()
        screenshot(page, tmp_path, "markup-inventory")
        assert page.evaluate(XSS_TRACES) == [0, None, 0]
        assert not page.errors, page.errors
    finally:
        page.close()


def test_audit_events_and_failovers_are_listed_as_text(browser, proxy, tmp_path):
    """A client id is the client's to choose: markup in it shows as text in both sections."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from tests.observers.captures import Link, produce_answer, produce_request

    hostile = '<img src=x onerror="window.pwned=1">'
    topic = f"audit-{uuid.uuid4().hex[:6]}"

    async def fail_over():                   # on kproxy's event loop, as its relays feed observers
        before, after = (Link(proxy.runtime.failovers, conn_id=10**9 + i, node_id=i) for i in (1, 2))
        before.exchange(0, 10, 1, produce_request(topic), produce_answer(0, 6, (2, 5), topic), client_id=hostile)
        after.exchange(0, 10, 2, produce_request(topic), produce_answer(0, 0, None, topic), client_id=hostile)
    proxy.call(fail_over())
    admin = KafkaAdminClient(bootstrap_servers=proxy.bootstrap, client_id=hostile)
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        admin.close()
    page = open_page(browser, proxy)
    try:
        page.locator("#audit tbody tr", has_text=topic).first.wait_for(timeout=WAIT_MS)
        page.locator("#failovers tbody tr", has_text=topic).first.wait_for(timeout=WAIT_MS)
        cells = "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
        audit = [r for r in page.eval_on_selector_all("#audit tbody tr", cells) if topic in r[6]]
        assert [(r[3], r[5], r[7]) for r in audit] == [(hostile, "CreateTopics", "ok")], audit
        (failover,) = [r for r in page.eval_on_selector_all("#failovers tbody tr", cells) if topic in r[4]]
        assert (failover[1], failover[4], failover[6], failover[10]) == (hostile, f"{topic}-0", "1 → 2", "hint (hint: 2)")
        assert page.locator("#audit img, #failovers img").count() == 0
        assert page.evaluate("window.pwned") is None
        screenshot(page, tmp_path, "failovers-audit")
    finally:
        page.close()
