"""The report's cells: values from the capture as HTML-safe strings, and table columns.

Shared by the report's sections (``report``) and the policy section (``report_policy``):
every string that comes from the capture goes through ``_esc`` (``html.escape``) here.
"""

from __future__ import annotations

import datetime as dt
import html
import math
from dataclasses import dataclass
from typing import Callable

LABEL_MAX_CHARS = 28            # plot labels are cut here (client ids can be any length)
CELL_LIST_MAX = 8               # list items shown in a table cell before "+N more"
ITEM_NOWRAP_MAX = 40            # list items up to this long are never broken inside
CELL_TEXT_MAX = 200             # longer strings are cut in a cell (the full text is its tooltip)


# ------------------------------------------------------------------ formatting (HTML-safe strings)

def _esc(value) -> str:
    return html.escape(str(value), quote=True)


def _text(value) -> str:
    """A string from the data, escaped; a very long one cut, with the whole in its tooltip."""
    if value is None or value == "":
        return "—"
    text = str(value)
    if len(text) <= CELL_TEXT_MAX:
        return _esc(text)
    return f'<span title="{_esc(text)}">{_esc(text[:CELL_TEXT_MAX - 1])}…</span>'


def _int(value) -> str:
    return "—" if value is None else f"{int(value):,}"


def _ms(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 1000 else f"{value:,.0f}"


def _duration(seconds) -> str:
    if seconds is None:
        return "—"
    seconds = float(seconds)
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def _bytes(value) -> str:
    if value is None:
        return "—"
    if abs(value) < 1024:
        return f"{value:,.0f} B"
    value = float(value)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if abs(value) < 1024:
            break
    else:
        value, unit = value / 1024, "TiB"
    return f"{value:,.1f} {unit}"


def _share(value) -> str:
    if value is None:
        return "—"
    if value == 0:
        return "0"
    percent = value * 100
    return f"{percent:.2f} %" if percent < 1 else f"{percent:.1f} %"


def _time(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, str):          # summary.json's ISO 8601 UTC
        try:
            value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return _esc(value)
    return value.strftime("%Y-%m-%d %H:%M:%S")


def _when(value) -> str:
    """A time in a table cell: date and time each kept whole, so a narrow column breaks between them."""
    if value is None:
        return "—"
    return " ".join(f'<span class="k">{part}</span>' for part in _time(value).split())


def _item(value) -> str:
    """One item of a list cell: short ones never break inside (at a hyphen, say), only between items."""
    text = _text(value)
    return f'<span class="k">{text}</span>' if len(str(value)) <= ITEM_NOWRAP_MAX else text


def _list(values) -> str:
    values = [v for v in (values or []) if v is not None and v != ""]
    if not values:
        return "—"
    shown = ", ".join(_item(v) for v in values[:CELL_LIST_MAX])
    more = len(values) - CELL_LIST_MAX
    return shown + (f' <span class="more">+{more} more</span>' if more > 0 else "")


def _api(row: dict) -> str:
    return f"{_esc(row.get('api_name'))} v{_esc(row.get('api_version'))}"


def _client(row: dict) -> str:
    client_id = row.get("client_id")
    name = _text(client_id) if client_id else '<span class="none">no client id</span>'
    host = row.get("client_host")
    return name + (f' <span class="host">{_text(host)}</span>' if host else "")


def _label(value, fallback: str = "(none)") -> str:
    """A plot label: plain text, cut to a readable length."""
    text = fallback if value is None or value == "" else str(value)
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= LABEL_MAX_CHARS else text[:LABEL_MAX_CHARS - 1] + "…"


# ------------------------------------------------------------------ tables

@dataclass(frozen=True)
class Col:
    """One column of an HTML table: the row key (or a function of the row), title and format."""
    title: str
    key: str | Callable[[dict], str]
    fmt: Callable = _text
    numeric: bool = False
    hint: str = ""
    css: str = ""                   # "k": short values never broken; "name", "list": kept readable

    def cell(self, row: dict) -> str:
        if callable(self.key):
            return self.key(row)
        return self.fmt(row.get(self.key))


def _th(col: Col) -> str:
    attributes = (' class="n"' if col.numeric else "") + (f' title="{_esc(col.hint)}"' if col.hint else "")
    return f"<th{attributes}>{_esc(col.title)}</th>"


def _td(col: Col, row: dict) -> str:
    css = "n" if col.numeric else col.css
    return f'<td class="{css}">{col.cell(row)}</td>' if css else f"<td>{col.cell(row)}</td>"


def _sorted(rows: list[dict], *keys: str, reverse: bool = False) -> list[dict]:
    """Rows ordered by ``keys`` (None sorts first): the job reads tables back without an order."""
    def key(row):
        return tuple((row.get(k) is not None, row.get(k) if row.get(k) is not None else 0) for k in keys)
    return sorted(rows, key=key, reverse=reverse)
