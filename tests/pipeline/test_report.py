"""The HTML report: self-contained, escaped, every plot a PNG, headline figures from summary.json.

The unit tests build small tables by hand (no Spark) in the shapes ``tables.py``
produces; the browser test runs the real job on the synthetic capture and opens
the page in headless Chromium with every network request recorded and refused.
"""

from __future__ import annotations

import base64
import datetime as dt
import html.parser
import json
import os
import pathlib
import shutil
from dataclasses import dataclass

import pytest
from PIL import Image

from kproxy.pipeline.report import PLOT_NAMES, write_report

HOSTILE = "<script>alert(1)</script>"
HOSTILE_TOPIC = '"><img src=x onerror=alert(2)>'
MATHTEXT = r"$\frac{1}{0}$ & co"          # would break a plot label if mathtext were on
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
T0 = dt.datetime(2026, 3, 1, 12, 0, 0)


def _minute(i: int) -> dt.datetime:
    return T0 + dt.timedelta(minutes=i)


def sample_tables(windows: int = 6) -> dict[str, list[dict]]:
    """One or more rows for every table, with hostile strings where clients choose them."""
    series = []
    for i in range(windows):
        for api, rate, p99 in (("Produce", 40.0, 3.0), ("Fetch", 20.0, 1.5), ("Metadata", 1.0, 0.8)):
            series.append({"window_start": _minute(i), "window_end": _minute(i + 1), "api_name": api,
                           "requests": int(rate * 60), "rate_per_s": rate,
                           "latency_p99_ms": p99 * (10 if (api == "Produce" and i == 3) else 1),
                           "request_bytes": 1000, "response_bytes": 500, "error_pairs": i % 2,
                           "error_rate": (i % 2) / (rate * 60), "throttled": 1 if i == 2 else 0,
                           "throttle_max_ms": 5 if i == 2 else 0})
    return {
        "api_latency": [
            {"api_name": "Produce", "api_key": 0, "api_version": 9, "requests": 2400, "answered": 2400,
             "latency_p50_ms": 1.2, "latency_p95_ms": 2.5, "latency_p99_ms": 4.0, "latency_max_ms": 31.0,
             "long_polls": 0, "long_poll_p50_ms": None, "long_poll_p99_ms": None,
             "request_bytes": 2_400_000, "response_bytes": 120_000, "error_pairs": 3,
             "error_rate": 0.00125, "throttled": 1, "throttled_share": 1 / 2400,
             "throttle_p50_ms": 5.0, "throttle_p99_ms": 5.0, "throttle_max_ms": 5.0},
            {"api_name": "Fetch", "api_key": 1, "api_version": 12, "requests": 1200, "answered": 1200,
             "latency_p50_ms": 0.6, "latency_p95_ms": 1.1, "latency_p99_ms": 1.5, "latency_max_ms": 9.0,
             "long_polls": 300, "long_poll_p50_ms": 500.0, "long_poll_p99_ms": 502.0,
             "request_bytes": 96_000, "response_bytes": 2_300_000, "error_pairs": 0, "error_rate": 0.0,
             "throttled": 0, "throttled_share": 0.0, "throttle_p50_ms": None, "throttle_p99_ms": None,
             "throttle_max_ms": None},
            {"api_name": "Metadata", "api_key": 3, "api_version": 0, "requests": 60, "answered": 60,
             "latency_p50_ms": 0.4, "latency_p95_ms": 0.7, "latency_p99_ms": 0.8, "latency_max_ms": 0.9,
             "long_polls": 0, "long_poll_p50_ms": None, "long_poll_p99_ms": None,
             "request_bytes": 1200, "response_bytes": 9000, "error_pairs": 0, "error_rate": 0.0,
             "throttled": 0, "throttled_share": 0.0, "throttle_p50_ms": None, "throttle_p99_ms": None,
             "throttle_max_ms": None}],
        "api_errors": [{"api_name": "Produce", "api_version": 9, "error": "NOT_LEADER_OR_FOLLOWER",
                        "pairs": 3, "answered": 2400, "share": 0.00125}],
        "series": series,
        "anomalies": [{"window_start": _minute(3), "api_name": "Produce", "metric": "latency_p99_ms",
                       "value": 30.0, "baseline": 3.0, "spread": 1.0, "score": 27.0, "requests": 2400,
                       "evidence": "latency_p99_ms 30.0 ms vs baseline 3.0 ms (spread 1.0 ms) over 6 "
                                   "windows; 2400 requests in this window"}],
        "clients": [
            {"client_id": HOSTILE, "client_host": "10.0.0.7", "connections": 3, "requests": 2460,
             "request_bytes": 2_401_200, "response_bytes": 129_000, "records_produced": 24_000,
             "records_fetched": 0, "error_pairs": 3, "api_versions": ["Metadata v0", "Produce v9"],
             "software": ["apache-kafka-java 3.7.0"], "proxies": ["sidecar-a"],
             "first_seen": _minute(0), "last_seen": _minute(windows)},
            {"client_id": MATHTEXT, "client_host": "10.0.0.8", "connections": 1, "requests": 1200,
             "request_bytes": 96_000, "response_bytes": 2_300_000, "records_produced": 0,
             "records_fetched": 23_000, "error_pairs": 0, "api_versions": ["Fetch v12"], "software": [],
             "proxies": ["sidecar-a"], "first_seen": _minute(0), "last_seen": _minute(windows)}],
        "client_inventory": [
            {"client_software_name": "apache-kafka-java", "client_software_version": "3.7.0",
             "client_id": HOSTILE, "client_host": "10.0.0.7", "connections": 3, "requests": 2460,
             "api_versions": ["Metadata v0", "Produce v9"], "first_seen": _minute(0),
             "last_seen": _minute(windows)},
            {"client_software_name": "unknown", "client_software_version": "unknown",
             "client_id": MATHTEXT, "client_host": "10.0.0.8", "connections": 1, "requests": 1200,
             "api_versions": ["Fetch v12"], "first_seen": _minute(0), "last_seen": _minute(windows)}],
        "upgrade_readiness": [
            {"client_id": HOSTILE, "client_host": "10.0.0.7", "client_software_name": "apache-kafka-java",
             "client_software_version": "3.7.0", "api_name": "Metadata", "api_version": 0,
             "requests": 60, "removed_versions": "v0-v3", "first_seen": _minute(0),
             "last_seen": _minute(windows)}],
        "topic_clients": [
            {"topic": HOSTILE_TOPIC, "role": "producer", "client_id": HOSTILE, "requests": 2400,
             "records": 24_000, "bytes": 2_300_000},
            {"topic": HOSTILE_TOPIC, "role": "consumer", "client_id": MATHTEXT, "requests": 900,
             "records": 23_000, "bytes": 2_200_000},
            {"topic": "audit", "role": "consumer", "client_id": MATHTEXT, "requests": 300,
             "records": 0, "bytes": 0}],
        "topics": [
            {"topic": HOSTILE_TOPIC, "pairs": 3360, "produced_records": 24_000, "produced_bytes": 2_300_000,
             "fetched_records": 23_000, "fetched_bytes": 2_200_000, "producers": [HOSTILE],
             "consumers": [MATHTEXT]},
            {"topic": "audit", "pairs": 300, "produced_records": 0, "produced_bytes": 0,
             "fetched_records": 0, "fetched_bytes": 0, "producers": [], "consumers": [MATHTEXT]}],
        "rebalances": [
            {"group_id": HOSTILE, "protocol": "classic", "generation": 1, "started": _minute(0),
             "completed": _minute(0) + dt.timedelta(seconds=3), "members": 1, "duration_s": 3.0},
            {"group_id": HOSTILE, "protocol": "classic", "generation": 2, "started": _minute(2),
             "completed": None, "members": 2, "duration_s": None}],
        "group_members": [{"window_start": _minute(i), "group_id": HOSTILE, "members": 1 + (i >= 2)}
                          for i in range(windows)],
        "group_errors": [{"group_id": HOSTILE, "api_name": "Heartbeat", "error": "REBALANCE_IN_PROGRESS",
                          "pairs": 2, "first_seen": _minute(2), "last_seen": _minute(2)}],
        "groups": [{"group_id": HOSTILE, "protocols": ["classic"], "members_seen": 2, "members_peak": 2,
                    "rebalances": 2, "rebalance_p50_s": 3.0, "rebalance_max_s": 3.0, "rejoin_errors": 2,
                    "commits": 40, "client_ids": [MATHTEXT], "first_seen": _minute(0),
                    "last_seen": _minute(windows)}],
        "slowest": [{"time": _minute(3), "proxy_instance": "sidecar-a", "connection_id": 4,
                     "client_host": "10.0.0.7", "client_port": 50123, "client_id": HOSTILE,
                     "api_name": "Produce", "api_version": 9, "correlation_id": 812, "latency_ms": 31.0,
                     "request_size": 1000, "response_size": 50, "topics": [HOSTILE_TOPIC],
                     "errors": []}],
        "connections": [{"client_id": HOSTILE, "client_host": "10.0.0.7", "proxy_instance": "sidecar-a",
                         "connections": 3, "short_lived": 2, "lifetime_p50_s": 1.5,
                         "lifetime_max_s": 360.0, "requests_per_connection": 820.0,
                         "first_opened": _minute(0), "last_opened": _minute(1)}],
    }


def sample_summary(tables: dict, windows: int = 6) -> dict:
    """summary.json's shape (job._summary), with figures consistent with ``tables``."""
    return {
        "pairs": 3660, "first_time": "2026-03-01T12:00:00Z",
        "last_time": (T0 + dt.timedelta(minutes=windows, seconds=-1)).isoformat() + "Z",
        "span_seconds": windows * 60.0 - 1, "proxies": ["sidecar-a"], "client_ids": 2,
        "client_addresses": 2, "connections": 4, "topics": len(tables["topics"]),
        "apis": len({r["api_name"] for r in tables["api_latency"]}),
        "top_errors": [{"error": r["error"], "pairs": r["pairs"]} for r in tables["api_errors"]],
        "worst_p99": ({"api": "Produce", "version": 9, "latency_p99_ms": 4.0, "requests": 2400}
                      if tables["api_latency"] else None),
        "groups": len(tables["groups"]), "rebalances": sum(r["rebalances"] for r in tables["groups"]),
        "anomalies": len(tables["anomalies"]),
        "clients_on_removed_versions": len({(r["client_id"], r["client_host"])
                                            for r in tables["upgrade_readiness"]}),
        "inputs": {"format": "parquet", "files": 2, "pruned_files": 0}, "capture_versions": [2],
        "window_seconds": 60, "since": None, "until": None, "percentile_accuracy": 10000,
        "generated_at": "2026-03-01T13:00:00Z", "kproxy_version": "0.1.0", "spark_version": "4.3.0",
    }


class _Page(html.parser.HTMLParser):
    """Every tag with its attributes, and the text inside each data-summary element."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.figures: list[tuple[str, object, str]] = []    # (key, JSON value, shown text)
        self._open: list[list] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        self.tags.append((tag, attributes))
        if "data-summary" in attributes:
            self._open.append([tag, attributes["data-summary"], json.loads(attributes["data-value"]), ""])
        elif self._open:
            self._open.append([tag, None, None, ""])

    def handle_endtag(self, tag):
        if self._open:
            _, key, value, text = self._open.pop()
            if self._open:
                self._open[-1][3] += text
            if key is not None:
                self.figures.append((key, value, text.strip()))

    def handle_data(self, data):
        if self._open:
            self._open[-1][3] += data


def _resolve(summary: dict, key: str):
    value = summary
    for part in key.split("."):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def _check_figures(figures: list[tuple[str, object, str]], summary: dict) -> None:
    """Each marked figure holds summary's value, and a whole number shows as that number."""
    for key, value, text in figures:
        assert value == _resolve(summary, key), key
        if isinstance(value, int) and not isinstance(value, bool):
            assert text == f"{value:,}", (key, text)
        if isinstance(value, list) and key == "proxies":
            assert text.startswith(str(len(value))), (key, text)


def _report(tmp_path, tables, summary) -> tuple[str, _Page]:
    path = write_report(str(tmp_path), tables, summary)
    assert path == os.path.join(str(tmp_path), "report.html")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return text, _Page(text)


@dataclass
class Written:
    out: pathlib.Path
    summary: dict
    text: str
    page: _Page


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> Written:
    """The report of ``sample_tables()``, written once for the tests that only read it."""
    out = tmp_path_factory.mktemp("report")
    tables = sample_tables()
    summary = sample_summary(tables)
    return Written(out, summary, *_report(out, tables, summary))


def test_every_plot_is_a_png_file_and_embedded_in_the_page(full):
    tmp_path, page = full.out, full.page
    files = sorted(os.listdir(tmp_path / "plots"))
    assert files == sorted(f"{name}.png" for name in PLOT_NAMES)
    embedded = {attrs["data-plot"]: attrs["src"] for tag, attrs in page.tags if tag == "img"}
    assert sorted(embedded) == sorted(PLOT_NAMES)
    for name in PLOT_NAMES:
        png = (tmp_path / "plots" / f"{name}.png").read_bytes()
        assert png.startswith(PNG_SIGNATURE)
        with Image.open(tmp_path / "plots" / f"{name}.png") as image:
            image.verify()
        with Image.open(tmp_path / "plots" / f"{name}.png") as image:
            assert 300 <= image.width <= 1000 and 100 <= image.height <= 1000, (name, image.size)
        assert embedded[name] == "data:image/png;base64," + base64.b64encode(png).decode()


def test_the_page_refers_to_nothing_outside_itself(full):
    text, page = full.text, full.page
    assert "http://" not in text and "https://" not in text
    for tag, attrs in page.tags:
        assert tag not in ("script", "link", "iframe", "object", "embed"), tag
        if "src" in attrs:
            assert attrs["src"].startswith("data:image/png;base64,"), (tag, attrs["src"][:40])
        if "href" in attrs:
            assert attrs["href"].startswith("#"), (tag, attrs["href"])
    assert "@import" not in text and "url(" not in text


def test_strings_from_the_capture_are_escaped(full):
    text, page = full.text, full.page
    assert HOSTILE not in text and HOSTILE_TOPIC not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "&quot;&gt;&lt;img src=x onerror=alert(2)&gt;" in text
    assert not any(tag == "script" for tag, _ in page.tags)
    assert not any("onerror" in attrs for _, attrs in page.tags)
    assert (full.out / "plots" / "topic_map.png").exists()        # "$...$" labels drew as text


def test_headline_figures_are_summary_values(full):
    keys = {key for key, _, _ in full.page.figures}
    assert {"pairs", "span_seconds", "first_time", "last_time", "proxies", "client_ids", "connections",
            "topics", "apis", "groups", "rebalances", "anomalies", "clients_on_removed_versions",
            "worst_p99.latency_p99_ms", "top_errors.0.error", "top_errors.0.pairs"} <= keys
    _check_figures(full.page.figures, full.summary)


def test_upgrade_readiness_stands_out_when_a_client_uses_a_removed_version(full):
    text = full.text
    assert 'id="upgrade" class="box bad"' in text
    assert "sent request versions that Kafka 4.0 no longer accepts" in text
    assert "v0-v3" in text


def test_empty_tables_get_sentences_and_no_plots(tmp_path):
    tables = {name: [] for name in sample_tables()}
    summary = sample_summary(tables)
    text, page = _report(tmp_path, tables, summary)
    assert os.listdir(tmp_path / "plots") == []
    assert not any(tag in ("img", "table") for tag, _ in page.tags)
    for sentence in ("None: no broker answer in this capture carried an error code.",
                     "None: no window's p99 latency or error rate stood out",
                     "<strong>None.</strong> No client in this capture sent a request version that "
                     "Kafka 4.0 removed.",
                     "None: no consumer group traffic", "No topics: no pair in this capture named one.",
                     "None: no request was answered in this capture.",
                     "None: no connection in this capture.",
                     "none: no broker answer carried an error"):
        assert sentence in text, sentence
    assert 'id="upgrade" class="box ok"' in text
    _check_figures(page.figures, summary)


def test_a_single_window_still_draws_its_series(tmp_path):
    tables = sample_tables(windows=1)
    text, _ = _report(tmp_path, tables, sample_summary(tables, windows=1))
    for name in ("request_rate", "latency_p99", "errors_throttling", "group_members"):
        assert (tmp_path / "plots" / f"{name}.png").exists(), name
    assert "Only one 60-second window" in text


def test_a_table_the_report_got_only_part_of_says_so(tmp_path):
    tables = sample_tables()
    summary = sample_summary(tables)
    summary["table_rows"] = {"series": len(tables["series"]) + 500, "clients": len(tables["clients"])}
    text, _ = _report(tmp_path, tables, summary)
    got, total = len(tables["series"]), len(tables["series"]) + 500
    assert f"These plots got only the first {got} of {total:,} rows" in text
    assert "showing the first" not in text          # clients: the report has every row


def test_a_rerun_into_the_same_directory_drops_plots_it_did_not_draw(tmp_path):
    tables = sample_tables()
    _report(tmp_path, tables, sample_summary(tables))
    tables["topic_clients"] = []
    _report(tmp_path, tables, sample_summary(tables))
    assert not (tmp_path / "plots" / "topic_map.png").exists()
    assert (tmp_path / "plots" / "request_rate.png").exists()


# ------------------------------------------------------------------ in a real browser

SCREENSHOT_ENV = "KPROXY_REPORT_SCREENSHOT"      # also save the screenshot here (for the README)


@pytest.mark.browser
def test_the_real_report_renders_in_chromium_without_any_request(synthetic_analysis, tmp_path, browser):
    """The job's report in headless Chromium: every plot drawn, headline = summary.json, no fetch."""
    result = synthetic_analysis
    out = pathlib.Path(result.out)
    summary = json.loads((out / "summary.json").read_text())
    url = (out / "report.html").as_uri()
    assert result.report == str(out / "report.html")
    plots = sorted(name[:-4] for name in os.listdir(out / "plots"))
    assert plots == sorted(PLOT_NAMES)          # the synthetic capture has data for every plot

    refused: list[str] = []                     # every request but the page itself
    seen: list[str] = []

    def refuse(route):
        if route.request.url == url:
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        page.route("**/*", refuse)
        page.on("request", lambda request: seen.append(request.url))
        page.goto(url, wait_until="load")
        images = page.eval_on_selector_all(
            "img", "els => els.map(e => [e.dataset.plot, e.complete, e.naturalWidth, e.naturalHeight])")
        figures = page.eval_on_selector_all(
            "[data-summary]", "els => els.map(e => [e.dataset.summary, e.dataset.value, "
                              "e.textContent.trim()])")
        screenshot = tmp_path / "report.png"
        page.screenshot(path=str(screenshot), full_page=True)
    finally:
        page.close()

    assert refused == []
    assert [u for u in seen if u != url and not u.startswith("data:")] == []
    assert sorted(name for name, *_ in images) == plots
    for name, complete, width, height in images:
        assert complete and width > 0 and height > 0, name
    keys = {key for key, _, _ in figures}
    assert {"pairs", "span_seconds", "client_ids", "topics", "rebalances", "anomalies",
            "clients_on_removed_versions", "worst_p99.latency_p99_ms", "top_errors.0.pairs"} <= keys
    _check_figures([(key, json.loads(value), text) for key, value, text in figures], summary)
    assert summary["clients_on_removed_versions"] > 0    # the synthetic legacy client is flagged
    print(f"screenshot: {screenshot}")
    if os.environ.get(SCREENSHOT_ENV):
        shutil.copyfile(screenshot, os.environ[SCREENSHOT_ENV])
