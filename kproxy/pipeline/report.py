"""The report: one self-contained HTML page, and its plots as PNG files.

``write_report`` gets the job's small tables (at most ``tables.REPORT_ROWS`` rows
each, plain dicts) and ``summary.json``'s dict, and writes ``report.html``
plus ``plots/*.png``. The page fetches nothing: CSS is inline, plots are
base64 data URIs, there are no fonts, scripts or links to other sites, so it
can be mailed or opened on a machine without network. It is written for
someone who never saw kproxy: each section opens with the question it answers
and how to read it, in the order of issue 9's six questions.

Every string that comes from the capture (client ids, topics, group ids are
chosen by clients, i.e. attacker-controlled) goes through ``html.escape``, and
plot labels are drawn with mathtext off so a ``$`` is just a character.
Headline figures carry ``data-summary="<key>"`` and the raw JSON value in
``data-value``, so a test (or a script) can read them back.

Plots use matplotlib's object API (``Figure``, Agg canvas) and never pyplot,
so drawing them changes no global backend of a notebook that calls the job.
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import math
import os
import warnings
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import matplotlib
from matplotlib import dates as mdates
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from . import tables as T
from .report_cells import (Col, _api, _bytes, _client, _duration, _esc, _int, _label, _list, _ms,
                           _share, _sorted, _td, _text, _th, _time, _when)
from .report_policy import policy_section
from .tables import REPORT_ROWS, WORST_P99_MIN_REQUESTS

PLOT_DPI = 100                  # 800 px wide plots: sharp enough; 10-200 KB each (measured)
PLOT_WIDTH_IN = 8.0             # fits the page's text column without scaling
PLOT_HEIGHT_IN = 2.8
SERIES_MAX_APIS = 8             # more lines than this make a legend nobody can match to colours
BAR_MAX_ROWS = 15               # bars per bar chart; the table below it has the rest
MAP_MAX_TOPICS = 12             # topics in the producer -> topic -> consumer plot
MAP_MAX_CLIENTS = 14            # clients per side of that plot; the rest become one "other" node
MARKERS_MAX_POINTS = 40         # a series with more windows than this is drawn without dots

# Axes rectangle (left, bottom, width, height) shared by every plot over time, so their time
# axes line up down the page; the right quarter holds the legend (labels cut to LABEL_MAX_CHARS).
TIME_AXES = (0.075, 0.19, 0.68, 0.72)

PALETTE = ("#2563eb", "#ea580c", "#16a34a", "#9333ea", "#dc2626", "#0891b2", "#ca8a04",
           "#db2777", "#4b5563", "#65a30d")
ANOMALY_COLOR = "#dc2626"
_STYLE = {
    "font.size": 9, "axes.titlesize": 10, "axes.titleweight": "bold", "axes.titlelocation": "left",
    "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
    "grid.color": "#e5e7eb", "grid.linewidth": 0.8, "axes.edgecolor": "#9ca3af",
    "axes.prop_cycle": matplotlib.cycler(color=PALETTE), "legend.frameon": False,
    "legend.fontsize": 8, "lines.linewidth": 1.6, "savefig.facecolor": "white",
    "text.parse_math": False,       # a "$" in a client id must not start mathtext
}
# Plot files this module writes: a rerun into the same --out removes the ones it did not redraw.
PLOT_NAMES = ("latency_by_api", "request_rate", "latency_p99", "errors_throttling",
              "client_software", "topic_map", "group_members", "connections")


# ------------------------------------------------------------------ plots

@dataclass(frozen=True)
class Plot:
    name: str
    png: bytes
    alt: str

    def html(self, caption: str) -> str:
        data = base64.b64encode(self.png).decode("ascii")
        return (f'<figure><img src="data:image/png;base64,{data}" alt="{_esc(self.alt)}" '
                f'data-plot="{_esc(self.name)}"><figcaption>{caption}</figcaption></figure>')


class _Plots:
    """Draws figures in the report's style and writes each to ``plots/<name>.png``."""

    def __init__(self, directory: str):
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        for name in PLOT_NAMES:           # a plot with no data this time must not survive a rerun
            stale = os.path.join(directory, f"{name}.png")
            if os.path.exists(stale):
                os.remove(stale)

    def draw(self, name: str, alt: str, paint: Callable[[Figure], None],
             height: float = PLOT_HEIGHT_IN, layout: str | None = "constrained") -> Plot:
        assert name in PLOT_NAMES, name
        with matplotlib.rc_context(_STYLE), warnings.catch_warnings():
            # Client ids may hold characters DejaVu Sans lacks: they draw as boxes, not an error.
            warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from font")
            figure = Figure(figsize=(PLOT_WIDTH_IN, height), dpi=PLOT_DPI, layout=layout)
            FigureCanvasAgg(figure)
            paint(figure)
            buffer = io.BytesIO()
            figure.savefig(buffer, format="png", dpi=PLOT_DPI, metadata={"Software": None})
        png = buffer.getvalue()
        path = os.path.join(self.directory, f"{name}.png")
        with open(path, "wb") as f:
            f.write(png)
        return Plot(name, png, alt)


def _time_axis(ax, windows: list[dt.datetime], window_seconds: float) -> None:
    locator = mdates.AutoDateLocator(minticks=3, maxticks=8)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    step = dt.timedelta(seconds=window_seconds or 60)
    ax.set_xlim(min(windows) - step / 2, max(windows) + step / 2)
    ax.set_xlabel("window start (UTC)")


def _legend(ax) -> None:
    """The legend right of the axes, where it covers no data."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _bars(plots: _Plots, name: str, alt: str, title: str, xlabel: str, labels: list[str],
          stacks: list[tuple[list[int], str, str | None]]) -> Plot:
    """Horizontal count bars, the first label at the bottom; ``stacks`` are (counts, colour,
    legend label or None), drawn end to end."""
    def paint(fig):
        ax = fig.add_subplot()
        y = range(len(labels))
        left = [0] * len(labels)
        for counts, colour, label in stacks:
            ax.barh(y, counts, left=left, color=colour, height=0.6, label=label)
            left = [a + b for a, b in zip(left, counts)]
        ax.set_yticks(list(y), labels)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(xlabel)
        ax.set_title(title)
        ax.grid(axis="y", visible=False)
        _legend(ax)
    return plots.draw(name, alt, paint, height=max(1.6, 0.7 + 0.28 * len(labels)))


# ------------------------------------------------------------------ sections

@dataclass
class _Data:
    """What every section draws from: the tables, summary.json's dict, and where plots go."""
    tables: dict[str, list[dict]]
    summary: dict
    plots: _Plots

    def rows(self, name: str) -> list[dict]:
        return self.tables.get(name) or []

    def cut(self, name: str, rows: list[dict]) -> str:
        """Which part of the table the report got ("the first 200 of 1,234 rows"); "" for all of it."""
        total = (self.summary.get("table_rows") or {}).get(name)
        if total is not None:
            return f"the first {len(rows):,} of {total:,} rows" if len(rows) < total else ""
        return f"the first {len(rows):,} rows" if len(rows) == REPORT_ROWS else ""

    def table(self, name: str, rows: list[dict], cols: tuple[Col, ...], empty: str) -> str:
        """Rows as an HTML table in a scroll box, or the ``empty`` sentence when there are none."""
        if not rows:
            return f'<p class="empty">{empty}</p>'
        head = "".join(_th(c) for c in cols)
        body = "\n".join("<tr>" + "".join(_td(c, r) for c in cols) + "</tr>" for r in rows)
        cut = self.cut(name, rows)
        shown = f"showing {cut}; " if cut else ""
        return (f'<div class="scroll"><table data-table="{_esc(name)}"><thead><tr>{head}</tr></thead>'
                f'<tbody>\n{body}\n</tbody></table></div>'
                f'<p class="source">{shown}full table: <code>tables/{_esc(name)}/</code> (Parquet)</p>')


def _section(anchor: str, title: str, question: str, body: str) -> str:
    """A section: its title, the question it answers and how to read it, then tables and plots."""
    return (f'<section id="{anchor}"><h2>{_esc(title)}</h2><p class="question">{question}</p>'
            f"{body}</section>")


def _lookup(summary: dict, key: str):
    """``summary["worst_p99"]["api"]`` for ``"worst_p99.api"``; list items by index."""
    value = summary
    for part in key.split("."):
        if value is None:
            return None
        value = value[int(part)] if isinstance(value, list) else value.get(part)
    return value


def _mark(summary: dict, key: str, fmt: Callable = _text, tag: str = "span") -> str:
    """One figure of summary.json, shown formatted, its raw JSON value in ``data-value``."""
    value = _lookup(summary, key)
    return (f'<{tag} data-summary="{_esc(key)}" data-value="{_esc(json.dumps(value))}">'
            f"{fmt(value)}</{tag}>")


def _count(values) -> str:
    return f"{len(values or []):,}"


def _headline(summary: dict) -> str:
    def figure(key: str, label: str, fmt: Callable = _int, note: str = "", css: str = "") -> str:
        if key not in summary:
            return ""
        return f'<div class="fig {css}"><dt>{label}</dt>{_mark(summary, key, fmt, "dd")}{note}</div>'

    span = (f'<p class="sub">{_mark(summary, "first_time", _time)} → '
            f'{_mark(summary, "last_time", _time)} UTC</p>')
    removed = summary.get("clients_on_removed_versions") or 0
    items = [
        figure("pairs", "request/response pairs"),
        figure("span_seconds", "time span", _duration, span),
        figure("proxies", "proxy instances", _count, f'<p class="sub">{_list(summary.get("proxies"))}</p>'),
        figure("client_ids", "client ids"),
        figure("client_addresses", "client addresses"),
        figure("connections", "connections"),
        figure("apis", "APIs used"),
        figure("topics", "topics"),
        figure("groups", "consumer groups"),
        figure("rebalances", "rebalances"),
        figure("anomalies", "anomalous windows", css="warn" if summary.get("anomalies") else ""),
        figure("clients_on_removed_versions", "clients on versions Kafka 4.0 removed", _int,
               '<p class="sub"><a href="#upgrade">upgrade readiness</a></p>', "bad" if removed else "good"),
    ]
    if summary.get("worst_p99"):
        text = (f'{_mark(summary, "worst_p99.api")} v{_mark(summary, "worst_p99.version")}: '
                f'{_mark(summary, "worst_p99.latency_p99_ms", _ms)} ms'
                f'<p class="sub">p99 over {_mark(summary, "worst_p99.requests", _int)} requests</p>')
    else:
        text = f'none <p class="sub">no API version had {WORST_P99_MIN_REQUESTS} requests</p>'
    items.append(f'<div class="fig wide"><dt>highest p99 latency</dt><dd>{text}</dd></div>')
    errors = summary.get("top_errors") or []
    if errors:
        listed = "".join(f'<li>{_mark(summary, f"top_errors.{i}.error")} <span class="count">'
                         f'{_mark(summary, f"top_errors.{i}.pairs", _int)}</span></li>'
                         for i in range(len(errors)))
        text = f'<ol class="errors">{listed}</ol>'
    else:
        text = '<span class="none-ok">none: no broker answer carried an error</span>'
    items.append(f'<div class="fig wide"><dt>most frequent errors (pairs)</dt><dd>{text}</dd></div>')
    body = f'<dl class="headline">{"".join(items)}</dl>'
    return _section("headline", "Headline figures",
                    "What did the capture see? Totals over every request/response pair read; "
                    "each links to its section below. All times are UTC.", body)


def _api_latency(data: _Data) -> str:
    rows = _sorted(data.rows("api_latency"), "api_key", "api_version")
    cols = (
        Col("API", _api, css="k"), Col("requests", "requests", _int, True),
        Col("p50 ms", "latency_p50_ms", _ms, True, "median latency of answered requests"),
        Col("p95 ms", "latency_p95_ms", _ms, True),
        Col("p99 ms", "latency_p99_ms", _ms, True, "99 % of answered requests were faster"),
        Col("max ms", "latency_max_ms", _ms, True),
        Col("long-polls", "long_polls", _int, True, "Fetches answered with no records: they wait on purpose"),
        Col("long-poll p50 / p99 ms", _long_polls, numeric=True),
        Col("sent", "request_bytes", _bytes, True, "request bytes, client to broker"),
        Col("received", "response_bytes", _bytes, True, "response bytes, broker to client"),
        Col("error rate", "error_rate", _share, True, "share of answers carrying an error code"),
        Col("throttled", "throttled_share", _share, True, "share of answers with throttle_time_ms > 0"),
        Col("throttle p99 ms", "throttle_p99_ms", _ms, True),
    )
    parts = []
    timed = [r for r in rows if r.get("latency_p99_ms") is not None]
    if timed:
        shown = sorted(timed, key=lambda r: -(r.get("requests") or 0))[:BAR_MAX_ROWS]
        shown.sort(key=lambda r: (r.get("latency_p99_ms") or 0))

        def paint(fig):
            ax = fig.add_subplot()
            y = range(len(shown))
            floor = 0.001         # a log axis cannot show 0 ms
            p50 = [max(r.get("latency_p50_ms") or floor, floor) for r in shown]
            p99 = [max(r.get("latency_p99_ms") or floor, floor) for r in shown]
            top = [max(r.get("latency_max_ms") or floor, floor) for r in shown]
            ax.hlines(y, p50, p99, color="#93c5fd", linewidth=4)
            ax.plot(p50, y, "o", color=PALETTE[0], label="p50 (median)")
            ax.plot(p99, y, "D", color=PALETTE[1], markersize=5, label="p99")
            ax.plot(top, y, "x", color="#4b5563", label="max")
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))   # no mathtext: it is off
            ax.set_yticks(list(y), [_label(f"{r.get('api_name')} v{r.get('api_version')}") for r in shown])
            ax.set_xlabel("latency, ms (log scale)")
            ax.set_title("Latency per API version (long-polls excluded)")
            ax.grid(axis="y", visible=False)
            _legend(ax)
        plot = data.plots.draw("latency_by_api", "latency percentiles per API version", paint,
                               height=max(1.8, 0.8 + 0.28 * len(shown)))
        parts.append(plot.html(f"The {len(shown)} busiest API versions, fastest p99 at the bottom: "
                               "the bar runs from the median to p99; a long bar means a few slow "
                               "requests among fast ones."))
    parts.append(data.table("api_latency", rows, cols, "No request/response pairs: nothing to show."))
    return _section("apis", "Per API and version",
                    "How fast and how healthy is each API version? One row per API version: latency "
                    "percentiles of answered requests (p99 = 99 % were faster), Fetches that returned "
                    "no records counted apart as long-polls because they wait for data on purpose, "
                    "bytes each way, the share of answers carrying an error, and how often the "
                    "broker throttled the client. Hover a column title for its meaning.", "".join(parts))


def _long_polls(row: dict) -> str:
    if not row.get("long_polls"):
        return "—"
    return f'{_ms(row.get("long_poll_p50_ms"))} / {_ms(row.get("long_poll_p99_ms"))}'


def _api_errors(data: _Data) -> str:
    rows = _sorted(data.rows("api_errors"), "pairs", reverse=True)
    cols = (Col("error", "error", _text, css="k"), Col("API", _api, css="k"), Col("pairs", "pairs", _int, True),
            Col("of answered", "share", _share, True, "share of this API version's answered requests"))
    return _section("errors", "Errors by name",
                    "Which errors did the brokers answer with? One row per error name and API "
                    "version, most frequent first; a pair whose response names several errors (one "
                    "per partition, say) counts once per error name.",
                    data.table("api_errors", rows, cols,
                               "None: no broker answer in this capture carried an error code."))


def _series(data: _Data) -> str:
    rows = data.rows("series")
    window_seconds = data.summary.get("window_seconds") or 60
    anomalies = _sorted(data.rows("anomalies"), "score", reverse=True)
    parts = []
    if not rows:
        parts.append('<p class="empty">No time series: the capture holds no pairs.</p>')
    else:
        windows = sorted({r["window_start"] for r in rows})
        totals: dict[str, int] = defaultdict(int)
        by_api: dict[str, dict] = defaultdict(dict)
        for r in rows:
            totals[r["api_name"]] += r.get("requests") or 0
            by_api[r["api_name"]][r["window_start"]] = r
        ranked = sorted(totals, key=lambda a: (-totals[a], a))
        top, rest = ranked[:SERIES_MAX_APIS], ranked[SERIES_MAX_APIS:]
        marker = "o" if len(windows) <= MARKERS_MAX_POINTS else None
        drawn = [a for a in anomalies if windows[0] <= a["window_start"] <= windows[-1]]

        def rate(fig):
            ax = fig.add_axes(TIME_AXES)
            for api in top:
                ax.plot(windows, [(by_api[api].get(w) or {}).get("rate_per_s") or 0 for w in windows],
                        marker=marker, markersize=3, label=_label(api))
            if rest:
                ax.plot(windows, [sum((by_api[a].get(w) or {}).get("rate_per_s") or 0 for a in rest)
                                  for w in windows], marker=marker, markersize=3, color="#9ca3af",
                        label=f"{len(rest)} other APIs")
            ax.set_ylim(bottom=0)
            ax.set_ylabel("requests / s")
            ax.set_title("Request rate per API")
            _time_axis(ax, windows, window_seconds)
            _legend(ax)

        def p99(fig):
            ax = fig.add_axes(TIME_AXES)
            for api in top:
                ax.plot(windows, [_nan((by_api[api].get(w) or {}).get("latency_p99_ms")) for w in windows],
                        marker=marker, markersize=3, label=_label(api))
            flagged = [a for a in drawn if a.get("metric") == "latency_p99_ms"]
            if flagged:
                ax.plot([a["window_start"] for a in flagged], [a["value"] for a in flagged], "o",
                        markersize=9, markerfacecolor="none", markeredgecolor=ANOMALY_COLOR,
                        markeredgewidth=1.5, label="anomaly")
            ax.set_ylim(bottom=0)
            ax.set_ylabel("p99 latency, ms")
            ax.set_title("p99 latency per API (long-polls excluded)")
            _time_axis(ax, windows, window_seconds)
            _legend(ax)

        def errors(fig):
            ax = fig.add_axes(TIME_AXES)
            errs = [sum((by_api[a].get(w) or {}).get("error_pairs") or 0 for a in ranked) for w in windows]
            throttled = [sum((by_api[a].get(w) or {}).get("throttled") or 0 for a in ranked) for w in windows]
            ax.plot(windows, errs, marker=marker, markersize=3, color=PALETTE[4], label="answers with an error")
            ax.plot(windows, throttled, marker=marker, markersize=3, color=PALETTE[6], label="throttled answers")
            step = dt.timedelta(seconds=window_seconds)
            for i, start in enumerate(sorted({a["window_start"] for a in drawn
                                              if a.get("metric") == "error_rate"})):
                ax.axvspan(start, start + step, color=ANOMALY_COLOR, alpha=0.2, linewidth=0,
                           label="error-rate anomaly" if i == 0 else None)
            ax.set_ylim(bottom=0)
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylabel("pairs per window")
            ax.set_title("Errors and throttling, all APIs")
            _time_axis(ax, windows, window_seconds)
            _legend(ax)

        note = (f" Only one {window_seconds:g}-second window: the capture is shorter than a window, "
                f"so each line is a single point." if len(windows) == 1 else "")
        cut = data.cut("series", rows)
        if cut:
            note += (f" These plots got only {cut} of the series, so some windows are missing: "
                     "<code>tables/series/</code> has them all.")
        parts.append(data.plots.draw("request_rate", "request rate per API over time", rate, layout=None).html(
            f"Requests per second in each window, for the {len(top)} busiest APIs"
            + (" (the rest summed in grey)" if rest else "") + "." + note))
        parts.append(data.plots.draw("latency_p99", "p99 latency per API over time", p99, layout=None).html(
            "The slowest 1 % of each window's answers took at least this long; red circles mark "
            "windows listed as anomalies below. A gap means the API had no answered request then."))
        parts.append(data.plots.draw("errors_throttling", "errors and throttling over time", errors,
                                     layout=None).html(
            "Answers carrying an error code, and answers in which the broker throttled the client, per "
            "window; shaded windows had an anomalous error rate."))
    cols = (Col("window start", "window_start", _when, css="k"), Col("API", "api_name", css="k"),
            Col("metric", css="k", key=lambda r: {"latency_p99_ms": "p99 latency", "error_rate": "error rate"}
                .get(r.get("metric"), _text(r.get("metric")))),
            Col("value", lambda r: _metric(r, "value"), numeric=True),
            Col("baseline", lambda r: _metric(r, "baseline"), numeric=True,
                hint="the API's median over all its windows"),
            Col("score", "score", lambda v: "—" if v is None else f"{v:.1f}", True,
                "how many robust spreads above the baseline"),
            Col("requests", "requests", _int, True), Col("evidence", "evidence"))
    parts.append("<h3>Anomalies</h3>"
                 f'<p class="question">Which windows stand out? A window is listed when its p99 latency or '
                 f"error rate is above its own API's median by more than {T.ANOMALY_SPREADS:g} robust "
                 f"spreads and at least {T.ANOMALY_MIN_RATIO:g} times the median (APIs with at least "
                 f"{T.ANOMALY_MIN_WINDOWS} windows of {T.ANOMALY_MIN_REQUESTS} or more requests); "
                 "the evidence column gives the numbers behind each.</p>")
    parts.append(data.table("anomalies", anomalies, cols,
                            "None: no window's p99 latency or error rate stood out from its API's baseline."))
    return _section("time", "Over time",
                    f"When did traffic, latency or errors change? Each point is one "
                    f"{window_seconds:g}-second window of the capture.", "".join(parts))


def _nan(value) -> float:
    return math.nan if value is None else value


def _metric(row: dict, key: str) -> str:
    value = row.get(key)
    if value is None:
        return "—"
    return f"{_ms(value)} ms" if row.get("metric") == "latency_p99_ms" else _share(value)


def _clients(data: _Data) -> str:
    rows = _sorted(data.rows("clients"), "requests", reverse=True)
    cols = (Col("client", _client, css="name"), Col("connections", "connections", _int, True),
            Col("requests", "requests", _int, True), Col("sent", "request_bytes", _bytes, True),
            Col("received", "response_bytes", _bytes, True),
            Col("records produced", "records_produced", _int, True),
            Col("records fetched", "records_fetched", _int, True),
            Col("errors", "error_pairs", _int, True, "answers carrying an error code"),
            Col("software", "software", _list, css="list"),
            Col("API versions", "api_versions", _list, css="list"),
            Col("proxies", "proxies", _list))
    parts = [data.table("clients", rows, cols, "No clients: the capture holds no pairs.")]

    inventory = _sorted(data.rows("client_inventory"), "connections", reverse=True)
    parts.append("<h3>Client inventory</h3>"
                 '<p class="question">Which client software runs, in which versions? Name and version '
                 "are what the client announced in its ApiVersions request (v3 and later, KIP-511); "
                 "<em>unknown</em> means it never did (an older client, or a connection opened before "
                 "the capture started).</p>")
    software: dict[str, int] = defaultdict(int)
    for r in inventory:
        software[_software(r)] += r.get("connections") or 0
    if software:
        ranked = sorted(software.items(), key=lambda kv: (-kv[1], kv[0]))[:BAR_MAX_ROWS][::-1]
        parts.append(_bars(data.plots, "client_software", "connections per client software",
                           "Connections per client software and version", "connections",
                           [_label(name) for name, _ in ranked],
                           [([n for _, n in ranked], PALETTE[0], None)]).html(
            "Connections opened by each client library and version."))
    cols = (Col("software", "client_software_name", css="k"), Col("version", "client_software_version", css="k"),
            Col("client", _client, css="name"), Col("connections", "connections", _int, True),
            Col("requests", "requests", _int, True), Col("API versions", "api_versions", _list, css="list"),
            Col("first seen", "first_seen", _when), Col("last seen", "last_seen", _when))
    parts.append(data.table("client_inventory", inventory, cols, "No connections: nothing to list."))
    parts.append(_latency_split(data))
    parts.append(_upgrade(data))
    return _section("clients", "Clients",
                    "Who talks to the cluster, and how much? One row per client id and client "
                    "address: connections, requests, bytes each way, records produced and fetched, "
                    "errors, the software it announced and the API versions it used.", "".join(parts))


def _instances(data: _Data) -> str:
    rows = _sorted(data.rows("instances"), "requests", reverse=True)
    cols = (Col("proxy", "proxy_instance", css="k"), Col("requests", "requests", _int, True),
            Col("connections", "connections", _int, True),
            Col("clients", "clients", _int, True, "distinct client id and address pairs"),
            Col("errors", "error_pairs", _int, True, "answers carrying an error code"),
            Col("error rate", "error_rate", _share, True),
            Col("p50", "latency_p50_ms", _ms, True), Col("p99", "latency_p99_ms", _ms, True,
                                                          "latency, Fetches that waited for data left out"),
            Col("sent", "request_bytes", _bytes, True), Col("received", "response_bytes", _bytes, True),
            Col("first seen", "first_seen", _when), Col("last seen", "last_seen", _when))
    return _section("instances", "Proxies",
                    "Which kproxy saw what? One row per proxy instance (its instance_name): requests, "
                    "connections, clients, errors and latency. A sidecar whose p99 or error rate stands "
                    "out points at its broker; one with no rows was not capturing.",
                    data.table("instances", rows, cols, "None: the capture holds no pairs."))


def _latency_split(data: _Data) -> str:
    rows = data.rows("latency_split")
    intro = ("<h3>Producer latency split (client telemetry)</h3>"
             '<p class="question">Where does a producer\'s time go? The record queue time and request '
             "latency each producer pushed (KIP-714 client metrics; averaged over its pushes), beside the "
             "Produce latency kproxy measured for the same client id and address over the same windows: "
             "<em>network</em> is request minus broker (the network and kproxy), <em>queue share</em> "
             "the client's queue out of queue plus request.</p>")
    cols = (Col("client instance", "client_instance_id", css="k"), Col("client", _client, css="name"),
            Col("software", "client_software_name", css="k"), Col("pushes", "pushes", _int, True),
            Col("queue", "queue_ms", _ms, True, "record queue time the client reported"),
            Col("request", "request_ms", _ms, True, "request latency the client reported"),
            Col("broker", "broker_ms", _ms, True, "Produce latency kproxy measured, same client and windows"),
            Col("network", "network_ms", _ms, True, "request minus broker"),
            Col("queue share", "queue_share", _share, True),
            Col("Produce pairs", "produce_pairs", _int, True))
    return intro + data.table("latency_split", rows, cols,
                              "No producer pushed client metrics (KIP-714) in this capture.")


def _software(row: dict) -> str:
    name, version = row.get("client_software_name"), row.get("client_software_version")
    if name in (None, "unknown") and version in (None, "unknown"):
        return "unknown (never announced)"
    return f"{_text(name)} {_text(version)}"      # named by the client: escaped


def _upgrade(data: _Data) -> str:
    rows = _sorted(data.rows("upgrade_readiness"), "requests", reverse=True)
    clients = {(r.get("client_id"), r.get("client_host")) for r in rows}
    count = data.summary.get("clients_on_removed_versions", len(clients))
    intro = ('<p class="question">Which clients would break when the brokers move to Kafka 4.0? Kafka '
             "4.0 removed the oldest request versions (KIP-896): a client still sending one gets an "
             "error after the upgrade and must be upgraded first.</p>")
    if not rows:
        body = ('<p class="verdict ok"><strong>None.</strong> No client in this capture sent a request '
                "version that Kafka 4.0 removed.</p>")
        return f'<div id="upgrade" class="box ok"><h3>Upgrade readiness (Kafka 4.0)</h3>{intro}{body}</div>'
    cols = (Col("client", _client, css="name"), Col("software", "client_software_name", css="k"),
            Col("version", "client_software_version", css="k"), Col("API", _api, css="k"),
            Col("removed versions", "removed_versions", hint="the versions of this API Kafka 4.0 removed"),
            Col("requests", "requests", _int, True), Col("first seen", "first_seen", _when),
            Col("last seen", "last_seen", _when))
    headline = (f'<p class="verdict bad"><strong>{_int(count)} client'
                f'{"s" if count != 1 else ""}</strong> (client id and address) sent request versions '
                "that Kafka 4.0 no longer accepts:</p>")
    return (f'<div id="upgrade" class="box bad"><h3>Upgrade readiness (Kafka 4.0)</h3>{intro}{headline}'
            f'{data.table("upgrade_readiness", rows, cols, "")}</div>')


def _topics(data: _Data) -> str:
    rows = _sorted(data.rows("topics"), "produced_records", "fetched_records", reverse=True)
    flows = data.rows("topic_clients")
    parts = []
    if flows:
        plot = _topic_map(flows, data.plots)
        parts.append(plot.html(
            "Producer → topic → consumer: clients on the left produced to the topics in the middle, "
            "clients on the right fetched from them; a thicker line carried more records. "
            f"At most {MAP_MAX_TOPICS} topics (most records first) and {MAP_MAX_CLIENTS} clients a "
            "side; the tables hold everything."))
    cols = (Col("topic", "topic", css="name"),
            Col("pairs", "pairs", _int, True, "request/response pairs naming the topic"),
            Col("records produced", "produced_records", _int, True),
            Col("bytes produced", "produced_bytes", _bytes, True),
            Col("records fetched", "fetched_records", _int, True),
            Col("bytes fetched", "fetched_bytes", _bytes, True),
            Col("producers", "producers", _list, css="list"), Col("consumers", "consumers", _list, css="list"))
    parts.append(data.table("topics", rows, cols, "No topics: no pair in this capture named one."))
    flow_cols = (Col("topic", "topic", css="name"), Col("role", "role", css="k"),
                 Col("client id", "client_id", css="name"),
                 Col("requests", "requests", _int, True), Col("records", "records", _int, True),
                 Col("bytes", "bytes", _bytes, True))
    parts.append("<h3>Who produces and fetches what</h3>")
    parts.append(data.table("topic_clients", _sorted(flows, "records", reverse=True), flow_cols,
                            "None: no Produce or Fetch request carried records in this capture."))
    return _section("topics", "Topics",
                    "Which topics carry data, and who writes and reads them? One row per topic: "
                    "records and bytes produced and fetched, and the client ids on each side.",
                    "".join(parts))


def _topic_map(flows: list[dict], plots: _Plots) -> Plot:
    """Producers, topics and consumers as three columns of names joined by lines."""
    weight: dict[str, int] = defaultdict(int)
    for f in flows:
        weight[f.get("topic")] += (f.get("records") or 0) + 1      # +1: a topic with 0 records still counts
    topics = sorted(weight, key=lambda t: (-weight[t], str(t)))[:MAP_MAX_TOPICS]
    rank = {t: i for i, t in enumerate(topics)}
    links = [(f["role"], _label(f.get("client_id"), "(no client id)"), f["topic"], f.get("records") or 0)
             for f in flows if f.get("topic") in rank and f.get("role") in ("producer", "consumer")]
    other = "other clients"
    nodes: dict[str, list[str]] = {}
    for role in ("producer", "consumer"):
        totals: dict[str, int] = defaultdict(int)
        position: dict[str, float] = defaultdict(float)
        for link_role, client, topic, records in links:
            if link_role == role:
                totals[client] += records + 1
                position[client] += rank[topic] * (records + 1)
        ranked = sorted(totals, key=lambda c: (-totals[c], c))[:MAP_MAX_CLIENTS]
        # Each client sits level with the mean position of its topics: fewer crossing lines.
        ranked.sort(key=lambda c: (position[c] / totals[c], c))
        nodes[role] = ranked + ([other] if len(totals) > MAP_MAX_CLIENTS else [])
    edges: dict[tuple[str, str, str], int] = defaultdict(int)
    for role, client, topic, records in links:
        edges[(role, client if client in nodes[role] else other, topic)] += records
    tallest = max(len(topics), len(nodes["producer"]), len(nodes["consumer"]), 1)
    heaviest = max(list(edges.values()) + [1])

    def ys(names: list) -> dict:
        n = len(names)
        return {name: (tallest - 1) / 2 + (n - 1) / 2 - i for i, name in enumerate(names)}

    def paint(fig):
        ax = fig.add_subplot()
        y_topic, y_prod, y_cons = ys(topics), ys(nodes["producer"]), ys(nodes["consumer"])
        colours = {t: PALETTE[i % len(PALETTE)] for i, t in enumerate(topics)}
        for (role, client, topic), records in edges.items():
            width = 0.8 + 7 * math.sqrt(records / heaviest)
            if role == "producer":
                xs, yy = (0.02, 0.98), (y_prod[client], y_topic[topic])
            else:
                xs, yy = (1.02, 1.98), (y_topic[topic], y_cons[client])
            ax.plot(xs, yy, color=colours[topic], alpha=0.45, linewidth=width, solid_capstyle="butt")
        for name, y in y_prod.items():
            ax.text(0, y, name + " ", ha="right", va="center")
        for name, y in y_cons.items():
            ax.text(2, y, " " + name, ha="left", va="center")
        for topic, y in y_topic.items():
            ax.text(1, y, _label(topic), ha="center", va="center", fontweight="bold",
                    bbox={"boxstyle": "round,pad=0.3", "facecolor": "white", "edgecolor": colours[topic]})
        if not y_prod:
            ax.text(0, (tallest - 1) / 2, "no producer seen ", ha="right", va="center", color="#6b7280")
        if not y_cons:
            ax.text(2, (tallest - 1) / 2, " no consumer seen", ha="left", va="center", color="#6b7280")
        for x, title in ((0, "producers"), (1, "topics"), (2, "consumers")):
            ax.text(x, tallest - 0.3, title, ha="center", va="bottom", color="#6b7280", fontweight="bold")
        ax.set_xlim(-1.15, 3.15)
        ax.set_ylim(-0.6, tallest + 0.2)
        ax.axis("off")
    return plots.draw("topic_map", "producer to topic to consumer map", paint,
                      height=max(1.8, 0.6 + 0.32 * tallest))


def _groups(data: _Data) -> str:
    groups = _sorted(data.rows("groups"), "rebalances", reverse=True)
    if not groups:
        return _section("groups", "Consumer groups",
                        "Are consumer groups stable? Rebalances, their durations and members over time.",
                        '<p class="empty">None: no consumer group traffic (JoinGroup, SyncGroup, Heartbeat, '
                        "OffsetCommit or ConsumerGroupHeartbeat with a group id) in this capture.</p>")
    parts = []
    members = data.rows("group_members")
    rebalances = _sorted(data.rows("rebalances"), "group_id", "started")
    if members:
        peak: dict[str, int] = defaultdict(int)
        for r in members:
            peak[r["group_id"]] = max(peak[r["group_id"]], r.get("members") or 0)
        shown = sorted(peak, key=lambda g: (-peak[g], str(g)))[:SERIES_MAX_APIS]
        windows = sorted({r["window_start"] for r in members})
        seen = {(r["group_id"], r["window_start"]): r.get("members") or 0 for r in members}
        window_seconds = data.summary.get("window_seconds") or 60

        def paint(fig):
            ax = fig.add_axes(TIME_AXES)
            for i, group in enumerate(shown):
                own = [w for w in windows if (group, w) in seen]
                span = [w for w in windows if own[0] <= w <= own[-1]]
                colour = PALETTE[i % len(PALETTE)]
                ax.step(span, [seen.get((group, w), 0) for w in span], where="post", color=colour,
                        marker="o" if len(span) <= MARKERS_MAX_POINTS else None, markersize=3,
                        label=_label(group))
                for r in rebalances:
                    if r.get("group_id") == group and r.get("started") is not None:
                        ax.axvline(r["started"], color=colour, linestyle=":", linewidth=1, alpha=0.7)
            ax.set_ylim(bottom=0)
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylabel("members")
            ax.set_title("Members per consumer group")
            _time_axis(ax, windows, window_seconds)
            _legend(ax)
        drawn = (f" The {len(shown)} largest of {len(peak)} groups are drawn." if len(shown) < len(peak)
                 else "")
        cut = data.cut("group_members", members)
        if cut:
            drawn += (f" The plot got only {cut} of the table, so some windows are missing: "
                      "<code>tables/group_members/</code> has them all.")
        parts.append(data.plots.draw("group_members", "consumer group members over time", paint,
                                     layout=None).html(
            "Distinct members active in each window; dotted lines mark where a rebalance started."
            + drawn))
    cols = (Col("group", "group_id", css="name"), Col("protocol", "protocols", _list),
            Col("members seen", "members_seen", _int, True), Col("peak members", "members_peak", _int, True),
            Col("rebalances", "rebalances", _int, True, "generations handed out, the first formation included"),
            Col("p50 duration", "rebalance_p50_s", _duration, True),
            Col("max duration", "rebalance_max_s", _duration, True),
            Col("rejoin errors", "rejoin_errors", _int, True, "answers that made a member rejoin"),
            Col("commits", "commits", _int, True), Col("client ids", "client_ids", _list, css="list"),
            Col("first seen", "first_seen", _when), Col("last seen", "last_seen", _when))
    parts.append(data.table("groups", groups, cols, ""))
    parts.append("<h3>Rebalances</h3>"
                 '<p class="question">Each generation a group went through, its first formation '
                 "included: classic groups from the first JoinGroup request to the last SyncGroup "
                 "answer; KIP-848 groups from the first to the last member reaching the new epoch. "
                 "An empty end means the rebalance did not finish within the capture.</p>")
    cols = (Col("group", "group_id", css="name"), Col("protocol", "protocol", css="k"),
            Col("generation", "generation", _int, True),
            Col("started", "started", _when), Col("completed", "completed", _when),
            Col("members", "members", _int, True), Col("duration", "duration_s", _duration, True))
    parts.append(data.table("rebalances", rebalances, cols,
                            "None: no group formed or rebalanced in this capture."))
    parts.append("<h3>Errors that forced members to rejoin</h3>")
    errors = _sorted(data.rows("group_errors"), "pairs", reverse=True)
    cols = (Col("group", "group_id", css="name"), Col("API", "api_name", css="k"),
            Col("error", "error", css="k"),
            Col("pairs", "pairs", _int, True), Col("first seen", "first_seen", _when),
            Col("last seen", "last_seen", _when))
    parts.append(data.table("group_errors", errors, cols,
                            "None: no group answer carried a rejoin error (REBALANCE_IN_PROGRESS, "
                            "UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION and the like)."))
    return _section("groups", "Consumer groups",
                    "Are consumer groups stable? One row per group: how often it rebalanced, how long "
                    "rebalances took, members over time, and the errors that made members rejoin. "
                    "Frequent rebalances stall consumption while they last.", "".join(parts))


def _slowest(data: _Data) -> str:
    rows = _sorted(data.rows("slowest"), "latency_ms", reverse=True)
    cols = (Col("latency ms", "latency_ms", _ms, True), Col("time", "time", _when),
            Col("API", _api, css="k"), Col("client", _client, css="name"),
            Col("connection", lambda r: f'{_text(r.get("proxy_instance"))} #{_text(r.get("connection_id"))}'
                f' <span class="host">port {_text(r.get("client_port"))}</span>',
                hint="proxy instance, connection id and client port"),
            Col("correlation id", "correlation_id", _int, True),
            Col("sent", "request_size", _bytes, True), Col("received", "response_size", _bytes, True),
            Col("topics", "topics", _list), Col("errors", "errors", _list))
    return _section("slowest", "Slowest requests",
                    f"Which single requests took longest? The {len(rows)} slowest answered "
                    f"pair{'s' * (len(rows) != 1)} (Fetches "
                    "that waited for data are left out), with the proxy, connection and correlation id "
                    "that find each one in the capture files.",
                    data.table("slowest", rows, cols, "None: no request was answered in this capture."))


def _mean(value) -> str:
    return "—" if value is None else f"{value:,.1f}"


def _connections(data: _Data) -> str:
    rows = _sorted(data.rows("connections"), "connections", reverse=True)
    parts = []
    if rows:
        per_client: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])     # all proxies together
        for r in rows:
            counts = per_client[(r.get("client_id"), r.get("client_host"))]
            counts[0] += r.get("connections") or 0
            counts[1] += r.get("short_lived") or 0
        shown = sorted(per_client.items(), key=lambda kv: (-kv[1][0], -kv[1][1], str(kv[0])))
        shown = shown[:BAR_MAX_ROWS][::-1]
        parts.append(_bars(data.plots, "connections", "connections per client", "Connections per client",
                           "connections opened",
                           [_label(f"{_label(client, '(no client id)')} @ {host or '?'}") for (client, host), _ in shown],
                           [([counts[0] - counts[1] for _, counts in shown], PALETTE[0], "lived longer"),
                            ([counts[1] for _, counts in shown], PALETTE[1],
                             f"lived < {T.SHORT_LIVED_CONNECTION_S:g} s")]).html(
            "Connections each client opened, the short-lived ones in orange: a long orange bar is a "
            "client that keeps reconnecting."))
    cols = (Col("client", _client, css="name"), Col("proxy", "proxy_instance", css="k"),
            Col("connections", "connections", _int, True),
            Col(f"< {T.SHORT_LIVED_CONNECTION_S:g} s", "short_lived", _int, True,
                f"connections gone within {T.SHORT_LIVED_CONNECTION_S:g} s of opening"),
            Col("lifetime p50", "lifetime_p50_s", _duration, True),
            Col("lifetime max", "lifetime_max_s", _duration, True),
            Col("requests / conn.", "requests_per_connection", _mean, True),
            Col("first opened", "first_opened", _when), Col("last opened", "last_opened", _when))
    parts.append(data.table("connections", rows, cols, "None: no connection in this capture."))
    return _section("connections", "Connection churn",
                    "Do clients reconnect too often? One row per client and proxy: connections opened, "
                    f"how many lived under {T.SHORT_LIVED_CONNECTION_S:g} s, typical and longest lifetime "
                    "(as far as the capture saw it). Many short connections usually mean a misconfigured "
                    "or crash-looping client.", "".join(parts))


def _about(summary: dict) -> str:
    """The footer: what was read, with which settings, by which versions."""
    def mark(key: str, fmt: Callable = _text) -> str:
        return _mark(summary, key, fmt)

    def versions(values) -> str:
        return ", ".join(_esc(v) for v in values or [])

    pruned = (f', {mark("inputs.pruned_files", _int)} left out by --since'
              if (summary.get("inputs") or {}).get("pruned_files") else "")
    limits = (f'; pairs from {mark("since", _when)} until {mark("until", _when)}'
              if summary.get("since") or summary.get("until") else "")
    return ("<footer><p>"
            f'Read {mark("inputs.files", _int)} {mark("inputs.format")} files{pruned} (capture schema '
            f'version {mark("capture_versions", versions)}){limits}; {mark("window_seconds", _int)}-second '
            "windows. Percentiles are approximate (Spark's percentile_approx): the value shown has a rank "
            f'within 1/{mark("percentile_accuracy", _int)} of the row count of the exact one. '
            f'Generated {mark("generated_at", _when)} UTC by kproxy {mark("kproxy_version")} on Spark '
            f'{mark("spark_version")}. The tables behind every section are under <code>tables/</code> '
            "next to this file; <code>summary.json</code> holds the headline figures.</p></footer>")


_CSS = """
:root { --fg:#111827; --muted:#6b7280; --line:#e5e7eb; --accent:#2563eb; --bad:#b91c1c; --ok:#15803d; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--fg); background: #f9fafb; line-height: 1.45;
       font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
header, main { max-width: 1280px; margin: 0 auto; padding: 0 20px; }
header { padding-top: 20px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 18px; margin: 0 0 4px; }
h3 { font-size: 15px; margin: 22px 0 4px; }
nav { margin: 10px 0 4px; display: flex; flex-wrap: wrap; gap: 4px 14px; font-size: 13px; }
a { color: var(--accent); text-decoration: none; }
a:hover { text-decoration: underline; }
section { background: white; border: 1px solid var(--line); border-radius: 8px; padding: 16px 20px;
          margin: 16px 0; }
.question { color: #374151; margin: 0 0 12px; max-width: 80ch; }
.subtitle, .source, figcaption, footer { color: var(--muted); font-size: 12.5px; }
.source { margin: 4px 0 0; }
.empty { color: var(--muted); font-style: italic; }
dl.headline { display: grid; grid-template-columns: repeat(auto-fill, minmax(170px, 1fr)); gap: 10px;
               margin: 0; }
.fig { border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px; }
.fig.wide { grid-column: span 2; }
.fig dt { color: var(--muted); font-size: 12px; }
.fig dd { margin: 2px 0 0; font-size: 20px; font-weight: 600; font-variant-numeric: tabular-nums; }
.fig.wide dd { font-size: 15px; }
.fig .sub { margin: 2px 0 0; font-size: 12px; font-weight: normal; color: var(--muted); }
.fig.bad { border-color: #fca5a5; background: #fef2f2; } .fig.bad dd { color: var(--bad); }
.fig.good dd { color: var(--ok); }
.fig.warn { border-color: #fcd34d; background: #fffbeb; }
ol.errors { margin: 2px 0 0; padding-left: 18px; font-size: 13px; font-weight: normal; }
ol.errors .count { color: var(--muted); font-variant-numeric: tabular-nums; }
.none-ok { color: var(--ok); font-size: 13px; font-weight: normal; }
figure { margin: 8px 0 14px; }
figure img { display: block; max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 4px; }
figcaption { margin-top: 4px; max-width: 80ch; }
.scroll { max-height: 420px; overflow: auto; border: 1px solid var(--line); border-radius: 4px; }
table { border-collapse: collapse; width: 100%; font-size: 12.5px; }
th, td { padding: 4px 8px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
th { position: sticky; top: 0; background: #f3f4f6; font-weight: 600; }
th[title] { text-decoration: underline dotted; cursor: help; }
td { overflow-wrap: break-word; }
.k { white-space: nowrap; }
td.name { min-width: 9em; } td.list { min-width: 14em; }
.n { text-align: right; font-variant-numeric: tabular-nums; }
td.n { white-space: nowrap; }
tbody tr:nth-child(even) { background: #fafafa; }
.host, .more, .none { color: var(--muted); }
.none { font-style: italic; }
code { font-size: 12px; background: #f3f4f6; padding: 0 3px; border-radius: 3px; }
.box { border-radius: 6px; padding: 2px 14px 12px; margin-top: 18px; }
.box.bad { border: 2px solid var(--bad); background: #fef2f2; }
.box.ok { border: 1px solid #86efac; background: #f0fdf4; }
.verdict { margin: 6px 0 10px; font-size: 15px; }
.verdict.bad strong { color: var(--bad); } .verdict.ok strong { color: var(--ok); }
footer { max-width: 1280px; margin: 0 auto; padding: 4px 20px 30px; }
"""

def _errors_counted(row: dict) -> str:
    names, counts = row.get("errors") or [], row.get("error_counts") or []
    return _list([f"{name} ×{n}" for name, n in zip(names, counts)])


def _seconds(value) -> str:
    return "—" if value is None else f"{value:.3f}"


def _failovers(data: _Data) -> str:
    rows = _sorted(data.rows("failovers"), "first_failure")
    cols = (Col("first failure", "first_failure", _when), Col("client", _client, css="name"),
            Col("software", _software, css="k"), Col("principal", "principal"),
            Col("partition", lambda r: f'{_text(r.get("topic"))}-{_text(r.get("partition"))}', css="name"),
            Col("API", "api", css="k"),
            Col("leader", lambda r: f'{_text(r.get("old_leader"))} → {_text(r.get("new_leader"))}', css="k",
                hint="the node that answered the first failure, and the node of the first success"),
            Col("recovery s", "recovery_seconds", _seconds, True,
                "first failed request sent → first answer without error received"),
            Col("failed requests", "failed_requests", _int, True), Col("errors", _errors_counted),
            Col("hint", "hint_leader", _text, True, "the leader a KIP-951 hint named, if one did"),
            Col("Metadata", "metadata_requests", _int, True, "Metadata answers the client got in between"),
            Col("new leader found by", "recovered_by", css="k",
                hint="hint: followed the KIP-951 hint; metadata: after a Metadata round trip; "
                     "retry: neither"))
    changes = _sorted(data.rows("leader_changes"), "first_named")
    change_cols = (Col("first named", "first_named", _when),
                   Col("partition", lambda r: f'{_text(r.get("topic"))}-{_text(r.get("partition"))}', css="name"),
                   Col("leader", lambda r: f'{_text(r.get("old_leader"))} → {_text(r.get("new_leader"))}', css="k"),
                   Col("epoch", "epoch", _int, True), Col("named first by", "first_named_by", css="k"),
                   Col("answers", "answers", _int, True, "answers that named this leader at this epoch"))
    return _section("failovers", "Failovers",
                    "What did each partition leader change cost each client? One row per client and "
                    "partition: the first request that failed with a leadership error "
                    "(NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, ...), the first answer without error "
                    "after it, the requests that failed in between, and whether the client went to the "
                    "leader a KIP-951 hint named or needed a Metadata round trip. Below, the leader "
                    "changes the answers named.",
                    data.table("failovers", rows, cols, "None: no client met a leader change in this capture.")
                    + data.table("leader_changes", changes, change_cols,
                                 "No leader change was named by a Metadata answer or a KIP-951 hint."))


def _audit(data: _Data) -> str:
    rows = _sorted(data.rows("audit"), "time")
    cols = (Col("time", "time", _when), Col("principal", "principal"),
            Col("client", lambda r: f'{_text(r.get("client_id"))} <span class="host">'
                f'{_text(r.get("client_address"))}</span>', css="name"),
            Col("software", _software, css="k"), Col("API", _api_of_audit, css="k"),
            Col("topics", "topics", _list), Col("group", "group_id"),
            Col("outcome", "outcome", css="k"), Col("errors", "errors", _list),
            Col("proxy", "proxy_instance", css="k"))
    return _section("audit", "Audit trail",
                    "Who changed the cluster, from where, as which user? Every request that creates, "
                    "deletes or alters something (topics, partitions, configs, ACLs, quotas, users, "
                    "groups, offsets reset from outside a group), with its answer.",
                    data.table("audit", rows, cols, "None: no request in this capture changed the cluster."))


def _api_of_audit(row: dict) -> str:
    return f"{_esc(row.get('api'))} v{_esc(row.get('api_version'))}"


_SECTIONS = (("headline", "Headline"), ("apis", "Per API"), ("errors", "Errors"), ("time", "Over time"),
             ("clients", "Clients"), ("upgrade", "Upgrade readiness"), ("topics", "Topics"),
             ("groups", "Consumer groups"), ("slowest", "Slowest requests"), ("connections", "Connections"),
             ("instances", "Proxies"), ("policy", "Policy"), ("failovers", "Failovers"), ("audit", "Audit trail"))


def _policy(data: _Data) -> str:
    return policy_section(data)


_BODY = (_api_latency, _api_errors, _series, _clients, _topics, _groups, _slowest, _connections, _instances,
         _policy, _failovers, _audit)


def render(tables: dict[str, list[dict]], summary: dict, plots: _Plots) -> str:
    """The whole page as one string."""
    span = (f'{_time(summary.get("first_time"))} → {_time(summary.get("last_time"))} UTC'
            if summary.get("first_time") else "")
    proxies = _list(summary.get("proxies")) if summary.get("proxies") else ""
    nav = "".join(f'<a href="#{anchor}">{title}</a>' for anchor, title in _SECTIONS)
    data = _Data(tables, summary, plots)
    body = "\n".join((_headline(summary), *(section(data) for section in _BODY)))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>kproxy capture report {span}</title><style>{_CSS}</style></head><body>"
            f'<header><h1>Kafka traffic report</h1><p class="subtitle">Requests and responses captured by '
            f"kproxy (a Kafka protocol proxy){' on ' + proxies if proxies else ''}, {span}.</p>"
            f"<nav>{nav}</nav></header><main>\n{body}\n</main>{_about(summary)}</body></html>\n")


def write_report(out: str, tables: dict[str, list[dict]], summary: dict) -> str:
    """Write ``out/report.html`` and ``out/plots/*.png``; return the report's path."""
    plots = _Plots(os.path.join(out, "plots"))
    page = render(tables, summary, plots)
    path = os.path.join(out, "report.html")
    # errors="replace": a client id decoded with lone surrogates must not cost the whole report.
    with open(path, "w", encoding="utf-8", errors="replace") as f:
        f.write(page)
    return path
